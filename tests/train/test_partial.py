"""Partial rollouts (``reasonrl.train.partial``, ``train --partial-rollout-len``): the pool's
bookkeeping, and the collector with the tiny format-taught model's real generation (HF engine,
fp32): responses continued segment by segment are conditioned on their own earlier tokens, no
token and no group is lost or used twice across steps, and a pool saved and loaded continues
exactly as one that never stopped."""

from __future__ import annotations

import json

import pytest
import torch

from reasonrl.train.collector import Collection
from reasonrl.train.partial import OpenGroup, PartialPool, Piece


def _group(draw: int, n: int = 2) -> OpenGroup:
    return OpenGroup(draw=draw, row=draw, born=1, prompt="p", prompt_ids=[1, 2], pieces=[Piece() for _ in range(n)])


def test_a_segment_length_is_not_the_end_of_a_response() -> None:
    pool = PartialPool(4, 12)
    pool.add(_group(5))
    pool.add(_group(3))
    assert pool.work() == [(3, 0), (3, 1), (5, 0), (5, 1)]  # draw order
    done = pool.apply([(3, 0, [7, 7, 7, 7], [-.1] * 4, "length"), (3, 1, [8], [-.2], "stop"), (5, 0, [9, 9], [-.3] * 2, "stop"),
                       (5, 1, [6, 6, 6], [-.4] * 3, "stop")])
    assert [g.draw for g in done] == [5] and [p.finish for p in done[0].pieces] == ["stop", "stop"]
    assert pool.work() == [(3, 0)] and pool.prompt_of(3, 0) == [1, 2, 7, 7, 7, 7] and pool.open_responses == 1
    saved = json.loads(json.dumps(pool.state()))
    assert pool.apply([(3, 0, [7] * 4, [-.1] * 4, "length")]) == []  # 8 of 12: still going
    done = pool.apply([(3, 0, [7] * 4, [-.1] * 4, "length")])  # 12 = L_max: cut, as without segments
    assert [p.finish for p in done[0].pieces] == ["length", "stop"] and len(done[0].pieces[0].ids) == 12 and not pool.open
    again = PartialPool(4, 12)
    again.load(saved)
    assert again.state() == saved and again.work() == [(3, 0)]
    # A segment cut short with "length" is the engine's context limit (vLLM lowers max_model_len to
    # the model's): the response ends there, as it would without segments, and is not sent again.
    done = again.apply([(3, 0, [7, 7], [-.1] * 2, "length")])
    assert [p.finish for p in done[0].pieces] == ["length", "stop"] and len(done[0].pieces[0].ids) == 6 and not again.open
    at_limit = PartialPool(4, 12, context_len=10)  # (the prompt's 2 tokens + 8: full after two whole segments)
    at_limit.add(_group(0, 1))
    assert at_limit.apply([(0, 0, [7] * 4, [-.1] * 4, "length")]) == []
    assert [p.finish for g in at_limit.apply([(0, 0, [7] * 4, [-.1] * 4, "length")]) for p in g.pieces] == ["length"]


