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
