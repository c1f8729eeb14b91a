"""reasonrl.interrupts with real signals sent to this process: SIGTERM raises like Ctrl-C (once);
the training loop's stop drops a step only before its update, answers a second signal at once (not
an echo of the first), ignores signals while the loop closes, and puts the handlers back."""

from __future__ import annotations

import os
import signal
import time

import pytest

from reasonrl.interrupts import Interrupted, StepAbandoned, StepStop, exit_line, hold_sigterm, last_write, sigterm_raises, stage_finished, stage_starts
from reasonrl.train.ranks import Ranks


@pytest.fixture(autouse=True)
def _handlers():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, h in before.items():
        signal.signal(s, h)


def _signal(sig: int = signal.SIGTERM) -> None:
    os.kill(os.getpid(), sig)  # the handler runs in this (main) thread before os.kill returns to the next bytecode
    time.sleep(0.01)


def _noted(sig: int) -> None:
    """``sig`` sent, to be only noted: raising is this test's failure (not a KeyboardInterrupt ending the session)."""
    try:
        _signal(sig)
    except KeyboardInterrupt as e:
        pytest.fail(f"{signal.Signals(sig).name} raised {type(e).__name__} ({e}): not noted")


def test_sigterm_raises_interrupted_a_keyboard_interrupt():
    hold_sigterm()
    closed = False
    with pytest.raises(Interrupted) as e:
        with sigterm_raises():  # a stage
            try:
                _signal()
            finally:
                _signal()  # while it unwinds (its finally blocks), another SIGTERM is ignored
                closed = True
    assert closed and isinstance(e.value, KeyboardInterrupt) and e.value.signum == signal.SIGTERM

    hold_sigterm()
    _signal()  # before the stage starts (imports, parsing): held ...
    with pytest.raises(Interrupted):
        with sigterm_raises():  # ... and raised as it starts
            pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with sigterm_raises():  # without the CLI's handler (a stage run in-process): nothing held, nothing raised
        pass
    line, code = exit_line(e.value, "eval")
    assert code == 143 and line is not None and line.startswith("stopped by SIGTERM: eval did not finish") and "\n" not in line
    assert exit_line(KeyboardInterrupt(), "report")[1] == 130  # Ctrl-C


def test_exit_line_is_quiet_on_other_ranks(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    assert exit_line(Interrupted(signal.SIGTERM, "stopped by SIGTERM after step 2: ..."), "train") == (None, 143)
    monkeypatch.setenv("RANK", "0")
    assert exit_line(Interrupted(signal.SIGTERM, "x"), "train") == ("x", 143)
    assert exit_line(Interrupted(signal.SIGTERM, "x", quiet=True), "train") == (None, 143)


def test_step_stop_abandons_only_before_the_update_and_restores_handlers():
    prev = signal.getsignal(signal.SIGTERM)
    stop = StepStop(repeat_s=3600)
    stop.install(Ranks())
    try:
        stop.begin_step()
        with pytest.raises(StepAbandoned):  # collecting: dropped at once
            _signal()
        assert stop.requested() and stop.signum == signal.SIGTERM
        with pytest.raises(StepAbandoned):  # and the next step does not start
            stop.begin_step()
        _signal()  # a repeat within repeat_s (torchrun forwarding the same Ctrl-C): no effect
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) is prev  # stopped in-process (a script, a test): the caller's handlers are back (were SIG_IGN)

    hold_sigterm()  # the CLI's process
    stop = StepStop(repeat_s=3600)
    stop.install(Ranks())
    try:
        stop.begin_step()
        stop.commit()
        _signal()
    finally:
        stop.uninstall()
    assert all(signal.getsignal(s) == signal.SIG_IGN for s in (signal.SIGTERM, signal.SIGINT))  # stopped: it is on its way out

    signal.signal(signal.SIGTERM, prev)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stop = StepStop(repeat_s=3600)
    stop.install(Ranks())
    try:
        stop.begin_step()
        stop.commit()  # the update starts: a signal now only asks to stop after the step
        _signal(signal.SIGINT)
        assert stop.requested() and stop.signum == signal.SIGINT
    finally:
        stop.uninstall()

    signal.signal(signal.SIGTERM, prev)
    stop = StepStop(repeat_s=0.0)
    stop.install(Ranks())
    try:
        stop.begin_step()
        stop.commit()
        stop.closing()  # the loop is over: closing the engine and trackers is not interrupted
        _signal()
        _signal()
        assert not stop.requested()
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) is prev  # no stop: the handlers it found are back


