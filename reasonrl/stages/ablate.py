"""`reasonrl ablate`: the papers' ablation tables as a command, a driver over ordinary `train` runs.

An ablation is a ladder of *rungs* (each a name plus `train` overrides) over a base recipe, run for
several seeds. Every rung × seed is a normal `train` run directory, ``out/<rung>/seed-<k>/``, made
by a subprocess running the same CLI (``python -m reasonrl.cli train --config BASE --set … --seed k
--out …``), with validation on; rungs that need a value-pretrained critic (VC-PPO) use
``out/_critic/seed-<k>/``, a `pretrain-value` run made first, once per seed. Runs of one seed share
``--seed`` (the data order and the sampling seeds), so the rungs' differences are paired.

A rerun of the same command skips finished runs (their ``manifest.json``), resumes crashed ones
(``--resume`` from their last checkpoint; ``--overwrite`` for one that stopped before its first
checkpoint, which holds nothing to resume), and starts the others. Each train run checkpoints at its
validation steps (unless the recipe or ``--set save_every`` says otherwise) and keeps the newest
one. ``--jobs N`` runs N at once; ``--dry-run`` prints the command lines instead (one per line, in
an order that runs: critics first), for a cluster's scheduler, and writes nothing but a new
directory's ``plan.json``; ``--collect DIR`` builds the table
from whatever finished.

Outputs in ``out/``: ``plan.json`` (the rungs, seeds and each run's command; written first),
``logs/<run>.log`` (each run's console, appended across reruns), ``ablation.json`` (the table) and
``manifest.json`` last, once every run has finished. The table, per rung: final and best
validation avg@n (the mean over seeds, with a 95% interval for the crossed design, every seed
scored on the same problems: ``crossed_mean_ci``, seeds and problems both random), the area under the validation curve, final entropy, clip fractions, response length and
truncation, dynamic-sampling rounds, seconds per step; and the difference to the previous rung,
paired by seed and problem, with its interval (``reasonrl.evaluation.scores``). The per-problem
values come from each run's ``validation.jsonl``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reasonrl.artifacts import MANIFEST, step_records, write_json, write_manifest
from reasonrl.config import check, check_seed, load_recipe, opt, parse_sets, to_dict
from reasonrl.errors import ReasonRLError
from reasonrl.rundir import claim, releases_claims
from reasonrl.stages.options import ProgressOpts

#: What `ablate` writes in its directory besides the runs (each run directory is its stage's own).
OUTPUTS = ("plan.json", "ablation.json", "logs")
CRITICS = "_critic"
#: Keys of a run that the driver sets itself (each from its own option), never a rung or --set.
DRIVER_KEYS = {"out": "each run's directory is out/<rung>/seed-<k>", "seed": "use --seeds", "steps": "use --steps", "val_every": "use --val-every",
               "resume": "a rerun resumes crashed runs by itself", "overwrite": "finished runs are kept; choose another --out to start over"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Rung:
    """One row of the table: ``train`` overrides (recipe keys: ``algo``, ``algo.eps_high``, …) and
    whether its runs take the seed's value-pretrained critic (``--critic out/_critic/seed-<k>``)."""

    name: str
    sets: dict[str, Any]
    pretrained_critic: bool = False


@dataclass(frozen=True)
class Preset:
    base: str  # the train recipe, a file of the shipped recipes (stages/)
    rungs: tuple[Rung, ...]
    critic_base: str = "pretrain-value-cpu.toml"
    about: str = ""
    critic: tuple[tuple[str, Any], ...] = ()  # the critics' pretrain-value overrides (a spec's [critic] table)


def _ladder(start: dict[str, Any], steps: list[tuple[str, dict[str, Any]]], first: str) -> tuple[Rung, ...]:
    """Rungs that each add their overrides to every one before (the paper's cumulative order)."""
    rungs, acc = [Rung(first, dict(start))], dict(start)
    for name, add in steps:
        acc = {**acc, **add}
        rungs.append(Rung(name, dict(acc)))
    return tuple(rungs)


