"""How reasonrl's OpenMP threads wait, decided before torch loads: the CPU shared gracefully.

torch's CPU build runs its parallel regions on GNU OpenMP (libgomp). Between regions a thread that
has finished its share *spins* (libgomp's default, ``GOMP_SPINCOUNT`` 300,000 iterations) before it
sleeps. On a quiet machine that is the fastest choice: the next region starts without a wake-up.
When another process is busy on one of the cores it is a disaster: the thread sharing a core with the
other process falls behind, and its partner spins on the free core instead of leaving it idle, so the
scheduler never moves the late thread there. Measured on 2 cores with one competing busy process
pinned to core 0 (``bench/vs_trl.py --compete 1``, docs/performance.md#sharing-the-cpu): the fewshot
step went from 12.8 s to 156 s (update 10 s → 125 s). With a short spin (``GOMP_SPINCOUNT=1000``:
tens of microseconds, then sleep) it took 21 s, at a cost when the machine is quiet (17.6 s).

So the wait is chosen once per process, before torch is imported (libgomp reads its environment when
it loads; the engine's own process inherits the choice), from ``$REASONRL_CPU_WAIT``:

- ``auto`` (default): sample the CPU time used by other processes for a fifth of a second; if they use
  half a CPU or more, wait with a short spin (``yield``), else spin (``spin``);
- ``spin``: libgomp's default, fastest on a quiet machine;
- ``yield``: ``GOMP_SPINCOUNT=1000``, for runs that share the machine (``reasonrl ablate --jobs N``
  with N > 1 gives its runs this unless ``$REASONRL_CPU_WAIT`` says otherwise).

A user's own ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is always kept. The thread count is not changed
by load (``OMP_NUM_THREADS`` stays the cores available): it decides the order of floating-point
reductions, and a run must be the same run whatever else the machine is doing (exact resume).
"""

from __future__ import annotations

import os
import time
from collections.abc import MutableMapping

ENV = "REASONRL_CPU_WAIT"
MODES = ("auto", "spin", "yield")
#: libgomp's spin count under ``yield``: about 1000 pause iterations (tens of µs) before a waiting thread sleeps.
SHORT_SPIN = "1000"
#: Other processes' CPU use (in CPUs) from which ``auto`` yields.
BUSY_FROM = 0.5


def _busy_ticks() -> tuple[int, int]:
    """(the machine's busy clock ticks, this process's own) so far (``/proc/stat``, ``/proc/self/stat``)."""
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    busy = sum(cpu[:8]) - cpu[3] - (cpu[4] if len(cpu) > 4 else 0)  # user nice system (idle) (iowait) irq softirq steal
    with open("/proc/self/stat") as f:
        st = f.read().rsplit(")", 1)[1].split()
    return busy, int(st[11]) + int(st[12])  # utime + stime (this process's threads)


def others_busy(window: float = 0.2) -> float:
    """The CPUs used by other processes (and other virtual machines' steal) over ``window`` seconds."""
    b0, s0 = _busy_ticks()
    time.sleep(window)
    b1, s1 = _busy_ticks()
    return max(0, (b1 - b0) - (s1 - s0)) / (os.sysconf("SC_CLK_TCK") * window)


def choose_wait(env: MutableMapping[str, str] | None = None, *, measure=others_busy) -> str:
    """Set libgomp's wait in ``env`` (``os.environ``) as ``$REASONRL_CPU_WAIT`` asks; returns what
    was chosen: ``spin``, ``yield`` or ``user`` (the user's own OpenMP wait settings, untouched).
    Raises ValueError on an unknown mode."""
    env = os.environ if env is None else env
    mode = env.get(ENV, "auto") or "auto"
    if mode not in MODES:
        raise ValueError(f"{ENV}={mode!r}: use one of {', '.join(MODES)}")
    if "OMP_WAIT_POLICY" in env or "GOMP_SPINCOUNT" in env:
        return "user"
    if mode == "auto":
        try:
            mode = "yield" if measure() >= BUSY_FROM else "spin"
        except (OSError, ValueError, IndexError):  # no /proc (not Linux): libgomp's default
            mode = "spin"
    if mode == "yield":
        env["GOMP_SPINCOUNT"] = SHORT_SPIN
    return mode


def split_threads(n: int) -> tuple[int, int]:
    """(the engine process's threads, the trainer's) for ``train --async-steps`` on a CPU with ``n``
    threads when the user chose neither ``--engine-threads`` nor ``--engine-cpus``: half each, the
    trainer taking the odd one. Both processes at ``n`` threads put twice as many spinning threads as
    cores on the machine: measured on 2 cores (``bench/async_steps.py``), steps 2-6 took 180 s
    against 77 s for one thread each, and 73 s for the synchronous loop on both cores."""
    engine = max(1, n // 2)
    return engine, max(1, n - engine)
