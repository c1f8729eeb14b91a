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
    state, article = ("finished", "a") if finished else ("unfinished", "an")
    for stage in ("eval", "report"):
        with pytest.raises(ReasonRLError, match=f"holds {article} {state} `reasonrl train` run: `reasonrl {stage}` will not write over it"):
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


# -- a claim killed at any instant (issue 42), and links in a run directory (issue 40, item 9) --------------------

#: What each stage's own claim of --out is (the call its run_… makes), with no --overwrite.
STAGES = ["eval", "train", "pretrain-value", "rollout", "prepare-data", "report"]
TMP = MARKER + ".tmp"
#: What write_json leaves when the marker's write is killed: the whole JSON (killed before the
#: rename), part of it, or nothing (killed right after the temporary file was created).
HALF = {"whole": lambda s: json.dumps({"stage": s, "created": "2026-12-04T18:00:00+0000"}, indent=2) + "\n",
        "truncated": lambda s: '{"stage": "' + s + '"', "empty": lambda s: ""}


def _stage_claim(stage: str, d: Path, tmp_path: Path):
    """The claim ``stage`` makes of its --out ``d`` (its real call), without --overwrite."""
    if stage == "train":
        from reasonrl.train.checkpoint import start_run

        run, ckpt = start_run(d, resume=False, overwrite=False, model_dir=tmp_path / "model", config={})
        assert ckpt is None
        return run
    if stage == "prepare-data":
        return claim(d, stage=stage)  # (prepare-data: a finished artifact needs --overwrite; none here)
    from reasonrl.stages.eval import OUTPUTS as EVAL_OUTPUTS
    from reasonrl.stages.pretrain_value import OUTPUTS as PV_OUTPUTS

    outputs = {"eval": EVAL_OUTPUTS, "pretrain-value": PV_OUTPUTS, "rollout": ("rollouts.parquet", "summary.json"),
               "report": ("report.html", "curves.png")}[stage]
    return open_output(d, stage=stage, outputs=outputs, overwrite=stage == "report")  # (report always overwrites its own)


def _killed_in_marker_write(d: Path, stage: str, half: str) -> None:
    """The directory a SIGKILL inside the claim's marker write leaves: the lock file (naming the dead
    process) and the marker's temporary file, nothing else."""
    d.mkdir()
    (d / LOCK).write_text(json.dumps({"pid": 999999, "stage": stage}) + "\n")
    (d / TMP).write_text(HALF[half](stage))


@pytest.mark.parametrize("half", list(HALF))
@pytest.mark.parametrize("stage", STAGES)
def test_a_claim_killed_while_writing_its_marker_is_taken_by_the_next_run_of_the_stage(stage, half, tmp_path):
    """Issue 42: `echo '{"stage": "eval"' > d/.reasonrl-run.json.tmp` was refused by every stage, with --overwrite too."""
    d = tmp_path / "out"
    _killed_in_marker_write(d, stage, half)
    with _stage_claim(stage, d, tmp_path) as run:
        assert not run.finished and run.found in (stage, None)
        assert sorted(q.name for q in d.iterdir()) == [MARKER, LOCK]  # the leftover replaced by the marker
        assert json.loads((d / MARKER).read_text())["stage"] == stage
        assert json.loads((d / LOCK).read_text())["pid"] == os.getpid()


@pytest.mark.parametrize("half", ["truncated", "empty"])
def test_a_marker_torn_before_it_named_its_stage_is_no_run(half, tmp_path):
    """A torn marker cannot say whose it was: the directory holds nothing but reasonrl's leftovers, any stage takes it."""
    d = tmp_path / "out"
    _killed_in_marker_write(d, "train", half)
    with open_output(d, stage="eval", outputs=("samples.jsonl",), overwrite=False) as run:
        assert run.found is None and not run.finished
        assert json.loads((d / MARKER).read_text())["stage"] == "eval"


def test_another_stages_whole_marker_is_its_run(tmp_path):
    """A whole marker, killed before its rename, names its stage: the run is that stage's, as with a renamed one."""
    d = tmp_path / "out"
    _killed_in_marker_write(d, "train", "whole")
    before = _tree(d)
    for overwrite in (False, True):
        with pytest.raises(ReasonRLError, match=rf"--out {d} holds an unfinished `reasonrl train` run \(only its {TMP}: it was "
                                                rf"killed as it began\): `reasonrl eval` will not write over it; "):
            open_output(d, stage="eval", outputs=("samples.jsonl",), overwrite=overwrite)
    assert _tree(d) == before


def test_leftovers_beside_a_users_files_are_named_apart(tmp_path):
    """A user's file beside reasonrl's leftovers: refused, naming the user's file and what to do; nothing changed."""
    d = tmp_path / "out"
    _killed_in_marker_write(d, "eval", "truncated")
    (d / "notes.txt").write_text("mine")
    before = _tree(d)
    with pytest.raises(ReasonRLError, match=r"is not empty \(notes.txt\) and holds no reasonrl run: .*move it out or choose a new --out"):
        open_output(d, stage="eval", outputs=("samples.jsonl",), overwrite=True)
    assert _tree(d) == before


def test_a_rerun_removes_a_manifest_torn_by_a_kill(tmp_path):
    """Killed while its manifest was written: the rerun takes the crashed run and removes the manifest's temporary file too."""
    d = tmp_path / "e"
    with open_output(d, stage="eval", outputs=("samples.jsonl",), overwrite=False):
        (d / "samples.jsonl").write_text("s")
        (d / (MANIFEST + ".tmp")).write_text('{"stage": "ev')
    with open_output(d, stage="eval", outputs=("samples.jsonl",), overwrite=False) as run:
        assert run.found == "eval" and not run.finished
        assert sorted(q.name for q in d.iterdir()) == [MARKER, LOCK]


