"""`reasonrl train` under faults: divergence stops cleanly, a crashed run is never deleted by a plain
rerun, a torn `latest` still resumes, --resume refuses changed settings, --keep-last, a full disk."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clihelp import assert_user_error, run_and_resume, run_cli, step_rollouts

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--engine", "hf", "--dtype", "fp32", "--group-size", "4", "--max-response-len", "8", "--seed", "0", "--prompts-per-step", "2",
         "--mini-batch-size", "8", "--micro-batch-size", "4", "--overlong-cache-len", "2", "--algo", "grpo"]



def _finite_on_disk(run: Path) -> None:
    import torch
    from safetensors.torch import load_file

    files = list(run.rglob("*.safetensors"))
    assert files
    for f in files:
        for k, v in load_file(f).items():
            assert torch.isfinite(v).all(), (f, k)


def test_divergence_stops_with_one_line_and_no_nan_on_disk(prepared, tiny_model, tmp_path):
    out = tmp_path / "div"
    r = run_cli("train", "--model", tiny_model, "--data", prepared, "--out", out, "--steps", "10", "--save-every", "1", "--lr", "1e3", *SMALL)
    line = assert_user_error(r, "training diverged", "not finite for 3 steps in a row", "--lr")
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    bad = [m["step"] for m in lines if m.get("actor/bad_step")]
    assert len(bad) == 3 and bad == list(range(bad[0], bad[0] + 3))
    latest = (out / "checkpoints" / "latest").read_text().strip()
    assert latest == f"step_{bad[0] - 1}" and latest in line  # the last good checkpoint stays the latest
    assert not (out / "policy").exists() and not (out / "manifest.json").exists()
    _finite_on_disk(out)


def test_bad_numbers_are_refused(prepared, tiny_model, tmp_path):
    for flag, value, needle in [("--lr", "inf", "'lr' must be a finite float"), ("--grad-clip", "-1", "grad_clip"),
                                ("--top-k", "0", "top_k"), ("--temperature", "inf", "temperature"), ("--weight-decay", "-0.1", "weight_decay"),
                                ("--kl-coef", "-1", "kl_coef"), ("--lam-actor", "1.5", "lam_actor")]:
        r = run_cli("train", "--model", tiny_model, "--data", prepared, "--out", tmp_path / "x", "--steps", "1", *SMALL, flag, value)
        assert_user_error(r, needle)


def test_a_crashed_run_is_never_deleted_by_a_plain_rerun(prepared, tiny_model, tmp_path):
    out = tmp_path / "run"
    base = ["train", "--model", tiny_model, "--data", prepared, "--out", out, "--save-every", "1", *SMALL]
    assert run_cli(*base, "--steps", "2").exit_code == 0
    assert_user_error(run_cli(*base, "--steps", "2"), "already holds a finished run", "--overwrite")
    (out / "manifest.json").unlink()  # as after a crash before the end
    (out / "policy").rename(out / "policy.partial")
    assert_user_error(run_cli(*base, "--steps", "3"), "unfinished run", "step_2", "--resume", "--overwrite")
    assert (out / "checkpoints" / "step_2" / "trainer_state.json").is_file()  # still there
    (out / "checkpoints" / "latest").write_text("step_9\x00garbage")  # a torn `latest`
    r = run_cli(*base, "--steps", "3", "--resume")
    assert r.exit_code == 0, r.output
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert (out / "policy.partial").is_dir()  # --resume and --overwrite touch only what train writes
    assert_user_error(run_cli(*base, "--steps", "4", "--resume", "--lr", "5e-6"), "changed settings", "lr")
    r = run_cli(*base, "--steps", "5", "--resume", "--keep-last", "2", "--log-every", "2")  # steps, retention, cadence may change
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step_")) == ["step_4", "step_5"]
    r = run_cli(*base, "--steps", "1", "--overwrite")
    assert r.exit_code == 0, r.output
    assert (out / "policy.partial").is_dir() and [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1]


def test_out_cannot_be_the_model(prepared, tiny_model, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    before = (model / "config.json").read_text()
    assert_user_error(run_cli("train", "--model", model, "--data", prepared, "--out", model, *SMALL), "model directory")
    assert (model / "config.json").read_text() == before


def test_a_full_disk_leaves_the_previous_checkpoint(prepared, tiny_model, tmp_path):
    """A real file-size limit (RLIMIT_FSIZE: writes past it fail with EFBIG): the first checkpoint
    fits, the final policy copy does not."""
    out = tmp_path / "full"
    cmd = [sys.executable, "-m", "reasonrl.cli", "train", "--model", str(tiny_model), "--data", str(prepared), "--out", str(out),
           "--save-every", "1", *SMALL]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    assert subprocess.run(cmd + ["--steps", "1"], env=env, capture_output=True, timeout=600).returncode == 0
    size = max(f.stat().st_size for f in out.rglob("*") if f.is_file())

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, size // 2))

    p = subprocess.run(cmd + ["--steps", "2", "--resume"], env=env, capture_output=True, text=True, timeout=600, preexec_fn=limit)
    assert p.returncode == 1, p.stderr[-2000:]
    err = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert len(err) == 1 and "file-size limit" in err[0] and "step_1 is intact" in err[0] and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_1"
    assert not list((out / "checkpoints").glob(".step_*"))


@pytest.mark.vllm
def test_vllm_resume_draws_the_same_tokens(prepared, format_model, tmp_path):
    """vLLM's per-request seeds: after a resume, step 2 samples exactly the tokens an uninterrupted
    run sampled (fp32 on CPU; vLLM documents no batch-invariance guarantee, see the README)."""
    pytest.importorskip("vllm")
    args = ["train", "--model", format_model, "--data", prepared, "--save-every", "1", "--keep-rollouts", "--lr", "1e-3",
            *[a if a != "hf" else "vllm" for a in SMALL]]
    run_and_resume(args, tmp_path / "a", tmp_path / "b", steps=2)
    tokens = lambda d: [row["response_ids"] for row in step_rollouts(d, 2)]  # noqa: E731
    assert tokens(tmp_path / "a") == tokens(tmp_path / "b")
