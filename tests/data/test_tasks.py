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
    examples_for,
    make_chains,
    worked_steps,
    write_jsonl,
)
from reasonrl.data.templates import ALL_TEMPLATES, messages_for
from reasonrl.rewards import extract_answer, math_reward
from reasonrl.stages.prepare_data import PrepareConfig, run_prepare

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "chains.jsonl"
STEP = re.compile(r"^(\d+)\. Add (\d+): (\d+) \+ (\d+) = (\d+)\.$")
EXAMPLES = {c for chains in CHAIN_EXAMPLES.values() for c in chains}


def rows() -> list[dict]:
    return [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()]


def test_the_file_is_what_the_generator_writes(tmp_path) -> None:
    first, second = write_jsonl(make_chains(), tmp_path / "a.jsonl"), write_jsonl(make_chains(), tmp_path / "b.jsonl")
    assert first.read_bytes() == second.read_bytes() == DATA.read_bytes(), "regenerate it: python data/make_chains.py"
    assert make_chains(seed=1) != make_chains(), "the seed draws the chains"


def test_the_script_writes_the_file(tmp_path, capsys) -> None:
    import runpy

    main = runpy.run_path(str(ROOT / "data" / "make_chains.py"))["main"]
    main(["--out", str(tmp_path / "c.jsonl")])
    assert (tmp_path / "c.jsonl").read_bytes() == DATA.read_bytes()
    assert f"{sum(CHAIN_LENGTHS.values())} chains" in capsys.readouterr().out


def test_every_answer_is_the_sum_and_every_problem_distinct() -> None:
    data = rows()
    assert Counter(r["length"] for r in data) == Counter(CHAIN_LENGTHS)
    assert len({r["problem"] for r in data}) == len(data)
    for r in data:
        numbers = chain_numbers(r["problem"])
        assert list(numbers) == r["numbers"] and len(numbers) == r["length"]
        assert all(LOW <= n <= HIGH for n in numbers)
        assert numbers not in EXAMPLES, "the templates' examples stay out of the data"
        assert r["answer"] == str(sum(numbers)) and int(r["answer"]) == sum(numbers)
        assert r["data_source"] == chain_source(r["length"])
        assert r["steps"] == worked_steps(numbers)
    assert len({r["length"] for r in data[:20]}) > 1, "lengths are shuffled together"


def test_worked_steps_add_up_and_score_as_correct() -> None:
    for r in rows():
        *steps, last = r["steps"].split("\n")
        start = steps.pop(0)
        assert start == f"1. Start with {r['numbers'][0]}."
        total = r["numbers"][0]
        for i, (line, n) in enumerate(zip(steps, r["numbers"][1:], strict=True), start=2):
            index, added, before, again, after = map(int, STEP.match(line).groups())
            assert (index, added, before, again) == (i, n, total, n) and after == total + n
            total = after
        assert last == f"Answer: {total}" and extract_answer(r["steps"]) == r["answer"]
        assert math_reward(r["steps"], r["answer"]) == 1.0
        assert math_reward(direct_answer(r["numbers"]), r["answer"]) == 1.0


@pytest.mark.parametrize("template,answers", [("chains", (worked_steps, worked_steps)), ("chains-direct", (direct_answer, direct_answer)),
                                              ("chains-choice", (worked_steps, direct_answer)),
                                              ("chains-choice-worked-last", (direct_answer, worked_steps))])
@pytest.mark.parametrize("length", sorted(CHAIN_LENGTHS))
def test_the_templates_show_two_examples_as_long_as_the_problem(template, answers, length) -> None:
    assert template in ALL_TEMPLATES
    problem = chain_problem(range(1, length + 1))
    msgs = messages_for(template, problem)
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user"]
    assert msgs[-1]["content"] == problem
    shown = examples_for(problem)
    assert [len(c) for c in shown] == [length, length] and len(set(shown)) == 2
    for (q, a), example, answer in zip(zip(msgs[:-1:2], msgs[1::2]), shown, answers, strict=True):
        assert q["content"] == chain_problem(example) and a["content"] == answer(example)
        assert math_reward(a["content"], sum(example)) == 1.0, "the reward reads the examples' own answers as correct"
        assert extract_answer(a["content"]) == str(sum(example))


