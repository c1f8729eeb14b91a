"""Chaos: SIGKILL the real CLI at random moments and resume; the run must end as if nothing happened.

`reasonrl train` (HF engine, fp32, the format-taught tiny model, DAPO with dynamic sampling) is
killed with SIGKILL at >= 10 random moments (some timed to land while a checkpoint is being
written), and rerun each time the way a user would: `--resume` when a checkpoint exists, else
`--overwrite`. The final weights must be bitwise equal to an uninterrupted run's, metrics.jsonl must
hold each step exactly once with the same values, and the checkpoints must be the same. The other
stages are killed too: a half-written output is refused by the next stage, and rerunning the
command finishes it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6
KILLS = 10


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}


def _cmd(*args: object) -> list[str]:
    return [sys.executable, "-m", "reasonrl.cli", *[str(a) for a in args]]


def _train_args(model: Path, data: Path, out: Path) -> list[object]:
    return ["train", "--algo", "dapo", "--model", model, "--data", data, "--out", out, "--engine", "hf", "--dtype", "fp32",
            "--group-size", "4", "--max-response-len", "8", "--prompts-per-step", "2", "--mini-batch-size", "4", "--micro-batch-size", "2",
            "--max-gen-rounds", "2", "--overlong-cache-len", "2", "--lr", "1e-3", "--save-every", "1", "--steps", STEPS, "--seed", "3"]


def _metrics(out: Path) -> list[dict]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in lines]


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def _lines(out: Path) -> int:
    try:
        return sum(1 for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip())
    except OSError:
        return 0


def _kill_when(p: subprocess.Popen, out: Path, *, at_checkpoint: bool, after_lines: int, extra_s: float) -> str:
    """SIGKILL ``p`` as soon as a checkpoint is being written (``at_checkpoint``), or ``extra_s``
    seconds after metrics.jsonl reached ``after_lines`` lines (a random moment inside the next step:
    generation, scoring, update, sync or checkpoint); returns what was happening, or "finished"."""
    reached = None
    while p.poll() is None:
        writing = list((out / "checkpoints").glob(".step_*.tmp")) if (out / "checkpoints").is_dir() else []
        if reached is None and _lines(out) >= after_lines:
            reached = time.monotonic()
        if (at_checkpoint and writing) or (not at_checkpoint and reached is not None and time.monotonic() - reached >= extra_s):
            p.send_signal(signal.SIGKILL)
            p.wait()
            return "mid-checkpoint" if writing else "mid-step"
        time.sleep(0.002 if at_checkpoint else 0.01)
    return "finished"


def _done_steps(out: Path) -> int:
    latest = out / "checkpoints" / "latest"
    try:
        return int(latest.read_text().strip().removeprefix("step_"))
    except (OSError, ValueError):
        return 0


def test_sigkill_anywhere_then_resume_is_the_same_run(format_model, tmp_path, toy_data_file) -> None:
    data = tmp_path / "data"
    subprocess.run(_cmd("prepare-data", toy_data_file, "--out", data, "--template", "none", "--val-size", "4"), env=_env(), check=True,
                   capture_output=True, timeout=300)
    # The uninterrupted run; its time per step sets how far into a step a kill lands.
    ref = tmp_path / "ref"
    t0 = time.monotonic()
    p = subprocess.Popen(_cmd(*_train_args(format_model, data, ref)), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while p.poll() is None and _lines(ref) < 1:
        time.sleep(0.05)
    startup = time.monotonic() - t0
    _, err = p.communicate(timeout=900)
    assert p.returncode == 0, err[-3000:]
    per_step = max((time.monotonic() - t0 - startup) / (STEPS - 1), 0.05)

    out = tmp_path / "chaos"
    rng = random.Random(0)
    kills: list[str] = []
    launches = 0
    while True:
        resume = (out / "checkpoints").is_dir() and any((out / "checkpoints").glob("step_*"))
        args = _train_args(format_model, data, out) + (["--resume"] if resume else ["--overwrite"])
        proc = subprocess.Popen(_cmd(*args), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        launches += 1
        if len(kills) < KILLS:
            done = _done_steps(out)
            # a random moment of a random remaining step (or of the start-up, before any step)
            target = rng.randint(done, STEPS - 1) if done < STEPS else done
            extra = rng.uniform(0.2, 1.0) * startup if target == done else rng.uniform(0.0, 0.9) * per_step  # (startup: to the 1st step's end)
            what = _kill_when(proc, out, at_checkpoint=len(kills) % 4 == 3, after_lines=target, extra_s=extra)
            if what != "finished":
                kills.append(what)
                print(f"chaos: kill {len(kills)} {what} (launch {launches}, {_done_steps(out)} steps checkpointed)", file=sys.stderr)
                continue
            assert proc.returncode == 0, proc.stderr.read()[-3000:] if proc.stderr else ""
            shutil.rmtree(out)  # it ended before the kill: start over
            continue
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        break
    assert len(kills) >= KILLS and "mid-checkpoint" in kills, kills

    assert _metrics(out) == _metrics(ref)  # every step exactly once, with the same values
    assert [m["step"] for m in _metrics(out)] == list(range(1, STEPS + 1))
    a, b = _weights(ref / "policy"), _weights(out / "policy")
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a), "final weights differ"
    ckpts = lambda d: sorted(x.name for x in (d / "checkpoints").iterdir())  # noqa: E731
    assert ckpts(out) == ckpts(ref)
    for n in range(1, STEPS + 1):
        st_ref = json.loads((ref / "checkpoints" / f"step_{n}" / "trainer_state.json").read_text())
        assert json.loads((out / "checkpoints" / f"step_{n}" / "trainer_state.json").read_text()) == st_ref
    print(f"chaos: {len(kills)} SIGKILLs ({', '.join(kills)}) over {launches} launches; final weights bitwise equal")


@pytest.mark.parametrize("stage", ["prepare-data", "pretrain-value", "eval"])
def test_sigkill_in_other_stages(stage, format_model, tmp_path) -> None:
    """Killed mid-run: the next stage refuses the half-written output (no manifest), and rerunning
    the same command finishes it."""
    shared = ROOT.parent / "shared" / "data" / "gsm8k_train.jsonl"
    src = shared if shared.is_file() else ROOT / "data" / "gsm8k_test.jsonl"
    data = tmp_path / "data"
    prep = _cmd("prepare-data", src, "--out", data, "--template", "none", "--val-size", "8", "--overwrite")
    if stage != "prepare-data":
        subprocess.run(prep, env=_env(), check=True, capture_output=True, timeout=600)
    out = tmp_path / stage
    cmd = {
        "prepare-data": prep,
        "pretrain-value": _cmd("pretrain-value", "--model", format_model, "--data", data, "--out", out, "--engine", "hf", "--dtype", "fp32",
                               "--steps", "3", "--prompts-per-step", "2", "--group-size", "2", "--max-response-len", "8", "--eval-prompts", "2"),
        "eval": _cmd("eval", "file", "--dataset", data, "--model", format_model, "--out", out, "--engine", "hf", "--dtype", "fp32", "--n", "2",
                     "--max-response-len", "8", "--max-problems", "8"),
    }[stage]
    target = data if stage == "prepare-data" else out
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    while proc.poll() is None and not (target.is_dir() and any(target.iterdir())):  # as soon as it has written something
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (target / "manifest.json").exists()
    if stage == "prepare-data":
        nxt = subprocess.run(_cmd("train", "--data", data, "--model", format_model, "--out", tmp_path / "t"), env=_env(), capture_output=True, text=True)
        assert nxt.returncode == 1 and "manifest.json" in nxt.stderr and "prepare-data" in nxt.stderr, nxt.stderr[-2000:]
    elif stage == "pretrain-value":
        nxt = subprocess.run(_cmd("train", "--algo", "vcppo", "--critic", out, "--data", data, "--model", format_model, "--out", tmp_path / "t"),
                             env=_env(), capture_output=True, text=True)
        assert nxt.returncode == 1 and "pretrain-value" in nxt.stderr and "Traceback" not in nxt.stderr, nxt.stderr[-2000:]
    again = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (target / "manifest.json").is_file()
