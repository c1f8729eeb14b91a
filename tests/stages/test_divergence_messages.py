"""The divergence guard's lines are true to their cause (#40 item 17): they name the metric that was not
finite (the reward's fault when it is the reward's), and with no checkpoint on disk they say so and
point to --overwrite, never to a resume from nothing ("the last good checkpoint is None; … --resume")."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from clihelp import assert_user_error, run_cli

pytestmark = pytest.mark.slow

SMALL = ["--engine", "hf", "--dtype", "fp32", "--group-size", "4", "--max-response-len", "8", "--seed", "0", "--prompts-per-step", "2",
         "--mini-batch-size", "8", "--micro-batch-size", "4", "--overlong-cache-len", "2", "--algo", "grpo"]


def test_the_lines_with_and_without_a_checkpoint() -> None:
    from reasonrl.stages.train import divergence_message, no_update_message

    cfg = SimpleNamespace(lr=1e3)
    grad = {"actor/pg_loss": 0.5, "actor/grad_norm": math.inf}
    line = divergence_message(5, grad, 3, cfg, Path("run/checkpoints/step_2"))
    assert "actor/grad_norm was not finite" in line and line.endswith("the last good checkpoint is step_2; try a lower --lr or a --grad-clip, then --resume")
    line = divergence_message(3, grad, 3, cfg, None)
    assert "None" not in line and "--resume" not in line and "nothing to resume" in line and line.endswith("then start over with --overwrite")
    line = no_update_message(1, {"rollout/reward_mean": math.nan, "actor/pg_loss": math.nan}, None)
    assert line.startswith("step 1 made no update (rollout/reward_mean was not finite)") and "check the reward (--reward)" in line
    assert "None" not in line and "--resume" not in line and "--lr" not in line, line
    line = no_update_message(4, {"actor/pg_loss": math.nan}, Path("run/checkpoints/step_3"))
    assert "actor/pg_loss was not finite" in line and line.endswith("the last good checkpoint is step_3; try a lower --lr or a --grad-clip, then --resume")


def test_divergence_before_any_checkpoint_says_start_over(prepared, tiny_model, tmp_path) -> None:
    """--save-every 0: the run diverges with nothing on disk; the line says so and names --overwrite."""
    out = tmp_path / "div"
    r = run_cli("train", "--model", tiny_model, "--data", prepared, "--out", out, "--steps", "10", "--save-every", "0", "--lr", "1e3", *SMALL)
    line = assert_user_error(r, "training diverged", "not finite for 3 steps in a row", "no checkpoint was written (nothing to resume)", "--overwrite")
    assert "--resume" not in line and "None" not in line, line
    assert not (out / "checkpoints" / "latest").exists()
