"""Memory-friendly per-token quantities from logits: entropy and log-probs of given tokens, under
the distribution a sampler actually draws from.

The sampling distribution (:class:`Sampling`, :func:`sampling_logits`) is the one vLLM's CPU
sampler and ``processed_logprobs`` use (vLLM 0.32 ``v1/sample``, computed the same way): logits / T,
then the top-k mask (every logit >= the k-th largest is kept, ties included), then the top-p mask
over the softmax of what top-k kept (the logits sorted ascending by torch's default sort, a token
dropped iff the cumulative mass up to it is <= 1 - p, i.e. kept iff the mass sorted above it is
< p; the top token always stays; tied tokens at the cut are kept or dropped in the order that
sort leaves them), renormalised over the kept set. The transformers engine samples from it and
the trainer scores every token under it, so the old log-probs, the update's log-probs, the entropy
and the clip-by-probability buckets all describe the distribution that produced the tokens.

Both work on logits of shape (..., V) and process the flattened leading dims in chunks of
``chunk_size`` rows, so a (B, T, 150k) batch never materialises a second full-size tensor
(softmax, log_softmax or an fp32 copy of bf16 logits): temporaries are at most (chunk_size, V)
in float32. The default chunk (``"auto"``) is cache-sized on CPU (:data:`CPU_CHUNK_BYTES`), 1024
rows on GPUs. Gradients come from hand-written backward passes that recompute softmax chunk by
chunk, so autograd keeps only a reference to the logits themselves (no saved full-size
softmax); the only full-size tensor of backward is the logits' gradient. Non-contiguous logits
such as ``logits[:, :-1]`` are processed without a flattening copy. Half-precision logits are
computed in float32 and the result is float32; float64 stays float64. Both are differentiable
once (no double backward).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["Sampling", "sampling_logits", "entropy_from_logits", "logprobs_from_logits", "DEFAULT_CHUNK_SIZE", "CPU_CHUNK_BYTES"]

DEFAULT_CHUNK_SIZE = "auto"
"""Rows (token positions) per chunk: on CPU as many as keep a float32 (rows, V) temporary within
:data:`CPU_CHUNK_BYTES`; on GPUs 1024 (x 152k vocab x fp32 = 0.6 GB per temporary)."""

CPU_CHUNK_BYTES = 2 << 20
"""On CPU a chunk's temporaries stay in cache, so its several passes (upcast, softmax, sums; the
backward's) do not each go through main memory: log-prob + entropy + backward over (2000, 49152)
bf16 logits took 1.86 s in chunks of 1024 rows, 0.50 s of 64, 0.38 s of 16 on this project's
2-core machine (bench/README.md)."""


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """A sampling distribution: temperature T > 0, top-p (1.0: off) and top-k (<= 0: off), by
    keyword (the fields in the engine's ``SamplingParams`` order)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 for a sampling distribution (greedy has none), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def identity(self) -> bool:
        """True when the distribution is softmax(logits) itself."""
        return self.temperature == 1.0 and self.top_k <= 0 and self.top_p >= 1.0


PLAIN = Sampling()


def _upcast(x: Tensor) -> Tensor:
    """float32 for half precision, else as is; -inf clamped to the dtype's finite minimum (so
    that probability-0 entries give 0 * finite = 0 instead of 0 * -inf = nan)."""
    if x.dtype in (torch.float16, torch.bfloat16):
        return x.float().clamp_(min=torch.finfo(torch.float32).min)  # (clamped in place: the upcast is a copy already)
    return x.clamp(min=torch.finfo(x.dtype).min)


def _out_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _chunks(n: int, step: int) -> range:
    return range(0, n, max(step, 1))


def _keep_mask(z: Tensor, sampling: Sampling) -> Tensor | None:
    """(N, V) bool: the tokens the sampler may draw, from temperature-scaled logits ``z``; None
    when every token is kept. vLLM's CPU rule, op for op (``apply_top_k_top_p_pytorch``): top-k
    alone keeps every logit >= the k-th largest; with top-p the logits are sorted ascending by
    torch's default sort (so tied tokens fall in the order that sort leaves them, not by index),
    top-k masks the sorted values below the k-th largest, and a token is dropped when the
    cumulative softmax mass up to it (ascending) is <= 1 - p, the largest always kept."""
    V = z.shape[-1]
    k = sampling.top_k if 0 < sampling.top_k < V else 0
    if sampling.top_p >= 1.0:
        return z >= torch.topk(z, k, dim=-1).values[:, -1:] if k else None
    srt, idx = z.sort(dim=-1, descending=False)
    if k:
        srt = srt.masked_fill(srt < srt[:, V - k : V - k + 1], float("-inf"))
    drop = srt.softmax(dim=-1).cumsum(dim=-1) <= 1 - torch.full((), sampling.top_p, dtype=z.dtype, device=z.device)
    drop[:, -1] = False
    return torch.ones_like(drop).scatter(-1, idx, ~drop)


def _processed(x: Tensor, sampling: Sampling, ids: Tensor | None) -> Tensor:
    """Temperature-scaled logits with the filtered tokens at the dtype's minimum (upcast like
    :func:`_upcast`). ``ids`` (N,), when given, are always kept: a sampled token lies in the
    sampler's kept set even where the trainer's numerics put it a hair outside."""
    z = _upcast(x)
    if sampling.identity:
        return z
    if sampling.temperature != 1.0:
        z = z / sampling.temperature
    keep = _keep_mask(z, sampling)
    if keep is None:
        return z
    if ids is not None:
        keep = keep.scatter(-1, ids[:, None], True)
    return z.masked_fill(~keep, torch.finfo(z.dtype).min)


def sampling_logits(logits: Tensor, sampling: Sampling = PLAIN) -> Tensor:
    """The logits of the sampling distribution: ``logits / T`` with the tokens top-k / top-p
    filter out at -inf (see the module doc for vLLM's order). (..., V) → (..., V), float32 for half
    precision inputs. ``softmax`` of the result is the distribution sampled from."""
    lead, V = logits.shape[:-1], logits.shape[-1]
    z = _processed(logits.reshape(-1, V), sampling, None)
    return z.masked_fill(z == torch.finfo(z.dtype).min, float("-inf")).reshape(*lead, V)


def _entropy_value(z: Tensor, ids: Tensor | None) -> Tensor:
    """H = logsumexp(z) - sum_v p_v z_v, per row."""
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def _entropy_grad(z: Tensor, ids: Tensor | None, g: Tensor) -> Tensor:
    """dH/dz scaled by g (N, 1): -g * p * (z - sum_v p_v z_v)."""
    p = torch.softmax(z, dim=-1)
    return -g * p * (z - (p * z).sum(dim=-1, keepdim=True))


def _logprob_value(z: Tensor, ids: Tensor | None) -> Tensor:
    """z_id - logsumexp(z), per row."""
    assert ids is not None
    return z.gather(-1, ids[:, None]).squeeze(-1) - torch.logsumexp(z, dim=-1)


def _logprob_grad(z: Tensor, ids: Tensor | None, g: Tensor) -> Tensor:
    """d log p_id / dz scaled by g (N, 1): g * (onehot(id) - p)."""
    assert ids is not None
    gz = -g * torch.softmax(z, dim=-1)
    return gz.scatter_add_(-1, ids[:, None], g)


_ROWWISE = {"entropy": (_entropy_value, _entropy_grad), "logprob": (_logprob_value, _logprob_grad)}


class _Chunked(torch.autograd.Function):
    """(N, V) logits (and (N,) ids) -> (N,) per-row values, ``step`` rows at a time: the processed
    logits (temperature, top-k/top-p) of one chunk exist at once, forward and backward alike; the
    backward recomputes them from the saved raw logits. ``kind`` picks the value and its gradient
    with respect to the processed logits (``_ROWWISE``); the chain rule through the temperature is
    the ``1 / T`` factor, and filtered-out entries get no gradient (their processed value is a
    constant)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, ids: Tensor | None, step: int, sampling: Sampling, kind: str) -> Tensor:  # type: ignore[override]
        value = _ROWWISE[kind][0]
        out = torch.empty(x.shape[0], dtype=_out_dtype(x.dtype), device=x.device)
        for s in _chunks(x.shape[0], step):
            idc = None if ids is None else ids[s : s + step]
            out[s : s + step] = value(_processed(x[s : s + step], sampling, idc), idc)
        ctx.save_for_backward(x, ids)
        ctx.step, ctx.sampling, ctx.kind = step, sampling, kind
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None, None, None]:  # type: ignore[override]
        x, ids = ctx.saved_tensors
        step, sampling, grad_of = ctx.step, ctx.sampling, _ROWWISE[ctx.kind][1]
        grad = torch.empty_like(x)
        for s in _chunks(x.shape[0], step):
            idc = None if ids is None else ids[s : s + step]
            zc = _processed(x[s : s + step], sampling, idc)
            grad[s : s + step] = grad_of(zc, idc, g[s : s + step, None].to(zc.dtype) / sampling.temperature).to(x.dtype)
        return grad, None, None, None, None


def _rowwise(kind: str, x: Tensor, ids: Tensor | None, chunk_size: int | str | None, sampling: Sampling) -> Tensor:
    """Apply the chunked op to ``x`` (..., V) (and ``ids`` (...)), returning (...)."""
    lead = x.shape[:-1]
    V = x.shape[-1]
    if x.dim() == 1:
        x2 = x.unsqueeze(0)
    elif x.dim() == 2:
        x2 = x  # row slices need no flattening, whatever the strides
    else:
        try:
            x2 = x.view(-1, V)
        except RuntimeError:
            # Not flattenable without a full copy (e.g. logits[:, :-1]): one leading index at a time.
            parts = [_rowwise(kind, x[i], None if ids is None else ids[i], chunk_size, sampling) for i in range(x.shape[0])]
            return torch.stack(parts)
    n = x2.shape[0]
    if chunk_size == "auto":
        chunk_size = 1024 if x2.device.type == "cuda" else max(1, CPU_CHUNK_BYTES // (4 * V))
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size <= 0):
        raise ValueError(f"chunk_size must be > 0, None or 'auto', got {chunk_size}")
    step = max(n, 1) if chunk_size is None else chunk_size
    flat_ids = None if ids is None else ids.reshape(-1)
    out = _Chunked.apply(x2, flat_ids, step, sampling, kind)
    return out.view(lead)


def entropy_from_logits(logits: Tensor, chunk_size: int | str | None = DEFAULT_CHUNK_SIZE, *, sampling: Sampling = PLAIN,
                        token_ids: Tensor | None = None) -> Tensor:
    """Entropy of the sampling distribution softmax(z) at every position, z = sampling_logits(x).

        H = -sum_v p_v log p_v = logsumexp(z) - sum_v softmax(z)_v * z_v
        dH/dx_v = -(p_v / T) * (z_v - sum_u p_u z_u)        (filtered tokens: 0)

    Args:
        logits: (..., V), e.g. (B, T, V). Any float dtype; half precision is computed in float32.
        chunk_size: rows (flattened leading positions) per chunk; None = all at once; "auto": cache-sized
            on CPU, 1024 on GPUs.
        sampling: the sampler's temperature / top-k / top-p (default: softmax(logits) itself).
        token_ids: (...) the sampled tokens, kept in the filtered set as :func:`logprobs_from_logits`
            keeps them (so entropy and log-probs describe the same distribution).

    Returns:
        (...) entropies (float32, or float64 for float64 logits). Differentiable (once) when
        ``logits.requires_grad``; works under ``torch.no_grad()``. -inf logits count as
        probability 0.
    """
    if logits.dim() < 1:
        raise ValueError("logits must have a vocabulary dimension (..., V)")
    ids = None if token_ids is None else _check_ids(logits, token_ids)
    return _rowwise("entropy", logits, ids, chunk_size, sampling)


def logprobs_from_logits(logits: Tensor, token_ids: Tensor, chunk_size: int | str | None = DEFAULT_CHUNK_SIZE, *,
                         sampling: Sampling = PLAIN) -> Tensor:
    """log softmax(z)[token_id] at every position, z = sampling_logits(logits, sampling), without a
    full log_softmax tensor.

        log p(id) = z_id - logsumexp(z)
        d/dx_v    = (1[v = id] - p_v) / T          (filtered tokens: 0)

    The token itself always counts as kept by top-k / top-p (it was sampled, so it was in the
    sampler's set; a tie or a rounding difference must not make its log-probability -inf).

    Args:
        logits: (..., V), e.g. (B, T, V): logits predicting each position (for a causal LM, the
            caller aligns them: ``logits[:, :-1]`` with ``input_ids[:, 1:]``).
        token_ids: (...) integer ids, same leading shape as ``logits``.
        chunk_size: rows per chunk; None = all at once; "auto" (see ``entropy_from_logits``).
        sampling: the sampler's temperature / top-k / top-p (default: softmax(logits) itself).

    Returns:
        (...) log-probs (float32, or float64 for float64 logits), differentiable (once) w.r.t.
        logits.
    """
    return _rowwise("logprob", logits, _check_ids(logits, token_ids), chunk_size, sampling)


def _check_ids(logits: Tensor, token_ids: Tensor) -> Tensor:
    if logits.shape[:-1] != token_ids.shape:
        raise ValueError(
            f"token_ids shape {tuple(token_ids.shape)} must equal logits' leading shape {tuple(logits.shape[:-1])}"
        )
    if token_ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise ValueError(f"token_ids must be an integer tensor, got {token_ids.dtype}")
    return token_ids.long()
