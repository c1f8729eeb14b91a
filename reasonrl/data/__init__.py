"""Data: readers, the integer-answer transformation (DAPO section 3.5), templates, decontamination,
and reading prepared data (the stage itself is ``reasonrl.stages.prepare_data``).

Public API::

    integerize(problem, answer, *, rewriter=None) -> IntegerProblem | Refusal
    to_integer_answer(problem, answer, *, rewriter=None) -> IntegerProblem | None
    load_prepared(path, split="train") -> list[dict]
    apply_template(name, problem), DAPO_TEMPLATE
"""

from reasonrl.data.transform import REASONS, RULES, IntegerProblem, Refusal, Rewriter, integerize, to_integer_answer
from reasonrl.data.prepared import load_prepared
from reasonrl.data.templates import DAPO_TEMPLATE, apply_template, strip_template

__all__ = [
    "DAPO_TEMPLATE",
    "REASONS",
    "RULES",
    "IntegerProblem",
    "Refusal",
    "Rewriter",
    "apply_template",
    "integerize",
    "load_prepared",
    "strip_template",
    "to_integer_answer",
]
