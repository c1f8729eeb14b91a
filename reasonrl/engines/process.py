"""Any registered engine in a child process of its own, so that generation overlaps training.

:class:`EngineProcess` starts one child process that builds the engine through
``reasonrl.engines.registry.make_engine`` (from picklable options: ``EngineOptions``, the model
directory, the seed, ``max_model_len``, ``decode_steps``) and serves requests one at a time:

- ``submit(prompts, params)`` returns a :class:`Pending` at once; the child generates while the
  caller goes on (trains). ``result(pending)`` blocks until its completions are back.
- ``update_weights(state_dict, version)`` queues new weights. Requests and weight updates form one
  ordered queue: the child applies an update only between generations, after every request
  submitted before it and before every request submitted after it. So which weights generated a
  batch is known at submit time (``Pending.weights_version``) and never depends on timing.
- ``generate`` (submit + result), ``update_weights``, ``close`` and ``name``: the
  ``GenerationEngine`` protocol, so it stands in for an in-process engine. For the same prompts,
  seeded parameters and weights, its completions are the in-process engine's (the same engine code
  runs in the child, with the same seed; ``tests/engines/test_process.py``).

Why a ``subprocess`` (a fresh interpreter, ``python -c``) with two pipes rather than
``multiprocessing``: a spawned ``multiprocessing`` child re-imports the parent's ``__main__``
(a user's script without an ``if __name__ == "__main__"`` guard would run again in it) and its
``Process`` objects may not start children when daemonic (vLLM may); a plain subprocess shares
nothing with the trainer (no copied torch or CUDA state, no forked threads), and its pipes carry
small pickled messages (``multiprocessing.connection.Connection`` framing) while the weights go
through memory (below). Each side has a reader thread that drains its pipe, so neither ``submit``
nor the child's sending of results ever waits on the other side being busy.

Weights without pickling tensors through a pipe: the parent writes the state dict's tensors into one
anonymous in-memory file (Linux ``memfd_create``; a temporary file elsewhere), 64-byte aligned, and
sends a manifest (name, dtype, shape, offset) over the pipe. The child maps that file (through
``/proc/<parent>/fd/<n>``, the parent's descriptor, so nothing is ever left behind in ``/dev/shm``
by a killed run), builds tensors that view it, hands them to its engine's ``update_weights`` (which
copies them in) and acknowledges; the parent then closes its descriptor and the memory is freed.
A mapping whose ``partial`` attribute is true (LoRA's merged layers,
``reasonrl.models.lora.engine_weights``) arrives as a mapping with ``partial`` true; a lazy mapping
is read one tensor at a time, as the in-process engines read it. Tensors that share memory in a
plain dict (tied embeddings) are written once.

Lifetime and failure:

- The child dies with the parent: Linux's ``PR_SET_PDEATHSIG`` (SIGKILL) is set at the child's
  first line, and a parent gone before that is caught by comparing the parent's pid. The signal
  comes when the parent *thread* that started the child ends: start the engine from a thread that
  outlives it (the trainer's main thread). A closed pipe (the parent exited) also ends the child.
- SIGINT and SIGTERM are blocked in the parent's thread while it starts the child, so the child
  starts with both blocked, then ignores them: a Ctrl-C or a scheduler's SIGTERM to the process
  group stops the trainer, which decides what happens to the engine (``close``); the child prints no
  ``KeyboardInterrupt`` traceback.
- A child that dies (killed, out of memory, a crash) or fails (an engine error) surfaces in the
  parent as one line, a ``ReasonRLError`` naming what happened, at the next ``result`` or request.
- ``close`` is idempotent: the child drops what is still queued, stops a generation in progress
  (its process ends) or else closes its engine, and exits; after a grace period the parent SIGKILLs
  it; either way the parent reaps it.
- ``threads`` (torch threads) and ``cpus`` (``os.sched_setaffinity``) are set in the child before
  torch is imported, so on 2 cores the engine can be pinned to one and the trainer to the other
  (``bench/engine_process.py``; ``docs/performance.md`` "Generation in its own process").
"""

from __future__ import annotations

import dataclasses
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Mapping, Sequence

from reasonrl.engines.base import Completion, EngineOptions, ProgressFn, SamplingParams
from reasonrl.errors import ReasonRLError

#: Offsets of tensors in the weights file are multiples of this (any dtype's alignment, a cache line).
ALIGN = 64
_STOPS = {signal.SIGINT, signal.SIGTERM}


