"""Generation from a running OpenAI-compatible ``vllm serve`` (``--engine http://HOST:PORT``).

The user starts the server, e.g.::

    vllm serve MODEL_DIR --port 8000 --logprobs-mode processed_logprobs --generation-config vllm

and passes ``--engine http://127.0.0.1:8000``. Each prompt is one ``POST /v1/completions`` with the
prompt as token ids, ``n`` samples and ``return_token_ids`` (so no text round-trip); requests run
concurrently and the server batches them. Only the standard library is used.

``--logprobs-mode processed_logprobs`` makes the returned log-probabilities those of the
distribution sampled from (as the other engines); the server's default ("raw_logprobs") ignores
temperature, top-k and top-p. ``--generation-config vllm`` stops the server from applying the
model's ``generation_config.json`` defaults; every sampling parameter is sent explicitly anyway.

Weights: a separate server process cannot receive the trainer's weights in memory here, so
``update_weights`` raises. For training, use ``--engine vllm`` (in-process, weights synced every
step) or save a checkpoint and restart ``vllm serve`` on it; a server suits evaluation and rollouts
of a fixed model.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from reasonrl.engines.base import Completion, GenerationStats, SamplingParams, eos_token_ids, prompt_seeds
from reasonrl.errors import ReasonRLError


class ServerEngine:
    """Client of a vLLM OpenAI-compatible server at ``url`` serving ``model_dir``."""

    name = "vllm-server"

    def __init__(self, url: str, model_dir: str | None = None, *, model: str | None = None, max_concurrency: int = 32,
                 request_timeout: float = 3600.0) -> None:
        url = url.rstrip("/")
        if url.endswith("/v1"):
            url = url[: -len("/v1")]
        self.url = url
        self.model_dir = model_dir
        self.max_concurrency = max(1, int(max_concurrency))
        self.timeout = float(request_timeout)
        self.eos_ids: set[int] = eos_token_ids(model_dir) if model_dir else set()
        self._model = model
        self.last_stats = GenerationStats()

    # ------------------------------------------------------------------ HTTP
    def _request(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="GET" if body is None else "POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return json.loads(r.read().decode())
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:300].replace("\n", " ")
            raise ReasonRLError(f"vLLM server {self.url} answered {e.code} to {path}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ReasonRLError(f"cannot reach the vLLM server at {self.url} ({reason}): start `vllm serve MODEL_DIR --port PORT` or use --engine vllm/hf") from None

    @property
    def model(self) -> str:
        """The served model's name (the first one ``/v1/models`` lists), asked once."""
        if self._model is None:
            data = self._request("/v1/models").get("data") or []
            if not data:
                raise ReasonRLError(f"the vLLM server at {self.url} serves no model")
            self._model = str(data[0]["id"])
        return self._model

    # ------------------------------------------------------------------ generation
    def _body(self, prompt: list[int], p: SamplingParams, seed: int | None) -> dict[str, Any]:
        greedy = p.temperature == 0
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "n": p.n,
            "max_tokens": p.max_tokens,
            "temperature": p.temperature,
            "top_p": 1.0 if greedy else p.top_p,
            "top_k": p.top_k if (p.top_k > 0 and not greedy) else 0,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "logprobs": 0,  # the sampled token's log-probability only
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "stop_token_ids": sorted(self.eos_ids | set(p.stop_token_ids)),
        }
        if seed is not None:
            body["seed"] = seed
        return body

    def _one(self, prompt: list[int], p: SamplingParams, seed: int | None) -> list[Completion]:
        resp = self._request("/v1/completions", self._body(prompt, p, seed))
        choices = sorted(resp.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != p.n:
            raise ReasonRLError(f"the vLLM server at {self.url} returned {len(choices)} completions for n={p.n}")
        return [_completion(c) for c in choices]

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        t0 = time.perf_counter()
        _ = self.model  # fail early, once, when the server is unreachable
        jobs = [([int(t) for t in pr], seed) for pr, seed in zip(prompts, prompt_seeds(params, len(prompts)))]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, max(1, len(jobs)))) as pool:
            grouped = list(pool.map(lambda j: self._one(j[0], params, j[1]), jobs))
        n_tok = sum(len(c.token_ids) for g in grouped for c in g)
        self.last_stats = GenerationStats(len(prompts), sum(len(g) for g in grouped), n_tok, time.perf_counter() - t0)
        return grouped

    # ------------------------------------------------------------------ weights
    def update_weights(self, state_dict: dict[str, Any]) -> None:
        raise ReasonRLError(
            f"the vLLM server engine ({self.url}) cannot receive new weights in-process yet: for training use "
            "--engine vllm (in-process, synced every step), or save a checkpoint and restart `vllm serve` on it"
        )

    def close(self) -> None:
        """Nothing to free: the server belongs to the user."""


def _completion(c: dict[str, Any]) -> Completion:
    lp = c.get("logprobs") or {}
    ids = c.get("token_ids")
    if ids is None:  # servers without return_token_ids: ids from "token_id:N" strings
        ids = [int(str(t).rsplit(":", 1)[-1]) for t in lp.get("tokens") or []]
    ids = [int(t) for t in ids]
    vals = lp.get("token_logprobs")
    logprobs = [float(x) if x is not None else 0.0 for x in vals] if vals is not None else [0.0] * len(ids)
    if len(logprobs) != len(ids):
        raise ReasonRLError(f"the vLLM server returned {len(ids)} token ids but {len(logprobs)} logprobs")
    return Completion(ids, logprobs, "stop" if c.get("finish_reason") == "stop" else "length")
