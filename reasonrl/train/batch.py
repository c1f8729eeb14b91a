"""Turning samples into training tensors.

Layout (B rows): ``[pad … prompt | response … pad]``: prompts are left-padded and responses
right-padded, so every response starts at column P and the logits that score response token t sit
at column P − 1 + t for every row. The model then only projects the last T + 1 positions
(``logits_to_keep``), never the prompt's.
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


def response_logits(model: Any, batch: Batch) -> torch.Tensor:
    """Logits scoring each response token: (B, T, V)."""
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
        logits_to_keep=batch.T + 1,
    )
    return out.logits[:, :-1, :]


def response_values(value_model: Any, batch: Batch) -> torch.Tensor:
    """V(s_t) for each response token t (the state before emitting it): (B, T) float32."""
    out = value_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids)
    v = out.logits.squeeze(-1).float()
    P = batch.prompt_len
    return v[:, P - 1 : P - 1 + batch.T]
