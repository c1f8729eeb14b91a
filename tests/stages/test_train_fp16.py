"""`reasonrl train --dtype fp16`: PPO (actor and critic) trains under fp16 autocast with dynamic loss
scaling (``actor/loss_scale``, ``critic/loss_scale``, ``*/overflow``), the engine samples in float16,
and a run crashed after a checkpoint resumes bitwise (the scalers' state is in the checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clihelp import assert_same_run, crashed_copy, run_cli

pytestmark = pytest.mark.slow

ARGS = ["--engine", "hf", "--dtype", "fp16", "--algo", "ppo", "--group-size", "4", "--max-response-len", "8", "--seed", "0",
        "--prompts-per-step", "2", "--mini-batch-size", "8", "--micro-batch-size", "4", "--lr", "1e-3", "--save-every", "1"]


def _lines(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln]


def test_fp16_trains_with_loss_scaling_and_resumes_bitwise(prepared, tiny_model, tmp_path):
    args = ["train", "--model", tiny_model, "--data", prepared, "--steps", "3", *ARGS]
    full = tmp_path / "full"
    r = run_cli(*args, "--out", full)
    assert r.exit_code == 0, r.output
    lines = _lines(full)
    assert [m["step"] for m in lines] == [1, 2, 3]
    for m in lines:
        assert m["actor/loss_scale"] >= 1 and m["critic/loss_scale"] >= 1
        assert 0 <= m["actor/overflow"] <= 1 and 0 <= m["critic/overflow"] <= 1
    assert json.loads((full / "config.json").read_text())["dtype_resolved"] == "fp16"
    out = tmp_path / "crashed"
    crashed_copy(full, out, step=1, steps=3)
    r = run_cli(*args, "--out", out, "--resume")
    assert r.exit_code == 0, r.output
    assert_same_run(full, out)
