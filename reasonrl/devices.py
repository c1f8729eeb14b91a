"""Devices and dtypes: the one place that decides what "auto" means and names each dtype.

Every component (trainer, transformers engine, vLLM engine) takes a dtype name from the CLI
(``auto``, ``bf16``, ``fp16``, ``fp32``) and asks this module for what it needs: the resolved
name (:func:`resolve_dtype`), the torch dtype (:func:`torch_dtype`) or vLLM's spelling
(:func:`vllm_dtype`).
"""

from __future__ import annotations

import contextlib
import platform
from typing import Any

#: Accepted spellings → canonical name.
DTYPE_NAMES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "fp32": "fp32", "float32": "fp32"}
_TORCH = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def reproducible_blas() -> None:
    """Ask Intel MKL (torch's CPU BLAS on x86) for results that do not depend on where each buffer
    lies in memory (``MKL_CBWR=AUTO,STRICT``; a user's own ``MKL_CBWR`` is kept). Without it, on
    an AVX-512 AMD EPYC, the same fp32 critic forward on the same weights and tokens differed in its
    last bit between an uninterrupted run and one resumed from a checkpoint, so a resumed run was
    not the same run. MKL reads the variable at its first call, so this runs before any matmul; the
    processes a stage starts (engine processes, scorer workers) inherit it through the environment,
    and each torchrun rank, a CLI process, sets it itself.
    Side by side, GEMMs of SmolLM2-135M's shapes ran as fast with it as without (±3%)."""
    import os

    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")


def hardware_bf16() -> bool:
    """Whether this machine computes in bf16 natively: CUDA with bf16 support; on x86 CPUs,
    AVX512-BF16 or AMX (without them bf16 GEMMs are emulated: 1.3 GFLOP/s against 115 for fp32 on
    the project's earlier CPU machine; with AVX512-BF16, this one's, ~420 against ~190,
    ``bench/README.md``); on other CPUs, oneDNN's bf16 support."""
    import torch

    if torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    if platform.machine().lower() in ("x86_64", "amd64"):
        return any(bool(getattr(torch.cpu, f, lambda: False)()) for f in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # noqa: BLE001
        return False


def machine(dtype: str | None = None) -> dict[str, Any]:
    """What computed a stage's outputs, for its manifest: the CPU's model name and its bf16 / AMX /
    AVX-512 flags (they decide ``--dtype auto`` and the kernels, and fp32 rounds differently from
    one CPU to the next), the CPUs this process may use, the GPU when torch sees one, and ``dtype``
    resolved ("auto" → what it meant here; omitted for a stage without one)."""
    import os
    import sys
    from pathlib import Path

    cpu, flags = None, []
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and cpu is None:
                cpu = value.strip()
            elif key.strip() == "flags":
                flags = sorted(f for f in value.split() if f.startswith(("avx512", "amx")))
                break
    except OSError:
        pass
    out: dict[str, Any] = {"cpu": cpu or platform.processor(), "cpu_flags": flags, "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()}
    torch = sys.modules.get("torch")  # a stage that never loaded torch has no GPU to name
    if torch is not None and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    if dtype is not None:
        out["dtype"] = resolve_dtype(dtype)
    return out


def resolve_dtype(name: str) -> str:
    """A dtype name → "bf16", "fp16" or "fp32"; "auto" is "bf16" where the hardware computes in
    bf16 (:func:`hardware_bf16`), else "fp32". Unknown names: ValueError naming the valid ones."""
    if name == "auto":
        return "bf16" if hardware_bf16() else "fp32"
    try:
        return DTYPE_NAMES[name]
    except KeyError:
        raise ValueError(f"unknown dtype '{name}': use auto, bf16, fp16 or fp32") from None


def torch_dtype(name: str) -> Any:
    """The torch dtype of a dtype name ("auto" resolved)."""
    import torch

    return getattr(torch, _TORCH[resolve_dtype(name)])


def vllm_dtype(name: str) -> str:
    """vLLM's spelling of a dtype name ("auto" resolved): "bfloat16", "float16" or "float32"."""
    return _TORCH[resolve_dtype(name)]


def autocast_ctx(dtype: str) -> Any:
    """Autocast on the current device when ``dtype`` resolves to bf16 or fp16 (the weights stay in
    fp32, the matrix products run in the half type), else a no-op. fp16 training also needs loss
    scaling (:func:`grad_scaler`)."""
    import torch

    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(resolve_dtype(dtype))
    if half is not None:
        return torch.autocast("cuda" if torch.cuda.is_available() else "cpu", dtype=half)
    return contextlib.nullcontext()


def grad_scaler(dtype: str) -> Any:
    """A dynamic loss scaler (``torch.amp.GradScaler`` on the current device) when ``dtype``
    resolves to fp16, else None. fp16's 5 exponent bits underflow small gradients to zero: the loss
    is multiplied by the scale before backward (2^16 at the start), the gradients divided by it
    before clipping; a step whose gradients overflow (inf/NaN) is skipped and the scale halved, and
    after 2000 clean steps it doubles (torch's defaults, as DeepSpeed's dynamic scaler)."""
    import torch

    if resolve_dtype(dtype) != "fp16":
        return None
    return torch.amp.GradScaler("cuda" if torch.cuda.is_available() else "cpu")


def default_device() -> str:
    """This process's device: its current CUDA device when there is one, else "cpu"."""
    import torch

    return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
