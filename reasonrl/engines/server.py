"""Generation from running OpenAI-compatible ``vllm serve`` processes (``--engine http://HOST:PORT[,...]``).

The user starts the servers, e.g.::

    vllm serve MODEL_DIR --port 8000 --logprobs-mode processed_logprobs --generation-config vllm

and passes ``--engine http://127.0.0.1:8000`` (several: comma-separated URLs of servers of the same
model). Each prompt is one ``POST /v1/completions`` with the prompt as token ids, ``n`` samples and
``return_token_ids`` (so no text round-trip); prompt ``i`` goes to server ``i mod #servers``,
requests run concurrently and each server batches them. A prompt's seed depends on its index only,
so which server serves it does not change its samples. Generation uses only the standard library.

``--logprobs-mode processed_logprobs`` makes the returned log-probabilities those of the
distribution sampled from (as the other engines); the server's default ("raw_logprobs") ignores
temperature, top-k and top-p. ``--generation-config vllm`` stops the server from applying the
model's ``generation_config.json`` defaults; every sampling parameter is sent explicitly anyway.

Training: ``update_weights`` pushes the new weights to every server through vLLM's native
weight-transfer API over NCCL (``reasonrl.engines.weight_sync``; the servers must run with
``VLLM_SERVER_DEV_MODE=1`` and ``--weight-transfer-config '{"backend":"nccl"}'``). Only rank 0 of a
multi-process trainer sends; the others wait at a barrier so that no rank generates before every
server has the new weights. Around the transfer the servers are paused (``/pause?mode=wait``, which
also clears their prefix caches: cached KV of the old weights) and resumed. NCCL needs CUDA GPUs on
the trainer and the servers: on a CPU-only machine the update is a one-line error.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from reasonrl.engines.base import Completion, ProgressFn, SamplingParams, eos_token_ids, prompt_seeds
from reasonrl.errors import ReasonRLError


class ServerEngine:
    """Client of a vLLM OpenAI-compatible server at ``url`` serving ``model_dir``."""

    name = "vllm-server"

    def __init__(self, url: str, model_dir: str | None = None, *, model: str | None = None, max_concurrency: int = 32,
                 request_timeout: float = 3600.0, dtype: str = "auto", weight_sync_address: str | None = None) -> None:
        self.urls = [_base_url(u) for u in url.split(",") if u.strip()]
        if not self.urls:
            raise ReasonRLError(f"--engine {url!r} names no server: pass http://HOST:PORT[,http://HOST2:PORT]")
        self.url = self.urls[0]
        self.model_dir = model_dir
        self.max_concurrency = max(1, int(max_concurrency))
        self.timeout = float(request_timeout)
        self.eos_ids: set[int] = eos_token_ids(model_dir) if model_dir else set()
        self.dtype, self.weight_sync_address = dtype, weight_sync_address
        self._model = model
        self._transfer: Any = None  # vLLM's trainer-side NCCL engine, opened at the first update
        self._source: Any = None
        self.last_update_seconds = 0.0

    # ------------------------------------------------------------------ HTTP
    def _request(self, path: str, body: dict[str, Any] | None = None, *, url: str | None = None, missing: str = "") -> Any:
        """GET (no body) or POST ``path`` on ``url`` (the first server); ``missing``: the fix to name on a 404."""
        url = url or self.url
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url + path, data=data, method="GET" if body is None else "POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return json.loads(r.read().decode())
        except urllib.error.HTTPError as e:
            if e.code == 404 and missing:
                raise ReasonRLError(f"vLLM server {url} has no {path.split('?')[0]}: {missing}") from None
            detail = e.read().decode(errors="replace")[:300].replace("\n", " ")
            raise ReasonRLError(f"vLLM server {url} answered {e.code} to {path}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ReasonRLError(f"cannot reach the vLLM server at {url} ({reason}): start `vllm serve MODEL_DIR --port PORT` or use --engine vllm/hf") from None

    @property
    def model(self) -> str:
        """The served model's name (the first one ``/v1/models`` lists), asked once; every server must serve it."""
        if self._model is None:
            names = []
            for u in self.urls:
                data = self._request("/v1/models", url=u).get("data") or []
                if not data:
                    raise ReasonRLError(f"the vLLM server at {u} serves no model")
                names.append(str(data[0]["id"]))
            if len(set(names)) > 1:
                raise ReasonRLError(f"the vLLM servers serve different models ({', '.join(f'{u}: {n}' for u, n in zip(self.urls, names))}): "
                                    "start every server on the same model")
            self._model = names[0]
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

    def _one(self, url: str, prompt: list[int], p: SamplingParams, seed: int | None) -> list[Completion]:
        resp = self._request("/v1/completions", self._body(prompt, p, seed), url=url)
        choices = sorted(resp.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != p.n:
            raise ReasonRLError(f"the vLLM server at {url} returned {len(choices)} completions for n={p.n}")
        return [_completion(c) for c in choices]

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, progress: ProgressFn | None = None) -> list[list[Completion]]:
        _ = self.model  # fail early, once, when a server is unreachable
        n = len(self.urls)
        jobs = [(self.urls[i % n], [int(t) for t in pr], seed) for i, (pr, seed) in enumerate(zip(prompts, prompt_seeds(params, len(prompts))))]

        def one(job: tuple[str, list[int], int | None]) -> list[Completion]:
            comps = self._one(job[0], job[1], params, job[2])
            if progress is not None:
                progress(len(comps), sum(len(c.token_ids) for c in comps))
            return comps

        with ThreadPoolExecutor(max_workers=min(self.max_concurrency * n, max(1, len(jobs)))) as pool:
            grouped = list(pool.map(one, jobs))
        return grouped

    # ------------------------------------------------------------------ weights
    def world_sizes(self) -> list[int]:
        """Each server's vLLM workers (TP × PP × DP): its ranks in the weight-transfer group."""
        return [int(self._request("/get_world_size", url=u, missing=_DEV_MODE_HINT)["world_size"]) for u in self.urls]

    def pause(self) -> None:
        """Stop every server's scheduling once its requests finished; clears its prefix cache."""
        for u in self.urls:
            self._request("/pause?mode=wait&clear_cache=true", {}, url=u, missing=_DEV_MODE_HINT)

    def resume(self) -> None:
        for u in self.urls:
            self._request("/resume", {}, url=u, missing=_DEV_MODE_HINT)

    def update_weights(self, state_dict: dict[str, Any]) -> None:
        """Push the new weights to every server (rank 0 sends; every rank returns once all servers have them)."""
        import torch

        dist = torch.distributed
        multi = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        t0 = time.perf_counter()
        if not multi or dist.get_rank() == 0:
            self._push(state_dict)
        if multi:
            dist.barrier()
        self.last_update_seconds = time.perf_counter() - t0

    def _push(self, state_dict: dict[str, Any]) -> None:
        import torch

        sizes = self.world_sizes()  # also checks that every server runs the RL routes
        if not torch.cuda.is_available():
            raise ReasonRLError("pushing weights to vLLM servers goes through vLLM's weight-transfer API over NCCL, which needs CUDA GPUs "
                                "on the trainer and the servers: train on GPUs, or use --engine vllm (in-process) on this machine")
        from reasonrl.devices import torch_dtype
        from reasonrl.engines.base import model_config
        from reasonrl.engines.weight_sync import StateDictSource, open_nccl_transfer

        if self._transfer is None:
            self._source = StateDictSource(torch_dtype(self.dtype), torch.device("cuda", torch.cuda.current_device()))
            self._transfer = open_nccl_transfer(self.urls, sizes, self._source, address=self.weight_sync_address, timeout=self.timeout)
        tied = bool(model_config(self.model_dir).get("tie_word_embeddings")) if self.model_dir else False
        self._source.state_dict = {k: v for k, v in state_dict.items() if not (tied and k == "lm_head.weight")}  # vLLM skips a tied head
        self.pause()
        try:
            self._transfer.send_weights()
        finally:
            self.resume()

    def close(self) -> None:
        """Drop the weight-transfer link (the servers keep serving: they belong to the user)."""
        if self._transfer is None:
            return
        transfer, self._transfer = self._transfer, None
        for u in self.urls:
            try:
                self._request("/shutdown_weight_transfer_engine", {}, url=u)
            except ReasonRLError:
                pass
        transfer.shutdown()


_DEV_MODE_HINT = ("start it with `VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --weight-transfer-config '{\"backend\":\"nccl\"}' ...` "
                  "(vLLM's RL routes) to train with it")


def _base_url(url: str) -> str:
    url = url.strip().rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


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
