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
one (none once it has finished, with ``--drop-checkpoints``). ``--jobs N`` runs N at once; ``--dry-run`` prints the command lines instead (one per line, in
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

This module is the stage: its options and ``run_ablate``, which composes the machinery in
``reasonrl.stages.ablation``: ``plan`` (what runs), ``jobs`` (running it), ``stats`` (ablation.json's
numbers) and ``table`` (the console's tables).
"""

from __future__ import annotations

import json
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.artifacts import write_json, write_manifest
from reasonrl.config import check, opt, parse_sets, to_dict
from reasonrl.errors import ReasonRLError
from reasonrl.interrupts import last_write
from reasonrl.rundir import claim, releases_claims
from reasonrl.stages.ablation.jobs import Job, drop_checkpoints, make_jobs, run_jobs
from reasonrl.stages.ablation.plan import CRITICS, OUTPUTS, PRESETS, Plan, check_key, make_plan
from reasonrl.stages.ablation.stats import summarise
from reasonrl.stages.ablation.table import print_table
from reasonrl.stages.options import ProgressOpts


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
    drop_checkpoints: bool = opt(False, "Delete each train run's checkpoints/ once it has finished (its policy/, metrics, validation and rollouts stay), "
                                        "and those of runs finished before: the newest is kept otherwise, ~1.6 GB a run for SmolLM2-135M, twice that "
                                        "with a critic. A finished run is never resumed; a stopped one keeps its checkpoint.")
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
        check(not (self.collect and (self.dry_run or self.sets or self.drop_checkpoints)), "--collect only reads the runs: drop --dry-run, --set and --drop-checkpoints")
        check(not (self.dry_run and self.drop_checkpoints), "--dry-run writes and deletes nothing: drop --drop-checkpoints (give it to the run that runs the plan)")
        for k in parse_sets(self.sets):
            check_key(k, "--set")
        if self.collect:
            self.out = self.collect


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
        on_done = drop_checkpoints if cfg.drop_checkpoints else None
        if on_done is not None and sum(drop_checkpoints(j) for j in skipped):
            say("--drop-checkpoints: the finished runs' checkpoints deleted")
        try:
            run_jobs(job_list, cfg.jobs, say, on_done)
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
            with last_write():  # (a SIGTERM or Ctrl-C from here on is only noted: the run is finished, exit 0)
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
