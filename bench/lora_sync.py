"""How the engine gets a LoRA policy each step: (a) the merged weights W + (α/R)·B·A through the
in-memory weight sync, or (b) vLLM's own LoRA (``enable_lora``, a ``LoRARequest`` per step).

    .venv/bin/python bench/lora_sync.py --model tiny            # the tiny test model (~1 min)
    .venv/bin/python bench/lora_sync.py --model default --rank 8  # SmolLM2-135M-Instruct (a few min)

Both engines are in-process vLLM on this machine's device, fp32 (the gap below is the fp32 one).
The policy is the model with a rank-R adapter on every linear layer of its blocks whose B is random
(an adapter some steps into training), in peft; each "sync" is what a training step would do:

- (a) ``reasonrl.models.lora.engine_weights`` (the blocks' linear layers, merged, one matrix at a
  time) into ``VLLMEngine.update_weights``: what ``reasonrl train --lora-rank`` does;
- (a0) for reference, full fine-tuning's sync of the whole state dict;
  Before each sync every B moves a little (a stand-in for an optimizer step), so a stale engine
  would show in the gap, which is measured after the last sync;
- (b) the adapter saved with peft to a fresh directory under /dev/shm (vLLM 0.32's ``LoRARequest``
  takes a path, nothing in memory), then vLLM loads it (``load_inplace=True``) on the next request:
  timed as that request's extra seconds over the same 1-token request with the adapter already in.

Then the gap: the engine's sampled-token log-probs (T = 1, 8 prompts x 4 samples x 32 tokens) against
the peft model's own forward on the same tokens (fp32), max |Δ| and mean |Δ|; and the decode
throughput of each engine on those requests (tok/s of ``generate``). Sizes: the bytes each sync
moves (fp32). The median of ``--repeats`` syncs is reported; timings are noisy on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _model_dir(name: str) -> Path:
    if name == "tiny":
        from reasonrl.models.tiny import build_tiny_model

        d = Path(tempfile.gettempdir()) / "reasonrl-bench-tiny"
        return d if (d / "config.json").is_file() else build_tiny_model(d)
    from reasonrl.models.loading import resolve_model

    return resolve_model(name)


def _policy(model_dir: Path, rank: int, alpha: float):
    import torch

    from reasonrl.models.loading import load_causal_lm
    from reasonrl.models.lora import LoraSettings, apply_lora

    model = apply_lora(load_causal_lm(model_dir, dtype=torch.float32), LoraSettings(rank, alpha), seed=0, base_path=model_dir)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:  # (as if some steps in: the merged update is not 0)
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
    return model.eval()


def _update(model, i: int) -> None:
    """A stand-in for an optimizer step: every B moves a little (so a stale engine would show in the gap)."""
    import torch

    g = torch.Generator().manual_seed(100 + i)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.01 * torch.randn(p.shape, generator=g))


def _prompts(model_dir: Path) -> list[list[int]]:
    from reasonrl.models.loading import load_tokenizer

    tok = load_tokenizer(model_dir)
    texts = [f"What is {a} + {b}? Think step by step." for a, b in [(12, 30), (7, 8), (100, 1), (55, 44), (3, 9), (21, 21), (64, 36), (9, 91)]]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def _gap(model, prompts, outs) -> tuple[float, float]:
    import torch

    diffs = []
    with torch.no_grad():
        for p, req in zip(prompts, outs):
            for o in req.outputs:
                ids = list(o.token_ids)
                if not ids:
                    continue
                x = torch.tensor([p + ids])
                logits = model(input_ids=x).logits[0, len(p) - 1 : -1].float()
                want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
                got = torch.tensor([next(iter(d.values())).logprob if isinstance(d, dict) else float("nan") for d in o.logprobs])
                diffs.append((got - want).abs())
    d = torch.cat(diffs)
    return float(d.max()), float(d.mean())


def _generate(llm, prompts, lora=None):
    import vllm
    from vllm.inputs import TokensPrompt

    sp = vllm.SamplingParams(n=4, temperature=1.0, max_tokens=32, seed=0, logprobs=0, detokenize=False)
    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, lora_request=lora, use_tqdm=False)
    dt = time.perf_counter() - t0
    return outs, sum(len(o.token_ids) for r in outs for o in r.outputs) / dt


def _one_token(llm, prompts, lora=None) -> float:
    import vllm
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], vllm.SamplingParams(max_tokens=1, temperature=0), lora_request=lora, use_tqdm=False)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="'tiny', 'default' (SmolLM2-135M-Instruct) or an HF directory")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()

    import torch

    from reasonrl.console import quiet_libraries
    from reasonrl.engines.vllm_engine import VLLMEngine
    from reasonrl.models.lora import engine_weights, save_adapter

    quiet_libraries()
    torch.set_num_threads(max(1, (os.cpu_count() or 1)))
    model_dir = _model_dir(a.model)
    model = _policy(model_dir, a.rank, a.alpha)
    prompts = _prompts(model_dir)
    sd = model.state_dict()
    seen: dict[int, int] = {}  # (tied embeddings: one tensor under two names, counted once)
    for n, v in model.get_base_model().state_dict().items():
        if "lora_" not in n and v.is_floating_point():
            seen.setdefault(v.data_ptr(), v.numel())
    total = sum(seen.values())
    print(f"model {model_dir.name}: {total / 1e6:.1f}M params; LoRA r={a.rank} α={a.alpha:g} all-linear: "
          f"{sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6:.2f}M trained | torch threads {torch.get_num_threads()}")

    # (a) merged weights through the in-memory sync
    eng = VLLMEngine(str(model_dir), dtype="fp32", seed=0, max_model_len=512)
    full = {k: v.detach() for k, v in model.get_base_model().state_dict().items() if "lora_" not in k}
    merged_keys = list(engine_weights(model, sd))
    sent = sum(sd[k.replace(".weight", ".base_layer.weight").replace("model.", "base_model.model.model.", 1)].numel()
               if k.endswith(".weight") else 0 for k in merged_keys)
    ta, ta0, tm = [], [], []
    for i in range(a.repeats):
        _update(model, i)
        t0 = time.perf_counter()
        eng.update_weights(engine_weights(model, sd))
        ta.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for v in engine_weights(model, sd).values():  # (the merge alone: each W + (α/R)·B·A computed and dropped)
            del v
        tm.append(time.perf_counter() - t0)
    for _ in range(a.repeats):  # (full fine-tuning's sync, for reference: the base weights, HF names)
        t0 = time.perf_counter()
        eng.update_weights({k.replace(".base_layer.", "."): v for k, v in full.items()})
        ta0.append(time.perf_counter() - t0)
    _update(model, a.repeats)
    eng.update_weights(engine_weights(model, sd))
    outs, tps_a = _generate(eng.llm, prompts)
    gap_a = _gap(model, prompts, outs)
    eng.close()

    # (b) vLLM's LoRA: a LoRARequest per step, from an adapter directory (vLLM 0.32 takes a path)
    import vllm
    from vllm.lora.request import LoRARequest

    llm = vllm.LLM(model=str(model_dir), dtype="float32", seed=0, max_model_len=512, enforce_eager=True, enable_lora=True, max_lora_rank=max(8, a.rank),
                   max_loras=1, enable_prefix_caching=True, block_size=32, enable_chunked_prefill=False, max_num_batched_tokens=4096,
                   kv_cache_memory_bytes=1 << 30, logprobs_mode="processed_logprobs", disable_log_stats=True, trust_remote_code=False)
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    tb, tsave = [], []
    with tempfile.TemporaryDirectory(dir=shm) as tmp:
        for i in range(a.repeats + 1):  # (the same updates as (a), one more at the end)
            _update(model, i)
            d = Path(tmp) / f"step_{i}"
            t0 = time.perf_counter()
            save_adapter(model, sd, d)
            tsave.append(time.perf_counter() - t0)
            req = LoRARequest("policy", 1, str(d), load_inplace=True)
            load = _one_token(llm, prompts, req)
            again = _one_token(llm, prompts, req)
            tb.append(tsave[-1] + max(0.0, load - again))
        llm.reset_prefix_cache()
        outs, tps_b = _generate(llm, prompts, req)
        gap_b = _gap(model, prompts, outs)
    outs0, tps_base = _generate(llm, prompts)  # (the same engine without the adapter)

    mib = 1 << 20
    print(f"(a)  merged sync      : {statistics.median(ta) * 1e3:8.1f} ms/sync (the merge alone {statistics.median(tm) * 1e3:.1f} ms), "
          f"{sent * 4 / mib:8.2f} MiB sent ({100 * sent / total:.0f}% of the weights) | "
          f"decode {tps_a:7.0f} tok/s | gap max {gap_a[0]:.2e} mean {gap_a[1]:.2e}")
    print(f"(a0) full FT sync     : {statistics.median(ta0) * 1e3:8.1f} ms/sync, {total * 4 / mib:8.2f} MiB sent")
    print(f"(b)  vLLM LoRARequest : {statistics.median(tb) * 1e3:8.1f} ms/sync (save {statistics.median(tsave) * 1e3:.1f} ms + load), "
          f"{sum(p.numel() for p in model.parameters() if p.requires_grad) * 4 / mib:8.2f} MiB adapter | decode {tps_b:7.0f} tok/s "
          f"(no adapter, enable_lora: {tps_base:7.0f}) | gap max {gap_b[0]:.2e} mean {gap_b[1]:.2e}")


if __name__ == "__main__":
    main()
