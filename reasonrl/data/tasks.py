"""Generated tasks bundled in ``data/``: addition chains (``data/chains.jsonl``).

A chain is "What is 7 + 6 + 8 + 1?": 3 to 6 numbers from 1–9, an integer answer. It is the CPU task
on which reasoning length matters for the embedded SmolLM2-135M-Instruct: written out one addition
a numbered line (:func:`worked_steps`, the ``chains`` template's examples) its answers are right
several times as often as when it answers at once (:func:`direct_answer`, the ``chains-direct``
template), and longer chains need longer answers. The templates show two worked chains with as many
numbers as the problem (:func:`examples_for`): with examples of other lengths, the 135M model
keeps the examples' number of steps, not the problem's. Under ``chains-choice`` (one worked
example, then one answered at once) the response's form, so its length, is the policy's choice:
mostly short and wrong, sometimes worked and more often right (issue 39's start for RL). The
measurements are in ``data/README.md`` (``bench/cot_task.py``).

The file is deterministic: ``python data/make_chains.py`` rewrites ``data/chains.jsonl`` byte for
byte from the seed (``tests/data/test_tasks.py`` checks it).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any, Sequence

__all__ = [
    "CHAIN_EXAMPLES",
    "CHAIN_LENGTHS",
    "chain_numbers",
    "chain_problem",
    "chain_source",
    "direct_answer",
    "examples_for",
    "make_chains",
    "worked_steps",
    "write_jsonl",
]

#: Numbers per chain (2 to 5 additions) in data/chains.jsonl, and how many chains of each length.
CHAIN_LENGTHS: dict[int, int] = {3: 200, 4: 200, 5: 200, 6: 200}
#: The smallest and largest number of a chain.
LOW, HIGH = 1, 9
SEED = 0
#: The worked examples the few-shot templates show for a problem of k numbers: two chains of k
#: numbers (drawn once by ``random.Random(1000 + k)``; kept out of the data file).
CHAIN_EXAMPLES: dict[int, tuple[tuple[int, ...], ...]] = {
    2: ((9, 7), (4, 3)),
    3: ((8, 9, 6), (4, 8, 8)),
    4: ((7, 2, 9, 9), (4, 4, 6, 1)),
    5: ((8, 7, 9, 7, 5), (6, 9, 3, 8, 2)),
    6: ((6, 1, 4, 8, 1, 4), (6, 1, 4, 9, 5, 3)),
    7: ((1, 3, 5, 3, 4, 9, 1), (4, 9, 1, 8, 5, 1, 1)),
    8: ((9, 8, 6, 2, 2, 1, 3, 2), (6, 1, 9, 6, 5, 4, 8, 3)),
}
#: The examples' length for a problem that is not a chain.
DEFAULT_EXAMPLE_LENGTH = 4

_PROBLEM = re.compile(r"^What is (\d+(?: \+ \d+)+)\?$")


def chain_problem(numbers: Sequence[int]) -> str:
    """The problem text: ``What is 7 + 6 + 8 + 1?``."""
    return "What is " + " + ".join(str(n) for n in numbers) + "?"


def chain_numbers(problem: str) -> tuple[int, ...]:
    """The numbers of a chain problem (the inverse of :func:`chain_problem`); ValueError otherwise."""
    m = _PROBLEM.match(problem)
    if not m:
        raise ValueError(f"not a chain problem: {problem!r}")
    return tuple(int(n) for n in m.group(1).split(" + "))


def examples_for(problem: str) -> tuple[tuple[int, ...], ...]:
    """The worked-example chains shown before ``problem``: two chains with as many numbers as it
    has (2 to 8; clamped beyond), or of :data:`DEFAULT_EXAMPLE_LENGTH` numbers when it is not a chain."""
    try:
        k = len(chain_numbers(problem))
    except ValueError:
        k = DEFAULT_EXAMPLE_LENGTH
    return CHAIN_EXAMPLES[min(max(k, min(CHAIN_EXAMPLES)), max(CHAIN_EXAMPLES))]


def worked_steps(numbers: Sequence[int]) -> str:
    """The worked answer, one addition a numbered line, each naming the number it adds, then the
    ``Answer:`` line the DAPO reward reads::

        1. Start with 7.
        2. Add 6: 7 + 6 = 13.
        3. Add 8: 13 + 8 = 21.
        4. Add 1: 21 + 1 = 22.
        Answer: 22
    """
    total = numbers[0]
    lines = [f"1. Start with {total}."]
    for i, n in enumerate(numbers[1:], start=2):
        lines.append(f"{i}. Add {n}: {total} + {n} = {total + n}.")
        total += n
    return "\n".join(lines) + f"\nAnswer: {total}"


def direct_answer(numbers: Sequence[int]) -> str:
    """The answer alone: ``Answer: 22``."""
    return f"Answer: {sum(numbers)}"


def chain_source(length: int) -> str:
    """The ``data_source`` of chains with ``length`` numbers (``chains-4``): prepare-data keeps it,
    so evaluation and validation report each length apart."""
    return f"chains-{length}"


def make_chains(lengths: dict[int, int] | None = None, *, seed: int = SEED, low: int = LOW, high: int = HIGH,
                exclude: Sequence[Sequence[int]] | None = None) -> list[dict[str, Any]]:
    """``lengths[k]`` distinct chains of ``k`` numbers each, drawn uniformly from ``low..high`` by a
    ``random.Random(seed)`` (stable across Python versions), none equal to an ``exclude`` chain
    (default: the templates' examples, :data:`CHAIN_EXAMPLES`), then shuffled together. Each row: ``problem``, ``answer`` (a string, as the other bundled
    files), ``numbers``, ``length``, ``steps`` (:func:`worked_steps`) and ``data_source``."""
    lengths = dict(CHAIN_LENGTHS if lengths is None else lengths)
    rng = random.Random(seed)
    if exclude is None:
        exclude = [c for chains in CHAIN_EXAMPLES.values() for c in chains]
    seen = {tuple(e) for e in exclude}
    rows: list[dict[str, Any]] = []
    for k in sorted(lengths):
        possible = (high - low + 1) ** k - sum(len(e) == k for e in seen)
        if k < 2 or lengths[k] > possible:
            raise ValueError(f"cannot draw {lengths[k]} distinct chains of {k} numbers from {low}..{high} (at most {max(possible, 0)}; k >= 2)")
        drawn = 0
        while drawn < lengths[k]:
            numbers = tuple(rng.randint(low, high) for _ in range(k))
            if numbers in seen:
                continue
            seen.add(numbers)
            drawn += 1
            rows.append({"problem": chain_problem(numbers), "answer": str(sum(numbers)), "numbers": list(numbers), "length": k,
                         "steps": worked_steps(numbers), "data_source": chain_source(k)})
    rng.shuffle(rows)
    return rows


def write_jsonl(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """One JSON object a line, keys in the rows' order, ``\\n`` endings: the same rows give the same bytes."""
    p = Path(path)
    with open(p, "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=True) + "\n")
    return p
