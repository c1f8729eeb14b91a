"""Options shared by the stages that generate (rollout, pretrain-value, train, eval), and the
engine + tokenizer + scorer they open together."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.config import check, opt
from reasonrl.engines.base import EngineOptions


@dataclass
class ModelOpts(EngineOptions):
    model: str = opt("default", "Policy: an HF model directory, a finished train run, or 'default' for the embedded SmolLM2-135M-Instruct.")
    seed: int = opt(0, "Random seed (data order, sampling, initialisation).")
    allow_pickle: bool = opt(False, "Load model directories whose weights are pickle files (.bin/.pt), which can run code when loaded; default: safetensors only.")

    def _check_model(self) -> None:
        self._check_engine()

    def policy_dir(self) -> Path:
        """The policy's HF directory (``model`` resolved), its weights checked (safetensors unless --allow-pickle)."""
        from reasonrl.models.loading import check_weights, resolve_policy

        return check_weights(resolve_policy(self.model), self.allow_pickle)


@dataclass
class SamplingOpts:
    group_size: int = opt(8, "Responses sampled per prompt (G).")
    temperature: float = opt(1.0, "Sampling temperature (0 = greedy).")
    top_p: float = opt(1.0, "Nucleus sampling mass (1.0 = off).")
    top_k: int = opt(-1, "Top-k sampling (-1 = off).")
    max_prompt_len: int = opt(512, "Prompts longer than this many tokens are skipped and counted.")
    max_response_len: int = opt(256, "Generation cap L_max in tokens (DAPO: 20480).")

    def _check_sampling(self) -> None:
        check(self.group_size >= 1, "group_size must be >= 1")
        check(0 <= self.temperature < math.inf, "temperature must be finite and >= 0")
        check(self.top_k == -1 or self.top_k >= 1, f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        check(0 < self.top_p <= 1, "top_p must be in (0, 1]")
        check(self.max_response_len >= 1, "max_response_len must be >= 1")
        check(self.max_prompt_len >= 1, "max_prompt_len must be >= 1")


@dataclass
class Generation:
    """An engine, its tokenizer and a reward scorer, opened together and closed together."""

    engine: Any
    tokenizer: Any
    scorer: Any
    model_dir: Path

    def close(self) -> None:
        self.scorer.close()
        self.engine.close()


def open_generation(cfg: Any, model_dir: Path | None = None) -> Generation:
    from reasonrl.engines.registry import make_engine
    from reasonrl.models.loading import load_tokenizer
    from reasonrl.rewards import RewardScorer

    md = model_dir or cfg.policy_dir()
    tok = load_tokenizer(md)
    engine = make_engine(cfg, str(md), seed=cfg.seed, max_model_len=cfg.max_prompt_len + cfg.max_response_len)
    return Generation(engine, tok, RewardScorer(), md)
