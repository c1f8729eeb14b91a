"""`reasonrl main-job`: the whole recipe on the embedded default, end to end.

prepare-data (bundled arithmetic, integer answers) → pretrain-value (VC-PPO) → train --algo dapo →
eval of the base and the trained policy on the held-out problems (with confidence intervals) →
a few AIME samples, said plainly → ``reasonrl report`` on it all (``out/report/report.html``).
Every stage reads the recipes in ``stages/`` (``*-cpu.toml``) and writes its artifacts under
``out/``; the same commands run one by one give the same result.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.artifacts import write_json
from reasonrl.bundled import bundled
from reasonrl.config import build_config, check, check_seed, load_recipe, opt, recipe_layer
from reasonrl.errors import ReasonRLError
from reasonrl.rundir import claim, releases_claims
from reasonrl.stages.options import RewardOpts, TrackOpts


@dataclass
class MainJobConfig(TrackOpts, RewardOpts):
    model: str = opt("default", "Policy: 'default' (embedded SmolLM2-135M-Instruct) or an HF model directory.")
    data: str = opt("", "Training data file (default: the bundled addition chains data/chains.jsonl; data/addition.jsonl with --template fewshot is the fastest smoke run).")
    template: str | None = opt(None, "Override the prepare-data recipe's prompt template (its default: chains).")
    out: str = opt("runs/main", "Directory for every stage's artifacts (data/, critic/, train/, eval_base/, eval_trained/, eval_aime/).")
    recipes: str = opt("", "Folder of the *-cpu.toml stage recipes (default: the repository's stages/).")
    engine: str = opt("auto", "Generation engine for every stage: auto, vllm or hf.")
    dtype: str | None = opt(None, "Compute dtype for every stage: auto (bf16 where the CPU computes it natively, else fp32), bf16 or fp32 (default: the recipes', else auto).")
    steps: int | None = opt(None, "Override the train recipe's step count.")
    value_steps: int | None = opt(None, "Override the pretrain-value recipe's step count.")
    eval_n: int | None = opt(None, "Override samples per held-out problem.")
    aime_problems: int = opt(2, "AIME problems sampled at the end (0 skips it).")
    seed: int = opt(0, "Seed for every stage.")

    def __post_init__(self) -> None:
        self._check_tracking()
        self._check_reward()
        check_seed(self.seed)
        check(self.aime_problems >= 0, "aime_problems must be >= 0")
        check(self.dtype in (None, "auto", "bf16", "fp16", "fp32"), f"dtype {self.dtype!r}: use auto, bf16, fp16 or fp32")


def paired_deltas(base: dict[str, Any], trained: dict[str, Any], *, seed: int = 0, n_boot: int = 1000) -> dict[str, dict[str, Any]]:
    """trained − base for each avg@n of two evaluations of the same problems, paired by problem
    (``results.json``'s ``per_problem``), with a 95% paired bootstrap interval."""
    from reasonrl.evaluation.scores import paired_difference

    pb, pt = base["per_problem"], trained["per_problem"]
    if pb["where"] != pt["where"]:
        raise ReasonRLError("the base and trained evaluations are not of the same problems: rerun the main job")
    return {k: paired_difference(pt[k], pb[k], n_boot=n_boot, seed=seed) for k in pb if k.startswith("avg@")}


def recipes_dir() -> Path:
    """The stage recipes shipped with the package (the repository's top-level ``stages/``)."""
    from importlib import resources

    return Path(str(resources.files("reasonrl.recipes")))


def _stage_cfg(cls: type, recipes: Path, name: str, stage: str, **over: Any) -> Any:
    if not (recipes / name).is_file():
        raise ReasonRLError(f"recipe {recipes / name} not found: pass --recipes with a folder holding the *-cpu.toml recipes (the repository's stages/)")
    recipe = load_recipe(recipes / name)
    return build_config(cls, recipe_layer(recipe, stage, cls), {k: v for k, v in over.items() if v is not None})


@releases_claims
def run_main_job(cfg: MainJobConfig, console: Any = None) -> dict[str, Any]:
    from rich.console import Console
    from rich.table import Table

    from reasonrl.stages.eval import EvalConfig, run_eval
    from reasonrl.stages.prepare_data import PrepareConfig, print_report, run_prepare
    from reasonrl.stages.pretrain_value import PretrainValueConfig, run_pretrain_value
    from reasonrl.stages.report import ReportConfig, run_report
    from reasonrl.stages.train import TrainConfig, run_train

    console = console or Console()
    t0 = time.perf_counter()
    out = Path(cfg.out)
    claim(out, stage="main-job", inputs=(cfg.model, cfg.data))  # its folder (each stage below claims its own sub-directory)
    recipes = Path(cfg.recipes) if cfg.recipes else recipes_dir()
    data_file = cfg.data or str(bundled("chains.jsonl"))
    common = {"model": cfg.model, "engine": cfg.engine, "dtype": cfg.dtype, "seed": cfg.seed, "quiet": cfg.quiet, "report_to": cfg.report_to,
              "reward": cfg.reward}
    timings: dict[str, float] = {}

    def phase(name: str) -> None:
        timings[name] = time.perf_counter() - t0
        console.rule(f"[bold]{name}[/]  ({timings[name]:.0f} s)")

    phase("1/5 prepare-data")
    prep = _stage_cfg(PrepareConfig, recipes, "prepare-data-cpu.toml", "prepare-data", inputs=[data_file], out=str(out / "data"), overwrite=True, seed=cfg.seed,
                      template=cfg.template, quiet=cfg.quiet)
    print_report(run_prepare(prep, console=console), console)

    phase("2/5 pretrain-value (VC-PPO)")
    pv = _stage_cfg(PretrainValueConfig, recipes, "pretrain-value-cpu.toml", "pretrain-value", data=str(out / "data"), out=str(out / "critic"),
                    overwrite=True, steps=cfg.value_steps, **common)
    run_pretrain_value(pv, console)

    phase("3/5 train --algo dapo")
    tr = _stage_cfg(TrainConfig, recipes, "train-dapo-cpu.toml", "train", data=str(out / "data"), out=str(out / "train"), overwrite=True,
                    steps=cfg.steps, algo="dapo", **common)
    run_train(tr, console)

    phase("4/5 eval: base vs trained on held-out problems")
    ev = dict(dataset=str(out / "data"), n=cfg.eval_n, overwrite=True, max_response_len=tr.max_response_len, **common)
    base = run_eval(_stage_cfg(EvalConfig, recipes, "eval-cpu.toml", "eval", out=str(out / "eval_base"), **ev), console, title="base policy (held-out)")
    ev["model"] = str(out / "train" / "policy")
    trained = run_eval(_stage_cfg(EvalConfig, recipes, "eval-cpu.toml", "eval", out=str(out / "eval_trained"), **ev), console, title="trained policy (held-out)")

    aime = None
    if cfg.aime_problems:
        phase("5/5 eval aime (a few samples)")
        aime = run_eval(_stage_cfg(EvalConfig, recipes, "eval-aime-cpu.toml", "eval", out=str(out / "eval_aime"), dataset="aime",
                                   max_problems=cfg.aime_problems, **{**common, "model": str(out / "train" / "policy")}), console,
                        title="AIME (a few problems)")
    phase("report")
    report = run_report(ReportConfig(runs=[str(out)], out=str(out / "report"), title="reasonrl main job", quiet=cfg.quiet), console)
    total = time.perf_counter() - t0
    # One row per metric, one column per policy: fits 80 columns (a log's width) for any metric set.
    table = Table(title=f"main job: held-out accuracy ({base['problems']} problems × {base['n']} samples)", caption="value [95% bootstrap CI]")
    table.add_column("metric")
    for name in ("base SmolLM2-135M-Instruct" if cfg.model == "default" else f"base {Path(cfg.model).name}", f"after {tr.steps} DAPO steps"):
        table.add_column(name, justify="right")
    for k, v in base["metrics"].items():
        table.add_row(k, *[f"{100 * m['value']:.1f}% [{100 * m['ci'][0]:.1f}, {100 * m['ci'][1]:.1f}]" for m in (v, trained["metrics"][k])])
    console.print(table)
    delta = paired_deltas(base, trained, seed=cfg.seed)
    for k, d in delta.items():
        console.print(f"[bold]paired gain[/] (trained − base, same {d['problems']} problems) {k}: {100 * d['value']:+.1f} points, "
                      f"95% CI [{100 * d['ci'][0]:+.1f}, {100 * d['ci'][1]:+.1f}]" + (" — beyond noise" if d["ci"][0] > 0 else " — within noise"))
    if aime is not None:
        v = next(iter(aime["metrics"].values()))
        console.print(f"AIME: {aime['problems']} problems × {aime['n']} samples, avg@{aime['n']} = {100 * v['value']:.1f}%. "
                      "A 135M model scores about 0 on AIME; this only shows the pipeline runs there.")
    write_json(out / "summary.json", {"delta": delta, "base": base["metrics"], "trained": trained["metrics"], "minutes": total / 60,
                                      "problems": base["problems"], "n": base["n"], "timings_s": timings})
    console.print(f"main job finished in {total / 60:.1f} min; artifacts under {out}/ (summary: {out / 'summary.json'})")
    console.print(f"report: {report.html}")
    return {"base": base, "trained": trained, "delta": delta, "aime": aime, "seconds": total, "timings": timings, "report": str(report.html)}
