"""Batch reward scoring that never stalls the caller: math-verify runs in killable processes.

:class:`RewardScorer` scores a batch of responses in three tiers:

1. *No answer* (nothing to extract): -1, status "no_answer", no work at all.
2. *Fast path*: the extracted answer and the ground truth both spell integers (most DAPO items),
   or the rule refuses the answer (words the ground truth lacks, arithmetic left undone against an
   integer: ``reasonrl.rewards.verify.decide_by_rule``); decided in this process, no math-verify.
3. Everything else goes to math-verify in a ``concurrent.futures.ProcessPoolExecutor`` with a
   per-item time limit. Identical (answer, ground truth) pairs of a batch are verified once.

Timeouts. sympy can run for minutes or forever on some answers (``9^{9^{9^{9}}}`` against a decimal
does not finish; against an integer the rule refuses it first). An item is given ``timeout_s``
seconds from the moment it is handed to an idle, warmed-up worker (at most ``num_workers`` items
are in flight, so an item never waits in a queue on the clock). When it runs past that, the item
scores -1 with status "timeout" and the whole pool is killed (SIGKILL) and replaced on next use: a
worker stuck in sympy cannot be interrupted or reused, and waiting on it would hang the caller.
Items that were running next to it keep running to their own deadlines (nothing new is handed out
meanwhile), so items in flight together time out together, with one pool restart between them. A
reward plug-in that times out on :data:`PLUGIN_TIMEOUTS_IN_A_ROW` responses in a row stops the run
(:class:`RewardPluginError`); math-verify's timeouts are per answer and never stop a run. A worker
that dies (segfault, OOM kill) breaks the pool: its items are rerun one at a time so the culprit is
identified and scored "error".

Processes, not threads or signals: math-verify's own timeout uses ``signal.alarm``, which only
works in the main thread; the caller here may be any thread (a rollout worker, an async reward
loop). The scorer sets no alarm; it only SIGKILLs its own workers, and holds SIGTERM and SIGINT
while it spawns them (below).

Starting and stopping at any instant (#43). A spawned worker first unpickles its state (the pool's
queues and their named semaphores) and only then runs our code; a parent that stops while a worker
is being spawned must not release those semaphores under it (the worker would print multiprocessing's
``FileNotFoundError`` traceback from ``SemLock._rebuild`` onto the console). So: (1) the pool is
known, with every process it has spawned, from before its first spawn, and a stop at any point of a
start (or a step) SIGKILLs them before the parent releases anything (a SIGKILLed worker prints
nothing); (2) a spawn is never cut in half: SIGTERM and SIGINT are held while the pool's processes
are spawned (a few milliseconds; the handler runs right after, with every spawned worker known) --
without that, a stop landing between a worker's start and its registration leaves a worker nobody
kills; (3) the workers are spawned with SIGTERM and SIGINT blocked, so a Ctrl-C or a scheduler's
SIGTERM to the process group cannot interrupt them (a KeyboardInterrupt traceback) before their
initializer ignores both (under "forkserver", a server started by the pool inherits the blocked
pair too; it ends with its client, as ever). A worker whose parent was SIGKILLed (no cleanup)
still finds the semaphores (multiprocessing's resource tracker removes them only after every
worker is gone) and exits quietly at its first line (:func:`_die_with_parent`). Left: a SIGKILL in the microseconds
between a worker's fork and the parent's write of its state (the worker reads a truncated stream).
Held and blocked rather than redirecting the workers' stderr: the workers' own errors stay visible,
and the stdlib's pool is used unchanged.

Start method: "spawn" by default. The trainer process holds torch (and possibly CUDA) state and
many threads, which ``fork`` can copy into a deadlocked child; "spawn" starts each worker as a
fresh interpreter on every platform, sharing nothing. "forkserver" is also accepted (a little
faster to restart, Unix only; its server and preload list are process-wide). Pool (re)starts are
rare: lazily on first use and after a timeout. As with any spawn-based pool, a script that
creates the scorer at import time needs an ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
import weakref
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from typing import Any, Iterator, Sequence

from reasonrl.errors import ReasonRLError
from reasonrl.rewards.extract import extract_answer
from reasonrl.rewards.verify import Score, ScoreStatus, decide_by_rule, math_verify_equivalent

__all__ = ["RewardPluginError", "RewardScorer", "ScoreStats", "default_num_workers"]

log = logging.getLogger(__name__)

_Key = tuple[str, str]  # (extracted answer, ground truth)


def default_num_workers() -> int:
    """1 or 2 verifier processes: most items take the fast path, and training owns the cores."""
    return max(1, min(2, (os.cpu_count() or 1) - 1))


@dataclass
class ScoreStats:
    """What happened while scoring one batch (all counts are items, i.e. responses).

    ``fast_path + verified + no_answer == total``; ``timeouts`` and ``errors`` are among
    ``verified`` (except ``errors`` from a pool that could not start, also among ``verified``).
    """

    total: int = 0
    no_answer: int = 0
    fast_path: int = 0  # decided here by rule (both integers, or words foreign to the answer), without math-verify
    verified: int = 0  # sent to math-verify (after de-duplication: ``verifier_calls`` calls)
    verifier_calls: int = 0
    timeouts: int = 0
    errors: int = 0
    pool_restarts: int = 0  # pools killed (after a timeout or a worker crash)
    reward_errors: int = 0  # items scored -1 because the reward failed: timeouts + errors (a plug-in's exceptions and non-finite values among them)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


# --------------------------------------------------------------------------------------------
# Worker side (top-level functions: "spawn" pickles them by reference).


def _worker_init(barrier: Any, wait_s: float, memory_limit_mb: int | None, reward: str = "math", owner: int | None = None) -> None:
    """Warm a worker up (imports + one comparison), then wait for its siblings.

    The barrier makes every worker of a new pool ready before the first item is handed out, so no
    item's time limit is spent on another worker's imports. ``owner``: the scorer's process, which
    may already be gone when this runs (killed while the pool was spawning).
    """
    _die_with_parent(owner)
    try:
        # Ctrl-C (and a scheduler's SIGTERM) reach the whole process group; the parent decides what
        # happens to workers (it may finish its step first), and a worker outlives no parent. (Spawned
        # with both blocked, see _stops_held: ignored first, then unblocked, any pending one dropped.)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
        if memory_limit_mb:
            import resource

            limit = int(memory_limit_mb) * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        if reward != "math":  # import the plug-in now, so its import time is spent on no item's clock
            from reasonrl.rewards.plugin import load_plugin

            load_plugin(reward)
        math_verify_equivalent("\\frac{1}{2}", "0.5")  # (maj@n's comparisons use math-verify under a plug-in too)
    except Exception:  # noqa: BLE001 - a failed warm-up must not break the pool
        pass
    finally:
        try:
            barrier.wait(wait_s)
        except Exception:  # noqa: BLE001 - broken/timed-out barrier: carry on
            pass


def _die_with_parent(owner: int | None = None, period_s: float = 0.5) -> None:
    """End this worker when its parent is gone (SIGKILLed parents run no cleanup): a daemon thread
    watches the parent pid, and ``owner``, the scorer's process (the parent under "spawn", the
    forkserver's client under "forkserver"). The owner is named by the pool, not read here: a parent
    killed while it was still spawning the pool is gone before this runs, and the worker's parent is
    then already its new one. (Not prctl's PDEATHSIG: that fires when the *thread* that started the
    worker ends, and the scorer may be used from short-lived threads.)"""
    parent = os.getppid()

    def gone() -> bool:
        if os.getppid() != parent:
            return True
        if owner is None:
            return False
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # (a pid reused by another user's process: the owner is gone)
            return True
        return owner != parent and not _is_running(owner)

    def watch() -> None:
        while not gone():
            time.sleep(period_s)
        os._exit(0)

    if gone():
        os._exit(0)
    threading.Thread(target=watch, name="reasonrl-parent-watch", daemon=True).start()


def _is_running(pid: int) -> bool:
    """``pid`` exists and is not a zombie (Linux /proc; elsewhere: it exists)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _worker_ping() -> int:
    return os.getpid()


