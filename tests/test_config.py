"""The config system's sections: --algo overrides generated from AlgoSpec's fields."""

from __future__ import annotations

import dataclasses

import pytest

from clihelp import assert_user_error, run_cli
from reasonrl.algos import AlgoSpec
from reasonrl.config import build_config, recipe_layer
from reasonrl.errors import ReasonRLError
from reasonrl.stages.train import TrainConfig


def test_every_algospec_field_is_an_option_of_train() -> None:
    import typer

    from reasonrl import cli

    run_cli("--help")  # registers the commands
    train = typer.main.get_command(cli.app).commands["train"]
    flags = {o for p in train.params for o in p.opts}
    for f in dataclasses.fields(AlgoSpec):
        if f.name != "name":
            assert "--" + f.name.replace("_", "-") in flags, f.name
    own = {f.name for f in dataclasses.fields(TrainConfig)}
    assert not own & {f.name for f in dataclasses.fields(AlgoSpec)} - {"name"}, "a TrainConfig field shadows an AlgoSpec field"


def test_overrides_from_every_layer() -> None:
    flat = build_config(TrainConfig, {"algo": "grpo", "eps_high": 0.3})
    assert flat.algo_spec().eps_high == 0.3 and flat.algo_spec().name == "grpo"
    table = build_config(TrainConfig, recipe_layer({"algo": {"name": "ppo", "lam_actor": 0.9}, "steps": 3}, "train", TrainConfig))
    assert (table.algo, table.steps, table.algo_spec().lam_actor, table.algo_spec().use_critic) == ("ppo", 3, 0.9, True)
    staged = build_config(TrainConfig, recipe_layer({"train": {"algo": {"name": "dapo", "loss_agg": "seq-mean-token-mean"}}}, "train", TrainConfig))
    assert staged.algo_spec().loss_agg == "seq-mean-token-mean"
    dotted = build_config(TrainConfig, {"algo.eps_high": 0.28}, {"algo.eps_high": "0.35", "algo.dual_clip": "none"})
    assert dotted.algo_spec().eps_high == 0.35 and dotted.algo_overrides == {"eps_high": 0.35, "dual_clip": None}
    assert build_config(TrainConfig).algo_spec() == AlgoSpec(**dataclasses.asdict(build_config(TrainConfig).algo_spec()))


@pytest.mark.parametrize("layer,msg", [
    ({"algo.nope": 1}, "unknown key 'algo.nope'"),
    ({"eps_low": "x"}, "'eps_low' must be a float"),
    ({"eps_low": 1.5}, "eps_low"),
    ({"loss_agg": "mean"}, "loss_agg must be one of"),
    ({"algo": {"name": "nope"}}, "unknown --algo 'nope'"),
])
def test_bad_overrides_are_one_line_errors(layer, msg) -> None:
    with pytest.raises(ReasonRLError, match=msg):
        build_config(TrainConfig, layer)


def test_cli_override_reaches_the_row(tmp_path) -> None:
    r = run_cli("train", "--data", tmp_path / "none", "--eps-low", "1.5")
    assert_user_error(r, "eps_low")


def test_list_options_take_brackets_and_empties() -> None:
    from reasonrl.stages.prepare_data import PrepareConfig

    assert build_config(PrepareConfig, {"inputs": "a", "decontaminate": "[]"}).decontaminate == []
    assert build_config(PrepareConfig, {"inputs": "a", "decontaminate": ""}).decontaminate == []
    assert build_config(PrepareConfig, {"inputs": "a", "decontaminate": '[aime24, "math500"]'}).decontaminate == ["aime24", "math500"]
    assert build_config(PrepareConfig, {"inputs": "a", "decontaminate": [""]}).decontaminate == []


# --- issue 20 item 15: values every field of a type must reject, and recipes that cannot be read -------