CRITIC_STEPS = (("steps", 8),)
PRESETS: dict[str, Preset] = {
    # DAPO (arXiv 2503.14476) table 1: naive GRPO, then each technique added in the paper's order;
    # the last rung is the dapo row.
    "dapo": Preset("train-dapo-cpu.toml", _ladder({"algo": "grpo"}, [
        ("overlong-filter", {"algo.overlong_filter": True}),
        ("clip-higher", {"algo.eps_high": 0.28}),
        ("soft-overlong", {"algo.overlong_penalty": True}),
        ("token-mean", {"algo.loss_agg": "token-mean"}),
        ("dynamic-sampling", {"algo.dynamic_sampling": True}),
    ], "grpo"), about="DAPO's ladder: naive GRPO → + overlong filtering → + clip-higher → + soft overlong punishment → + token-level loss → + dynamic sampling"),
    # VC-PPO (arXiv 2503.01491): PPO with a fresh critic, + value pretraining, + decoupled GAE (the vcppo row).
    # Its critic is pretrained for 8 steps (128 responses of the fixed policy), not the main job's 2
    # (a smoke-sized 32): VC-PPO pretrains the value model until its loss settles.
    "vcppo": Preset("train-vcppo-cpu.toml", (
        Rung("ppo", {"algo": "ppo", "critic": None}),
        Rung("value-pretraining", {"algo": "ppo"}, pretrained_critic=True),
        Rung("decoupled-gae", {"algo": "vcppo"}, pretrained_critic=True),
    ), about="VC-PPO: PPO → + value pretraining → + decoupled GAE (λ_critic 1)", critic=CRITIC_STEPS),
    # VC-PPO's λ_actor ablation, on the vcppo row (pretrained critic, λ_critic 1).
    "lambda": Preset("train-vcppo-cpu.toml", tuple(Rung(f"lam-{x}", {"algo": "vcppo", "algo.lam_actor": x}, pretrained_critic=True)
                                                  for x in (0.9, 0.95, 0.99, 1.0)), about="VC-PPO's λ_actor ∈ {0.9, 0.95, 0.99, 1.0}, λ_critic 1, pretrained critic",
                     critic=CRITIC_STEPS),
}


@dataclass
class AblateConfig(ProgressOpts):
    preset: str = opt("", f"A shipped ladder: {', '.join(PRESETS)} (docs/ablations.md); or pass --spec.")
    spec: str = opt("", "A TOML spec: base (a train recipe), seeds, [train] overrides for every run, [[rung]] tables (name plus train overrides); see docs/ablations.md.")
    out: str = opt("runs/ablate", "Ablation directory: <rung>/seed-<k>/ (train runs), _critic/seed-<k>/, logs/, plan.json, ablation.json, manifest.json.")
    collect: str = opt("", "Build the table of the ablation in this directory from whatever finished; runs nothing.")
    seeds: int | None = opt(None, "Seeds 0 … K-1 (default: the spec's seeds, else 3).")
    steps: int | None = opt(None, "Training steps of every run (default: the base recipe's).")
    val_every: int | None = opt(None, "Validate every N steps (default: the base recipe's --val-every; when it has none, at step 0 and at the last step).")
    jobs: int = opt(1, "Runs at once, each its own process.")
    dry_run: bool = opt(False, "Print each run's command line (one per line, critics first) and run nothing; plan.json is written for --collect "
                               "into a directory without one (nothing else is written or removed).")
    bootstrap: int = opt(1000, "Bootstrap resamples for the table's intervals.")
    sets: list[str] = opt([], "train overrides for every run (--set key=value, repeatable); a rung's own overrides win.")

    def __post_init__(self) -> None:
        given = [k for k in ("preset", "spec", "collect") if getattr(self, k)]
        check(len(given) == 1, f"--{' and --'.join(given)} conflict: give one" if given
              else "give one of --preset (dapo, vcppo, lambda), --spec FILE.toml or --collect DIR")
        check(not self.preset or self.preset in PRESETS, f"unknown --preset '{self.preset}': choose one of {', '.join(PRESETS)} (or write a --spec)")
        check(self.seeds is None or self.seeds >= 1, "seeds must be >= 1")
        check(self.steps is None or self.steps >= 1, "steps must be >= 1")
        check(self.val_every is None or self.val_every >= 1, "val_every must be >= 1: the table is made of validation curves")
        check(self.jobs >= 1, "jobs must be >= 1")
        check(self.bootstrap >= 1, "bootstrap must be >= 1")
        check(not (self.collect and (self.dry_run or self.sets)), "--collect only reads the runs: drop --dry-run and --set")
        for k in parse_sets(self.sets):
            _check_key(k, "--set")
        if self.collect:
            self.out = self.collect


def _check_key(key: str, where: str, own: tuple[str, ...] = ()) -> None:
    """A key the driver sets itself (``own``: those the table may set) is a one-line error."""
    k = key.replace("-", "_")
    if k in DRIVER_KEYS and k not in own:
        raise ReasonRLError(f"{where} {key}: ablate sets '{k}' itself ({DRIVER_KEYS[k]})")


# ----------------------------------------------------------------------------------------------- the plan


@dataclass
class Plan:
    """What an ablation runs: the base recipes, the rungs, the seeds, the overrides of every run."""

    base: Path
    critic_base: Path
    rungs: list[Rung]
    seeds: list[int]
    sets: dict[str, str]  # every run's train overrides (formatted as --set values)
    critic_sets: dict[str, str]  # the critics' pretrain-value overrides
    steps: int = 0
    val_every: int = 0
    save_every: int = 0  # each train run's checkpoint interval (resumable: not part of what())
    keep_last: int = 0
    source: str = ""  # "preset dapo" or the spec file

    def rung(self, name: str) -> Rung:
        return next(r for r in self.rungs if r.name == name)

    def what(self) -> dict[str, Any]:
        """The plan without its seeds: a rerun must keep it (finished runs are not rerun)."""
        return {"base": str(self.base), "critic_base": str(self.critic_base), "sets": self.sets, "critic_sets": self.critic_sets,
                "rungs": [{"name": r.name, "sets": {k: _fmt(v) for k, v in r.sets.items()}, "pretrained_critic": r.pretrained_critic}
                          for r in self.rungs], "steps": self.steps, "val_every": self.val_every}


