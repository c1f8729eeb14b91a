"""Cutting a mini-batch into micro-batches: by rows (``--micro-batch-size``) or to a token budget
(``--max-tokens-per-micro-batch``, verl's ``use_dynamic_bsz`` / ``ppo_max_token_len_per_gpu``).

The gradient does not depend on the cut: the learner weights each micro-batch's loss by its share
of the mini-batch's counted tokens (token-mean) or rows (the sequence modes), counted over every
rank, so the accumulated gradient is the mini-batch's aggregate whatever the micro-batches are
(``tests/train/test_micro.py`` checks it in fp32). Only time and memory change.

A micro-batch's **cost** is the tokens the trainer's forward (``reasonrl.train.batch``) runs over
it: shared, its distinct prompts at its longest prompt plus its rows at its longest response
(padding included); plain, its rows at its longest prompt plus longest response; packed, its
distinct prompts' and its rows' real tokens. ``auto`` is counted as the padded mode it would fall
back to, an upper bound of whichever it picks, so the budget holds either way. By rows, a
mini-batch is arranged so that this cost is low (``arrange``) and cut every ``micro`` rows. To a
budget, the rows are taken in the cheaper of two orders (a group's rows together, or all rows
longest first) and a micro-batch is closed when the next row would take its
cost over the budget: short rows go many to a micro-batch, long rows few, so padding and the count
of forward calls both shrink where lengths are heavy-tailed. A row whose cost alone exceeds the
budget gets a micro-batch of its own.

ZeRO-3 gathers parameters collectively in every forward, so every rank must run as many
micro-batches: ``split_to`` cuts the costliest micro-batches in two until a rank has the most any
rank has (the learner takes that count's maximum over ranks).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RowLengths:
    """Per row of the step's batch: its prompt's and response's token counts and its group; the
    forward mode whose tokens a micro-batch's cost counts (shared, plain or packed)."""

    prompt: list[int]
    response: list[int]
    group: list[int]
    forward: str = "shared"

    def cost(self, rows: list[int]) -> int:
        """Tokens the ``forward`` mode runs for these rows as one micro-batch (its padding too, but packed has none)."""
        if not rows:
            return 0
        if self.forward == "packed":
            prompts = {self.group[r]: self.prompt[r] for r in rows}
            return sum(prompts.values()) + sum(self.response[r] for r in rows)
        top_prompt, top_response = max(self.prompt[r] for r in rows), max(self.response[r] for r in rows)
        if self.forward == "plain":
            return len(rows) * (top_prompt + top_response)
        return len({self.group[r] for r in rows}) * top_prompt + len(rows) * top_response

    def orders(self, rows: list[int]) -> tuple[list[int], list[int]]:
        """The two arrangements: a group's rows together (groups longest first, each longest first:
        a prompt computed once per micro-batch) and all rows longest first (least padding)."""
        top: dict[int, int] = {}
        for r in rows:
            top[self.group[r]] = max(top.get(self.group[r], 0), self.response[r])
        by_group = sorted(rows, key=lambda r: (-top[self.group[r]], self.group[r], -self.response[r]))
        by_length = sorted(rows, key=lambda r: (-self.response[r], self.group[r]))
        return by_group, by_length


def by_rows(order: list[int], micro: int) -> list[list[int]]:
    """``order`` cut every ``micro`` rows."""
    return [order[i : i + micro] for i in range(0, len(order), micro)]


def arrange(lens: RowLengths, rows: list[int], micro: int) -> list[int]:
    """The rows in the order they are cut by ``micro`` rows: the cheaper of the two orders (by the
    total cost of the micro-batches they give)."""
    if len(rows) <= micro:
        return rows
    return min(lens.orders(rows), key=lambda o: sum(lens.cost(m) for m in by_rows(o, micro)))


def by_tokens(lens: RowLengths, order: list[int], budget: int) -> list[list[int]]:
    """``order`` cut greedily: a micro-batch is closed when the next row would take its cost over ``budget``."""
    out: list[list[int]] = []
    cur: list[int] = []
    for r in order:
        if cur and lens.cost(cur + [r]) > budget:
            out.append(cur)
            cur = []
        cur.append(r)
    if cur:
        out.append(cur)
    return out


def to_budget(lens: RowLengths, rows: list[int], budget: int) -> list[list[int]]:
    """The rows cut to ``budget`` tokens per micro-batch, in the order that runs fewer tokens (then
    fewer micro-batches)."""
    if not rows:
        return []
    cuts = [by_tokens(lens, o, budget) for o in lens.orders(rows)]
    return min(cuts, key=lambda c: (sum(lens.cost(m) for m in c), len(c)))


def split_to(lens: RowLengths, micros: list[list[int]], count: int) -> list[list[int]]:
    """``micros`` with the costliest multi-row micro-batch cut in two (where the two halves' larger
    cost is least) until there are ``count``; as many as possible when there are fewer rows."""
    out = [list(m) for m in micros]
    while len(out) < count:
        cands = [i for i, m in enumerate(out) if len(m) > 1]
        if not cands:
            break
        i = max(cands, key=lambda j: lens.cost(out[j]))
        m = out[i]
        at = min(range(1, len(m)), key=lambda k: max(lens.cost(m[:k]), lens.cost(m[k:])))
        out[i : i + 1] = [m[:at], m[at:]]
    return out
