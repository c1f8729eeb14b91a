"""Data: integer-answer transformation (DAPO section 3.5) and the prepare-data stage.

Public API::

    integerize(problem, answer, *, rewriter=None) -> IntegerProblem | Refusal
    to_integer_answer(problem, answer, *, rewriter=None) -> IntegerProblem | None
    PrepareConfig, run_prepare(cfg, *, rewriter=None) -> dict, print_report(report, console=None)
    load_prepared(path, split="train") -> list[dict]
    apply_template(name, problem), DAPO_TEMPLATE
"""

from reasonrl.data.transform import REASONS, RULES, IntegerProblem, Refusal, Rewriter, integerize, to_integer_answer
from reasonrl.data.prepare import BUNDLED, PrepareConfig, load_prepared, print_report, run_prepare
from reasonrl.data.templates import DAPO_TEMPLATE, apply_template, strip_template

__all__ = [
    "BUNDLED",
    "DAPO_TEMPLATE",
    "REASONS",
    "RULES",
    "IntegerProblem",
    "PrepareConfig",
    "Refusal",
    "Rewriter",
    "apply_template",
    "integerize",
    "load_prepared",
    "print_report",
    "run_prepare",
    "strip_template",
    "to_integer_answer",
]
