"""reasonrl.rundir: which directories a stage may write, the one-writer lock, and what a rerun removes."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from reasonrl.artifacts import LOCK, MANIFEST, MARKER, hash_path
from reasonrl.errors import ReasonRLError
from reasonrl.rundir import claim, open_output, releases_claims, write_failure

ROOT = Path(__file__).resolve().parents[1]


def _tree(p: Path) -> dict[str, bytes]:
    return {str(q.relative_to(p)): q.read_bytes() for q in sorted(p.rglob("*")) if q.is_file()}


@pytest.mark.parametrize("where", ["root", "home", "checkout"])
def test_root_home_and_checkout_are_never_outputs(where, tmp_path):
    p = {"root": Path("/"), "home": Path.home(), "checkout": ROOT}[where]
    before = sorted(q.name for q in p.iterdir())
    with pytest.raises(ReasonRLError, match={"root": "root", "home": "home directory", "checkout": "checkout"}[where]):
        claim(p, stage="train")
    assert sorted(q.name for q in p.iterdir()) == before  # no marker, no lock file left there


def test_an_input_or_a_folder_holding_one_is_refused(tmp_path):
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    for out in (model, tmp_path / "models"):
        with pytest.raises(ReasonRLError, match="the input"):
            claim(out, stage="eval", inputs=[model])
    assert _tree(tmp_path) == {"models/m/config.json": b"{}"}


def test_a_users_files_are_never_written_over_or_deleted(tmp_path):
    """The probe: `mkdir -p u/wandb && echo x > u/wandb/n && reasonrl train ... --out u` deleted u/wandb."""
    u = tmp_path / "u"
    (u / "wandb").mkdir(parents=True)
    (u / "wandb" / "n").write_text("x")
    (u / "config.json").write_text('{"mine": 1}')
    before = _tree(u)
    for overwrite in (False, True):
        with pytest.raises(ReasonRLError, match=r"is not empty \(config.json, wandb\) and holds no reasonrl run"):
            open_output(u, stage="eval", outputs=("wandb", "config.json"), overwrite=overwrite)
    assert _tree(u) == before and not (u / LOCK).exists() and not (u / MARKER).exists()


@pytest.mark.parametrize("finished", [True, False])
def test_another_stages_run_is_refused_even_with_overwrite(tmp_path, finished):
    """The probe: `reasonrl report T --out T` / `reasonrl eval ... --out T` replaced a finished train run's manifest."""
    t = tmp_path / "T"
    t.mkdir()
    (t / "metrics.jsonl").write_text('{"step": 1}\n')
    if finished:
        (t / MANIFEST).write_text(json.dumps({"stage": "train"}))
    else:
        (t / MARKER).write_text(json.dumps({"stage": "train"}))
    before = _tree(t)
    state = "finished" if finished else "unfinished"
    for stage in ("eval", "report"):
        with pytest.raises(ReasonRLError, match=f"holds a {state} `reasonrl train` run: `reasonrl {stage}` will not write over it"):
            open_output(t, stage=stage, outputs=("metrics.jsonl", "*.png"), overwrite=True)
    assert _tree(t) == before


def test_a_rerun_removes_the_manifest_and_every_old_output_and_nothing_else(tmp_path):
    d = tmp_path / "e"
    with open_output(d, stage="eval", outputs=("samples.jsonl", "results.json", "tensorboard"), overwrite=False) as run:
        assert run.found is None and not run.finished
        (d / "samples.jsonl").write_text("old")
        (d / "results.json").write_text("old")
        (d / "tensorboard").mkdir()
        (d / "tensorboard" / "ev").write_text("old")
        (d / "notes.txt").write_text("a user's note in the run directory")
        (d / MANIFEST).write_text(json.dumps({"stage": "eval"}))
    with pytest.raises(ReasonRLError, match="already holds a finished `reasonrl eval` run: pass --overwrite"):
        open_output(d, stage="eval", outputs=("samples.jsonl",), overwrite=False)
    assert (d / MANIFEST).is_file()
    with open_output(d, stage="eval", outputs=("samples.jsonl", "results.json", "tensorboard"), overwrite=True) as run:
        assert run.found == "eval" and run.finished
        assert sorted(q.name for q in d.iterdir()) == sorted([LOCK, MARKER, "notes.txt"])
    # a crashed run (the marker, no manifest) is rerun without --overwrite, its outputs removed first
    (d / "results.json").write_text("from the crashed run")
    with open_output(d, stage="eval", outputs=("results.json",), overwrite=False) as run:
        assert run.found == "eval" and not run.finished and not (d / "results.json").exists()


