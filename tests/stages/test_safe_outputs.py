"""Safe by default, the probe's trials on the real CLI: no stage deletes or overwrites what is not its
own, one writer per run directory, `latest` stays inside the run, and a failed write is one line
with nothing half-written left behind (issue 20, items 1, 3, 4, 5, 7-10, 15, 16)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clihelp import assert_user_error, crashed_copy, run_cli
from toyhelp import jsonl_records
from reasonrl.artifacts import LOCK, MANIFEST

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--engine", "hf", "--dtype", "fp32", "--group-size", "4", "--max-response-len", "8", "--seed", "0", "--prompts-per-step", "2",
         "--mini-batch-size", "8", "--micro-batch-size", "4", "--overlong-cache-len", "2", "--algo", "grpo"]
EVAL = ["--engine", "hf", "--dtype", "fp32", "--max-response-len", "8", "--bootstrap", "50", "--n", "2", "--template", "none"]


def _tree(p: Path) -> dict[str, bytes]:
    return {str(q.relative_to(p)): q.read_bytes() for q in sorted(p.rglob("*")) if q.is_file() and q.name != LOCK}


def _outputs(d: Path) -> list[str]:
    """What a stage left in ``d`` besides its bookkeeping (the run marker, the lock file)."""
    return sorted(q.name for q in d.iterdir() if not q.name.startswith(".reasonrl")) if d.exists() else []


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}


def _cmd(*args: object) -> list[str]:
    return [sys.executable, "-m", "reasonrl.cli", *[str(a) for a in args]]


def _run(*args: object, fsize: int | None = None) -> subprocess.CompletedProcess:
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run(_cmd(*args), env=_env(), capture_output=True, text=True, timeout=600, preexec_fn=limit if fsize else None)


def _one_error_line(p: subprocess.CompletedProcess, *needles: str) -> str:
    assert p.returncode == 1, p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1, p.stderr[-3000:]
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def finished_train(tiny_model, prepared, tmp_path_factory) -> Path:
    """A finished 2-step train run with a checkpoint at each step (read only: copy it to change it)."""
    out = tmp_path_factory.mktemp("safe") / "T"
    r = run_cli("train", "--model", tiny_model, "--data", prepared, "--out", out, "--steps", "2", "--save-every", "1", *SMALL)
    assert r.exit_code == 0, r.output
    return out


def test_train_never_deletes_a_users_files(tiny_model, prepared, tmp_path):
    """`mkdir -p u/wandb && echo x > u/wandb/n && reasonrl train ... --out u` deleted u/wandb (and config.json, tensorboard/, ...)."""
    u = tmp_path / "u"
    for name in ("wandb/n", "tensorboard/events", "policy/notes", "config.json", "summary.json"):
        (u / name).parent.mkdir(parents=True, exist_ok=True)
        (u / name).write_text('{"a user\'s": "file"}')
    before = _tree(u)
    for extra in ([], ["--overwrite"]):
        assert_user_error(run_cli("train", "--model", tiny_model, "--data", prepared, "--out", u, "--steps", "1", *SMALL, *extra),
                          "is not empty", "holds no reasonrl run", "choose a new --out")
    assert _tree(u) == before and sorted(q.name for q in u.iterdir()) == ["config.json", "policy", "summary.json", "tensorboard", "wandb"]


@pytest.mark.parametrize("stage", ["train", "eval", "report"])
def test_the_root_directory_in_a_recipe_is_refused(stage, tiny_model, prepared, finished_train, tmp_path):
    """`out = "/"` in a recipe was accepted by train, eval and report (they started unlinking /manifest.json ...)."""
    recipe = tmp_path / "r.toml"
    recipe.write_text('out = "/"\n')
    before = sorted(q.name for q in Path("/").iterdir())
    args = {"train": ["train", "--model", tiny_model, "--data", prepared, "--steps", "1", *SMALL],
            "eval": ["eval", "file", "--dataset", prepared, "--model", tiny_model, *EVAL],
            "report": ["report", finished_train]}[stage]
    assert_user_error(run_cli(*args, "--config", recipe), "--out / is the file system's root")
    assert sorted(q.name for q in Path("/").iterdir()) == before


def test_two_trains_in_one_directory(tiny_model, prepared, tmp_path):
    """`reasonrl train ... --out X & reasonrl train ... --seed 1 --lr 1e-2 --out X`: both exited 0 with interleaved metrics."""
    x = tmp_path / "X"
    first = subprocess.Popen(_cmd("train", "--model", tiny_model, "--data", prepared, "--out", x, "--steps", "200", *SMALL), env=_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not ((x / LOCK).is_file() and str(first.pid) in (x / LOCK).read_text()):
            assert first.poll() is None and time.monotonic() < deadline, "the first run never took the directory"
            time.sleep(0.05)
        second = _run("train", "--model", tiny_model, "--data", prepared, "--out", x, "--steps", "3", *SMALL, "--seed", "1", "--lr", "1e-2")
        assert first.poll() is None  # (still running: the second was refused while the first held the directory)
        _one_error_line(second, f"is in use by PID {first.pid}, `reasonrl train`", "choose another --out")
    finally:
        first.kill()
        first.wait(timeout=60)
    steps = [m["step"] for m in jsonl_records(x / "metrics.jsonl")]  # (killed: maybe mid-append, a torn last line)
    assert steps == list(range(1, len(steps) + 1))  # the first run's steps, each once
    assert json.loads((x / "config.json").read_text())["lr"] != 1e-2


def test_latest_naming_another_runs_checkpoint_is_not_followed(finished_train, tmp_path):
    """`echo /other/checkpoints/step_3 > X/checkpoints/latest; reasonrl train ... --resume` continued the other run's weights."""
    other, x = tmp_path / "other", tmp_path / "X"
    shutil.copytree(finished_train, other)
    shutil.copytree(finished_train, x)
    shutil.rmtree(x / "checkpoints" / "step_2")
    (x / MANIFEST).unlink()
    (x / "checkpoints" / "latest").write_text(str(other / "checkpoints" / "step_2") + "\n")
    from reasonrl.train.checkpoint import latest_checkpoint

    assert latest_checkpoint(x) == x / "checkpoints" / "step_1"  # its own newest, never a path from outside


