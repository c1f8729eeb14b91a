"""The generation interface every engine implements, the engine options, and helpers engines share.

Prompt token ids and sampling parameters in; per prompt, ``n`` completions out, each with its token
ids, the per-token log-probabilities of the sampled tokens under the sampling model, and a finish
reason ("stop": EOS or a stop token; "length": hit ``max_tokens``). Engines never see text or rewards.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from reasonrl.config import check, opt
from reasonrl.errors import ReasonRLError


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``top_k=-1`` and ``top_p=1.0`` disable those filters.

    Seeds: ``seeds`` gives each prompt its own seed (sample ``j`` of prompt ``i`` uses
    ``seeds[i] + j``, vLLM's convention), so a prompt's tokens do not depend on which other
    prompts share the call; else ``seed`` derives one per prompt (:func:`prompt_seeds`); with
    neither, the engine draws from its own generator.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    seeds: tuple[int, ...] | None = None

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


ProgressFn = Callable[[int, int], None]
"""``progress(completions, tokens)``: called while ``generate`` runs, each time some completions
finish (how many finished since the last call, and the tokens they hold). Display only: it never
changes what is generated."""


class GenerationEngine(Protocol):
    name: str

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, progress: ProgressFn | None = None) -> list[list[Completion]]:
        """``len(prompts)`` lists of ``params.n`` completions each; ``progress`` (optional) hears
        about completions as they finish.

        With ``--engine-tp N`` inside a torchrun job, this is collective over the N ranks of an engine
        group: each calls it the same number of times (with no prompts, when it has none).
        """
        ...

    def update_weights(self, state_dict: dict[str, Any]) -> None:
        """Load new policy weights in memory (same names as the HF causal LM's state dict).

        Called on every rank of a multi-process trainer, with the full weights on each. A mapping
        whose ``partial`` attribute is true (LoRA's merged linear layers,
        ``reasonrl.models.lora.engine_weights``) holds only the weights that changed."""
        ...

    def close(self) -> None: ...


@dataclass
class EngineOptions:
    """How generation runs: which engine and its settings (fields shared by every generating stage).

    Each engine reads only some of these (``reasonrl.engines.registry.ENGINES`` lists which); a
    non-default value of an option the chosen engine does not read is an error, never ignored.
    """

    engine: str = opt("auto", "Generation engine: 'vllm', 'hf' (transformers), 'auto' (vLLM when installed), or vLLM server URLs (http://HOST:PORT[,http://HOST2:PORT]: prompts spread over them; training pushes the weights to each, see docs/scale.md).")
    dtype: str = opt("auto", "Compute dtype: 'auto' (bf16 where the hardware computes in it, else fp32), 'bf16', 'fp16' or 'fp32'.")
    gen_batch_size: int = opt(64, "hf engine: rows (prompt × sample) decoded together (memory vs speed).")
    kv_cache_gib: float | None = opt(None, "vllm engine on CPU: KV cache size in GiB (default 2, or $VLLM_CPU_KVCACHE_SPACE).")
    gpu_memory_utilization: float | None = opt(None, "vllm engine on GPU: share of GPU memory vLLM may take (default 0.5: the trainer shares the GPU; with --engine-sleep it is freed while the trainer works).")
    max_num_seqs: int | None = opt(None, "vllm engine: most sequences decoded at once (vLLM's default when unset).")
    enforce_eager: bool | None = opt(None, "vllm engine: no CUDA graphs / torch.compile. Default: off on GPU; on CPU, off (compiled) where a stage expects at least 10,000 decode steps in one process (train and pretrain-value: steps × max_response_len; eval and rollout: max_response_len per 256 rows), where compiling's minute at start-up pays back (a decode step's fixed cost a third lower), else on.")
    prefix_caching: bool = opt(True, "vllm engine: share the KV blocks of a prompt among its samples (reset after each weight sync).")
    max_concurrency: int = opt(32, "server engine: requests in flight at once, per server.")
    engine_tp: int = opt(1, "vllm engine: tensor-parallel size N. Under torchrun, consecutive ranks form engine groups of N (one vLLM engine split over their N GPUs through vLLM's external_launcher; N must divide the processes per node); each group generates the union of its ranks' prompts and each rank keeps its own. In one process, vLLM starts N workers itself (GPUs).")
    engine_sleep: bool = opt(False, "vllm engine on GPU: vLLM sleep mode, so that the trainer gets the engine's GPU memory back: after each generation the weights go to CPU memory and the KV cache is dropped (sleep level 1); they come back for the weight sync and the next generation. Not on CPU (vLLM supports it on CUDA/ROCm/XPU only).")
    weight_sync_address: str | None = opt(None, "server engine, training: the address of this (rank-0) host the servers connect to for the NCCL weight transfer (default: this host's address on the route to the first server).")

    def _check_engine(self) -> None:
        from reasonrl.devices import DTYPE_NAMES

        check(self.dtype == "auto" or self.dtype in DTYPE_NAMES, f"dtype must be auto, bf16, fp16 or fp32, got '{self.dtype}'")
        check(self.gen_batch_size >= 1, "gen_batch_size must be >= 1")
        check(self.kv_cache_gib is None or self.kv_cache_gib > 0, "kv_cache_gib must be > 0")
        check(self.gpu_memory_utilization is None or 0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization must be in (0, 1]")
        check(self.max_num_seqs is None or self.max_num_seqs >= 1, "max_num_seqs must be >= 1")
        check(self.max_concurrency >= 1, "max_concurrency must be >= 1")
        check(self.engine_tp >= 1, "engine_tp must be >= 1")


# ------------------------------------------------------------------------------------------------
# Helpers every engine may use


def engine_compiled(engine: Any) -> bool:
    """Whether the engine compiled its model (vLLM's torch.compile; False for engines that never do)."""
    return bool(getattr(engine, "compiled", False))


def engine_label(engine: Any) -> str:
    """The engine's name for the console, "(compiled)" added where it compiled its model."""
    return f"{engine.name} (compiled)" if engine_compiled(engine) else engine.name


def model_config(model_dir: str | Path) -> dict[str, Any]:
    """A model directory's ``config.json`` (a multimodal config's ``text_config`` merged in)."""
    from reasonrl.models.loading import read_json_object

    p = Path(model_dir) / "config.json"
    if not p.is_file():
        raise ReasonRLError(f"{model_dir} is not a model directory (no config.json): pass an HF model directory")
    cfg = read_json_object(p, "restore the model directory's config.json or pass another model directory")
    text = cfg.get("text_config")
    return {**text, **{k: v for k, v in cfg.items() if k != "text_config"}} if isinstance(text, dict) else cfg


def eos_token_ids(model_dir: str | Path, cfg: dict[str, Any] | None = None) -> set[int]:
    """EOS ids as transformers sees them: the tokenizer's plus the generation config's."""
    cfg = model_config(model_dir) if cfg is None else cfg
    ids: set[int] = set()

    def add(x: Any) -> None:
        if isinstance(x, int):
            ids.add(x)
        elif isinstance(x, (list, tuple)):
            ids.update(i for i in x if isinstance(i, int))

    gen = Path(model_dir) / "generation_config.json"
    # transformers builds the generation config from config.json when the file is absent.
    add(json.loads(gen.read_text()).get("eos_token_id") if gen.is_file() else cfg.get("eos_token_id"))
    try:
        from reasonrl.models.loading import load_tokenizer

        add(load_tokenizer(model_dir).eos_token_id)
    except ReasonRLError:
        pass
    return ids


def derived_seed(seed: int, prompt_index: int, n: int) -> int:
    """A distinct seed per prompt; vLLM then uses ``seed + j`` for sample ``j`` (so no overlap)."""
    return (seed * 1_000_003 + prompt_index * n) % (2**62)


def prompt_seeds(params: SamplingParams, n_prompts: int) -> list[int | None]:
    """Each prompt's seed: ``params.seeds`` when given (one per prompt), else derived from
    ``params.seed`` (:func:`derived_seed`), else None (unseeded)."""
    if params.seeds is not None:
        if len(params.seeds) != n_prompts:
            raise ValueError(f"SamplingParams.seeds has {len(params.seeds)} seeds for {n_prompts} prompts")
        return [int(s) for s in params.seeds]
    if params.seed is None:
        return [None] * n_prompts
    return [derived_seed(params.seed, i, params.n) for i in range(n_prompts)]
