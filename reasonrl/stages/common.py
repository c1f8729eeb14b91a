"""Options shared by the stages that generate (rollout, pretrain-value, train, eval)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.config import check, opt


@dataclass
class ModelOpts:
    model: str = opt("default", "Policy: an HF model directory, or 'default' for the embedded SmolLM2-135M-Instruct.")
    engine: str = opt("auto", "Generation engine: 'vllm', 'hf' (transformers), 'auto' (vLLM when installed), or a vLLM server URL.")
    dtype: str = opt("auto", "Compute dtype: 'auto' (bf16 where the hardware has it), 'bf16' or 'fp32'.")
    seed: int = opt(0, "Random seed (data order, sampling, initialisation).")
    gen_batch_size: int = opt(64, "Rows decoded together by the transformers engine (memory vs speed).")

    def _check_model(self) -> None:
        check(self.dtype in ("auto", "bf16", "fp32"), f"dtype must be auto, bf16 or fp32, got '{self.dtype}'")
        check(self.gen_batch_size >= 1, "gen_batch_size must be >= 1")


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
        check(self.temperature >= 0, "temperature must be >= 0")
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
    from reasonrl.engines.base import make_engine
    from reasonrl.models.loading import load_tokenizer
    from reasonrl.rewards import RewardScorer
    from reasonrl.train.run import resolve_policy

    md = model_dir or resolve_policy(cfg.model)
    tok = load_tokenizer(md)
    engine = make_engine(cfg.engine, str(md), dtype=cfg.dtype, seed=cfg.seed, batch_size=cfg.gen_batch_size,
                         max_model_len=getattr(cfg, "max_prompt_len", 1024) + cfg.max_response_len)
    return Generation(engine, tok, RewardScorer(), md)
