"""The Python API: each CLI stage as a function (docs/api.md).

``reasonrl.prepare_data``, ``pretrain_value``, ``rollout``, ``train``, ``evaluate``, ``report`` and
``ablate`` take the stage's config dataclass (the one the CLI builds from its options), or keyword
arguments that build it (``train(model=..., data=..., algo="dapo")``: the option names with ``_``,
checked and coerced as a recipe's keys are; ``recipe="stages/x.toml"`` first, as ``--config``), or a
config and keyword arguments that replace some of its fields. Each runs the stage's ``run_…(config)`` as the CLI does (the same validation, run-directory
rules and manifest; the libraries' logs and bars off unless ``verbose=True``) and returns a
:class:`Result`. Bad input raises :class:`reasonrl.errors.ReasonRLError` (its message is the CLI's
one line); a stop by SIGINT raises ``KeyboardInterrupt``.

``reward=`` takes, besides ``"math"`` and a ``FILE.py:FUNCTION`` / ``package.module:FUNCTION`` spec,
a Python function defined at the top level of a module or script
(:func:`reasonrl.rewards.plugin.callable_spec`): the scorer's worker processes are started with
"spawn" and import it by name, so a script that passes one needs the ``if __name__ == "__main__":``
guard.

Nothing heavy is imported until a stage runs (``import reasonrl`` does not import torch).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

__all__ = ["Result", "ablate", "evaluate", "prepare_data", "pretrain_value", "report", "rollout", "train"]

#: The recipe tables a TOML recipe may hold (the CLI's stage names).
STAGES = ("prepare-data", "pretrain-value", "rollout", "train", "eval", "report", "ablate", "main-job")


@dataclass
class Result:
    """What a stage left: its run directory, its main files, its summary and its headline numbers.

    - ``out``: the run directory (``--out``).
    - ``paths``: its main outputs by name (``policy``, ``critic``, ``train``, ``results``, ...), those that exist.
    - ``summary``: what the stage returned (``summary.json`` for train; ``results.json``'s content for eval; the report of prepare-data).
    - ``metrics``: numbers: train the last step's metrics (``rollout/acc_mean``, ...), eval each metric's
      value (``avg@4``, ``pass@4``, ...; the intervals are in ``summary["metrics"]``), the others the numbers of their summary.
    - ``config``: the config the stage ran with.
    - ``manifest``: ``manifest.json`` (read when asked).
    """

    stage: str
    out: Path
    config: Any
    summary: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    paths: dict[str, Path] = field(default_factory=dict)

    @property
    def manifest(self) -> dict[str, Any]:
        return json.loads((self.out / "manifest.json").read_text(encoding="utf-8"))


def _numbers(d: Any) -> dict[str, float]:
    return {k: v for k, v in (d or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool)} if isinstance(d, dict) else {}


def _config(cls: type, config: Any, options: dict[str, Any], stage: str) -> Any:
    """``config`` (a ``cls``), keyword arguments that build one (over ``recipe``'s keys, when given),
    or both (the options replace fields)."""
    from reasonrl.config import build_config, load_recipe, recipe_layer
    from reasonrl.errors import ReasonRLError

    def plain(v: Any) -> Any:  # (a Path is given as its string, as on the command line)
        return os.fspath(v) if isinstance(v, os.PathLike) else [plain(x) for x in v] if isinstance(v, (list, tuple)) else v

    options = {k: plain(v) for k, v in options.items()}
    recipe = options.pop("recipe", None)
    if "reward" in options and callable(options["reward"]):
        from reasonrl.rewards.plugin import callable_spec

        options["reward"] = callable_spec(options["reward"])
    if config is None:
        return build_config(cls, recipe_layer(load_recipe(recipe), stage, cls, STAGES) if recipe else {}, options)
    if recipe:
        raise ReasonRLError(f"recipe={recipe!r} and a {cls.__name__} given: pass one of them")
    if not isinstance(config, cls):
        raise ReasonRLError(f"expected a {cls.__name__}, got {type(config).__name__}: pass {cls.__name__}(...) or keyword arguments")
    if not options:
        return config
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise ReasonRLError(f"{cls.__name__} has no field {unknown[0]!r}: see docs/api.md for its fields")
    return dataclasses.replace(config, **options)  # (__post_init__ checks the result)


def _run(run: Callable[[Any], Any], cfg: Any, verbose: bool) -> Any:
    """``run(cfg)`` as the CLI runs it: the libraries quiet unless ``verbose``, SIGTERM as the CLI
    handles it when this process holds it (``reasonrl.interrupts``); the caller's SIGINT and SIGTERM
    handlers are back afterwards, however it ended (a stopped stage leaves nothing ignored)."""
    from reasonrl import console, devices
    from reasonrl.interrupts import handlers_kept, sigterm_raises

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    devices.reproducible_blas()  # (no effect when this process has already run a matmul)
    if not verbose:
        console.quiet_libraries()
    with handlers_kept(), sigterm_raises():
        return run(cfg)


def _existing(out: Path, names: dict[str, str]) -> dict[str, Path]:
    return {k: out / v for k, v in names.items() if (out / v).exists()}


def prepare_data(config: Any = None, /, *, verbose: bool = False, **options: Any) -> Result:
    """``reasonrl prepare-data``: a :class:`reasonrl.stages.prepare_data.PrepareConfig` (``inputs``: files,
    directories or ``hf:ORG/NAME[:CONFIG][@SPLIT]``). ``summary``: the report (counts, drops, rewrites)."""
    from reasonrl.stages.prepare_data import PrepareConfig, run_prepare

    cfg = _config(PrepareConfig, config, options, "prepare-data")
    rep = _run(run_prepare, cfg, verbose)
    out = Path(cfg.out)
    return Result("prepare-data", out, cfg, rep, {"train_rows": rep.get("train", 0), "validation_rows": rep.get("validation", 0)},
                  _existing(out, {"train": "train.parquet", "validation": "validation.parquet", "report": "report.json"}))


def pretrain_value(config: Any = None, /, *, verbose: bool = False, **options: Any) -> Result:
    """``reasonrl pretrain-value``: a :class:`reasonrl.stages.pretrain_value.PretrainValueConfig`. ``paths["critic"]``: the value model."""
    from reasonrl.stages.pretrain_value import PretrainValueConfig, run_pretrain_value

    cfg = _config(PretrainValueConfig, config, options, "pretrain-value")
    summary = _run(run_pretrain_value, cfg, verbose)
    out = Path(cfg.out)
    return Result("pretrain-value", out, cfg, summary, _numbers(summary), _existing(out, {"critic": "critic", "metrics": "metrics.jsonl"}))


def rollout(config: Any = None, /, *, verbose: bool = False, **options: Any) -> Result:
    """``reasonrl rollout``: a :class:`reasonrl.stages.rollout.RolloutConfig`. ``paths["rollouts"]``: the parquet."""
    from reasonrl.stages.rollout import RolloutConfig, run_rollout

    cfg = _config(RolloutConfig, config, options, "rollout")
    summary = _run(run_rollout, cfg, verbose)
    out = Path(cfg.out)
    return Result("rollout", out, cfg, summary, _numbers(summary), _existing(out, {"rollouts": "rollouts.parquet", "summary": "summary.json"}))


def train(config: Any = None, /, *, verbose: bool = False, **options: Any) -> Result:
    """``reasonrl train``: a :class:`reasonrl.stages.train.TrainConfig` (``algo``: ppo, vcppo, grpo, dapo, ...).
    ``paths["policy"]``: the trained policy (an HF directory, usable as ``evaluate(model=...)``);
    ``metrics``: the last step's metrics; ``summary``: ``summary.json``."""
    from reasonrl.stages.train import TrainConfig, run_train

    cfg = _config(TrainConfig, config, options, "train")
    _run(run_train, cfg, verbose)
    out = Path(cfg.out)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8")) if (out / "summary.json").is_file() else {}
    return Result("train", out, cfg, summary, _numbers(summary.get("last")),
                  _existing(out, {"policy": "policy", "best": "best", "metrics": "metrics.jsonl", "validation": "validation.jsonl", "checkpoints": "checkpoints"}))


def evaluate(config: Any = None, /, *, verbose: bool = False, **options: Any) -> Result:
    """``reasonrl eval``: a :class:`reasonrl.stages.eval.EvalConfig` (``dataset``: a bundled set such as
    ``aime24``, a data file, a prepare-data directory or ``hf:ORG/NAME...``). ``metrics``: each metric's value."""
    from reasonrl.stages.eval import EvalConfig, run_eval

    cfg = _config(EvalConfig, config, options, "eval")
    results = _run(run_eval, cfg, verbose)
    out = Path(cfg.out)
    metrics = {k: v["value"] for k, v in (results.get("metrics") or {}).items() if isinstance(v, dict) and "value" in v}
    return Result("eval", out, cfg, results, metrics, _existing(out, {"results": "results.json", "samples": "samples.jsonl"}))


def report(config: Any = None, /, *, verbose: bool = False, **options: Any) -> Result:
    """``reasonrl report``: a :class:`reasonrl.stages.report.ReportConfig` (``runs``: run directories). ``paths["html"]``: report.html."""
    from reasonrl.stages.report import ReportConfig, run_report

    cfg = _config(ReportConfig, config, options, "report")
    rep = _run(run_report, cfg, verbose)
    out = Path(cfg.out)
    summary = {"runs": [str(r.path) for r in rep.runs], "figures": [p.name for p in rep.figures], "skipped": rep.skipped}
    return Result("report", out, cfg, summary, {}, {"html": Path(rep.html), **{p.stem: Path(p) for p in rep.figures}})


def ablate(config: Any = None, /, *, verbose: bool = False, **options: Any) -> Result:
    """``reasonrl ablate``: a :class:`reasonrl.stages.ablate.AblateConfig` (each run a ``reasonrl train``
    process). ``summary``: what the stage returned; ``paths["table"]``: ablation.json when collected."""
    from reasonrl.stages.ablate import AblateConfig, run_ablate

    cfg = _config(AblateConfig, config, options, "ablate")
    summary = _run(run_ablate, cfg, verbose)
    out = Path(cfg.out)
    return Result("ablate", out, cfg, summary if isinstance(summary, dict) else {}, {}, _existing(out, {"table": "ablation.json", "plan": "plan.json"}))
