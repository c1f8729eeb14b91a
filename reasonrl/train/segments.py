"""Per-segment attention for the packed forward (:func:`reasonrl.train.batch.pack`).

The packed sequence is ``[prompt 0 | response 0.0 | response 0.1 | … | prompt 1 | response 1.0 | …]``:
a prompt's tokens attend causally among themselves, a response's tokens to their own prompt and
causally to their own earlier tokens. As one dense N × N masked attention (the reference,
:func:`dense_attention`), CPU SDPA computes every query-key pair, masked or not: N² per layer, N
the micro-batch's tokens. Per segment (:func:`segment_attention`) it computes only the pairs that
count, Σ_u p_u² over the prompts plus Σ_b k_b (p_b + k_b) over the responses (p_b its prompt's
length, k_b its own), one SDPA call per segment. A sliding-window layer (Mistral, Phi-3, Qwen2's
``use_sliding_window``, Gemma-2/3's local layers) also masks, in each segment, every key w or more
positions before its query (transformers' ``sliding_window_overlay``: a token sees itself and the
w − 1 before it in its row).

:func:`segment_attention_fn` is the same computation as a transformers attention function; the
trainer runs a packed forward through it (:func:`segments_in`) where the model attends with
``sdpa``, passing the dense masks as well, so that a path that ignores the segments (a wrapper that
drops the keyword) still attends correctly. Each layer's window is that of the dense mask the model
hands the layer (:attr:`Spans.masks`, by identity: the packed forward makes one per window); a mask
it does not know is attended densely, as given.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.nn.functional as F

#: The name :func:`segments_in` registers :func:`segment_attention_fn` under (transformers' AttentionInterface).
ATTENTION_NAME = "reasonrl_segments"
#: The keyword that carries a forward's :class:`Spans` to :func:`segment_attention_fn`.
KWARG = "reasonrl_segments"


@dataclass
class Spans:
    """Where each segment sits in a packed sequence of ``n`` tokens: per distinct prompt
    ``(start, length, ((start, length) of each of its rows' responses, …))``, in sequence order
    (a response of length 0 takes no place). ``calls`` counts the attention calls that used them;
    ``masks`` the packed forward's dense masks, each with the sliding window it applies (None: none),
    for :func:`segment_attention_fn` to tell a layer's window by the mask the layer receives."""

    prompts: tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...]
    n: int
    calls: int = 0
    masks: list[tuple[torch.Tensor, int | None]] = field(default_factory=list, repr=False)
    _masks: dict[tuple[str, int, int, int | None, str], torch.Tensor] = field(default_factory=dict, repr=False)

    def pairs(self) -> int:
        """The query-key pairs :func:`segment_attention` computes (the dense attention's: n²)."""
        return sum(p * p + sum(k * (p + k) for _, k in rows) for _, p, rows in self.prompts)

    def window_of(self, mask: Any) -> tuple[bool, int | None]:
        """(known, window): whether ``mask`` is one of :attr:`masks` (the very tensor), and its window."""
        for m, w in self.masks:
            if m is mask:
                return True, w
        return False, None

    def response_mask(self, k: int, p: int, device: torch.device, window: int | None = None) -> torch.Tensor:
        """(k, p + k) bool: response token i (position p + i) sees the p prompt tokens and its own
        tokens ≤ i (causal aligned to the bottom right), with a ``window`` only the keys at
        positions > p + i − window (key column c is position c). Made once per shape, window and
        device for all layers."""
        key = ("response", k, p, window, str(device))
        m = self._masks.get(key)
        if m is None:
            ones = torch.ones(k, p + k, dtype=torch.bool, device=device)
            m = ones.tril(p) if window is None else ones.tril(p) & ~ones.tril(p - window)
            self._masks[key] = m
        return m

    def prompt_mask(self, p: int, window: int, device: torch.device) -> torch.Tensor:
        """(p, p) bool: prompt token i sees its tokens j ≤ i with i − j < ``window``."""
        key = ("prompt", p, 0, window, str(device))
        m = self._masks.get(key)
        if m is None:
            ones = torch.ones(p, p, dtype=torch.bool, device=device)
            m = self._masks[key] = ones.tril() & ~ones.tril(-window)
        return m


#: Per-segment attention pays one SDPA call per segment; a micro-batch attends per segment only
#: where that computes at most this share of the dense N² pairs (bench/packed_attention.py).
SEGMENTS_BELOW = 0.5


def segments_pay(pairs: float, n: float) -> bool:
    """Whether :func:`segment_attention` is worth it over the dense attention for a packed
    sequence of ``n`` tokens whose segments hold ``pairs`` query-key pairs (:meth:`Spans.pairs`)."""
    return pairs <= SEGMENTS_BELOW * n * n


def segment_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, spans: Spans,
                      *, scale: float | None = None, window: int | None = None) -> torch.Tensor:
    """Attention of a packed sequence, segment by segment.

    query (1, H, N, d); key, value (1, H_kv, N, d) with H a multiple of H_kv (grouped-query: head h
    reads key-value head h // (H / H_kv)) → (1, H, N, d), equal to :func:`dense_attention` up to
    float rounding. Per prompt u: softmax(q k^T · scale) v causally over its p_u tokens; per
    response b of u: its k_b queries against the keys [prompt u ; response b] under
    :meth:`Spans.response_mask`; with a sliding ``window`` w, only the keys fewer than w positions
    before each query (:meth:`Spans.prompt_mask`), as the dense mask made with that window
    (:meth:`reasonrl.train.batch.Packed.attention_mask`). Gradients reach every segment's queries,
    keys and values (the prompt's keys and values from each of its responses too)."""
    key, value = _per_query_head(key, value, query.shape[1])
    outs = []
    for s, p, rows in spans.prompts:
        kp, vp = key[:, :, s : s + p], value[:, :, s : s + p]
        if window is None or p <= window:  # (the window masks nothing in a prompt this short)
            outs.append(F.scaled_dot_product_attention(query[:, :, s : s + p], kp, vp, is_causal=True, scale=scale))
        else:
            outs.append(F.scaled_dot_product_attention(query[:, :, s : s + p], kp, vp, attn_mask=spans.prompt_mask(p, window, query.device),
                                                       scale=scale))
        for r, k in rows:
            keys = torch.cat([kp, key[:, :, r : r + k]], 2)
            values = torch.cat([vp, value[:, :, r : r + k]], 2)
            mask = spans.response_mask(k, p, query.device, window if window is not None and p + k > window else None)
            outs.append(F.scaled_dot_product_attention(query[:, :, r : r + k], keys, values, attn_mask=mask, scale=scale))
    return torch.cat(outs, 2)


