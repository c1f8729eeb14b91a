"""`reasonrl train` with the knobs ported from peers' recipes: an entropy bonus, Skywork-OR1's
adaptive entropy target and a cosine LR schedule, their metrics, and a run resumed from a
checkpoint equal to the uninterrupted one (the controller's state and the schedule included);
`pretrain-value` with the schedule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clihelp import assert_same_run, assert_user_error, crashed_copy, run_cli

pytestmark = pytest.mark.slow

SMALL = ["--engine", "hf", "--dtype", "fp32", "--group-size", "4", "--max-response-len", "8", "--seed", "0", "--prompts-per-step", "2",
         "--mini-batch-size", "8", "--micro-batch-size", "4", "--overlong-cache-len", "2", "--algo", "grpo"]
KNOBS = ["--lr", "1e-3", "--lr-schedule", "cosine", "--min-lr-ratio", "0.2", "--warmup-steps", "1",
         "--entropy-coef", "0.001", "--entropy-target", "1000", "--entropy-coef-delta", "0.01", "--entropy-coef-max", "0.025"]
STEPS = 4


def _lines(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln]


def test_cosine_and_adaptive_entropy_metrics_and_an_exact_resume(prepared, tiny_model, tmp_path):
    from reasonrl.train.backend import lr_factor

    args = ["train", "--model", tiny_model, "--data", prepared, "--steps", str(STEPS), "--save-every", "1", *SMALL, *KNOBS]
    full = tmp_path / "full"
    r = run_cli(*args, "--out", full)
    assert r.exit_code == 0, r.output
    lines = _lines(full)
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    # actor/lr follows the schedule: warm-up step 1 at 1e-3, then the cosine from 1e-3 towards 2e-4 at step 4
    want = [1e-3 * lr_factor(s, schedule="cosine", warmup_steps=1, total_steps=STEPS, min_lr_ratio=0.2) for s in range(STEPS)]
    assert [m["actor/lr"] for m in lines] == pytest.approx(want, rel=1e-12)
    assert want[0] == want[1] == 1e-3 and want[1] > want[2] > want[3] > 2e-4
    # the entropy (far) below its target: alpha rises by delta each step up to its cap, the bonus on every step
    assert [m["actor/entropy_coef"] for m in lines] == pytest.approx([0.001, 0.011, 0.021, 0.025], rel=1e-9)
    assert all(m["actor/entropy_loss"] < 0 and m["actor/entropy"] > 0 for m in lines)
    st = json.loads((full / "checkpoints" / "step_4" / "trainer_state.json").read_text())
    assert st["learner"] == {"entropy_coef": 0.025, "entropy_on": True}
    man = json.loads((full / "manifest.json").read_text())
    assert man["algo"]["entropy_target"] == 1000 and man["algo"]["entropy_coef"] == 0.001

    # a run that crashed after step 2, resumed: the same metrics and bitwise the same weights
    out = tmp_path / "resumed"
    crashed_copy(full, out, step=2, steps=4)
    r = run_cli(*args, "--out", out, "--resume")
    assert r.exit_code == 0, r.output
    assert_same_run(full, out)

    # a resume that would change the schedule's length is refused
    r = run_cli(*[a_ if a_ != str(STEPS) else "6" for a_ in args], "--out", out, "--resume")
    assert_user_error(r, "--steps 6", "the run's is 4", "--lr-schedule cosine", "--overwrite")


def test_fixed_entropy_bonus_on_the_cli(prepared, tiny_model, tmp_path):
    out = tmp_path / "fixed"
    r = run_cli("train", "--model", tiny_model, "--data", prepared, "--out", out, "--steps", "1", *SMALL, "--entropy-coef", "0.01")
    assert r.exit_code == 0, r.output
    (m,) = _lines(out)
    assert m["actor/entropy_coef"] == 0.01 and -0.01 * 20 < m["actor/entropy_loss"] < 0  # -alpha * mean H, H <= log V
    assert m["actor/lr"] == 1e-6  # the default schedule: constant, no warm-up
    r = run_cli("train", "--model", tiny_model, "--data", prepared, "--out", tmp_path / "bad", "--entropy-target", "0.2", "--entropy-coef", "0.01")
    assert_user_error(r, "entropy_coef 0.01", "entropy_coef_max 0.005")


def test_pretrain_value_takes_the_schedule(prepared, tiny_model, tmp_path):
    from reasonrl.train.backend import lr_factor

    out = tmp_path / "critic"
    r = run_cli("pretrain-value", "--model", tiny_model, "--data", prepared, "--out", out, "--steps", "3", "--prompts-per-step", "2", "--eval-prompts", "2",
                "--mini-batch-size", "8", "--micro-batch-size", "4", "--engine", "hf", "--dtype", "fp32", "--group-size", "4", "--max-response-len", "8",
                "--critic-lr", "1e-4", "--lr-schedule", "cosine", "--min-lr-ratio", "0", "--warmup-ratio", "0.3")
    assert r.exit_code == 0, r.output
    lrs = [m["critic/lr"] for m in _lines(out)]
    # --warmup-ratio 0.3 of 3 steps: ceil(0.9) = 1 warm-up step; then the cosine to 0 at step 3
    assert lrs == pytest.approx([1e-4 * lr_factor(s, schedule="cosine", warmup_steps=1, total_steps=3, min_lr_ratio=0.0) for s in range(3)], rel=1e-12)
    assert lrs[0] == lrs[1] == 1e-4 and 0 < lrs[2] < 1e-4


def test_token_budget_micro_batches_on_the_cli(prepared, tiny_model, tmp_path):
    """`--max-tokens-per-micro-batch` (with `--forward-mode packed`) trains (train and pretrain-value)
    and is in config.json; a negative budget, an unknown forward mode: one line (auto under ZeRO-3
    is allowed: its choice is the ranks' together, tests/train/test_deepspeed.py "3a")."""
    out = tmp_path / "budget"
    r = run_cli("train", "--model", tiny_model, "--data", prepared, "--out", out, "--steps", "1", *SMALL, "--max-tokens-per-micro-batch", "48",
                "--forward-mode", "packed")
    assert r.exit_code == 0, r.output
    (m,) = _lines(out)
    assert json.loads((out / "config.json").read_text())["max_tokens_per_micro_batch"] == 48 and "actor/grad_norm" in m
    critic = tmp_path / "critic"
    r = run_cli("pretrain-value", "--model", tiny_model, "--data", prepared, "--out", critic, "--steps", "1", "--engine", "hf", "--dtype", "fp32",
                "--group-size", "4", "--max-response-len", "8", "--prompts-per-step", "2", "--mini-batch-size", "8", "--micro-batch-size", "4",
                "--eval-prompts", "1", "--max-tokens-per-micro-batch", "48")
    assert r.exit_code == 0, r.output
    for stage in ("train", "pretrain-value"):
        r = run_cli(stage, "--model", tiny_model, "--data", prepared, "--out", tmp_path / f"bad-{stage}", "--max-tokens-per-micro-batch", "-1")
        assert_user_error(r, "max_tokens_per_micro_batch must be >= 0")
        r = run_cli(stage, "--model", tiny_model, "--data", prepared, "--out", tmp_path / f"bad2-{stage}", "--forward-mode", "fast")
        assert_user_error(r, "forward_mode must be one of shared, packed, plain, auto")
