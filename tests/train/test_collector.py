"""Dynamic sampling across ranks as one step (2 real processes, gloo, the tiny model's real
generation): every informative group is kept whichever rank generated it, the kept groups are
shared equally, the stream is one global stream, and the counts are global."""

from __future__ import annotations

import math
import socket

import pytest

pytestmark = pytest.mark.slow


class RankScript:
    """A scorer whose verdicts depend on the rank: rank 0's groups are informative (every other
    response correct), rank 1's are uniform (all wrong). Generation and everything else is real."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def score_batch(self, responses, ground_truths, infos=None):
        from reasonrl.rewards import Score, ScoreStats

        scores = [Score.decided("0", self.rank == 0 and i % 2 == 0) for i in range(len(responses))]
        return scores, ScoreStats(total=len(responses), fast_path=len(responses))


def _worker(rank: int, world: int, port: int, model_dir: str, n: int, out: dict) -> None:
    import torch
    import torch.distributed as dist

    from reasonrl.algos import get_algo
    from reasonrl.engines.base import SamplingParams
    from reasonrl.engines.hf import HFEngine
    from reasonrl.models.loading import load_tokenizer
    from reasonrl.train.collector import Collector, DataStream
    from reasonrl.train.step_metrics import rollout_metrics
    from reasonrl.train.ranks import Ranks
    from toyhelp import toy_rows

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rows = [{"prompt": [{"role": "user", "content": r["problem"]}], "reward_model": {"ground_truth": r["answer"]}} for r in toy_rows(40, seed=1)]
    stream = DataStream(rows, seed=0)
    col = Collector(spec=get_algo("dapo"), engine=HFEngine(model_dir, dtype="fp32", seed=0), tokenizer=load_tokenizer(model_dir),
                    scorer=RankScript(rank), stream=stream, sampling=SamplingParams(n=4, max_tokens=6), max_prompt_len=256,
                    overlong_cache_len=2, oversample=1.0, max_rounds=5, seed=0, ranks=Ranks(rank, world)).collect(n, step=1)
    metrics = rollout_metrics(col, None, Ranks(rank, world))
    out[rank] = {"share": [g[0].group for g in col.groups], "pads": [g[0].pad for g in col.groups], "kept": col.kept_groups,
                 "generated": col.generated_groups, "dropped_wrong": col.dropped_all_wrong, "rounds": col.rounds,
                 "stream": stream.state(), "lengths": [s.length for s in col.generated], "metrics": {k: v for k, v in metrics.items() if not k.startswith("perf/")}}
    dist.destroy_process_group()


def _run(model_dir, n: int) -> tuple[dict, dict]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_worker, args=(2, port, str(model_dir), n, out), nprocs=2, join=True)
    return out[0], out[1]


def test_two_ranks_keep_every_informative_group(tiny_model) -> None:
    r0, r1 = _run(tiny_model, 4)
    # Round 1 draws 4 prompts (rank 0: draws 0, 2 informative; rank 1: 1, 3 uniform), round 2 draws 2
    # (rank 0: 4), round 3 draws 1 (rank 0: 6): 4 informative groups, all of rank 0's making.
    assert (r0["rounds"], r0["generated"], r0["kept"], r0["dropped_wrong"]) == (3, 7, 4, 3)
    assert sorted(r0["share"] + r1["share"]) == [0, 2, 4, 6]  # every informative group is trained on, none twice
    assert len(r0["share"]) == len(r1["share"]) == 2 and not any(r0["pads"] + r1["pads"])  # equal shares
    assert r0["stream"] == r1["stream"] == {"epoch": 0, "pos": 7}  # one global stream
    assert r0["metrics"] == r1["metrics"]  # global metrics, the same on both ranks
    lengths = sorted(r0["lengths"] + r1["lengths"])  # the length percentiles: of both ranks' responses
    for q in (50, 90, 99):
        assert r0["metrics"][f"rollout/response_length_p{q}"] == lengths[math.ceil(q / 100 * len(lengths)) - 1], q
    assert r0["metrics"]["rollout/ds_kept_groups"] == 4 and r0["metrics"]["rollout/batch_size"] == 16
    assert r0["metrics"]["rollout/acc_mean"] == pytest.approx(8 / 28)  # 4 groups x 2 correct of 7 x 4 responses


def test_an_odd_count_is_padded_not_dropped(tiny_model) -> None:
    r0, r1 = _run(tiny_model, 3)
    # Draws 0, 2 (round 1) and 3 (round 2) are informative, all rank 0's: rank 0 trains on 0 and 2,
    # rank 1 on 3 plus a padding copy (no loss), so both ranks make the same updates.
    assert r0["kept"] == 3 and r0["share"] == [0, 2] and r1["share"][0] == 3
    assert r0["pads"] == [False, False] and r1["pads"] == [False, True]
    assert r0["metrics"]["rollout/batch_size"] == 12  # the padding copy counts nowhere


def _partial_worker(rank: int, world: int, port: int, model_dir: str, out: dict) -> None:
    import torch
    import torch.distributed as dist

    from reasonrl.algos import get_algo
    from reasonrl.engines.base import SamplingParams
    from reasonrl.engines.hf import HFEngine
    from reasonrl.models.loading import load_tokenizer
    from reasonrl.rewards import RewardScorer
    from reasonrl.train.collector import Collector, DataStream
    from reasonrl.train.step_metrics import rollout_metrics
    from reasonrl.train.ranks import Ranks
    from toyhelp import toy_rows

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rows = [{"prompt": [{"role": "user", "content": r["problem"]}], "reward_model": {"ground_truth": r["answer"]}} for r in toy_rows(40, seed=1)]
    col = Collector(spec=get_algo("grpo"), engine=HFEngine(model_dir, dtype="fp32", seed=0), tokenizer=load_tokenizer(model_dir),
                    scorer=RewardScorer(), stream=DataStream(rows, seed=0), sampling=SamplingParams(n=4, max_tokens=12), max_prompt_len=256,
                    overlong_cache_len=2, max_rounds=10, seed=0, ranks=Ranks(rank, world), partial_len=4)
    steps = [col.collect(4, step=s) for s in (1, 2, 3)]
    out[rank] = {"shares": [[(g[0].group, g[0].pad) for g in c.groups] for c in steps], "state": col.state(),
                 "metrics": [{k: v for k, v in rollout_metrics(c, None, Ranks(rank, world)).items() if not k.startswith("perf/")} for c in steps],
                 "tokens": sum(c.stats.gen_tokens for c in steps)}
    dist.destroy_process_group()


def test_two_ranks_share_one_partial_rollout_pool(format_model) -> None:
    """--partial-rollout-len over 2 processes: the pool (responses going on, groups waiting) is the
    same on both ranks, each step's batch is shared equally, and no group is trained on twice."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_partial_worker, args=(2, port, str(format_model), out), nprocs=2, join=True)
    r0, r1 = out[0], out[1]
    assert r0["state"] == r1["state"] and r0["metrics"] == r1["metrics"]
    trained = [d for r in (r0, r1) for share in r["shares"] for d, pad in share if not pad]
    assert len(trained) == len(set(trained)) == 12 and all(len(a) == len(b) == 2 for a, b in zip(r0["shares"], r1["shares"]))
    pool = r0["state"]["partial"]
    going = sum(len(p[0]) for g in pool["open"] for p in g["pieces"])  # (a piece: ids, log-probs, finish, versions)
    finished = sum(m["rollout/response_length_mean"] * m["rollout/ds_generated_groups"] * 4 for m in r0["metrics"] if "rollout/response_length_mean" in m)
    assert r0["tokens"] + r1["tokens"] == pytest.approx(finished + going)  # every token decoded on either rank is in a response