def _stage_classes():
    from reasonrl.stages.eval import EvalConfig
    from reasonrl.stages.main_job import MainJobConfig
    from reasonrl.stages.prepare_data import PrepareConfig
    from reasonrl.stages.pretrain_value import PretrainValueConfig
    from reasonrl.stages.report import ReportConfig
    from reasonrl.stages.rollout import RolloutConfig

    base = {PrepareConfig: {"inputs": "a"}, ReportConfig: {"runs": "r"}}
    return [(cls, base.get(cls, {})) for cls in (TrainConfig, EvalConfig, RolloutConfig, PretrainValueConfig, PrepareConfig, MainJobConfig, ReportConfig)]


def _float_keys():
    """(config class, its required keys, key, inf allowed) for every float field of every stage
    config and of AlgoSpec (through train's --algo overrides)."""
    import typing

    from reasonrl.config import base_type

    out = []
    for cls, base in _stage_classes():
        hints = typing.get_type_hints(cls)
        out += [(cls, base, f.name, bool(f.metadata.get("inf_ok"))) for f in dataclasses.fields(cls) if base_type(hints[f.name])[0] is float]
    hints = typing.get_type_hints(AlgoSpec)
    out += [(TrainConfig, {}, f.name, bool(f.metadata.get("inf_ok"))) for f in dataclasses.fields(AlgoSpec) if base_type(hints[f.name])[0] is float]
    return out


FLOATS = _float_keys()


@pytest.mark.parametrize("cls,base,key,inf_ok", FLOATS, ids=[f"{c.__name__}.{k}" for c, _, k, _ in FLOATS])
def test_no_float_knob_takes_nan(cls, base, key, inf_ok) -> None:
    for nan in ("nan", float("nan"), "-nan"):
        with pytest.raises(ReasonRLError, match=f"'{key}' must be a finite float"):
            build_config(cls, base, {key: nan})
    if inf_ok:  # an upper bound that inf turns off
        assert build_config(cls, base, {key: "inf"})
    else:
        with pytest.raises(ReasonRLError, match=f"'{key}' must be a finite float, got"):
            build_config(cls, base, {key: float("inf")})
    with pytest.raises(ReasonRLError, match=key):
        build_config(cls, base, {key: "-inf"})


def test_the_float_table_is_complete() -> None:
    keys = {k for _, _, k, _ in FLOATS}
    assert {"eps_high", "eps_low", "lr", "critic_lr", "temperature", "top_p", "oversample", "val_fraction", "gamma", "tis_cap"} <= keys
    assert {k for _, _, k, inf in FLOATS if inf} == {"eps_high", "cispo_weight_max", "cov_clip_high"}


def test_algospec_itself_refuses_nan() -> None:
    from reasonrl.algos import ALGOS

    with pytest.raises(ValueError, match="eps_high must be a finite number"):
        ALGOS["dapo"].replace(eps_high=float("nan"))
    with pytest.raises(ValueError, match="dual_clip must be a finite number, got inf"):
        AlgoSpec(dual_clip=float("inf"))
    assert AlgoSpec(eps_high=float("inf")).eps_high == float("inf")


def test_eps_high_nan_is_refused_before_the_run(prepared, tiny_model, tmp_path) -> None:
    """The probe's trial: accepted, the run diverged three steps later ('try a lower --lr')."""
    r = run_cli("train", "--set", "algo.eps_high=nan", "--data", prepared, "--model", tiny_model, "--out", tmp_path / "r", "--engine", "hf",
                "--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--max-response-len", "4")
    assert_user_error(r, "'eps_high' must be a finite float", "got 'nan'")
    assert not (tmp_path / "r").exists()


