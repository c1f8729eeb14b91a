"""Pushing the trainer's weights into running ``vllm serve`` processes: vLLM's native weight-transfer
API with its NCCL backend (vLLM 0.32, ``vllm.distributed.weight_transfer``), driven over HTTP.

The servers are started as vLLM documents::

    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --weight-transfer-config '{"backend": "nccl"}' ...

(the dev mode adds the RL routes: ``/get_world_size``, ``/init_weight_transfer_engine``,
``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``, ``/pause``, ``/resume``).

One NCCL group holds the trainer's rank 0 (NCCL rank 0, the sender) and every worker of every
server: server ``j`` with ``w_j`` workers (TP × PP × DP, its ``/get_world_size``) joins at
``rank_offset = 1 + w_0 + ... + w_{j-1}``, so one broadcast per tensor reaches every server. vLLM's
own trainer engine (``NCCLTrainerWeightTransferEngine``) drives each update: ``start_weight_update``,
then ``update_weights`` with the parameters' HF names, dtypes and shapes, concurrently with the
broadcast of the tensors (both sides meet inside the NCCL calls), then ``finish_weight_update``;
:class:`FanOutClient` sends each call to every server at once. NCCL needs CUDA on both sides.
"""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Sequence
from urllib.parse import urlsplit

import torch
from vllm.distributed.weight_transfer import HTTPVLLMWeightSyncClient, ParamMeta, WeightSource, WeightTransferTrainerFactory
from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo


class StateDictSource(WeightSource):
    """The weights of one update as vLLM's trainer engine reads them: HF names in the state dict's
    order, floating tensors in ``dtype``, each moved to this rank's GPU as it is sent."""

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype, self.device = dtype, device
        self.state_dict: dict[str, torch.Tensor] = {}

    def _wire(self, t: torch.Tensor) -> torch.dtype:
        return self.dtype if t.is_floating_point() else t.dtype

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(k, self._wire(v), tuple(v.shape)) for k, v in self.state_dict.items()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for k, v in self.state_dict.items():
            yield k, v.detach().to(self.device, self._wire(v), non_blocking=True).contiguous()


class FanOutClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over several servers: each call goes to every server
    at once (they all block in the same NCCL collectives); the init gives each server its ranks."""

    def __init__(self, urls: Sequence[str], world_sizes: Sequence[int], timeout: float) -> None:
        self.clients = [HTTPVLLMWeightSyncClient(u, timeout=timeout) for u in urls]
        self.offsets = [1 + sum(world_sizes[:j]) for j in range(len(urls))]

    def _all(self, call: Callable[[Any], None]) -> None:
        with ThreadPoolExecutor(max_workers=len(self.clients)) as pool:
            for f in [pool.submit(call, c) for c in self.clients]:
                f.result()

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        with ThreadPoolExecutor(max_workers=len(self.clients)) as pool:
            futures = [pool.submit(c.init_weight_transfer_engine, {**init_info, "rank_offset": off}) for c, off in zip(self.clients, self.offsets)]
            for f in futures:
                f.result()

    def start_weight_update(self) -> None:
        self._all(lambda c: c.start_weight_update())

    def update_weights(self, update_info: Any) -> None:
        self._all(lambda c: c.update_weights(update_info))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all(lambda c: c.finish_weight_update(weight_version))


def route_address(url: str) -> str:
    """This host's address on the route to ``url``'s host (a UDP connect sends nothing)."""
    parts = urlsplit(url)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((parts.hostname or "127.0.0.1", parts.port or 80))
        return str(s.getsockname()[0])


def free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def open_nccl_transfer(urls: Sequence[str], world_sizes: Sequence[int], source: StateDictSource, *, address: str | None,
                       timeout: float) -> Any:
    """Rendezvous with every server's workers (on this rank's current GPU) and return vLLM's trainer
    engine; ``engine.send_weights()`` then pushes ``source``'s current state dict to all of them."""
    addr = address or route_address(urls[0])
    info = NCCLTrainerInitInfo(master_address=addr, master_port=free_port(addr), world_size=1 + sum(world_sizes), rank=0)
    return WeightTransferTrainerFactory.trainer_init(info, client=FanOutClient(urls, world_sizes, timeout), source=source)