def _fmt(v: Any) -> str:
    """A TOML value as a --set value (the same string the run's CLI parses)."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return ",".join(_fmt(x) for x in v)
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _recipe(name: str, near: Path | None, what: str) -> Path:
    """A recipe file: a path (relative to ``near``, the spec's folder), else a shipped recipe."""
    from reasonrl.stages.main_job import recipes_dir

    for p in ([near / name] if near is not None else []) + [Path(name), recipes_dir() / name]:
        if p.is_file():
            return p.resolve()
    raise ReasonRLError(f"{what} recipe {name} not found (as a path, or in the shipped recipes {recipes_dir()}): fix the spec's {what}")


def _rung(t: Any, i: int) -> Rung:
    if not isinstance(t, dict):
        raise ReasonRLError(f"spec: rung {i + 1} must be a table: [[rung]] name = \"…\" plus train overrides")
    t = dict(t)
    name = t.pop("name", None)
    pre = t.pop("pretrained_critic", False)
    if not isinstance(name, str) or not name:
        raise ReasonRLError(f"spec: rung {i + 1} has no name: give each [[rung]] a name = \"…\"")
    if not isinstance(pre, bool):
        raise ReasonRLError(f"spec: rung {name}: pretrained_critic must be true or false")
    return Rung(name, _flat(t, f"spec: rung {name}:"), pre)


def _flat(t: dict[str, Any], where: str, own: tuple[str, ...] = ()) -> dict[str, Any]:
    """A table of train overrides, its sub-tables ([algo] …) as dotted keys (algo.eps_high)."""
    out: dict[str, Any] = {}
    for k, v in t.items():
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in v.items()})
        else:
            out[k] = v
    for k in out:
        _check_key(k, where, own)
    return out


