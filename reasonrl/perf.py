"""FLOPs, a training step's bound at a machine's limits, and MFU.

One place counts the work of a step's phases from the model's config and the step's token counts
(:func:`flops_per_token`, :func:`step_work`) and turns it into the least time each phase can take on
a machine with a given GEMM throughput and memory bandwidth (:func:`phase_bounds`):

- **generate**: each distinct prompt prefilled once (its samples share it, as a prefix cache does),
  then decoding: at least the larger of the compute of every generated token and the memory
  traffic (the weights streamed once per decode step, plus every token's read of its KV cache);
- **prepare** (old log-probs; reference / critic forwards when the algo has them): one forward over
  the trained batch, each distinct prompt once, logits only at response positions; no policy forward
  when the old log-probs are the update's own (one update per batch: ``perf/old_logp_pass`` 0);
- **update_actor**: forward + backward = 3 × that forward's FLOPs per epoch, plus AdamW's memory
  traffic (read weight, grad, m, v; write weight, m, v: 28 bytes per parameter) per optimizer step;
  **update_critic** the same without the LM head;
- **weight_sync**: reading the trainer's fp32 weights and writing the engine's copy, once.

The step's bound is their sum; reward scoring (string work, no model) has none. ``bench/limits.py``
measures the throughput at each phase's own GEMM shapes; ``reasonrl train`` (:class:`StepPerf`)
uses one peak for every phase: the GPU's datasheet peak, ``--peak-flops``, or on CPU a GEMM
measured once at start-up, so its shares are of a looser (lower) bound.

Not counted anywhere: norms, rotary embeddings, activations, softmax, sampling (together under 2%
of SmolLM2-135M's FLOPs at 256 tokens of context).
"""

from __future__ import annotations

import contextlib
import functools
import math
import resource
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterator, MutableMapping, Sequence