def test_every_token_carries_the_version_that_sampled_it_and_max_staleness_restarts_older_responses() -> None:
    from reasonrl.rollouts import Sample

    pool = PartialPool(2, 8)
    pool.add(_group(0))
    pool.add(_group(1))
    pool.apply([(0, 0, [5, 5], [-.1] * 2, "length"), (0, 1, [6], [-.1], "stop"), (1, 0, [7, 7], [-.1] * 2, "length"),
                (1, 1, [8, 8], [-.1] * 2, "length")], version=1)
    done = pool.apply([(0, 0, [5], [-.2], "stop"), (1, 0, [7, 7], [-.2] * 2, "length"), (1, 1, [8, 8], [-.2] * 2, "length")], version=2)
    assert [p.versions for p in done[0].pieces] == [[1, 1, 2], [1]] and [p.versions for p in pool.open[1].pieces] == [[1, 1, 2, 2]] * 2
    saved = json.loads(json.dumps(pool.state()))  # (the versions go into the checkpoint)
    again = PartialPool(2, 8)
    again.load(saved)
    assert again.state() == saved
    # a checkpoint from before tokens carried versions: each token gets its group's born step (the oldest it can be)
    legacy = json.loads(json.dumps(saved))
    for g in legacy["open"]:
        g["pieces"] = [p[:3] for p in g["pieces"]]
    old = PartialPool(2, 8)
    old.load(legacy)
    assert [p.versions for p in old.open[1].pieces] == [[1, 1, 1, 1]] * 2
    # a finished group waiting for a batch, its first response begun at version 1, the other at 3
    grp = [Sample(group=0, prompt_index=0, prompt="p", prompt_ids=[1, 2], response="", response_ids=ids, logprobs=[-.1] * len(ids),
                  finish_reason="stop", truncated=False, ground_truth="0", versions=v) for ids, v in (([5, 5, 5], [1, 1, 2]), ([6], [3]))]
    pool.defer([(1, grp)])
    assert pool.enforce(3, 2) == 0 and len(pool.ready) == 1  # versions 1 and 2 lag step 3 by 2 at most: nothing to do
    assert pool.enforce(4, 2) == 3  # at step 4, version 1 lags by 3: group 1's two responses and the waiting group's first restart
    assert [p.ids for p in pool.open[1].pieces] == [[], []] and all(p.finish == "" and not p.versions for p in pool.open[1].pieces)
    assert not pool.ready and [(p.ids, p.versions, p.finish) for p in pool.open[0].pieces] == [([], [], ""), ([6], [3], "stop")]
    assert pool.work() == [(0, 0), (1, 0), (1, 1)] and pool.prompt_of(0, 0) == [1, 2]
    assert pool.enforce(4, 0) == 1  # K = 0: the finished response of version 3 lags too


def test_the_segment_must_divide_l_max_and_bound_the_engine() -> None:
    with pytest.raises(ValueError, match="divide"):
        PartialPool(5, 12)
    pool = PartialPool(4, 12)
    pool.add(_group(0, 1))
    with pytest.raises(RuntimeError, match="5 tokens for a segment of 4"):
        pool.apply([(0, 0, [1] * 5, [0.0] * 5, "length")])


def test_the_option_is_checked():
    from reasonrl.errors import ReasonRLError
    from reasonrl.stages.train import TrainConfig

    with pytest.raises((ReasonRLError, ValueError), match="divide max_response_len"):
        TrainConfig(max_response_len=12, partial_rollout_len=5)
    assert TrainConfig(max_response_len=12, partial_rollout_len=4).partial_rollout_len == 4
    with pytest.raises((ReasonRLError, ValueError), match=r"e\.g\. 10 "):  # (a value that divides 100, not 100 // 8)
        TrainConfig(max_response_len=100, partial_rollout_len=7)


def _collector(model_dir, *, partial: int, algo: str = "grpo", seed: int = 0, **spec):
    from reasonrl.algos import get_algo
    from reasonrl.engines.base import SamplingParams
    from reasonrl.engines.hf import HFEngine
    from reasonrl.models.loading import load_tokenizer
    from reasonrl.rewards import RewardScorer
    from reasonrl.train.collector import Collector, DataStream
    from toyhelp import toy_rows

    rows = [{"prompt": [{"role": "user", "content": r["problem"]}], "reward_model": {"ground_truth": r["answer"]}} for r in toy_rows(30, seed=2)]
    return Collector(spec=get_algo(algo).replace(**spec), engine=HFEngine(str(model_dir), dtype="fp32", seed=0), tokenizer=load_tokenizer(model_dir),
                     scorer=RewardScorer(), stream=DataStream(rows, seed=seed), sampling=SamplingParams(n=4, max_tokens=12), max_prompt_len=256,
                     overlong_cache_len=2, oversample=1.0, max_rounds=10, seed=seed, ranks=None, partial_len=partial)