def _toy_collector(model_dir, engine, **kw):
    from reasonrl.algos import get_algo
    from reasonrl.engines.base import SamplingParams
    from reasonrl.models.loading import load_tokenizer
    from reasonrl.train.collector import Collector, DataStream
    from toyhelp import toy_rows

    rows = [{"prompt": [{"role": "user", "content": r["problem"]}], "reward_model": {"ground_truth": r["answer"]}} for r in toy_rows(40, seed=1)]
    return Collector(spec=get_algo("dapo"), engine=engine, tokenizer=load_tokenizer(model_dir), scorer=RankScript(0), stream=DataStream(rows, seed=0),
                     sampling=SamplingParams(n=2, max_tokens=6), max_prompt_len=256, overlong_cache_len=2, max_rounds=3, seed=0, **kw)


def _drawn(col) -> list[tuple]:
    return [(s.group, s.response_ids, s.logprobs, s.finish_reason, s.versions) for g in col.groups for s in g]


def test_rounds_generated_ahead(tiny_model, tmp_path) -> None:
    """--async-steps 1 (AheadRounds over an EngineProcess): step t+1's first round is drawn and submitted
    at the end of step t's collection, sampled by the weights of step t (its tokens carry that
    version); it is the synchronous collector's round with those weights, token for token (same
    draws, same per-prompt seeds); saved (waited for) and loaded it gives the same next step; and a
    step dropped before its update (snapshot, restore) collects again the same."""
    import torch

    from reasonrl.engines.base import EngineOptions
    from reasonrl.engines.hf import HFEngine
    from reasonrl.engines.process import EngineProcess

    torch.set_num_threads(1)  # the engine process's count: fp32 sums in the same order (put back after the test)
    torch.manual_seed(0)
    sync_engine = HFEngine(str(tiny_model), dtype="fp32", seed=0)
    new = {k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v for k, v in sync_engine.model.state_dict().items()}
    with EngineProcess(EngineOptions(engine="hf", dtype="fp32"), str(tiny_model), seed=0, threads=1, version=1) as proc:
        ahead, sync = _toy_collector(tiny_model, proc, ahead=1), _toy_collector(tiny_model, sync_engine)
        a1, s1 = ahead.collect(2, step=1), sync.collect(2, step=1)
        assert ahead.state() == {"epoch": 0, "pos": 4}  # step 2's first round drawn too
        assert [x[:4] for x in _drawn(a1)] == [x[:4] for x in _drawn(s1)] and {v for x in _drawn(a1) for v in x[4]} == {1}
        assert a1.pool_metrics["rollout/ahead_lag"] == 0
        proc.update_weights(new)  # (step 1's update: version 2, after step 2's batch in the engine's queue)
        a2, s2 = ahead.collect(2, step=2), sync.collect(2, step=2)  # (the synchronous engine still has step 1's weights)
        assert [x[:4] for x in _drawn(a2)] == [x[:4] for x in _drawn(s2)] and {v for x in _drawn(a2) for v in x[4]} == {1}
        assert a2.pool_metrics["rollout/ahead_lag"] == 1 and ahead.ahead.batches[3].version == 2

        ahead.ahead.save(tmp_path / "ahead")  # (waits for step 3's batch)
        again = _toy_collector(tiny_model, proc, ahead=1)
        again.load(ahead.state())
        again.ahead.load(tmp_path / "ahead")
        snap = ahead.snapshot()
        a3 = _drawn(ahead.collect(2, step=3))
        assert _drawn(again.collect(2, step=3)) == a3 and {v for x in a3 for v in x[4]} == {2}
        ahead.restore(snap)
        assert _drawn(ahead.collect(2, step=3)) == a3
    sync_engine.close()


