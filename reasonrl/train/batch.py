"""Turning samples into training tensors.

Layout (B rows): ``[pad … prompt | response … pad]``: prompts are left-padded and responses
right-padded, so every response starts at column P and the logits that score response token t sit
at column P − 1 + t for every row. The model then only projects the last T + 1 positions
(``logits_to_keep``), never the prompt's.

Shared prompts: the G samples of a group have the same prompt. When a (micro-)batch holds fewer
distinct prompts than rows, each distinct prompt goes through the model once (with gradients),
its KV cache is copied to its rows (an ``index_select``, so gradients from every row flow back into
the one prompt pass), and only the responses run per row. Same outputs as one forward over the
padded rows (``tests/train/test_batch.py``), up to float rounding; on this task, where a few-shot
prompt is ~85% of a row's tokens, it removes most of the forward and backward FLOPs.

Packed (shared-prefix packing): one sequence of batch 1 per micro-batch, each distinct prompt's real
tokens once, each followed by its rows' real response tokens, positions restarting per prompt and a
4D attention mask (a response sees its own prompt and its own earlier tokens, nothing else), so
every GEMM runs over the micro-batch's real tokens only; one forward call. Its cost: a dense N × N
mask, and attention either over all of it (CPU SDPA computes masked pairs too) or, where the model
attends with sdpa and is not checkpointed, per segment (:mod:`reasonrl.train.segments`: each
prompt causally, each response against its own prompt and itself, only the pairs that count) when
that skips at least half of the N² pairs. A model with sliding-window layers (Mistral, Phi-3,
Qwen2 with ``use_sliding_window``, Gemma-2/3) gets the window in its masks too, per layer type as
its own forward makes them (:func:`mask_windows`); a model whose attention the masks cannot
reproduce (:func:`packing_problem`: chunked or bidirectional attention, other layer types, an
attention implementation that takes no 4D mask) is never packed: ``auto`` runs it padded, an
explicit ``packed`` is refused. ``mode="auto"`` picks shared or
packed per micro-batch from token counts (:func:`cheapest_mode`); the trainer picks once per pass
over a step's or a mini-batch's micro-batches, from every rank's counts (:func:`pass_mode`), so
that ZeRO-3's ranks make the same forward calls.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch

from reasonrl.errors import ReasonRLError
from reasonrl.train.segments import KWARG, Spans, segments_in, segments_pay


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, P + T)
    attention_mask: torch.Tensor  # (B, P + T)
    position_ids: torch.Tensor  # (B, P + T)
    response_ids: torch.Tensor  # (B, T)
    mask: torch.Tensor  # (B, T) float: 1 on response tokens that count in the loss
    valid: torch.Tensor  # (B, T) float: 1 on every generated token (mask before overlong filtering)
    prompt_len: int  # P
    rows: list[int]  # indices into the step's sample list

    @property
    def T(self) -> int:
        return self.response_ids.shape[1]

    def to(self, device: torch.device | str) -> "Batch":
        if torch.device(device) == self.input_ids.device:
            return self
        t = {k: getattr(self, k).to(device) for k in ("input_ids", "attention_mask", "position_ids", "response_ids", "mask", "valid")}
        return Batch(**t, prompt_len=self.prompt_len, rows=self.rows)

    def select(self, idx: Sequence[int]) -> "Batch":
        """A sub-batch, trimmed to its own longest prompt and response."""
        ix = torch.as_tensor(list(idx), dtype=torch.long)
        valid = self.valid[ix]
        T = max(int(valid.sum(1).max().item()), 1)
        am = self.attention_mask[ix, : self.prompt_len]
        P0 = int((am.sum(0) > 0).nonzero()[0].item()) if am.sum() > 0 else 0
        cols = slice(P0, self.prompt_len + T)
        return Batch(
            input_ids=self.input_ids[ix, cols],
            attention_mask=self.attention_mask[ix, cols],
            position_ids=self.position_ids[ix, cols],
            response_ids=self.response_ids[ix, :T],
            mask=self.mask[ix, :T],
            valid=valid[:, :T],
            prompt_len=self.prompt_len - P0,
            rows=[self.rows[i] for i in idx],
        )


def build_batch(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *, pad_id: int, loss_rows: Sequence[bool] | None = None) -> Batch:
    """``loss_rows[i]`` False zeroes row i's loss mask (overlong filtering)."""
    B = len(prompts)
    P = max(len(p) for p in prompts)
    T = max(max((len(r) for r in responses), default=1), 1)
    ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    am = torch.zeros((B, P + T), dtype=torch.long)
    valid = torch.zeros((B, T), dtype=torch.float32)
    for b, (p, r) in enumerate(zip(prompts, responses)):
        ids[b, P - len(p) : P] = torch.as_tensor(list(p), dtype=torch.long)
        am[b, P - len(p) : P] = 1
        if len(r):
            ids[b, P : P + len(r)] = torch.as_tensor(list(r), dtype=torch.long)
            am[b, P : P + len(r)] = 1
            valid[b, : len(r)] = 1.0
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    mask = valid.clone()
    if loss_rows is not None:
        mask *= torch.as_tensor([1.0 if k else 0.0 for k in loss_rows])[:, None]
    return Batch(ids, am, pos, ids[:, P:].clone(), mask, valid, P, list(range(B)))


