"""The processes of a run as one group: sums, maxima and object gathers across ranks (no-ops in
one process), and the seeds every random stream of a run derives from."""

from __future__ import annotations

import hashlib
from typing import Any

import torch


class Ranks:
    """This process's ``rank`` among ``world`` (torch.distributed must be initialised when world > 1)."""

    def __init__(self, rank: int = 0, world: int = 1) -> None:
        self.rank, self.world = rank, world

    def _device(self) -> torch.device:
        import torch.distributed as dist

        return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")

    def _reduce(self, x: torch.Tensor, op: Any) -> torch.Tensor:
        if self.world <= 1:
            return x
        import torch.distributed as dist

        y = x.detach().clone().to(self._device())
        dist.all_reduce(y, op=op)
        return y.to(x.device)

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over ranks."""
        import torch.distributed as dist

        return self._reduce(x, dist.ReduceOp.SUM) if self.world > 1 else x

    def max(self, x: torch.Tensor) -> torch.Tensor:
        """Element-wise maximum over ranks."""
        import torch.distributed as dist

        return self._reduce(x, dist.ReduceOp.MAX) if self.world > 1 else x

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (a picklable object)."""
        if self.world <= 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out


def mix(*parts: int) -> int:
    """A 62-bit seed from integers (seed, step, round, index, ...): the same parts give the same
    seed in any process, at any time, so no random stream of a run depends on its history."""
    h = hashlib.blake2b(b"".join(int(p).to_bytes(16, "little", signed=True) for p in parts), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 2
