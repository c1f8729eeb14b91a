"""The Python API (reasonrl/api.py, docs/api.md): the docs' examples run as scripts, the same
errors and run-directory rules as the CLI, a reward given as a function, and a light import."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import reasonrl

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "api.md"
ENGINE = dict(engine="hf", dtype="fp32", max_response_len=12, seed=0)


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def substituted(block: str, changes: dict[str, str]) -> str:
    """``block`` with each line (or text) in ``changes`` replaced; each must be there (the docs cannot drift from the test)."""
    for old, new in changes.items():
        assert block.count(old) == 1, f"docs/api.md no longer has {old!r}"
        block = block.replace(old, new)
    return block


def run_script(path: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2"}
    r = subprocess.run([sys.executable, str(path)], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def short_reward(response: str, ground_truth: str, **info) -> float:
    """A reward of this (importable) module: the scorer's workers import it as test_api:short_reward."""
    return -0.01 * len(response)


def test_import_is_light_and_train_is_the_function():
    """``reasonrl.train`` / ``reasonrl.report`` are both the API's functions and the subpackages
    (reasonrl.stage_package): called they run the stage, and every spelling of an import reaches the
    package, whichever came first."""
    code = ("import inspect, sys, reasonrl; fs = (reasonrl.train, reasonrl.evaluate, reasonrl.Result); "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "import reasonrl.train.batch; import reasonrl.train.backend as B; from reasonrl.report import FIGURES; "
            "assert reasonrl.train is fs[0] is sys.modules['reasonrl.train'] and callable(reasonrl.train) and callable(reasonrl.report); "
            "assert B.TorchBackend and reasonrl.train.batch; "
            "from reasonrl.api import train; assert inspect.signature(reasonrl.train) == inspect.signature(train); print('ok')")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
    assert {"prepare_data", "pretrain_value", "rollout", "train", "evaluate", "report", "ablate"} <= set(reasonrl.__all__)
    code = "import reasonrl.train.backend as B, reasonrl; assert callable(reasonrl.train) and B.TorchBackend; print('ok')"  # the subpackage first
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_the_docs_example_trains_dapo_on_the_chains_and_evaluates(tiny_model, tmp_path):
    block = python_blocks()[0]
    script = substituted(block, {
        'MODEL = "default"': f"MODEL = {str(tiny_model)!r}",
        "STEPS, PROMPTS, SAMPLES, MAX_LEN = 8, 4, 6, 160": "STEPS, PROMPTS, SAMPLES, MAX_LEN = 1, 2, 4, 12",
        'ENGINE = dict(engine="auto", dtype="auto")': 'ENGINE = dict(engine="hf", dtype="fp32")',
    })
    (tmp_path / "data").mkdir()
    shutil.copy(ROOT / "data" / "chains.jsonl", tmp_path / "data" / "chains.jsonl")
    (tmp_path / "example.py").write_text(script)
    r = run_script(tmp_path / "example.py", tmp_path)
    assert "held-out avg@4" in r.stdout and "step 1: train accuracy" in r.stdout, r.stdout
    runs = tmp_path / "runs" / "api"
    train = json.loads((runs / "dapo" / "manifest.json").read_text())
    assert train["stage"] == "train" and train["config"]["algo"] == "dapo" and train["config"]["steps"] == 1
    results = json.loads((runs / "eval" / "results.json").read_text())
    assert results["problems"] == 96 and results["n"] == 4 and (runs / "eval" / "manifest.json").is_file()


def test_the_docs_reward_function_runs_in_the_scorer_workers(tiny_model, prepared, tmp_path):
    """The docs' script: its function goes to the spawned workers as FILE.py:FUNCTION; the rewards
    written are the function's (recomputed here), and the manifest names the file and its hash."""
    block = python_blocks()[1]
    script = substituted(block, {'model="default"': f'model={str(tiny_model)!r}, engine="hf", dtype="fp32", max_response_len=12'})
    shutil.copytree(prepared, tmp_path / "runs" / "api" / "data")
    (tmp_path / "reward_example.py").write_text(script)
    r = run_script(tmp_path / "reward_example.py", tmp_path)
    assert "reward mean" in r.stdout
    out = tmp_path / "runs" / "api" / "rollout"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["reward"]["spec"] == f"{(tmp_path / 'reward_example.py').resolve()}:short_and_right"
    assert manifest["reward"]["sha256"]
    import pyarrow.parquet as pq

    ns: dict = {}
    exec(compile(script.split('if __name__ == "__main__":')[0], "reward_example", "exec"), ns)
    rows = pq.read_table(out / "rollouts.parquet").to_pylist()
    assert len(rows) == 32
    for row in rows:
        assert row["reward"] == pytest.approx(ns["short_and_right"](row["response"], row["ground_truth"]))


