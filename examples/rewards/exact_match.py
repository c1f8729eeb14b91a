"""A reward plug-in (docs/rewards.md): reasonrl train --reward examples/rewards/exact_match.py:exact_match"""
from reasonrl.rewards import extract_answer


def exact_match(response: str, ground_truth: str, **info) -> float:
    """+1 when the final answer is the ground truth up to case and spacing (text answers such as
    "blue" or "(1, 2)", kept by prepare-data --keep-non-integer), else -1."""
    answer = extract_answer(response)
    norm = lambda s: " ".join(s.lower().replace("$", "").split())  # noqa: E731
    return 1.0 if answer is not None and norm(answer) == norm(ground_truth) else -1.0
