"""`reasonrl train --async-steps K`: the engine in its own process generates step t+1's first round
while step t trains; its tokens lag by one version (corrected by default), the batch in flight is
part of every checkpoint, and a run resumed from a middle checkpoint is the uninterrupted one; the
same on 2 ranks under torchrun, each rank with an engine process of its own. (Killed by SIGKILL and
SIGTERM at random moments: tests/stages/test_chaos.py.)"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from clihelp import assert_same_run, assert_user_error, crashed_copy, run_cli
from toyhelp import jsonl_records

pytestmark = pytest.mark.slow

SMALL = ["--algo", "grpo", "--engine", "hf", "--dtype", "fp32", "--group-size", "4", "--max-response-len", "8", "--seed", "0", "--prompts-per-step", "2",
         "--mini-batch-size", "8", "--micro-batch-size", "4", "--overlong-cache-len", "2", "--lr", "1e-3"]


def _lines(out: Path) -> list[dict]:
    return jsonl_records(out / "metrics.jsonl")  # (complete lines: a run being watched may have one half-written)


def test_async_steps_train_one_step_off_and_resume_exactly(prepared, format_model, tmp_path):
    args = ["train", "--model", format_model, "--data", prepared, "--steps", "4", "--save-every", "1", "--async-steps", "1", "--engine-threads", "1",
            *SMALL]
    full = tmp_path / "full"
    r = run_cli(*args, "--out", full)
    assert r.exit_code == 0, r.output
    lines = _lines(full)
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    # Step 1's batch is sampled by the initial policy (nothing ahead yet); every later step's first
    # round by the policy one version older than the one it trains: corrected, as stale tokens are.
    assert all(m["rollout/staleness_max"] <= 1 and m["rollout/ahead_lag"] == int(m["step"] > 1) for m in lines)
    assert lines[0]["rollout/staleness_max"] == 0 and all(m["rollout/staleness_max"] == 1 and m["rollout/stale_token_frac"] > 0 for m in lines[1:])
    assert all(m["actor/correction_scope_frac"] > 0 for m in lines[1:])
    # The batch in flight is part of each checkpoint: step_2 holds step 3's, sampled by version 2.
    held = torch.load(full / "checkpoints" / "step_2" / "ahead.pt", weights_only=True)["batches"]
    assert [(b["step"], b["version"]) for b in held] == [(3, 2)] and len(held[0]["finish"]) == 2 * 4
    assert json.loads((full / "config.json").read_text())["async_steps"] == 1

    out = tmp_path / "resumed"  # a run that crashed after step 2
    crashed_copy(full, out, step=2, steps=4)
    r = run_cli(*args, "--out", out, "--resume")
    assert r.exit_code == 0, r.output
    assert_same_run(full, out)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the split is for a CPU's threads")
def test_async_steps_share_the_cpu_out_by_default(prepared, format_model, tmp_path):
    """On a CPU, with neither --engine-threads nor --engine-cpus, the engine process and the trainer
    each take half of torch's threads (both at all of them ran 2.3× slower than one each on 2 cores:
    bench/async_steps.py); config.json says what ran, and torch's count is back after the run."""
    torch.set_num_threads(2)  # (put back after the test: tests/conftest.py)
    out, args = tmp_path / "split", ["train", "--model", format_model, "--data", prepared, "--steps", "2", "--save-every", "1", "--async-steps", "1", *SMALL]
    r = run_cli(*args, "--out", out)
    assert r.exit_code == 0, r.output
    assert json.loads((out / "config.json").read_text())["threads_resolved"] == {"trainer": 1, "engine": 1}
    assert torch.get_num_threads() == 2
    crashed_copy(out, tmp_path / "resumed", step=1, steps=2)  # (resumed under the same split: the same run)
    r = run_cli(*args, "--out", tmp_path / "resumed", "--resume")
    assert r.exit_code == 0, r.output
    assert_same_run(out, tmp_path / "resumed")
    r = run_cli("train", "--model", format_model, "--data", prepared, "--steps", "1", "--async-steps", "1", "--engine-threads", "2", *SMALL,
                "--out", tmp_path / "chosen")
    assert r.exit_code == 0, r.output
    assert "threads_resolved" not in json.loads((tmp_path / "chosen" / "config.json").read_text())


def test_async_steps_refuse_what_they_do_not_support(prepared, format_model, tmp_path):
    base = ["train", "--model", format_model, "--data", prepared, "--out", tmp_path / "x", "--steps", "1", *SMALL]
    r = run_cli(*base, "--async-steps", "1", "--partial-rollout-len", "2", "--max-gen-rounds", "4")
    assert_user_error(r, "use --async-steps 0 with --partial-rollout-len")
    r = run_cli(*base, "--engine-cpus", "1")
    assert_user_error(r, "--engine-cpus and --engine-gpus set the engine's own process")
    r = run_cli(*base, "--async-steps", "1", "--max-staleness", "0")
    assert_user_error(r, "above --max-staleness 0")
    assert not (tmp_path / "x").exists()


def _command(*args, nproc: int = 2) -> tuple[list[str], dict[str, str], Path]:
    """``reasonrl`` under torchrun (``nproc`` processes; 0: one process, no torchrun), as a user runs
    it: (the command, its environment, its directory)."""
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(root) + os.pathsep + env.get("PYTHONPATH", ""))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).with_name("torchrun")
    launch = ([str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]) + ["--nproc_per_node", str(nproc), "--master_port", str(port)]
    return (launch if nproc else [sys.executable]) + ["-m", "reasonrl.cli", *map(str, args)], env, root