def _worker_verify(pred: str, ground_truth: str) -> bool:
    return math_verify_equivalent(pred, ground_truth)


def _worker_plugin(spec: str, response: str, ground_truth: str, info: dict[str, Any]) -> tuple[str, Any]:
    from reasonrl.rewards.plugin import call_plugin

    return call_plugin(spec, response, ground_truth, info)


# --------------------------------------------------------------------------------------------
# Parent side.


_STOPS = {signal.SIGTERM, signal.SIGINT}


@contextlib.contextmanager
def _stops_held() -> Iterator[None]:
    """SIGTERM and SIGINT wait until the block is done (then their handlers run, once each).

    In the main thread the Python handlers are swapped for one that notes the signal (Python runs
    handlers in the main thread only, whichever thread the OS delivered to) and the signal is raised
    again after; elsewhere a signal interrupts the main thread, not this block. Both are also blocked
    in this thread, so the processes it spawns start with them blocked (the worker's initializer
    ignores, then unblocks them)."""
    main = threading.current_thread() is threading.main_thread()
    noted: list[int] = []
    previous: dict[int, Any] = {}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS) if hasattr(signal, "pthread_sigmask") else None
    try:
        if main:
            for s in _STOPS:
                if signal.getsignal(s) is not None:  # (None: a handler not set from Python, left alone)
                    previous[s] = signal.signal(s, lambda signum, frame: noted.append(signum))
        yield
    finally:
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # (one that came while blocked is noted: the handlers are still swapped)
        for s, h in previous.items():
            signal.signal(s, h)  # (runs a pending noting handler first)
        for signum in dict.fromkeys(noted):
            signal.raise_signal(signum)


