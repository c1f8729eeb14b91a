"""The engine registry: ``--engine NAME`` → the class that generates, and which options it reads.

A new engine is one module (a class with ``generate``, ``update_weights``, ``close``; see
``reasonrl.engines.base.GenerationEngine``) and one row here. Modules are imported only when their
engine is built, so vLLM is never imported by a run that uses transformers.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any

from reasonrl.engines.base import EngineOptions, GenerationEngine
from reasonrl.errors import ReasonRLError


@dataclass(frozen=True)
class EngineEntry:
    """One engine: ``target`` ("module:Class"), the ``EngineOptions`` fields it reads mapped to its
    constructor's keyword arguments, and whether it takes ``max_model_len`` and
    ``expected_decode_steps`` (how much the caller will decode: vLLM on CPU compiles for long runs)."""

    target: str
    options: dict[str, str]
    help: str
    takes_max_model_len: bool = True
    takes_decode_steps: bool = False
    install_hint: str = ""


ENGINES: dict[str, EngineEntry] = {
    "hf": EngineEntry("reasonrl.engines.hf:HFEngine", {"dtype": "dtype", "gen_batch_size": "batch_size"},
                      "transformers, in this process", takes_max_model_len=False),
    "vllm": EngineEntry("reasonrl.engines.vllm_engine:VLLMEngine",
                        {"dtype": "dtype", "kv_cache_gib": "kv_cache_gib", "gpu_memory_utilization": "gpu_memory_utilization",
                         "max_num_seqs": "max_num_seqs", "enforce_eager": "enforce_eager", "prefix_caching": "enable_prefix_caching",
                         "engine_tp": "tensor_parallel_size", "engine_sleep": "enable_sleep_mode"},
                        "vLLM, in this process", takes_decode_steps=True, install_hint="run `bash scripts/install.sh` or use --engine hf"),
    "server": EngineEntry("reasonrl.engines.server:ServerEngine",
                          {"max_concurrency": "max_concurrency", "dtype": "dtype", "weight_sync_address": "weight_sync_address"},
                          "running `vllm serve` processes (--engine http://HOST:PORT[,http://HOST2:PORT])", takes_max_model_len=False),
}
"""name → engine. ``auto`` is vllm when it imports, else hf; a URL is the server engine."""


def engine_kind(name: str) -> str:
    """The registry key for an ``--engine`` value ("auto" and URLs resolved)."""
    if name == "auto":
        return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    if name.startswith(("http://", "https://")):
        return "server"
    if name not in ENGINES or name == "server":
        raise ReasonRLError(f"unknown engine '{name}': use {', '.join(k for k in ENGINES if k != 'server')}, auto or a vLLM server URL")
    return name


def make_engine(opts: EngineOptions, model_dir: str, *, seed: int, max_model_len: int = 4096, decode_steps: int | None = None,
                **extra: Any) -> GenerationEngine:
    """Build the engine ``opts.engine`` names for ``model_dir``; ``decode_steps``: about how many
    decode steps the caller will run over the engine's life (None: unknown), for engines that take it.

    Options the engine does not read must keep their defaults (an error names the option and the
    engine otherwise). ``extra`` passes constructor arguments that are not user options (e.g. an
    in-memory ``model`` for the hf engine).
    """
    kind = engine_kind(opts.engine)
    entry = ENGINES[kind]
    defaults = EngineOptions()
    for f in dataclasses.fields(EngineOptions):
        if f.name in ("engine",) or f.name in entry.options:
            continue
        if getattr(opts, f.name) != getattr(defaults, f.name):
            flag = "--" + f.name.replace("_", "-")
            raise ReasonRLError(f"{flag} does not apply to the {kind} engine ({entry.help}): drop it or choose another --engine")
    kwargs = {arg: getattr(opts, name) for name, arg in entry.options.items()}
    if entry.takes_max_model_len:
        kwargs["max_model_len"] = max_model_len
    if entry.takes_decode_steps:
        kwargs["expected_decode_steps"] = decode_steps
    module_name, cls_name = entry.target.split(":")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except ImportError as e:
        raise ReasonRLError(f"--engine {kind} cannot be used here ({e}): {entry.install_hint or 'install its package'}") from None
    if kind == "server":
        return cls(opts.engine, model_dir, **kwargs, **extra)
    return cls(model_dir, seed=seed, **kwargs, **extra)
