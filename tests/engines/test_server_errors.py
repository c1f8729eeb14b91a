"""The server engine's failures are one-line ReasonRLErrors that name the fix (no server needed)."""

from __future__ import annotations

import socket

import pytest

from reasonrl.engines.base import SamplingParams
from reasonrl.engines.server import ServerEngine, _completion
from reasonrl.errors import ReasonRLError


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is: nothing listens there


def test_unreachable_server_names_the_fix(tiny_model) -> None:
    eng = ServerEngine(f"http://127.0.0.1:{_closed_port()}/v1/", str(tiny_model), request_timeout=5)
    assert eng.url.startswith("http://127.0.0.1:") and not eng.url.endswith(("/v1", "/"))
    assert eng.eos_ids == {2}
    with pytest.raises(ReasonRLError, match="cannot reach the vLLM server"):
        eng.generate([[1, 2, 3]], SamplingParams(max_tokens=2))


def test_update_weights_needs_the_servers(tiny_model) -> None:
    eng = ServerEngine(f"http://127.0.0.1:{_closed_port()}", str(tiny_model), request_timeout=5)
    with pytest.raises(ReasonRLError, match="cannot reach the vLLM server"):
        eng.update_weights({})


def test_several_urls_and_a_bad_list(tiny_model) -> None:
    eng = ServerEngine("http://a:1/v1, http://b:2/", str(tiny_model))
    assert eng.urls == ["http://a:1", "http://b:2"] and eng.url == "http://a:1"
    with pytest.raises(ReasonRLError, match="names no server"):
        ServerEngine(" , ", str(tiny_model))


def test_completion_parsing_with_and_without_token_ids() -> None:
    with_ids = {"index": 0, "token_ids": [5, 2], "finish_reason": "stop",
                "logprobs": {"tokens": ["token_id:5", "token_id:2"], "token_logprobs": [-0.5, -0.1]}}
    c = _completion(with_ids)
    assert (c.token_ids, c.logprobs, c.finish_reason) == ([5, 2], [-0.5, -0.1], "stop")
    legacy = {"index": 0, "finish_reason": "length", "logprobs": {"tokens": ["token_id:7", "token_id:8"], "token_logprobs": [-1.0, -2.0]}}
    c = _completion(legacy)
    assert (c.token_ids, c.finish_reason) == ([7, 8], "length")
    with pytest.raises(ReasonRLError):
        _completion({"token_ids": [1, 2], "logprobs": {"token_logprobs": [-1.0]}})


def test_weight_sync_pieces_that_run_on_cpu(tiny_model) -> None:
    """What the NCCL push sends, checked on CPU: the source's metadata (HF names, wire dtypes, full
    shapes) agrees with its iteration, as vLLM's sender checks; each server's NCCL ranks follow the
    trainer's rank 0 and the servers before it; the rendezvous address is the route's."""
    pytest.importorskip("vllm")
    import torch

    from reasonrl.engines.weight_sync import FanOutClient, StateDictSource, route_address
    from reasonrl.models import load_causal_lm

    src = StateDictSource(torch.bfloat16, torch.device("cpu"))
    src.state_dict = {**load_causal_lm(tiny_model).state_dict(), "step": torch.tensor(3)}
    meta, sent = src.metadata(), list(src)
    assert [(m.name, m.dtype, m.shape) for m in meta] == [(k, t.dtype, tuple(t.shape)) for k, t in sent]
    assert sent[0][1].dtype == torch.bfloat16 and sent[-1][1].dtype == torch.int64  # floats on the wire dtype, others as they are
    assert FanOutClient(["http://a:1", "http://b:2", "http://c:3"], [2, 4, 1], timeout=5).offsets == [1, 3, 7]
    assert route_address("http://127.0.0.1:8000") == "127.0.0.1"