class _PoolStartError(RuntimeError):
    pass


#: A reward plug-in that times out on this many responses in a row (no reward in between, over
#: batches) hangs: the run stops with one line naming it instead of paying a time limit and a pool
#: restart per response (at 8,192 responses a step, hours). Items in flight time out together, so
#: with the default 2 workers that is two rounds of the time limit and two pool kills.
PLUGIN_TIMEOUTS_IN_A_ROW = 4


class RewardPluginError(ReasonRLError):
    """A reward plug-in failed on every response of a batch, or timed out on
    :data:`PLUGIN_TIMEOUTS_IN_A_ROW` responses in a row: the run stops (one line, exit 1).
    ``stats``: the batch's :class:`ScoreStats` up to the stop."""

    def __init__(self, message: str, stats: ScoreStats | None = None) -> None:
        super().__init__(message)
        self.stats = stats


class _Hung(Exception):
    """``in_a_row`` timeouts in a row (``timed_out`` of them in this batch): the plug-in hangs."""

    def __init__(self, in_a_row: int, timed_out: int) -> None:
        super().__init__(in_a_row)
        self.in_a_row, self.timed_out = in_a_row, timed_out


class _Pool:
    """One ProcessPoolExecutor and its processes; ``kill`` never blocks for long."""

    def __init__(self, executor: ProcessPoolExecutor) -> None:
        self.executor = executor
        # The executor's own record of its processes, kept from before the first spawn (a worker
        # enters it as it is spawned; the executor drops the record at shutdown, this keeps it).
        spawned = getattr(executor, "_processes", None)  # (the same dict, not a copy: it is empty now)
        self._spawned: dict[int, Any] = spawned if spawned is not None else {}

    @property
    def processes(self) -> list[Any]:
        return list(self._spawned.values())

    def kill(self) -> None:
        """Shut the pool down now: SIGKILL its workers (idle or stuck), reap them, and wait for the
        executor's manager thread to end.

        The wait is for the interpreter's exit: CPython's exit hook for process pools wakes every
        manager thread still running, and its wake-up (unlocked, CPython 3.11) can write to the pipe
        the manager thread is closing that very moment ("Exception ignored in: <module 'threading'>
        ... OSError: [Errno 9] Bad file descriptor" on stderr of a run stopped right after a kill).
        """
        with _stops_held():  # (a second signal does not cut the kill short: no worker is left unkilled)
            processes = self.processes
            manager = getattr(self.executor, "_executor_manager_thread", None)  # (shutdown forgets it)
            kill_workers = getattr(self.executor, "kill_workers", None)  # Python >= 3.14
            if not processes and kill_workers is not None:
                kill_workers()
            else:
                try:
                    self.executor.shutdown(wait=False, cancel_futures=True)
                except Exception:  # noqa: BLE001
                    pass
                for p in processes:
                    if p.is_alive():
                        p.kill()
                for p in processes:
                    p.join(5.0)
            if manager is not None and manager is not threading.current_thread():
                manager.join(5.0)  # (its workers are dead: it closes its pipes and ends at once)


