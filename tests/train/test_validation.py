"""`train --val-every`: held-out curves during training that never change the training itself."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clihelp import assert_user_error, run_cli
from reasonrl.train.ranks import Ranks
from reasonrl.train.validation import Best, Validator, improved

SMALL = ["--engine", "hf", "--dtype", "fp32", "--group-size", "4", "--max-response-len", "8", "--seed", "0", "--prompts-per-step", "2",
         "--mini-batch-size", "8", "--micro-batch-size", "4", "--overlong-cache-len", "2", "--algo", "grpo", "--lr", "1e-3"]
VAL = ["--val-n", "2", "--val-bootstrap", "50", "--val-max-response-len", "8"]


def _lines(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def _val_lines(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "validation.jsonl").read_text().splitlines() if ln.strip()]


def _weights(d: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(d / "model.safetensors")


def _same_weights(a: Path, b: Path) -> bool:
    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all(bool((wa[k] == wb[k]).all()) for k in wa)


def test_validation_seeds_are_their_own_stream():
    v = Validator([{}] * 5, None, None, Ranks(), n=4, temperature=1.0, top_p=0.7, top_k=-1, max_tokens=8, max_prompt_len=64, ks=[1], seed=3)
    assert v.seeds(2) == v.seeds(2)  # (seed, step, problem) only: the same in a resumed run
    assert v.seeds(2) != v.seeds(3) and len(set(v.seeds(2))) == 5
    w = Validator([{}] * 5, None, None, Ranks(), n=4, temperature=1.0, top_p=0.7, top_k=-1, max_tokens=8, max_prompt_len=64, ks=[1], seed=4)
    assert set(v.seeds(2)).isdisjoint(w.seeds(2))


def test_best_and_patience():
    b = Best("val/avg@4", patience=2)
    assert b.update({"val/avg@4": 0.2}, 0) and b.value == 0.2 and b.step == 0
    assert not b.update({"val/avg@4": 0.2}, 2) and not b.stop  # a tie is not better
    assert b.update({"val/avg@4": 0.3}, 4) and b.since == 0
    assert not b.update({"val/avg@4": float("nan")}, 6)
    assert not b.update({"val/avg@4": 0.1}, 8) and b.stop
    c = Best("val/avg@4", patience=2)
    c.load(b.state())
    assert c.state() == b.state() and c.stop
    assert improved(10.0, 12.0, "val/response_length_mean") and not improved(0.5, 0.4, "val/truncated_frac")


@pytest.fixture(scope="module")
def plain_run(format_model, prepared, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("val") / "plain"
    r = run_cli("train", "--model", format_model, "--data", prepared, "--out", out, "--steps", "3", "--save-every", "1", *SMALL)
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def val_run(format_model, prepared, tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("val") / "validated"
    r = run_cli("train", "--model", format_model, "--data", prepared, "--out", out, "--steps", "3", "--save-every", "1", *SMALL,
                "--val-every", "2", *VAL, "--save-best", "val/avg@2")
    assert r.exit_code == 0, r.output
    return out, r.output


def test_validation_at_step_0_every_n_and_at_the_last_step(val_run):
    out, console = val_run
    lines = _lines(out)
    assert [m["step"] for m in lines] == [0, 1, 2, 3]
    validated = [m["step"] for m in lines if "val/avg@2" in m]
    assert validated == [0, 2, 3]
    for m in lines:
        if "val/avg@2" in m:
            assert 0 <= m["val/avg@2_ci_low"] <= m["val/avg@2"] <= m["val/avg@2_ci_high"] <= 1
            assert m["val/problems"] == 4 and m["perf/val_s"] > 0 and "val/maj@2" in m and "val/pass@1" in m
            assert 1 <= m["val/response_length_mean"] <= 8
    assert sum(1 for ln in console.splitlines() if ln.startswith("val ")) == 3
    best = json.loads((out / "best" / "best.json").read_text())
    vals = {m["step"]: m["val/avg@2"] for m in lines if "val/avg@2" in m}
    assert best["metric"] == "val/avg@2" and best["value"] == max(vals.values()) and vals[best["step"]] == best["value"]
    assert best["step"] == min(s for s, v in vals.items() if v == best["value"])  # the first to reach it
    assert (out / "best" / "model.safetensors").is_file() and (out / "best" / "tokenizer.json").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best"]["step"] == best["step"] and summary["early_stopped"] is False
    # validation.jsonl: one line per validation, each problem's values (in the same problem order), their mean the scalar
    per = _val_lines(out)
    assert [v["step"] for v in per] == [0, 2, 3]
    assert all(v["where"] == per[0]["where"] and len(set(v["where"])) == 4 and len(v["source"]) == 4 for v in per)
    for v in per:
        assert sum(v["avg@2"]) / 4 == pytest.approx(vals[v["step"]]) and len(v["pass@1"]) == len(v["maj@2"]) == 4
    assert "validation.jsonl" in json.loads((out / "manifest.json").read_text())["outputs"]


def test_validation_does_not_change_the_training(plain_run, val_run):
    """Its own seeds: the same weights and the same training metrics with validation on or off."""
    out, _ = val_run
    assert _same_weights(plain_run / "policy", out / "policy")
    drop = ("perf/", "val/")
    strip = lambda ms: [{k: v for k, v in m.items() if not k.startswith(drop)} for m in ms if m["step"] > 0]  # noqa: E731
    assert strip(_lines(plain_run)) == strip(_lines(out))


def test_a_resumed_run_validates_as_the_uninterrupted_one(val_run, format_model, prepared, tmp_path):
    """Resume from the step-1 checkpoint: the same validation values at steps 2 and 3, the same best."""
    full, _ = val_run
    out = tmp_path / "resumed"
    shutil.copytree(full, out)
    for p in ("policy", "manifest.json", "summary.json"):  # (best/ stays: a killed run keeps it)
        (shutil.rmtree if (out / p).is_dir() else Path.unlink)(out / p)
    for p in ("step_2", "step_3"):
        shutil.rmtree(out / "checkpoints" / p)
    (out / "checkpoints" / "latest").write_text("step_1\n")
    r = run_cli("train", "--model", format_model, "--data", prepared, "--out", out, "--steps", "3", "--save-every", "1", *SMALL,
                "--val-every", "2", *VAL, "--save-best", "val/avg@2", "--resume")
    assert r.exit_code == 0, r.output
    keep = lambda ms: [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in ms]  # noqa: E731
    assert keep(_lines(out)) == keep(_lines(full))
    assert _val_lines(out) == _val_lines(full)  # cut back to step 1, then steps 2 and 3 once each
    assert json.loads((out / "best" / "best.json").read_text()) == json.loads((full / "best" / "best.json").read_text())
    assert _same_weights(out / "policy", full / "policy")


def test_early_stop(format_model, prepared, tmp_path):
    out = tmp_path / "es"
    r = run_cli("train", "--model", format_model, "--data", prepared, "--out", out, "--steps", "6", *SMALL,
                "--val-every", "1", *VAL, "--save-best", "val/response_length_mean", "--early-stop-patience", "1", "--lr", "1e-9")
    assert r.exit_code == 0, r.output
    lines = _lines(out)
    last = lines[-1]["step"]
    assert last < 6 and "early stop at step" in r.output  # lr 1e-9: nothing changes, the length never beats step 0's
    summary = json.loads((out / "summary.json").read_text())
    assert summary["early_stopped"] is True and summary["steps"] == last
    assert (out / "checkpoints" / f"step_{last}").is_dir() and (out / "policy").is_dir() and (out / "manifest.json").is_file()


def test_validation_options_are_checked(format_model, prepared, tmp_path):
    base = ["train", "--model", format_model, "--data", prepared, "--out", tmp_path / "x", "--steps", "1", *SMALL]
    assert_user_error(run_cli(*base, "--save-best", "val/avg@2"), "needs validation", "--val-every")
    assert_user_error(run_cli(*base, "--val-every", "1", "--early-stop-patience", "2"), "--save-best")
    assert_user_error(run_cli(*base, "--val-every", "1", *VAL, "--save-best", "val/accuracy"), "not a validation metric", "val/avg@2")
    assert_user_error(run_cli(*base, "--val-every", "1", "--val-data", tmp_path / "missing.jsonl"), "not found")
