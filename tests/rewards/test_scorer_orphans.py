"""Scorer workers die with their parent: a SIGKILLed trainer leaves no verifier process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys, time
from reasonrl.rewards import RewardScorer
if __name__ == "__main__":
    s = RewardScorer(num_workers=2)
    s.score_batch(["Answer: \\\\frac{1}{2}"], ["0.5"])  # math-verify: the pool is started
    print("ready", flush=True)
    time.sleep(600)
"""


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_workers_exit_when_the_parent_is_killed(tmp_path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(SCRIPT)
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.stdout.readline().strip() == "ready"
    workers = [c for c in _children(p.pid) if _alive(c)]
    assert len(workers) >= 2, workers  # (plus multiprocessing's resource tracker)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.2)
    assert not [w for w in workers if _alive(w)], "verifier workers outlived their parent"