def test_eval_and_report_refuse_a_finished_train_run(tiny_model, prepared, finished_train, tmp_path):
    """`reasonrl report T --out T` or `reasonrl eval ... --out T` replaced a finished train run's manifest."""
    t = tmp_path / "T"
    shutil.copytree(finished_train, t)
    before = _tree(t)
    assert_user_error(run_cli("report", t, "--out", t), "is the input")
    assert_user_error(run_cli("report", finished_train, "--out", t), "holds a finished `reasonrl train` run", "`reasonrl report` will not write")
    assert_user_error(run_cli("eval", "file", "--dataset", prepared, "--model", tiny_model, "--out", t, *EVAL),
                      "holds a finished `reasonrl train` run", "`reasonrl eval` will not write over it")
    assert _tree(t) == before


def test_an_eval_rerun_killed_midway_leaves_no_stale_results(tiny_model, prepared, tmp_path):
    """An eval rerun killed before results.json was written left the previous results.json beside the new samples."""
    e = tmp_path / "E"
    r = run_cli("eval", "file", "--dataset", prepared, "--model", tiny_model, "--out", e, *EVAL)
    assert r.exit_code == 0, r.output
    assert (e / "results.json").is_file() and (e / MANIFEST).is_file()
    rerun = subprocess.Popen(_cmd("eval", "file", "--dataset", prepared, "--model", tiny_model, "--out", e, *EVAL, "--seed", "1"), env=_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while (e / MANIFEST).is_file():  # the rerun removes the old manifest first ...
            assert rerun.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.5)  # ... and is loading the model or generating when it is killed
        rerun.send_signal(signal.SIGKILL)
    finally:
        rerun.wait(timeout=60)
    # ... and every old output with it, before it generates anything
    assert not (e / MANIFEST).exists() and not (e / "results.json").exists() and not (e / "samples.jsonl").exists()
    r = run_cli("eval", "file", "--dataset", prepared, "--model", tiny_model, "--out", e, *EVAL)  # a plain rerun finishes it
    assert r.exit_code == 0, r.output
    assert (e / MANIFEST).is_file()


def test_resuming_a_finished_run_keeps_its_summary(finished_train, tiny_model, prepared, tmp_path):
    """Resuming a run whose last step was already checkpointed rewrote summary.json with "last": {}."""
    t = tmp_path / "T"
    shutil.copytree(finished_train, t)
    before = json.loads((t / "summary.json").read_text())
    assert len(before["last"]) > 20
    r = run_cli("train", "--model", tiny_model, "--data", prepared, "--out", t, "--steps", "2", "--save-every", "1", *SMALL, "--resume")
    assert r.exit_code == 0, r.output
    assert json.loads((t / "summary.json").read_text()) == before