class _PoolHolder:
    """The scorer's current pool, kept apart from the scorer so the atexit finalizer can reach it
    without keeping the scorer alive."""

    def __init__(self) -> None:
        self.pool: _Pool | None = None

    def kill(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.kill()


class RewardScorer:
    """Scores batches of responses with a time limit per math-verify call (see the module doc).

    Use it as a context manager, or just call :meth:`score_batch` (the pool starts lazily) and
    :meth:`close` when done; a scorer that is garbage-collected or alive at interpreter exit is
    closed automatically. Thread-safe: calls from several threads are served one at a time.

    Args:
        num_workers: verifier processes; default 1-2 (:func:`default_num_workers`). 0 verifies in
            this process without any time limit (debugging only).
        timeout_s: time limit of one math-verify call (parse + verify of one pair).
        mp_context: "spawn" (default) or "forkserver"; see the module doc.
        startup_timeout_s: time allowed for a new pool to start and warm up.
        memory_limit_mb: optional address-space limit for each worker (RLIMIT_AS, Unix); a
            runaway sympy computation then fails with MemoryError instead of eating the node.
        reward: "math" (the rule reward above) or a plug-in spec, FILE.py:FUNCTION or
            package.module:FUNCTION (:mod:`reasonrl.rewards.plugin`): every response is then scored
            by the plug-in in the pool, ``timeout_s`` per response, with ``infos`` of
            :meth:`score_batch`; an exception, a timeout or a non-finite value scores -1 (status
            "error" / "timeout", counted in ``reward_errors``), and a batch on which every response
            fails raises :class:`RewardPluginError` naming the first exception.
    """

    def __init__(
        self,
        num_workers: int | None = None,
        timeout_s: float = 5.0,
        mp_context: str = "spawn",
        startup_timeout_s: float = 120.0,
        memory_limit_mb: int | None = None,
        reward: str = "math",
    ) -> None:
        if mp_context not in ("spawn", "forkserver"):
            raise ValueError(f"mp_context must be 'spawn' or 'forkserver', not {mp_context!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.num_workers = default_num_workers() if num_workers is None else int(num_workers)
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        self.timeout_s = float(timeout_s)
        self.mp_context = mp_context
        self.startup_timeout_s = float(startup_timeout_s)
        self.memory_limit_mb = memory_limit_mb
        self.reward = reward
        self._holder = _PoolHolder()
        self._lock = threading.Lock()
        self._timeouts_in_a_row = 0  # (a plug-in's, over batches: PLUGIN_TIMEOUTS_IN_A_ROW)
        # Runs at garbage collection or at interpreter exit, whichever comes first.
        self._finalizer = weakref.finalize(self, self._holder.kill)

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker processes. The scorer may still be used: a new pool starts lazily."""
        with self._lock:
            self._holder.kill()

    @property
    def pool_pids(self) -> list[int]:
        """PIDs of the current workers (empty when no pool is running)."""
        pool = self._holder.pool
        return [] if pool is None else [p.pid for p in pool.processes if p.pid is not None]

    def _ensure_pool(self) -> _Pool:
        if self._holder.pool is not None:
            return self._holder.pool
        ctx = mp.get_context(self.mp_context)
        n = self.num_workers
        barrier = ctx.Barrier(n)
        executor = ProcessPoolExecutor(
            max_workers=n,
            mp_context=ctx,
            initializer=_worker_init,
            initargs=(barrier, self.startup_timeout_s, self.memory_limit_mb, self.reward, os.getpid()),
        )
        pool = _Pool(executor)  # (known before its first spawn: a stop from here on kills what it spawned)
        try:
            # With spawn/forkserver, each submit that finds no idle worker starts one: n pings
            # start all n workers, and the barrier in their initializer lines them up. No stop
            # lands inside a spawn (see the module doc).
            with _stops_held():
                pings = [executor.submit(_worker_ping) for _ in range(n)]
            done, not_done = wait(pings, timeout=self.startup_timeout_s)
            if not_done:
                raise _PoolStartError(f"verifier pool did not start within {self.startup_timeout_s:.0f} s")
            for f in done:
                f.result()  # raises BrokenProcessPool when a worker died while starting
        except BaseException as e:
            pool.kill()
            if isinstance(e, Exception) and not isinstance(e, _PoolStartError):
                raise _PoolStartError(f"verifier pool failed to start: {e!r}") from e
            raise
        self._holder.pool = pool
        return pool

    # -- scoring -----------------------------------------------------------------------------

    def score(self, response: str, ground_truth: str | int) -> Score:
        """Score one response (a batch of one)."""
        return self.score_batch([response], [ground_truth])[0][0]

    def score_batch(
        self, responses: Sequence[str], ground_truths: Sequence[str | int], infos: Sequence[dict[str, Any]] | None = None,
    ) -> tuple[list[Score], ScoreStats]:
        """Score ``responses[i]`` against ``ground_truths[i]``; never hangs, never raises for an item.

        Returns the scores (in order) and the batch's :class:`ScoreStats`. Bounded time: about
        (items sent to math-verify / workers) x their verify time, plus ``timeout_s`` and a pool
        restart (a few seconds) per round of items in flight that times out.
        """
        if len(responses) != len(ground_truths):
            raise ValueError(
                f"{len(responses)} responses but {len(ground_truths)} ground truths: they must pair up"
            )
        if self.reward != "math":
            return self._score_plugin(responses, ground_truths, infos)
        t0 = time.monotonic()
        stats = ScoreStats(total=len(responses))
        scores: list[Score | None] = [None] * len(responses)
        pending: dict[_Key, list[int]] = {}
        extracted_all: list[str | None] = []
        for i, (response, gt) in enumerate(zip(responses, ground_truths)):
            extracted = extract_answer(response)
            extracted_all.append(extracted)
            if extracted is None:
                scores[i] = Score.failed(None, "no_answer")
                stats.no_answer += 1
                continue
            rule = decide_by_rule(extracted, gt)  # never raises: None sends the item to the verifier pool
            if rule is not None:
                scores[i] = Score.decided(extracted, rule)
                stats.fast_path += 1
                continue
            pending.setdefault((extracted, str(gt)), []).append(i)
            stats.verified += 1

        if pending:
            stats.verifier_calls = len(pending)
            with self._lock:
                outcomes = self._verify_all(list(pending), stats)
            for key, items in pending.items():
                status, ok = outcomes[key]
                for i in items:
                    if status == "ok":
                        scores[i] = Score.decided(key[0], ok)
                    else:
                        scores[i] = Score.failed(key[0], status)
                        if status == "timeout":
                            stats.timeouts += 1
                        else:
                            stats.errors += 1
        stats.reward_errors = stats.timeouts + stats.errors
        stats.seconds = time.monotonic() - t0
        return [s for s in scores if s is not None], stats

    def _score_plugin(
        self, responses: Sequence[str], ground_truths: Sequence[str | int], infos: Sequence[dict[str, Any]] | None,
    ) -> tuple[list[Score], ScoreStats]:
        """Every response through the plug-in ``self.reward``, one pool item each (no de-duplication:
        ``info`` differs between prompts)."""
        from reasonrl.rewards.plugin import call_plugin

        if infos is not None and len(infos) != len(responses):
            raise ValueError(f"{len(responses)} responses but {len(infos)} infos: they must pair up")
        t0 = time.monotonic()
        n = len(responses)
        stats = ScoreStats(total=n, verified=n, verifier_calls=n)
        args = [(self.reward, str(r), str(gt), dict(infos[i]) if infos is not None else {})
                for i, (r, gt) in enumerate(zip(responses, ground_truths))]
        if not n:
            return [], stats
        with self._lock:
            if self.num_workers == 0:
                outcomes = {i: ("ok", call_plugin(*args[i])) for i in range(n)}
            else:
                try:
                    outcomes = self._run_in_pool(list(range(n)), stats, task=lambda i: (_worker_plugin, args[i]),
                                                 hung_after=PLUGIN_TIMEOUTS_IN_A_ROW)
                except _Hung as e:
                    stats.timeouts = stats.reward_errors = e.timed_out
                    stats.seconds = time.monotonic() - t0
                    raise RewardPluginError(
                        f"reward plug-in {self.reward} timed out on {e.in_a_row} responses in a row (no reward within {self.timeout_s:g} s "
                        "each): it hangs or is too slow; fix the function (docs/rewards.md)", stats) from None
                except BaseException:
                    self._holder.kill()
                    raise
        scores: list[Score] = []
        first: str | None = None
        for i, response in enumerate(responses):
            extracted = extract_answer(response)  # (what maj@n votes on)
            status, value = outcomes[i]
            if status == "ok" and value[0] == "ok":
                reward = float(value[1])
                scores.append(Score(reward, reward > 0, extracted, "ok"))
                continue
            if status == "timeout":
                stats.timeouts += 1
                first = first or f"no reward within {self.timeout_s:g} s (timeout)"
            else:
                stats.errors += 1
                first = first or (value[1] if status == "ok" else "its worker process died (or the pool did not start)")
                status = "error"
            scores.append(Score.failed(extracted, status))
        stats.reward_errors = stats.timeouts + stats.errors
        stats.seconds = time.monotonic() - t0
        if stats.reward_errors == n:
            raise RewardPluginError(f"reward plug-in {self.reward} failed on all {n} responses of this batch; the first: {first}: "
                                    "fix the function (docs/rewards.md: FUNCTION(response, ground_truth, **info) -> float | bool)", stats)
        return scores, stats

    def equivalent(
        self, pairs: Sequence[tuple[str, str | int]], stats: ScoreStats | None = None
    ) -> list[bool | None]:
        """Whether each answer pair ``(a, b)`` is equivalent, by the reward's rule, with its time limit.

        The comparison :meth:`score_batch` makes between an extracted answer ``a`` and a ground
        truth ``b`` (decided by rule in this process: integers as integers, foreign words wrong; else math-verify in
        the pool with ``timeout_s`` per pair); majority voting asks it of two answers. Identical
        pairs are decided once. Returns True / False per pair, or None when math-verify ran past
        its time limit or failed (counted in ``stats.timeouts`` / ``stats.errors``, items like
        every count of ``stats``, which is added to when given). Never raises for a pair.
        """
        stats = ScoreStats() if stats is None else stats
        t0 = time.monotonic()
        keys = [(str(a), str(b)) for a, b in pairs]
        decided: dict[_Key, bool | None] = {key: decide_by_rule(*key) for key in keys}
        pending = [key for key, ok in decided.items() if ok is None]
        status: dict[_Key, ScoreStatus] = {}
        if pending:
            stats.verifier_calls += len(pending)
            with self._lock:
                outcomes = self._verify_all(pending, stats)
            for key, (st, ok) in outcomes.items():
                status[key] = st
                decided[key] = ok if st == "ok" else None
        for key in keys:
            stats.total += 1
            if key not in status:
                stats.fast_path += 1
                continue
            stats.verified += 1
            stats.timeouts += status[key] == "timeout"
            stats.errors += status[key] not in ("ok", "timeout")
        stats.seconds += time.monotonic() - t0
        return [decided[key] for key in keys]

    def _verify_all(self, keys: list[_Key], stats: ScoreStats) -> dict[_Key, tuple[ScoreStatus, bool]]:
        if self.num_workers == 0:
            out: dict[_Key, tuple[ScoreStatus, bool]] = {}
            for key in keys:
                try:
                    out[key] = ("ok", math_verify_equivalent(*key))
                except Exception:  # noqa: BLE001
                    out[key] = ("error", False)
            return out
        try:
            return self._run_in_pool(keys, stats)
        except BaseException:
            # KeyboardInterrupt, or a bug: leave no worker running and nothing half-done.
            self._holder.kill()
            raise

    def _run_in_pool(self, keys: list[Any], stats: ScoreStats, task: Any = None,
                     hung_after: int | None = None) -> dict[Any, tuple[ScoreStatus, Any]]:
        """The scheduling loop: at most ``num_workers`` items in flight, each with a deadline.

        ``task(key)`` gives the worker function and its arguments (default: math-verify of the
        (answer, ground truth) pair ``key``); an item's value is what that function returned.

        An item past its deadline scores "timeout" and dooms the pool (its worker cannot be
        interrupted), but the items in flight beside it keep running to their own deadlines (they
        started about together: they finish, or time out in the same round); nothing new is handed
        out meanwhile, and then the pool is killed once. ``hung_after``: raise :class:`_Hung` (the
        pool killed) at that many timeouts in a row, counted over calls (a plug-in's)."""
        task = task or (lambda key: (_worker_verify, key))
        results: dict[Any, tuple[ScoreStatus, Any]] = {}
        queue: collections.deque[_Key] = collections.deque(keys)
        suspects: set[_Key] = set()  # were in flight when a worker died: rerun alone
        inflight: dict[Future[bool], tuple[_Key, float]] = {}
        broken_submits = 0
        draining = False  # an item timed out: the pool is killed once the others in flight are done or timed out
        timed_out = 0

        def answered(key: Any, outcome: tuple[ScoreStatus, Any]) -> None:
            nonlocal timed_out
            results[key] = outcome
            if hung_after is None:
                return
            if outcome[0] != "timeout":
                self._timeouts_in_a_row = 0
                return
            timed_out += 1
            self._timeouts_in_a_row += 1

        def restart() -> None:
            self._holder.kill()
            stats.pool_restarts += 1

        while queue or inflight:
            # Hand out work to idle workers.
            while queue and len(inflight) < self.num_workers and not draining:
                key = queue[0]
                solo_running = any(k in suspects for k, _ in inflight.values())
                if solo_running or (key in suspects and inflight):
                    break
                try:
                    pool = self._ensure_pool()
                except _PoolStartError as e:
                    log.warning("%s; %d answers scored as errors", e, len(queue))
                    while queue:
                        results[queue.popleft()] = ("error", False)
                    break
                try:
                    fn, args = task(key)
                    fut = pool.executor.submit(fn, *args)
                except (BrokenProcessPool, RuntimeError):
                    # The pool broke between two submits (a worker died while idle): restart it,
                    # and rerun what was in flight one at a time. Give up after a few tries.
                    restart()
                    broken_submits += 1
                    for f in list(inflight):
                        k, _ = inflight.pop(f)
                        queue.appendleft(k)
                        suspects.add(k)
                    if broken_submits >= 3:
                        log.warning("verifier pool keeps breaking; %d answers scored as errors", len(queue))
                        while queue:
                            results[queue.popleft()] = ("error", False)
                    continue
                queue.popleft()
                inflight[fut] = (key, time.monotonic() + self.timeout_s)
            if not inflight:
                if draining:
                    draining = False
                    restart()
                continue

            next_deadline = min(d for _, d in inflight.values())
            done, _ = wait(
                list(inflight), timeout=max(0.0, next_deadline - time.monotonic()),
                return_when=FIRST_COMPLETED,
            )
            crashed: list[_Key] = []
            for fut in done:
                key, _ = inflight.pop(fut)
                try:
                    answered(key, ("ok", fut.result()))
                except BrokenProcessPool:
                    crashed.append(key)
                except Exception:  # noqa: BLE001 - the verifier raised in the worker
                    answered(key, ("error", False))
            if crashed:
                # A worker died: every future of the pool fails. Alone in flight -> its fault;
                # otherwise rerun the items one at a time to find out. (While draining, the pool
                # was doomed anyway: the timed-out worker may be the one that died.)
                crashed += [k for k, _ in inflight.values()]
                inflight.clear()
                restart()
                draining = False
                if len(crashed) == 1:  # it was alone in flight: it killed its worker
                    answered(crashed[0], ("error", False))
                else:
                    for k in reversed(crashed):
                        queue.appendleft(k)
                        suspects.add(k)
                continue

            now = time.monotonic()
            expired = [f for f, (_, d) in inflight.items() if d <= now and not f.done()]
            for fut in expired:
                # The stuck worker cannot be interrupted: the pool is killed once the items running
                # next to it are answered or past their own deadlines (see the docstring).
                key, _ = inflight.pop(fut)
                answered(key, ("timeout", False))
                draining = True
            if hung_after is not None and self._timeouts_in_a_row >= hung_after:
                in_a_row, self._timeouts_in_a_row = self._timeouts_in_a_row, 0
                restart()
                raise _Hung(in_a_row, timed_out)
            if draining and not inflight:
                draining = False
                restart()
        return results

