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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch


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


def _response_outputs(model: Any, batch: Batch, *, causal_lm: bool, share_prompts: bool) -> torch.Tensor:
    """The model's outputs (``.logits``) at columns P − 1 … P + T − 2, the positions that score the
    response tokens: (B, T, V) for a causal LM, (B, T, 1) for a value head.

    Shared: pass 1 runs the distinct prompts' first P − 1 columns into a KV cache; pass 2 runs
    every row's columns P − 1 … P + T − 2 on its prompt's cache. Always these two passes, also
    when every prompt differs, so that every rank of a ZeRO-3 run makes the same number of
    forward calls (each gathers the sharded parameters collectively).
    """
    P, T = batch.prompt_len, batch.T
    ids, am, pos = batch.input_ids, batch.attention_mask, batch.position_ids
    # Transformers' gradient checkpointing drops the KV cache in training mode: one plain pass then.
    if not share_prompts or (model.training and getattr(model, "is_gradient_checkpointing", False)):
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


def response_logits(model: Any, batch: Batch, *, share_prompts: bool = True) -> torch.Tensor:
    """Logits scoring each response token: (B, T, V)."""
    return _response_outputs(model, batch, causal_lm=True, share_prompts=share_prompts)


def response_values(value_model: Any, batch: Batch, *, share_prompts: bool = True) -> torch.Tensor:
    """V(s_t) for each response token t (the state before emitting it): (B, T) float32."""
    return _response_outputs(value_model, batch, causal_lm=False, share_prompts=share_prompts).squeeze(-1).float()
