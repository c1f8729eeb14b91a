"""The engine in its own process (``reasonrl.engines.process.EngineProcess``): the same completions as
the in-process engine (seeded, and after weight updates), updates ordered with requests, LoRA's
partial updates, and its lifetime (a killed child as one line, close idempotent, dies with its parent,
no traceback on a Ctrl-C to the process group)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from reasonrl.engines.base import EngineOptions, SamplingParams
from reasonrl.engines.hf import HFEngine
from reasonrl.engines.process import EngineProcess
from reasonrl.errors import ReasonRLError

ROOT = Path(__file__).resolve().parents[2]
SAMPLED = SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=3)


def _tokens(out):
    return [[(c.token_ids, c.finish_reason) for c in g] for g in out]


def _noisy(model, seed: int) -> dict[str, torch.Tensor]:
    """The model's weights, moved by seeded noise (a stand-in for a training step)."""
    g = torch.Generator().manual_seed(seed)
    return {k: (v + 0.05 * torch.randn(v.shape, generator=g, dtype=v.dtype)) if v.is_floating_point() else v.clone()
            for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def child(tiny_model):
    eng = EngineProcess(EngineOptions(engine="hf", dtype="fp32"), str(tiny_model), seed=0, threads=1)
    yield eng
    eng.close()


def _fresh(child, tiny_model) -> HFEngine:
    """An in-process engine on the model's weights, and the module's child put back on them."""
    local = HFEngine(str(tiny_model), dtype="fp32", seed=0)
    child.update_weights(local.model.state_dict())
    return local


def test_same_completions_and_ordered_updates(child, tiny_model, prompts) -> None:
    """Seeded generation equals the in-process engine's, and an update applies after the requests
    submitted before it and before those submitted after it, whatever the timing."""
    local = _fresh(child, tiny_model)
    before = local.generate(prompts, SAMPLED)
    assert _tokens(child.generate(prompts, SAMPLED)) == _tokens(before)
    weights = _noisy(local.model, 1)
    kept = {k: v.clone() for k, v in weights.items()}
    first = child.submit(prompts, SAMPLED)
    child.update_weights(weights, version="v7")
    for v in weights.values():  # (the caller may change its tensors once update_weights returns)
        v.zero_()
    second = child.submit(prompts, SAMPLED)
    assert first.weights_version != "v7" and second.weights_version == "v7"
    local.update_weights(kept)
    after = local.generate(prompts, SAMPLED)
    got_second = child.result(second)  # (taken out of order)
    got_first = child.result(first)
    assert _tokens(got_first) == _tokens(before)
    assert _tokens(got_second) == _tokens(after) != _tokens(before)
    assert [c.logprobs for g in got_second for c in g] == [c.logprobs for g in after for c in g]
    assert child.applied[-1][0] == "v7"
    with pytest.raises(ReasonRLError, match="already taken"):
        child.result(first)


def test_partial_update_keeps_the_rest(child, tiny_model, prompts) -> None:
    """A mapping marked ``partial`` (LoRA's merged layers) arrives marked, and the weights it leaves
    out stay as they were: the child generates what an in-process engine given the same maps does."""
    local = _fresh(child, tiny_model)
    full = _noisy(local.model, 2)

    class Partial(dict):
        partial = True

    part = Partial({k: v for k, v in full.items() if ".mlp." in k})
    assert part and len(part) < len(full)
    child.update_weights(part)
    local.update_weights(part)
    got = child.generate(prompts, SAMPLED)
    assert _tokens(got) == _tokens(local.generate(prompts, SAMPLED)) != _tokens(HFEngine(str(tiny_model), dtype="fp32").generate(prompts, SAMPLED))


def test_a_failed_request_is_one_line_and_the_engine_goes_on(child, tiny_model, prompts) -> None:
    local = _fresh(child, tiny_model)
    bad = child.submit(prompts, SamplingParams(max_tokens=4, seeds=(1,)))  # (one seed for three prompts)
    good = child.submit(prompts, SAMPLED)
    with pytest.raises(ReasonRLError) as e:
        child.result(bad)
    assert "\n" not in str(e.value) and "generating" in str(e.value) and "seeds" in str(e.value)
    assert _tokens(child.result(good)) == _tokens(local.generate(prompts, SAMPLED))


def test_unseeded_lazy_mapping_shared_tensors_close(tiny_model, prompts) -> None:
    """Unseeded generation draws from the same stream as the in-process engine's; a lazy mapping (read one value at a time) and a dict whose two names share one tensor (tied
    embeddings) reach the engine as the same weights."""
    from collections.abc import Mapping

    local = HFEngine(str(tiny_model), dtype="fp32", seed=0)
    weights = _noisy(local.model, 3)
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"]

    class Lazy(Mapping):
        def __init__(self, d):
            self.d = d

        def __getitem__(self, k):
            return self.d[k].clone()

        def __iter__(self):
            return iter(self.d)

        def __len__(self):
            return len(self.d)

    unseeded = SamplingParams(n=2, temperature=1.0, max_tokens=6)  # (from each engine's own stream, seeded by seed=0)
    cpu = min(os.sched_getaffinity(0))
    with EngineProcess(EngineOptions(engine="hf", dtype="fp32"), str(tiny_model), seed=0, threads=1, cpus=[cpu]) as eng:
        assert os.sched_getaffinity(eng.pid) == {cpu} and eng.name == "hf"
        assert _tokens(eng.generate(prompts, unseeded)) == _tokens(local.generate(prompts, unseeded))
        eng.update_weights(weights)
        a = eng.generate(prompts, SAMPLED)
        eng.update_weights(Lazy(weights))
        b = eng.generate(prompts, SAMPLED)
    assert eng._proc.returncode == 0  # (closed on leaving the block: its engine closed, the process reaped)
    eng.close()  # (idempotent)
    with pytest.raises(ReasonRLError, match="closed"):
        eng.submit(prompts, SAMPLED)
    local.update_weights(weights)
    want = _tokens(local.generate(prompts, SAMPLED))
    assert _tokens(a) == want == _tokens(b)


def test_killed_child_is_one_line_and_close_reaps(tiny_model, prompts) -> None:
    eng = EngineProcess(EngineOptions(engine="hf", dtype="fp32"), str(tiny_model), seed=0, threads=1)
    pending = eng.submit(prompts, SamplingParams(n=4, temperature=1.0, max_tokens=200, seed=1))
    os.kill(eng.pid, signal.SIGKILL)
    with pytest.raises(ReasonRLError) as e:
        eng.result(pending)
    msg = str(e.value)
    assert "\n" not in msg and f"pid {eng.pid}" in msg and "SIGKILL" in msg
    with pytest.raises(ReasonRLError, match="SIGKILL"):
        eng.submit(prompts, SAMPLED)
    eng.close()
    eng.close()
    assert eng._proc.returncode == -signal.SIGKILL


def test_build_failure_is_one_line(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ReasonRLError) as e:
        EngineProcess(EngineOptions(engine="hf", dtype="fp32"), str(tmp_path), seed=0, threads=1)
    assert "\n" not in str(e.value) and "building the engine" in str(e.value)


DRIVER = textwrap.dedent("""
    import signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (whatever the test process left: a Ctrl-C raises here)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    from reasonrl.engines.base import EngineOptions, SamplingParams
    from reasonrl.engines.process import EngineProcess
    eng = EngineProcess(EngineOptions(engine="hf", dtype="fp32"), sys.argv[1], seed=0, threads=1)
    eng.submit([[1, 2, 3]], SamplingParams(n=8, temperature=1.0, max_tokens=4000, seed=0))
    try:
        print(eng.pid, flush=True)
        time.sleep(120)
    except KeyboardInterrupt:
        eng.close()
        print("stopped", flush=True)
""")


def _driver(tiny_model, tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script), str(tiny_model)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    line = proc.stdout.readline()
    assert line.strip().isdigit(), proc.stderr.read()
    return proc, int(line)


def _gone(pid: int, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_ctrl_c_to_the_group_prints_no_child_traceback(tiny_model, tmp_path) -> None:
    proc, child_pid = _driver(tiny_model, tmp_path)
    os.killpg(proc.pid, signal.SIGINT)  # (as a terminal's Ctrl-C: the driver and its engine child both get it)
    out, err = proc.communicate(timeout=60)
    assert "stopped" in out, (out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert _gone(child_pid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_child_dies_with_its_parent(tiny_model, tmp_path) -> None:
    proc, child_pid = _driver(tiny_model, tmp_path)
    os.kill(proc.pid, signal.SIGKILL)  # (no cleanup runs in the parent)
    proc.wait(timeout=30)
    proc.stdout.close()
    proc.stderr.close()
    assert _gone(child_pid)


@pytest.mark.vllm
def test_vllm_in_its_own_process_matches_in_process(tiny_model, prompts) -> None:
    """vLLM (fp32) in the child generates what vLLM in this process generates: at the start, after a
    full update, and after LoRA's partial, lazy update (the merged linear layers only)."""
    pytest.importorskip("vllm")
    from reasonrl.engines.vllm_engine import VLLMEngine
    from reasonrl.models import load_causal_lm
    from reasonrl.models.lora import LoraSettings, apply_lora, engine_weights

    opts = EngineOptions(engine="vllm", dtype="fp32", kv_cache_gib=0.25)
    local = VLLMEngine(str(tiny_model), dtype="fp32", seed=0, max_model_len=512, kv_cache_gib=0.25)
    try:
        with EngineProcess(opts, str(tiny_model), seed=0, max_model_len=512, threads=torch.get_num_threads()) as child:
            assert (child.name, child.max_model_len) == ("vllm", local.max_model_len)
            same = [_tokens(child.generate(prompts, SAMPLED)) == _tokens(local.generate(prompts, SAMPLED))]
            full = _noisy(load_causal_lm(tiny_model, dtype=torch.float32), 4)
            child.update_weights(full, version=1)
            local.update_weights(full)
            same.append(_tokens(child.generate(prompts, SAMPLED)) == _tokens(local.generate(prompts, SAMPLED)))
            model = apply_lora(load_causal_lm(tiny_model, dtype=torch.float32), LoraSettings(rank=2, alpha=4.0), seed=0, base_path=tiny_model)
            g = torch.Generator().manual_seed(5)
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if "lora_B" in n:
                        p.copy_(0.5 * torch.randn(p.shape, generator=g))
            merged = engine_weights(model, model.state_dict())
            assert merged.partial and "lm_head.weight" not in merged
            child.update_weights(merged, version=2)
            local.update_weights(merged)
            got = child.generate(prompts, SAMPLED)
            want = local.generate(prompts, SAMPLED)
            same.append(_tokens(got) == _tokens(want))
            assert same == [True, True, True]
            torch.testing.assert_close(torch.tensor([x for gr in got for c in gr for x in c.logprobs]),
                                       torch.tensor([x for gr in want for c in gr for x in c.logprobs]), atol=1e-5, rtol=0)
    finally:
        local.close()


def test_weights_round_trip_through_shared_memory() -> None:
    """What the child's engine receives: every value and dtype as sent, ``partial`` kept, two names
    of one tensor in a plain dict written once (another mapping, possibly lazy, is never deduplicated by
address: a freed tensor's address can come back)."""
    from reasonrl.engines.process import WeightsView, read_weights, write_weights

    g = torch.Generator().manual_seed(0)
    emb = torch.randn(7, 5, generator=g)
    sd = {"model.embed_tokens.weight": emb, "lm_head.weight": emb, "a.bf16": torch.randn(3, 3, generator=g).bfloat16(),
          "a.int": torch.arange(5), "a.scalar": torch.tensor(2.5), "a.view": torch.randn(4, 6, generator=g)[:, 1:4], "a.meta": "x"}
    part = WeightsView(sd)
    part.partial = True
    sizes = []
    for sent, partial in ((sd, False), (part, True)):
        source, manifest = write_weights(sent, "test")
        try:
            got = read_weights(source, manifest, partial=bool(getattr(sent, "partial", False)))
        finally:
            os.close(source[2]) if source[0] == "fd" else None
        assert got.partial is partial and list(got) == list(sd) and got["a.meta"] == "x"
        for k, v in sd.items():
            if isinstance(v, torch.Tensor):
                assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
        sizes.append(source[-1])
    assert sizes[1] - sizes[0] >= emb.numel() * 4  # (a plain dict's shared embedding written once; not deduplicated in another mapping)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/task/<tid>/status")
def test_stop_signals_reach_the_main_thread_not_the_reader(tiny_model) -> None:
    """The reader thread blocks SIGINT and SIGTERM: a process-directed Ctrl-C then always goes to the
    main thread, which wakes from its sleep or wait and runs Python's handler (one that landed on the
    reader thread left the main thread asleep: the Ctrl-C test hung for a minute in a CI run)."""
    with EngineProcess(EngineOptions(engine="hf", dtype="fp32"), str(tiny_model), seed=0, threads=1) as eng:
        reader = next(t for t in threading.enumerate() if t.name == f"engine-process-{eng.pid}")
        status = Path(f"/proc/self/task/{reader.native_id}/status").read_text()
        blocked = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("SigBlk:")), 16)
        for sig in (signal.SIGINT, signal.SIGTERM):
            assert blocked >> (sig - 1) & 1, (sig, hex(blocked))
