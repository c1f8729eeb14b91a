"""`reasonrl ablate`: the presets' rungs, bad input, and a 2-rung × 2-seed ablation of real `train`
runs on the tiny model (a SIGKILLed driver rerun to the end, a SIGTERMed one resumed, --dry-run, --collect, the report)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clihelp import assert_user_error, run_cli
from reasonrl.algos import ALGOS
from reasonrl.stages.ablate import AblateConfig
from reasonrl.stages.ablation.jobs import make_jobs
from reasonrl.stages.ablation.plan import PRESETS, critic_config, make_plan, train_config

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------ presets (no runs)


def _specs(preset: str, out: Path) -> dict[str, tuple[object, object]]:
    """Each rung's (train config, resolved AlgoSpec) for seed 0, as its subprocess builds it."""
    (out / "data").mkdir(exist_ok=True)
    plan = make_plan(AblateConfig(preset=preset, seeds=2, out=str(out), sets=[f"data={out / 'data'}"]))
    return {r.name: (c := train_config(plan, r, 0, out), c.algo_spec()) for r in plan.rungs}


def _fields(spec: object) -> dict:
    return {k: v for k, v in dataclasses.asdict(spec).items() if k != "name"}


def test_dapo_preset_is_the_papers_ladder(tmp_path):
    rungs = _specs("dapo", tmp_path)
    assert list(rungs) == ["grpo", "overlong-filter", "clip-higher", "soft-overlong", "token-mean", "dynamic-sampling"]
    grpo = rungs["grpo"][1]
    assert _fields(grpo) == _fields(ALGOS["grpo"])  # naive GRPO: clip 0.2 / 0.2, seq-mean-token-mean, no filtering, shaping or dynamic sampling
    assert (grpo.eps_low, grpo.eps_high, grpo.loss_agg) == (0.2, 0.2, "seq-mean-token-mean")
    assert not (grpo.overlong_filter or grpo.overlong_penalty or grpo.dynamic_sampling)
    added = [("overlong_filter", True), ("eps_high", 0.28), ("overlong_penalty", True), ("loss_agg", "token-mean"), ("dynamic_sampling", True)]
    specs = [s for _, s in rungs.values()]
    for i, (k, v) in enumerate(added, 1):  # each rung: the one before plus one technique, in the paper's order
        before, now = _fields(specs[i - 1]), _fields(specs[i])
        assert now[k] == v and {f for f in now if now[f] != before[f]} == {k}
    assert _fields(specs[-1]) == _fields(ALGOS["dapo"])  # the last rung is the dapo row
    cfg = rungs["grpo"][0]
    assert cfg.val_every >= 1 and cfg.seed == 0 and cfg.out == str(tmp_path / "grpo" / "seed-0")


def test_vcppo_and_lambda_presets(tmp_path):
    v = _specs("vcppo", tmp_path)
    assert list(v) == ["ppo", "value-pretraining", "decoupled-gae"]
    assert v["ppo"][0].critic is None and _fields(v["ppo"][1]) == _fields(ALGOS["ppo"])  # a fresh critic
    critic = str(tmp_path / "_critic" / "seed-0")
    assert v["value-pretraining"][0].critic == critic and _fields(v["value-pretraining"][1]) == _fields(ALGOS["ppo"])
    assert v["decoupled-gae"][0].critic == critic and _fields(v["decoupled-gae"][1]) == _fields(ALGOS["vcppo"])
    assert v["decoupled-gae"][1].lam_critic == 1.0 and v["value-pretraining"][1].lam_critic == 0.95
    lam = _specs("lambda", tmp_path)
    assert [s.lam_actor for _, s in lam.values()] == [0.9, 0.95, 0.99, 1.0]
    assert all(s.lam_critic == 1.0 and s.pretrained_critic_required and c.critic == critic for c, s in lam.values())
    # the critics run first, one per seed (pretrain-value: λ = 1 targets from the fixed policy), each rung's runs after theirs
    jobs = make_jobs(make_plan(AblateConfig(preset="lambda", seeds=2, out=str(tmp_path), sets=[f"data={tmp_path / 'data'}"])), tmp_path)
    assert [j.label for j in jobs[:2]] == ["_critic/seed-0", "_critic/seed-1"] and all(j.stage == "pretrain-value" for j in jobs[:2])
    assert all(j.needs is jobs[j.seed] and "--critic" in j.argv and "--seed" in j.argv for j in jobs[2:])
    assert len({j.line() for j in jobs}) == len(jobs) == 2 + 4 * 2
    # the presets' critics pretrain for 8 steps (not the main job's 2-step smoke), as built for the subprocess
    for name in ("vcppo", "lambda"):
        plan = make_plan(AblateConfig(preset=name, seeds=1, out=str(tmp_path), sets=[f"data={tmp_path / 'data'}"]))
        assert critic_config(plan, 0, tmp_path).steps == 8
    assert PRESETS["dapo"].base == "train-dapo-cpu.toml" and PRESETS["vcppo"].base == "train-vcppo-cpu.toml"


