"""Where each rank's engine process runs with --async-steps (``reasonrl.train.run.engine_env``,
``engine_cpus``): one process keeps the trainer's environment (or --engine-gpus, --engine-cpus); under
torchrun each rank's engine is a job of one on a GPU of its own rank's, and on its own share of the
cores --engine-cpus lists."""

from __future__ import annotations

import pytest

from reasonrl.errors import ReasonRLError
from reasonrl.train.run import LAUNCHER_VARS, engine_cpus, engine_env


def test_one_process_keeps_the_trainers_environment() -> None:
    assert engine_env("", world=1, device=0) is None
    assert engine_env("1", world=1, device=0) == {"CUDA_VISIBLE_DEVICES": "1"}


def test_each_rank_engine_is_a_job_of_one_on_its_own_gpu() -> None:
    env = engine_env("", world=4, local_rank=1, local_world=2, device=1)
    assert {k for k, v in env.items() if v is None} == set(LAUNCHER_VARS) and {"RANK", "WORLD_SIZE", "MASTER_PORT"} <= set(LAUNCHER_VARS)
    assert env["CUDA_VISIBLE_DEVICES"] == "1"  # the rank's own GPU, shared with its trainer
    assert engine_env("", world=2, local_rank=1, local_world=2, device=1, visible="4,6")["CUDA_VISIBLE_DEVICES"] == "6"  # (by the trainer's ids)
    assert engine_env("2,3", world=2, local_rank=1, local_world=2, device=1)["CUDA_VISIBLE_DEVICES"] == "3"  # --engine-gpus: one per local rank
    assert "CUDA_VISIBLE_DEVICES" not in engine_env("", world=2, local_rank=0, local_world=2, device=None)  # (CPU)


def test_engine_gpus_must_list_one_gpu_per_process_of_a_node() -> None:
    with pytest.raises(ReasonRLError, match=r"lists 1 GPUs for the 2 processes of a node: .*e\.g\. --engine-gpus 2,3$"):
        engine_env("1", world=2, local_rank=0, local_world=2, device=0)
    with pytest.raises(ReasonRLError, match="lists 3 GPUs"):
        engine_env("1,,2", world=2, local_rank=0, local_world=2, device=0)


def test_one_process_engine_gets_every_listed_core() -> None:
    assert engine_cpus(None, world=1) is None
    assert engine_cpus([1, 3], world=1) == [1, 3]
    assert engine_cpus(None, world=2, local_rank=1, local_world=2) is None  # (not pinned: the trainer's cores)


def test_each_rank_engine_gets_its_own_equal_share_of_the_listed_cores() -> None:
    cpus = [2, 3, 4, 5]
    shares = [engine_cpus(cpus, world=2, local_rank=i, local_world=2) for i in range(2)]
    assert shares == [[2, 3], [4, 5]]  # in the order given, disjoint, together all of them
    assert engine_cpus([7, 0, 8, 1], world=4, local_rank=1, local_world=2) == [8, 1]  # (two nodes of 2: by local rank)


def test_engine_cpus_must_share_out_evenly_among_a_nodes_processes() -> None:
    with pytest.raises(ReasonRLError, match=r"lists 3 cores for the 2 processes of a node: list a multiple of 2, .*e\.g\. --engine-cpus 0-1$"):
        engine_cpus([0, 1, 2], world=2, local_rank=0, local_world=2)
    with pytest.raises(ReasonRLError, match="each core once"):
        engine_cpus([1, 1], world=2, local_rank=0, local_world=2)
