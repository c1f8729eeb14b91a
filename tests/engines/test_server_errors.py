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


def test_unreachable_server_names_the_fix(tiny_dir) -> None:
    eng = ServerEngine(f"http://127.0.0.1:{_closed_port()}/v1/", str(tiny_dir), request_timeout=5)
    assert eng.url.startswith("http://127.0.0.1:") and not eng.url.endswith(("/v1", "/"))
    assert eng.eos_ids == {2}
    with pytest.raises(ReasonRLError, match="cannot reach the vLLM server"):
        eng.generate([[1, 2, 3]], SamplingParams(max_tokens=2))


def test_update_weights_says_what_to_do(tiny_dir) -> None:
    eng = ServerEngine("http://127.0.0.1:9", str(tiny_dir))
    with pytest.raises(ReasonRLError, match="--engine vllm"):
        eng.update_weights({})


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