def test_every_train_run_checkpoints_at_its_validation_steps(tmp_path):
    """A run stopped mid-way (a session's end) resumes from its last validation step, not from scratch;
    a recipe's or --set's own interval wins, and only the newest checkpoint is kept."""
    (tmp_path / "data").mkdir()
    cfgs = [train_config(plan, r, 0, tmp_path) for plan in [make_plan(AblateConfig(preset="vcppo", seeds=1, out=str(tmp_path), sets=[f"data={tmp_path / 'data'}"]))]
            for r in plan.rungs]
    assert all((c.save_every, c.keep_last) == (c.val_every, 1) == (4, 1) for c in cfgs)
    plan = make_plan(AblateConfig(preset="dapo", seeds=1, steps=6, val_every=3, out=str(tmp_path), sets=[f"data={tmp_path / 'data'}", "save_every=2", "keep_last=3"]))
    assert all((train_config(plan, r, 0, tmp_path).save_every, train_config(plan, r, 0, tmp_path).keep_last) == (2, 3) for r in plan.rungs)
    assert "--save-every 2 --keep-last 3" in make_jobs(plan, tmp_path)[0].line()


def test_a_stopped_run_resumes_in_the_dtype_it_began_in(tmp_path):
    """A ladder resumed where --dtype auto resolves otherwise (a later session's or another node's CPU,
    with native bf16 where the first had none, or the reverse): the resume names the dtype the run began
    in, which train requires; where auto resolves the same, or the run's dtype was explicit, it does not."""
    from reasonrl.devices import resolve_dtype

    (tmp_path / "data").mkdir()
    plan = make_plan(AblateConfig(preset="dapo", seeds=1, out=str(tmp_path), sets=[f"data={tmp_path / 'data'}"]))
    here, other = resolve_dtype("auto"), {"bf16": "fp32", "fp32": "bf16"}[resolve_dtype("auto")]
    d = tmp_path / plan.rungs[0].name / "seed-0"
    (d / "checkpoints" / "step_2").mkdir(parents=True)
    (d / "checkpoints" / "step_2" / "trainer_state.json").write_text("{}")
    for cfg, pinned in (({"dtype": "auto", "dtype_resolved": other}, other), ({"dtype": "auto", "dtype_resolved": here}, None),
                        ({"dtype": other, "dtype_resolved": other}, None), (None, None)):
        if cfg is None:
            (d / "config.json").write_text("{not json")  # damaged: train --resume reports it
        else:
            (d / "config.json").write_text(json.dumps(cfg))
        job = make_jobs(plan, tmp_path)[0]
        assert job.start == "resume" and job.argv[-1] == "--resume", job.line()
        assert (job.argv[-3:-1] == ["--dtype", pinned]) if pinned else "--dtype" not in job.argv, (cfg, job.line())
        assert "--dtype" not in make_jobs(plan, tmp_path)[1].argv  # a run not begun takes the recipe's dtype


def test_set_takes_trains_filter_rollouts_by_either_name(tmp_path):
    """Issue 37: `--set filter_rollouts=DIR` reaches every train run; `--set rollouts=DIR`, its old name, too
    (with the old name, the critics' pretrain-value runs take it as well, as before: their `rollouts`)."""
    (tmp_path / "data").mkdir()
    for key in ("filter_rollouts", "rollouts"):
        plan = make_plan(AblateConfig(preset="vcppo", seeds=1, out=str(tmp_path), sets=[f"data={tmp_path / 'data'}", f"{key}=ro"]))
        assert all(train_config(plan, r, 0, tmp_path).filter_rollouts == "ro" for r in plan.rungs)
        assert (critic_config(plan, 0, tmp_path).rollouts == "ro") == (key == "rollouts")


@pytest.fixture
def data_dir(tmp_path) -> Path:
    (tmp_path / "data").mkdir()
    return tmp_path / "data"


@pytest.mark.parametrize("args,needles", [
    ([], ["give one of --preset"]),
    (["--preset", "nope"], ["unknown --preset 'nope'", "dapo"]),
    (["--preset", "dapo", "--spec", "x.toml"], ["--preset and --spec conflict"]),
    (["--preset", "dapo", "--set", "out=elsewhere"], ["ablate sets 'out'"]),
    (["--preset", "dapo", "--set", "seed=3"], ["--seeds"]),
    (["--preset", "dapo", "--set", "no_such_key=1"], ["rung grpo", "unknown key 'no_such_key'"]),
    (["--preset", "dapo", "--set", "eps_high=-1"], ["eps_high"]),
    (["--preset", "dapo", "--set", "lr"], ["key=value"]),
    (["--preset", "dapo", "--jobs", "0"], ["jobs must be >= 1"]),
    (["--spec", "missing.toml"], ["spec missing.toml not found", "--spec"]),
    (["--preset", "dapo", "--set", "data=no/such/dir"], ["no/such/dir not found", "--set data="]),
    (["--preset", "dapo", "--dry-run", "--drop-checkpoints"], ["--dry-run writes and deletes nothing", "drop --drop-checkpoints"]),
])
def test_bad_input_is_one_line_before_anything_runs(args, needles, tmp_path, monkeypatch, data_dir):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "abl"
    data = [] if "--set" in args and any(a.startswith("data=") for a in args) or "--preset" not in args else ["--set", f"data={data_dir}"]
    assert_user_error(run_cli("ablate", *args, *data, "--out", out), *needles)
    assert not out.exists()


