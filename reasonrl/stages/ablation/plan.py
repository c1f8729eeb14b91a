"""An ablation's plan: the rungs (a preset's ladder or a spec's [[rung]] tables), the seeds, and the
``train`` (and critic ``pretrain-value``) overrides of every run, each run's config built and
checked here as its subprocess will build it; where each run lives (``out/<rung>/seed-<k>/``,
``out/_critic/seed-<k>/``)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.artifacts import MANIFEST
from reasonrl.config import check, check_seed, load_recipe, parse_sets
from reasonrl.errors import ReasonRLError

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
    vs: str | None = None  # a rung above it that its Δ is paired against (None: the rung just above)


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


def check_key(key: str, where: str, own: tuple[str, ...] = ()) -> None:
    """A key the driver sets itself (``own``: those the table may set) is a one-line error."""
    k = key.replace("-", "_")
    if k in DRIVER_KEYS and k not in own:
        raise ReasonRLError(f"{where} {key}: ablate sets '{k}' itself ({DRIVER_KEYS[k]})")


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
                "rungs": [{"name": r.name, "sets": {k: _fmt(v) for k, v in r.sets.items()}, "pretrained_critic": r.pretrained_critic,
                           **({"vs": r.vs} if r.vs else {})} for r in self.rungs], "steps": self.steps, "val_every": self.val_every}


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
    vs = t.pop("vs", None)
    if not isinstance(name, str) or not name:
        raise ReasonRLError(f"spec: rung {i + 1} has no name: give each [[rung]] a name = \"…\"")
    if not isinstance(pre, bool):
        raise ReasonRLError(f"spec: rung {name}: pretrained_critic must be true or false")
    if vs is not None and not isinstance(vs, str):
        raise ReasonRLError(f"spec: rung {name}: vs must be the name of another rung (its Δ is paired against that rung's runs)")
    return Rung(name, _flat(t, f"spec: rung {name}:"), pre, vs)


def _flat(t: dict[str, Any], where: str, own: tuple[str, ...] = ()) -> dict[str, Any]:
    """A table of train overrides, its sub-tables ([algo] …) as dotted keys (algo.eps_high)."""
    out: dict[str, Any] = {}
    for k, v in t.items():
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in v.items()})
        else:
            out[k] = v
    for k in out:
        check_key(k, where, own)
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


def make_plan(cfg: Any) -> Plan:
    """The plan of ``cfg`` (an ``AblateConfig``: a preset or a spec, with its options), every run's train config
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
    for i, r in enumerate(rungs):
        check(r.vs is None or r.vs in names[:i], f"rung {r.name}: vs = '{r.vs}' names no rung above it: give one of "
                                                 f"{', '.join(names[:i]) or '(none: the first rung has nothing to compare with)'}")
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

    explicit = train_options(plan, rung, seed, out, steps=plan.steps if steps == -1 else steps, val_every=plan.val_every if val_every == -1 else val_every)
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


def train_options(plan: Plan, rung: Rung, seed: int, out: Path, *, steps: int | None, val_every: int | None) -> dict[str, Any]:
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
