"""SIGTERM at the end of a stage, sent by the process to itself at the exact point (no timing): once
`train`'s steps are over, or once `eval`'s manifest is written, the run is finished and a SIGTERM is
ignored to the process's exit: exit 0, the manifest there, no "did not finish" line. It used to be
raised by the CLI's restored handler ("… did not finish (no manifest.json written)", exit 143, with
the manifest written) or, in the interpreter's shutdown (Python puts the default action back for
every signal with a Python handler), to kill the process by the raw signal (returncode -15): the
chaos test's failure on a busy machine."""

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


def sigterm(at=AT, mark=str(MARK), os=os, signal=signal):  # (bound now: at shutdown the module's globals are gone)
    fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.write(fd, at.encode())
    os.close(fd)
    signal.raise_signal(signal.SIGTERM)


if AT == "train-loop-closed":  # the handlers the step loop found are back (the CLI's, inside the stage)
    import reasonrl.interrupts as I

    uninstall = I.StepStop.uninstall

    def uninstall_then_sigterm(self):
        uninstall(self)
        sigterm()

    I.StepStop.uninstall = uninstall_then_sigterm
elif AT == "eval-manifest":  # eval's manifest.json has just been written
    import reasonrl.stages.eval as E

    write_manifest = E.write_manifest

    def write_manifest_then_sigterm(*a, **k):
        write_manifest(*a, **k)
        sigterm()

    E.write_manifest = write_manifest_then_sigterm
elif AT == "shutdown":  # the interpreter's shutdown: __main__'s globals are cleared after the signal handlers were reset

    class AtShutdown:
        def __del__(self, sigterm=sigterm):
            sigterm()

    at_shutdown = AtShutdown()
from reasonrl.cli import main

main()
"""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("stage,at", [("train", "train-loop-closed"), ("train", "shutdown"), ("eval", "eval-manifest"), ("eval", "shutdown")])
def test_sigterm_after_the_run_finished_is_ignored(stage, at, tmp_path, tiny_model, prepared) -> None:
    script, mark, out = tmp_path / "driver.py", tmp_path / "signalled", tmp_path / "run"
    script.write_text(DRIVER)
    common = ["--model", tiny_model, "--engine", "hf", "--dtype", "fp32", "--max-response-len", "4", "--seed", "1"]
    if stage == "train":
        args = ["train", "--algo", "grpo", "--data", prepared, "--out", out, "--group-size", "2", "--prompts-per-step", "2",
                "--mini-batch-size", "4", "--micro-batch-size", "2", "--steps", "1", *common]
    else:
        args = ["eval", "file", "--dataset", prepared, "--out", out, "--n", "2", "--max-problems", "2", "--ks", "1", *common]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REASONRL_SIGNAL_AT": at, "REASONRL_SIGNAL_MARK": str(mark), "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, str(script), *map(str, args)], env=env, capture_output=True, text=True, timeout=500)
    assert mark.read_text() == at, p.stderr[-3000:]  # the signal was sent, at that point
    assert p.returncode == 0, (p.returncode, p.stderr[-3000:])  # (-15: killed by the raw signal; 143: "did not finish")
    assert "stopped by" not in p.stderr and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert json.loads((out / "manifest.json").read_text())["stage"] == stage
