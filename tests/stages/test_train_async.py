"""`reasonrl train --async-steps K`: the engine in its own process generates step t+1's first round
while step t trains; its tokens lag by one version (corrected by default), the batch in flight is
part of every checkpoint, and a run resumed from a middle checkpoint is the uninterrupted one.
(Killed by SIGKILL and SIGTERM at random moments: tests/stages/test_chaos.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from clihelp import assert_same_run, assert_user_error, crashed_copy, run_cli

pytestmark = pytest.mark.slow

SMALL = ["--algo", "grpo", "--engine", "hf", "--dtype", "fp32", "--group-size", "4", "--max-response-len", "8", "--seed", "0", "--prompts-per-step", "2",
         "--mini-batch-size", "8", "--micro-batch-size", "4", "--overlong-cache-len", "2", "--lr", "1e-3"]


def _lines(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln]


def test_async_steps_train_one_step_off_and_resume_exactly(prepared, format_model, tmp_path):
    args = ["train", "--model", format_model, "--data", prepared, "--steps", "4", "--save-every", "1", "--async-steps", "1", "--engine-threads", "1",
            *SMALL]
    full = tmp_path / "full"
    r = run_cli(*args, "--out", full)
    assert r.exit_code == 0, r.output
    lines = _lines(full)
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    # Step 1's batch is sampled by the initial policy (nothing ahead yet); every later step's first
    # round by the policy one version older than the one it trains: corrected, as stale tokens are.
    assert all(m["rollout/staleness_max"] <= 1 and m["rollout/ahead_lag"] == int(m["step"] > 1) for m in lines)
    assert lines[0]["rollout/staleness_max"] == 0 and all(m["rollout/staleness_max"] == 1 and m["rollout/stale_token_frac"] > 0 for m in lines[1:])
    assert all(m["actor/correction_scope_frac"] > 0 for m in lines[1:])
    # The batch in flight is part of each checkpoint: step_2 holds step 3's, sampled by version 2.
    held = torch.load(full / "checkpoints" / "step_2" / "ahead.pt", weights_only=True)["batches"]
    assert [(b["step"], b["version"]) for b in held] == [(3, 2)] and len(held[0]["finish"]) == 2 * 4
    assert json.loads((full / "config.json").read_text())["async_steps"] == 1

    out = tmp_path / "resumed"  # a run that crashed after step 2
    crashed_copy(full, out, step=2, steps=4)
    r = run_cli(*args, "--out", out, "--resume")
    assert r.exit_code == 0, r.output
    assert_same_run(full, out)


def test_async_steps_refuse_what_they_do_not_support(prepared, format_model, tmp_path):
    base = ["train", "--model", format_model, "--data", prepared, "--out", tmp_path / "x", "--steps", "1", *SMALL]
    r = run_cli(*base, "--async-steps", "1", "--partial-rollout-len", "2", "--max-gen-rounds", "4")
    assert_user_error(r, "use --async-steps 0 with --partial-rollout-len")
    r = run_cli(*base, "--engine-cpus", "1")
    assert_user_error(r, "--engine-cpus and --engine-gpus set the engine's own process")
    r = run_cli(*base, "--async-steps", "1", "--max-staleness", "0")
    assert_user_error(r, "above --max-staleness 0")
    assert not (tmp_path / "x").exists()
