"""The one line of a `train` stopped by SIGTERM / SIGINT says where it stopped, which checkpoint
holds the run, and the one thing to do: --resume when there is a checkpoint, start over when not.
(The real signals, processes and resumes: tests/stages/test_chaos.py.)"""

from __future__ import annotations

import signal

from reasonrl.stages.train import TrainConfig, TrainProgress, stop_message


def _cfg(**kw) -> TrainConfig:
    return TrainConfig(engine="hf", **kw)


def test_after_a_step_names_the_checkpoint_and_resume():
    line = stop_message(_cfg(), signal.SIGTERM, TrainProgress(phase="steps", finished=3, saved=3, written=True))
    assert line == "stopped by SIGTERM after step 3: checkpoint step_3 written; continue with the same command and --resume"
    line = stop_message(_cfg(overwrite=True), signal.SIGINT, TrainProgress(phase="steps", finished=3, saved=3))
    assert line.startswith("stopped by SIGINT after step 3: checkpoint step_3 is the latest;") and "--resume (not --overwrite)" in line
    assert "(it has --resume)" in stop_message(_cfg(resume=True), signal.SIGTERM, TrainProgress(phase="steps", finished=5, saved=5))


def test_a_dropped_step_and_a_second_signal():
    line = stop_message(_cfg(), signal.SIGTERM, TrainProgress(phase="steps", finished=2, saved=2, written=True, abandoned=3))
    assert line.startswith("stopped by SIGTERM in step 3, before its update (the step is dropped): checkpoint step_2 written;")
    line = stop_message(_cfg(), signal.SIGTERM, TrainProgress(phase="steps", finished=4, saved=2), again=True)
    assert "again while stopping" in line and "checkpoint step_2 is the latest" in line and "--resume" in line


def test_nothing_to_resume_says_start_over():
    for p in (TrainProgress(phase="setup"), TrainProgress(phase="steps", abandoned=1)):
        line = stop_message(_cfg(), signal.SIGTERM, p)
        assert "nothing to resume" in line and "start over with the same command and --overwrite" in line and "--resume" not in line
    assert stop_message(_cfg(), signal.SIGTERM, TrainProgress()).endswith("before the first step: nothing written; rerun the same command")
    line = stop_message(_cfg(resume=True), signal.SIGTERM, TrainProgress(saved=3))  # (a --resume stopped while it starts)
    assert line == "stopped by SIGTERM before the first step: checkpoint step_3 is the latest; continue with the same command (it has --resume)"
    line = stop_message(_cfg(), signal.SIGTERM, TrainProgress(phase="final", finished=6, saved=6))
    assert line == "stopped by SIGTERM after step 6, while writing the final policy: checkpoint step_6 is the latest; continue with the same command and --resume"