def _record(col) -> dict:
    return {"groups": [[(s.group, s.response_ids, s.logprobs, s.finish_reason, s.reward, s.kept) for s in g] for g in col.groups],
            "generated": [(s.group, s.response_ids) for s in col.generated], "tokens": col.stats.gen_tokens, "rounds": col.rounds,
            "partial": col.pool_metrics, "kind": col.kind}


@pytest.mark.slow
def test_continued_responses_are_conditioned_on_their_own_tokens(format_model) -> None:
    """The log-probs the engine reported segment by segment are the model's log-probs of the whole
    response given the prompt (teacher-forced, one forward): each segment continued the response."""
    from reasonrl.models.loading import load_causal_lm

    torch.manual_seed(0)
    col = _collector(format_model, partial=4)
    got = col.collect(3, step=1)
    samples = [s for g in got.groups for s in g]
    long = [s for s in samples if s.length > 4]
    assert long, "no response needed a second segment"
    assert all(s.length <= 12 and len(s.logprobs) == s.length and s.truncated == (s.finish_reason == "length") for s in samples)
    assert all((s.length == 12) == s.truncated for s in samples)
    model = load_causal_lm(format_model).eval()
    for s in long:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, len(s.prompt_ids) - 1:-1].float(), -1)
        ref = logp.gather(-1, torch.tensor(s.response_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(s.logprobs), ref, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_no_token_or_group_is_lost_or_used_twice_and_a_loaded_pool_goes_on_exactly(format_model) -> None:
    torch.manual_seed(0)
    col = _collector(format_model, partial=4)
    steps = [col.collect(2, step=s) for s in (1, 2, 3, 4)]
    trained = [g[0].group for c in steps for g in c.groups]
    assert len(trained) == len(set(trained)) == 8 and all(len(c.groups) == 2 for c in steps)
    waiting = [g[0].group for _, g in col.pool.ready]
    assert sorted(trained + waiting + list(col.pool.open)) == list(range(col.stream.drawn))  # every drawn prompt: trained, waiting or going
    finished = sum(s.length for c in steps for s in c.generated)
    going = sum(len(p.ids) for g in col.pool.open.values() for p in g.pieces)
    assert sum(c.stats.gen_tokens for c in steps) == finished + going  # every decoded token is in a response
    assert any(c.pool_metrics["rollout/partial_stale_frac"] > 0 for c in steps), "no group was carried into a later step"
    assert sum(c.generated_groups for c in steps) == len(trained) + len(waiting)  # a finished group is counted in the step it finished
    _assert_counts_add_up(steps, waiting)
    assert any(c.deferred_groups for c in steps), "no group was finished beyond its batch"
    assert all(c.kind is Collection.SEGMENTS and c.label == "collection (partial rollouts)" for c in steps)

    torch.manual_seed(0)
    a = _collector(format_model, partial=4)
    a.collect(2, step=1)
    saved = json.loads(json.dumps(a.state()))  # (through JSON, as in a checkpoint)
    b = _collector(format_model, partial=4)
    b.load(saved)
    assert [_record(b.collect(2, step=s)) for s in (2, 3, 4)] == [_record(c) for c in steps[1:]]


def _assert_counts_add_up(steps, waiting) -> None:
    """Each step's groups on offer (finished in it, or carried into it) were kept, dropped by dynamic
    sampling, or deferred to the next step; what one step defers the next carries."""
    for c in steps:
        assert c.kept_groups + c.dropped_all_correct + c.dropped_all_wrong + c.deferred_groups == c.generated_groups + c.carried_groups
        offered = c.generated_groups + c.carried_groups - c.deferred_groups
        assert c.kept_frac == (c.kept_groups / offered if offered else 0.0) and 0 <= c.kept_frac <= 1
    assert sum(c.deferred_groups for c in steps) - sum(c.carried_groups for c in steps) == len(waiting)


def _lags(col, step: int) -> list[int]:
    return [step - v for g in col.groups for s in g for v in s.versions]


@pytest.mark.slow
@pytest.mark.parametrize("bound", [None, 1, 0])
def test_max_staleness_bounds_how_far_trained_tokens_lag(format_model, bound) -> None:
    """Every trained token carries the step that sampled it (non-decreasing along its response, at
    most the step training it); --max-staleness K: none lags more than K, the older responses are
    regenerated (counted), and no group is lost or trained twice."""
    torch.manual_seed(0)
    col = _collector(format_model, partial=2, **({} if bound is None else {"max_staleness": bound}))
    steps = [col.collect(2, step=s) for s in (1, 2, 3, 4, 5)]
    for s, c in enumerate(steps, 1):
        for smp in (x for g in c.groups for x in g):
            assert len(smp.versions) == smp.length and smp.versions == sorted(smp.versions) and all(1 <= v <= s for v in smp.versions)
    lags = [lag for s, c in enumerate(steps, 1) for lag in _lags(c, s)]
    trained = [g[0].group for c in steps for g in c.groups]
    assert len(trained) == len(set(trained)) == 10
    if bound is None:
        assert max(lags) >= 2 and all("rollout/partial_stale_regenerated" not in c.pool_metrics for c in steps)
    else:
        assert max(lags) <= bound and sum(c.pool_metrics["rollout/partial_stale_regenerated"] for c in steps) > 0
        assert (max(lags) == 0) == (bound == 0)


@pytest.mark.slow
def test_dynamic_sampling_with_partial_rollouts_counts_every_group_once(format_model) -> None:
    """DAPO's dynamic sampling over partial rollouts: groups all correct or all wrong are dropped
    when they finish, the others are kept, deferred or carried, and no group is trained twice."""
    torch.manual_seed(0)
    col = _collector(format_model, partial=4, algo="dapo")
    steps = [col.collect(2, step=s) for s in (1, 2, 3, 4)]
    trained = [g[0].group for c in steps for g in c.groups]
    assert len(trained) == len(set(trained)) == sum(c.kept_groups for c in steps)
    assert all(0 < sum(s.correct for s in g) < len(g) for c in steps for g in c.groups)  # (only informative groups)
    assert sum(c.dropped_all_correct + c.dropped_all_wrong for c in steps) > 0, "dynamic sampling dropped nothing"
    _assert_counts_add_up(steps, [g[0].group for _, g in col.pool.ready])


@pytest.mark.slow
def test_a_segment_of_l_max_is_the_plain_collector(format_model) -> None:
    """--partial-rollout-len equal to L_max turns nothing on: the same draws and tokens as without it."""
    torch.manual_seed(0)
    plain = _record(_collector(format_model, partial=0).collect(2, step=1))
    torch.manual_seed(0)
    col = _collector(format_model, partial=12)
    assert col.pool is None and _record(col.collect(2, step=1)) == plain
    assert plain["kind"] is Collection.WHOLE and plain["partial"] == {}  # (the collection's kind is said, not guessed from its metrics)


@pytest.mark.slow
def test_a_step_abandoned_and_collected_again_is_the_same_step(format_model) -> None:
    """What `train` does when a signal comes while a step collects: the state taken before the step
    is loaded back (in memory, not through a file), and the step collected again draws the same."""
    torch.manual_seed(0)
    col = _collector(format_model, partial=4)
    col.collect(2, step=1)
    before = col.state()
    first = _record(col.collect(2, step=2))
    col.load(before)
    assert col.state() == before and _record(col.collect(2, step=2)) == first


def test_the_console_line_names_the_carried_groups() -> None:
    from reasonrl.train.step_metrics import log_line

    plain = {"rollout/ds_kept_groups": 4, "rollout/ds_generated_groups": 6, "rollout/ds_rounds": 1}
    assert "kept 4/6 (1 rnd)" in log_line(1, 8, plain)
    carried = {"rollout/ds_kept_groups": 4, "rollout/ds_generated_groups": 0, "rollout/ds_rounds": 0, "rollout/partial_carried_groups": 4,
               "rollout/partial_open_responses": 35, "rollout/partial_stale_frac": 1.0}
    assert "kept 4/0+4 carried (0 rnd)" in log_line(5, 8, carried) and "stale 1.00 | going 35" in log_line(5, 8, carried)
