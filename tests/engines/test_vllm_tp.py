"""vLLM tensor parallel inside a torchrun job (``--engine-tp 2``, vLLM's external_launcher, gloo on CPU).

* 2 ranks forming one TP-2 engine, each bringing its own prompts (unequal shares, then one rank with
  none), generate the same seeded tokens as one process with TP 1 generating all the prompts; after
  the same weight update both give the same greedy tokens (each TP rank loaded its slice); segments
  that a dead TP job left in /dev/shm under vLLM's own names are not in its way (its own carry a token;
  on a CPU with only AVX2, vLLM loads its AVX2 build, which has no shared-memory all-reduce: the group
  all-reduces through gloo and makes no segments).
* ``train --engine vllm --engine-tp 2 --backend deepspeed --zero 3`` on 2 ranks completes: the sync
  gathers the ZeRO-3 shards on every rank and each TP rank loads its slice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("deepspeed")

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist

    MODEL, OUT = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    prompts = [[5, 6, 7], [8, 9, 10, 11], [12, 13], [14, 15, 16, 17, 18]]
    rank, world = 0, 1
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    from reasonrl.engines.base import SamplingParams
    from reasonrl.engines.vllm_engine import VLLMEngine
    from reasonrl.models import load_causal_lm

    eng = VLLMEngine(MODEL, dtype="fp32", seed=rank, max_model_len=256, tensor_parallel_size=world)
    shm = sorted(n for n in os.listdir("/dev/shm") if "cpushm" in n) if os.path.isdir("/dev/shm") else []
    shm_ops = hasattr(torch.ops._C, "init_shm_manager")  # vLLM's AVX2 build has no shared-memory all-reduce (gloo instead)
    share = lambda k: [prompts[:k], prompts[k:]][rank] if world > 1 else prompts  # rank 0 takes the first k
    toks = lambda out: [[c.token_ids for c in g] for g in out]
    res = {"sampled": toks(eng.generate(share(1), SamplingParams(n=2, temperature=1.0, top_p=0.9, max_tokens=12, seed=7)))}
    res["rank0_empty"] = toks(eng.generate(share(0), SamplingParams(temperature=0, max_tokens=6)))
    g = torch.Generator().manual_seed(1)
    eng.update_weights({k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in load_causal_lm(MODEL).state_dict().items()})
    res["after_update"] = toks(eng.generate(share(2), SamplingParams(temperature=0, max_tokens=8)))
    eng.close()
    res["shm"], res["shm_ops"] = shm, shm_ops
    parts = [None] * world
    if world > 1:
        dist.all_gather_object(parts, res)
    else:
        parts = [res]
    if rank == 0:
        json.dump(parts, open(OUT, "w"))
    if world > 1:  # (left to the interpreter's teardown, gloo can abort a rank: reasonrl.train.ds_backend.leave_group)
        dist.destroy_process_group()
    """
)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", VLLM_CPU_KVCACHE_SPACE="1", REASONRL_DS_Z3_PERSISTENCE_THRESHOLD="0",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return env


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1100)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))}\nexit {p.returncode}\n--- stdout\n{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-6000:]}"
    return p


def _torchrun(nproc: int) -> list[str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).with_name("torchrun")
    return ([str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]) + ["--nproc_per_node", str(nproc), "--master_port", str(port)]


def test_tp2_group_generates_like_one_process(tiny_model: Path, tmp_path: Path) -> None:
    script = tmp_path / "tp.py"
    script.write_text(SCRIPT)
    _run([sys.executable, str(script), str(tiny_model), str(tmp_path / "one.json")])
    # What a TP-2 job that died leaves in /dev/shm under vLLM's own names (the same for every torchrun
    # job of a machine): its segments must not be in this job's way (reasonrl names them per job).
    stale = [Path(f"/dev/shm/-tp:0-[0-1]-cpushm_{r}") for r in range(2)] if Path("/dev/shm").is_dir() else []
    planted = [p for p in stale if not p.exists()]
    try:
        for p in planted:
            p.write_bytes(b"\0" * 4096)
        _run(_torchrun(2) + [str(script), str(tiny_model), str(tmp_path / "tp2.json")])
    finally:
        for p in planted:
            p.unlink(missing_ok=True)
    (one,), (r0, r1) = json.loads((tmp_path / "one.json").read_text()), json.loads((tmp_path / "tp2.json").read_text())
    assert len(one["sampled"]) == 4 and all(len(g) == 2 and g[0] != g[1] for g in one["sampled"])  # seeded sampling, 2 distinct samples
    assert r0["sampled"] + r1["sampled"] == one["sampled"]  # rank 0 kept its 1 prompt, rank 1 its 3: the union, as one process
    assert r0["rank0_empty"] == [] and r1["rank0_empty"] == one["rank0_empty"]
    assert r0["after_update"] + r1["after_update"] == one["after_update"]
    assert any(a[0][:6] != b[0] for a, b in zip(one["after_update"], one["rank0_empty"]))  # the update changed the greedy tokens
    ours = [n for n in r0["shm"] if n.startswith("reasonrl-")]
    if stale and r0["shm_ops"]:  # the TP group all-reduced through shared memory of its own, one segment per rank under one job token
        assert len(ours) == 2 and ours == [n for n in r1["shm"] if n.startswith("reasonrl-")] and ours[0][:-2] == ours[1][:-2], r0["shm"]
    else:  # vLLM's build for this CPU (AVX2) has no shared-memory all-reduce: the group went through gloo, and made no segments
        assert ours == [] and r0["shm_ops"] == r1["shm_ops"] == False, r0["shm"]  # noqa: E712


def test_train_with_engine_tp2_under_zero3(format_model: Path, toy_data_file: Path, tmp_path: Path) -> None:
    from reasonrl.stages.prepare_data import PrepareConfig, run_prepare

    data, out = tmp_path / "data", tmp_path / "run"
    run_prepare(PrepareConfig(inputs=[str(toy_data_file)], out=str(data), template="none", decontaminate=[]))
    _run(_torchrun(2) + ["-m", "reasonrl.cli", "train", "--backend", "deepspeed", "--zero", "3", "--engine", "vllm", "--engine-tp", "2",
                         "--model", str(format_model), "--data", str(data), "--out", str(out), "--dtype", "fp32", "--algo", "grpo",
                         "--steps", "2", "--prompts-per-step", "2", "--group-size", "4", "--max-prompt-len", "64", "--max-response-len", "12",
                         "--mini-batch-size", "8", "--micro-batch-size", "4", "--lr", "1e-3", "--kv-cache-gib", "1"])
    m = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in m] == [1, 2] and all(r["rollout/gen_tokens"] > 0 for r in m)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["engine_resolved"] == "vllm" and cfg["engine_tp"] == 2 and all(r["perf/weight_sync_s"] > 0 for r in m)
    assert (out / "policy" / "config.json").is_file() and (out / "manifest.json").is_file()
