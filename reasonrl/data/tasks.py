"""Generated tasks bundled in ``data/``: addition chains (``data/chains.jsonl``).

A chain is "What is 7 + 6 + 8 + 1?": 3 to 7 numbers from 1–9, an integer answer. It is the CPU task
on which reasoning length matters for the embedded SmolLM2-135M-Instruct: written out one addition
per line (:func:`worked_steps`, the ``chains`` template's examples) its answers are right far more
often than when it answers at once (:func:`direct_answer`, the ``chains-direct`` template), and
longer chains need longer answers. The measurements are in ``data/README.md``
(``bench/cot_task.py``).

The file is deterministic: ``python -m reasonrl.data.tasks`` rewrites ``data/chains.jsonl`` byte
for byte from the seed (``tests/data/test_tasks.py`` checks it).
"""

from __future__ import annotations

import argparse
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
    "make_chains",
    "worked_steps",
    "write_jsonl",
]

#: Numbers per chain (2 to 6 additions) in data/chains.jsonl, and how many chains of each length.
CHAIN_LENGTHS: dict[int, int] = {3: 150, 4: 150, 5: 150, 6: 150, 7: 150}
#: The smallest and largest number of a chain.
LOW, HIGH = 1, 9
SEED = 0
#: The chains the few-shot templates show as worked examples (kept out of the data file).
CHAIN_EXAMPLES: tuple[tuple[int, ...], ...] = ((2, 3, 4), (5, 1, 3, 6), (4, 2, 7, 1, 3))

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


def worked_steps(numbers: Sequence[int]) -> str:
    """The worked answer, one addition per line, each naming the number it adds, then the
    ``Answer:`` line the DAPO reward reads::

        Start with 7.
        Add 6: 7 + 6 = 13.
        Add 8: 13 + 8 = 21.
        Add 1: 21 + 1 = 22.
        Answer: 22
    """
    total = numbers[0]
    lines = [f"Start with {total}."]
    for n in numbers[1:]:
        lines.append(f"Add {n}: {total} + {n} = {total + n}.")
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
                exclude: Sequence[Sequence[int]] = CHAIN_EXAMPLES) -> list[dict[str, Any]]:
    """``lengths[k]`` distinct chains of ``k`` numbers each, drawn uniformly from ``low..high`` by a
    ``random.Random(seed)`` (stable across Python versions), none equal to an ``exclude`` chain,
    then shuffled together. Each row: ``problem``, ``answer`` (a string, as the other bundled
    files), ``numbers``, ``length``, ``steps`` (:func:`worked_steps`) and ``data_source``."""
    lengths = dict(CHAIN_LENGTHS if lengths is None else lengths)
    rng = random.Random(seed)
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


def main(argv: list[str] | None = None) -> None:
    """``python -m reasonrl.data.tasks [--out data/chains.jsonl]``: write the chains file."""
    ap = argparse.ArgumentParser(description="Write the bundled addition-chain task (data/chains.jsonl) from its seed.")
    ap.add_argument("--out", default="data/chains.jsonl", help="where to write (default: data/chains.jsonl, from the repository root)")
    a = ap.parse_args(argv)
    rows = make_chains()
    write_jsonl(rows, a.out)
    print(f"{len(rows)} chains -> {a.out}")


if __name__ == "__main__":
    main()