def test_a_stage_that_fails_after_taking_leftovers_leaves_nothing(tmp_path):
    @releases_claims
    def failing_stage(out: Path) -> None:
        claim(out, stage="eval")
        raise ReasonRLError("bad input found after the claim")

    d = tmp_path / "out"
    _killed_in_marker_write(d, "eval", "truncated")
    with pytest.raises(ReasonRLError):
        failing_stage(d)
    assert list(d.iterdir()) == []


def _precious(tmp_path: Path) -> Path:
    v = tmp_path / "v.txt"
    v.write_text("precious\n")
    return v


@pytest.mark.parametrize("name", [LOCK, MARKER, MANIFEST, TMP, MANIFEST + ".tmp"])
@pytest.mark.parametrize("stage", ["eval", "report", "train"])
def test_a_bookkeeping_file_that_is_a_link_is_refused_and_never_written_through(name, stage, tmp_path):
    """Issue 40, item 9: a `.reasonrl.lock` link to a file outside the run was truncated and filled with the PID."""
    v = _precious(tmp_path)
    if name != LOCK:
        v.write_text(json.dumps({"stage": stage}))  # (a link that would make the directory look like the stage's own)
    before = v.read_text()
    d = tmp_path / "d"
    d.mkdir()
    (d / name).symlink_to(v)
    with pytest.raises(ReasonRLError) as e:
        _stage_claim(stage, d, tmp_path)
    assert v.read_text() == before and sorted(q.name for q in d.iterdir()) == [name] and (d / name).is_symlink()
    msg = str(e.value)
    assert "\n" not in msg and str(d / name) in msg and "is a symbolic link" in msg and f"remove {d / name}" in msg, msg


def test_a_lock_that_is_a_hard_link_fifo_or_directory_is_refused(tmp_path):
    v = _precious(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    os.link(v, d / LOCK)
    with pytest.raises(ReasonRLError, match=rf"{d / LOCK} has 2 hard links"):
        claim(d, stage="eval")
    assert v.read_text() == "precious\n"
    (d / LOCK).unlink()
    os.mkfifo(d / LOCK)  # (opened without blocking)
    with pytest.raises(ReasonRLError, match=rf"{d / LOCK} is not a regular file"):
        claim(d, stage="eval")
    (d / LOCK).unlink()
    (d / LOCK).mkdir()
    with pytest.raises(ReasonRLError, match=rf"{d / LOCK} is not a regular file"):
        claim(d, stage="eval")


def test_the_lock_is_opened_without_following_a_link_made_after_the_check(tmp_path, monkeypatch):
    """The link appears between the directory's check and the lock's open: the open itself refuses it."""
    import reasonrl.rundir as rundir

    v = _precious(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    checked = rundir._check_owner

    def then_link(p, stage, option):
        found = checked(p, stage, option)
        if not (p / LOCK).is_symlink():
            (p / LOCK).symlink_to(v)
        return found

    monkeypatch.setattr(rundir, "_check_owner", then_link)
    with pytest.raises(ReasonRLError, match="is a symbolic link"):
        claim(d, stage="eval")
    assert v.read_text() == "precious\n"


def test_write_json_never_writes_through_a_link(tmp_path):
    from reasonrl.artifacts import write_json

    v = _precious(tmp_path)
    for name in ("results.json.tmp", "results.json"):  # a link where the temporary file goes; the file itself a link
        d = tmp_path / name
        d.mkdir()
        (d / name).symlink_to(v)
        write_json(d / "results.json", {"a": 1})
        assert v.read_text() == "precious\n"
        assert not (d / "results.json").is_symlink() and json.loads((d / "results.json").read_text()) == {"a": 1}
        assert sorted(q.name for q in d.iterdir()) == ["results.json"]


def test_append_jsonl_and_the_parquet_writes_never_write_through_a_link(tmp_path):
    """A link planted at metrics.jsonl (or validation.jsonl) had every step's line appended to the file it
    points to, outside the run; one at a parquet's temporary path (prepare-data's splits, rollouts and
    train --keep-rollouts) had pyarrow write the table through it."""
    import pyarrow.parquet as pq

    from reasonrl.artifacts import append_jsonl
    from reasonrl.rollouts import Sample, write_rollouts

    v = _precious(tmp_path)
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").symlink_to(v)
    with pytest.raises(OSError) as e:
        append_jsonl(d / "metrics.jsonl", {"step": 1})
    assert v.read_text() == "precious\n" and (d / "metrics.jsonl").is_symlink()
    assert e.value.filename == str(d / "metrics.jsonl") and "symbolic link" in write_failure(e.value)
    (d / "validation.jsonl").symlink_to(tmp_path / "made-outside.jsonl")  # a dangling link: the file would be made there
    with pytest.raises(OSError):
        append_jsonl(d / "validation.jsonl", {"step": 1})
    assert not (tmp_path / "made-outside.jsonl").exists()
    append_jsonl(d / "new.jsonl", {"step": 1})  # (a regular file: made, then appended to)
    append_jsonl(d / "new.jsonl", {"step": 2})
    assert [json.loads(ln)["step"] for ln in (d / "new.jsonl").read_text().splitlines()] == [1, 2]

    (d / "rollouts.parquet.tmp").symlink_to(v)
    sample = Sample(group=0, prompt_index=0, prompt="p", prompt_ids=[1], response="r", response_ids=[2], logprobs=[-1.0], finish_reason="stop",
                    truncated=False, ground_truth="0", reward=1.0, correct=True)
    write_rollouts(d / "rollouts.parquet", [sample])
    assert v.read_text() == "precious\n" and not (d / "rollouts.parquet.tmp").exists()
    assert pq.read_table(d / "rollouts.parquet").to_pylist()[0]["response"] == "r"
