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


STARTING = """
import sys
from reasonrl.rewards import RewardScorer
if __name__ == "__main__":
    s = RewardScorer(num_workers=2)
    print("starting", flush=True)
    s.score_batch(["Answer: \\\\frac{1}{2}"], ["0.5"])  # the pool starts here: the kill lands somewhere in it
    print("ready", flush=True)
    import time
    time.sleep(600)
"""


def _marked(mark: str) -> list[int]:
    """Live processes whose environment carries ``mark`` (the killed parent's children, wherever they were reparented)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                env = (d / "environ").read_bytes()
            except OSError:
                continue
            if f"REASONRL_ORPHAN_MARK={mark}".encode() in env.split(b"\0") and _alive(int(d.name)):
                out.append(int(d.name))
    return out


def test_workers_exit_when_the_parent_is_killed_while_the_pool_starts(tmp_path) -> None:
    """A SIGKILL while the workers are being spawned (before their parent watch could start): the ones already
    spawned find their parent gone and exit, with multiprocessing's resource tracker after them."""
    script = tmp_path / "starting.py"
    script.write_text(STARTING)
    left = {}
    for i, delay in enumerate((0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.8, 1.5)):
        mark = f"{os.getpid()}-{i}"
        p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT), "REASONRL_ORPHAN_MARK": mark})
        assert p.stdout.readline().strip() == "starting"
        time.sleep(delay)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _marked(mark):
            time.sleep(0.2)
        left[delay] = _marked(mark)
        for pid in left[delay]:  # (clean up what a failure leaves)
            os.kill(pid, signal.SIGKILL)
    assert not any(left.values()), f"processes outlived their killed parent (by kill delay): {left}"
