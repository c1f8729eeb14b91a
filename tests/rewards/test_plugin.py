"""Reward plug-ins (``--reward FILE.py:FUNCTION``): loading and its one-line errors through the real
CLI, scoring in the scorer's pool (exception / timeout / non-finite -> -1 and counted, a batch that
fails everywhere stops), the example plug-in, and rollout -> train (dynamic sampling) -> eval on the
tiny random model driven by a plug-in, with a resume refused after the plug-in file changed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from clihelp import run_cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "rewards" / "exact_match.py"

#: The tiny random model writes random tokens: a reward by the response's length parity is +1 or -1
#: at random (both occur), never a constant. It fails (-> an error) when ``info`` lacks what the
#: contract promises, so reward_errors == 0 shows the keys were there.
PARITY = '''
def parity(response, ground_truth, **info):
    assert isinstance(info["prompt"], str) and info["prompt"], info
    assert isinstance(info["data_source"], str) and isinstance(info["extra_info"], dict), info
    return len(response) % 2 == 0
'''

BAD = '''
import math, time

def one_arg(response):
    return 1.0

not_a_function = 3

def faulty(response, ground_truth, **info):
    if response == "raise":
        raise ValueError("no reward for " + info["prompt"])
    if response == "nan":
        return math.nan
    if response == "inf":
        return -math.inf
    if response == "text":
        return "yes"
    if response == "sleep":
        time.sleep(60)
    if response == "exit":
        raise SystemExit(2)
    return 0.25 if response == "good" else False

def always_raise(response, ground_truth, **info):
    raise RuntimeError("the plug-in is broken")

def named_only(response, ground_truth, prompt):
    return 1.0 if prompt == "p" else -1.0

def hangs(response, ground_truth, **info):
    if response.startswith("hang"):
        time.sleep(600)
    if response == "slow":
        time.sleep(0.05)
    return 1.0
'''


@pytest.fixture
def plugins(tmp_path) -> Path:
    (tmp_path / "bad.py").write_text(BAD)
    (tmp_path / "parity.py").write_text(PARITY)
    (tmp_path / "broken_import.py").write_text("import no_such_module_anywhere\n")
    return tmp_path


# ------------------------------------------------------------------ loading: one line, before any model loads


@pytest.mark.parametrize("stage", [["rollout"], ["pretrain-value"], ["train"], ["eval", "file", "--dataset", "x.jsonl"], ["main-job"]])
def test_bad_plugins_are_one_line_errors_before_any_model_loads(plugins, stage):
    cases = {
        f"{plugins}/missing.py:f": "not found",
        "no_such_package_xyz.rewards:f": "module no_such_package_xyz.rewards not found",
        f"{plugins}/bad.py:nope": "has no function nope",
        f"{plugins}/bad.py:not_a_function": "not a function",
        f"{plugins}/bad.py:one_arg": "must take two positional arguments",
        f"{plugins}/broken_import.py:f": "importing",
        "no-colon": "expected 'math', FILE.py:FUNCTION or package.module:FUNCTION",
    }
    for spec, says in cases.items():
        # (a model that does not exist: had anything tried to load it, the error would be about the model)
        extra = [] if stage == ["main-job"] else ["--model", str(plugins / "no_model_here")]
        r = run_cli(*stage, *extra, "--reward", spec)
        assert r.exit_code == 1, (spec, r.output)
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: --reward") and says in lines[0], (spec, r.output)
        assert "Traceback" not in r.output


EXITS = {  # plug-ins that end the process while they are imported, printing first
    "sys_exit.py": "print('hello from the plug-in')\nimport sys\nsys.exit(3)\ndef f(response, ground_truth, **info):\n    return 1.0\n",
    "os_exit.py": "import os, sys\nprint('bye', file=sys.stderr)\nos._exit(0)\ndef f(response, ground_truth, **info):\n    return 1.0\n",
    "chatty.py": "print('loading my reward')\ndef f(response, ground_truth, **info):\n    return 1.0\n",
}


@pytest.mark.parametrize("name,exit_", [("sys_exit.py", "sys.exit(3)"), ("os_exit.py", "os._exit(0)")])
def test_a_plugin_that_exits_at_import_is_one_line(tmp_path, name, exit_):
    """A plug-in that calls sys.exit / os._exit while imported: one line naming the plug-in and what it
    printed, exit 1 (it ended the CLI silently, exit 3 or 0, its prints raw on the console)."""
    import os
    import subprocess
    import sys

    (tmp_path / name).write_text(EXITS[name])
    spec = f"{tmp_path / name}:f"
    p = subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", "--model", str(tmp_path / "no_model_here"), "--reward", spec],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300, cwd=tmp_path)
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert p.stdout == "" and len(p.stderr.strip().splitlines()) == 1, (p.stdout, p.stderr)
    line = p.stderr.strip()
    printed = "hello from the plug-in" if name == "sys_exit.py" else "bye"
    assert line.startswith(f"error: --reward {spec}") and exit_ in line and printed in line and "Traceback" not in line, line


def test_a_plugins_prints_at_import_show_with_verbose_only(tmp_path):
    import os
    import subprocess
    import sys

    (tmp_path / "chatty.py").write_text(EXITS["chatty.py"])
    spec = f"{tmp_path / 'chatty.py'}:f"
    for verbose in ([], ["--verbose"]):
        p = subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", "--model", str(tmp_path / "no_model_here"), "--reward", spec,
                            *verbose], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300, cwd=tmp_path)
        last = p.stderr.strip().splitlines()[-1]
        assert p.returncode == 1 and last.startswith("error: ") and "--reward" not in last, p.stderr  # (the plug-in loaded; the data is next)
        assert ("loading my reward" in p.stdout + p.stderr) == bool(verbose), (verbose, p.stdout, p.stderr)
        if verbose:
            assert f"reward plug-in {spec} printed while imported: loading my reward" in p.stderr, p.stderr


def test_reward_record_hashes_the_file(plugins):
    from reasonrl.rewards.plugin import reward_record

    spec = f"{plugins}/parity.py:parity"
    rec = reward_record(spec)
    assert rec["spec"] == spec and rec["sha256"] == hashlib.sha256((plugins / "parity.py").read_bytes()).hexdigest()
    assert reward_record("math") == {"spec": "math", "file": None, "sha256": None}


# ------------------------------------------------------------------ scoring in the pool


def test_plugin_failures_score_minus_one_and_are_counted(plugins):
    from reasonrl.rewards import RewardScorer

    responses = ["good", "raise", "nan", "inf", "text", "sleep", "bad", "good Answer: 7", "exit"]
    infos = [{"prompt": "p", "data_source": "d", "extra_info": {}}] * len(responses)
    with RewardScorer(reward=f"{plugins}/bad.py:faulty", timeout_s=1.0, num_workers=1) as scorer:
        scores, st = scorer.score_batch(responses, ["1"] * len(responses), infos)
        by = dict(zip(responses, scores))
        assert by["good"].reward == 0.25 and by["good"].correct and by["good"].status == "ok"
        assert by["bad"].reward == -1.0 and not by["bad"].correct and by["bad"].status == "ok"  # False means -1, no error
        for r in ("raise", "nan", "inf", "text", "exit"):  # (a sys.exit in the function used to end the caller)
            assert (by[r].reward, by[r].correct, by[r].status) == (-1.0, False, "error"), r
        assert (by["sleep"].reward, by["sleep"].status) == (-1.0, "timeout")
        assert by["good Answer: 7"].extracted == "7"  # what maj@n votes on
        assert (st.reward_errors, st.errors, st.timeouts, st.total) == (6, 5, 1, len(responses))
        # the pool was replaced after the timeout and still scores
        again, st2 = scorer.score_batch(["good"], ["1"], infos[:1])
        assert again[0].reward == 0.25 and st2.reward_errors == 0


INFO = {"prompt": "p", "data_source": "d", "extra_info": {}}


def test_hanging_responses_in_flight_time_out_together(plugins):
    """Two hanging responses in flight on the two workers (the second handed out at least 0.2 s after the
    first) time out in the same round: one pool kill for both. The second used to be requeued with a
    fresh clock when the first expired, and cost a pool restart of its own."""
    from reasonrl.rewards import RewardScorer

    responses = ["hang a"] + ["slow"] * 4 + ["hang b"] + ["fine"] * 4
    with RewardScorer(reward=f"{plugins}/bad.py:hangs", timeout_s=1.0, num_workers=2) as scorer:
        scores, st = scorer.score_batch(responses, ["1"] * len(responses), [INFO] * len(responses))
    assert [s.status for s in scores] == ["timeout"] + ["ok"] * 4 + ["timeout"] + ["ok"] * 4
    assert (st.timeouts, st.reward_errors, st.pool_restarts) == (2, 2, 1)


def test_a_hanging_plugin_fails_fast_with_one_line(plugins):
    """16 responses on which the plug-in hangs: the run stops after PLUGIN_TIMEOUTS_IN_A_ROW (4) timeouts in
    a row -- two rounds of the two workers, two pool kills -- naming the plug-in; not 16 timeouts one after
    another, each with its pool restart (about 100 s at 5 s each)."""
    from reasonrl.rewards import RewardPluginError, RewardScorer
    from reasonrl.rewards.scorer import PLUGIN_TIMEOUTS_IN_A_ROW

    spec = f"{plugins}/bad.py:hangs"
    with RewardScorer(reward=spec, timeout_s=1.0, num_workers=2) as scorer:
        with pytest.raises(RewardPluginError) as e:
            scorer.score_batch(["hang"] * 16, ["1"] * 16, [INFO] * 16)
    st = e.value.stats
    assert PLUGIN_TIMEOUTS_IN_A_ROW == 4 and (st.timeouts, st.pool_restarts) == (4, 2), st
    msg = str(e.value)
    assert "\n" not in msg and spec in msg and "4 responses in a row" in msg and "1 s" in msg, msg


def test_keywords_are_passed_by_name_to_a_function_without_info(plugins):
    from reasonrl.rewards import RewardScorer

    with RewardScorer(reward=f"{plugins}/bad.py:named_only", num_workers=1) as scorer:
        scores, st = scorer.score_batch(["a", "b"], ["1", "1"], [{"prompt": "p", "data_source": "", "extra_info": {}},
                                                                 {"prompt": "q", "data_source": "", "extra_info": {}}])
    assert [s.reward for s in scores] == [1.0, -1.0] and st.reward_errors == 0


def test_a_plugin_failing_on_every_item_stops_with_one_line(plugins):
    from reasonrl.errors import ReasonRLError
    from reasonrl.rewards import RewardPluginError, RewardScorer

    with RewardScorer(reward=f"{plugins}/bad.py:always_raise", num_workers=1) as scorer:
        with pytest.raises(RewardPluginError) as e:
            scorer.score_batch(["x", "y"], ["1", "1"], [{"prompt": "p", "data_source": "", "extra_info": {}}] * 2)
    assert isinstance(e.value, ReasonRLError)
    msg = str(e.value)
    assert "\n" not in msg and "all 2 responses" in msg and "RuntimeError: the plug-in is broken" in msg


def test_the_example_plugin(tmp_path):
    from reasonrl.rewards import RewardScorer
    from reasonrl.rewards.plugin import load_plugin

    spec = f"{EXAMPLE}:exact_match"
    assert len(EXAMPLE.read_text().splitlines()) <= 10
    assert EXAMPLE.read_text() in (ROOT / "docs" / "rewards.md").read_text()  # the page shows the file as it is
    fn = load_plugin(spec)
    assert fn("so the sky is\nAnswer: Blue", "blue") == 1.0
    assert fn("Answer: green", "blue") == -1.0 and fn("no final answer", "blue") == -1.0
    with RewardScorer(reward=spec, num_workers=1) as scorer:
        scores, st = scorer.score_batch(["Answer: $(1, 2)$", "Answer: (2, 1)"], ["(1, 2)", "(1, 2)"],
                                        [{"prompt": "Name the pair.", "data_source": "t", "extra_info": {}}] * 2)
    assert [s.correct for s in scores] == [True, False] and st.reward_errors == 0


def test_maj_by_reward_judges_the_winning_answer_by_its_response():
    from reasonrl.evaluation.scores import per_problem_maj_by_reward, per_problem_values

    answers = [["a", "b", "a"], ["x", None, "y"], [None, None, None]]
    correct = [[True, False, False], [False, False, True], [True, True, True]]
    assert per_problem_maj_by_reward(correct, answers, equal=lambda pairs: [a == b for a, b in pairs]) == [1.0, 0.0, 0.0]
    v = per_problem_values(correct, answers, ["?", "?", "?"], ks=[1], equal=lambda pairs: [a == b for a, b in pairs], maj_by_reward=True)
    assert v["maj@3"] == [1.0, 0.0, 0.0]


# ------------------------------------------------------------------ end to end on the tiny random model


TINY = ["--engine", "hf", "--dtype", "fp32", "--max-response-len", "8", "--seed", "1"]


def _metrics(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


@pytest.mark.timeout(900)
def test_a_plugin_drives_rollout_train_and_eval(tmp_path, tiny_model, prepared, plugins):
    plugin = tmp_path / "reward.py"
    plugin.write_text(PARITY)
    spec = f"{plugin}:parity"
    sha = hashlib.sha256(plugin.read_bytes()).hexdigest()

    r = run_cli("rollout", "--model", tiny_model, "--data", prepared, "--out", tmp_path / "ro", "--num-prompts", "4", "--group-size", "4",
                "--reward", spec, "--quiet", *TINY)
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "ro" / "summary.json").read_text())
    assert summary["reward"] == spec and summary["reward_errors"] == 0 and summary["samples"] == 16
    manifest = json.loads((tmp_path / "ro" / "manifest.json").read_text())
    assert manifest["reward"]["spec"] == spec and manifest["reward"]["sha256"] == sha
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "ro" / "rollouts.parquet").to_pylist()
    for s in rows:  # the plug-in's reward, by length parity of the decoded text; correct = reward > 0
        assert s["reward"] == (1.0 if len(s["response"]) % 2 == 0 else -1.0) and s["correct"] == (s["reward"] > 0)

    r = run_cli("pretrain-value", "--model", tiny_model, "--data", prepared, "--out", tmp_path / "pv", "--steps", "1", "--prompts-per-step", "2",
                "--group-size", "2", "--mini-batch-size", "4", "--micro-batch-size", "2", "--eval-prompts", "2", "--reward", spec, "--quiet", *TINY)
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "pv" / "manifest.json").read_text())["reward"]["sha256"] == sha
    pv_steps = [m for m in _metrics(tmp_path / "pv" / "metrics.jsonl") if "rollout/reward_errors" in m]
    assert pv_steps and all(m["rollout/reward_errors"] == 0 for m in pv_steps)

    train = ["train", "--algo", "dapo", "--model", tiny_model, "--data", prepared, "--out", tmp_path / "tr", "--group-size", "4",
             "--prompts-per-step", "2", "--mini-batch-size", "4", "--micro-batch-size", "2", "--max-gen-rounds", "3", "--lr", "1e-3",
             "--save-every", "1", "--val-every", "2", "--val-n", "2", "--val-bootstrap", "20", "--reward", spec, "--quiet", *TINY]
    r = run_cli(*train, "--steps", "2")
    assert r.exit_code == 0, r.output
    ms = _metrics(tmp_path / "tr" / "metrics.jsonl")
    steps = [m for m in ms if "rollout/reward_mean" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert m["rollout/reward_errors"] == 0
        assert m["rollout/ds_kept_groups"] + m["rollout/ds_dropped_all_correct"] + m["rollout/ds_dropped_all_wrong"] == m["rollout/ds_generated_groups"]
        assert m["rollout/acc_mean"] == pytest.approx((m["rollout/reward_mean"] + 1) / 2)  # rewards are ±1: acc = P(reward > 0)
    vals = _metrics(tmp_path / "tr" / "validation.jsonl") if (tmp_path / "tr" / "validation.jsonl").is_file() else []
    val_ms = [m for m in ms if "val/reward_errors" in m] + [v for v in vals if "val/reward_errors" in v]
    assert val_ms and all(m["val/reward_errors"] == 0 for m in val_ms)
    manifest = json.loads((tmp_path / "tr" / "manifest.json").read_text())
    assert manifest["reward"] == {"spec": spec, "file": str(plugin.resolve()), "sha256": sha}

    # the plug-in file changed: a resume is refused (one line), the run is left as it was
    plugin.write_text(PARITY.replace("% 2 == 0", "% 2 == 1"))
    r = run_cli(*train, "--steps", "3", "--resume")
    assert r.exit_code == 1 and "the reward plug-in" in r.output and "changed since the run started" in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert _metrics(tmp_path / "tr" / "metrics.jsonl") == ms
    plugin.write_text(PARITY)  # the same file again: the resume goes on
    r = run_cli(*train, "--steps", "3", "--resume")
    assert r.exit_code == 0, r.output
    assert [m["step"] for m in _metrics(tmp_path / "tr" / "metrics.jsonl") if "rollout/reward_mean" in m] == [1, 2, 3]

    r = run_cli("eval", "file", "--dataset", prepared, "--model", tmp_path / "tr" / "policy", "--out", tmp_path / "ev", "--n", "4",
                "--max-problems", "3", "--ks", "1", "--bootstrap", "20", "--reward", spec, "--quiet", *TINY)
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert res["reward"] == spec and res["reward_errors"] == 0
    samples = [json.loads(ln) for ln in (tmp_path / "ev" / "samples.jsonl").read_text().splitlines()]
    assert all(s["correct"] == (len(s["response"]) % 2 == 0) for s in samples)
    assert res["metrics"]["avg@4"]["value"] == pytest.approx(sum(s["correct"] for s in samples) / len(samples))
    assert json.loads((tmp_path / "ev" / "manifest.json").read_text())["reward"]["sha256"] == sha


HUGE = "def huge(response, ground_truth, **info):\n    return 1e300 if len(response) % 2 else -1e300\n"


def test_a_reward_beyond_the_bound_is_an_error(tmp_path):
    """|reward| > REWARD_BOUND (1e6) scores -1 and is counted, as a NaN is; the bound itself passes."""
    from reasonrl.rewards.plugin import REWARD_BOUND, as_reward

    assert REWARD_BOUND == 1e6 and as_reward(1e6) == 1e6 and as_reward(-1e6) == -1e6
    for bad in (1e300, -1e300, 1e6 * (1 + 1e-9)):
        with pytest.raises(ValueError, match="bound"):
            as_reward(bad)


@pytest.mark.timeout(600)
def test_huge_rewards_stop_train_with_one_line_naming_the_plugin(tmp_path, tiny_model, prepared):
    """±1e300 rewards (every response): one line naming the plug-in and the bound; they used to pass,
    overflow the group std, and stop the run blaming --lr with "the last good checkpoint is None"."""
    (tmp_path / "huge.py").write_text(HUGE)
    spec = f"{tmp_path / 'huge.py'}:huge"
    r = run_cli("train", "--algo", "grpo", "--model", tiny_model, "--data", prepared, "--out", tmp_path / "tr", "--group-size", "2",
                "--prompts-per-step", "2", "--mini-batch-size", "4", "--micro-batch-size", "2", "--steps", "1", "--quiet",
                "--reward", spec, *TINY)
    assert r.exit_code == 1, r.output
    last = r.output.strip().splitlines()[-1]
    assert last.startswith(f"error: reward plug-in {spec} failed on all") and "1e+300" in last and "1e+06" in last, last
    assert "None" not in r.output and "Traceback" not in r.output, r.output


@pytest.mark.timeout(600)
def test_a_plugin_that_always_fails_stops_train_with_one_line(tmp_path, tiny_model, prepared, plugins):
    r = run_cli("train", "--algo", "grpo", "--model", tiny_model, "--data", prepared, "--out", tmp_path / "tr", "--group-size", "2",
                "--prompts-per-step", "2", "--mini-batch-size", "4", "--micro-batch-size", "2", "--steps", "1", "--quiet",
                "--reward", f"{plugins}/bad.py:always_raise", *TINY)
    assert r.exit_code == 1, r.output
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("error: reward plug-in") and "RuntimeError: the plug-in is broken" in last
    assert "Traceback" not in r.output