def test_a_second_signal_abandons_at_once():
    stop = StepStop(repeat_s=0.0)
    stop.install(Ranks())
    try:
        stop.begin_step()
        stop.commit()
        _signal()
        assert stop.requested()
        with pytest.raises(Interrupted) as e:
            _signal()
        assert e.value.signum == signal.SIGTERM and not e.value.message  # (the stage says where it stopped)
    finally:
        stop.uninstall()


def test_a_finished_stage_notes_sigterm_and_the_command_ends_ignoring_it():
    """Once a stage's run is finished (its manifest written, or train's loop closing) a SIGTERM is only
    noted: the command returns as it would have, and from its return to the process's exit both
    signals are ignored (SIG_IGN: Python resets its own handlers to the default action as it shuts
    down, which killed the process by the raw signal). A stage that runs others (main-job) stops at
    the next one's start."""
    hold_sigterm()
    with sigterm_raises():  # a stage command
        with last_write():  # its manifest: a signal during the write is only noted
            _signal()
        _signal()  # after it: noted (it used to raise "… did not finish (no manifest.json written)")
    assert all(signal.getsignal(s) == signal.SIG_IGN for s in (signal.SIGTERM, signal.SIGINT))

    hold_sigterm()  # the stages of a main job, in one command
    with pytest.raises(Interrupted) as e:
        with sigterm_raises():
            stage_starts()
            stage_finished()  # the first stage returned
            _signal()  # between two stages: noted ...
            stage_starts()  # ... and the next one does not start
    assert e.value.signum == signal.SIGTERM and not e.value.message
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN  # (stopped, not finished)

    hold_sigterm()  # the training loop's stop, closing under the CLI's handler
    with sigterm_raises():
        stop = StepStop(repeat_s=3600)
        stop.install(Ranks())
        stop.closing()
        _signal()  # closing: ignored
        stop.uninstall()
        _signal()  # the CLI's handler is back: only noted
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN

    hold_sigterm()
    with pytest.raises(Interrupted):  # before the last write: a stop as usual
        with sigterm_raises():
            _signal()
            with last_write():
                pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # then stages run in-process (a test): what the CLI's noted is never raised
    stage_finished()
    stage_starts()


def test_a_finished_stage_notes_ctrl_c_too():
    """Ctrl-C (SIGINT) once a stage's run is finished is noted as a SIGTERM is: the command ends as it
    would have (it raised KeyboardInterrupt: "… did not finish" beside the manifest, exit 130); in a
    main job the next stage does not start (exit 130); the stage's own SIGINT handler is back whenever
    the finished state ends (a next stage, a failed last write)."""
    hold_sigterm()
    with sigterm_raises():
        with last_write():
            _noted(signal.SIGINT)  # during the manifest's write: only noted
        _noted(signal.SIGINT)  # after it: noted
    assert all(signal.getsignal(s) == signal.SIG_IGN for s in (signal.SIGTERM, signal.SIGINT))

    signal.signal(signal.SIGINT, signal.default_int_handler)
    hold_sigterm()  # a main job's stages
    with pytest.raises(Interrupted) as e:
        with sigterm_raises():
            stage_starts()
            stage_finished()  # the first stage returned
            _noted(signal.SIGINT)  # between two stages: noted ...
            stage_starts()  # ... and the next one does not start
    assert e.value.signum == signal.SIGINT and exit_line(e.value, "main-job")[1] == 130
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    hold_sigterm()
    with sigterm_raises():
        stage_finished()
        stage_starts()  # a next stage starts (no signal): Ctrl-C raises again
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            _signal(signal.SIGINT)
        with pytest.raises(OSError):
            with last_write():  # the manifest's write fails: its error is the stage's end, and Ctrl-C raises again
                raise OSError("disk full")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    hold_sigterm()  # the training loop's stop, closing under the CLI's handler: a Ctrl-C after it is noted
    with sigterm_raises():
        stop = StepStop(repeat_s=3600)
        stop.install(Ranks())
        stop.closing()
        _signal(signal.SIGINT)  # closing: ignored
        stop.uninstall()
        _noted(signal.SIGINT)  # the loop's handlers are back, the run finished: only noted (it raised KeyboardInterrupt)
    assert all(signal.getsignal(s) == signal.SIG_IGN for s in (signal.SIGTERM, signal.SIGINT))

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a process started with Ctrl-C ignored (in the background): it stays ignored
    hold_sigterm()
    with pytest.raises(Interrupted) as e:
        with sigterm_raises():
            stage_finished()
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            _noted(signal.SIGINT)
            _signal()  # (a SIGTERM noted: the next stage stops for it, not for the ignored Ctrl-C)
            stage_starts()
    assert e.value.signum == signal.SIGTERM and signal.getsignal(signal.SIGINT) == signal.SIG_IGN