def test_chains_choice_shows_both_forms_and_chains_instruct_none() -> None:
    """chains-choice: the worked example first, the direct one next to the problem; chains-instruct:
    the problem and an instruction that names the rewarded line but no form, no examples."""
    problem = chain_problem([7, 6, 8, 1])
    choice = [m["content"] for m in messages_for("chains-choice", problem)]
    assert choice[1].count("=") == 3 and choice[3] == direct_answer(examples_for(problem)[1]) and "=" not in choice[3]
    (msg,) = messages_for("chains-instruct", problem)
    assert msg["role"] == "user" and msg["content"].startswith(problem + "\n\n")
    instruction = msg["content"][len(problem):]
    assert "Answer: N" in instruction and not any(w in instruction.lower() for w in ("step", "=", "start with"))
    assert "chains-instruct" in ALL_TEMPLATES and "chains-choice" in ALL_TEMPLATES


@pytest.mark.parametrize("template", ["chains-choice", "chains-instruct"])
def test_prepare_data_with_the_free_form_templates(tmp_path, template) -> None:
    out = tmp_path / "data"
    run_prepare(PrepareConfig(inputs=[str(DATA)], out=str(out), template=template, val_size=8, quiet=True))
    for r in load_prepared(out, "validation"):
        assert r["prompt"] == messages_for(template, r["extra_info"]["raw_problem"])
        assert r["prompt"][-1]["content"].startswith(r["extra_info"]["raw_problem"])


def test_examples_for_other_problems() -> None:
    assert examples_for("What is 2 + 2?") == CHAIN_EXAMPLES[2]
    assert examples_for(chain_problem([1] * 20)) == CHAIN_EXAMPLES[max(CHAIN_EXAMPLES)]
    assert examples_for("Natalia sold clips to 48 of her friends.") == CHAIN_EXAMPLES[4]
    assert len(messages_for("chains", "Natalia sold clips to 48 of her friends.")) == 5
    with pytest.raises(ValueError, match="not a chain problem"):
        chain_numbers("What is 2 - 1?")


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


def test_the_bench_rule_histogram_and_pairing() -> None:
    """bench/cot_task.py: the steps rule, the length histogram, and the pairing of two templates'
    samples by problem, by their validation row when older samples lack raw_problem (checked by the
    ground truths: other problems are refused)."""
    import runpy

    bench = runpy.run_path(str(ROOT / "bench" / "cot_task.py"))
    assert bench["writes_steps"]("1. Start with 3.\n2. Add 5: 3 + 5 = 8.\n3. Add 2: 8 + 2 = 10.\nAnswer: 10")
    assert not bench["writes_steps"]("3 + 5 + 2 = 10.\nAnswer: 10") and not bench["writes_steps"]("Answer: 10")
    hist = bench["length_histogram"]([0, 15, 16, 63, 64, 255, 256, 300])
    assert hist == {"0-15": 2, "16-31": 1, "32-63": 1, "64-127": 1, "128-255": 1, "256+": 2}

    def sample(row: int, truth: str, correct: bool, raw: str | None = None) -> dict:
        return {"where": f"validation.parquet row {row}", "ground_truth": truth, "correct": correct, **({"raw_problem": raw} if raw else {})}

    steps = [sample(1, "10", True, "What is 3 + 5 + 2?"), sample(1, "10", True, "What is 3 + 5 + 2?"), sample(2, "7", False, "What is 1 + 6?")]
    direct = [sample(1, "10", False), sample(1, "10", True), sample(2, "7", False)]
    d = bench["paired_diff"](steps, direct, n_boot=50)
    assert d["problems"] == 2 and d["value"] == pytest.approx(0.25)
    with pytest.raises(SystemExit, match="not the same problems"):
        bench["paired_diff"](steps, [sample(1, "11", False), sample(2, "7", False)], n_boot=50)