def test_a_seed_out_of_range_is_one_line(prepared, tiny_model, tmp_path) -> None:
    """The probe's trial: 'Overflow when unpacking long long' traceback. The bound is numpy's
    2**32 - 1: vLLM seeds numpy's global generator with the engine's seed."""
    import numpy as np

    r = run_cli("train", "--set", "seed=99999999999999999999999", "--data", prepared, "--model", tiny_model, "--out", tmp_path / "r",
                "--engine", "hf", "--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--max-response-len", "4")
    assert_user_error(r, "'seed' is out of range", "99999999999999999999999")
    assert not (tmp_path / "r").exists()
    for cls, base in _stage_classes():
        if "seed" in {f.name for f in dataclasses.fields(cls)}:
            for seed in (2**32, -1, 2**63):
                with pytest.raises(ReasonRLError, match="seed"):
                    build_config(cls, base, {"seed": seed})
            assert build_config(cls, base, {"seed": 2**32 - 1}).seed == 2**32 - 1
    np.random.seed(2**32 - 1)  # the bound is numpy's own
    with pytest.raises(ValueError):
        np.random.seed(2**32)


@pytest.mark.parametrize("text,needles", [
    (b'steps = 2\nlr = "\xff\xfe"\n', ["is not UTF-8 text (byte 0xff on line 2)", "save it as UTF-8"]),
    (b'steps = 2\nlr = \n', ["is not valid TOML", "line 2"]),
    (b'steps = "abc"\n', ["'steps' must be an int, got 'abc'"]),
    (b'steps = [1, 2]\n', ["'steps' must be an int, got [1, 2]"]),
    (b'steps = 1.5\n', ["'steps' must be an int, got 1.5"]),
    (b'steps = true\n', ["'steps' must be an int, got True"]),
    (b'steps = 1979-05-27\n', ["'steps' must be an int"]),
    (b'lr = "fast"\n', ["'lr' must be a float, got 'fast'"]),
    (b'lr = nan\n', ["'lr' must be a finite float, got nan"]),
    (b'out = [1]\n', ["'out' must be a str, got [1]"]),
    (b'quiet = 1\n', ["'quiet' must be a bool, got 1"]),
    (b'report_to = [["tensorboard"]]\n', ["'report_to' must be a list of str"]),
    (b'max_response_len = 99999999999999999999\n', ["'max_response_len' is out of range"]),
    (b'algo_overrides = 1\n', ["'algo_overrides' is set key by key", "[algo]"]),
    (b'[algo]\neps_high = "wide"\n', ["'eps_high' must be a float, got 'wide'"]),
])
def test_recipe_type_errors_are_one_line(tmp_path, text, needles) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_bytes(text)
    line = assert_user_error(run_cli("train", "--config", recipe, "--data", tmp_path / "none", "--out", tmp_path / "o"), *needles)
    assert str(recipe) in line or "'" in line  # the file or the key is named
    assert not (tmp_path / "o").exists()


def test_list_items_have_the_list_type() -> None:
    from reasonrl.stages.eval import EvalConfig

    with pytest.raises(ReasonRLError, match=r"'ks' must be a list of int, got \[1.5\]"):
        build_config(EvalConfig, {"ks": [1.5]})
    with pytest.raises(ReasonRLError, match="'ks' must be a list of int"):
        build_config(EvalConfig, {"ks": "[1, x]"})
    assert build_config(EvalConfig, {"ks": "[1, 4]"}).ks == [1, 4]


def test_train_filter_rollouts_takes_its_old_name(capsys, monkeypatch) -> None:
    """Issue 37: `train --rollouts` (filter the prompts by pass rate) is `--filter-rollouts`; the old
    name still works in a recipe and in --set, with one note a process; `pretrain-value --rollouts`
    (train on saved responses) keeps its name."""
    from reasonrl import config
    from reasonrl.config import parse_sets
    from reasonrl.stages.pretrain_value import PretrainValueConfig

    monkeypatch.setattr(config, "noted_renames", set())
    recipe = build_config(TrainConfig, recipe_layer({"train": {"rollouts": "ro"}}, "train", TrainConfig))
    sets = build_config(TrainConfig, {}, parse_sets(["rollouts=ro2"]))
    assert (recipe.filter_rollouts, sets.filter_rollouts) == ("ro", "ro2")
    notes = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("note:")]
    assert len(notes) == 1 and "'rollouts' (--rollouts) is now 'filter_rollouts' (--filter-rollouts)" in notes[0], notes
    assert build_config(TrainConfig, {"filter_rollouts": "new"}).filter_rollouts == "new"
    assert build_config(TrainConfig, {"rollouts": "old"}, {"filter_rollouts": "new"}).filter_rollouts == "new"  # (a later layer wins)
    assert "rollouts" not in config.to_dict(recipe) and config.to_dict(recipe)["filter_rollouts"] == "ro"
    with pytest.raises(ReasonRLError, match="'rollouts' and 'filter_rollouts' both given"):
        build_config(TrainConfig, {"rollouts": "a", "filter_rollouts": "b"})
    assert build_config(PretrainValueConfig, {"rollouts": "ro"}).rollouts == "ro"
    assert "note:" not in capsys.readouterr().err