def test_errors_and_run_directory_rules(tiny_model, prepared, tmp_path):
    from reasonrl import ReasonRLError, RolloutConfig

    out = tmp_path / "r"
    with pytest.raises(ReasonRLError, match="group_size must be >= 1"):
        reasonrl.rollout(model=tiny_model, data=prepared, out=out, group_size=0, **ENGINE)
    with pytest.raises(ReasonRLError, match="unknown key 'group_sise'"):
        reasonrl.rollout(model=tiny_model, data=prepared, out=out, group_sise=2, **ENGINE)
    with pytest.raises(ReasonRLError, match="'num_prompts' must be an int, got 'two'"):
        reasonrl.rollout(model=tiny_model, data=prepared, out=out, num_prompts="two", **ENGINE)
    with pytest.raises(ReasonRLError, match="top level of a module"):
        reasonrl.rollout(model=tiny_model, data=prepared, out=out, reward=lambda response, truth: 1.0, **ENGINE)
    with pytest.raises(ReasonRLError, match="not found"):
        reasonrl.rollout(model=tmp_path / "absent", data=prepared, out=out, **ENGINE)
    assert not out.exists()

    cfg = RolloutConfig(model=str(tiny_model), data=str(prepared), out=str(out), group_size=2, num_prompts=2, **ENGINE)
    res = reasonrl.rollout(cfg, reward=short_reward)  # a config, and a field replaced by keyword
    assert res.config.reward == "test_api:short_reward" and res.manifest["reward"]["spec"] == "test_api:short_reward"
    assert res.out == out and res.paths["rollouts"] == out / "rollouts.parquet"
    assert res.metrics["samples"] == 4 and res.summary["reward_errors"] == 0
    import pyarrow.parquet as pq

    assert [row["reward"] for row in pq.read_table(out / "rollouts.parquet").to_pylist()] == \
        [pytest.approx(short_reward(row["response"], "")) for row in pq.read_table(out / "rollouts.parquet").to_pylist()]
    with pytest.raises(ReasonRLError, match="already holds a finished `reasonrl rollout` run"):
        reasonrl.rollout(cfg)
    with pytest.raises(ReasonRLError, match="RolloutConfig has no field 'stepz'"):
        reasonrl.rollout(cfg, stepz=3)
    assert reasonrl.rollout(cfg, overwrite=True).metrics["samples"] == 4


def test_a_stopped_stage_gives_the_caller_its_signal_handlers_back(tiny_model, prepared, toy_data_file, tmp_path, monkeypatch):
    """A stage stopped by a Ctrl-C in-process raises KeyboardInterrupt, and the caller's SIGINT and
    SIGTERM handlers are back after the call: the training loop's stop left both ignored (SIG_IGN),
    and so did any stage run under the CLI's own SIGTERM handler (its command ends ignoring both), so
    every later Ctrl-C of the caller, and of the subprocesses it starts, was lost. (The process's
    handlers are put back after each test: tests/isolation.py.)"""
    import signal

    from reasonrl.interrupts import StepStop, hold_sigterm

    def caller_int(signum, frame):
        raise KeyboardInterrupt

    def caller_term(signum, frame):
        raise SystemExit(143)

    signal.signal(signal.SIGINT, caller_int)
    signal.signal(signal.SIGTERM, caller_term)
    begin_step = StepStop.begin_step

    def ctrl_c_then_begin(self):
        signal.raise_signal(signal.SIGINT)  # a Ctrl-C as the first step starts: the loop notes it, and drops the step
        begin_step(self)

    monkeypatch.setattr(StepStop, "begin_step", ctrl_c_then_begin)
    with pytest.raises(KeyboardInterrupt) as e:
        reasonrl.train(algo="grpo", data=prepared, out=tmp_path / "run", model=tiny_model, group_size=2, prompts_per_step=2, mini_batch_size=4,
                       micro_batch_size=2, steps=1, quiet=True, **ENGINE)
    assert getattr(e.value, "signum", None) == signal.SIGINT and "stopped by SIGINT" in str(e.value)
    assert signal.getsignal(signal.SIGINT) is caller_int and signal.getsignal(signal.SIGTERM) is caller_term

    hold_sigterm()  # a caller holding the CLI's SIGTERM handler: the stage runs as the CLI's, and the handlers stay the caller's
    held = signal.getsignal(signal.SIGTERM)
    res = reasonrl.prepare_data(inputs=[toy_data_file], out=tmp_path / "data", template="none", val_size=4, quiet=True)
    assert res.paths["train"].is_file()
    assert signal.getsignal(signal.SIGINT) is caller_int and signal.getsignal(signal.SIGTERM) is held


def test_a_recipe_then_keywords(tmp_path):
    """``recipe=`` is read as ``--config`` is (its [rollout] table, a misspelled table refused) and
    keywords override it: group_size 0 from the recipe fails the check, group_size=2 passes it and
    the run stops at the missing data."""
    from reasonrl import ReasonRLError

    recipe = tmp_path / "r.toml"
    recipe.write_text("[rollout]\ngroup_size = 0\n")
    with pytest.raises(ReasonRLError, match="group_size must be >= 1"):
        reasonrl.rollout(recipe=recipe, out=tmp_path / "o")
    with pytest.raises(ReasonRLError, match="absent not found: run `reasonrl prepare-data` first"):
        reasonrl.rollout(recipe=recipe, group_size=2, data=tmp_path / "absent", out=tmp_path / "o", **ENGINE)
    recipe.write_text("[rollot]\ngroup_size = 2\n")
    with pytest.raises(ReasonRLError, match=r"recipe table \[rollot\] names no stage"):
        reasonrl.rollout(recipe=recipe, out=tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_a_nested_function_is_refused_with_its_fix():
    from reasonrl.rewards.plugin import callable_spec

    def inner(response, ground_truth):
        return 1.0

    with pytest.raises(reasonrl.ReasonRLError, match="define it with `def` at the top level"):
        callable_spec(inner)
    assert callable_spec(short_reward) == "test_api:short_reward"
