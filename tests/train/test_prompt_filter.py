"""The prompt filters and the replay of saved groups: `train --rollouts` (pass rates from a rollout
artifact), `--skip-solved-epochs` (the data stream retires solved prompts, its state in checkpoints),
and `pretrain-value --rollouts`' Replay (saved groups as steps' batches, ranks' shares)."""

from __future__ import annotations

import json

import pytest

from reasonrl.rollouts import Sample
from reasonrl.train.collector import DataStream, Replay
from reasonrl.train.prompt_filter import filter_prompts
from reasonrl.train.ranks import Ranks


def _rows(n: int) -> list[dict]:
    return [{"q": f"p{i}"} for i in range(n)]


def test_filter_bounds_are_strict_and_unrated_follow_the_option() -> None:
    rows = _rows(6)
    rates = {"p0": (0, 4), "p1": (4, 4), "p2": (1, 4), "p3": (3, 4), "p4": (0, 0)}  # p4: no samples; p5: not rated
    kept, c = filter_prompts(rows, lambda r: r["q"], rates, min_rate=0.0, max_rate=1.0, unrated="keep")
    assert [r["q"] for r in kept] == ["p2", "p3", "p4", "p5"]
    assert (c.prompts, c.kept, c.dropped_solved, c.dropped_unsolved, c.unrated) == (6, 4, 1, 1, 2)
    kept, c = filter_prompts(rows, lambda r: r["q"], rates, min_rate=0.25, max_rate=0.75, unrated="drop")
    assert [r["q"] for r in kept] == [] and (c.dropped_solved, c.dropped_unsolved, c.unrated) == (2, 2, 2)
    kept, c = filter_prompts(rows, lambda r: r["q"], rates, min_rate=-1, max_rate=2, unrated="drop")
    assert [r["q"] for r in kept] == ["p0", "p1", "p2", "p3"]  # (-1 and 2 keep the never and the always solved)
    assert "kept 4 of 6" in c.line() and "dropped" in c.line()


def _draw_all(stream: DataStream, steps: int, k: int, solved: set[str]) -> list[list[str]]:
    out = []
    for _ in range(steps):
        rows, idx = stream.take(k)
        for r, i in zip(rows, idx):
            stream.visit(i, r["q"] in solved)
        out.append([r["q"] for r in rows])
    return out


def test_skip_solved_retires_after_k_visits_in_a_row_and_resumes_the_same() -> None:
    rows = _rows(5)
    a = DataStream(rows, seed=1, skip_solved=2)
    draws = _draw_all(a, 6, 2, solved={"p0", "p3"})
    seen = [q for d in draws for q in d]
    assert seen.count("p0") == 2 and seen.count("p3") == 2  # retired after their second solved visit
    assert a.retired == {0, 3} and len(seen) == 12 and not {"p0", "p3"} & set(draws[-1])
    # a streak is broken by one visit with a wrong sample
    b = DataStream(rows, seed=1, skip_solved=2)
    b.visit(1, True), b.visit(1, False), b.visit(1, True)
    assert b.retired == set() and b.streak[1] == 1
    # the state (JSON, as in trainer_state.json) resumes the same draws
    full = DataStream(rows, seed=1, skip_solved=2)
    _draw_all(full, 3, 2, solved={"p0", "p3"})
    saved = json.loads(json.dumps(full.state()))
    rest = _draw_all(full, 4, 2, solved={"p0", "p3"})
    again = DataStream(rows, seed=1, skip_solved=2)
    again.load(saved)
    assert _draw_all(again, 4, 2, solved={"p0", "p3"}) == rest
    # off: no streaks, the state as before (old checkpoints load)
    off = DataStream(rows, seed=1)
    _draw_all(off, 3, 2, solved={"p0"})
    assert set(off.state()) == {"epoch", "pos"} and not off.retired


def test_every_prompt_retired_is_a_one_line_error() -> None:
    from reasonrl.errors import ReasonRLError

    s = DataStream(_rows(2), seed=0, skip_solved=1)
    _draw_all(s, 1, 2, solved={"p0", "p1"})
    with pytest.raises(ReasonRLError, match="--skip-solved-epochs"):
        s.take(1)


def _group(g: int, n: int = 2) -> list[Sample]:
    return [Sample(group=g, prompt_index=g, prompt=f"p{g}", prompt_ids=[1], response="r", response_ids=[2, 3], logprobs=[0.0, 0.0],
                   finish_reason="stop", truncated=False, ground_truth="1", reward=1.0, correct=True) for _ in range(n)]


def test_replay_serves_every_group_once_an_epoch_in_rank_shares() -> None:
    groups = [_group(g) for g in range(5)]
    one = Replay(groups, seed=0)
    served = [g[0].group for _ in range(5) for g in one.collect(2).groups]
    assert sorted(served) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]  # two epochs of five
    col = Replay(groups, seed=0).collect(2)
    assert col.kept_groups == col.wanted == 2 and col.rounds == 0 and col.stats.samples == 4 and col.stats.gen_tokens == 8
    # two ranks: equal shares of the same global draw; an odd count pads the short rank
    r0, r1 = (Replay(groups, seed=0, ranks=Ranks(r, 2)).collect(3) for r in (0, 1))
    assert len(r0.groups) == len(r1.groups) == 2
    assert [g[0].pad for g in r1.groups] == [False, True] and not any(s.pad for s in r1.generated)
    assert sorted(g[0].group for g in r0.groups + r1.groups[:1]) == sorted(g[0].group for g in Replay(groups, seed=0).collect(3).groups)
