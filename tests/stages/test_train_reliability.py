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


def test_a_resume_goes_on_in_the_dtype_the_run_started_in(prepared, tiny_model, tmp_path):
    """config.json's dtype_resolved is what the run computes in. A --resume where --dtype resolves
    to another (as "auto" does on a CPU with native bf16 after one without) is refused with the
    --dtype that keeps the run; that dtype spelled out in place of "auto" resumes it."""
    out = tmp_path / "run"
    base = ["train", "--model", tiny_model, "--data", prepared, "--out", out, "--save-every", "1", *SMALL]
    assert run_cli(*base, "--steps", "1").exit_code == 0
    (out / "manifest.json").unlink()  # as after a crash before the end
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    assert cfg["dtype"] == "fp32" and cfg["dtype_resolved"] == "fp32"
    cfg_path.write_text(json.dumps({**cfg, "dtype": "auto", "dtype_resolved": "bf16"}))  # as if started with auto on a bf16 CPU
    line = assert_user_error(run_cli(*base, "--steps", "2", "--resume"), "computes in bf16", "--dtype auto where it started", "--dtype bf16")
    assert "changed settings" not in line
    cfg_path.write_text(json.dumps({**cfg, "dtype": "auto"}))  # started with auto where auto was fp32: fp32 spelled out goes on
    r = run_cli(*base, "--steps", "2", "--resume")
    assert r.exit_code == 0, r.output
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert json.loads(cfg_path.read_text())["dtype_resolved"] == "fp32"


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


@pytest.fixture(scope="module")
def two_steps(prepared, tiny_model, tmp_path_factory) -> Path:
    """A finished 2-step run (a checkpoint a step); read only: copy it."""
    out = tmp_path_factory.mktemp("two") / "run"
    r = run_cli("train", "--model", tiny_model, "--data", prepared, "--out", out, "--steps", "2", "--save-every", "1", *SMALL)
    assert r.exit_code == 0, r.output
    return out


def _unfinished(src: Path, dst: Path) -> Path:
    """A copy of finished run ``src`` as if it had stopped after its last checkpoint (no final outputs)."""
    import shutil

    shutil.copytree(src, dst)
    for p in ("policy", "manifest.json", "summary.json"):
        (shutil.rmtree if (dst / p).is_dir() else Path.unlink)(dst / p)
    return dst


