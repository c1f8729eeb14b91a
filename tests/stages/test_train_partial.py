"""`reasonrl train --partial-rollout-len`: responses generated a segment at a time and carried
across steps, their metrics, the pool in the checkpoint, and a run resumed from a middle checkpoint
equal to the uninterrupted one (the same responses continued with the same seeds, the same weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clihelp import assert_same_run, assert_user_error, crashed_copy, run_and_resume, run_cli, step_rollouts

pytestmark = pytest.mark.slow

SMALL = ["--engine", "hf", "--dtype", "fp32", "--group-size", "4", "--max-response-len", "8", "--seed", "0", "--prompts-per-step", "2",
         "--mini-batch-size", "8", "--micro-batch-size", "4", "--overlong-cache-len", "2", "--lr", "1e-3"]


def _lines(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln]


def test_partial_rollouts_carry_responses_across_steps_and_resume_exactly(prepared, format_model, tmp_path):
    args = ["train", "--model", format_model, "--data", prepared, "--steps", "4", "--save-every", "1", "--partial-rollout-len", "2", "--keep-rollouts", *SMALL]
    full = tmp_path / "full"
    r = run_cli(*args, "--out", full)
    assert r.exit_code == 0, r.output
    lines = _lines(full)
    assert all(0 <= m["rollout/partial_stale_frac"] <= 1 and 0 <= m["rollout/ds_kept_frac"] <= 1 and m["rollout/response_length_max"] <= 8 for m in lines)
    # Every response needs several segments of 2 tokens ("Answer: d" and EOS), so each step leaves
    # responses going, and the pool goes into the checkpoint.
    assert all(m["rollout/partial_open_responses"] > 0 for m in lines)
    # With no other option, the tokens sampled by an older policy are corrected (token TIS, C = 2),
    # and only they: the correction's scope is the stale tokens' share of the loss tokens.
    stale = [m for m in lines if m["rollout/stale_token_frac"] > 0]
    assert stale and max(m["rollout/staleness_max"] for m in lines) >= 1
    assert all(m["actor/correction_scope_frac"] > 0 and 0 < m["actor/correction_weight_mean"] <= 2.0 for m in stale)
    assert all(m["rollout/staleness_mean"] <= m["rollout/staleness_max"] for m in lines)
    assert all(k in lines[0] for k in ("rollout/mismatch_k1", "rollout/mismatch_k1_seq", "rollout/mismatch_k3_seq", "rollout/mismatch_chi2",
                                        "rollout/mismatch_chi2_seq", "rollout/mismatch_ratio_max", "rollout/token_mult_prob_error"))
    st = json.loads((full / "checkpoints" / "step_2" / "trainer_state.json").read_text())
    assert len(st["data"]["partial"]["open"]) == lines[1]["rollout/partial_open_groups"] > 0
    assert json.loads((full / "config.json").read_text())["partial_rollout_len"] == 2
    # --keep-rollouts: a step's file holds the responses finished in it, each response in one file;
    # kept = trained (a group finished beyond its step's batch is trained in the next step).
    files = [step_rollouts(full, s) for s in (1, 2, 3, 4)]
    groups = [x["group"] for rows in files for x in rows]
    assert len(groups) == 4 * len(set(groups))  # (G = 4: no group in two files)
    kept = {x["group"] for rows in files for x in rows if x["kept"]}
    assert len(kept) == sum(m["rollout/ds_kept_groups"] for m in lines) + lines[-1]["rollout/partial_ready_groups"]  # (the last ones still waiting)

    out = tmp_path / "resumed"  # a run that crashed after step 2
    crashed_copy(full, out, step=2, steps=4)
    r = run_cli(*args, "--out", out, "--resume")
    assert r.exit_code == 0, r.output
    assert_same_run(full, out)


def test_max_staleness_bounds_the_lag_of_every_trained_token(prepared, format_model, tmp_path):
    """--max-staleness 0 (the same run as above, whose batches hold tokens one version old): no
    trained token lags its policy; the older responses are regenerated, and counted. (K = 1 against
    lags of 2 and more: tests/train/test_partial.py.)"""
    out = tmp_path / "bounded"
    r = run_cli("train", "--model", format_model, "--data", prepared, "--steps", "4", "--partial-rollout-len", "2", "--max-staleness", "0",
                "--out", out, *SMALL)
    assert r.exit_code == 0, r.output
    lines = _lines(out)
    assert all(m["rollout/staleness_max"] == 0 and m["rollout/stale_token_frac"] == 0 for m in lines)
    assert sum(m["rollout/partial_stale_regenerated"] for m in lines) > 0
    assert all(m.get("actor/correction_scope_frac", 0.0) == 0.0 for m in lines)
    assert json.loads((out / "config.json").read_text())["resolved_algo"]["max_staleness"] == 0


def test_a_segment_that_does_not_divide_l_max_is_refused(prepared, format_model, tmp_path):
    r = run_cli("train", "--model", format_model, "--data", prepared, "--out", tmp_path / "x", "--steps", "1", "--partial-rollout-len", "3", *SMALL)
    assert_user_error(r, "partial_rollout_len must divide max_response_len (8)")
    assert not (tmp_path / "x").exists()


@pytest.mark.vllm
def test_vllm_continues_the_same_responses_after_a_resume(prepared, format_model, tmp_path):
    """The vLLM engine with partial rollouts: responses are continued from their token ids, and a
    resumed run continues the same ones into the same tokens (fp32 on CPU, per-request seeds)."""
    pytest.importorskip("vllm")
    args = ["train", "--model", format_model, "--data", prepared, "--save-every", "1", "--keep-rollouts", "--partial-rollout-len", "2",
            *[a if a != "hf" else "vllm" for a in SMALL]]
    run_and_resume(args, tmp_path / "a", tmp_path / "b", steps=3)
    for s in (2, 3):
        assert [(x["group"], x["response_ids"]) for x in step_rollouts(tmp_path / "a", s)] == [(x["group"], x["response_ids"]) for x in step_rollouts(tmp_path / "b", s)]
    assert any(x["length"] > 2 for s in (1, 2, 3) for x in step_rollouts(tmp_path / "a", s))  # (responses of several segments)
    assert [m["rollout/partial_open_responses"] for m in _lines(tmp_path / "a")][1:] == [m["rollout/partial_open_responses"] for m in _lines(tmp_path / "b")][1:]


def test_a_round_cap_below_the_segments_of_l_max_is_refused(prepared, format_model, tmp_path):
    r = run_cli("train", "--model", format_model, "--data", prepared, "--out", tmp_path / "x", "--steps", "1", "--partial-rollout-len", "2",
                "--max-gen-rounds", "3", *SMALL)
    assert_user_error(r, "takes 4", "raise --max-gen-rounds to 4 or more")
    assert not (tmp_path / "x").exists()


def test_a_skipped_update_keeps_its_finished_groups_for_the_next_step(prepared, format_model, tmp_path):
    """--on-short-batch skip with partial rollouts (DAPO: groups dropped, new ones drawn late, the
    round cap hit with groups going): the batch's finished groups (sampled and scored, carried or
    new) wait for the next step, in the checkpoint too, instead of being lost with the update;
    a run resumed from that checkpoint is the same run."""
    args = ["train", "--model", format_model, "--data", prepared, "--steps", "4", "--save-every", "1", "--partial-rollout-len", "2", "--keep-rollouts",
            "--algo", "dapo", "--max-gen-rounds", "4", "--on-short-batch", "skip", *SMALL, "--prompts-per-step", "3"]
    full = tmp_path / "full"
    r = run_cli(*args, "--out", full)
    assert r.exit_code == 0, r.output
    lines = _lines(full)
    skipped = [m["step"] for m in lines if m.get("actor/skipped_update") and m["rollout/ds_kept_groups"]]
    assert skipped, "no update with kept groups was skipped"
    s = skipped[0]
    batch = {x["group"] for x in step_rollouts(full, s) if x["kept"]} | set(_ready(full, s - 1)[:lines[s - 1]["rollout/partial_carried_groups"]])
    assert batch <= set(_ready(full, s))  # (in step s's checkpoint, waiting: carried ones and those finished in it)
    # Every group marked kept was trained by an update, or is still waiting at the end: none lost.
    kept = {x["group"] for t in range(1, 5) for x in step_rollouts(full, t) if x["kept"]}
    trained = sum(m["rollout/ds_kept_groups"] for m in lines if not m.get("actor/skipped_update"))
    assert len(kept) == trained + lines[-1]["rollout/partial_ready_groups"]
    assert "finished groups kept for the next step" in r.output

    out = tmp_path / "resumed"  # crashed right after the skipped step's checkpoint
    if s < 4:
        crashed_copy(full, out, step=s, steps=4)
        r = run_cli(*args, "--out", out, "--resume")
        assert r.exit_code == 0, r.output
        assert_same_run(full, out)


def _ready(run: Path, step: int) -> list[int]:
    """The groups waiting in checkpoint ``step``'s partial-rollout pool (none at step 0)."""
    if step == 0:
        return []
    st = json.loads((run / "checkpoints" / f"step_{step}" / "trainer_state.json").read_text())
    return [grp[0]["group"] for _, grp in st["data"]["partial"]["ready"]]
