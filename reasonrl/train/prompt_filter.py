"""The offline prompt filter of `train --filter-rollouts`: keep the prompts a rollout artifact says are worth
training on (Skywork-OR1, arXiv 2505.22312, and POLARIS drop what the initial policy always or
never solves before training; dynamic sampling then does the same online, each step).

A prompt's pass rate p is its correct responses over its responses in the artifact (every group of
that prompt). It is kept when ``min_rate < p < max_rate``; with the defaults 0 and 1, the prompts
never solved (p = 0) and always solved (p = 1) are dropped. Prompts the artifact does not cover
follow ``unrated`` ('keep' or 'drop'). Prompts are matched by their chat-formatted text, the text the
policy sees.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence


@dataclass
class FilterCounts:
    """What the filter did, for the console, summary.json and the manifest."""

    prompts: int = 0  # training prompts before the filter
    kept: int = 0
    dropped_solved: int = 0  # p >= max_rate (solved when max_rate is 1; the key's name kept for summary.json)
    dropped_unsolved: int = 0  # p <= min_rate (unsolved when min_rate is 0)
    unrated: int = 0  # not in the artifact (kept or dropped as ``unrated`` says)
    unrated_policy: str = "keep"
    min_rate: float = 0.0
    max_rate: float = 1.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def dropped(self) -> str:
        """The prompts the bounds dropped, counted by the bound that dropped them ("unsolved" and
        "solved" only where the bound is 0 or 1: a prompt at 0.5 under --min-pass-rate 0.5 is neither)."""
        def named(n: int, bound: str, rate: float, word: str) -> str:
            return f"{n} at pass rate {bound} {rate:g}" + (f" ({word})" if rate == (0 if word == "never solved" else 1) else "")

        return f"{named(self.dropped_unsolved, '<=', self.min_rate, 'never solved')}, {named(self.dropped_solved, '>=', self.max_rate, 'always solved')}"

    def line(self) -> str:
        """One console line."""
        return (f"kept {self.kept} of {self.prompts} prompts with {self.min_rate:g} < pass rate < {self.max_rate:g}: dropped {self.dropped()}; "
                f"{self.unrated} not in the rollouts ({'kept' if self.unrated_policy == 'keep' else 'dropped'})")


def filter_prompts(rows: Sequence[dict[str, Any]], key: Callable[[dict[str, Any]], str], rates: dict[str, tuple[int, int]], *,
                   min_rate: float, max_rate: float, unrated: str) -> tuple[list[dict[str, Any]], FilterCounts]:
    """``rows`` whose pass rate ``rates[key(row)]`` = (correct, samples) lies strictly between the
    bounds (``unrated`` for the rows without one), in their order, and the counts."""
    kept: list[dict[str, Any]] = []
    c = FilterCounts(prompts=len(rows), unrated_policy=unrated, min_rate=min_rate, max_rate=max_rate)
    for row in rows:
        rate = rates.get(key(row))
        if rate is None or rate[1] == 0:
            c.unrated += 1
            if unrated == "keep":
                kept.append(row)
            continue
        p = rate[0] / rate[1]
        if p >= max_rate:
            c.dropped_solved += 1
        elif p <= min_rate:
            c.dropped_unsolved += 1
        else:
            kept.append(row)
    c.kept = len(kept)
    return kept, c