def _truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def test_a_checkpoint_symlink_is_never_resumed_from(prepared, tiny_model, two_steps, tmp_path):
    """The probe, in a scratch directory: `ln -s OTHER/checkpoints/step_2 X/checkpoints/step_2` was
    resumed from ("resumed from OTHER/checkpoints/step_2"), a link named step_5 failed with "a file
    operation failed: OSError", naming no path; a `latest` link was followed."""
    import shutil

    base = ["train", "--model", tiny_model, "--data", prepared, "--save-every", "1", *SMALL]
    other = _unfinished(two_steps, tmp_path / "other")
    before = {p: p.read_bytes() for p in (other / "checkpoints").rglob("*") if p.is_file()}
    for name in ("step_2", "step_5"):
        x = _unfinished(two_steps, tmp_path / f"x_{name}")
        shutil.rmtree(x / "checkpoints" / "step_2")
        (x / "checkpoints" / "latest").unlink()
        (x / "checkpoints" / name).symlink_to(other / "checkpoints" / "step_2")
        (x / "checkpoints" / "latest").symlink_to(other / "checkpoints" / "latest")
        r = run_cli(*base, "--out", x, "--steps", "3", "--resume")
        assert r.exit_code == 0, r.output
        assert f"resumed from {x / 'checkpoints' / 'step_1'} (step 1)" in r.output.replace("\n", ""), r.output
        assert f"checkpoints/{name} is a symbolic link" in r.output and "checkpoints/latest is a symbolic link" in r.output.replace("\n", "")
        assert [json.loads(ln)["step"] for ln in (x / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
        ckpts = x / "checkpoints"
        assert not any(p.is_symlink() for p in ckpts.iterdir()) and (ckpts / "latest").read_text().strip() == "step_3"
    assert {p: p.read_bytes() for p in (other / "checkpoints").rglob("*") if p.is_file()} == before  # never written through


@pytest.mark.parametrize("damage", ["policy_state/optim.pt", "rng.pt", "trainer_state.json", "policy/model.safetensors", "critic_state gone"])
def test_a_damaged_checkpoint_is_passed_over_for_the_newest_intact_one(two_steps, tmp_path, damage):
    """A truncated optim.pt or rng.pt (RuntimeError), trainer_state.json `{}` (KeyError), a truncated
    model ("pass an HF model directory") stopped --resume with a traceback, the intact step_1 unused."""
    from reasonrl.train.checkpoint import checkpoint_damage, resume_checkpoint

    x = _unfinished(two_steps, tmp_path / "x")
    step2 = x / "checkpoints" / "step_2"
    assert checkpoint_damage(step2) is None and resume_checkpoint(x) == step2
    if damage == "trainer_state.json":
        (step2 / damage).write_text("{}")
    elif damage == "critic_state gone":  # (a critic without its optimizer state)
        import shutil

        shutil.copytree(step2 / "policy", step2 / "critic")
    else:
        _truncate(step2 / damage)
    notes: list[str] = []
    assert resume_checkpoint(x, notes) == x / "checkpoints" / "step_1"
    assert len(notes) == 1 and "step_2" in notes[0] and "resuming from step_1, the newest intact checkpoint" in notes[0], notes
    _truncate(x / "checkpoints" / "step_1" / "rng.pt")
    from reasonrl.errors import ReasonRLError

    with pytest.raises(ReasonRLError, match=r"no intact checkpoint .*step_2 .*step_1 \(rng.pt is truncated.*--overwrite"):
        resume_checkpoint(x)


def test_resume_from_a_truncated_optimizer_state_falls_back_with_a_line(prepared, tiny_model, two_steps, tmp_path, monkeypatch):
    """The CLI: a line naming the damaged checkpoint and the one used, the run continued from it; the
    checkpoint's files and directory were fsynced before `latest` named it."""
    x = _unfinished(two_steps, tmp_path / "x")
    _truncate(x / "checkpoints" / "step_2" / "policy_state" / "optim.pt")
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    r = run_cli("train", "--model", tiny_model, "--data", prepared, "--out", x, "--save-every", "1", *SMALL, "--steps", "3", "--resume")
    assert r.exit_code == 0, r.output
    out = r.output.replace("\n", "")
    assert "step_2 (policy_state/optim.pt is truncated" in out and "resuming from step_1, the newest intact checkpoint" in out, r.output
    assert [json.loads(ln)["step"] for ln in (x / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    ck = str(x / "checkpoints")
    for name in ("trainer_state.json", "rng.pt", "optim.pt", "model.safetensors"):
        assert any(p.startswith(f"{ck}/.step_3.tmp/") and p.endswith(name) for p in synced), name
    last = len(synced) - 1 - synced[::-1].index(f"{ck}/latest.tmp")  # (step 3's)
    assert synced[last - 1] == ck == synced[last + 1]  # the checkpoint's rename on disk, then latest, then latest's rename
    assert max(i for i, p in enumerate(synced) if p.startswith(f"{ck}/.step_3.tmp")) < last - 1


def test_a_kill_while_best_is_replaced_leaves_a_best(tmp_path):
    """best/ is swapped by renames (old aside, new in, old removed): whatever the kill left, the next
    start has a complete best/ (it was removed, then renamed: a kill between left none)."""
    from reasonrl.train.checkpoint import recover_best

    def state(**dirs: int) -> Path:
        out = tmp_path / str(len(list(tmp_path.iterdir())))
        for name, step in dirs.items():
            d = out / {"best": "best", "old": ".best.old", "tmp": ".best.tmp"}[name]
            d.mkdir(parents=True)
            (d / "model.safetensors").write_bytes(b"x")
            if step:
                (d / "best.json").write_text(json.dumps({"step": step}))
        return out

    for dirs, kept in [({"old": 1, "tmp": 2}, 1), ({"best": 2, "old": 1}, 2), ({"best": 1, "tmp": 0}, 1), ({"old": 1, "tmp": 0}, 1)]:
        out = state(**dirs)
        recover_best(out)
        assert sorted(p.name for p in out.iterdir()) == ["best"] and json.loads((out / "best" / "best.json").read_text())["step"] == kept


VAL_BEST = ["--val-every", "1", "--val-n", "2", "--val-bootstrap", "20", "--save-best", "val/avg@2"]


def test_a_full_disk_while_best_is_written_is_one_line(prepared, tiny_model, tmp_path):
    """A real file-size limit (EFBIG) at the first best/ (step 0): a traceback and a `.best.tmp` left before."""
    out = tmp_path / "full"
    size = (Path(tiny_model) / "model.safetensors").stat().st_size
    cmd = [sys.executable, "-m", "reasonrl.cli", "train", "--model", str(tiny_model), "--data", str(prepared), "--out", str(out),
           "--save-every", "0", "--steps", "1", *SMALL, *VAL_BEST]

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, size // 2))

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, preexec_fn=limit)
    assert p.returncode == 1, p.stderr[-2000:]
    err = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert len(err) == 1 and "could not write best/ for step 0" in err[0] and "file-size limit" in err[0] and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert not (out / ".best.tmp").exists() and not (out / "best").exists()


def test_a_failed_best_write_keeps_the_step_checkpointed(prepared, tiny_model, tmp_path, monkeypatch):
    """With --save-every 0 a full disk while best/ was written lost every trained step: now the step
    is checkpointed first, the line says so, and --resume writes best/ from that checkpoint.
    (The disk fills at the write of step 1's best/: an OSError ENOSPC injected there; every validation
    counts as a new best so that step 1 writes one.)"""
    import errno

    import reasonrl.train.backend as B
    import reasonrl.train.validation as V

    monkeypatch.setattr(V, "improved", lambda value, best, metric: True)
    real, calls = B.save_policy, []

    def save_policy(backend, out_dir, tokenizer=None):
        calls.append(out_dir)
        real(backend, out_dir, tokenizer)
        if len(calls) == 2:  # step 1's best/, half written
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(B, "save_policy", save_policy)
    out = tmp_path / "run"
    args = ["train", "--model", tiny_model, "--data", prepared, "--out", out, "--save-every", "0", *SMALL, *VAL_BEST]
    line = assert_user_error(run_cli(*args, "--steps", "3"), "could not write best/ for step 1", "the disk is full", "best/ still holds step 0",
                             "step 1 is checkpointed", "--resume")
    assert "1 is checkpointed" in line and not (out / ".best.tmp").exists() and not (out / ".best.old").exists()
    assert json.loads((out / "best" / "best.json").read_text())["step"] == 0
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_1"
    monkeypatch.setattr(B, "save_policy", real)
    r = run_cli(*args, "--steps", "1", "--resume")  # (nothing more to train: best/ from step 1's checkpoint)
    assert r.exit_code == 0, r.output
    assert json.loads((out / "best" / "best.json").read_text())["step"] == 1 and "best/: written from step_1" in r.output
    from safetensors.torch import load_file

    a, b = load_file(out / "best" / "model.safetensors"), load_file(out / "checkpoints" / "step_1" / "policy" / "model.safetensors")
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


def test_a_resume_with_validation_is_the_same_run(prepared, tiny_model, tmp_path):
    """PPO (a critic) with validation every step and a best policy: a process stopped right after
    step 1's checkpoint (validation in between) and a new one resuming it end bitwise equal to the
    uninterrupted process, and so does every later checkpoint, file by file. (Before, the resumed
    process put torch's RNG state back before its setup drew from it, measuring the peak FLOP/s
    once per process: its checkpoints carried another RNG state than the uninterrupted run's.)"""
    from clihelp import assert_same_run

    a, b = tmp_path / "a", tmp_path / "b"
    # (MKL_CBWR left to the CLI: without it, on an AVX-512 AMD EPYC, step 3's critic forward differed
    # in a last bit between the two processes: reasonrl.devices.reproducible_blas)
    env = {**{k: v for k, v in os.environ.items() if k != "MKL_CBWR"}, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}

    def train(out: Path, *extra: str) -> None:
        cmd = [sys.executable, "-m", "reasonrl.cli", "train", "--model", str(tiny_model), "--data", str(prepared), "--out", str(out),
               "--save-every", "1", *SMALL, "--algo", "ppo", "--lr", "1e-3", *VAL_BEST, *extra]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]

    train(a, "--steps", "3")
    train(b, "--steps", "1")
    train(b, "--steps", "3", "--resume")
    assert_same_run(a, b)
    for s in (2, 3):
        files = sorted(p.relative_to(a) for p in (a / "checkpoints" / f"step_{s}").rglob("*") if p.is_file())
        assert files and files == sorted(p.relative_to(b) for p in (b / "checkpoints" / f"step_{s}").rglob("*") if p.is_file())
        assert [f for f in files if (a / f).read_bytes() != (b / f).read_bytes()] == []


def test_a_truncated_lora_adapter_is_passed_over(prepared, tiny_model, tmp_path):
    """A LoRA checkpoint whose adapter safetensors is truncated (it stopped --resume with a SafetensorError traceback)."""
    x = tmp_path / "lora"
    r = run_cli("train", "--model", tiny_model, "--data", prepared, "--out", x, "--steps", "2", "--save-every", "1", *SMALL, "--lora-rank", "4")
    assert r.exit_code == 0, r.output
    (x / "manifest.json").unlink()
    _truncate(x / "checkpoints" / "step_2" / "policy" / "adapter_model.safetensors")
    r = run_cli("train", "--model", tiny_model, "--data", prepared, "--out", x, "--steps", "3", "--save-every", "1", *SMALL, "--lora-rank", "4", "--resume")
    assert r.exit_code == 0, r.output
    out = r.output.replace("\n", "")
    assert "step_2 (policy/adapter_model.safetensors is truncated" in out and "resuming from step_1" in out, r.output
    assert [json.loads(ln)["step"] for ln in (x / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