#: Datasheet peak (dense, no sparsity) TFLOP/s: (bf16/fp16 tensor cores, fp32 without TF32). The
#: longest key contained in ``torch.cuda.get_device_name()`` wins; other GPUs get a measured GEMM.
GPU_PEAK_TFLOPS: dict[str, tuple[float, float]] = {
    "H100 PCIe": (756.0, 51.2),
    "H100": (989.4, 66.9),
    "H200": (989.4, 66.9),
    "GH200": (989.4, 66.9),
    "A100": (312.0, 19.5),
    "L40S": (362.1, 91.6),
    "L4": (121.0, 30.3),
    "RTX 4090": (165.2, 82.6),
    "MI300X": (1307.4, 163.4),
}
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
ADAMW_BYTES_PER_PARAM = 28  # fp32: read weight, grad, m, v and write weight, m, v


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count needs from a Llama-like decoder's config."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True

    @classmethod
    def from_config(cls, cfg: Any) -> "ModelShape":
        """From an HF config object or its ``config.json`` dict."""
        get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
        h, heads = int(get("hidden_size")), int(get("num_attention_heads"))
        return cls(hidden=h, intermediate=int(get("intermediate_size")), layers=int(get("num_hidden_layers")), heads=heads,
                   kv_heads=int(get("num_key_value_heads") or heads), head_dim=int(get("head_dim") or h // heads),
                   vocab=int(get("vocab_size")), tied=bool(get("tie_word_embeddings", False)))

    def linears(self) -> dict[str, tuple[int, int]]:
        """Each GEMM of a forward as (in, out) features, fused as inference engines fuse them:
        per layer ``qkv``, ``o``, ``gate_up``, ``down``; once ``lm_head``."""
        q, kv, i = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return {"qkv": (self.hidden, q + 2 * kv), "o": (q, self.hidden), "gate_up": (self.hidden, 2 * i), "down": (i, self.hidden),
                "lm_head": (self.hidden, self.vocab)}

    def layer_linear_params(self) -> int:
        return sum(k * n for name, (k, n) in self.linears().items() if name != "lm_head")

    def params(self) -> int:
        """All parameters (a tied embedding once): layer linears and two norms per layer, the final norm, embeddings."""
        return self.layers * (self.layer_linear_params() + 2 * self.hidden) + self.hidden + self.vocab * self.hidden * (1 if self.tied else 2)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV cache bytes one token holds (keys and values of every layer)."""
        return self.layers * 2 * self.kv_heads * self.head_dim * dtype_bytes


def flops_per_token(shape: ModelShape, *, context: float, lm_head: bool = True, backward: bool = False) -> float:
    """FLOPs to run one token through the model: forward, or forward + backward (3×: the backward
    computes the input's and the weights' gradients, each as costly as the forward).

    Forward, at 2 FLOPs per multiply-add: 2 × the layers' linear weights, plus attention
    4 · layers · heads · head_dim · ``context`` (QKᵀ and the weighted sum of values over the
    ``context`` keys this token attends to), plus the LM head 2 · hidden · vocab when ``lm_head``
    (the token's logits are needed)."""
    fwd = 2 * shape.layers * shape.layer_linear_params() + 4 * shape.layers * shape.heads * shape.head_dim * context
    if lm_head:
        fwd += 2 * shape.hidden * shape.vocab
    return 3 * fwd if backward else fwd


@dataclass(frozen=True)
class StepCounts:
    """A step's token counts, as a run's ``metrics.jsonl`` holds them (:meth:`from_metrics`)."""

    gen_prompts: float  # distinct prompts generated from (every dynamic-sampling round)
    gen_rows: float  # responses generated
    gen_tokens: float  # response tokens generated
    decode_steps: int  # the longest response: the batch decoded at least this many steps (partial rollouts: the rounds' engine steps)
    prompt_len: float  # mean prompt tokens
    train_prompts: float  # groups trained on
    train_rows: float  # responses trained on
    train_tokens: float  # prompt + response tokens of the trained rows (each row's prompt counted)
    epochs: int = 1
    optimizer_steps: int = 1
    old_pass: bool = True  # the old log-probs came from a forward of their own (not the update's)

    @property
    def train_response_tokens(self) -> float:
        return max(0.0, self.train_tokens - self.train_rows * self.prompt_len)

    @classmethod
    def from_metrics(cls, m: dict[str, Any], *, group_size: int, epochs: int = 1, mini_batch_size: int | None = None,
                     world: int = 1) -> "StepCounts | None":
        """One process's share, from one line of ``metrics.jsonl`` (its ``rollout/…`` counts are over
        all ``world`` processes, ``perf/train_tokens`` this process's); None for a step without an
        update. Runs logged before ``rollout/prompt_length_mean`` existed get it from the batch when
        nothing was dropped. ``mini_batch_size``: per process."""
        rows = (m.get("rollout/batch_size") or 0) / world
        if not rows or not m.get("perf/train_tokens"):
            return None
        gen_prompts = (m.get("rollout/ds_generated_groups") or 0) / world or rows / group_size
        p = m.get("rollout/prompt_length_mean")
        if p is None:
            if gen_prompts * group_size != rows:
                raise ValueError("this step dropped groups and its metrics have no rollout/prompt_length_mean: give the prompt length")
            p = (m["perf/train_tokens"] - m["rollout/gen_tokens"] / world) / rows
        return cls(gen_prompts=gen_prompts, gen_rows=gen_prompts * group_size, gen_tokens=m["rollout/gen_tokens"] / world,
                   decode_steps=int(m.get("rollout/partial_decode_steps", m.get("rollout/response_length_max")) or 0), prompt_len=float(p),
                   train_prompts=(m.get("rollout/ds_kept_groups") or 0) / world or rows / group_size, train_rows=rows,
                   train_tokens=m["perf/train_tokens"], epochs=epochs, optimizer_steps=epochs * math.ceil(rows / (mini_batch_size or rows)),
                   old_pass=bool(m.get("perf/old_logp_pass", 1)))


@dataclass(frozen=True)
class StepWork:
    """FLOPs and bytes of a step's phases (:func:`step_work`)."""

    prefill_flops: float
    decode_flops: float
    decode_bytes: float
    forward_flops: float  # one policy forward over the trained batch
    critic_forward_flops: float  # the same without the LM head
    update_flops: float  # the policy's forward + backward, every epoch
    params: int


def step_work(shape: ModelShape, c: StepCounts, *, engine_bytes: int) -> StepWork:
    """What :func:`phase_bounds` divides by the machine's limits. Attention contexts are means: a
    prompt token attends to (p + 1) / 2 keys on average, a response token to p + (r + 1) / 2."""
    p = c.prompt_len
    ctx_prompt = (p + 1) / 2
    ctx_gen = p + (c.gen_tokens / max(c.gen_rows, 1) + 1) / 2
    ctx_train = p + (c.train_response_tokens / c.train_rows + 1) / 2
    prompt_tokens = c.train_prompts * p

    def forward(lm_head: bool) -> float:
        return prompt_tokens * flops_per_token(shape, context=ctx_prompt, lm_head=False) + \
            c.train_response_tokens * flops_per_token(shape, context=ctx_train, lm_head=lm_head)

    fwd = forward(True)
    n = shape.params()
    return StepWork(
        prefill_flops=c.gen_prompts * p * flops_per_token(shape, context=ctx_prompt, lm_head=False),
        decode_flops=c.gen_tokens * flops_per_token(shape, context=ctx_gen),
        decode_bytes=c.decode_steps * n * engine_bytes + c.gen_tokens * ctx_gen * shape.kv_bytes_per_token(engine_bytes),
        forward_flops=fwd, critic_forward_flops=forward(False), update_flops=3 * fwd * c.epochs, params=n)


@dataclass(frozen=True)
class Limits:
    """A machine's throughputs: GEMM FLOP/s in each kind of pass, and memory bytes/s."""

    decode: float  # rows = the sequences decoded together
    prefill: float  # rows = a step's prompt tokens
    forward: float  # rows = a training micro-batch's tokens
    train: float  # the same micro-batch's forward and backward GEMMs
    bandwidth: float

    @classmethod
    def uniform(cls, flops: float, bandwidth: float) -> "Limits":
        return cls(flops, flops, flops, flops, bandwidth)


def phase_bounds(work: StepWork, c: StepCounts, lim: Limits, *, engine_bytes: int, critic: bool = False, ref: bool = False) -> dict[str, float]:
    """Seconds each phase needs at least (module docstring), and ``step``, their sum."""
    adam = c.optimizer_steps * work.params * ADAMW_BYTES_PER_PARAM / lim.bandwidth
    b = {
        "generate": work.prefill_flops / lim.prefill + max(work.decode_flops / lim.decode, work.decode_bytes / lim.bandwidth),
        "prepare": (work.forward_flops * (c.old_pass + ref) + work.critic_forward_flops * critic) / lim.forward,
        "update_actor": work.update_flops / lim.train + adam,
        "weight_sync": work.params * (DTYPE_BYTES["fp32"] + engine_bytes) / lim.bandwidth,
    }
    if critic:
        b["update_critic"] = 3 * work.critic_forward_flops * c.epochs / lim.train + adam
    b["step"] = sum(b.values())
    return b


# ---------------------------------------------------------------- measuring a machine


def _sync(device: str) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


def seconds_per_call(fn: Any, *, device: str = "cpu", seconds: float = 0.2, windows: int = 5) -> float:
    """Wall seconds of ``fn()`` at its fastest: after one warm-up call, the lowest mean over
    ``windows`` windows of about ``seconds / windows`` each (a limit, so other load is left out)."""
    fn()
    _sync(device)
    best = math.inf
    for _ in range(windows):
        reps, t0 = 0, time.perf_counter()
        while True:
            fn()
            reps += 1
            _sync(device)
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds / windows:
                break
        best = min(best, elapsed / reps)
    return best


def gemm_flops(shapes: Sequence[tuple[int, int, int, int]], *, dtype: str = "fp32", device: str = "cpu", seconds: float = 0.2) -> float:
    """Measured FLOP/s of the products (m, k, n, count): ``count`` times (m × k) @ (k × n) each,
    Σ 2·m·k·n·count / Σ time·count."""
    import torch

    td = getattr(torch, {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[dtype])
    flops = secs = 0.0
    for m, k, n, count in shapes:
        a, b = torch.randn(m, k, device=device).to(td), torch.randn(k, n, device=device).to(td)
        secs += count * seconds_per_call(lambda: a @ b, device=device, seconds=seconds)
        flops += count * 2 * m * k * n
    return flops / secs


def phase_gemms(shape: ModelShape, rows: int, *, kind: str) -> dict[str, list[tuple[int, int, int, int]]]:
    """The (m, k, n, count) products of one pass over ``rows`` tokens, by linear: ``kind``
    "prefill" (no LM head), "forward" / "decode" (with it), "train" (each forward product and the
    backward's two: the input's gradient (m × n) @ (n × k) and the weight's (k × m) @ (m × n))."""
    out = {}
    for name, (k, n) in shape.linears().items():
        if name == "lm_head" and kind == "prefill":
            continue
        count = 1 if name == "lm_head" else shape.layers
        out[name] = [(rows, k, n, count)] + ([(rows, n, k, count), (k, rows, n, count)] if kind == "train" else [])
    return out


def memory_bandwidth(*, nbytes: int = 256 << 20, device: str = "cpu", seconds: float = 0.2) -> dict[str, float]:
    """Measured bytes/s of a large fp32 ``copy`` (read + write) and STREAM's ``triad`` a = b + s·c
    (two reads, one write)."""
    import torch

    n = nbytes // 4
    a, b, c = (torch.rand(n, device=device) for _ in range(3))
    copy = seconds_per_call(lambda: a.copy_(b), device=device, seconds=seconds)
    triad = seconds_per_call(lambda: torch.add(b, c, alpha=3.0, out=a), device=device, seconds=seconds)
    return {"copy": 2 * nbytes / copy, "triad": 3 * nbytes / triad}


def gpu_peak_flops(name: str, dtype: str) -> float | None:
    """The datasheet peak of a GPU named ``name`` in ``dtype`` (FLOP/s), None when not in the table."""
    keys = sorted((k for k in GPU_PEAK_TFLOPS if k.lower() in name.lower()), key=len, reverse=True)
    if not keys:
        return None
    bf16, fp32 = GPU_PEAK_TFLOPS[keys[0]]
    return (fp32 if dtype == "fp32" else bf16) * 1e12


@contextlib.contextmanager
def timed(metrics: MutableMapping[str, Any], key: str) -> Iterator[None]:
    """``metrics[key]``: the wall seconds the ``with`` block took (set when it ends, not when it raises)."""
    t0 = time.perf_counter()
    yield
    metrics[key] = time.perf_counter() - t0


def peak_memory() -> dict[str, float]:
    """This process's peak memory so far, in GiB: ``perf/peak_rss_gib`` (the host's resident set,
    the trainer and an in-process engine together) and on CUDA ``perf/peak_gpu_gib`` (what torch's
    allocator has held; vLLM's KV cache is its own reservation, ``--gpu-memory-utilization``)."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # (KiB on Linux, bytes on macOS)
    out = {"perf/peak_rss_gib": kib / (2**30 if sys.platform == "darwin" else 2**20)}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        out["perf/peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


@functools.lru_cache(maxsize=None)
def measured_peak(hidden: int, intermediate: int, dtype: str, device: str) -> float:
    """A GEMM throughput measured once per process: the MLP's up projection at 2048 rows."""
    return gemm_flops([(2048, hidden, intermediate, 1)], dtype=dtype, device=device, seconds=0.3)


@functools.lru_cache(maxsize=None)
def measured_bandwidth(device: str) -> float:
    return max(memory_bandwidth(nbytes=64 << 20, device=device, seconds=0.1).values())


class StepPerf:
    """What ``reasonrl train`` logs about a step's speed (:meth:`metrics`): ``perf/<phase>_bound_frac``
    (the phase's bound / its time), ``perf/step_bound_s``, ``perf/step_bound_frac`` and ``perf/mfu``
    (the update's FLOPs / (its time × peak), as verl's actor MFU)."""

    def __init__(self, shape: ModelShape, *, peak_flops: float, bandwidth: float, engine_dtype: str, group_size: int,
                 epochs: int = 1, mini_batch_size: int | None = None, critic: bool = False, ref: bool = False, world: int = 1) -> None:
        self.shape, self.peak, self.limits = shape, peak_flops, Limits.uniform(peak_flops, bandwidth)
        self.engine_bytes, self.group_size, self.epochs, self.mini = DTYPE_BYTES[engine_dtype], group_size, epochs, mini_batch_size
        self.critic, self.ref, self.world = critic, ref, world

    @classmethod
    def for_model(cls, config: Any, *, dtype: str, device: str, peak_flops: float | None = None, **kw: Any) -> "StepPerf":
        """Peak: ``peak_flops``, else the GPU's datasheet peak, else a GEMM measured now (cached per
        process, ~0.3 s); bandwidth measured now (~0.2 s)."""
        shape = ModelShape.from_config(config)
        if peak_flops is None and device.startswith("cuda"):
            import torch

            peak_flops = gpu_peak_flops(torch.cuda.get_device_name(device), dtype)
        if peak_flops is None:
            peak_flops = measured_peak(shape.hidden, shape.intermediate, dtype, device)
        return cls(shape, peak_flops=peak_flops, bandwidth=measured_bandwidth(device), engine_dtype=dtype, **kw)

    def metrics(self, m: dict[str, Any]) -> dict[str, float]:
        c = StepCounts.from_metrics(m, group_size=self.group_size, epochs=self.epochs, mini_batch_size=self.mini, world=self.world)
        if c is None:
            return {}
        work = step_work(self.shape, c, engine_bytes=self.engine_bytes)
        bounds = phase_bounds(work, c, self.limits, engine_bytes=self.engine_bytes, critic=self.critic, ref=self.ref)
        out = {f"perf/{k}_bound_frac": v / m[f"perf/{k}_s"] for k, v in bounds.items() if v > 0 and m.get(f"perf/{k}_s")}
        out["perf/step_bound_s"] = bounds["step"]
        if m.get("perf/update_actor_s"):
            out["perf/mfu"] = work.update_flops / (m["perf/update_actor_s"] * self.peak)
        return out