def test_train_filter_rollouts_on_the_command_line(tmp_path, monkeypatch) -> None:
    """Both spellings reach the run (the missing data is the first thing it says); both at once, or
    the pass-rate bounds without either, are one line naming --filter-rollouts."""
    from reasonrl import config

    monkeypatch.setattr(config, "noted_renames", set())
    for flag in ("--filter-rollouts", "--rollouts"):
        r = run_cli("train", flag, tmp_path / "ro", "--min-pass-rate", "0.5", "--data", tmp_path / "none", "--out", tmp_path / "o", "--engine", "hf")
        assert_user_error(r, "prepare-data")
        assert ("note: 'rollouts' (--rollouts) is now" in r.output) == (flag == "--rollouts"), r.output
    assert_user_error(run_cli("train", "--rollouts", "a", "--filter-rollouts", "b", "--data", tmp_path / "none"), "both given", "'filter_rollouts'")
    assert_user_error(run_cli("train", "--min-pass-rate", "0.5", "--data", tmp_path / "none"), "give --filter-rollouts DIR")
    help_text = run_cli("train", "--help").output
    assert "--filter-rollouts" in help_text and "--rollouts " not in help_text  # (the old name is hidden)


def test_option_groups_have_their_help_panels() -> None:
    """Issue 37: each option group (a mixin of stages/options.py) is one `--help` panel, in every
    stage that takes it; a stage's own options stay in 'Options'."""
    import typer

    from reasonrl import cli
    from reasonrl.config import field_panel
    from reasonrl.stages import options as O
    from reasonrl.stages.eval import EvalConfig
    from reasonrl.stages.pretrain_value import PretrainValueConfig
    from reasonrl.stages.rollout import RolloutConfig

    run_cli("--help")  # registers the commands
    root = typer.main.get_command(cli.app)
    commands = {"train": TrainConfig, "pretrain-value": PretrainValueConfig, "rollout": RolloutConfig}
    groups = (O.ModelOpts, O.RolloutOpts, O.DecodeOpts, O.OptimOpts, O.ScheduleOpts, O.LoraOpts, O.BackendOpts, O.ValOpts, O.TrackOpts)
    declared = [g for g in groups if "help_panel" in vars(g)]  # (RolloutOpts takes DecodeOpts' Sampling)
    assert len({g.help_panel.title for g in declared}) == len(declared) == len(groups) - 1
    for name, cls in [*commands.items(), ("eval file", EvalConfig)]:
        cmd = root.commands["eval"].commands["file"] if name == "eval file" else root.commands[name]
        panels = {p.name: getattr(p, "rich_help_panel", None) for p in cmd.params}
        for f in dataclasses.fields(cls):
            if "section" in f.metadata:
                continue
            group = next((g for g in groups if issubclass(cls, g) and f.name in {h.name for h in dataclasses.fields(g)}), None)
            want = group.help_panel.title if group is not None else None
            assert field_panel(cls, f.name) == (group.help_panel if group is not None else None), (name, f.name)
            assert panels[f.name] == want, (name, f.name, panels[f.name], want)
    assert panels["top_p"] == "Sampling" and panels["model"] == "Model, engine and reward"  # (eval's redefinitions stay in their group)
    assert TrainConfig.__dataclass_fields__["critic_lr"].default == PretrainValueConfig.__dataclass_fields__["critic_lr"].default