def test_a_stage_that_wrote_nothing_leaves_the_directory_as_it_found_it(tmp_path):
    @releases_claims
    def failing_stage(out: Path) -> None:
        claim(out, stage="eval")
        raise ReasonRLError("bad input found after the claim")

    with pytest.raises(ReasonRLError):
        failing_stage(tmp_path / "new")
    assert not (tmp_path / "new").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReasonRLError):
        failing_stage(tmp_path / "empty")
    assert list((tmp_path / "empty").iterdir()) == []


def test_bookkeeping_files_are_not_part_of_a_directorys_hash(tmp_path):
    d = tmp_path / "data"
    with claim(d, stage="prepare-data"):
        (d / "train.parquet").write_bytes(b"rows")
        h = hash_path(d)
    (d / LOCK).write_text(json.dumps({"pid": 1}))
    assert hash_path(d) == h


def _holder(d: Path, stage: str) -> subprocess.Popen:
    code = ("import sys, time; from reasonrl.rundir import claim; r = claim(sys.argv[1], stage=sys.argv[2]); "
            "print('held', flush=True); time.sleep(600)")
    p = subprocess.Popen([sys.executable, "-c", code, str(d), stage], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


@pytest.mark.parametrize("stage", ["train", "eval", "pretrain-value", "report", "prepare-data", "rollout"])
def test_one_writer_per_directory_and_a_killed_holder_leaves_no_stale_lock(tmp_path, stage):
    d = tmp_path / "X"
    p = _holder(d, stage)
    try:
        with pytest.raises(ReasonRLError, match=rf"{d} is in use by PID {p.pid}, `reasonrl {stage}`: one process writes a run directory"):
            open_output(d, stage=stage, outputs=(), overwrite=True)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    with claim(d, stage=stage) as run:  # the kernel dropped the dead holder's lock
        assert run.found == stage
        assert json.loads((d / LOCK).read_text())["pid"] == os.getpid()


def test_a_process_never_blocks_itself(tmp_path):
    d = tmp_path / "X"
    claim(d, stage="train")  # a stage that raised before releasing
    with claim(d, stage="train") as run:  # the next stage of the same process takes it over
        assert run.found == "train"


def test_an_uncreatable_output_is_one_line(tmp_path):
    with pytest.raises(ReasonRLError, match=r"cannot create --out /proc/x: "):
        claim("/proc/x", stage="eval")
    (tmp_path / "f").write_text("a file")
    with pytest.raises(ReasonRLError, match="is a file: choose a directory"):
        claim(tmp_path / "f", stage="eval")


def test_write_failures_say_what_happened(tmp_path):
    assert "disk is full" in write_failure(OSError(errno.ENOSPC, "No space left on device"))
    assert "ulimit -f" in write_failure(OSError(errno.EFBIG, "File too large"))
    assert "free space" not in write_failure(OSError(errno.EIO, "Input/output error"))  # not every failure is a full disk
    d = tmp_path / "e"
    run = open_output(d, stage="eval", outputs=("samples.jsonl",), overwrite=False)
    with pytest.raises(ReasonRLError, match=r"could not write .*samples.jsonl: the disk is full: free space; the partial outputs were removed"):
        with run.writing(("samples.jsonl",)):
            (d / "samples.jsonl").write_text("half")
            raise OSError(errno.ENOSPC, "No space left on device", str(d / "samples.jsonl"))
    assert not (d / "samples.jsonl").exists() and not (d / MANIFEST).exists()
    run.release()
