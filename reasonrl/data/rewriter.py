"""`prepare-data --rewriter MODEL`: a model phrases the sentence a rewrite appends.

The integer answer, the form and its conditions are always decided by the rules in
``reasonrl.data.transform``; the model only rewords the sentence. A phrasing is accepted only if it
keeps every number and every ``$…$`` formula of the rule's sentence (so the question asked cannot
change); otherwise the deterministic sentence stays. Counts of accepted and rejected phrasings are
reported.
"""

from __future__ import annotations

import re
from typing import Any

_MATH = re.compile(r"\$[^$]+\$")
_NUM = re.compile(r"\d+")
PROMPT = (
    "Rewrite the following instruction for a math problem in different words. Keep every formula between "
    "dollar signs exactly as it is and keep its meaning. Reply with the rewritten instruction only.\n\n"
    "Instruction: {sentence}"
)


def keeps_meaning(original: str, candidate: str) -> bool:
    """True when ``candidate`` keeps every $…$ formula and every number of ``original``."""
    if not candidate.strip() or len(candidate) > 4 * len(original) + 200:
        return False
    if any(m not in candidate for m in _MATH.findall(original)):
        return False
    outside = _MATH.sub(" ", original)
    cand_outside = _MATH.sub(" ", candidate)
    return sorted(_NUM.findall(outside)) == sorted(_NUM.findall(cand_outside))


class ModelRewriter:
    """Callable ``(problem, rule, sentence) -> sentence`` backed by a generation engine (greedy
    decoding of ``tokenizer``'s chat prompt); the caller opens the engine and closes it."""

    def __init__(self, engine: Any, tokenizer: Any, *, seed: int = 0, max_tokens: int = 128) -> None:
        self._engine, self._tok, self.seed, self.max_tokens = engine, tokenizer, seed, max_tokens
        self.stats = {"asked": 0, "accepted": 0, "rejected": 0}

    def __call__(self, problem: str, rule: str, sentence: str) -> str:
        from reasonrl.engines.base import SamplingParams

        self.stats["asked"] += 1
        msgs = [{"role": "user", "content": PROMPT.format(sentence=sentence)}]
        ids = self._tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
        out = self._engine.generate([ids], SamplingParams(n=1, temperature=0.0, max_tokens=self.max_tokens, seed=self.seed))
        text = self._tok.decode(out[0][0].token_ids, skip_special_tokens=True).strip()
        if keeps_meaning(sentence, text):
            self.stats["accepted"] += 1
            return text
        self.stats["rejected"] += 1
        return ""  # blank: the rule's own sentence is kept
