"""The generation interface every engine implements.

Prompt token ids and sampling parameters in; per prompt, ``n`` completions out, each with its token
ids, the per-token log-probabilities of the sampled tokens under the sampling model, and a finish
reason ("stop": EOS or a stop token; "length": hit ``max_tokens``). Engines never see text or rewards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``top_k=-1`` and ``top_p=1.0`` disable those filters."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError("n must be >= 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@dataclass
class GenerationStats:
    prompts: int = 0
    completions: int = 0
    tokens: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class GenerationEngine(Protocol):
    name: str
    last_stats: GenerationStats

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        """``len(prompts)`` lists of ``params.n`` completions each."""
        ...

    def update_weights(self, state_dict: dict[str, Any]) -> None:
        """Load new policy weights in memory (same names as the HF causal LM's state dict)."""
        ...

    def close(self) -> None: ...


def make_engine(kind: str, model_dir: str, *, dtype: str = "auto", seed: int = 0, max_model_len: int = 4096, **kw: Any) -> GenerationEngine:
    """``kind``: "hf", "vllm", or "auto" (vLLM when importable, else transformers)."""
    from reasonrl.errors import ReasonRLError

    if kind == "auto":
        import importlib.util

        kind = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    if kind == "hf":
        from reasonrl.engines.hf import HFEngine

        return HFEngine(model_dir, dtype=dtype, seed=seed, **kw)
    if kind == "vllm":
        try:
            from reasonrl.engines.vllm_engine import VLLMEngine
        except ImportError as e:
            raise ReasonRLError(f"--engine vllm needs vLLM ({e}): run `bash scripts/install.sh` or use --engine hf") from None
        return VLLMEngine(model_dir, dtype=dtype, seed=seed, max_model_len=max_model_len, **kw)
    if kind.startswith("http://") or kind.startswith("https://"):
        from reasonrl.engines.server import ServerEngine

        return ServerEngine(kind, model_dir, **kw)
    raise ReasonRLError(f"unknown engine '{kind}': use hf, vllm, auto or a vLLM server URL")
