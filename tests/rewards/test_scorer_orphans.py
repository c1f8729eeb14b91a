"""Scorer workers die with their parent: a SIGKILLed trainer leaves no verifier process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


# ------------------------------------------------------------------ a stop while a worker is being spawned (#43)

#: The real CLI, run by this script as its __main__: the scorer as `train` and `eval` use it. A worker
#: imports its parent's main script (as __mp_main__) before it unpickles its state (the pool's queues
#: and semaphores), so the script's worker branch holds a freshly spawned worker there until the
#: parent has released what it owns at exit (its last exit finalizer), then lets it go on: the moment
#: the traceback of #43 came from. The parent branch makes the SIGTERM land as a worker of the pool
#: has just been spawned (when the pool's first process has started), the window of #43.
WINDOW = """
import os, signal, sys, time
from pathlib import Path

MARK = Path(os.environ["REASONRL_WINDOW_DIR"])
if __name__ == "__mp_main__":  # a worker, at its start
    (MARK / f"worker-{os.getpid()}").write_text("")
    deadline = time.monotonic() + 60
    while not (MARK / "released").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
elif __name__ == "__main__":
    import multiprocessing.process
    import multiprocessing.util

    # exit priority 0 and made first: runs after the parent's other finalizers (its semaphores' unlinks)
    multiprocessing.util.Finalize(None, (MARK / "released").touch, exitpriority=0)
    start = multiprocessing.process.BaseProcess.start

    def start_then_sigterm(self):
        start(self)
        if not (MARK / "signalled").exists():
            (MARK / "signalled").write_text(str(self.pid))
            signal.raise_signal(signal.SIGTERM)

    multiprocessing.process.BaseProcess.start = start_then_sigterm
    from reasonrl.cli import main

    main()
"""

REWARD = "def parity(response, ground_truth, **info):\n    return len(response) % 2 == 0\n"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("stage", ["train", "eval"])
def test_a_sigterm_while_a_worker_is_spawned_is_one_line(stage, tmp_path, tiny_model, prepared) -> None:
    """SIGTERM lands as the pool's first worker is spawned; the worker unpickles its state only after the
    parent has released everything it would at exit. The run ends with its one line (exit 143), and no
    worker prints anything (#43: a FileNotFoundError traceback from SemLock._rebuild) or outlives it."""
    script, mark = tmp_path / "window.py", tmp_path / "mark"
    script.write_text(WINDOW)
    mark.mkdir()
    (tmp_path / "reward.py").write_text(REWARD)
    common = ["--model", tiny_model, "--engine", "hf", "--dtype", "fp32", "--max-response-len", "4", "--seed", "1",
              "--reward", f"{tmp_path / 'reward.py'}:parity"]
    if stage == "train":
        args = ["train", "--algo", "grpo", "--data", prepared, "--out", tmp_path / "run", "--group-size", "2", "--prompts-per-step", "2",
                "--mini-batch-size", "4", "--micro-batch-size", "2", "--steps", "1", *common]
    else:
        args = ["eval", "file", "--dataset", prepared, "--out", tmp_path / "run", "--n", "2", "--max-problems", "2", "--ks", "1", *common]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REASONRL_WINDOW_DIR": str(mark), "REASONRL_ORPHAN_MARK": f"{os.getpid()}-w{stage}",
           "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, str(script), *map(str, args)], env=env, capture_output=True, text=True, timeout=500)
    assert (mark / "signalled").exists(), p.stderr[-3000:]  # the signal came as a worker was being spawned
    assert p.returncode == 143, p.stderr[-3000:]
    stops = [ln for ln in p.stderr.splitlines() if ln.startswith("stopped by SIGTERM")]
    assert len(stops) == 1 and "Traceback" not in p.stderr and "Error" not in p.stderr, p.stderr[-3000:]
    assert p.stderr.rstrip().endswith(stops[0]), p.stderr[-3000:]  # (nothing after the one line)
    deadline = time.monotonic() + 30  # (multiprocessing's resource tracker exits just after its parent)
    while time.monotonic() < deadline and _marked(f"{os.getpid()}-w{stage}"):
        time.sleep(0.2)
    assert not _marked(f"{os.getpid()}-w{stage}"), "a process outlived the stopped run"


#: A Ctrl-C (SIGINT to the process group) that reaches a worker still bootstrapping: the worker sends it to
#: itself at its start (importing its parent's main script), before its initializer ran.
CTRL_C = """
import os, signal, sys
if __name__ == "__mp_main__":
    os.kill(os.getpid(), signal.SIGINT)
elif __name__ == "__main__":
    from reasonrl.rewards import RewardScorer

    with RewardScorer(num_workers=1) as s:
        scores, st = s.score_batch(["Answer: \\\\frac{1}{2}"], ["0.5"])  # math-verify: the pool starts
    print(scores[0].status, scores[0].correct, st.errors, flush=True)
"""


def test_a_ctrl_c_to_a_worker_still_starting_prints_nothing(tmp_path) -> None:
    """Workers are spawned with SIGINT and SIGTERM blocked until their initializer ignores them: a Ctrl-C
    that lands on one while it bootstraps neither kills it with a KeyboardInterrupt traceback nor breaks
    the pool's start (the item used to score an error, with the worker's traceback on the console)."""
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0 and p.stdout.split() == ["ok", "True", "0"], (p.stdout, p.stderr[-3000:])
    assert "Traceback" not in p.stderr and "KeyboardInterrupt" not in p.stderr, p.stderr[-3000:]
