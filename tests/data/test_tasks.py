"""The addition-chain task: data/chains.jsonl is what its seeded generator writes, its answers are
right, and the chains templates show worked examples that the DAPO reward scores as correct."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from reasonrl.data import load_prepared
from reasonrl.data.tasks import (
    CHAIN_EXAMPLES,
    CHAIN_LENGTHS,
    HIGH,
    LOW,
    chain_numbers,
    chain_problem,
    chain_source,
    direct_answer,
    make_chains,
    worked_steps,
    write_jsonl,
)
from reasonrl.data.templates import ALL_TEMPLATES, messages_for
from reasonrl.rewards import extract_answer, math_reward
from reasonrl.stages.prepare_data import PrepareConfig, run_prepare

DATA = Path(__file__).resolve().parents[2] / "data" / "chains.jsonl"
STEP = re.compile(r"^Add (\d+): (\d+) \+ (\d+) = (\d+)\.$")


def rows() -> list[dict]:
    return [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()]


def test_the_file_is_what_the_generator_writes(tmp_path) -> None:
    first, second = write_jsonl(make_chains(), tmp_path / "a.jsonl"), write_jsonl(make_chains(), tmp_path / "b.jsonl")
    assert first.read_bytes() == second.read_bytes() == DATA.read_bytes(), "regenerate it: python -m reasonrl.data.tasks"
    assert make_chains(seed=1) != make_chains(), "the seed draws the chains"


def test_the_module_command_writes_the_file(tmp_path, capsys) -> None:
    from reasonrl.data.tasks import main

    main(["--out", str(tmp_path / "c.jsonl")])
    assert (tmp_path / "c.jsonl").read_bytes() == DATA.read_bytes()
    assert f"{sum(CHAIN_LENGTHS.values())} chains" in capsys.readouterr().out


def test_every_answer_is_the_sum_and_every_problem_distinct() -> None:
    data = rows()
    assert Counter(r["length"] for r in data) == Counter(CHAIN_LENGTHS)
    assert len({r["problem"] for r in data}) == len(data)
    examples = {tuple(e) for e in CHAIN_EXAMPLES}
    for r in data:
        numbers = chain_numbers(r["problem"])
        assert list(numbers) == r["numbers"] and len(numbers) == r["length"]
        assert all(LOW <= n <= HIGH for n in numbers)
        assert numbers not in examples, "the templates' examples stay out of the data"
        assert r["answer"] == str(sum(numbers)) and int(r["answer"]) == sum(numbers)
        assert r["data_source"] == chain_source(r["length"])
        assert r["steps"] == worked_steps(numbers)
    assert len({r["length"] for r in data[:20]}) > 1, "lengths are shuffled together"


def test_worked_steps_add_up_and_score_as_correct() -> None:
    for r in rows():
        *steps, last = r["steps"].split("\n")
        start = steps.pop(0)
        assert start == f"Start with {r['numbers'][0]}."
        total = r["numbers"][0]
        for line, n in zip(steps, r["numbers"][1:], strict=True):
            added, before, again, after = map(int, STEP.match(line).groups())
            assert (added, before, again) == (n, total, n) and after == total + n
            total = after
        assert last == f"Answer: {total}" and extract_answer(r["steps"]) == r["answer"]
        assert math_reward(r["steps"], r["answer"]) == 1.0
        assert math_reward(direct_answer(r["numbers"]), r["answer"]) == 1.0


@pytest.mark.parametrize("template,answer", [("chains", worked_steps), ("chains-direct", direct_answer)])
def test_the_templates_show_the_examples_then_the_problem(template, answer) -> None:
    assert template in ALL_TEMPLATES
    problem = chain_problem((8, 1, 5, 7))
    msgs = messages_for(template, problem)
    assert [m["role"] for m in msgs] == ["user", "assistant"] * len(CHAIN_EXAMPLES) + ["user"]
    assert msgs[-1]["content"] == problem
    for (q, a), example in zip(zip(msgs[:-1:2], msgs[1::2]), CHAIN_EXAMPLES, strict=True):
        assert q["content"] == chain_problem(example) and a["content"] == answer(example)
        assert math_reward(a["content"], sum(example)) == 1.0, "the reward reads the examples' own answers as correct"
    assert len({len(e) for e in CHAIN_EXAMPLES}) == len(CHAIN_EXAMPLES), "the examples show chains of different lengths"


def test_prepare_data_keeps_every_chain_and_its_length(tmp_path) -> None:
    out = tmp_path / "data"
    report = run_prepare(PrepareConfig(inputs=[str(DATA)], out=str(out), template="chains", val_size=40, quiet=True))
    train, val = load_prepared(out, "train"), load_prepared(out, "validation")
    assert (len(train), len(val)) == (sum(CHAIN_LENGTHS.values()) - 40, 40), report
    assert {r["data_source"] for r in train + val} == {chain_source(k) for k in CHAIN_LENGTHS}
    assert not {r["extra_info"]["raw_problem"] for r in train} & {r["extra_info"]["raw_problem"] for r in val}
    for r in val:
        assert r["prompt"] == messages_for("chains", r["extra_info"]["raw_problem"])
        assert r["reward_model"]["ground_truth"] == str(sum(chain_numbers(r["extra_info"]["raw_problem"])))


def test_a_chain_set_too_large_for_its_numbers_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot draw 82 distinct chains of 2 numbers"):
        make_chains({2: 82})
    assert len(make_chains({2: 81}, exclude=())) == 81
