"""SIGTERM and SIGINT: stop cleanly, say so in one line, exit 128 + the signal's number.

Schedulers stop a job with SIGTERM (Slurm, Kubernetes; ``torchrun`` forwards it to its workers
and sends SIGKILL 30 s later, ``--shutdown-timeout``), a terminal with SIGINT (Ctrl-C).

Every command: :func:`raise_on_sigterm` (installed by ``reasonrl.cli.main``) makes SIGTERM raise
:class:`Interrupted` wherever the program is, as Python makes SIGINT raise ``KeyboardInterrupt``
(of which it is a subclass), so every ``finally`` runs (engines, reward workers and trackers are
closed) and no manifest is written; the CLI prints one line and exits 143 (SIGTERM) or 130 (SIGINT).

Training loops: :class:`StepStop` replaces both handlers around the steps. A signal asks the loop
to stop at the next step boundary, every rank at the same one; the loop checkpoints the last
finished step and raises :class:`Interrupted` with its own line. In one process a step still
collecting its rollouts (generation, scoring: nothing changed yet but the data position and the
RNGs, which the loop puts back) is abandoned at once (:class:`StepAbandoned`); a step that has
started its updates is finished. A second signal (at least ``repeat_s`` after the first: one
Ctrl-C reaches torchrun and its workers, and torchrun forwards it again) abandons at once.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Interrupted(KeyboardInterrupt):
    """A stop by ``signum``; ``message`` is the one line the CLI prints ("" = a stage-neutral one),
    none when ``quiet`` (the other ranks of a multi-process run: rank 0 says it)."""

    def __init__(self, signum: int, message: str = "", *, quiet: bool = False) -> None:
        super().__init__(message or signal_name(signum))
        self.signum, self.message, self.quiet = int(signum), message, quiet


class StepAbandoned(Exception):
    """The current step is dropped before it changed the weights (see :class:`StepStop`)."""


def raise_on_sigterm() -> None:
    """SIGTERM raises :class:`Interrupted` in the main thread, the way SIGINT raises KeyboardInterrupt."""

    def handler(signum: int, frame: Any) -> None:
        raise Interrupted(signum)

    signal.signal(signal.SIGTERM, handler)


def exit_line(e: BaseException, stage: str) -> tuple[str | None, int]:
    """(line to print or None, exit code) for a KeyboardInterrupt or :class:`Interrupted` in ``stage``."""
    signum = getattr(e, "signum", signal.SIGINT)
    msg = getattr(e, "message", "") or (f"stopped by {signal_name(signum)}: {stage} did not finish (no manifest.json written); "
                                        "rerun the same command to start over")
    quiet = getattr(e, "quiet", False) or os.environ.get("RANK", "0") != "0"  # (under torchrun every rank got the signal)
    return (None if quiet else msg), 128 + signum


class StepStop:
    """Stop a training loop at a step boundary on SIGTERM / SIGINT, every rank at the same step.

    The loop calls :meth:`begin_step` before a step, passes :meth:`commit` to the step to call once
    its rollouts are collected (before any update), and asks :meth:`requested` after the step. In
    one process, a signal before ``commit`` raises :class:`StepAbandoned` at once; with several
    ranks it is only noted (a rank leaving mid-collective would hang the others) and ``commit`` and
    ``requested`` agree on it over the ranks (a max-reduce). ``ranks``: a ``reasonrl.train.ranks.Ranks``.
    """

    def __init__(self, ranks: Any, *, repeat_s: float = 2.0) -> None:
        self.ranks, self.repeat_s = ranks, repeat_s
        self.signum = 0  # the first signal received here or, after an agreement, on any rank
        self._t = 0.0
        self._abandonable = False
        self._prev: dict[int, Any] = {}

    def install(self) -> None:
        """Take over SIGTERM and SIGINT (main thread only; elsewhere the defaults stay)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for s in SIGNALS:
            self._prev[s] = signal.getsignal(s)
            signal.signal(s, self._handler)

    def uninstall(self) -> None:
        """Put the handlers back that :meth:`install` found."""
        for s, h in self._prev.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        self._prev = {}

    def _handler(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if not self.signum:
            self.signum, self._t = signum, now
            if self._abandonable and self.ranks.world == 1:
                self._abandonable = False
                raise StepAbandoned(signal_name(signum))
        elif now - self._t >= self.repeat_s:
            raise Interrupted(signum)  # a second signal: abandon at once

    def begin_step(self) -> None:
        """A step starts: until :meth:`commit` it may be abandoned."""
        if self.signum and self.ranks.world == 1:
            raise StepAbandoned(signal_name(self.signum))
        self._abandonable = True

    def commit(self) -> None:
        """The step's rollouts are in; its updates come next. Raises :class:`StepAbandoned` on every
        rank when a signal came (on any rank) before this point."""
        self._abandonable = False
        if self.requested():
            raise StepAbandoned(signal_name(self.signum))

    def requested(self) -> bool:
        """Whether a signal came, on any rank (a collective: every rank calls it at the same point)."""
        if self.ranks.world > 1:
            import torch

            agreed = int(self.ranks.max(torch.tensor([self.signum], dtype=torch.int64))[0])
            if agreed and not self.signum:  # another rank's: one here soon after is the same stop
                self.signum, self._t = agreed, time.monotonic()
        return bool(self.signum)
