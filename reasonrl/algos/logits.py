"""Memory-friendly per-token quantities from logits: entropy and log-probs of given tokens.

Both work on logits of shape (..., V) and process the flattened leading dims in chunks of
``chunk_size`` rows, so a (B, T, 150k) batch never materialises a second full-size tensor
(softmax, log_softmax or an fp32 copy of bf16 logits): temporaries are at most (chunk_size, V)
in float32. Gradients come from hand-written backward passes that recompute softmax chunk by
chunk, so autograd keeps only a reference to the logits themselves (no saved full-size
softmax); the only full-size tensor of backward is the logits' gradient. Non-contiguous logits
such as ``logits[:, :-1]`` are processed without a flattening copy. Half-precision logits are
computed in float32 and the result is float32; float64 stays float64. Both are differentiable
once (no double backward).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["entropy_from_logits", "logprobs_from_logits", "DEFAULT_CHUNK_SIZE"]

DEFAULT_CHUNK_SIZE = 1024
"""Rows (token positions) per chunk: 1024 x 152k vocab x fp32 = 0.6 GB per temporary."""


def _upcast(x: Tensor) -> Tensor:
    """float32 for half precision, else as is; -inf clamped to the dtype's finite minimum (so
    that probability-0 entries give 0 * finite = 0 instead of 0 * -inf = nan)."""
    x = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return x.clamp(min=torch.finfo(x.dtype).min)


def _out_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _chunks(n: int, step: int) -> range:
    return range(0, n, max(step, 1))


class _ChunkedEntropy(torch.autograd.Function):
    """(N, V) logits -> (N,) entropies; backward dH/dx = -p * (x - sum_v p_v x_v)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, step: int) -> Tensor:  # type: ignore[override]
        out = torch.empty(x.shape[0], dtype=_out_dtype(x.dtype), device=x.device)
        for s in _chunks(x.shape[0], step):
            xc = _upcast(x[s : s + step])
            p = torch.softmax(xc, dim=-1)
            out[s : s + step] = torch.logsumexp(xc, dim=-1) - (p * xc).sum(dim=-1)
        ctx.save_for_backward(x)
        ctx.step = step
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        (x,) = ctx.saved_tensors
        step = ctx.step
        grad = torch.empty_like(x)
        for s in _chunks(x.shape[0], step):
            xc = _upcast(x[s : s + step])
            p = torch.softmax(xc, dim=-1)
            mean_x = (p * xc).sum(dim=-1, keepdim=True)
            gc = g[s : s + step, None].to(xc.dtype)
            grad[s : s + step] = (-gc * p * (xc - mean_x)).to(x.dtype)
        return grad, None


class _ChunkedLogprob(torch.autograd.Function):
    """(N, V) logits, (N,) ids -> (N,) x_id - logsumexp(x); backward g * (onehot(id) - p)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, ids: Tensor, step: int) -> Tensor:  # type: ignore[override]
        out = torch.empty(x.shape[0], dtype=_out_dtype(x.dtype), device=x.device)
        for s in _chunks(x.shape[0], step):
            xc = _upcast(x[s : s + step])
            picked = xc.gather(-1, ids[s : s + step, None]).squeeze(-1)
            out[s : s + step] = picked - torch.logsumexp(xc, dim=-1)
        ctx.save_for_backward(x, ids)
        ctx.step = step
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        x, ids = ctx.saved_tensors
        step = ctx.step
        grad = torch.empty_like(x)
        for s in _chunks(x.shape[0], step):
            xc = _upcast(x[s : s + step])
            gc = g[s : s + step, None].to(xc.dtype)
            gx = -gc * torch.softmax(xc, dim=-1)
            gx.scatter_add_(-1, ids[s : s + step, None], gc)
            grad[s : s + step] = gx.to(x.dtype)
        return grad, None, None


def _rowwise(kind: str, x: Tensor, ids: Tensor | None, chunk_size: int | None) -> Tensor:
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
            parts = [_rowwise(kind, x[i], None if ids is None else ids[i], chunk_size) for i in range(x.shape[0])]
            return torch.stack(parts)
    n = x2.shape[0]
    if chunk_size is not None and chunk_size <= 0:
        raise ValueError(f"chunk_size must be > 0 or None, got {chunk_size}")
    step = max(n, 1) if chunk_size is None else chunk_size
    if kind == "entropy":
        out = _ChunkedEntropy.apply(x2, step)
    else:
        assert ids is not None
        out = _ChunkedLogprob.apply(x2, ids.reshape(-1), step)
    return out.view(lead)


def entropy_from_logits(logits: Tensor, chunk_size: int | None = DEFAULT_CHUNK_SIZE) -> Tensor:
    """Entropy of the categorical distribution softmax(logits) at every position.

        H = -sum_v p_v log p_v = logsumexp(x) - sum_v softmax(x)_v * x_v
        dH/dx_v = -p_v * (x_v - sum_u p_u x_u)

    Args:
        logits: (..., V), e.g. (B, T, V). Any float dtype; half precision is computed in float32.
        chunk_size: rows (flattened leading positions) per chunk; None = all at once.

    Returns:
        (...) entropies (float32, or float64 for float64 logits). Differentiable (once) when
        ``logits.requires_grad``; works under ``torch.no_grad()``. -inf logits count as
        probability 0.
    """
    if logits.dim() < 1:
        raise ValueError("logits must have a vocabulary dimension (..., V)")
    return _rowwise("entropy", logits, None, chunk_size)


def logprobs_from_logits(logits: Tensor, token_ids: Tensor, chunk_size: int | None = DEFAULT_CHUNK_SIZE) -> Tensor:
    """log softmax(logits)[token_id] at every position, without a full log_softmax tensor.

        log p(id) = x_id - logsumexp(x)
        d/dx_v    = 1[v = id] - p_v

    Args:
        logits: (..., V), e.g. (B, T, V): logits predicting each position (for a causal LM, the
            caller aligns them: ``logits[:, :-1]`` with ``input_ids[:, 1:]``).
        token_ids: (...) integer ids, same leading shape as ``logits``.
        chunk_size: rows per chunk; None = all at once.

    Returns:
        (...) log-probs (float32, or float64 for float64 logits), differentiable (once) w.r.t.
        logits.
    """
    if logits.shape[:-1] != token_ids.shape:
        raise ValueError(
            f"token_ids shape {tuple(token_ids.shape)} must equal logits' leading shape {tuple(logits.shape[:-1])}"
        )
    if token_ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise ValueError(f"token_ids must be an integer tensor, got {token_ids.dtype}")
    return _rowwise("logprob", logits, token_ids.long(), chunk_size)
