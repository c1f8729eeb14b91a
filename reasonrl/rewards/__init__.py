"""Rule-based rewards for math reasoning (DAPO eq. 7 and eq. 13).

- :func:`extract_answer`: a response's final answer (last ``Answer:`` line, else last ``\\boxed{}``).
- :func:`answers_equivalent`: integers compare as integers, anything else through math-verify.
- :func:`score` / :func:`math_reward`: +1 / -1 for one response, in this process, no timeout.
- :class:`RewardScorer`: batches, with math-verify in killable worker processes and a per-item
  timeout; what training should use.
"""

from reasonrl.rewards.extract import extract_answer, find_boxed
from reasonrl.rewards.scorer import RewardPluginError, RewardScorer, ScoreStats, default_num_workers
from reasonrl.rewards.verify import (
    CORRECT_REWARD,
    WRONG_REWARD,
    Score,
    ScoreStatus,
    answers_equivalent,
    integer_equivalent,
    math_reward,
    math_verify_equivalent,
    score,
    unevaluated_arithmetic,
)

__all__ = [
    "CORRECT_REWARD",
    "WRONG_REWARD",
    "RewardPluginError",
    "RewardScorer",
    "Score",
    "ScoreStats",
    "ScoreStatus",
    "answers_equivalent",
    "default_num_workers",
    "extract_answer",
    "find_boxed",
    "integer_equivalent",
    "math_reward",
    "math_verify_equivalent",
    "score",
    "unevaluated_arithmetic",
]
