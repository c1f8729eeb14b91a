"""SIGTERM and SIGINT: stop cleanly, say so in one line, exit 128 + the signal's number.

Schedulers stop a job with SIGTERM (Slurm, Kubernetes; ``torchrun`` forwards it to its workers
and sends SIGKILL 30 s later, ``--shutdown-timeout`` / ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``), a
terminal with SIGINT (Ctrl-C).

Every command: with :func:`hold_sigterm` (installed by ``reasonrl.cli.main``) and inside
:func:`sigterm_raises` (around each stage command), the first SIGTERM raises :class:`Interrupted`
wherever the stage is, as Python makes SIGINT raise ``KeyboardInterrupt`` (of which it is a
subclass), so every ``finally`` runs (engines, reward workers and trackers are closed) and no
manifest is written; the CLI prints one line and exits 143 (SIGTERM) or 130 (SIGINT). A SIGTERM
that comes before the stage starts (imports, parsing) is held and raised as it starts; later ones
are ignored while it unwinds (torchrun sends one more to a rank whose peer has stopped; the
scheduler's SIGKILL stays the backstop).

Training loops: :class:`StepStop` replaces both handlers for the steps. A signal asks the loop to
stop at the next step boundary, every rank at the same one; the loop checkpoints the last finished
step and raises :class:`Interrupted` with its own line. In one process a step still collecting its
rollouts (generation, scoring: nothing changed yet but the data position and the RNGs, which the
loop puts back) is dropped at once (:class:`StepAbandoned`); a step that has started its updates is
finished. A second signal while stopping (at least ``repeat_s`` after the first: one Ctrl-C reaches
torchrun and its workers, and torchrun forwards it again) abandons at once: the previous checkpoint
stays the latest. Once the loop is closing (engine, trackers; then the final outputs) signals are ignored.

The end of a stage (the CLI's process): once its run is finished (``train``'s steps are over:
:meth:`StepStop.closing`; a stage's manifest is being written: :func:`last_write`; any stage's
``run_…`` returned: :func:`stage_finished`) a SIGTERM or a Ctrl-C is only noted (the CLI's handler
takes SIGINT too until then): the command ends as it would have (exit 0), and SIGTERM and SIGINT are
ignored (``SIG_IGN``) from the command's return to the process's exit. A stage that runs others
(``main-job``) stops before its next one starts (:func:`stage_starts`): one line, exit 143 (130).
(The CLI's handler used to raise it: "… did not finish (no manifest.json written)", exit 143, the
manifest written; a Ctrl-C raised KeyboardInterrupt: exit 130, the same line; and Python puts the
default action back for every signal with a Python handler as it shuts down, so one in its last
moments killed it by the raw signal, -15.)

In-process (a script calling ``reasonrl.train(...)``, a test calling ``run_…``): the caller's
SIGINT / SIGTERM handlers are back after the call, stopped or not (:meth:`StepStop.uninstall`
ignores both only in the CLI's process; the Python API wraps each stage in :func:`handlers_kept`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any, Iterator

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


class StepAbandoned(BaseException):
    """The current step is dropped before it changed the weights (see :class:`StepStop`). A
    BaseException, like KeyboardInterrupt: no ``except Exception`` on the way swallows it."""


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class _Held:
    """The CLI's SIGTERM: ``pending`` (the signal once received), ``armed`` (inside a stage)."""

    pending = 0
    armed = False
    finished = False  # the stage's run is finished: a SIGTERM (and a SIGINT, :func:`_finish`) is only noted
    sigint: Any = None  # the SIGINT handler this one replaced while the run is finished (None: not replaced)

    def __call__(self, signum: int, frame: Any) -> None:
        if self.pending:
            return  # already stopping
        self.pending = signum
        if self.armed and not self.finished:
            raise Interrupted(signum)


_HELD = _Held()


def hold_sigterm() -> None:
    """Install the CLI's SIGTERM handler: a SIGTERM is held until :func:`sigterm_raises` is entered,
    raised at once inside it, ignored after the first."""
    _HELD.pending, _HELD.armed, _HELD.finished, _HELD.sigint = 0, False, False, None
    signal.signal(signal.SIGTERM, _HELD)


