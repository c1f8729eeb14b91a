"""Prompt templates applied by prepare-data (the DAPO one is SPEC.md's, byte for byte)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from reasonrl.data.tasks import chain_problem, direct_answer, examples_for, worked_steps

DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
#: DAPO's prompt template (SPEC.md, "Rewards"); ``{problem}`` is the raw problem.
DAPO_TEMPLATE = DAPO_PREFIX + "{problem}" + DAPO_SUFFIX
#: The Qwen2.5-Math style template: reason step by step, final answer in \boxed{}.
BOXED_TEMPLATE = "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."

#: An instruction alone, for data/chains.jsonl (``chains-instruct``): what to do and the answer's
#: line, nothing about how, so the response's form is the policy's choice.
CHAINS_INSTRUCT_TEMPLATE = "{problem}\n\nAdd the numbers. End with a line of the form 'Answer: N', where N is the sum."

TEMPLATES = {"dapo": DAPO_TEMPLATE, "boxed": BOXED_TEMPLATE, "none": "{problem}", "chains-instruct": CHAINS_INSTRUCT_TEMPLATE}


def apply_template(name: str, problem: str) -> str:
    """The user message for ``problem`` under template ``name`` ("dapo", "boxed", "none" or "chains-instruct")."""
    return TEMPLATES[name].format(problem=problem)


def strip_template(text: str) -> str | None:
    """The raw problem inside a prompt built with a known template, or None when none matches."""
    if text.startswith(DAPO_PREFIX) and text.endswith(DAPO_SUFFIX):
        return text[len(DAPO_PREFIX) : len(text) - len(DAPO_SUFFIX)]
    boxed_suffix = BOXED_TEMPLATE.format(problem="")
    if text.endswith(boxed_suffix):
        return text[: len(text) - len(boxed_suffix)]
    return None


#: Worked examples shown before the problem by the few-shot templates (as earlier chat turns), so
#: a small instruct model sees the "Answer: N" format it is rewarded for. Kept arithmetic-free of
#: the evaluation sets on purpose.
FEWSHOT_EXAMPLES: tuple[tuple[str, str], ...] = (
    ("What is 2 + 2?", "2 + 2 = 4.\nAnswer: 4"),
    ("What is 10 + 5?", "10 + 5 = 15.\nAnswer: 15"),
)
Examples = tuple[tuple[str, str], ...]  # (problem, answer) pairs


def chain_steps_examples(problem: str) -> Examples:
    """The ``chains`` template's examples for ``problem`` (data/chains.jsonl, reasonrl.data.tasks):
    two chains with as many numbers as the problem, worked one addition a numbered line."""
    return tuple((chain_problem(c), worked_steps(c)) for c in examples_for(problem))


def chain_direct_examples(problem: str) -> Examples:
    """The ``chains-direct`` template's examples: the same chains, answered at once (for comparison)."""
    return tuple((chain_problem(c), direct_answer(c)) for c in examples_for(problem))


def chain_choice_examples(problem: str) -> Examples:
    """The ``chains-choice`` template's examples: the same two chains, the first worked one addition
    a numbered line, the second (the one next to the problem) answered at once. Both forms are
    shown and neither is asked for, so the response's form is the policy's choice: the 135M model
    mostly copies the nearer, short one, and sometimes writes the steps."""
    first, second = examples_for(problem)
    return ((chain_problem(first), worked_steps(first)), (chain_problem(second), direct_answer(second)))


def chain_choice_worked_last_examples(problem: str) -> Examples:
    """The ``chains-choice-worked-last`` template's examples: as ``chains-choice``, the order swapped
    (the direct answer first, the worked one next to the problem)."""
    first, second = examples_for(problem)
    return ((chain_problem(first), direct_answer(first)), (chain_problem(second), worked_steps(second)))


@dataclass(frozen=True)
class FewShot:
    """A few-shot template: ``examples(problem)`` (problem, answer) pairs as earlier chat turns,
    every user turn (the problem's too) in the single-turn template ``inner``."""

    inner: str
    examples: Callable[[str], Examples]


#: few-shot template name → its single-turn template and examples
FEWSHOT_TEMPLATES: dict[str, FewShot] = {
    "fewshot": FewShot("none", lambda problem: FEWSHOT_EXAMPLES),
    "dapo-fewshot": FewShot("dapo", lambda problem: FEWSHOT_EXAMPLES),
    "chains": FewShot("none", chain_steps_examples),
    "chains-direct": FewShot("none", chain_direct_examples),
    "chains-choice": FewShot("none", chain_choice_examples),
    "chains-choice-worked-last": FewShot("none", chain_choice_worked_last_examples),
}


def messages_for(name: str, problem: str) -> list[dict[str, str]]:
    """The chat messages (verl's ``prompt`` column) for ``problem`` under template ``name``."""
    if name in FEWSHOT_TEMPLATES:
        shot = FEWSHOT_TEMPLATES[name]
        msgs: list[dict[str, str]] = []
        for q, a in shot.examples(problem):
            msgs += [{"role": "user", "content": apply_template(shot.inner, q)}, {"role": "assistant", "content": a}]
        return msgs + [{"role": "user", "content": apply_template(shot.inner, problem)}]
    return [{"role": "user", "content": apply_template(name, problem)}]


ALL_TEMPLATES = (*TEMPLATES, *FEWSHOT_TEMPLATES)
