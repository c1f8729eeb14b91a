"""The `reasonrl` command line: thin Typer commands over plain stage functions.

Every stage command is generated from its config dataclass: one ``--option`` per field (its help
is the field's documentation; the fields of an option group, a mixin of ``reasonrl.stages.options``,
in the group's ``--help`` panel, ``config.field_panel``; a renamed field's old name as a hidden
option, ``config.renamed_fields``), plus ``--config recipe.toml``, repeated ``--set key=value`` and
``--verbose`` (the libraries' own logs and bars, off by default: ``reasonrl.console``).
Precedence: dataclass defaults < recipe < --set < explicit options.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import typing
from typing import Any, Callable, List, Optional

import typer

from reasonrl import console, cpu_share, devices
from reasonrl.config import base_type, build_config, field_panel, load_recipe, parse_sets, recipe_layer, renamed_fields, sections
from reasonrl.errors import ReasonRLError
from reasonrl.rundir import write_failure

app = typer.Typer(
    name="reasonrl",
    help="RL for long chain-of-thought reasoning (DAPO, VC-PPO): prepare-data → pretrain-value → rollout → train → eval.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
eval_app = typer.Typer(help="Evaluate a policy: avg@n, pass@k, maj@n with bootstrap confidence intervals.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")


def _option_type(tp: Any) -> Any:
    base, _ = base_type(tp)
    if typing.get_origin(base) is list:
        return Optional[List[str]]
    return Optional[base]


def stage_command(target: typer.Typer, name: str, cls: type, run: Callable[[Any], Any], *, help: str, stage: str | None = None,
                  arguments: tuple[str, ...] = (), fixed: dict[str, Any] | None = None, sets_field: str | None = None) -> None:
    """Register ``name`` on ``target``: options from ``cls``'s fields, then ``run(config)``.

    ``sets_field``: the ``--set key=value`` items are not this command's keys but go, as a list, to
    that field (a driver over other stages: `ablate`'s train overrides)."""
    fixed = fixed or {}
    params = []

    def add_options(owner: type, skip: set[str], default_text: Callable[[dataclasses.Field], str], panel: str | None) -> None:
        """One option per field of ``owner``; ``cls``'s own fields first, then its option groups'
        (each in its ``help_panel``, the panels in their order), then a section's (in ``panel``).
        A renamed field's old name is a hidden option too (``config.renamed_fields``)."""
        hints = typing.get_type_hints(owner)
        ranked = []
        for f in dataclasses.fields(owner):
            if f.name in skip or f.name in fixed or "section" in f.metadata:
                continue
            h = f.metadata.get("help", "")
            group = field_panel(owner, f.name) if panel is None else None
            names = [(f.name, False)] + [(old, True) for old, new in renamed_fields(owner).items() if new == f.name]
            for name, hidden in names:
                if f.name in arguments:
                    param_default: Any = typer.Argument(None, help=h, show_default=False)
                else:
                    flag = "--" + name.replace("_", "-")
                    base, _ = base_type(hints[f.name])
                    decls = [f"{flag}/--no-{name.replace('_', '-')}"] if base is bool else [flag]
                    param_default = typer.Option(None, *decls, help=f"{h} {default_text(f)}", show_default=False, hidden=hidden,
                                                 rich_help_panel=panel if group is None else group.title)
                ranked.append((0 if group is None else group.order,
                               inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=param_default, annotation=_option_type(hints[f.name]))))
        params.extend(p for _, p in sorted(ranked, key=lambda r: r[0]))  # (stable: each panel in field order)

    def own_default(f: dataclasses.Field) -> str:
        default = f.default if f.default is not dataclasses.MISSING else (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)  # type: ignore[misc]
        return f"[default: {default}]"

    add_options(cls, {sets_field} if sets_field else set(), own_default, None)
    for sec in sections(cls):
        # One option per field of the section's class (e.g. AlgoSpec: --eps-high, --loss-agg, ...).
        table = sec.metadata["table"]
        add_options(sec.metadata["section"], {"name"}, lambda f, t=table: f"[default: the --{t} row's; or a recipe \\[{t}] table, or --set {t}.{f.name}=...]",
                    f"{table} row overrides")
    params.append(inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
                                    default=typer.Option(None, "--config", "-c", help="TOML recipe (see stages/); its keys are this command's options.")))
    set_help = next((f.metadata.get("help", "") for f in dataclasses.fields(cls) if f.name == sets_field), "") if sets_field else ""
    params.append(inspect.Parameter("set_", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[List[str]],
                                    default=typer.Option(None, "--set", help=set_help or "Override a recipe key: --set key=value (repeatable).")))
    params.append(inspect.Parameter("verbose", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                                    default=typer.Option(False, console.VERBOSE_FLAG, help=console.VERBOSE_HELP)))

    def command(**kwargs: Any) -> None:
        from reasonrl.interrupts import sigterm_raises

        recipe_path = kwargs.pop("config", None)
        sets = kwargs.pop("set_", None)
        if not kwargs.pop("verbose", False):
            console.quiet_libraries()  # (main() did it already, before the libraries were imported)
        with _user_errors(stage or name), sigterm_raises():  # (a SIGTERM: Interrupted, here or held from before)
            stages = sorted({c.name for c in app.registered_commands if c.name and not c.hidden} | {"eval"})
            recipe = recipe_layer(load_recipe(recipe_path), stage or name, cls, stages)
            explicit = {k: v for k, v in kwargs.items() if v is not None and v != []}
            if sets_field:  # (the items are checked by the config: they are another stage's keys)
                explicit[sets_field], sets = list(sets or []), None
            cfg = build_config(cls, recipe, parse_sets(sets), explicit, fixed)
            run(cfg)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__name__ = name.replace("-", "_")
    command.__doc__ = help
    target.command(name, help=help)(command)