def _cli() -> bool:
    """Whether the CLI's handler has SIGTERM (this is the CLI's process, inside or around a command)."""
    return signal.getsignal(signal.SIGTERM) is _HELD


def _finish() -> None:
    """The run is finished: a SIGTERM is only noted, and so is a SIGINT (the CLI's handler takes it
    until :func:`_unfinish`; main thread only: elsewhere handlers cannot be set)."""
    _HELD.finished = True
    if _main_thread() and _HELD.sigint is None:
        current = signal.getsignal(signal.SIGINT)
        if current is not signal.SIG_IGN:  # (a process started with SIGINT ignored, in the background: it stays so)
            _HELD.sigint = current if current is not None else signal.SIG_DFL
            signal.signal(signal.SIGINT, _HELD)


def _unfinish() -> None:
    """The finished state ends (a next stage starts, or the last write failed): SIGINT's handler is back."""
    _HELD.finished = False
    if _HELD.sigint is not None and _main_thread():
        if signal.getsignal(signal.SIGINT) is _HELD:
            signal.signal(signal.SIGINT, _HELD.sigint)
        _HELD.sigint = None


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside (a stage command), SIGTERM raises :class:`Interrupted` (one held from before raises on
    entering); once the command returned, SIGTERM and SIGINT are ignored to the process's exit (not
    a Python handler: it stays through the interpreter's shutdown); a no-op unless
    :func:`hold_sigterm` installed the handler."""
    if not _cli():  # (the stage run in-process, by a test or a script)
        yield
        return
    _HELD.armed = True
    done = False
    try:
        if _HELD.pending:
            raise Interrupted(_HELD.pending)
        yield
        if _main_thread():  # the command's run is finished (a SIGTERM or SIGINT since was noted, not raised)
            for s in SIGNALS:
                signal.signal(s, signal.SIG_IGN)
            _HELD.sigint = None
        done = True
    finally:
        _HELD.armed = False
        if not done:  # (it raised: SIGINT's own handler back, should a finished stage have taken it)
            _unfinish()


def stage_starts() -> None:
    """A stage's ``run_…`` starts (``reasonrl.rundir.releases_claims``; the stages a ``main-job``
    runs too): the previous stage's finished state ends, and a SIGTERM noted since stops this one
    before it starts (:class:`Interrupted`)."""
    if _HELD.finished:
        _unfinish()
        if _HELD.pending and _cli():
            raise Interrupted(_HELD.pending)


def stage_finished() -> None:
    """The stage's run is finished (its manifest written): a SIGTERM or SIGINT from now on is only
    noted (by the CLI's handler; the command ends as it would have, :func:`stage_starts` raises it in
    a next stage). A no-op unless the CLI's handler is installed (a stage run in-process: nothing to note)."""
    if _cli():
        _finish()


@contextlib.contextmanager
def last_write() -> Iterator[None]:
    """Around a stage's last write (its manifest): a SIGTERM or SIGINT from its start on is only noted
    (:func:`stage_finished`; one before it stops the stage as usual, no manifest). Should the write
    fail, its error is what the stage ends with. (Not a blocked signal mask: that is per thread, and
    a signal to the process goes to any thread that does not block it.)"""
    stage_finished()
    try:
        yield
    except BaseException:
        _unfinish()
        raise


@contextlib.contextmanager
def handlers_kept() -> Iterator[None]:
    """Around a stage run in-process for a caller (the Python API): the SIGINT and SIGTERM handlers
    the caller had are back afterwards, however the stage ended (a stopped one, under the CLI's
    handler, leaves both ignored: right for the CLI's process on its way out, not for a caller that
    goes on). Main thread only (elsewhere handlers cannot be set, nor changed by the stage)."""
    if not _main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in before.items():
            if h is not None and signal.getsignal(s) is not h:
                signal.signal(s, h)


def exit_line(e: BaseException, stage: str) -> tuple[str | None, int]:
    """(line to print or None, exit code) for a KeyboardInterrupt or :class:`Interrupted` in ``stage``."""
    signum = getattr(e, "signum", signal.SIGINT)
    msg = getattr(e, "message", "") or (f"stopped by {signal_name(signum)}: {stage} did not finish (no manifest.json written); "
                                        "rerun the same command")
    quiet = getattr(e, "quiet", False) or os.environ.get("RANK", "0") != "0"  # (under torchrun every rank got the signal)
    return (None if quiet else msg), 128 + signum