@dataclass(frozen=True)
class Pending:
    """A submitted request: ``id`` (submission order) and ``weights_version``, the version of the
    weights that generate it (the last ``update_weights`` submitted before it; ``None``: the
    weights the engine was built with)."""

    id: int
    weights_version: Any
    n_prompts: int


class WeightsView(dict):
    """The weights of one update as the child's engine receives them: tensors viewing the shared
    file, and ``partial`` as the sender's mapping had it."""

    partial: bool = False


# ------------------------------------------------------------------------------------------------
# Parent side


class EngineProcess:
    """An engine (``opts.engine``: hf, vllm, a server URL) built and run in a child process.

    ``threads``: torch threads in the child (None: torch's default); ``cpus``: the cores the child
    may run on (None: the parent's). ``start_timeout_s`` bounds the engine's construction;
    ``close_grace_s`` how long ``close`` waits for the child to close its engine before SIGKILL.
    ``version``: the version of the weights it is built with (``Pending.weights_version`` of the
    requests before any update; default None). ``env``: variables set in the child's environment
    (e.g. ``CUDA_VISIBLE_DEVICES``: the engine on GPUs of its own; a value None: the variable unset,
    e.g. a launcher's ``RANK``).
    """

    def __init__(self, opts: EngineOptions, model_dir: str | Path, *, seed: int, max_model_len: int = 4096,
                 decode_steps: int | None = None, threads: int | None = None, cpus: Sequence[int] | None = None,
                 start_timeout_s: float = 900.0, close_grace_s: float = 30.0, version: Any = None,
                 env: Mapping[str, str | None] | None = None) -> None:
        if threads is not None and threads < 1:
            raise ReasonRLError(f"EngineProcess: threads must be >= 1, got {threads}")
        self.close_grace_s = close_grace_s
        self.name = self.engine_name = "process"  # (the child's engine's, once built)
        self.compiled = False
        self.last_update_seconds = 0.0  # the parent's share of the last update: writing the shared file
        self.last_generate_seconds = 0.0  # the child's time generating the last result taken
        self._closed = False
        self._lock = threading.Lock()  # (one sender at a time)
        self._next_id = 0
        self._version: Any = version
        self._waiting: dict[int, queue.Queue[tuple[Any, ...]]] = {}
        self._weight_fds: dict[int, int] = {}  # update sequence number → the parent's descriptor of its file
        self._weight_paths: dict[int, str] = {}  # (no memfd: a temporary file, removed by the child)
        self._updates = 0
        self._applied: list[tuple[Any, float]] = []  # (version, the child's seconds to apply it)
        self._failure: str | None = None  # the one line that ends this engine
        self._child_error: str | None = None  # what the child said before it ended, if it said anything

        spec = {"opts": dataclasses.asdict(opts), "model_dir": str(model_dir), "seed": int(seed), "max_model_len": int(max_model_len),
                "decode_steps": decode_steps, "threads": threads, "cpus": list(cpus) if cpus is not None else None}
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
        root = str(Path(__file__).resolve().parents[2])  # (the child imports this copy of reasonrl)
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        if threads is not None:  # (read by OpenMP when torch loads, before the child's set_num_threads)
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
        cmd = [sys.executable, "-c", f"from reasonrl.engines.process import serve; serve({req_r}, {resp_w}, {os.getpid()})"]
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS) if hasattr(signal, "pthread_sigmask") else None
        try:  # (the child starts with SIGINT and SIGTERM blocked: a signal now cannot print its traceback)
            self._proc = subprocess.Popen(cmd, env=env, pass_fds=(req_r, resp_w), stdin=subprocess.DEVNULL)
        except OSError as e:
            for fd in (req_r, req_w, resp_r, resp_w):
                os.close(fd)
            raise ReasonRLError(f"the engine process could not start ({e}): check {sys.executable}") from None
        finally:
            if mask is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            for fd in (req_r, resp_w):
                if self.__dict__.get("_proc") is not None:
                    os.close(fd)
        self.pid = self._proc.pid
        self._send_conn = Connection(req_w, readable=False)
        self._recv_conn = Connection(resp_r, writable=False)
        self._ready: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name=f"engine-process-{self.pid}", daemon=True)
        self._reader.start()
        try:
            self._send(("build", spec))
            try:
                msg = self._ready.get(timeout=start_timeout_s)
            except queue.Empty:
                raise ReasonRLError(f"the engine process (pid {self.pid}) built no engine in {start_timeout_s:.0f} s: "
                                    "check its output above, or raise start_timeout_s") from None
            if msg[0] != "ready":
                raise ReasonRLError(self._failure or f"the engine process (pid {self.pid}) ended while building its engine")
        except BaseException:
            self.close()
            raise
        # A stand-in answers as its engine does: its name (what stages branch on and record), whether
        # it compiled, and its context length (vLLM lowers max_model_len to what the model supports).
        self.name = self.engine_name = msg[1]
        self.compiled = bool(msg[2])
        if msg[3] is not None:
            self.max_model_len = int(msg[3])

    # ---------------------------------------------------------------- requests
    def submit(self, prompts: Sequence[Sequence[int]], params: SamplingParams, progress: bool = False) -> Pending:
        """Queue a generation; returns at once. ``progress``: the child reports completions as they
        finish, heard by ``result``'s ``progress`` callback."""
        self._check_open()
        with self._lock:
            rid = self._next_id
            self._next_id += 1
            self._waiting[rid] = queue.Queue()
            pending = Pending(rid, self._version, len(prompts))
            self._send(("generate", rid, [list(map(int, p)) for p in prompts], params, progress))
        return pending

    def result(self, pending: Pending, progress: ProgressFn | None = None) -> list[list[Completion]]:
        """The completions of ``pending`` (blocks until they are back); once per request."""
        q = self._waiting.get(pending.id)
        if q is None:
            raise ReasonRLError(f"EngineProcess.result: request {pending.id} is unknown or its result was already taken")
        while True:
            msg = q.get()
            if msg[0] == "progress":
                if progress is not None:
                    progress(msg[1], msg[2])
                continue
            self._waiting.pop(pending.id, None)
            if msg[0] == "done":
                self.last_generate_seconds = msg[2]
                return msg[1]
            raise ReasonRLError(msg[1] if msg[0] == "failed" else f"the engine process (pid {self.pid}) failed {msg[1]}")

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, progress: ProgressFn | None = None) -> list[list[Completion]]:
        return self.result(self.submit(prompts, params, progress=progress is not None), progress)

    def update_weights(self, state_dict: Mapping[str, Any], version: Any = None) -> None:
        """Queue new weights (applied after every request submitted so far, before every later
        one); ``version`` labels them (default: the previous version + 1 when that is an int, else
        a count of updates). The tensors are written to
        shared memory now (``last_update_seconds``); the caller may change its own tensors after."""
        self._check_open()
        t0 = time.perf_counter()
        with self._lock:
            self._updates += 1
            seq = self._updates
            source, manifest = write_weights(state_dict, f"reasonrl-weights-{seq}")
            if source[0] == "fd":
                self._weight_fds[seq] = source[2]
            else:
                self._weight_paths[seq] = source[1]
            if version is None:
                version = self._version + 1 if isinstance(self._version, int) and not isinstance(self._version, bool) else seq
            self._version = version
            self._send(("weights", seq, self._version, source, manifest, bool(getattr(state_dict, "partial", False))))
        self.last_update_seconds = time.perf_counter() - t0

    @property
    def weights_version(self) -> Any:
        """The version of the last update submitted (None: the weights the engine was built with)."""
        return self._version

    @property
    def applied(self) -> list[tuple[Any, float]]:
        """(version, seconds the child took to load it) of each update the child has applied."""
        return list(self._applied)

    def close(self) -> None:
        """Close the child's engine and reap the child (SIGKILL after ``close_grace_s``); idempotent."""
        if self._closed:
            return
        self._closed = True
        proc = self.__dict__.get("_proc")
        if proc is None:
            return
        if proc.poll() is None:
            try:
                with self._lock:
                    self._send_conn.send(("close",))
            except (OSError, ValueError):
                pass
            try:
                proc.wait(timeout=self.close_grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for c in (self._send_conn, self._recv_conn):
            try:
                c.close()
            except OSError:
                pass
        self._reader.join(timeout=5)
        self._release_weights()
        self._failure = self._failure or f"the engine process (pid {self.pid}) was closed"
        for q in list(self._waiting.values()):
            q.put(("failed", self._failure))

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---------------------------------------------------------------- internals
    def _check_open(self) -> None:
        if self._failure is not None:
            raise ReasonRLError(self._failure)
        if self._closed:
            raise ReasonRLError("the engine process is closed: build a new EngineProcess")

    def _send(self, msg: tuple[Any, ...]) -> None:
        try:
            self._send_conn.send(msg)
        except (OSError, ValueError):  # (a broken pipe: the child is gone; the reader says why)
            self._reader.join(timeout=10)
            raise ReasonRLError(self._failure or f"the engine process (pid {self.pid}) is gone") from None

    def _release_weights(self, seq: int | None = None) -> None:
        for s in [seq] if seq is not None else list(self._weight_fds) + list(self._weight_paths):
            fd = self._weight_fds.pop(s, None)
            if fd is not None:
                os.close(fd)
            path = self._weight_paths.pop(s, None)
            if path is not None:
                Path(path).unlink(missing_ok=True)

    def _read(self) -> None:
        """The reader thread: every message from the child to its request's queue; at the child's
        end, the line that says why to every request still waiting. SIGINT and SIGTERM are blocked
        in this thread, so the kernel delivers them to the main thread: one that lands here would
        set Python's flag without waking the main thread from a sleep or a wait, and a Ctrl-C could
        go unanswered for as long as that lasts."""
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
        try:
            while True:
                msg = self._recv_conn.recv()
                kind = msg[0]
                if kind == "ready":
                    self._ready.put(msg)
                elif kind in ("progress", "done", "error"):
                    q = self._waiting.get(msg[1])
                    if q is not None:
                        q.put((kind, *msg[2:]))
                elif kind == "applied":
                    with self._lock:
                        self._release_weights(msg[1])
                    self._applied.append((msg[2], msg[3]))
                elif kind == "fatal":
                    self._child_error = msg[1]
        except (EOFError, OSError, ValueError):
            pass
        if self._closed and self._child_error is None:
            return
        try:
            code = self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        if self._child_error is not None:
            why = f"failed: {self._child_error}"
        elif code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            why = f"was killed by {name}" + (" (out of memory, or killed by hand)" if -code == signal.SIGKILL else "")
        else:
            why = f"exited with code {code}" if code is not None else "closed its pipe"
        self._failure = f"the engine process (pid {self.pid}) {why}: see its output above; restart the run (--resume continues it)"
        self._ready.put(("failed",))
        for q in list(self._waiting.values()):
            q.put(("failed", self._failure))


def write_weights(state_dict: Mapping[str, Any], label: str) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    """Write the tensors of ``state_dict`` into a new in-memory file: (where it is, the manifest).

    The manifest holds ``(name, "tensor", dtype name, shape, offset)`` per tensor (offsets
    ``ALIGN``-aligned; tensors sharing memory in a plain dict written once) and ``(name, "value",
    object)`` for anything else. Values are read one at a time (a lazy mapping computes one tensor
    at a time)."""
    import torch

    if hasattr(os, "memfd_create") and Path(f"/proc/{os.getpid()}/fd").is_dir():
        fd = os.memfd_create(label, getattr(os, "MFD_CLOEXEC", 0))
        source: tuple[Any, ...] = ("fd", os.getpid(), fd)
    else:
        fd, path = tempfile.mkstemp(prefix=label + "-")
        source = ("path", path)
    manifest: list[tuple[Any, ...]] = []
    shared: dict[tuple[Any, ...], int] = {}
    plain = type(state_dict) is dict  # (its tensors all stay alive, so equal pointers are equal tensors)
    offset = 0
    try:
        for name in list(state_dict.keys()):
            v = state_dict[name]
            if not isinstance(v, torch.Tensor):
                manifest.append((name, "value", v))
                continue
            v = v.detach()
            if v.device.type != "cpu":
                v = v.cpu()
            dtype = str(v.dtype).removeprefix("torch.")
            key = (v.data_ptr(), dtype, tuple(v.shape), tuple(v.stride()))
            if plain and v.numel() and key in shared:
                manifest.append((name, "tensor", dtype, tuple(v.shape), shared[key]))
                continue
            data = v.contiguous().reshape(-1).view(torch.uint8).numpy()
            pad = -offset % ALIGN
            if pad:
                os.write(fd, b"\0" * pad)
                offset += pad
            view = memoryview(data).cast("B")
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if plain:
                shared[key] = offset
            manifest.append((name, "tensor", dtype, tuple(v.shape), offset))
            offset += data.nbytes
    except BaseException:
        os.close(fd)
        if source[0] == "path":
            Path(source[1]).unlink(missing_ok=True)
        raise
    if source[0] == "path":
        os.close(fd)
    return source + (offset,), manifest


# ------------------------------------------------------------------------------------------------
# Child side


def read_weights(source: tuple[Any, ...], manifest: list[tuple[Any, ...]], partial: bool) -> WeightsView:
    """The tensors of an update, viewing the parent's file (mapped privately: nothing is copied
    until the engine copies them in)."""
    import torch

    size = source[-1]
    path = f"/proc/{source[1]}/fd/{source[2]}" if source[0] == "fd" else source[1]
    base = torch.from_file(path, shared=False, size=size, dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)
    if source[0] == "path":
        Path(path).unlink(missing_ok=True)  # (the mapping stays valid)
    out = WeightsView()
    out.partial = partial
    for entry in manifest:
        if entry[1] == "value":
            out[entry[0]] = entry[2]
            continue
        name, _, dtype, shape, offset = entry
        dt = getattr(torch, dtype)
        n = 1
        for s in shape:
            n *= s
        nbytes = n * torch.empty((), dtype=dt).element_size()
        out[name] = base[offset : offset + nbytes].view(dt).view(shape)
    return out


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when the parent (its starting thread) ends; exit now if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os._exit(0)


def serve(req_fd: int, resp_fd: int, parent: int) -> None:
    """The child's main: build the engine, then serve the parent's queue in order until it closes."""
    _die_with_parent(parent)
    for s in _STOPS:  # (started with both blocked; ignored, and left blocked, so none ever reaches us)
        signal.signal(s, signal.SIG_IGN)
    recv = Connection(req_fd, writable=False)
    send = Connection(resp_fd, readable=False)
    inbox: queue.Queue[Any] = queue.Queue()
    busy = threading.Event()  # (set while the engine generates or loads weights)

    def read() -> None:  # (drains the pipe, so the parent's sends never wait on a generation)
        try:
            while True:
                msg = recv.recv()
                if msg[0] == "close":
                    break
                inbox.put(msg)
        except (EOFError, OSError):
            pass
        # The parent closes (or is gone): nothing queued will be read. Mid-generation, stop now (the
        # parent waits for no result; ending the process frees the engine); else close it properly.
        inbox.put(("close",))
        if busy.is_set():
            os._exit(0)

    first = recv.recv()
    spec = first[1]
    if spec["cpus"] is not None:
        os.sched_setaffinity(0, spec["cpus"])
    threading.Thread(target=read, name="engine-requests", daemon=True).start()
    try:
        import torch

        if spec["threads"] is not None:
            torch.set_num_threads(spec["threads"])
        from reasonrl.console import quiet_libraries
        from reasonrl.engines.registry import make_engine

        quiet_libraries()
        engine = make_engine(EngineOptions(**spec["opts"]), spec["model_dir"], seed=spec["seed"], max_model_len=spec["max_model_len"],
                             decode_steps=spec["decode_steps"])
    except BaseException as e:  # noqa: BLE001 - reported to the parent as its one line
        send.send(("fatal", _line(e, "building the engine")))
        os._exit(1)
    send.send(("ready", engine.name, bool(getattr(engine, "compiled", False)), getattr(engine, "max_model_len", None)))
    try:
        while True:
            busy.clear()
            msg = inbox.get()
            if msg[0] == "close":
                break
            busy.set()
            if msg[0] == "generate":
                _, rid, prompts, params, want_progress = msg
                hook = (lambda c, t, rid=rid: send.send(("progress", rid, c, t))) if want_progress else None
                t0 = time.perf_counter()
                try:
                    out = engine.generate(prompts, params, progress=hook) if hook else engine.generate(prompts, params)
                except Exception as e:  # noqa: BLE001 - this request fails; the engine serves the next
                    send.send(("error", rid, _line(e, "generating")))
                    continue
                send.send(("done", rid, out, time.perf_counter() - t0))
            elif msg[0] == "weights":
                _, seq, version, source, manifest, partial = msg
                t0 = time.perf_counter()
                try:
                    weights = read_weights(source, manifest, partial)
                    engine.update_weights(weights)
                    del weights
                except Exception as e:  # noqa: BLE001 - later generations would use the wrong weights: fatal
                    send.send(("fatal", _line(e, f"loading weights version {version}")))
                    os._exit(1)
                send.send(("applied", seq, version, time.perf_counter() - t0))
    finally:
        try:
            engine.close()
        finally:
            send.close()
    os._exit(0)


def _line(e: BaseException, doing: str) -> str:
    from reasonrl.console import error_line

    msg = str(e) if isinstance(e, ReasonRLError) else error_line(e)
    return f"{doing}: {msg}" if msg else f"{doing}: {type(e).__name__}"
