"""An ablation's runs as processes: each run's command line as of now (``--resume`` for a crashed
train run with a checkpoint, ``--overwrite`` for one without), run N at once, critics first, each
tied to the driver (a SIGTERM passed on, a SIGKILL shared)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from reasonrl import cpu_share
from reasonrl.artifacts import MANIFEST
from reasonrl.devices import resolve_dtype
from reasonrl.stages.ablation.plan import CRITICS, Plan, critic_dir, run_dir, run_sets, train_options

def state(d: Path, stage: str) -> str:
    """What a run directory holds: 'finished' (its stage's manifest), 'resume' (a crashed train run
    with a checkpoint), 'restart' (a crashed run with nothing to resume) or 'new'."""
    from reasonrl.train.checkpoint import latest_checkpoint

    try:
        m = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
        if isinstance(m, dict) and m.get("stage") == stage:
            return "finished"
    except (OSError, ValueError):
        pass
    if stage == "train" and d.is_dir() and latest_checkpoint(d) is not None:
        return "resume"
    return "restart" if d.is_dir() and any(d.iterdir()) else "new"


@dataclass
class Job:
    """One run of the ablation: its command, what it waits for, how it went."""

    stage: str  # train | pretrain-value
    rung: str  # the rung, or _critic
    seed: int
    dir: Path
    argv: list[str]
    log: Path
    needs: "Job | None" = None
    start: str = "new"  # its state when planned: new | restart | resume | finished
    status: str = "pending"  # pending | running | skipped (finished before) | done | failed | blocked (its critic failed)
    rc: int | None = None
    error: str = ""
    seconds: float = 0.0
    proc: Any = field(default=None, repr=False)

    @property
    def label(self) -> str:
        return f"{self.rung}/seed-{self.seed}"

    def line(self) -> str:
        return shlex.join(self.argv)


def _cli(*args: Any) -> list[str]:
    return [sys.executable, "-m", "reasonrl.cli", *[str(a) for a in args]]


def make_jobs(plan: Plan, out: Path) -> list[Job]:
    """Every run, critics first (one per seed that a rung needs), each with its command as of now:
    ``--resume`` for a crashed train run with a checkpoint, ``--overwrite`` for one without."""
    jobs: list[Job] = []
    critics: dict[int, Job] = {}
    logs = out / "logs"
    if any(r.pretrained_critic for r in plan.rungs):
        for s in plan.seeds:
            d = critic_dir(out, s)
            argv = _cli("pretrain-value", "--config", plan.critic_base, *_set_args(plan.critic_sets), "--seed", s, "--out", d)
            critics[s] = Job("pretrain-value", CRITICS, s, d, argv, logs / f"{CRITICS}-seed-{s}.log", start=state(d, "pretrain-value"))
            jobs.append(critics[s])
    for s in plan.seeds:  # seed-major: a partial ablation (a session's time, a cluster's quota) holds whole ladders
        for r in plan.rungs:
            d = run_dir(out, r.name, s)
            st = state(d, "train")
            opts = train_options(plan, r, s, out, steps=plan.steps, val_every=plan.val_every)
            argv = _cli("train", "--config", plan.base, *_set_args(run_sets(plan, r)),
                        *[a for k, v in opts.items() for a in ("--" + k.replace("_", "-"), v)],
                        *(["--dtype", began] if st == "resume" and (began := _began_in_another_dtype(d)) else []),
                        *(["--resume"] if st == "resume" else ["--overwrite"] if st == "restart" else []))
            jobs.append(Job("train", r.name, s, d, argv, logs / f"{r.name}-seed-{s}.log", needs=critics.get(s) if r.pretrained_critic else None, start=st))
    for j in jobs:
        if j.start == "finished":
            j.status = "skipped"
    return jobs


def _began_in_another_dtype(d: Path) -> str | None:
    """The dtype a stopped run began in (its config.json's ``dtype_resolved``) where its ``--dtype auto``
    resolves to another here (a ladder resumed in a later session, or on another node, whose CPU has
    native bf16 where the first had not, or the reverse); else None. A run finishes in the dtype it
    began in: train refuses a resume that would change it, so the resume names it."""
    try:
        cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
        began = cfg["dtype_resolved"] if cfg.get("dtype") == "auto" else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # (train --resume reports a damaged config.json itself)
    return began if isinstance(began, str) and began != resolve_dtype("auto") else None


def drop_checkpoints(job: Job) -> bool:
    """Delete a finished train run's ``checkpoints/`` (what only a resume needs; its ``policy/``,
    metrics, validation and rollouts stay); True when something was deleted. A run that is not
    finished (no manifest: stopped by a signal, failed) keeps them, so that it can be resumed."""
    d = job.dir / "checkpoints"
    if job.stage != "train" or state(job.dir, "train") != "finished" or not d.is_dir():
        return False
    shutil.rmtree(d, ignore_errors=True)
    return True


def _set_args(sets: dict[str, str]) -> list[str]:
    return [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]


def _last_error(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    errs = [ln for ln in lines if ln.startswith("error:")]
    return (errs[-1] if errs else lines[-1] if lines else "")[:300]


def die_with_driver() -> Any:
    """The ``preexec_fn`` that ties a run to the driver: the kernel SIGKILLs it when the driver dies
    (Linux's ``PR_SET_PDEATHSIG``), so a SIGKILLed driver (which runs no cleanup) leaves no run
    training on under PID 1 (a rerun found it "in use by PID …" and started the next runs beside
    it); the run resumes from its last checkpoint on a rerun. A SIGTERM to the driver still stops the
    runs gently (:func:`run_jobs`). The signal comes when the *thread* that started the run ends:
    :func:`run_jobs` starts every run from the driver's thread and waits for them all before it
    returns, so that thread outlives them (an exception out of it ends them, as it should). A driver
    killed before the child set the signal is caught by comparing the parent. None off Linux (no
    equivalent there: the runs then outlive a SIGKILLed driver)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # (looked up here: the child only calls it)
    except (OSError, AttributeError):
        return None
    driver, pr_set_pdeathsig, kill = os.getpid(), 1, int(signal.SIGKILL)

    def preexec() -> None:  # (in the child, between fork and exec: no import, no allocation beyond a call)
        prctl(pr_set_pdeathsig, kill, 0, 0, 0)
        if os.getppid() != driver:  # the driver died before the line above: no signal will come
            os.kill(os.getpid(), kill)

    return preexec


def child_env(n: int, environ: Any) -> dict[str, str]:
    """The runs' environment: ``n`` > 1 runs side by side share the cores, so their OpenMP threads
    yield (``reasonrl.cpu_share``) unless the user chose a wait (``$REASONRL_CPU_WAIT``). Their
    thread count stays every core's (``train``'s default, ``$OMP_NUM_THREADS``), whatever ``n``: it
    orders the floating-point reductions, so a run resumed under another ``--jobs`` is the same run.
    (Measured on 2 cores, the entropy ladder: 2 runs side by side trained ~200-220 tokens/s each
    against 330-350 for one run alone, about the same steps an hour in all.)"""
    return {**environ, **({cpu_share.ENV: "yield"} if n > 1 and cpu_share.ENV not in environ else {})}


def run_jobs(jobs: list[Job], n: int, say: Any, on_done: Callable[[Job], Any] | None = None) -> None:
    """Run the pending jobs, ``n`` at once, each after the job it needs; a failure is recorded and
    the others go on (a job whose critic failed is blocked); ``on_done(job)`` after each that succeeded. A SIGTERM or SIGINT to the driver is
    passed on to the running runs (each stops at a step boundary with a checkpoint), then waited for;
    a SIGKILL to the driver kills them too (:func:`die_with_driver`)."""
    pending = [j for j in jobs if j.status == "pending"]
    running: list[Job] = []
    total = len(pending)
    started = 0
    tie = die_with_driver()
    env = child_env(n, os.environ)
    try:
        while pending or running:
            for j in list(pending):
                if len(running) >= n:
                    break
                if j.needs is not None and j.needs.status in ("pending", "running"):
                    continue
                pending.remove(j)
                if j.needs is not None and j.needs.status in ("failed", "blocked"):
                    j.status, j.error = "blocked", f"its critic {j.needs.label} failed"
                    say(f"[red]{j.label}: not run ({j.error})[/]")
                    continue
                started += 1
                j.log.parent.mkdir(parents=True, exist_ok=True)
                with open(j.log, "a", encoding="utf-8") as f:
                    f.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {j.line()}\n")
                fh = open(j.log, "a", encoding="utf-8")
                try:
                    j.proc = subprocess.Popen(j.argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=tie, env=env)
                finally:
                    fh.close()  # (the child holds its own copy)
                j.status, j.seconds = "running", time.monotonic()
                running.append(j)
                how = {"resume": " (resumed)", "restart": " (started over: it stopped before its first checkpoint)"}.get(j.start, "")
                say(f"[{started}/{total}] {j.label}: {j.stage}{how} → {j.log}")
            for j in list(running):
                rc = j.proc.poll()
                if rc is None:
                    continue
                running.remove(j)
                j.rc, j.seconds = rc, time.monotonic() - j.seconds
                if rc == 0:
                    j.status = "done"
                    say(f"{j.label}: finished in {j.seconds:.0f} s")
                    if on_done is not None:
                        on_done(j)
                else:
                    j.status, j.error = "failed", _last_error(j.log)
                    say(f"[red]{j.label}: FAILED (exit {rc}) {j.error}[/]")
            if pending or running:
                time.sleep(0.2)
    except KeyboardInterrupt:  # SIGINT, or SIGTERM (reasonrl.interrupts.Interrupted): pass it on, wait, then stop
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for j in running:
            try:
                j.proc.send_signal(signal.SIGTERM)  # (one that also got the signal ignores a second within 2 s)
            except OSError:
                pass
        for j in running:
            j.rc = j.proc.wait()
            j.status = "done" if j.rc == 0 else "failed"
            j.error = "" if j.rc == 0 else "stopped by the signal"
            if j.rc == 0 and on_done is not None:  # (it finished before the signal reached it)
                on_done(j)
        raise
