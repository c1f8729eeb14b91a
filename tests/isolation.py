"""What a test may change for the whole process, taken and put back (used by tests/conftest.py)."""

from __future__ import annotations

import os
import signal
import threading


class ProcessState:
    """What a test can change for every later test in the process: torch's thread count (vLLM and
    the engine tests lower it; it changes fp32 reduction order, so a learning test's trajectory),
    the environment (the CLI and vLLM set variables that later processes and libraries read), the
    default dtype, grad mode and the global RNGs, and what SIGINT and SIGTERM do in this (main)
    thread: their handlers and whether they are blocked (a stage stopped in-process leaves them
    ignored, and every subprocess a later test starts inherits an ignored or blocked signal).
    Taken before a test (or a module), put back after."""

    def __init__(self) -> None:
        import random

        import numpy as np
        import torch

        self.threads = torch.get_num_threads()
        self.set_num_threads = torch.set_num_threads
        self.environ = dict(os.environ)
        self.dtype = torch.get_default_dtype()
        self.grad = torch.is_grad_enabled()
        self.matmul_precision = torch.get_float32_matmul_precision()
        self.rng = (torch.get_rng_state(), random.getstate(), np.random.get_state())
        self.signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        self.sigmask = signal.pthread_sigmask(signal.SIG_BLOCK, []) if hasattr(signal, "pthread_sigmask") else None

    def restore(self) -> None:
        import random

        import numpy as np
        import torch

        torch.set_num_threads = self.set_num_threads
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        if dict(os.environ) != self.environ:
            os.environ.clear()
            os.environ.update(self.environ)
        torch.set_default_dtype(self.dtype)
        torch.set_grad_enabled(self.grad)
        torch.set_float32_matmul_precision(self.matmul_precision)
        torch.set_rng_state(self.rng[0])
        random.setstate(self.rng[1])
        np.random.set_state(self.rng[2])
        if threading.current_thread() is threading.main_thread():
            for sig, handler in self.signals.items():
                if signal.getsignal(sig) is not handler and handler is not None:
                    signal.signal(sig, handler)
            if self.sigmask is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, self.sigmask)