@pytest.mark.parametrize("spec,needles", [
    ('seeds = 2\n[[rung]]\nname = "a"\n', ["has no base"]),
    ('base = "train-dapo-cpu.toml"\n', ["has no rungs"]),
    ('base = "train-dapo-cpu.toml"\n[[rung]]\nalgo = "grpo"\n', ["rung 1 has no name"]),
    ('base = "train-dapo-cpu.toml"\n[[rung]]\nname = "a"\n[[rung]]\nname = "a"\n', ["'a' is used twice"]),
    ('base = "train-dapo-cpu.toml"\n[[rung]]\nname = "_x"\n', ["rung name '_x'"]),
    ('base = "train-dapo-cpu.toml"\n[[rung]]\nname = "a"\nalgo = "nope"\n', ["rung a", "unknown --algo 'nope'"]),
    ('base = "train-dapo-cpu.toml"\n[[rung]]\nname = "a"\nsteps = 3\n', ["ablate sets 'steps'"]),
    ('base = "nope.toml"\n[[rung]]\nname = "a"\n', ["base recipe nope.toml not found"]),
    ('base = "train-dapo-cpu.toml"\nseeds = 0\n[[rung]]\nname = "a"\n', ["seeds must be"]),
    ('base = "train-dapo-cpu.toml"\nrungs = 1\n[[rung]]\nname = "a"\n', ["unknown key 'rungs'"]),
    ('base = "train-dapo-cpu.toml"\n[[rung]\n', ["not valid TOML"]),
    ('base = "train-dapo-cpu.toml"\n[[rung]]\nname = "a"\nvs = "b"\n[[rung]]\nname = "b"\n', ["rung a: vs = 'b' names no rung above it"]),
    ('base = "train-dapo-cpu.toml"\n[[rung]]\nname = "a"\n[[rung]]\nname = "b"\nvs = 1\n', ["rung b: vs must be the name of another rung"]),
])
def test_a_bad_spec_is_one_line(spec, needles, tmp_path):
    (tmp_path / "s.toml").write_text(spec)
    (tmp_path / "data").mkdir()
    assert_user_error(run_cli("ablate", "--spec", tmp_path / "s.toml", "--set", f"data={tmp_path / 'data'}", "--out", tmp_path / "abl"), *needles)
    assert not (tmp_path / "abl").exists()


def test_collect_needs_an_ablation(tmp_path):
    (tmp_path / "empty").mkdir()
    assert_user_error(run_cli("ablate", "--collect", tmp_path / "empty"), "no plan.json")


# ------------------------------------------------------------------------------------ real runs


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}


def _ablate(*args: object) -> list[str]:
    return [sys.executable, "-m", "reasonrl.cli", "ablate", *[str(a) for a in args]]


def _spec(tmp: Path, model: Path, data: Path, rungs: str, *, steps: int) -> Path:
    """A tiny base recipe (fp32, the HF engine, 8-token responses, validation on the 4 held-out
    problems × 2) and a spec over it."""
    (tmp / "tiny.toml").write_text(f'''model = "{model}"
data = "{data}"
engine = "hf"
dtype = "fp32"
algo = "grpo"
group_size = 2
prompts_per_step = 2
mini_batch_size = 4
micro_batch_size = 2
max_response_len = 8
overlong_cache_len = 2
lr = 1e-3
val_n = 2
val_bootstrap = 20
report_to = ["none"]
''')
    spec = tmp / "spec.toml"
    spec.write_text(f'base = "tiny.toml"\nseeds = 2\nsteps = {steps}\n[train]\nsave_every = 1\n{rungs}')
    return spec


