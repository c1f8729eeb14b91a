"""Where each rank's engine process runs with --async-steps (``reasonrl.train.run.engine_env``): one
process keeps the trainer's environment (or --engine-gpus); under torchrun each rank's engine is a
job of one on a GPU of its own rank's."""

from __future__ import annotations

import pytest

from reasonrl.errors import ReasonRLError
from reasonrl.train.run import LAUNCHER_VARS, engine_env


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