class _user_errors:
    """ReasonRLError (and a few well-known user mistakes) → one line on stderr, exit code 1; a stop
    by SIGINT or SIGTERM (reasonrl.interrupts) → its one line, exit code 128 + the signal's number."""

    def __init__(self, stage: str) -> None:
        self.stage = stage

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: Any, e: Any, tb: Any) -> bool:
        if et is None:
            return False
        if issubclass(et, ReasonRLError):
            msg = str(e).splitlines()[0] if str(e) else et.__name__
        elif issubclass(et, KeyboardInterrupt):  # SIGINT; SIGTERM too (Interrupted)
            from reasonrl.interrupts import exit_line

            line, code = exit_line(e, self.stage)
            if line:
                typer.echo(line, err=True)
            raise typer.Exit(code)
        elif issubclass(et, MemoryError):
            msg = "out of memory: lower --micro-batch-size / --gen-batch-size or --max-response-len"
        elif issubclass(et, OSError):  # a read or write no stage turned into its own message
            where = f" on {e.filename}" if getattr(e, "filename", None) else ""
            msg = f"a file operation failed{where}: {write_failure(e)}; outputs without manifest.json are incomplete"
        else:
            return False
        typer.echo(f"error: {msg}", err=True)
        raise typer.Exit(1)


def _register() -> None:
    from reasonrl.evaluation.sets import EVAL_SETS
    from reasonrl.stages.ablate import AblateConfig, run_ablate
    from reasonrl.stages.eval import EvalConfig, run_eval
    from reasonrl.stages.main_job import MainJobConfig, run_main_job
    from reasonrl.stages.prepare_data import PrepareConfig, print_report, run_prepare
    from reasonrl.stages.pretrain_value import PretrainValueConfig, run_pretrain_value
    from reasonrl.stages.report import ReportConfig, run_report
    from reasonrl.stages.rollout import RolloutConfig, run_rollout
    from reasonrl.stages.train import TrainConfig, run_train

    def prepare(cfg: PrepareConfig) -> None:
        from rich.console import Console

        report = run_prepare(cfg)
        print_report(report, Console())

    stage_command(app, "prepare-data", PrepareConfig, prepare, arguments=("inputs",),
                  help="Read math datasets, make every answer an integer (DAPO §3.5), template, dedupe, decontaminate, split; write verl-format parquet.")
    stage_command(app, "pretrain-value", PretrainValueConfig, run_pretrain_value,
                  help="VC-PPO value pretraining: sample from the fixed initial policy, λ=1 targets, train the critic; write it as an HF directory.")
    stage_command(app, "rollout", RolloutConfig, run_rollout,
                  help="Sample G responses per prompt, score them, write parquet (prompt, response, token ids, logprobs, finish reason, reward).")
    stage_command(app, "train", TrainConfig, run_train,
                  help="On-policy RL with an --algo row: ppo | vcppo | grpo | dapo | gspo | cispo | drgrpo | vapo (rollout → rewards → filtering → advantages → updates → checkpoint).")
    for set_name, eval_set in EVAL_SETS.items():
        stage_command(eval_app, set_name, EvalConfig, run_eval, stage="eval", fixed={"dataset": set_name},
                      help=f"Evaluate on {eval_set.description}.")
    stage_command(eval_app, "file", EvalConfig, run_eval, stage="eval",
                  help="Evaluate on any dataset file (jsonl/json/parquet with problem + integer answer, or a prepare-data directory): --dataset PATH.")
    stage_command(app, "report", ReportConfig, run_report, arguments=("runs",),
                  help="Draw the runs' curves (reward, entropy, lengths, clipping, value bias, eval CIs, time split) as PNGs and one self-contained report.html.")
    stage_command(app, "ablate", AblateConfig, run_ablate, sets_field="sets",
                  help="The papers' ablation tables: every rung × seed a normal `train` run (validation on), skipped when finished and resumed "
                       "when crashed; --dry-run prints the commands, --collect DIR builds the table (ablation.json).")
    stage_command(app, "main-job", MainJobConfig, run_main_job,
                  help="The embedded demo: prepare-data → pretrain-value → train --algo dapo → eval, on SmolLM2-135M-Instruct and bundled arithmetic.")


