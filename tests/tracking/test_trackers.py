"""--report-to: TensorBoard event files read back by TensorBoard's own reader, W&B offline run files,
the one-line errors for unknown, conflicting and uninstalled trackers."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clihelp import assert_user_error, run_cli

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--engine", "hf", "--dtype", "fp32", "--group-size", "4", "--max-response-len", "12", "--seed", "0"]
TRAIN = ["--prompts-per-step", "2", "--mini-batch-size", "4", "--micro-batch-size", "4", "--overlong-cache-len", "4", "--lr", "1e-4", *SMALL]


def jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def expected_scalars(m: dict) -> dict[str, float]:
    """What a tracker must show for one metrics.jsonl line, spelled out independently of the code:
    every number under its name, list entry i as name/bin_NN, dict entry k as name/k."""
    out = {}
    for k, v in m.items():
        if k == "step":
            continue
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not (isinstance(v, float) and math.isnan(v)):
            out[k] = float(v)
        elif isinstance(v, list):
            out.update({f"{k}/bin_{i:02d}": float(x) for i, x in enumerate(v) if not math.isnan(x)})
        elif isinstance(v, dict):
            out.update({f"{k}/{kk}": float(x) for kk, x in v.items()})
    return out


def test_scalars_flatten_vectors():
    from reasonrl.tracking import scalars

    m = {"step": 3, "actor/pg_loss": 0.5, "critic/value_by_position": [0.1, float("nan"), 0.3],
         "actor/clipfrac_by_prob": {"clip_upper/p0.0-0.1": 0.25}, "x/none": None, "_samples": [1]}
    assert scalars(m) == {"actor/pg_loss": 0.5, "critic/value_by_position/bin_00": 0.1, "critic/value_by_position/bin_02": 0.3,
                          "actor/clipfrac_by_prob/clip_upper/p0.0-0.1": 0.25}


@pytest.mark.parametrize("clock_back_s", [0, 3600])
def test_tensorboard_resume_keeps_each_step_once_whatever_the_clock(tmp_path, monkeypatch, clock_back_s):
    """A run logs steps 1-3 and dies after step 3; it resumes from step 2's checkpoint and logs a new
    step 3. TensorBoard reads the event files in name order, and a name begins with the wall clock:
    with the clock set back an hour (another machine), the resumed file is read first. Either way
    each tag holds steps 1, 2, 3 once, and step 3 is the resumed run's."""
    import time

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from reasonrl.tracking.backends import TensorBoardTracker

    first = TensorBoardTracker(tmp_path, name="r", config={"seed": 0})
    for step in (1, 2, 3):
        first.log(step, {"a": float(step), "b": 10.0 * step})
    first.close()
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now - clock_back_s + 1)  # +1: never the first file's own second
    resumed = TensorBoardTracker(tmp_path, name="r", config={"seed": 0}, start_step=2)
    resumed.log(3, {"a": 33.0, "b": 333.0})
    resumed.close()
    monkeypatch.undo()
    names = sorted(p.name for p in (tmp_path / "tensorboard").iterdir())
    assert len(names) == 2 and all("tfevents" in n for n in names), names
    ea = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    ea.Reload()
    for tag, want in (("a", {1: 1.0, 2: 2.0, 3: 33.0}), ("b", {1: 10.0, 2: 20.0, 3: 333.0})):
        events = ea.Scalars(tag)
        assert sorted(e.step for e in events) == [1, 2, 3], (tag, [e.step for e in events])
        assert {e.step: e.value for e in events} == want
    assert "config/text_summary" in ea.Tags()["tensors"]  # the first run's step-0 text is kept