def load_spec(path: str) -> dict[str, Any]:
    """A spec file's keys (checked): base, critic_base, seeds, steps, val_every, train, critic, rung."""
    p = Path(path)
    if not p.is_file():
        raise ReasonRLError(f"spec {p} not found: pass an existing TOML file to --spec (docs/ablations.md)")
    raw = load_recipe(p)
    known = {"base", "critic_base", "seeds", "steps", "val_every", "train", "critic", "rung"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ReasonRLError(f"spec {p}: unknown key '{unknown[0]}'; known: {', '.join(sorted(known))}")
    if not isinstance(raw.get("base"), str):
        raise ReasonRLError(f"spec {p} has no base: give base = \"train-dapo-cpu.toml\" (a train recipe)")
    rungs = raw.get("rung")
    if not isinstance(rungs, list) or not rungs:
        raise ReasonRLError(f"spec {p} has no rungs: add [[rung]] tables, each a name plus train overrides")
    seeds = raw.get("seeds", 3)
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        seeds = list(range(seeds)) if seeds >= 1 else []
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
        raise ReasonRLError(f"spec {p}: seeds must be a count >= 1 or a list of seeds >= 0")
    for k in ("train", "critic"):
        if not isinstance(raw.get(k, {}), dict):
            raise ReasonRLError(f"spec {p}: [{k}] must be a table of overrides")
    for k in ("steps", "val_every"):
        if k in raw and (not isinstance(raw[k], int) or isinstance(raw[k], bool) or raw[k] < 1):
            raise ReasonRLError(f"spec {p}: {k} must be an integer >= 1")
    return {**raw, "seeds": seeds, "rung": [_rung(t, i) for i, t in enumerate(rungs)], "near": p.resolve().parent,
            "train": _flat(raw.get("train", {}), f"spec {p}: [train]"), "critic": _flat(raw.get("critic", {}), f"spec {p}: [critic]", own=("steps",))}


def make_plan(cfg: AblateConfig) -> Plan:
    """The plan of ``cfg`` (a preset or a spec, with its options), every run's train config
    validated as its subprocess will build it: a bad rung or --set is a one-line error here."""
    if cfg.preset:
        pre = PRESETS[cfg.preset]
        spec: dict[str, Any] = {"base": pre.base, "critic_base": pre.critic_base, "rung": list(pre.rungs), "seeds": list(range(3)), "near": None,
                                "train": {}, "critic": dict(pre.critic)}
        source = f"preset {cfg.preset}"
    else:
        spec, source = load_spec(cfg.spec), cfg.spec
    rungs: list[Rung] = spec["rung"]
    names = [r.name for r in rungs]
    taken = {*OUTPUTS, MANIFEST, "report"}
    for n in names:
        check(bool(_NAME.match(n)) and n not in taken, f"rung name '{n}' must be letters, digits, '.', '_' or '-', start with a letter or digit, "
                                                        f"and not be one of {', '.join(sorted(taken))}")
    dup = sorted({n for n in names if names.count(n) > 1})
    check(not dup, f"rung name '{dup[0] if dup else ''}' is used twice: give each rung its own name")
    sets = {k: _fmt(v) for k, v in spec["train"].items()}
    sets.update(parse_sets(cfg.sets))
    base = _recipe(spec["base"], spec["near"], "base")
    plan = Plan(base=base, critic_base=base, rungs=rungs, seeds=list(range(cfg.seeds)) if cfg.seeds else list(spec["seeds"]), sets=sets,
                critic_sets={}, source=source)
    for s in plan.seeds:
        check_seed(s, "a seed")
    check(len(set(plan.seeds)) == len(plan.seeds), "the spec's seeds repeat: give each seed once")
    if any(r.pretrained_critic for r in rungs):
        from reasonrl.stages.pretrain_value import PretrainValueConfig

        plan.critic_base = _recipe(spec.get("critic_base", "pretrain-value-cpu.toml"), spec["near"], "critic_base")
        known = {f.name for f in dataclasses.fields(PretrainValueConfig)} - {"steps"}
        plan.critic_sets = {k: v for k, v in sets.items() if k in known}  # (data, model, engine, … as the runs')
        plan.critic_sets.update({k: _fmt(v) for k, v in spec["critic"].items()})
        critic_config(plan, plan.seeds[0], Path(cfg.out))
    first = train_config(plan, rungs[0], plan.seeds[0], Path(cfg.out), steps=cfg.steps or spec.get("steps"), val_every=None)
    if not Path(first.data).exists():
        raise ReasonRLError(f"--set data: {first.data} not found (the base recipe's or --set data): pass --set data=DIR, a `reasonrl prepare-data` directory")
    plan.steps = first.steps
    plan.val_every = cfg.val_every or spec.get("val_every") or first.val_every or first.steps
    # a run stopped mid-way (a session's end, a preempted node) resumes from its last checkpoint: without
    # one of the recipe's, every validation step writes one, and only the newest is kept
    plan.save_every, plan.keep_last = first.save_every or plan.val_every, first.keep_last or 1
    for r in rungs:
        train_config(plan, r, plan.seeds[0], Path(cfg.out))
    return plan


def _layers(recipe: Path, stage: str, cls: type, sets: dict[str, str], explicit: dict[str, Any]) -> Any:
    from reasonrl.config import build_config, recipe_layer

    try:
        return build_config(cls, recipe_layer(load_recipe(recipe), stage, cls), sets, explicit)
    except ReasonRLError as e:
        raise ReasonRLError(f"{stage} run: {str(e).splitlines()[0]}") from None


def train_config(plan: Plan, rung: Rung, seed: int, out: Path, *, steps: int | None = -1, val_every: int | None = -1) -> Any:
    from reasonrl.stages.train import TrainConfig

    explicit = _train_options(plan, rung, seed, out, steps=plan.steps if steps == -1 else steps, val_every=plan.val_every if val_every == -1 else val_every)
    try:
        return _layers(plan.base, "train", TrainConfig, run_sets(plan, rung), explicit)
    except ReasonRLError as e:
        raise ReasonRLError(f"rung {rung.name}: {e}") from None


def critic_config(plan: Plan, seed: int, out: Path) -> Any:
    from reasonrl.stages.pretrain_value import PretrainValueConfig

    return _layers(plan.critic_base, "pretrain-value", PretrainValueConfig, plan.critic_sets, {"seed": seed, "out": str(critic_dir(out, seed))})


def run_sets(plan: Plan, rung: Rung) -> dict[str, str]:
    """A run's --set overrides: every run's, then the rung's (which win)."""
    return {**plan.sets, **{k: _fmt(v) for k, v in rung.sets.items()}}


def run_dir(out: Path, rung: str, seed: int) -> Path:
    return out / rung / f"seed-{seed}"


def critic_dir(out: Path, seed: int) -> Path:
    return out / CRITICS / f"seed-{seed}"


def _train_options(plan: Plan, rung: Rung, seed: int, out: Path, *, steps: int | None, val_every: int | None) -> dict[str, Any]:
    opts: dict[str, Any] = {"seed": seed, "out": str(run_dir(out, rung.name, seed))}
    if steps:
        opts["steps"] = steps
    if val_every:
        opts["val_every"] = val_every
    if plan.save_every:
        opts["save_every"], opts["keep_last"] = plan.save_every, plan.keep_last
    if rung.pretrained_critic:
        opts["critic"] = str(critic_dir(out, seed))
    return opts


# ----------------------------------------------------------------------------------------------- the runs


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
            opts = _train_options(plan, r, s, out, steps=plan.steps, val_every=plan.val_every)
            argv = _cli("train", "--config", plan.base, *_set_args(run_sets(plan, r)),
                        *[a for k, v in opts.items() for a in ("--" + k.replace("_", "-"), v)],
                        *(["--resume"] if st == "resume" else ["--overwrite"] if st == "restart" else []))
            jobs.append(Job("train", r.name, s, d, argv, logs / f"{r.name}-seed-{s}.log", needs=critics.get(s) if r.pretrained_critic else None, start=st))
    for j in jobs:
        if j.start == "finished":
            j.status = "skipped"
    return jobs


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


def run_jobs(jobs: list[Job], n: int, say: Any) -> None:
    """Run the pending jobs, ``n`` at once, each after the job it needs; a failure is recorded and
    the others go on (a job whose critic failed is blocked). A SIGTERM or SIGINT to the driver is
    passed on to the running runs (each stops at a step boundary with a checkpoint), then waited for;
    a SIGKILL to the driver kills them too (:func:`die_with_driver`)."""
    pending = [j for j in jobs if j.status == "pending"]
    running: list[Job] = []
    total = len(pending)
    started = 0
    tie = die_with_driver()
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
                    j.proc = subprocess.Popen(j.argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=tie)
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
        raise


# ----------------------------------------------------------------------------------------------- the table


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The step records of a .jsonl file (``reasonrl.artifacts.step_records``; a torn or foreign line is skipped)."""
    try:
        return [rec for _, rec in step_records(path)[0]]
    except OSError:
        return []


def _mean(xs: list[float]) -> float:
    return math.fsum(xs) / len(xs) if xs else math.nan


def _trapezoid(steps: list[int], ys: list[float]) -> float:
    """The area under (steps, ys) over the steps' span, divided by the span: the curve's mean level
    (a single point: its value)."""
    if len(steps) == 1:
        return ys[0]
    area = math.fsum((steps[i + 1] - steps[i]) * (ys[i] + ys[i + 1]) / 2 for i in range(len(steps) - 1))
    return area / (steps[-1] - steps[0])


def run_stats(d: Path) -> dict[str, Any] | None:
    """A finished run's numbers for the table: its validation curve (``validation.jsonl``: per
    problem) and its training metrics (``metrics.jsonl``), or None when it has no validation."""
    from reasonrl.train.checkpoint import latest_checkpoint

    val = sorted(read_jsonl(d / "validation.jsonl"), key=lambda r: r["step"])
    key = next((k for r in val for k in r if re.fullmatch(r"avg@\d+", k)), None)
    val = [r for r in val if key and isinstance(r.get(key), list) and r[key] and isinstance(r.get("where"), list) and len(r["where"]) == len(r[key])]
    if not val or key is None:
        return None
    where = val[-1]["where"]
    val = [r for r in val if r["where"] == where]  # (always: one run validates one set of problems)
    curve = [(r["step"], [float(x) for x in r[key]]) for r in val]
    means = [_mean(v) for _, v in curve]
    best = max(range(len(curve)), key=lambda i: (means[i], -i))  # (the first to reach the best)
    steps = [s for s, _ in curve]
    auc = [_trapezoid(steps, [v[p] for _, v in curve]) for p in range(len(where))]
    metrics = [m for m in read_jsonl(d / "metrics.jsonl") if m["step"] >= 1]

    def avg(k: str) -> float:
        xs = [float(m[k]) for m in metrics if isinstance(m.get(k), (int, float)) and not isinstance(m.get(k), bool)]
        return _mean(xs)

    ent = [float(m["actor/entropy"]) for m in metrics if isinstance(m.get("actor/entropy"), (int, float))]
    return {"metric": key, "where": where, "curve": [[s, _mean(v)] for s, v in curve], "final": curve[-1][1], "final_step": curve[-1][0],
            "best": curve[best][1], "best_step": curve[best][0], "auc": auc, "entropy_final": ent[-1] if ent else math.nan,
            "clipfrac_upper": avg("actor/clipfrac_upper"), "clipfrac_lower": avg("actor/clipfrac_lower"),
            "response_length": avg("rollout/response_length_mean"), "truncated_frac": avg("rollout/truncated_frac"),
            "ds_rounds": avg("rollout/ds_rounds"), "step_s": avg("perf/step_s"),
            "peak_rss_gib": max((float(m["perf/peak_rss_gib"]) for m in metrics if isinstance(m.get("perf/peak_rss_gib"), (int, float))), default=math.nan),
            "checkpoint_mib": _size_mib(latest_checkpoint(d))}


def _size_mib(d: Path | None) -> float:
    """A directory's files in MiB (NaN when there is none: a run's checkpoints may be deleted once it finished)."""
    return math.fsum(f.stat().st_size for f in d.rglob("*") if f.is_file()) / 2**20 if d is not None else math.nan


def _with_ci(per_seed: list[list[float]], n_boot: int, crossed: bool, bounds: tuple[float, float] = (0.0, 1.0)) -> dict[str, Any]:
    """The mean over seeds of each seed's mean over problems. ``crossed`` (every seed scored on the
    same problems, in the same order: ablate's design): ``ci`` is the crossed random-effects
    interval (:func:`~reasonrl.evaluation.scores.crossed_mean_ci`: seeds and problems both random,
    a problem's difficulty shared by the seeds), ``ci_problems`` the bootstrap over the problems of
    their mean over seeds (one draw of problems for all the seeds, the runs taken as fixed). Not
    crossed (runs that validated different problems): the nested design's two-level bootstrap (the
    seeds, then each drawn seed's problems) and the bootstrap over the pooled (seed, problem) values."""
    from reasonrl.evaluation.scores import bootstrap_ci, crossed_mean_ci, two_level_bootstrap_ci

    if crossed:
        ci = crossed_mean_ci(per_seed, bounds=bounds)
        problems = [_mean([v[p] for v in per_seed]) for p in range(len(per_seed[0]))]
    else:
        ci = two_level_bootstrap_ci(per_seed, n_boot=n_boot, seed=0)
        problems = [x for v in per_seed for x in v]
    return {"value": _mean([_mean(v) for v in per_seed]), "ci": list(ci), "ci_problems": list(bootstrap_ci(problems, n_boot=n_boot, seed=0)),
            "design": "crossed" if crossed else "nested", "per_seed": [_mean(v) for v in per_seed]}


def _crossed(stats: list[dict[str, Any]]) -> bool:
    """Whether the runs validated the same problems in the same order (seeds × problems crossed)."""
    return all(st["where"] == stats[0]["where"] for st in stats)


def _paired(after: dict[int, dict[str, Any]], before: dict[int, dict[str, Any]], key: str, n_boot: int) -> dict[str, Any] | None:
    """``after − before`` paired by seed and problem (the seeds both finished, the same problems):
    per seed, the difference on each problem; intervals as :func:`_with_ci`'s over those differences."""
    seeds = [s for s in sorted(after) if s in before and after[s]["where"] == before[s]["where"]]
    if not seeds:
        return None
    diffs = [[float(a) - float(b) for a, b in zip(after[s][key], before[s][key], strict=True)] for s in seeds]
    return {**_with_ci(diffs, n_boot, _crossed([after[s] for s in seeds]), bounds=(-1.0, 1.0)), "problems": sum(map(len, diffs)), "seeds": seeds}


def _steps_differ(after: dict[int, dict[str, Any]], before: dict[int, dict[str, Any]]) -> list[dict[str, int]]:
    """The paired seeds whose final validations are at different steps (early stopping, or another
    ``val_every`` in a run made elsewhere): their Δ final compares two training lengths, and their
    Δ AUC curves of two spans."""
    return [{"seed": s, "final_step": after[s]["final_step"], "previous_final_step": before[s]["final_step"]} for s in sorted(after)
            if s in before and after[s]["where"] == before[s]["where"] and after[s]["final_step"] != before[s]["final_step"]]


def summarise(plan_doc: dict[str, Any], out: Path, jobs: dict[str, Job], n_boot: int) -> dict[str, Any]:
    """ablation.json: one entry per rung (the numbers of its finished runs) and each run's status."""
    rows: list[dict[str, Any]] = []
    prev: dict[int, dict[str, Any]] | None = None
    prev_name = None
    for r in plan_doc["rungs"]:
        stats: dict[int, dict[str, Any]] = {}
        runs: dict[str, Any] = {}
        for s in plan_doc["seeds"]:
            d = run_dir(out, r["name"], s)
            j = jobs.get(f"{r['name']}/seed-{s}")
            finished = state(d, "train") == "finished"
            st = run_stats(d) if finished else None
            status = "finished" if finished else (j.status if j is not None and j.status in ("failed", "blocked") else "unfinished")
            if finished and st is None:
                status = "no validation"
            runs[str(s)] = {"dir": str(d), "status": status, **({"error": j.error} if j is not None and j.error and not finished else {})}
            if st is not None:
                stats[s] = st
        row: dict[str, Any] = {"name": r["name"], "overrides": r["sets"], "pretrained_critic": r["pretrained_critic"], "runs": runs,
                               "seeds_finished": sorted(stats)}
        if stats:
            vals = list(stats.values())
            row["metric"] = vals[0]["metric"]
            crossed = _crossed(vals)
            row["final"] = _with_ci([v["final"] for v in vals], n_boot, crossed)
            row["best"] = _with_ci([v["best"] for v in vals], n_boot, crossed)
            row["auc"] = _with_ci([v["auc"] for v in vals], n_boot, crossed)
            for k in ("entropy_final", "clipfrac_upper", "clipfrac_lower", "response_length", "truncated_frac", "ds_rounds", "step_s", "peak_rss_gib",
                      "checkpoint_mib"):
                row[k] = _mean([v[k] for v in vals])
            row["curves"] = {str(s): v["curve"] for s, v in stats.items()}
            if prev:
                row["vs_previous"] = {"rung": prev_name, "final": _paired(stats, prev, "final", n_boot), "auc": _paired(stats, prev, "auc", n_boot)}
                differ = _steps_differ(stats, prev)
                if differ:
                    row["vs_previous"]["steps_differ"] = differ
        rows.append(row)
        prev, prev_name = stats, r["name"]
    bad = [f"{r['name']}/seed-{s}" for r in rows for s, v in r["runs"].items() if v["status"] in ("failed", "blocked", "no validation")]
    critics = {label: {"dir": str(j.dir), "status": j.status, **({"error": j.error} if j.error else {})} for label, j in jobs.items() if j.stage == "pretrain-value"}
    bad += [k for k, v in critics.items() if v["status"] in ("failed", "blocked")]
    missing = [f"{r['name']}/seed-{s}" for r in rows for s, v in r["runs"].items() if v["status"] == "unfinished"]
    return {"source": plan_doc["source"], "base": plan_doc["base"], "seeds": plan_doc["seeds"], "steps": plan_doc["steps"], "val_every": plan_doc["val_every"],
            "bootstrap": n_boot, "interval": ("95%, seeds × problems crossed (design 'crossed'): the two-way random-effects t interval, Satterthwaite's df "
                                              "(ci; reasonrl.evaluation.scores.crossed_mean_ci); the percentile bootstrap over the problems of their mean over "
                                              "seeds, the runs taken as fixed (ci_problems). Runs on different problems (design 'nested'): the two-level "
                                              "bootstrap, seeds then each seed's problems (ci), and over the pooled values (ci_problems). vs_previous: "
                                              "paired by seed and problem"),
            "rungs": rows, "critics": critics, "failed": bad, "unfinished": missing, "complete": not bad and not missing}


def _pct(m: dict[str, Any] | None, signed: bool = False, ci: bool = True) -> str:
    if not m or m.get("value") is None or not math.isfinite(m["value"]):
        return "-"
    f = "{:+.1f}" if signed else "{:.1f}"
    if not ci:
        return f.format(100 * m["value"])
    lo, hi = m["ci"]
    return f"{f.format(100 * m['value'])} [{f.format(100 * lo)},{f.format(100 * hi)}]"


def _num(x: Any, f: str = "{:.3f}") -> str:
    return f.format(x) if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def print_table(doc: dict[str, Any], console: Any) -> None:
    """Three tables that fit a log's 80 columns: held-out accuracy (the intervals of best and AUC are
    in ablation.json), what the training did, and what it cost."""
    from rich import box
    from rich.table import Table

    metric = next((r["metric"] for r in doc["rungs"] if r.get("metric")), "avg@n")
    acc = Table(title=f"ablation ({doc['source']}): validation {metric} in % [95% CI: seeds × problems]", box=box.SIMPLE_HEAD,
                caption="Δ: to the rung above, paired by seed and problem; AUC: the validation curve's mean level")
    for c in ("rung", "seeds", "final", "best", "AUC", "Δ final"):
        acc.add_column(c, justify="left" if c == "rung" else "right")
    train = Table(title="training (mean over steps and seeds; entropy: the last step's)", box=box.SIMPLE_HEAD)
    for c in ("rung", "entropy", "clip↑", "clip↓", "len", "trunc", "ds rnd"):
        train.add_column(c, justify="left" if c == "rung" else "right")
    cost = Table(title="cost (mean over seeds)", box=box.SIMPLE_HEAD,
                 caption="peak: a run's largest resident memory (trainer and engine); checkpoint: its last one's size (- once deleted)")
    for c in ("rung", "s/step", "peak GiB", "checkpoint MiB"):
        cost.add_column(c, justify="left" if c == "rung" else "right")
    notes = []
    for r in doc["rungs"]:
        bad = [s for s, v in r["runs"].items() if v["status"] not in ("finished", "unfinished")]
        seeds = f"{len(r['seeds_finished'])}/{len(r['runs'])}" + (f" [red]{len(bad)} failed[/]" if bad else "")
        vs = (r.get("vs_previous") or {}).get("final")
        differ = (r.get("vs_previous") or {}).get("steps_differ") or []
        if differ:  # a Δ over two training lengths: marked, and said under the table
            notes.append(f"† {r['name']}: final validations at different steps ("
                         + ", ".join(f"seed {d['seed']}: step {d['final_step']} vs {d['previous_final_step']}" for d in differ) + ")")
        acc.add_row(r["name"], seeds, _pct(r.get("final")), _pct(r.get("best"), ci=False), _pct(r.get("auc"), ci=False),
                    _pct(vs, signed=True) + ("†" if differ else ""))
        train.add_row(r["name"], _num(r.get("entropy_final")), _num(r.get("clipfrac_upper"), "{:.4f}"), _num(r.get("clipfrac_lower"), "{:.4f}"),
                      _num(r.get("response_length"), "{:.1f}"), _num(r.get("truncated_frac"), "{:.2f}"), _num(r.get("ds_rounds"), "{:.2f}"))
        cost.add_row(r["name"], _num(r.get("step_s"), "{:.2f}"), _num(r.get("peak_rss_gib"), "{:.2f}"), _num(r.get("checkpoint_mib"), "{:.1f}"))
    if notes:
        acc.caption = f"{acc.caption}\n" + "\n".join(notes) + " (early stopping, or another val_every: the Δ compares two training lengths)"
    console.print(acc)
    console.print(train)
    console.print(cost)


# ----------------------------------------------------------------------------------------------- the stage


def _plan_doc(plan: Plan, jobs: list[Job]) -> dict[str, Any]:
    return {"source": plan.source, **plan.what(), "seeds": plan.seeds, "runs": [{"run": j.label, "stage": j.stage, "dir": str(j.dir), "command": j.line()} for j in jobs]}


def _read_plan(out: Path) -> dict[str, Any]:
    p = out / "plan.json"
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReasonRLError(f"{out} holds no ablation (no plan.json): run `reasonrl ablate --preset … --out {out}` (or --dry-run) first") from None
    except (OSError, ValueError) as e:
        raise ReasonRLError(f"{p} cannot be read ({e}): rerun `reasonrl ablate` with its --out") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rungs"), list) or not isinstance(doc.get("seeds"), list):
        raise ReasonRLError(f"{p} is corrupt: rerun `reasonrl ablate` with its --out")
    return doc


@releases_claims
def run_ablate(cfg: AblateConfig, console: Any = None) -> dict[str, Any]:
    """Plan, claim ``out``, run (or print) every run, then the table; exit 1 naming failed runs."""
    from rich.console import Console

    console = console or Console()
    err = Console(stderr=True)
    say = (lambda *a, **k: None) if cfg.quiet else err.print
    out = Path(cfg.out)
    plan = make_plan(cfg) if not cfg.collect else None  # every input checked before anything is written
    run = claim(out, stage="ablate", inputs=[plan.base] if plan else [])
    if cfg.collect:
        doc = _read_plan(out)
        jobs = {}
    else:
        assert plan is not None
        old = None
        if (out / "plan.json").is_file():
            old = _read_plan(out)
            changed = [k for k, v in plan.what().items() if old.get(k) != v]
            if changed:
                raise ReasonRLError(f"--out {out} holds an ablation planned differently ({', '.join(changed)} changed): finished runs would not "
                                    "be redone; rerun with its settings or choose another --out")
        job_list = make_jobs(plan, out)
        doc = _plan_doc(plan, job_list)
        if cfg.dry_run:  # its plan, and nothing else: a finished ablation's table and manifest stay
            if old is None:
                with run.writing(("plan.json",)):
                    write_json(out / "plan.json", doc)  # (for --collect)
            elif old.get("seeds") != plan.seeds:
                say(f"{out / 'plan.json'} (seeds {', '.join(map(str, old['seeds']))}) is kept: --collect tables those seeds; once these runs "
                    f"finished, the same command without --dry-run skips them and writes the table of seeds {', '.join(map(str, plan.seeds))}")
            then = f"`reasonrl ablate --collect {out}`" if old is None or old.get("seeds") == plan.seeds else "the same command without --dry-run"
            todo = [j for j in job_list if j.status == "pending"]
            for j in todo:
                sys.stdout.write(j.line() + "\n")
            sys.stdout.flush()
            skipped = len(job_list) - len(todo)
            say(f"{len(todo)} command(s)" + (f"; {skipped} finished run(s) skipped" if skipped else "")
                + (f"; the {CRITICS} ones (pretrain-value) must finish before the runs that use them" if any(j.stage == "pretrain-value" for j in todo) else "")
                + f"; then {then}")
            return {"commands": [j.line() for j in todo], "plan": doc}
        run.clear(("ablation.json",))  # (the manifest first: a stale table never looks finished)
        with run.writing(("plan.json",)):
            write_json(out / "plan.json", doc)
        skipped = [j for j in job_list if j.status == "skipped"]
        say(f"[bold]ablate[/] {plan.source}: {len(plan.rungs)} rung{'s' * (len(plan.rungs) != 1)} × {len(plan.seeds)} seed{'s' * (len(plan.seeds) != 1)}, {plan.steps} steps, validation every {plan.val_every}"
            + (f"; {len(skipped)} finished run(s) skipped" if skipped else "") + f" → {out}")
        try:
            run_jobs(job_list, cfg.jobs, say)
        except KeyboardInterrupt as e:
            from reasonrl.interrupts import Interrupted, signal_name

            signum = getattr(e, "signum", signal.SIGINT)
            stopped = [j.label for j in job_list if j.error == "stopped by the signal"]
            raise Interrupted(signum, f"ablate stopped by {signal_name(signum)}" + (f" (passed on to {', '.join(stopped)})" if stopped else "")
                              + ": no table written; rerun the same command to go on (finished runs are skipped, stopped ones resumed)") from None
        jobs = {j.label: j for j in job_list}
    summary = summarise(doc, out, jobs, cfg.bootstrap)
    run.clear(("ablation.json",))
    with run.writing(("ablation.json",)):
        write_json(out / "ablation.json", summary)
        print_table(summary, console)
        if summary["complete"]:
            write_manifest(out, "ablate", to_dict(cfg), {}, extra={"outputs": [*OUTPUTS, *(r["name"] + "/" for r in doc["rungs"])]})
    if summary["failed"]:
        raise ReasonRLError(f"{len(summary['failed'])} run(s) failed: {', '.join(summary['failed'])} (logs in {out / 'logs'}); "
                            "fix the cause and rerun the same command (finished runs are skipped)")
    if summary["unfinished"]:
        say(f"[yellow]{len(summary['unfinished'])} run(s) not finished: {', '.join(summary['unfinished'][:6])}"
            + (" …" if len(summary["unfinished"]) > 6 else "") + f"; the table holds the finished ones ({out / 'ablation.json'})[/]")
    else:
        say(f"ablation → {out / 'ablation.json'}; curves: `reasonrl report {out} --out {out / 'report'}`")
    return summary