@app.command("make-tiny-model", hidden=True)
def make_tiny_model(out: str = typer.Argument(..., help="Output directory"), seed: int = 0) -> None:
    """Write the tiny random test model (byte-level BPE + 2-layer Llama, head_dim 32)."""
    from reasonrl.models.tiny import build_tiny_model

    typer.echo(str(build_tiny_model(out, seed=seed)))


def main() -> None:
    # SIGTERM (a scheduler's stop) unwinds a stage like Ctrl-C: `finally` blocks run, one line, exit 143
    # (one that comes earlier is held until the stage starts: typer would turn it into a silent exit 130).
    # Installed first: before it, a SIGTERM ends the interpreter by the signal (-15, nothing written yet).
    from reasonrl.interrupts import exit_line, hold_sigterm

    hold_sigterm()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    devices.reproducible_blas()
    # vLLM's CPU backend lowers torch to 1 thread unless OMP_NUM_THREADS is set; the trainer shares
    # the process, so give it every core we may use (torchrun sets its own value per rank).
    os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    # How the OpenMP threads wait (spin, or yield the core when other processes are busy): read by
    # libgomp when torch loads, so chosen here (reasonrl.cpu_share; $REASONRL_CPU_WAIT).
    # (--help and a bare command load no torch: the mode is checked, the fifth of a second not spent.)
    helping = len(sys.argv) < 2 or bool({"--help", "-h"} & set(sys.argv[1:]))
    try:
        cpu_share.choose_wait(measure=(lambda: 0.0) if helping else cpu_share.others_busy)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    # The libraries' logs and bars stay off unless --verbose (reasonrl.console); decided here, before
    # any of them is imported, since several read their switches at import time.
    if not console.wants_verbose(sys.argv[1:]):
        console.quiet_libraries()
    try:
        _register()  # (imports torch: seconds)
        app()
    except ReasonRLError as e:  # raised outside a stage command
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt as e:  # Ctrl-C while importing (a stage's own are handled by _user_errors)
        line, code = exit_line(e, "reasonrl")
        if line:
            print(line, file=sys.stderr)
        sys.exit(code)


if __name__ == "__main__":
    main()