class Submitting:
    """An in-process engine behind ``EngineProcess``'s ``submit``/``result`` (generated at submit):
    :class:`AheadRounds` with no child process, its tokens the engine's."""

    def __init__(self, engine) -> None:
        self.engine, self.done, self.n = engine, {}, 0

    def submit(self, prompts, params):
        self.n += 1
        self.done[self.n] = self.engine.generate(prompts, params)
        return self.n

    def result(self, pending):
        return self.done.pop(pending)


def _ahead_steps(model_dir, ranks, ckpt) -> dict:
    """Steps 1-3 of a collector with --async-steps 1 on ``ranks`` (checkpointed after step 2 in
    ``ckpt``; a second collector resumed from it collects step 3 again), and step 4 with this rank's
    batch ahead relabelled by ``ranks.rank`` versions."""
    from reasonrl.engines.hf import HFEngine
    from reasonrl.errors import ReasonRLError

    engine = Submitting(HFEngine(str(model_dir), dtype="fp32", seed=0))
    col = _toy_collector(model_dir, engine, ahead=1, ranks=ranks)
    steps = [_drawn(col.collect(2, step=s)) for s in (1, 2)]
    col.ahead.save(ckpt / "ahead")
    again = _toy_collector(model_dir, engine, ahead=1, ranks=ranks)
    again.load(col.state())
    again.ahead.load(ckpt / "ahead")
    steps.append(_drawn(col.collect(2, step=3)))
    out = {"steps": steps, "resumed": _drawn(again.collect(2, step=3)), "state": col.state()}
    col.ahead.batches[4].version += ranks.rank
    try:
        col.collect(2, step=4)
    except ReasonRLError as e:
        out["refused"] = str(e)
    return out


