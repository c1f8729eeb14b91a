"""SIGTERM or Ctrl-C (SIGINT) at the end of a stage, sent by the process to itself at the exact point
(no timing): once `train`'s steps are over, or once any stage's manifest is written (prepare-data,
pretrain-value, rollout, eval, report), the run is finished and the signal is ignored to the
process's exit: exit 0, the manifest there, no "did not finish" line. It used to be raised by the
CLI's restored handler ("… did not finish (no manifest.json written)", exit 143, with the manifest
written; eval alone was mended first, the other stages still said so between their manifest and
their return, and a Ctrl-C raised KeyboardInterrupt in every stage) or, in the interpreter's shutdown
(Python puts the default action back for every signal with a Python handler), to kill the process by
the raw signal (returncode -15): the chaos test's failure on a busy machine.

In-process (the Python API), a stage stopped by a signal leaves the caller's handlers as they were
(it left both signals ignored: every later Ctrl-C of the caller, and of its subprocesses, was lost)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Runs the CLI with one hook that sends SIGTERM to this process at the point REASONRL_SIGNAL_AT names.
DRIVER = """
import os, signal, sys
from pathlib import Path

AT, MARK = os.environ["REASONRL_SIGNAL_AT"], Path(os.environ["REASONRL_SIGNAL_MARK"])
SIGNUM = getattr(signal, os.environ.get("REASONRL_SIGNAL", "SIGTERM"))


def sigterm(at=AT, mark=str(MARK), os=os, signal=signal, signum=SIGNUM):  # (bound now: at shutdown the module's globals are gone)
    fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.write(fd, at.encode())
    os.close(fd)
    signal.raise_signal(signum)


if AT == "train-loop-closed":  # the handlers the step loop found are back (the CLI's, inside the stage)
    import reasonrl.interrupts as I

    uninstall = I.StepStop.uninstall

    def uninstall_then_sigterm(self):
        uninstall(self)
        sigterm()

    I.StepStop.uninstall = uninstall_then_sigterm
elif AT.endswith("-manifest"):  # the stage's manifest.json has just been written (eval-manifest: reasonrl.stages.eval's)
    import importlib

    S = importlib.import_module("reasonrl.stages." + AT.removesuffix("-manifest").replace("-", "_"))
    write_manifest = S.write_manifest

    def write_manifest_then_sigterm(*a, **k):
        write_manifest(*a, **k)
        sigterm()

    S.write_manifest = write_manifest_then_sigterm
elif AT == "shutdown":  # the interpreter's shutdown: __main__'s globals are cleared after the signal handlers were reset

    class AtShutdown:
        def __del__(self, sigterm=sigterm):
            sigterm()

    at_shutdown = AtShutdown()
from reasonrl.cli import main

main()
"""


ROOT_DATA = ROOT / "tests" / "report" / "data" / "main"  # a real main job's runs (report's input, read only)
GEN = ["--engine", "hf", "--dtype", "fp32", "--max-response-len", "4", "--seed", "1"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("stage,at,sig", [("train", "train-loop-closed", "SIGTERM"), ("train", "train-loop-closed", "SIGINT"),
                                          ("train", "shutdown", "SIGTERM"),
                                          ("eval", "eval-manifest", "SIGTERM"), ("eval", "eval-manifest", "SIGINT"), ("eval", "shutdown", "SIGTERM"),
                                          ("prepare-data", "prepare-data-manifest", "SIGTERM"), ("prepare-data", "prepare-data-manifest", "SIGINT"),
                                          ("pretrain-value", "pretrain-value-manifest", "SIGTERM"), ("rollout", "rollout-manifest", "SIGTERM"),
                                          ("report", "report-manifest", "SIGTERM"), ("report", "report-manifest", "SIGINT")])
def test_a_signal_after_the_run_finished_is_ignored(stage, at, sig, tmp_path, request) -> None:
    script, mark, out = tmp_path / "driver.py", tmp_path / "signalled", tmp_path / "run"
    script.write_text(DRIVER)
    model = lambda: ["--model", request.getfixturevalue("tiny_model")]  # noqa: E731 (only the stages that need them build them)
    data = lambda: request.getfixturevalue("prepared")  # noqa: E731
    args = {
        "train": lambda: ["train", "--algo", "grpo", "--data", data(), "--out", out, "--group-size", "2", "--prompts-per-step", "2",
                          "--mini-batch-size", "4", "--micro-batch-size", "2", "--steps", "1", *model(), *GEN],
        "eval": lambda: ["eval", "file", "--dataset", data(), "--out", out, "--n", "2", "--max-problems", "2", "--ks", "1", *model(), *GEN],
        "prepare-data": lambda: ["prepare-data", request.getfixturevalue("toy_data_file"), "--out", out, "--template", "none", "--val-size", "4"],
        "pretrain-value": lambda: ["pretrain-value", "--data", data(), "--out", out, "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
                                   "--eval-prompts", "1", "--mini-batch-size", "4", "--micro-batch-size", "2", *model(), *GEN],
        "rollout": lambda: ["rollout", "--data", data(), "--out", out, "--num-prompts", "2", "--group-size", "2", *model(), *GEN],
        "report": lambda: ["report", ROOT_DATA, "--out", out],
    }[stage]()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REASONRL_SIGNAL_AT": at, "REASONRL_SIGNAL_MARK": str(mark), "REASONRL_SIGNAL": sig,
           "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, str(script), *map(str, args)], env=env, capture_output=True, text=True, timeout=500)
    assert mark.read_text() == at, p.stderr[-3000:]  # the signal was sent, at that point
    assert p.returncode == 0, (p.returncode, p.stderr[-3000:])  # (-15: killed by the raw signal; 143 / 130: "did not finish")
    assert "stopped by" not in p.stderr and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert json.loads((out / "manifest.json").read_text())["stage"] == stage
