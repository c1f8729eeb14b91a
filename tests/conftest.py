"""Shared fixtures: the tiny in-process model (random, and one taught the answer format)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from toyhelp import sft_answer_format, toy_rows

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parent.parent


class ProcessState:
    """What a test can change for every later test in the process: torch's thread count (vLLM and
    the engine tests lower it; it changes fp32 reduction order, so a learning test's trajectory),
    the environment (the CLI and vLLM set variables that later processes and libraries read), the
    default dtype, grad mode and the global RNGs. Taken before a test (or a module), put back after."""

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


@pytest.fixture(autouse=True, scope="module")
def _module_process_state():
    """Module-scoped fixtures (an engine built once per module) change state for their module only."""
    state = ProcessState()
    yield
    state.restore()


@pytest.fixture(autouse=True)
def _process_state():
    """Every test sees the process as the test before it found it, whatever order they run in."""
    state = ProcessState()
    yield
    state.restore()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from reasonrl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def format_model(tiny_model, tmp_path_factory) -> Path:
    return sft_answer_format(tiny_model, tmp_path_factory.mktemp("fmt") / "model")


@pytest.fixture(scope="session")
def toy_data_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("toy") / "toy.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in toy_rows(200, seed=3)))
    return p


@pytest.fixture(scope="session")
def prepared(tmp_path_factory, toy_data_file) -> Path:
    """The toy data through `reasonrl prepare-data` (template none, 4 held out); read only (copy it to change it)."""
    from clihelp import run_cli

    out = tmp_path_factory.mktemp("toyprep") / "data"
    r = run_cli("prepare-data", toy_data_file, "--out", out, "--template", "none", "--val-size", "4")
    assert r.exit_code == 0, r.output
    return out