def _lines(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


TWO_RUNGS = '[[rung]]\nname = "grpo"\n[[rung]]\nname = "clip-higher"\nalgo.eps_high = 0.28\n'


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ablation_killed_rerun_dry_run_collect_report(format_model, prepared, tmp_path):
    spec = _spec(tmp_path, format_model, prepared, TWO_RUNGS, steps=2)
    out = tmp_path / "abl"
    runs = [out / r / f"seed-{s}" for s in (0, 1) for r in ("grpo", "clip-higher")]  # seed-major: a partial ablation holds whole ladders

    # --dry-run: one command per run on stdout, each a plain `train` of the same CLI; nothing run
    dry = subprocess.run(_ablate("--spec", spec, "--out", out, "--dry-run"), env=_env(), capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0, dry.stderr[-2000:]
    lines = dry.stdout.splitlines()
    assert len(lines) == 4 and all(ln.startswith(f"{sys.executable} -m reasonrl.cli train --config ") for ln in lines)
    assert [ln.split("--out ")[1].split()[0] for ln in lines] == [str(r) for r in runs]
    assert all("--seed 0" in ln for ln in lines[:2]) and all("--seed 1" in ln for ln in lines[2:])  # one seed: the same --seed in every rung
    assert "--set algo.eps_high=0.28" in lines[1] and "algo.eps_high" not in lines[0]
    assert not any(r.exists() for r in runs) and (out / "plan.json").is_file() and not (out / "manifest.json").exists()

    # the ablation, SIGKILLed (the driver's whole process group) once a run has finished and the next has checkpointed its step 1
    p = subprocess.Popen(_ablate("--spec", spec, "--out", out), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    killed = None
    while p.poll() is None and killed is None:
        done = [r for r in runs if (r / "manifest.json").is_file()]
        mid = [r for r in runs if (r / "checkpoints" / "step_1").is_dir() and not (r / "manifest.json").exists()]
        if done and mid:
            os.killpg(p.pid, signal.SIGKILL)
            killed = mid[0]
        time.sleep(0.01)
    p.wait(timeout=60)
    assert killed is not None, f"the ablation ended before the kill: {p.returncode}, {p.stderr.read().decode()[-2000:]}"
    time.sleep(0.5)  # (the group's processes are gone)
    finished = [r for r in runs if (r / "manifest.json").is_file()]
    assert finished and killed not in finished and not (out / "manifest.json").exists()

    # --collect on the partial ablation: the table from the finished runs, the others named unfinished
    part = run_cli("ablate", "--collect", out)
    assert part.exit_code == 0, part.output
    doc = json.loads((out / "ablation.json").read_text())
    assert not doc["complete"] and f"{killed.parent.name}/{killed.name}" in doc["unfinished"] and not (out / "manifest.json").exists()

    # a dry run now: the finished runs left out, the killed one resumed
    dry2 = subprocess.run(_ablate("--spec", spec, "--out", out, "--dry-run"), env=_env(), capture_output=True, text=True, timeout=300)
    assert dry2.returncode == 0 and len(dry2.stdout.splitlines()) == 4 - len(finished), dry2.stderr[-2000:]
    assert any(ln.endswith("--resume") and f"--out {killed} " in ln for ln in dry2.stdout.splitlines()), dry2.stdout

    # the same command again (2 at once): finished runs skipped, the killed one resumed, the rest run
    before = {r: (r / "manifest.json").stat().st_mtime_ns for r in finished}
    again = subprocess.run(_ablate("--spec", spec, "--out", out, "--jobs", "2"), env=_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {r: (r / "manifest.json").stat().st_mtime_ns for r in finished} == before  # not rerun
    log = (out / "logs" / f"{killed.parent.name}-seed-{killed.name[5:]}.log").read_text()
    assert log.count("\n=== ") == 2 and log.split("\n=== ")[-1].splitlines()[0].endswith("--resume") and "resumed from" in log
    for r in runs:
        assert (r / "manifest.json").is_file()
        assert [m["step"] for m in _lines(r / "metrics.jsonl")] == [0, 1, 2]  # each step once, the resumed run's too
        assert [v["step"] for v in _lines(r / "validation.jsonl")] == [0, 2]
    doc = json.loads((out / "ablation.json").read_text())
    assert doc["complete"] and not doc["failed"] and json.loads((out / "manifest.json").read_text())["stage"] == "ablate"
    grpo, clip = doc["rungs"]
    for row in (grpo, clip):
        assert row["seeds_finished"] == [0, 1] and row["metric"] == "avg@2"
        for k in ("final", "best", "auc"):
            assert 0 <= row[k]["ci"][0] <= row[k]["value"] <= row[k]["ci"][1] <= 1 and len(row[k]["per_seed"]) == 2
            assert 0 <= row[k]["ci_problems"][0] <= row[k]["value"] <= row[k]["ci_problems"][1] <= 1
        assert row["best"]["value"] >= row["final"]["value"] and row["entropy_final"] > 0 and row["step_s"] > 0
        assert row["peak_rss_gib"] > 0.1 and row["checkpoint_mib"] > 0  # (the runs' own measurement and their last checkpoint)
    d = clip["vs_previous"]["final"]
    assert clip["vs_previous"]["rung"] == "grpo" and d["problems"] == 2 * 4 and d["seeds"] == [0, 1]
    assert d["value"] == pytest.approx(clip["final"]["value"] - grpo["final"]["value"]) and d["ci"][0] <= d["value"] <= d["ci"][1]
    assert d["ci_problems"][0] <= d["value"] <= d["ci_problems"][1] and len(d["per_seed"]) == 2
    assert "vs_previous" not in grpo
    assert "clip-higher" in again.stdout and "Δ final" in again.stdout and "peak GiB" in again.stdout

    # --collect on the finished ablation: the same table
    coll = run_cli("ablate", "--collect", out)
    assert coll.exit_code == 0, coll.output
    assert json.loads((out / "ablation.json").read_text())["rungs"] == doc["rungs"]

    # the report overlays the rungs
    rep = run_cli("report", out, "--out", tmp_path / "report")
    assert rep.exit_code == 0, rep.output
    assert (tmp_path / "report" / "ablation.png").is_file()
    assert "ablation" not in json.loads((tmp_path / "report" / "manifest.json").read_text())["skipped"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_drop_checkpoints_deletes_a_finished_runs_checkpoints_only(format_model, prepared, tmp_path):
    """--drop-checkpoints: a run finished before (skipped) and one finished now lose checkpoints/ and
    keep what the table and the user read; a run stopped by SIGTERM keeps its checkpoint and resumes.
    (6 steps: the SIGTERM, sent once step 1 is saved, stops the run well before its end.)"""
    spec = _spec(tmp_path, format_model, prepared, TWO_RUNGS, steps=6)
    out = tmp_path / "abl"
    grpo, clip = out / "grpo" / "seed-0", out / "clip-higher" / "seed-0"
    args = ("--spec", spec, "--out", out, "--seeds", "1")
    first = subprocess.run(_ablate(*args), env=_env(), capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    assert (grpo / "checkpoints" / "step_6").is_dir() and (clip / "checkpoints" / "step_6").is_dir()  # kept without the flag
    shutil.rmtree(clip)  # clip-higher runs again, SIGTERMed once it has checkpointed step 1
    p = subprocess.Popen(_ablate(*args, "--drop-checkpoints"), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while p.poll() is None and not (clip / "checkpoints" / "step_1").is_dir():
        time.sleep(0.01)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=300)
    assert p.returncode != 0 and "rerun the same command" in err, err[-2000:]
    assert not (grpo / "checkpoints").exists() and (grpo / "manifest.json").is_file()  # finished before: its checkpoints went first
    assert (clip / "checkpoints").is_dir() and not (clip / "manifest.json").exists()  # stopped: kept, to resume
    again = subprocess.run(_ablate(*args, "--drop-checkpoints"), env=_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resumed from" in (out / "logs" / "clip-higher-seed-0.log").read_text()
    for r in (grpo, clip):
        assert not (r / "checkpoints").exists() and (r / "manifest.json").is_file() and (r / "policy").is_dir()
        assert [m["step"] for m in _lines(r / "metrics.jsonl")] == list(range(7)) and [v["step"] for v in _lines(r / "validation.jsonl")] == [0, 6]
    doc = json.loads((out / "ablation.json").read_text())
    assert doc["complete"] and all(math.isnan(row["checkpoint_mib"]) for row in doc["rungs"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigterm_to_the_driver_is_passed_on_and_a_rerun_resumes(format_model, prepared, tmp_path):
    """SIGTERM to the driver alone (a scheduler stopping the job): the running `train` gets it, stops at a step
    boundary with a checkpoint, the driver waits for it and exits 143 with one line; the same command then resumes."""
    spec = _spec(tmp_path, format_model, prepared, '[[rung]]\nname = "grpo"\n', steps=4)
    spec.write_text(spec.read_text().replace("seeds = 2", "seeds = [0]"))
    out = tmp_path / "abl"
    run = out / "grpo" / "seed-0"
    p = subprocess.Popen(_ablate("--spec", spec, "--out", out), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    while p.poll() is None and not (run / "checkpoints" / "step_1").is_dir():
        time.sleep(0.01)
    assert p.poll() is None, p.stderr.read()[-2000:]
    os.kill(p.pid, signal.SIGTERM)  # (the driver only: not its process group)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 143, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("ablate stopped by SIGTERM (passed on to grpo/seed-0)"), err[-2000:]
    log = (out / "logs" / "grpo-seed-0.log").read_text()
    assert "stopped by SIGTERM" in log and "continue with the same command and --resume" in log, log[-2000:]
    assert not (run / "manifest.json").exists() and (run / "checkpoints" / "latest").is_file()
    stopped_at = int((run / "checkpoints" / "latest").read_text().strip().removeprefix("step_"))
    assert 1 <= stopped_at < 4 and [m["step"] for m in _lines(run / "metrics.jsonl")] == list(range(0, stopped_at + 1))
    time.sleep(0.5)
    assert not [d for d in Path("/proc").iterdir() if d.name.isdigit() and _session_of(d) == p.pid]  # nothing left of the job
    again = subprocess.run(_ablate("--spec", spec, "--out", out), env=_env(), capture_output=True, text=True, timeout=400)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in (out / "logs" / "grpo-seed-0.log").read_text()
    assert [m["step"] for m in _lines(run / "metrics.jsonl")] == [0, 1, 2, 3, 4] and (out / "manifest.json").is_file()


def _session_of(proc: Path) -> int | None:
    """The session id of a /proc entry (None when it is gone or a zombie)."""
    try:
        stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if stat[0] == "Z" else int(stat[3])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_failed_run_is_reported_and_the_others_run(format_model, prepared, tmp_path):
    """A rung whose runs fail (a critic that is not there), and one on the seed's pretrained critic
    (a pretrain-value run made first): the failure is named, the other rung runs."""
    rungs = ('[[rung]]\nname = "broken"\nalgo = "ppo"\ncritic = "/nonexistent/critic"\n'
             '[[rung]]\nname = "vc"\nalgo = "vcppo"\npretrained_critic = true\n')
    spec = _spec(tmp_path, format_model, prepared, rungs, steps=1)
    (tmp_path / "critic.toml").write_text(f'model = "{format_model}"\ndata = "{prepared}"\nengine = "hf"\ndtype = "fp32"\nsteps = 1\n'
                                          'prompts_per_step = 2\ngroup_size = 2\nmax_response_len = 8\nmini_batch_size = 4\nmicro_batch_size = 2\n'
                                          'eval_prompts = 2\nreport_to = ["none"]\n')
    spec.write_text(spec.read_text().replace("seeds = 2", 'seeds = [0]\ncritic_base = "critic.toml"'))
    out = tmp_path / "abl"
    r = subprocess.run(_ablate("--spec", spec, "--out", out, "--jobs", "2"), env=_env(), capture_output=True, text=True, timeout=500)
    assert r.returncode == 1, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1].startswith("error: 1 run(s) failed: broken/seed-0"), r.stderr[-2000:]
    doc = json.loads((out / "ablation.json").read_text())
    broken, vc = doc["rungs"]
    assert broken["runs"]["0"]["status"] == "failed" and "critic /nonexistent/critic not found" in broken["runs"]["0"]["error"]
    assert vc["runs"]["0"]["status"] == "finished" and vc["seeds_finished"] == [0] and "vs_previous" not in vc
    assert doc["critics"]["_critic/seed-0"]["status"] == "done" and (out / "_critic" / "seed-0" / "manifest.json").is_file()
    assert json.loads((out / "vc" / "seed-0" / "config.json").read_text())["critic"] == str(out / "_critic" / "seed-0")
    assert doc["failed"] == ["broken/seed-0"] and not doc["complete"] and not (out / "manifest.json").exists()
    assert "failed" in r.stdout  # (the table's seeds column)


def test_a_spec_plans_its_rungs_and_critics(tmp_path):
    """Flat or quoted dotted ("algo.eps_high") --algo fields, [train] for every run (the CLI's --set after it), [critic] for
    the critics (their own steps), a rung with the pretrained critic."""
    (tmp_path / "s.toml").write_text('base = "train-dapo-cpu.toml"\nseeds = [3, 5]\n[train]\nlr = 2e-5\n[critic]\nsteps = 4\n'
                                     '[[rung]]\nname = "flat"\nalgo = "grpo"\neps_high = 0.3\n'
                                     '[[rung]]\nname = "dotted"\nalgo = "grpo"\n"algo.eps_high" = 0.3\n'
                                     '[[rung]]\nname = "vc"\nalgo = "vcppo"\npretrained_critic = true\n')
    (tmp_path / "data").mkdir()
    cfg = AblateConfig(spec=str(tmp_path / "s.toml"), out=str(tmp_path / "abl"), sets=["lr=3e-5", "engine=hf", f"data={tmp_path / 'data'}"])
    plan = make_plan(cfg)
    assert plan.seeds == [3, 5] and plan.sets == {"lr": "3e-5", "engine": "hf", "data": str(tmp_path / "data")}
    flat, dotted, vc = (train_config(plan, r, 3, tmp_path / "abl") for r in plan.rungs)
    assert flat.algo_spec() == dotted.algo_spec() and flat.algo_spec().eps_high == 0.3 and flat.lr == 3e-5 and flat.engine == "hf"
    assert vc.critic == str(tmp_path / "abl" / "_critic" / "seed-3") and vc.seed == 3
    jobs = make_jobs(plan, tmp_path / "abl")
    critic = jobs[0]
    assert critic.stage == "pretrain-value" and critic.seed == 3 and "steps=4" in critic.argv and "engine=hf" in critic.argv
    assert not any(a.startswith("lr=") for a in critic.argv)  # (pretrain-value has critic_lr, not lr)
    assert [j.label for j in jobs if j.needs is critic] == ["vc/seed-3"]


# ------------------------------------------------------------------------------------ the table (no runs)


def _finished_run(d: Path, vals: dict[int, list[float]], dtype: str | None = None) -> None:
    """A finished train run as the table reads it: its manifest, validation.jsonl (per problem) and metrics.jsonl
    (and config.json's dtype_resolved, given a dtype)."""
    d.mkdir(parents=True)
    if dtype is not None:
        (d / "config.json").write_text(json.dumps({"dtype": "auto", "dtype_resolved": dtype}))
    (d / "manifest.json").write_text(json.dumps({"stage": "train"}))
    (d / "validation.jsonl").write_text("".join(json.dumps({"step": s, "where": ["p1", "p2"], "avg@2": v}) + "\n" for s, v in vals.items()))
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "actor/entropy": 0.5}) + "\n" for s in range(max(vals) + 1)))


def test_the_delta_says_when_final_validations_are_at_different_steps(tmp_path):
    """Early stopping (or another val_every) ends a rung's runs at another step: its Δ final then pairs step 6
    with step 8, which the table marks and ablation.json names, seed by seed (the same steps: no mark)."""
    from rich.console import Console

    from reasonrl.stages.ablation.stats import summarise
    from reasonrl.stages.ablation.table import print_table

    out = tmp_path / "abl"
    _finished_run(out / "a" / "seed-0", {0: [0.0, 0.0], 4: [0.5, 0.0], 8: [0.5, 0.5]})
    _finished_run(out / "a" / "seed-1", {0: [0.0, 0.0], 4: [0.5, 0.0], 8: [1.0, 0.5]})
    _finished_run(out / "b" / "seed-0", {0: [0.0, 0.0], 4: [1.0, 0.5], 6: [1.0, 0.0]})  # early-stopped at 6
    _finished_run(out / "b" / "seed-1", {0: [0.0, 0.0], 4: [0.5, 0.5], 8: [1.0, 1.0]})
    _finished_run(out / "c" / "seed-0", {0: [0.0, 0.0], 4: [0.5, 0.5], 6: [1.0, 1.0]})
    _finished_run(out / "c" / "seed-1", {0: [0.0, 0.0], 4: [0.5, 0.5], 8: [1.0, 1.0]})
    plan = {"source": "spec", "base": "x.toml", "steps": 8, "val_every": 4, "seeds": [0, 1],
            "rungs": [{"name": n, "sets": {}, "pretrained_critic": False} for n in "abc"]}
    doc = summarise(plan, out, {}, 20)
    a, b, c = doc["rungs"]
    assert b["vs_previous"]["steps_differ"] == [{"seed": 0, "final_step": 6, "previous_final_step": 8}]
    assert b["vs_previous"]["final"]["value"] == pytest.approx(0.125)  # (still the paired difference of the final validations)
    assert "steps_differ" not in c["vs_previous"]  # b and c end at the same steps, seed by seed
    assert "vs_previous" not in a
    console = Console(record=True, width=80)
    print_table(doc, console)
    text = console.export_text()
    row = next(ln for ln in text.splitlines() if ln.strip().startswith("b "))
    assert "†" in row and "†" not in next(ln for ln in text.splitlines() if ln.strip().startswith("c "))
    assert "† b: final validations at different steps (seed 0: step 6 vs 8)" in " ".join(text.split())


def test_the_delta_says_when_paired_runs_computed_in_different_dtypes(tmp_path):
    """A ladder whose runs ran on machines where --dtype auto resolves differently (bf16 on one CPU,
    fp32 on the next; job-array nodes): the rung whose seed pairs an fp32 run with a bf16 one is
    marked, ablation.json names the seed and the dtypes; runs in one dtype (or without a record) are not."""
    from rich.console import Console

    from reasonrl.stages.ablation.stats import summarise
    from reasonrl.stages.ablation.table import print_table

    out = tmp_path / "abl"
    for name, dtypes in (("a", ("bf16", "fp32")), ("b", ("fp32", "fp32")), ("c", ("fp32", None))):
        for s, dt in enumerate(dtypes):
            _finished_run(out / name / f"seed-{s}", {0: [0.0, 0.0], 4: [0.5, 0.5]}, dt)
    plan = {"source": "spec", "base": "x.toml", "steps": 4, "val_every": 4, "seeds": [0, 1],
            "rungs": [{"name": n, "sets": {}, "pretrained_critic": False} for n in "abc"]}
    doc = summarise(plan, out, {}, 20)
    a, b, c = doc["rungs"]
    assert a["dtypes"] == {"0": "bf16", "1": "fp32"} and c["dtypes"] == {"0": "fp32", "1": None}
    assert b["vs_previous"]["dtypes_differ"] == [{"seed": 0, "dtype": "fp32", "previous_dtype": "bf16"}]
    assert "dtypes_differ" not in c["vs_previous"]
    console = Console(record=True, width=80)
    print_table(doc, console)
    text = console.export_text()
    assert "‡" in next(ln for ln in text.splitlines() if ln.strip().startswith("b ")) and "‡" not in next(ln for ln in text.splitlines() if ln.strip().startswith("c "))
    assert "‡ b: runs in different dtypes (seed 0: fp32 vs bf16)" in " ".join(text.split())


def test_a_rung_names_the_rung_its_delta_is_paired_against(tmp_path):
    """vs = "a": the rung's Δ pairs it with rung a's runs (an ablation of alternatives to one baseline), not
    with the rung above; the table says so."""
    from rich.console import Console

    from reasonrl.stages.ablation.stats import summarise
    from reasonrl.stages.ablation.table import print_table

    out = tmp_path / "abl"
    for seed in (0, 1):
        _finished_run(out / "a" / f"seed-{seed}", {0: [0.0, 0.0], 8: [0.5, 0.0]})
        _finished_run(out / "b" / f"seed-{seed}", {0: [0.0, 0.0], 8: [1.0, 1.0]})
        _finished_run(out / "c" / f"seed-{seed}", {0: [0.0, 0.0], 8: [1.0, 0.0]})
    plan = {"source": "spec", "base": "x.toml", "steps": 8, "val_every": 8, "seeds": [0, 1],
            "rungs": [{"name": "a", "sets": {}, "pretrained_critic": False}, {"name": "b", "sets": {}, "pretrained_critic": False},
                      {"name": "c", "sets": {}, "pretrained_critic": False, "vs": "a"}]}
    doc = summarise(plan, out, {}, 20)
    a, b, c = doc["rungs"]
    assert b["vs_previous"]["rung"] == "a" and b["vs_previous"]["final"]["value"] == pytest.approx(0.75)
    assert c["vs"] == "a" and c["vs_previous"]["rung"] == "a" and c["vs_previous"]["final"]["value"] == pytest.approx(0.25)  # (against b: -0.25)
    console = Console(record=True, width=80)
    print_table(doc, console)
    assert "Δ of c against a" in " ".join(console.export_text().split())


def test_the_table_intervals_fit_the_crossed_design(tmp_path):
    """Every seed validated on the same problems (ablate's design): a rung's interval and the paired Δ's
    are the crossed random-effects interval over the seeds × problems values; runs that validated
    different problems get the nested design's two-level bootstrap, and the row says which."""
    from reasonrl.evaluation.scores import bootstrap_ci, crossed_mean_ci, two_level_bootstrap_ci
    from reasonrl.stages.ablation.stats import summarise

    def run(d: Path, final: list[float], where: list[str]) -> None:
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps({"stage": "train"}))
        (d / "validation.jsonl").write_text(json.dumps({"step": 0, "where": where, "avg@2": [0.0] * len(final)}) + "\n"
                                            + json.dumps({"step": 8, "where": where, "avg@2": final}) + "\n")
        (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "actor/entropy": 0.5}) + "\n")

    where = [f"p{i}" for i in range(6)]
    a = [[0.0, 0.5, 1.0, 0.0, 0.5, 1.0], [0.5, 0.5, 1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.5, 0.5, 0.5]]
    b = [[0.5, 0.5, 1.0, 0.5, 0.5, 1.0], [1.0, 0.5, 1.0, 0.0, 0.5, 1.0], [0.0, 1.0, 1.0, 1.0, 0.5, 1.0]]
    out = tmp_path / "abl"
    for s in range(3):
        run(out / "a" / f"seed-{s}", a[s], where)
        run(out / "b" / f"seed-{s}", b[s], where)
        run(out / "c" / f"seed-{s}", b[s], [f"q{s}-{i}" for i in range(6)])  # each seed its own problems
    plan = {"source": "spec", "base": "x.toml", "steps": 8, "val_every": 8, "seeds": [0, 1, 2],
            "rungs": [{"name": n, "sets": {}, "pretrained_critic": False} for n in "abc"]}
    doc = summarise(plan, out, {}, 200)
    ra, rb, rc = doc["rungs"]
    assert ra["final"]["design"] == "crossed" and ra["final"]["ci"] == pytest.approx(list(crossed_mean_ci(a, bounds=(0.0, 1.0))))
    assert ra["final"]["ci_problems"] == pytest.approx(list(bootstrap_ci([sum(col) / 3 for col in zip(*a)], n_boot=200, seed=0)))
    diffs = [[x - y for x, y in zip(rb_, ra_)] for rb_, ra_ in zip(b, a)]
    d = rb["vs_previous"]["final"]
    assert d["design"] == "crossed" and d["ci"] == pytest.approx(list(crossed_mean_ci(diffs, bounds=(-1.0, 1.0))))
    assert d["ci"][0] <= d["value"] <= d["ci"][1] and d["seeds"] == [0, 1, 2]
    assert rc["final"]["design"] == "nested" and rc["final"]["ci"] == pytest.approx(list(two_level_bootstrap_ci(b, n_boot=200, seed=0)))
    assert rc["vs_previous"]["final"] is None  # (no seed validated the same problems as the rung above)
    assert "crossed" in doc["interval"]


def test_a_dry_run_writes_nothing_into_a_finished_ablation(tmp_path, data_dir):
    """`--dry-run` with other --seeds on a finished ablation: its commands printed, and manifest.json, ablation.json and
    plan.json left as they were (it deleted the first two and replaced the plan)."""
    out = tmp_path / "abl"
    first = run_cli("ablate", "--preset", "dapo", "--seeds", "1", "--set", f"data={data_dir}", "--out", out, "--dry-run")
    assert first.exit_code == 0, first.output
    assert (out / "plan.json").is_file()  # (a dry run into a new directory writes its plan, for --collect)
    (out / "ablation.json").write_text('{"complete": true}')
    (out / "manifest.json").write_text(json.dumps({"stage": "ablate"}))

    def files() -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".reasonrl.lock"}  # (the lock names its holder)

    before = files()
    assert {"plan.json", "ablation.json", "manifest.json"} <= set(before)
    for seeds in ("2", "1"):
        r = run_cli("ablate", "--preset", "dapo", "--seeds", seeds, "--set", f"data={data_dir}", "--out", out, "--dry-run")
        assert r.exit_code == 0, r.output
        assert len([ln for ln in r.output.splitlines() if " -m reasonrl.cli train " in ln]) == 6 * int(seeds)
        assert files() == before
        said = " ".join(r.output.split())
        assert ("plan.json (seeds 0) is kept" in said) == (seeds == "2"), said[-600:]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, or a pid gone, does not)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the runs die with their driver through Linux's PR_SET_PDEATHSIG")
