"""The Slurm job files in ``examples/slurm/`` under a real Slurm: a one-node cluster (Debian's
slurm-wlm and munge, started by ``slurm_cluster``) runs ``train.sbatch`` as a 2-process ZeRO-2
train of the tiny model, and ``ablate.sh`` as job arrays (the plan from ``ablate --dry-run``) and a
collect job. Skipped only where slurm-wlm / munge are not installed (``scripts/install.sh``
installs them where apt-get exists)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_cluster import SlurmCluster, Unavailable

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    try:
        c = SlurmCluster.start(tmp_path_factory.mktemp("slurm"))
    except Unavailable as e:
        pytest.skip(str(e))
    yield c
    c.stop()


def _metrics(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def test_train_sbatch_runs_a_two_process_zero2_train(cluster, format_model, prepared, tmp_path):
    out = tmp_path / "run"
    job = cluster.sbatch("--cpus-per-task", "1", f"--output={tmp_path}/job-%j.out", str(ROOT / "examples/slurm/train.sbatch"),
                         "--zero", "2", "--model", str(format_model), "--data", str(prepared), "--out", str(out), "--engine", "hf",
                         "--dtype", "fp32", "--algo", "grpo", "--steps", "2", "--prompts-per-step", "2", "--group-size", "4",
                         "--max-response-len", "8", "--mini-batch-size", "8", "--micro-batch-size", "4", "--lr", "1e-3",
                         cwd=tmp_path, env={"REASONRL_PYTHON": sys.executable, "NPROC_PER_NODE": "2", "OMP_NUM_THREADS": "1"})
    state = cluster.wait(job, timeout_s=900)
    log = next(tmp_path.glob("job-*.out")).read_text(errors="replace")
    assert state == "COMPLETED", f"{state}\n{log[-3000:]}\n{cluster.logs()}"
    assert "2 process(es)" in log and "rendezvous" in log
    assert [m["step"] for m in _metrics(out)] == [1, 2]
    assert "backend deepspeed ×2" in log  # (train's start line: one ZeRO group of the job's 2 processes)
    assert (out / "manifest.json").is_file() and (out / "policy" / "config.json").is_file()


def test_ablate_sh_runs_the_plan_as_job_arrays(cluster, tiny_model, prepared, tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(f'''base = "train-grpo-cpu.toml"
seeds = 1

[train]
model = "{tiny_model}"
data = "{prepared}"
engine = "hf"
dtype = "fp32"
prompts_per_step = 2
group_size = 4
max_response_len = 8
mini_batch_size = 8
micro_batch_size = 4
val_max_problems = 4
val_n = 1
val_max_response_len = 8

[[rung]]
name = "grpo"
algo = "grpo"

[[rung]]
name = "dapo"
algo = "dapo"
''')
    out = tmp_path / "abl"
    p = subprocess.run(["bash", str(ROOT / "examples/slurm/ablate.sh"), "--spec", str(spec), "--out", str(out), "--steps", "1", "--val-every", "1",
                        "--sbatch", "--cpus-per-task 1"],
                       cwd=tmp_path, env={**cluster.env, "REASONRL_PYTHON": sys.executable}, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    jobs = dict(ln.split(": job ") for ln in p.stdout.splitlines() if ": job " in ln)
    assert set(jobs) == {"trains", "collect"}, p.stdout  # (no rung needs a critic)
    assert jobs["trains"].split()[1] == "(2)"
    state = cluster.wait(jobs["collect"].split()[0], timeout_s=900)
    logs = "\n".join(f.read_text(errors="replace")[-1500:] for f in sorted(tmp_path.glob("abl.*.out")))
    assert state == "COMPLETED", f"{state}\n{logs}\n{cluster.logs()}"
    assert cluster.state(jobs["trains"].split()[0]) == "COMPLETED", logs
    table = json.loads((out / "ablation.json").read_text())
    assert table["complete"] and [r["name"] for r in table["rungs"]] == ["grpo", "dapo"], logs
    assert (out / "manifest.json").is_file()