def test_a_resume_never_writes_through_a_link_at_a_logs_temporary_path(finished_train, tiny_model, prepared, tmp_path):
    """`ln -s $PWD/v.txt d/metrics.jsonl.tmp; reasonrl train … --out d --resume`: the resume's cut back to
    the checkpoint wrote the kept lines into v.txt, renamed the link to metrics.jsonl, and every later
    step's line went to v.txt too."""
    d, v = tmp_path / "d", tmp_path / "v.txt"
    crashed_copy(finished_train, d, step=1, steps=2)
    v.write_text("precious\n")
    (d / "metrics.jsonl.tmp").symlink_to(v)
    r = run_cli("train", "--model", tiny_model, "--data", prepared, "--out", d, "--steps", "2", "--save-every", "1", *SMALL, "--resume")
    assert r.exit_code == 0, r.output
    assert v.read_text() == "precious\n"
    assert not (d / "metrics.jsonl").is_symlink() and not (d / "metrics.jsonl.tmp").exists()
    assert [json.loads(ln)["step"] for ln in (d / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_resume_without_the_runs_config_is_refused(finished_train, tiny_model, prepared, tmp_path):
    """With config.json missing, the --resume guard fell open (a grpo checkpoint resumed as dapo)."""
    t = tmp_path / "T"
    shutil.copytree(finished_train, t)
    (t / "config.json").unlink()
    args = [a if a != "grpo" else "dapo" for a in SMALL]
    assert_user_error(run_cli("train", "--model", tiny_model, "--data", prepared, "--out", t, "--steps", "3", *args, "--resume"),
                      "config.json is missing", "--overwrite")


def test_a_crashed_run_without_a_checkpoint_is_not_offered_a_resume(tiny_model, prepared, tmp_path):
    """The rerun said "unfinished run (no checkpoint): resume it with --resume" — there was nothing to resume."""
    x = tmp_path / "X"
    p = subprocess.Popen(_cmd("train", "--model", tiny_model, "--data", prepared, "--out", x, "--steps", "200", *SMALL), env=_env(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not ((x / "metrics.jsonl").is_file() and (x / "metrics.jsonl").read_text().strip()):
            assert p.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
    finally:
        p.wait(timeout=60)
    line = assert_user_error(run_cli("train", "--model", tiny_model, "--data", prepared, "--out", x, "--steps", "2", *SMALL),
                             "stopped before its first checkpoint (nothing to resume)", "--overwrite")
    assert "--resume" not in line
    r = run_cli("train", "--model", tiny_model, "--data", prepared, "--out", x, "--steps", "1", *SMALL, "--overwrite")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("stage", ["train", "eval", "report", "prepare-data"])
def test_an_uncreatable_output_is_one_line(stage, tiny_model, prepared, toy_data_file, finished_train):
    args = {"train": ["train", "--model", tiny_model, "--data", prepared, "--steps", "1", *SMALL],
            "eval": ["eval", "file", "--dataset", prepared, "--model", tiny_model, *EVAL],
            "report": ["report", finished_train],
            "prepare-data": ["prepare-data", toy_data_file, "--template", "none"]}[stage]
    assert_user_error(run_cli(*args, "--out", "/proc/x"), "cannot create --out /proc/x")


def test_a_full_disk_in_eval_and_report_is_one_line_and_leaves_no_partial_output(tiny_model, prepared, finished_train, tmp_path):
    """A real file-size limit (RLIMIT_FSIZE): eval's samples.jsonl and the report's PNGs do not fit."""
    e = tmp_path / "E"
    _one_error_line(_run("eval", "file", "--dataset", prepared, "--model", tiny_model, "--out", e, *EVAL, fsize=1024),
                    "could not write", "a file-size limit", "the partial outputs were removed")
    assert _outputs(e) == []
    rep = tmp_path / "R"
    assert run_cli("report", finished_train, "--out", rep).exit_code == 0  # a finished report, then a rerun that fails
    _one_error_line(_run("report", finished_train, "--out", rep, fsize=8192), "could not write", "a file-size limit")
    assert _outputs(rep) == []  # no old manifest beside new or missing PNGs


def test_a_full_disk_while_training_is_one_line(tiny_model, prepared, tmp_path):
    """metrics.jsonl and the TensorBoard event file under a file-size limit (was: a traceback)."""
    x = tmp_path / "X"
    p = _run("train", "--model", tiny_model, "--data", prepared, "--out", x, "--steps", "3", *SMALL, "--report-to", "tensorboard", fsize=6000)
    line = _one_error_line(p, "could not write", "a file-size limit")
    assert "metrics.jsonl" in line or "tensorboard" in line or "config.json" in line, line
    assert not (x / MANIFEST).exists()


def test_a_failed_first_checkpoint_says_start_over(tiny_model, prepared, tmp_path):
    """The first checkpoint does not fit: the message said "rerun with --resume", with nothing to resume."""
    model_bytes = (tiny_model / "model.safetensors").stat().st_size
    x = tmp_path / "X"
    p = _run("train", "--model", tiny_model, "--data", prepared, "--out", x, "--steps", "1", *SMALL, fsize=model_bytes // 2)
    line = _one_error_line(p, "could not write checkpoint step 1", "no earlier checkpoint exists", "start over with --overwrite")
    assert "--resume" not in line
    assert not list((x / "checkpoints").glob(".step_*")) and not list((x / "checkpoints").glob("step_*"))



def _probe(scratch: Path, *args: object) -> subprocess.CompletedProcess:
    """Issue 40, item 9, as the probe ran it in a scratch directory: `mkdir d; echo precious > v.txt;
    ln -s $PWD/v.txt d/.reasonrl.lock` (over the lock file of a run already in ``d``), then `reasonrl ARGS`."""
    scratch.mkdir(exist_ok=True)
    subprocess.run(["bash", "-c", "mkdir -p d; echo precious > v.txt; rm -f d/.reasonrl.lock; ln -s $PWD/v.txt d/.reasonrl.lock"],
                   cwd=scratch, check=True)
    return subprocess.run(_cmd(*args), cwd=scratch, env=_env(), capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("stage", ["eval", "report", "train --resume"])
def test_a_lock_file_that_is_a_link_is_never_written_through(stage, tiny_model, prepared, finished_train, tmp_path):
    """`ln -s $PWD/v.txt d/.reasonrl.lock; reasonrl eval file … --out d` (or `report --out d`, `train --resume`): v.txt held {"pid": …}."""
    scratch = tmp_path / "scratch"
    if stage == "train --resume":  # a crashed run (from a shared disk, a tarball) whose lock file is a link
        crashed_copy(finished_train, scratch / "d", step=1, steps=2)
    args = {"eval": ["eval", "file", "--dataset", prepared, "--model", tiny_model, "--out", "d", *EVAL],
            "report": ["report", finished_train, "--out", "d"],
            "train --resume": ["train", "--model", tiny_model, "--data", prepared, "--out", "d", "--steps", "2", "--save-every", "1", *SMALL,
                               "--resume"]}[stage]
    _one_error_line(_probe(scratch, *args), "d/.reasonrl.lock is a symbolic link", "remove d/.reasonrl.lock and rerun")
    assert (scratch / "v.txt").read_text() == "precious\n"
    assert (scratch / "d" / LOCK).is_symlink()


@pytest.mark.parametrize("stage", ["eval", "report", "prepare-data"])
def test_a_run_killed_while_writing_its_marker_is_rerun(stage, tiny_model, prepared, toy_data_file, finished_train, tmp_path):
    """Issue 42: `mkdir -p d && echo '{"stage": "eval"' > d/.reasonrl-run.json.tmp`, then `reasonrl eval file … --out d`:
    refused by every stage, with --overwrite too ("is not empty (.reasonrl-run.json.tmp) and holds no reasonrl run")."""
    args = {"eval": ["eval", "file", "--dataset", prepared, "--model", tiny_model, *EVAL],
            "report": ["report", finished_train],
            "prepare-data": ["prepare-data", toy_data_file, "--template", "none", "--val-size", "4"]}[stage]
    for i, extra in enumerate([[], ["--overwrite"]] if stage == "eval" else [[]]):
        d = tmp_path / f"d{i}"
        d.mkdir()
        (d / ".reasonrl-run.json.tmp").write_text('{"stage": "' + stage + '"\n')
        r = run_cli(*args, "--out", d, *extra)
        assert r.exit_code == 0, r.output
        assert (d / MANIFEST).is_file() and not list(d.glob("*.tmp")) and not list(d.glob(".*.tmp"))
        assert json.loads((d / ".reasonrl-run.json").read_text())["stage"] == stage