def test_a_sigkilled_driver_takes_its_running_train_with_it(format_model, prepared, tmp_path):
    """Issue 40 item 14: SIGKILL to the driver alone left its `train` running under PID 1 (a rerun then found the run
    "in use by PID …" and started the next runs beside it). Now the run dies with the driver, and a rerun resumes it."""
    spec = _spec(tmp_path, format_model, prepared, '[[rung]]\nname = "grpo"\n', steps=100_000)  # (an orphan would train for hours)
    spec.write_text(spec.read_text().replace("seeds = 2", "seeds = [0]"))
    out = tmp_path / "abl"
    run = out / "grpo" / "seed-0"
    p = subprocess.Popen(_ablate("--spec", spec, "--out", out), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        train = None
        while p.poll() is None and train is None:
            try:
                pid = json.loads((run / ".reasonrl.lock").read_text())["pid"]  # (the run's own lock names its process)
                train = pid if (run / "checkpoints" / "latest").is_file() and _alive(pid) else None  # (training: a checkpoint written)
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.05)
        assert train is not None and train != p.pid, p.stderr.read().decode()[-2000:]
        os.kill(p.pid, signal.SIGKILL)  # (the driver only: not its process group)
        p.wait(timeout=60)
        deadline = time.monotonic() + 60  # (a generous bound: the kernel signals it as the driver exits)
        while _alive(train) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(train), "the driver's train run outlived it"
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # (whatever is left of the job, should the test fail)
        except OSError:
            pass
    assert not (run / "manifest.json").exists() and (run / "checkpoints" / "latest").is_file()
    dry = subprocess.run(_ablate("--spec", spec, "--out", out, "--dry-run"), env=_env(), capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0 and dry.stdout.strip().endswith("--resume"), dry.stdout + dry.stderr[-2000:]