@pytest.mark.slow
def test_train_tensorboard_events_read_by_tensorboard(prepared, tiny_model, tmp_path):
    """PPO (critic, clip buckets, by-position vectors) for 3 steps, checkpoints at 2 and 3; then a
    crash is simulated (step 3's checkpoint lost, step 3 already logged) and the run resumed: every
    tag holds steps 1, 2, 3 once each (the resumed tracker drops the first step 3 from the old file),
    and every value equals metrics.jsonl's."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "ppo"
    base = ["train", "--algo", "ppo", "--model", tiny_model, "--data", prepared, "--out", out, "--save-every", "2", "--steps", "3",
            "--report-to", "tensorboard", *TRAIN]
    r = run_cli(*base)
    assert r.exit_code == 0, r.output
    shutil.rmtree(out / "checkpoints" / "step_3")  # as if the run died after logging step 3, before its checkpoint
    (out / "checkpoints" / "latest").write_text("step_2")
    r = run_cli(*base, "--resume")
    assert r.exit_code == 0, r.output
    assert "resumed" in r.output

    lines = jsonl(out / "metrics.jsonl")
    last = {m["step"]: m for m in lines}  # the resumed step 3 is the one that counts
    assert sorted(last) == [1, 2, 3]
    ea = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    want = {k for m in last.values() for k in expected_scalars(m)}
    assert want <= tags, sorted(want - tags)
    for tag in ("actor/pg_loss", "critic/vf_loss", "actor/entropy", "critic/value_by_position/bin_00", "actor/advantage_by_position/bin_00",
                "actor/clipfrac_by_prob/clip_upper/p0.0-0.1", "perf/step_s", "rollout/acc_mean"):
        assert tag in tags, tag
    for tag in want:
        events = ea.Scalars(tag)
        steps = [e.step for e in events]
        logged = sorted(s for s, m in last.items() if tag in expected_scalars(m))
        assert sorted(steps) == logged, (tag, steps)  # in file order: a clock set back puts the resumed file first
        for e in events:
            assert e.value == pytest.approx(expected_scalars(last[e.step])[tag], rel=1e-5, abs=1e-6), (tag, e.step)


@pytest.mark.slow
def test_train_wandb_offline_run_holds_the_history(prepared, tiny_model, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from wandb_file import config, history

    wdir = tmp_path / "wandb_dir"
    wdir.mkdir()
    for k, v in {"WANDB_MODE": "offline", "WANDB_DIR": wdir, "WANDB_CONFIG_DIR": tmp_path / "wcfg", "WANDB_CACHE_DIR": tmp_path / "wcache",
                 "WANDB_DATA_DIR": tmp_path / "wdata", "WANDB_SILENT": "true", "WANDB_PROJECT": "reasonrl-test"}.items():
        monkeypatch.setenv(k, str(v))
    out = tmp_path / "grpo"
    r = run_cli("train", "--algo", "grpo", "--model", tiny_model, "--data", prepared, "--out", out, "--steps", "2", "--report-to", "wandb", *TRAIN)
    assert r.exit_code == 0, r.output
    files = list(wdir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    rows = history(files[0])
    assert [row["_step"] for row in rows] == [1, 2]
    for row, m in zip(rows, jsonl(out / "metrics.jsonl")):
        exp = expected_scalars(m)
        assert set(exp) <= set(row), sorted(set(exp) - set(row))
        for k, v in exp.items():
            assert row[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
    cfg = config(files[0])
    assert cfg["algo"] in ("grpo", {"value": "grpo"}) and "report_to" in cfg


def test_unknown_tracker_and_none_with_others_are_one_line_errors(tmp_path):
    assert_user_error(run_cli("train", "--report-to", "tensorbored", "--out", tmp_path / "x"), "unknown tracker 'tensorbored'", "tensorboard, wandb")
    assert_user_error(run_cli("eval", "aime", "--report-to", "none,tensorboard", "--out", tmp_path / "y"), "cannot be combined")


@pytest.mark.parametrize("tracker,package", [("wandb", "wandb"), ("mlflow", "mlflow"), ("trackio", "trackio")])
def test_uninstalled_tracker_is_a_one_line_error(tracker, package, tmp_path):
    """The real 'not installed' condition: the package is made unimportable (sys.modules[name] =
    None, what Python does for a module that must not load) in a fresh CLI process."""
    code = (f"import sys; sys.modules[{package!r}] = None; sys.argv = ['reasonrl'] + sys.argv[1:];"
            "from reasonrl.cli import main; main()")
    p = subprocess.run([sys.executable, "-c", code, "pretrain-value", "--report-to", f"tensorboard,{tracker}", "--out", str(tmp_path / "pv")],
                       capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert p.returncode == 1, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in p.stderr, p.stderr
    assert f"--report-to {tracker} needs the '{package}' package, which is not installed: pip install 'reasonrl[{tracker}]'" in errors[0]
    assert not (tmp_path / "pv").exists()  # nothing written