def _ahead_worker(rank: int, world: int, port: int, model_dir: str, ckpt: str, out: dict) -> None:
    import torch
    import torch.distributed as dist
    from pathlib import Path

    from reasonrl.train.ranks import Ranks

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    out[rank] = _ahead_steps(model_dir, Ranks(rank, world), Path(ckpt))
    dist.destroy_process_group()


def test_two_ranks_generate_ahead_as_one_process(tiny_model, tmp_path) -> None:
    """--async-steps 1 under torchrun (AheadRounds on 2 ranks, each with its own engine): every rank
    draws the same prompts and generates its share, so the two ranks' batches together are one
    process's, token for token (the log-probs to rounding), with the same versions; each rank saves its share (its own file) and
    takes it back to collect the same next step; a checkpoint of 2 ranks is refused by 1 (one line
    naming the fix), and ranks whose batches ahead differ in version refuse the step, both of them."""
    import torch.multiprocessing as mp

    from reasonrl.errors import ReasonRLError
    from reasonrl.train.ranks import Ranks

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ckpt = tmp_path / "step_2"
    ckpt.mkdir()
    out = mp.Manager().dict()
    mp.spawn(_ahead_worker, args=(2, port, str(tiny_model), str(ckpt), out), nprocs=2, join=True)
    r0, r1 = out[0], out[1]
    one = _ahead_steps(tiny_model, Ranks(), tmp_path)
    for s in range(3):  # (one group per rank and step: 2 prompts)
        assert len(r0["steps"][s]) == len(r1["steps"][s]) == 2
        both, alone = sorted(r0["steps"][s] + r1["steps"][s]), sorted(one["steps"][s])
        assert [x[:2] + x[3:] for x in both] == [x[:2] + x[3:] for x in alone], s  # (tokens, finish reasons, versions)
        assert [x[2] for x in both] == [pytest.approx(x[2], rel=1e-5) for x in alone], s  # (a batch of 1 prompt, not 2: the last bits differ)
    assert {v for x in one["steps"][2] for v in x[4]} == {2}  # (step 3's batch: sampled by step 2's policy)
    assert r0["resumed"] == r0["steps"][2] and r1["resumed"] == r1["steps"][2]
    assert r0["state"] == r1["state"] == one["state"]
    assert sorted(p.name for p in ckpt.iterdir()) == ["ahead-rank0-of-2.pt", "ahead-rank1-of-2.pt"]
    assert (tmp_path / "ahead.pt").is_file()  # (one process: the file it always wrote)
    assert "refused" not in one and r0["refused"] == r1["refused"]
    assert "step 4: the ranks disagree on its batch generated ahead" in r0["refused"] and "version 3; rank 1: " in r0["refused"] and r0["refused"].count("version 4") == 1
    with pytest.raises(ReasonRLError, match=r"saved by 2 processes, this run has 1: resume with torchrun --nproc_per_node 2$") as e:
        _toy_collector(tiny_model, None, ahead=1).ahead.load(ckpt / "ahead")
    assert "\n" not in str(e.value)