def _torchrun(*args, nproc: int = 2) -> subprocess.CompletedProcess:
    cmd, env, root = _command(*args, nproc=nproc)
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)


def _ranks_args(prepared, format_model) -> list:
    """(With --engine-cpus listing two of this machine's cores where it has two: each rank's engine
    pinned to one of them, its share.)"""
    cores = sorted(os.sched_getaffinity(0))[:2]
    pin = ["--engine-cpus", ",".join(map(str, cores))] if len(cores) == 2 else []
    return ["train", "--backend", "deepspeed", "--zero", "2", "--model", format_model, "--data", prepared, "--steps", "4", "--async-steps", "1",
            "--engine-threads", "1", *pin, *SMALL]


@pytest.fixture(scope="module")
def two_ranks(prepared, format_model, tmp_path_factory) -> Path:
    """The uninterrupted 4-step --async-steps 1 run on 2 ranks (torchrun, ZeRO-2), a checkpoint per step."""
    pytest.importorskip("deepspeed")
    full = tmp_path_factory.mktemp("two_ranks") / "full"
    p = _torchrun(*_ranks_args(prepared, format_model), "--save-every", "1", "--out", full)
    assert p.returncode == 0, p.stderr[-8000:]
    return full


@pytest.mark.deepspeed
@pytest.mark.timeout(900)
def test_async_steps_on_two_ranks_train_one_step_off_and_resume_exactly(two_ranks, prepared, format_model, tmp_path):
    """--async-steps 1 on 2 ranks (torchrun, ZeRO-2): each rank's engine process generates its share
    of the same prompts one step ahead; the steps lag as in one process, each rank's share of the batch
    in flight is in each checkpoint, a resume from a middle checkpoint is the uninterrupted run, and a
    resume with another number of processes is refused in one line naming the fix."""
    args, full = [*_ranks_args(prepared, format_model), "--save-every", "1"], two_ranks
    lines = _lines(full)
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    assert all(m["rollout/staleness_max"] <= 1 and m["rollout/ahead_lag"] == int(m["step"] > 1) for m in lines)
    assert lines[0]["rollout/staleness_max"] == 0 and all(m["rollout/staleness_max"] == 1 and m["rollout/stale_token_frac"] > 0 for m in lines[1:])
    assert all(m["rollout/batch_size"] == 2 * 4 for m in lines)  # (both ranks' groups: the metrics are global)
    assert json.loads((full / "config.json").read_text())["world_size"] == 2
    ckpt = full / "checkpoints" / "step_2"
    assert not (ckpt / "ahead.pt").exists()
    for rank in (0, 1):  # each rank's share of step 3's batch: one prompt × 4, sampled by version 2
        held = torch.load(ckpt / f"ahead-rank{rank}-of-2.pt", weights_only=True)["batches"]
        assert [(b["step"], b["version"], b["row_ids"]) for b in held] == [(3, 2, held[0]["row_ids"])] and len(held[0]["finish"]) == 4

    out = tmp_path / "resumed"  # a run that crashed after step 2
    crashed_copy(full, out, step=2, steps=4)
    p = _torchrun(*args, "--out", out, "--resume")
    assert p.returncode == 0, p.stderr[-8000:]
    assert_same_run(full, out)

    one = tmp_path / "one"  # the same checkpoint resumed by one process
    crashed_copy(full, one, step=2, steps=4)
    p = _torchrun(*args, "--out", one, "--resume", nproc=0)
    errors = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.startswith("error: ")]
    assert p.returncode == 1 and len(errors) == 1 and "Traceback" not in p.stderr, p.stderr[-8000:]
    assert "saved by 2 processes, this run has 1" in errors[0] and "--nproc_per_node 2" in errors[0], errors[0]


@pytest.mark.deepspeed
@pytest.mark.timeout(900)
def test_async_steps_on_two_ranks_sigterm_then_resume_is_the_same_run(two_ranks, prepared, format_model, tmp_path):
    """SIGTERM to torchrun (forwarded to both ranks) at a random moment of step 2 of a --save-every 0
    run: both ranks stop after the same step and checkpoint it with their batches in flight, one line
    says so, and --resume ends bitwise equal to the uninterrupted run."""
    args = [*_ranks_args(prepared, format_model), "--save-every", "0"]
    out = tmp_path / "run"
    step_s = sorted(m["perf/step_s"] for m in _lines(two_ranks))[1]
    cmd, env, root = _command(*args, "--out", out)
    p = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while p.poll() is None and not ((out / "metrics.jsonl").is_file() and _lines(out)):
        time.sleep(0.01)
    time.sleep(random.Random(0).uniform(0.0, 0.5) * step_s)
    assert p.poll() is None, "the run ended before the signal"
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=300)
    stops = [ln for ln in err.splitlines() if "stopped by SIGTERM" in ln]
    assert p.returncode != 0 and len(stops) == 1 and not any("Traceback" in ln for ln in err.splitlines() if ln.startswith("[rank")), err[-8000:]
    now = int((out / "checkpoints" / "latest").read_text().strip().removeprefix("step_"))
    assert 1 <= now <= 2 and f"checkpoint step_{now} " in stops[0], stops[0]
    assert [m["step"] for m in _lines(out)] == list(range(1, now + 1))
    cmd, env, root = _command(*args, "--out", out, "--resume")
    r = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-8000:]
    assert_same_run(two_ranks, out)
