"""The server engine against real ``vllm`` OpenAI-compatible servers on the tiny model (loopback only).

The fixture starts two ``python -m vllm.entrypoints.openai.api_server`` processes as vLLM documents
for RL (``VLLM_SERVER_DEV_MODE=1``, ``--weight-transfer-config '{"backend":"nccl"}'``) on free
127.0.0.1 ports, waits (bounded) until ``/v1/models`` answers, and always kills the servers' process
groups at teardown. Starting them takes about a minute on 2 CPU cores. What of the weight push runs
on CPU is tested here (the RL control plane; the one-line error NCCL gives without GPUs); the NCCL
data path runs in ``bench/gpu_check.sh``.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

from reasonrl.engines.base import EngineOptions, SamplingParams  # noqa: E402
from reasonrl.engines.registry import make_engine  # noqa: E402
from reasonrl.engines.hf import HFEngine  # noqa: E402
from reasonrl.engines.server import ServerEngine  # noqa: E402
from reasonrl.errors import ReasonRLError  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

STARTUP_TIMEOUT_S = 420


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def servers(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    logs = tmp_path_factory.mktemp("vllm_server")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env["VLLM_SERVER_DEV_MODE"] = "1"
    procs, urls = [], []
    for i in range(2):
        port = _free_port()
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model), "--host", "127.0.0.1",
               "--port", str(port), "--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--seed", "0",
               "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm", "--weight-transfer-config", '{"backend":"nccl"}']
        with open(logs / f"server{i}.log", "wb") as log:
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        urls.append(f"http://127.0.0.1:{port}")
    t0 = time.monotonic()
    try:
        for i, (proc, url) in enumerate(zip(procs, urls)):
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"vllm server exited with {proc.returncode}:\n{(logs / f'server{i}.log').read_text()[-3000:]}")
                if time.monotonic() - t0 > STARTUP_TIMEOUT_S:
                    pytest.fail(f"vllm server not ready after {STARTUP_TIMEOUT_S}s:\n{(logs / f'server{i}.log').read_text()[-3000:]}")
                try:
                    with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(1.0)
        print(f"vllm servers ready in {time.monotonic() - t0:.0f}s")
        yield urls
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(servers: list[str]) -> str:
    return servers[0]


@pytest.fixture(scope="module")
def client(server: str, tiny_model: Path) -> ServerEngine:
    return ServerEngine(server + "/v1", str(tiny_model))


def test_rollout_shapes_seeds_and_finish_reasons(client: ServerEngine, prompts) -> None:
    p = SamplingParams(n=3, temperature=1.0, max_tokens=12, seed=4)
    out = client.generate(prompts, p)
    assert len(out) == len(prompts) and all(len(g) == 3 for g in out)
    for g in out:
        for c in g:
            assert len(c.token_ids) == len(c.logprobs) and 1 <= len(c.token_ids) <= 12
            assert all(math.isfinite(x) and x <= 0 for x in c.logprobs)
            if c.finish_reason == "length":
                assert len(c.token_ids) == 12
            else:
                assert c.finish_reason == "stop" and c.token_ids[-1] == 2
    assert len({tuple(c.token_ids) for c in out[0]}) == 3
    again = client.generate(prompts, p)
    assert [c.token_ids for g in out for c in g] == [c.token_ids for g in again for c in g]
    assert [len(g) for g in out] == [3, 3, 3]
    greedy_first = client.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4))[0][0].token_ids[0]
    stop = client.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4, stop_token_ids=(greedy_first,)))[0][0]
    assert stop.finish_reason == "stop" and stop.token_ids == [greedy_first]


def test_greedy_matches_transformers(client: ServerEngine, tiny_model: Path, prompts) -> None:
    p = SamplingParams(temperature=0, max_tokens=16)
    s = client.generate(prompts, p)
    h = HFEngine(str(tiny_model), dtype="fp32").generate(prompts, p)
    assert [g[0].token_ids for g in s] == [g[0].token_ids for g in h]
    for gs, gh in zip(s, h):
        torch.testing.assert_close(torch.tensor(gs[0].logprobs), torch.tensor(gh[0].logprobs), atol=1e-4, rtol=0)


def test_processed_logprobs_with_temperature(client: ServerEngine, tiny_model: Path, prompts, hf_logprobs) -> None:
    model = HFEngine(str(tiny_model), dtype="fp32").model
    out = client.generate(prompts, SamplingParams(n=2, temperature=0.7, top_k=50, max_tokens=8, seed=1))
    for p, g in zip(prompts, out):
        for c in g:
            want = hf_logprobs(model, p, c.token_ids, temperature=0.7, top_k=50)
            torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=1e-4, rtol=0)


def _served_requests(url: str) -> float:
    """Finished requests the server counted (its Prometheus /metrics)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        lines = r.read().decode().splitlines()
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines if ln.startswith("vllm:request_success_total"))


def test_prompts_spread_over_servers(servers: list[str], tiny_model: Path, prompts) -> None:
    """Two URLs: prompt i goes to server i mod 2; a prompt's seed follows its index, so the samples
    are those one server gives."""
    eng = make_engine(EngineOptions(engine=",".join(servers)), str(tiny_model), seed=0)
    assert eng.urls == servers and eng.model == str(tiny_model)
    p = SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=11)
    four = prompts + prompts[:1]
    before = [_served_requests(u) for u in servers]
    out = eng.generate(four, p)
    after = [_served_requests(u) for u in servers]
    assert [a - b for a, b in zip(after, before)] == [2 * p.n, 2 * p.n]  # 2 requests each, counted per sequence
    one = ServerEngine(servers[1], str(tiny_model)).generate(four, p)
    assert [[c.token_ids for c in g] for g in out] == [[c.token_ids for c in g] for g in one]


def test_weight_push_control_plane_and_cpu_error(servers: list[str], tiny_model: Path, prompts) -> None:
    """The RL routes of real dev-mode servers: world sizes (1 worker each: NCCL ranks 1 and 2 after the
    trainer's 0), pause / resume; the push itself needs NCCL, i.e. GPUs: one line says so, and the
    servers keep serving."""
    from reasonrl.models import load_causal_lm

    if torch.cuda.is_available():
        pytest.skip("with GPUs the push runs (bench/gpu_check.sh)")
    eng = make_engine(EngineOptions(engine=",".join(servers)), str(tiny_model), seed=0)
    assert eng.world_sizes() == [1, 1]

    def paused() -> list[bool]:
        return [json.loads(urllib.request.urlopen(u + "/is_paused", timeout=10).read())["is_paused"] for u in servers]

    eng.pause()
    assert paused() == [True, True]
    eng.resume()
    assert paused() == [False, False]
    with pytest.raises(ReasonRLError) as e:
        eng.update_weights(load_causal_lm(tiny_model).state_dict())
    assert "NCCL" in str(e.value) and "GPUs" in str(e.value) and "\n" not in str(e.value)
    assert paused() == [False, False]
    assert len(eng.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=3))[0][0].token_ids) == 3
    eng.close()