def _distinct(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    key = torch.cat([prompt_ids, prompt_mask], dim=1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    B, U = key.shape[0], uniq.shape[0]
    if U == B:
        return None
    rows = torch.arange(B, device=key.device)
    first = torch.full((U,), B, dtype=torch.long, device=key.device).scatter_reduce(0, inverse, rows, reduce="amin")
    return first, inverse


def prompt_groups(batch: Batch) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Rows that share a prompt: ``(first, inverse)`` with ``first`` (U,) the first row of each
    distinct prompt and ``inverse`` (B,) each row's prompt in ``0..U-1``; None when all differ."""
    P = batch.prompt_len
    return _distinct(batch.input_ids[:, :P], batch.attention_mask[:, :P])


def _shared_outputs(model: Any, batch: Batch, *, causal_lm: bool, share_prompts: bool) -> torch.Tensor:
    """Plain and shared modes (:func:`response_logits`): the model's outputs at columns P − 1 …
    P + T − 2 of the padded rows.

    Shared: pass 1 runs the distinct prompts' first P − 1 columns into a KV cache; pass 2 runs
    every row's columns P − 1 … P + T − 2 on its prompt's cache. Always these two passes, also
    when every prompt differs, so that every rank of a ZeRO-3 run makes the same number of
    forward calls (each gathers the sharded parameters collectively).
    """
    P, T = batch.prompt_len, batch.T
    ids, am, pos = batch.input_ids, batch.attention_mask, batch.position_ids
    # Transformers' gradient checkpointing drops the KV cache in training mode: one plain pass then.
    if not share_prompts or _checkpointing(model):
        if causal_lm:
            return model(input_ids=ids, attention_mask=am, position_ids=pos, use_cache=False, logits_to_keep=T + 1).logits[:, :-1, :]
        return model(input_ids=ids, attention_mask=am, position_ids=pos, use_cache=False).logits[:, P - 1 : P - 1 + T]
    from transformers import DynamicCache

    if P < 2:  # pass 1 needs a column: one more left pad (masked out)
        ids, am, pos = (torch.nn.functional.pad(x, (1, 0)) for x in (ids, am, pos))
        P += 1
    groups = _distinct(ids[:, : P - 1], am[:, : P - 1])
    first = groups[0] if groups is not None else torch.arange(ids.shape[0], device=ids.device)
    cache = DynamicCache()
    keep = {"logits_to_keep": 1} if causal_lm else {}
    model(input_ids=ids[first, : P - 1], attention_mask=am[first, : P - 1], position_ids=pos[first, : P - 1],
          past_key_values=cache, use_cache=True, **keep)
    if groups is not None:
        cache.reorder_cache(groups[1])  # (U, …) → (B, …), differentiable
    cols = slice(P - 1, P - 1 + T)
    return model(input_ids=ids[:, cols], attention_mask=am[:, : P - 1 + T], position_ids=pos[:, cols],
                 past_key_values=cache, use_cache=True).logits


def _checkpointing(model: Any) -> bool:
    return bool(model.training and getattr(model, "is_gradient_checkpointing", False))


@dataclass
class Packed:
    """One micro-batch as one padding-free sequence (:func:`pack`): each distinct prompt's real
    tokens once, each followed by its rows' response tokens (only the ``valid`` ones).

    N tokens: ``input_ids``/``position_ids`` (N,) (a response continues its prompt's positions);
    ``group`` (N,) the token's prompt in 0 … U − 1 and ``row`` (N,) its row, −1 on prompt tokens.
    ``score`` (M,) the packed positions whose outputs score the M = Σ_b len_b response tokens, in
    row-major order (response token 0 is scored at its prompt's last token, shared by the group's
    rows; token t ≥ 1 at the row's response token t − 1); ``target`` (M,) where each lands in the
    flattened (B · T) output."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    group: torch.Tensor
    row: torch.Tensor
    score: torch.Tensor
    target: torch.Tensor
    spans: Spans

    def attention_mask(self, window: int | None = None) -> torch.Tensor:
        """(1, 1, N, N) bool, True where query i attends to key j: j ≤ i, the same prompt, and j a
        prompt token or a token of i's own response; with a sliding ``window`` w, also j fewer than
        w positions before i in their row (transformers' ``kv > q − w``: itself and the w − 1 before)."""
        g, r = self.group, self.row
        n = g.shape[0]
        i = torch.arange(n, device=g.device)
        m = (i[:, None] >= i[None, :]) & (g[:, None] == g[None, :]) & ((r[None, :] < 0) | (r[None, :] == r[:, None]))
        if window is not None:
            pos = self.position_ids
            m &= pos[:, None] - pos[None, :] < window
        return m[None, None]

    def longest(self) -> int:
        """The longest row's tokens, prompt and response (the largest position + 1)."""
        return int(self.position_ids.max()) + 1


#: The layer types (transformers' ``config.layer_types``) whose attention the packed forward's masks reproduce.
PACKED_LAYER_TYPES = ("full_attention", "sliding_attention")
#: The attention implementations that take the packed forward's 4D masks as given.
PACKED_ATTENTION = ("sdpa", "eager")


def _text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def packing_problem(config: Any) -> str:
    """Why the packed forward cannot reproduce the attention of a model with this HF ``config``
    ('' when it can): it packs only causal full and sliding-window layers (:func:`mask_windows`)
    under an attention implementation that takes its 4D masks (:data:`PACKED_ATTENTION`)."""
    impl = getattr(config, "_attn_implementation", None)
    if impl is not None and impl not in PACKED_ATTENTION:
        return f"it attends with {impl}, which takes no 4D attention mask (load it with sdpa or eager)"
    c = _text_config(config)
    if not getattr(c, "is_causal", True) or getattr(c, "use_bidirectional_attention", False):
        return "its attention is bidirectional"
    if getattr(c, "attention_chunk_size", None):
        return "it attends in chunks (attention_chunk_size)"
    other = sorted(set(getattr(c, "layer_types", None) or ()) - set(PACKED_LAYER_TYPES))
    if other:
        return f"it has {', '.join(other)} layers"
    return ""


def mask_windows(config: Any, longest: int) -> dict[str, int | None]:
    """The sliding window (None: full causal) of each attention mask the packed forward hands a
    model with this HF ``config`` (one :func:`packing_problem` clears), as the model's own forward
    makes its masks (transformers' ``masking_utils``): a ``sliding_attention`` layer sees the keys
    fewer than ``config.sliding_window`` positions back (itself included), a ``full_attention``
    layer every earlier key; a config that lists no ``layer_types`` applies its ``sliding_window``
    (if any: Mistral, Phi-3, Mixtral) in every layer. Keyed by layer type where the layers' windows
    differ (Gemma-2/3, Qwen2 with ``use_sliding_window``: the model picks each layer's mask from the
    dict, as it does from ``generate``'s); else one mask, under "". A window that the ``longest``
    row (prompt and response) does not exceed masks nothing and counts as None."""
    c = _text_config(config)
    w = getattr(c, "sliding_window", None)
    if w is not None and longest <= w:
        w = None
    types = getattr(c, "layer_types", None)
    if not types:
        return {"": w}
    windows = {t: w if t == "sliding_attention" else None for t in sorted(set(types))}
    return windows if len(set(windows.values())) > 1 else {"": next(iter(windows.values()))}


def check_forward_mode(mode: str, *models: Any) -> None:
    """Refuse ``--forward-mode packed`` for a model whose attention the packed forward cannot
    reproduce (:func:`packing_problem`; None among ``models`` is skipped): a one-line error naming
    the fix. ``auto`` never packs such a model (:func:`pass_mode`)."""
    if mode != "packed":
        return
    for m in models:
        problem = packing_problem(_config(m)) if m is not None else ""
        if problem:
            raise ReasonRLError(f"--forward-mode packed cannot reproduce this model's attention: {problem}; "
                                "use --forward-mode auto (it runs such a model padded), shared or plain")


def pack(batch: Batch) -> Packed:
    """The packed layout of ``batch`` (:class:`Packed`). A row's response is its first
    ``valid.sum()`` tokens (none for a padding copy); every distinct prompt is there even when all
    its rows are empty, so the sequence is never empty."""
    P, T = batch.prompt_len, batch.T
    dev = batch.input_ids.device
    pmask = batch.attention_mask[:, :P].bool()
    plen = pmask.sum(1).tolist()
    rlen = batch.valid.sum(1).round().long().tolist()
    B = len(plen)
    if min(plen, default=1) < 1:
        raise ValueError("the packed forward needs every prompt to have at least one token")
    groups = _distinct(batch.input_ids[:, :P], batch.attention_mask[:, :P])
    inverse = groups[1].tolist() if groups is not None else list(range(B))
    members: dict[int, list[int]] = {}  # prompts in the order of their first row
    for b, u in enumerate(inverse):
        members.setdefault(u, []).append(b)
    cols = torch.arange(P + T, device="cpu")
    flat, pos, grp, row = [], [], [], []
    score = [torch.empty(0, dtype=torch.long)] * B
    spans = []
    n = 0
    for u, rows in enumerate(members.values()):
        r0 = rows[0]
        p = plen[r0]
        start, responses = n, []
        flat.append(r0 * (P + T) + cols[P - p : P])
        pos.append(torch.arange(p))
        grp.append(torch.full((p,), u))
        row.append(torch.full((p,), -1))
        last = n + p - 1
        n += p
        for b in rows:
            k = rlen[b]
            flat.append(b * (P + T) + cols[P : P + k])
            pos.append(torch.arange(p, p + k))
            grp.append(torch.full((k,), u))
            row.append(torch.full((k,), b))
            score[b] = torch.cat([torch.tensor([last]), torch.arange(n, n + k - 1)]) if k else score[b]
            if k:
                responses.append((n, k))
            n += k
        spans.append((start, p, tuple(responses)))
    target = torch.cat([b * T + torch.arange(rlen[b]) for b in range(B)])
    ids = batch.input_ids.reshape(-1)[torch.cat(flat).to(dev)]
    return Packed(ids, torch.cat(pos).to(dev), torch.cat(grp).to(dev), torch.cat(row).to(dev), torch.cat(score).to(dev), target.to(dev),
                  Spans(tuple(spans), n))


def _packed_outputs(model: Any, batch: Batch, *, causal_lm: bool) -> torch.Tensor:
    """Packed mode: one forward over :func:`pack`'s sequence (batch 1) with its 4D attention mask
    (one per sliding window the model's layers apply: :func:`mask_windows`), outputs at the
    ``score`` positions only, scattered into (B, T, ·); zero off the valid tokens."""
    config = _config(model)
    problem = packing_problem(config)
    if problem:
        raise ReasonRLError(f"the packed forward cannot reproduce this model's attention: {problem}; use forward mode auto, shared or plain")
    pk = pack(batch)
    windows = mask_windows(config, pk.longest())
    # Additive float masks in the attention's dtype, made once: SDPA would otherwise turn a bool mask
    # into a float copy in every layer, and keep each for the backward (L × N² floats); eager adds it.
    dev = pk.input_ids.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else _param_dtype(model)
    made: dict[int | None, torch.Tensor] = {}
    for w in windows.values():
        if w not in made:
            keep = pk.attention_mask(w)
            made[w] = torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, torch.finfo(dtype).min)
            del keep
    pk.spans.masks = [(m, w) for w, m in made.items()]
    mask = made[windows[""]] if "" in windows else {t: made[w] for t, w in windows.items()}
    kw = dict(input_ids=pk.input_ids[None], attention_mask=mask, position_ids=pk.position_ids[None], use_cache=False)
    per_segment = segments_pay(pk.spans.pairs(), pk.spans.n) and not _checkpointing(model)  # (a checkpointed layer's recompute would attend densely)
    with segments_in(_config(model)) if per_segment else contextlib.nullcontext(False) as on:
        if on:
            kw[KWARG] = pk.spans
        if causal_lm:
            out = model(**kw, logits_to_keep=pk.score).logits[0]  # (M, V)
        else:
            out = model(**kw).logits[0, pk.score]  # (M, 1)
    B, T = batch.response_ids.shape
    full = out.new_zeros(B * T, out.shape[-1])
    return full.index_copy(0, pk.target, out).view(B, T, -1)


#: One query-key pair of CPU attention (torch's SDPA with a mask, forward + backward) costs about
#: this many times its FLOPs at the GEMMs' rate (SDPA ran at 0.3–0.6 of the GEMM rate on a 2-core
#: Xeon with AMX, fp32 and bf16).
ATTENTION_SLOWDOWN = 2.0
#: The shared mode's time per FLOP over the packed mode's, measured side by side (bench/README.md,
#: "Packed forward": 1.72x the time for 0.89x the FLOPs at the main job's shape): its two calls,
#: the KV-cache copy and its backward, GEMMs over a few hundred rows each.
SHARED_OVERHEAD = 1.9
#: Above this many tokens in one micro-batch the packed mode's N × N mask (a bool, and SDPA's
#: float copy for the backward: ~5 bytes a pair, 1.3 GiB at 16k) is not worth it: shared then.
PACKED_MAX_TOKENS = 16384


@dataclass(frozen=True)
class ForwardCost:
    """A model's forward cost in FLOPs: ``token`` per token through the blocks' linear layers,
    ``pair`` per query-key pair of attention over all layers (× :data:`ATTENTION_SLOWDOWN`),
    ``head`` per position projected by the output layer (the LM head, or a value head)."""

    token: float
    pair: float
    head: float

    @classmethod
    def of(cls, config: Any, *, causal_lm: bool = True) -> "ForwardCost":
        c = config.get_text_config() if hasattr(config, "get_text_config") else config
        d, L, nh = c.hidden_size, c.num_hidden_layers, c.num_attention_heads
        nkv = getattr(c, "num_key_value_heads", None) or nh
        hd = getattr(c, "head_dim", None) or d // nh
        ffn = getattr(c, "intermediate_size", None) or 4 * d
        linear = 2 * d * nh * hd + 2 * d * nkv * hd + 3 * d * ffn
        return cls(token=2.0 * L * linear, pair=ATTENTION_SLOWDOWN * 4.0 * L * nh * hd, head=2.0 * d * (c.vocab_size if causal_lm else 1))


def segment_pairs(batch: Batch) -> float:
    """The query-key pairs of ``batch``'s packed sequence attended per segment (``pack(batch).spans.pairs()``,
    from the token counts without packing): each distinct prompt's p² and each row's k (p + k)."""
    groups = prompt_groups(batch)
    first = groups[0] if groups is not None else torch.arange(batch.response_ids.shape[0])
    return _segment_pairs(batch, batch.attention_mask[:, : batch.prompt_len].sum(1), first)


def _segment_pairs(batch: Batch, plen: torch.Tensor, first: torch.Tensor) -> float:
    """:func:`segment_pairs` from each row's prompt length and each distinct prompt's first row."""
    plen, k = plen.double(), batch.valid.sum(1).round().double()
    return float((plen[first.to(plen.device)] ** 2).sum() + (k * (plen + k)).sum())


def forward_costs(batch: Batch, cost: ForwardCost, *, per_segment: bool = True) -> dict[str, float]:
    """Each mode's estimated cost for ``batch`` (one micro-batch) from its token counts, in FLOPs
    (shared's × :data:`SHARED_OVERHEAD`): plain and shared pay every padded column (and attention
    over it, masked or not: CPU SDPA skips no masked block), packed pays the real tokens only and
    a dense N × N attention, or, with ``per_segment`` (the model is not checkpointed) where
    :func:`reasonrl.train.segments.segments_pay`, each segment's pairs only (infinite above
    :data:`PACKED_MAX_TOKENS`, for the dense mask it still makes)."""
    B, T = batch.response_ids.shape
    P = max(batch.prompt_len, 2)
    groups = prompt_groups(batch)
    U = B if groups is None else int(groups[0].numel())
    plen = batch.attention_mask[:, : batch.prompt_len].sum(1)
    first = groups[0] if groups is not None else torch.arange(B)
    M = float(batch.valid.sum())
    N = float(plen[first.to(plen.device)].sum()) + M
    shared = cost.token * (U * (P - 1) + B * T) + cost.pair * (U * (P - 1) ** 2 + B * T * (P - 1 + T)) + cost.head * (U + B * T)
    pairs = _segment_pairs(batch, plen, first)
    if not (per_segment and segments_pay(pairs, N)):
        pairs = N * N
    return {
        "plain": cost.token * B * (P + T) + cost.pair * B * (P + T) ** 2 + cost.head * B * (T + 1),
        "shared": SHARED_OVERHEAD * shared,
        "packed": cost.token * N + cost.pair * pairs + cost.head * M if N <= PACKED_MAX_TOKENS else math.inf,
    }


def cheapest(costs: dict[str, float], *, shared: bool = True) -> str:
    """The cheaper of ``shared`` and ``packed`` in ``costs`` (:func:`forward_costs`, or their sums
    over a step's micro-batches and over ranks); ``plain`` in place of ``shared`` when the
    shared mode is unavailable (gradient checkpointing)."""
    other = "shared" if shared else "plain"
    return "packed" if costs["packed"] < costs[other] else other


def cheapest_mode(batch: Batch, cost: ForwardCost, *, shared: bool = True) -> str:
    """``auto``'s choice for one micro-batch: ``packed`` or ``shared`` (``plain`` when ``shared``
    is False), whichever :func:`forward_costs` puts cheaper. (Not the ``forward_mode`` setting,
    ``--forward-mode``, which names the mode or asks for ``auto``.)

    ZeRO-3: packed makes one forward call per micro-batch, shared two, and every rank must make
    the same calls. Per micro-batch this choice is local: the trainer uses :func:`pass_mode`,
    which decides a whole pass on every rank's counts summed."""
    return cheapest(forward_costs(batch, cost, per_segment=shared), shared=shared)


def pass_mode(mode: str, model: Any, batches: Iterable[Batch], *, causal_lm: bool,
              total: Callable[[torch.Tensor], torch.Tensor] | None = None) -> str:
    """The mode of a whole pass of ``model`` over ``batches`` (a step's or a mini-batch's
    micro-batches): ``mode`` itself unless it is ``auto`` (``batches`` are then not read); for
    ``auto`` the cheapest by :func:`forward_costs` summed over them and, with ``total`` (a sum over
    ranks, ``Ranks.sum``), over every rank's, so that every rank of a ZeRO-3 run picks the same
    mode and makes the same forward calls; :func:`padded_mode` is the alternative to packed, and
    the mode of a model the packed forward cannot reproduce (:func:`packing_problem`)."""
    if mode != "auto" or model is None:
        return mode
    if packing_problem(_config(model)):
        return padded_mode(model)
    cost = ForwardCost.of(_config(model), causal_lm=causal_lm)
    keys = ("plain", "shared", "packed")
    sums = torch.zeros(len(keys), dtype=torch.float64)
    per_segment = not _checkpointing(model)
    for b in batches:
        c = forward_costs(b, cost, per_segment=per_segment)
        sums += torch.tensor([c[k] for k in keys], dtype=torch.float64)
    if total is not None:
        sums = total(sums)
    return cheapest(dict(zip(keys, sums.tolist())), shared=padded_mode(model) == "shared")


def padded_mode(model: Any) -> str:
    """The padded mode ``model`` runs in (shared, or plain under gradient checkpointing in training
    mode): what ``auto`` falls back to when packed is not the cheaper."""
    return "plain" if _checkpointing(model) else "shared"


def _param_dtype(model: Any) -> torch.dtype:
    p = next(iter(model.parameters()), None)
    return p.dtype if p is not None and p.is_floating_point() else torch.float32


def _config(model: Any) -> Any:
    """The HF config of a model, a peft model (forwarded) or a DeepSpeed engine (its ``module``)."""
    return getattr(model, "config", None) or model.module.config


MODES = ("auto", "shared", "packed", "plain")


def _response_outputs(model: Any, batch: Batch, *, causal_lm: bool, mode: str) -> torch.Tensor:
    """The model's outputs scoring each response token: (B, T, V) for a causal LM, (B, T, 1) for a
    value head; one forward call (packed, plain) or two (shared) per micro-batch."""
    if mode not in MODES:
        raise ValueError(f"forward mode {mode!r}: use one of {', '.join(MODES)}")
    if mode == "auto":
        mode = (padded_mode(model) if packing_problem(_config(model)) else
                cheapest_mode(batch, ForwardCost.of(_config(model), causal_lm=causal_lm), shared=not _checkpointing(model)))
    if mode == "packed":
        return _packed_outputs(model, batch, causal_lm=causal_lm)
    return _shared_outputs(model, batch, causal_lm=causal_lm, share_prompts=mode == "shared")


def response_logits(model: Any, batch: Batch, *, mode: str = "shared") -> torch.Tensor:
    """Logits scoring each response token: (B, T, V). ``mode``: ``plain`` one forward over the
    padded rows; ``shared`` (the default) each distinct prompt into a KV cache, then the responses
    on it; ``packed`` one padding-free sequence; ``auto`` the cheapest of these by
    :func:`cheapest_mode` (per micro-batch: see its docstring for ZeRO-3). Off the valid tokens
    the numbers are finite (zero in packed mode)."""
    return _response_outputs(model, batch, causal_lm=True, mode=mode)


def response_values(value_model: Any, batch: Batch, *, mode: str = "shared") -> torch.Tensor:
    """V(s_t) for each response token t (the state before emitting it): (B, T) float32."""
    return _response_outputs(value_model, batch, causal_lm=False, mode=mode).squeeze(-1).float()