class StepStop:
    """Stop a training loop at a step boundary on SIGTERM / SIGINT, every rank at the same step.

    The loop calls :meth:`begin_step` before a step, passes :meth:`commit` to the step to call once
    its rollouts are collected (before any update), asks :meth:`requested` after the step, and calls
    :meth:`closing` when it ends. In one process, a signal before ``commit`` raises
    :class:`StepAbandoned` at once; with several ranks it is only noted (a rank leaving
    mid-collective would hang the others), and ``commit`` and ``requested`` agree on it over the
    ranks (a max-reduce).
    """

    def __init__(self, *, repeat_s: float = 2.0) -> None:
        self.ranks: Any = None
        self.world, self.repeat_s = 1, repeat_s
        self.signum = 0  # the first signal received here or, after an agreement, on any rank
        self._t = 0.0
        self._abandonable = False
        self._closing = False
        self._prev: dict[int, Any] = {}

    def install(self, ranks: Any) -> None:
        """Take over SIGTERM and SIGINT for the run's ``ranks`` (a ``reasonrl.train.ranks.Ranks``;
        main thread only, elsewhere the handlers stay)."""
        self.ranks, self.world = ranks, ranks.world
        if not _main_thread():
            return
        for s in SIGNALS:
            self._prev[s] = signal.getsignal(s)
            signal.signal(s, self._handler)

    def uninstall(self) -> None:
        """Put back the handlers :meth:`install` found; after a stop in the CLI's process, ignore both
        signals instead (it is on its way out with its one line). In-process (a script, a test) the
        caller's handlers come back, stopped or not. A run finished under the CLI's handler
        (:meth:`closing`): SIGINT too is only noted from here on (:func:`stage_finished`)."""
        cli = self._prev.get(signal.SIGTERM) is _HELD
        for s, h in self._prev.items():
            signal.signal(s, signal.SIG_IGN if self.signum and cli else (h if h is not None else signal.SIG_DFL))
        self._prev = {}
        if cli and _HELD.finished and not self.signum:
            _finish()

    def _handler(self, signum: int, frame: Any) -> None:
        if self._closing:
            return
        now = time.monotonic()
        if not self.signum:
            self.signum, self._t = signum, now
            if self._abandonable and self.world == 1:
                self._abandonable = False
                raise StepAbandoned(signal_name(signum))
        elif now - self._t >= self.repeat_s:
            raise Interrupted(signum)  # a second signal: abandon at once

    def begin_step(self) -> None:
        """A step starts: until :meth:`commit` it may be dropped."""
        if self.signum and self.world == 1:
            raise StepAbandoned(signal_name(self.signum))
        self._abandonable = True

    def commit(self) -> None:
        """The step's rollouts are in; its updates come next. Raises :class:`StepAbandoned` on every
        rank when a signal came (on any rank) before this point."""
        self._abandonable = False
        if self.requested():
            raise StepAbandoned(signal_name(self.signum))

    def requested(self) -> bool:
        """Whether a signal came, on any rank (a collective: every rank calls it at the same point
        and gets the same answer, even when a signal lands here while it runs)."""
        if self.world == 1:
            return bool(self.signum)
        import torch

        agreed = int(self.ranks.max(torch.tensor([self.signum], dtype=torch.int64))[0])
        if agreed and not self.signum:  # another rank's: one here soon after is the same stop
            self.signum, self._t = agreed, time.monotonic()
        return bool(agreed)  # (not self.signum: a signal after the reduce counts at the next one)

    def closing(self) -> None:
        """The loop is over (stopped, finished or failed): what is left is closing the engine and
        trackers and writing the outputs or the one line; signals from now on are ignored (by the
        CLI's handler too, once put back, :func:`stage_finished`)."""
        self._abandonable = False
        self._closing = True
        if self._prev.get(signal.SIGTERM) is _HELD and not self.signum:  # (the CLI's: a SIGTERM after :meth:`uninstall` is only noted)
            _HELD.finished = True
