"""Training checkpoints: ``out/checkpoints/step_N/`` (policy and critic as HF directories, their
optimizer and scheduler state, the RNG state, the data position), written to a temporary directory
and renamed into place; ``out/checkpoints/latest`` names the newest."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from reasonrl.artifacts import write_json


def latest_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint of a run directory, or None."""
    f = out / "checkpoints" / "latest"
    if f.is_file():
        p = out / "checkpoints" / f.read_text().strip()
        if (p / "trainer_state.json").is_file():
            return p
    return None


def save_checkpoint(out: Path, step: int, *, policy_backend: Any, critic_backend: Any, tokenizer: Any, data_state: dict[str, Any],
                    rank: int, world: int) -> Path:
    """Write ``out/checkpoints/step_{step}`` (every rank takes part: ZeRO state is sharded)."""
    d = out / "checkpoints" / f"step_{step}"
    tmp = out / "checkpoints" / f".step_{step}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    if world > 1:
        torch.distributed.barrier()
    policy_backend.save_model(tmp / "policy", tokenizer)
    policy_backend.save_state(tmp / "policy_state")
    if critic_backend is not None:
        critic_backend.save_model(tmp / "critic")
        critic_backend.save_state(tmp / "critic_state")
    if rank == 0:
        torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
        write_json(tmp / "trainer_state.json", {"step": step, "data": data_state})
        shutil.rmtree(d, ignore_errors=True)
        tmp.rename(d)
        (out / "checkpoints" / "latest").write_text(d.name + "\n")
    if world > 1:
        torch.distributed.barrier()
    return d