def dense_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, keep: torch.Tensor,
                    *, scale: float | None = None) -> torch.Tensor:
    """The reference: one SDPA call over the whole sequence under the dense (1, 1, N, N) bool mask
    ``keep`` (:meth:`reasonrl.train.batch.Packed.attention_mask`), every pair computed."""
    key, value = _per_query_head(key, value, query.shape[1])
    return F.scaled_dot_product_attention(query, key, value, attn_mask=keep, scale=scale)


def _per_query_head(key: torch.Tensor, value: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped-query keys and values (1, H_kv, N, d) repeated to ``heads`` (head h reads h // (H / H_kv))."""
    r = heads // key.shape[1]
    return (key, value) if r == 1 else (key.repeat_interleave(r, dim=1), value.repeat_interleave(r, dim=1))


def segment_attention_fn(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                         **kwargs: Any) -> tuple[torch.Tensor, None]:
    """A transformers attention function (``AttentionInterface``): :func:`segment_attention` with
    the :class:`Spans` of ``kwargs[KWARG]`` and the window of the dense mask the layer was handed
    (:meth:`Spans.window_of`); without them (a call that did not come through :func:`segments_in`'s
    forward, or a mask not among :attr:`Spans.masks`) transformers' ``sdpa`` with ``attention_mask``.
    Returns the output as (1, N, H, d), as every transformers attention function does, and no weights."""
    spans = kwargs.get(KWARG)
    known, window = spans.window_of(attention_mask) if spans is not None else (False, None)
    if not known or dropout:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    spans.calls += 1
    return segment_attention(query, key, value, spans, scale=scaling, window=window).transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def segments_in(config: Any) -> Iterator[bool]:
    """While active, a model with this HF ``config`` that attends with ``sdpa`` attends with
    :func:`segment_attention_fn` instead (yields True); any other attention implementation is left
    as it is (yields False: the caller keeps the dense mask only). Only the forward runs under it:
    the backward needs no lookup, so gradient checkpointing (which recomputes the forward in the
    backward) is the caller's to exclude."""
    if getattr(config, "_attn_implementation", None) != "sdpa":
        yield False
        return
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, segment_attention_fn)  # idempotent
    config._attn_implementation = ATTENTION_NAME
    try:
        yield True
    finally:
        config._attn_implementation = "sdpa"
