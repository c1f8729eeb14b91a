"""Chaos: SIGKILL and SIGTERM the real CLI at random moments and resume; the run must end as if nothing happened.

`reasonrl train` (HF engine, fp32, the format-taught tiny model, DAPO with dynamic sampling) is
(with validation on: step 0, every 2 steps, the last, a best policy kept) killed with SIGKILL at >= 10 random moments (some timed to land while a checkpoint is being
written), and rerun each time the way a user would: `--resume` when a checkpoint exists, else
`--overwrite`. The final weights must be bitwise equal to an uninterrupted run's, metrics.jsonl must
hold each step exactly once with the same values, and the checkpoints must be the same. The other
stages are killed too: inside the write of their run marker (the state that kill leaves, made on
disk: the lock file and the marker's torn temporary file) the same command takes the directory and
finishes; at a random moment of their start a half-written output is refused by the next stage, and
rerunning the command finishes it.

SIGTERM (a scheduler's stop) at >= 6 random moments, the launches alternating `--save-every 0` and
`--save-every 1` (one timed to land while a checkpoint is being written): each stop exits 143 with
one line naming the checkpoint it leaves (the last finished step, written at the signal when
--save-every 0 had not), metrics.jsonl holds exactly the checkpointed steps, the trackers were
closed (the W&B offline run has its exit record); following the line (--resume, or --overwrite
when there is nothing to resume) ends bitwise equal to the uninterrupted run. `eval` stopped by
SIGTERM: one line, exit 143, no manifest. (2 torchrun ranks: tests/train/test_deepspeed.py.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from toyhelp import jsonl_records

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6
KILLS = 10
TERMS = 6


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}


def _cmd(*args: object) -> list[str]:
    return [sys.executable, "-m", "reasonrl.cli", *[str(a) for a in args]]


#: Validation on (step 0, every 2 steps, the last), with a best policy kept: a resumed run validates as the uninterrupted one.
VAL = ["--val-every", "2", "--val-n", "2", "--val-bootstrap", "50", "--val-max-response-len", "8", "--save-best", "val/avg@2"]


def _train_args(model: Path, data: Path, out: Path, save_every: int = 1) -> list[object]:
    return ["train", "--algo", "dapo", "--model", model, "--data", data, "--out", out, "--engine", "hf", "--dtype", "fp32",
            "--group-size", "4", "--max-response-len", "8", "--prompts-per-step", "2", "--mini-batch-size", "4", "--micro-batch-size", "2",
            "--max-gen-rounds", "2", "--overlong-cache-len", "2", "--lr", "1e-3", "--save-every", save_every, "--steps", STEPS, "--seed", "3",
            *VAL]


def _metrics(out: Path) -> list[dict]:
    lines = jsonl_records(out / "metrics.jsonl")  # (a SIGKILL mid-append leaves a torn last line: the resumed run drops it)
    return [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in lines]


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def _lines(out: Path) -> int:
    return len(jsonl_records(out / "metrics.jsonl"))  # (complete lines: the run is being watched)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _claimed(out: Path, pid: int) -> bool:
    """Whether the process ``pid`` holds the run directory ``out`` (its lock file names it)."""
    try:
        return json.loads((out / ".reasonrl.lock").read_text()).get("pid") == pid
    except (OSError, ValueError, AttributeError):
        return False


def _kill_when(p: subprocess.Popen, out: Path, *, at_checkpoint: bool, after_lines: int = 0, extra_s: float = 0.0, sig: int = signal.SIGKILL,
               after_checkpoint: int | None = None) -> str:
    """Send ``sig`` to ``p`` as soon as a checkpoint is being written (``at_checkpoint``), or ``extra_s``
    seconds after metrics.jsonl reached ``after_lines`` lines (a random moment inside the next step:
    generation, scoring, update, sync or checkpoint) or, with ``after_checkpoint``, after ``latest``
    reached that step; and wait for it; returns what was happening, or "finished".

    A checkpoint's temporary directory left by a killed launch is not a write in progress. A SIGTERM
    is sent once the command holds its run directory (the lock names its PID): a killed launch can
    leave metrics.jsonl with lines past its checkpoint (the resumed run drops them), which made the
    moment "reached" at once, and a SIGTERM in the interpreter's first tenths of a second, before the
    CLI's handler exists, ends it as it ends any program that has not started (-15, nothing written)."""
    reached, launched = None, time.time() - 0.05
    while p.poll() is None:
        writing = [d for d in (out / "checkpoints").glob(".step_*.tmp") if _mtime(d) >= launched] if (out / "checkpoints").is_dir() else []
        up = _claimed(out, p.pid)
        if reached is None and (up or sig == signal.SIGKILL) and (_lines(out) >= after_lines if after_checkpoint is None
                                                                   else _done_steps(out) >= after_checkpoint):
            reached = time.monotonic()
        if (at_checkpoint and writing) or (not at_checkpoint and reached is not None and time.monotonic() - reached >= extra_s):
            p.send_signal(sig)
            p.wait(timeout=300)
            return "mid-checkpoint" if writing else "mid-step"
        time.sleep(0.002 if at_checkpoint else 0.01)
    return "finished"


def _done_steps(out: Path) -> int:
    latest = out / "checkpoints" / "latest"
    try:
        return int(latest.read_text().strip().removeprefix("step_"))
    except (OSError, ValueError):
        return 0


@pytest.fixture(scope="module")
def reference(format_model, toy_data_file, tmp_path_factory) -> tuple[Path, Path, float, float]:
    """(data, the uninterrupted run, its start-up time, its time per step): the time per step sets
    how far into a step a kill lands."""
    tmp = tmp_path_factory.mktemp("chaos_ref")
    data = tmp / "data"
    subprocess.run(_cmd("prepare-data", toy_data_file, "--out", data, "--template", "none", "--val-size", "4"), env=_env(), check=True,
                   capture_output=True, timeout=300)
    ref = tmp / "ref"
    t0 = time.monotonic()
    p = subprocess.Popen(_cmd(*_train_args(format_model, data, ref)), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while p.poll() is None and _lines(ref) < 1:
        time.sleep(0.05)
    startup = time.monotonic() - t0
    _, err = p.communicate(timeout=900)
    assert p.returncode == 0, err[-3000:]
    return data, ref, startup, max((time.monotonic() - t0 - startup) / (STEPS - 1), 0.05)


def _same_run(out: Path, ref: Path) -> None:
    """metrics.jsonl: each step once, with the reference's values; the final weights bitwise equal."""
    assert _metrics(out) == _metrics(ref)
    assert [m["step"] for m in _metrics(out)] == list(range(0, STEPS + 1))  # (step 0: the validation before any update)
    assert [m["step"] for m in _metrics(out) if "val/avg@2" in m] == [0, *range(2, STEPS + 1, 2)] + ([STEPS] if STEPS % 2 else [])
    assert json.loads((out / "best" / "best.json").read_text()) == json.loads((ref / "best" / "best.json").read_text())
    a, b = _weights(ref / "policy"), _weights(out / "policy")
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a), "final weights differ"


def test_sigkill_anywhere_then_resume_is_the_same_run(format_model, reference) -> None:
    data, ref, startup, per_step = reference
    out = ref.parent / "chaos"
    rng = random.Random(0)
    kills: list[str] = []
    launches = 0
    while True:
        resume = (out / "checkpoints").is_dir() and any((out / "checkpoints").glob("step_*"))
        args = _train_args(format_model, data, out) + (["--resume"] if resume else ["--overwrite"])
        proc = subprocess.Popen(_cmd(*args), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        launches += 1
        if len(kills) < KILLS:
            done = _done_steps(out)
            # a random moment of a random remaining step (or of the start-up, before any step)
            target = rng.randint(done, STEPS - 1) if done < STEPS else done
            extra = rng.uniform(0.2, 1.0) * startup if target == done else rng.uniform(0.0, 0.9) * per_step  # (startup: to the 1st step's end)
            what = _kill_when(proc, out, at_checkpoint=len(kills) % 4 == 3, after_lines=target, extra_s=extra)
            if what != "finished":
                kills.append(what)
                print(f"chaos: kill {len(kills)} {what} (launch {launches}, {_done_steps(out)} steps checkpointed)", file=sys.stderr)
                continue
            assert proc.returncode == 0, proc.stderr.read()[-3000:] if proc.stderr else ""
            shutil.rmtree(out)  # it ended before the kill: start over
            continue
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        break
    assert len(kills) >= KILLS and "mid-checkpoint" in kills, kills

    _same_run(out, ref)
    ckpts = lambda d: sorted(x.name for x in (d / "checkpoints").iterdir())  # noqa: E731
    assert ckpts(out) == ckpts(ref)
    for n in range(1, STEPS + 1):
        st_ref = json.loads((ref / "checkpoints" / f"step_{n}" / "trainer_state.json").read_text())
        assert json.loads((out / "checkpoints" / f"step_{n}" / "trainer_state.json").read_text()) == st_ref
    print(f"chaos: {len(kills)} SIGKILLs ({', '.join(kills)}) over {launches} launches; final weights bitwise equal")


def _dead_pid() -> int:
    """The PID of a process that has exited (what a killed stage's lock file names)."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _as_killed_in_marker_write(out: Path, stage: str) -> None:
    """Make ``out`` what a SIGKILL inside a stage's claim leaves when it lands in the write of the run
    marker: the lock file naming the dead process, and the marker's temporary file (write_json's,
    never renamed) torn halfway; nothing else (issue 42: every stage refused it, --overwrite too)."""
    from reasonrl.artifacts import LOCK, MARKER, temp_path

    out.mkdir(parents=True)
    (out / LOCK).write_text(json.dumps({"pid": _dead_pid(), "stage": stage}) + "\n")
    whole = json.dumps({"stage": stage, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=2) + "\n"
    temp_path(out / MARKER).write_text(whole[: len(whole) // 2])


@pytest.mark.parametrize("stage", ["prepare-data", "pretrain-value", "eval"])
def test_sigkill_in_other_stages(stage, format_model, tmp_path) -> None:
    """Killed inside the write of its run marker: the same command takes the directory and finishes.
    Killed at a random moment of its start (as soon as it has written something): the next stage
    refuses the half-written output (no manifest), and rerunning the same command finishes it."""
    shared = ROOT.parent / "shared" / "data" / "gsm8k_train.jsonl"
    src = shared if shared.is_file() else ROOT / "data" / "gsm8k_test.jsonl"
    data = tmp_path / "data"

    def prep(out: Path) -> list[str]:
        return _cmd("prepare-data", src, "--out", out, "--template", "none", "--val-size", "8", "--overwrite")

    if stage != "prepare-data":
        subprocess.run(prep(data), env=_env(), check=True, capture_output=True, timeout=600)

    def command(out: Path) -> list[str]:
        return {
            "prepare-data": prep(out),
            "pretrain-value": _cmd("pretrain-value", "--model", format_model, "--data", data, "--out", out, "--engine", "hf", "--dtype", "fp32",
                                   "--steps", "3", "--prompts-per-step", "2", "--group-size", "2", "--max-response-len", "8", "--eval-prompts", "2"),
            "eval": _cmd("eval", "file", "--dataset", data, "--model", format_model, "--out", out, "--engine", "hf", "--dtype", "fp32", "--n", "2",
                         "--max-response-len", "8", "--max-problems", "8"),
        }[stage]

    # the kill inside the marker's write, made deterministic: its on-disk state, then the command
    marked = tmp_path / f"{stage}-marker"
    _as_killed_in_marker_write(marked, stage)
    done = subprocess.run(command(marked), env=_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (marked / "manifest.json").is_file() and not [q.name for q in marked.iterdir() if q.name.endswith(".tmp")]

    # a random moment of the start: whatever it has written by then (the lock, the marker, outputs) is taken by the rerun
    target = data if stage == "prepare-data" else tmp_path / stage
    for _ in range(3):
        proc = subprocess.Popen(command(target), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        while proc.poll() is None and not (target.is_dir() and any(target.iterdir())):  # as soon as it has written something
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)  # (nothing, when it has already exited)
        _, err = proc.communicate(timeout=300)
        if proc.returncode == -signal.SIGKILL:
            break
        assert proc.returncode == 0, err[-3000:]  # it finished before the kill: again
        shutil.rmtree(target)
    assert proc.returncode == -signal.SIGKILL
    assert not (target / "manifest.json").exists()
    if stage == "prepare-data":
        nxt = subprocess.run(_cmd("train", "--data", data, "--model", format_model, "--out", tmp_path / "t"), env=_env(), capture_output=True, text=True)
        assert nxt.returncode == 1 and "manifest.json" in nxt.stderr and "prepare-data" in nxt.stderr, nxt.stderr[-2000:]
    elif stage == "pretrain-value":
        nxt = subprocess.run(_cmd("train", "--algo", "vcppo", "--critic", target, "--data", data, "--model", format_model, "--out", tmp_path / "t"),
                             env=_env(), capture_output=True, text=True)
        assert nxt.returncode == 1 and "pretrain-value" in nxt.stderr and "Traceback" not in nxt.stderr, nxt.stderr[-2000:]
    again = subprocess.run(command(target), env=_env(), capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (target / "manifest.json").is_file()


def _wandb_env(tmp: Path) -> dict[str, str]:
    """An offline W&B run in ``tmp``; {} without wandb."""
    if importlib.util.find_spec("wandb") is None:
        return {}
    return {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp / "wandb_dir"), "WANDB_CONFIG_DIR": str(tmp / "wcfg"), "WANDB_CACHE_DIR": str(tmp / "wcache"),
            "WANDB_DATA_DIR": str(tmp / "wdata"), "WANDB_SILENT": "true", "WANDB_PROJECT": "reasonrl-chaos"}


def _wandb_records(tmp: Path) -> tuple[list[str], list[int]]:
    """(record kinds, logged steps) of the one offline W&B run in ``tmp`` (tests/tracking/wandb_file.py reads the file)."""
    spec = importlib.util.spec_from_file_location("reasonrl_wandb_file", ROOT / "tests" / "tracking" / "wandb_file.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    files = list((tmp / "wandb_dir").glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    return [r.WhichOneof("record_type") for r in mod.records(files[0])], [row["_step"] for row in mod.history(files[0])]


def test_sigterm_anywhere_then_resume_is_the_same_run(format_model, reference, tmp_path) -> None:
    data, ref, startup, _ = reference
    raw = [json.loads(x) for x in (ref / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps_s = sorted(m["perf/step_s"] for m in raw if "perf/step_s" in m)  # (step 0's line is the validation alone)
    step_s = steps_s[len(steps_s) // 2]  # (the median step; a checkpoint comes on top)
    out = tmp_path / "term"
    wandb_env = _wandb_env(tmp_path)
    rng = random.Random(1)
    stops: list[str] = []
    launches = 0
    while True:
        done = _done_steps(out)
        save_every = len(stops) % 2  # the launches alternate --save-every 0 and 1 (a --resume may change it)
        args = _train_args(format_model, data, out, save_every=save_every) + (["--resume"] if done else ["--overwrite"])
        first = launches == 0
        if first and wandb_env:
            args += ["--report-to", "tensorboard,wandb"]
        proc = subprocess.Popen(_cmd(*args), env={**_env(), **(wandb_env if first else {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        launches += 1
        if len(stops) == TERMS:
            _, err = proc.communicate(timeout=900)
            assert proc.returncode == 0, err[-3000:]
            break
        # a random moment of a random remaining step but the last (a signal after the last step lets the run finish),
        # or of the start-up; the first stop comes after a step, so that there is a W&B run to close
        target = rng.randint(max(done, int(first)), STEPS - 2) if done < STEPS - 1 else done
        extra = rng.uniform(0.4, 0.7 if done >= STEPS - 1 else 1.0) * startup if target == done else rng.uniform(0.0, 1.0) * step_s
        what = _kill_when(proc, out, at_checkpoint=len(stops) == 3, after_lines=target, extra_s=extra, sig=signal.SIGTERM)
        err = proc.stderr.read() if proc.stderr else ""
        # it ended before the signal, or the signal came once the steps were over (closing, final outputs, the
        # interpreter's exit): the run is finished, exit 0 with its manifest (tests/stages/test_signal_at_end.py); start over
        if what == "finished" or proc.returncode == 0:
            assert proc.returncode == 0 and (out / "manifest.json").is_file(), (what, proc.returncode, err[-3000:])
            shutil.rmtree(out)
            continue
        assert proc.returncode == 143, (what, proc.returncode, err[-3000:])  # (never the raw signal, -15)
        lines = [ln for ln in err.splitlines() if ln.startswith("stopped by SIGTERM")]
        assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
        done = _done_steps(out)
        logged = [m["step"] for m in _metrics(out)] if (out / "metrics.jsonl").is_file() else []
        assert [s for s in logged if s > 0] == list(range(1, done + 1)), (lines[0], logged)  # every finished step logged once, and checkpointed
        if "train did not finish" in lines[0]:  # stopped before the command began (imports): the same command again
            assert lines[0].endswith("rerun the same command"), lines[0]
        elif done:
            assert f"checkpoint step_{done} " in lines[0] and "--resume" in lines[0], lines[0]
        else:
            assert "--resume" not in lines[0], lines[0]
        if first and wandb_env:  # the trackers were closed: wandb.finish() wrote the run's exit record
            kinds, steps = _wandb_records(tmp_path)
            assert "exit" in kinds and steps == logged, (kinds, steps, logged)
        stops.append(f"{what} (--save-every {save_every}): {lines[0].split(':')[0].removeprefix('stopped by SIGTERM ')}")
        print(f"chaos: SIGTERM {len(stops)} {stops[-1]}; {done} steps checkpointed", file=sys.stderr)
    assert len(stops) >= TERMS, stops

    _same_run(out, ref)
    for ck in (out / "checkpoints").glob("step_*"):  # (the stops wrote checkpoints the reference also has)
        st_ref = json.loads((ref / "checkpoints" / ck.name / "trainer_state.json").read_text())
        assert json.loads((ck / "trainer_state.json").read_text()) == st_ref, ck.name
    print(f"chaos: {len(stops)} SIGTERMs over {launches} launches; final weights bitwise equal", file=sys.stderr)


def test_sigterm_in_eval_is_one_line_and_no_manifest(format_model, reference, tmp_path) -> None:
    data = reference[0]
    out = tmp_path / "eval"
    cmd = _cmd("eval", "file", "--dataset", data / "train.parquet", "--model", format_model, "--out", out, "--engine", "hf", "--dtype", "fp32",
               "--n", "8", "--max-response-len", "64")
    delay = random.Random(2).uniform(0.5, 3.0)  # (model loading or generation: a few times shorter than the whole)
    for _ in range(4):
        proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while proc.poll() is None and not out.is_dir():  # (made before the engine is opened)
            time.sleep(0.005)
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)  # (nothing, when it has already exited)
        _, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            break
        assert (out / "manifest.json").is_file(), err[-3000:]  # (a signal once the manifest is written: finished, exit 0)
        shutil.rmtree(out)  # it finished before the signal (a faster machine): again, sooner
        delay /= 4
    assert proc.returncode == 143, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("stopped by SIGTERM")]
    assert len(lines) == 1 and "eval did not finish" in lines[0] and "rerun" in lines[0] and "Traceback" not in err, err[-3000:]
    assert not (out / "manifest.json").exists()


def _lora_args(model: Path, data: Path, out: Path) -> list[object]:
    """The chaos run with a rank-4 LoRA adapter at 10x the LR (validation and the best policy kept too)."""
    args = _train_args(model, data, out)
    args[args.index("--lr") + 1] = "1e-2"
    return [*args, "--lora-rank", "4"]


def test_sigkill_then_resume_a_lora_run_is_the_same_run(format_model, prepared, tmp_path) -> None:
    """One SIGKILL in a random moment of a LoRA run, then --resume: the same metrics, checkpoints
    (adapter + its optimizer state), best/ and final merged policy/ as an uninterrupted LoRA run, bitwise."""
    ref, out = tmp_path / "ref", tmp_path / "chaos"
    t0 = time.monotonic()
    done = subprocess.run(_cmd(*_lora_args(format_model, prepared, ref)), env=_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    per_step = (time.monotonic() - t0) / (STEPS + 1)
    raw = [json.loads(x) for x in (ref / "metrics.jsonl").read_text().splitlines() if x.strip()]
    step_s = min([m["perf/step_s"] for m in raw if "perf/step_s" in m] or [per_step])  # (the shortest step)
    rng = random.Random(4)
    what = "finished"
    for _ in range(5):  # (a run that ends before its kill, or a kill where it cannot be resumed into the run's middle, starts over)
        shutil.rmtree(out, ignore_errors=True)
        proc = subprocess.Popen(_cmd(*_lora_args(format_model, prepared, out)), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # after checkpoint k (not after step k's metrics line: its checkpoint comes after it), within the next step or
        # its checkpoint; k <= STEPS - 2, so even a step faster than the reference's shortest leaves the last one to do
        what = _kill_when(proc, out, at_checkpoint=False, after_checkpoint=rng.randint(1, STEPS - 2), extra_s=rng.uniform(0.0, 0.9) * step_s)
        if what != "finished" and 0 < _done_steps(out) < STEPS:
            break
    # (mid-step, or, when the random moment falls in a checkpoint's write, mid-checkpoint: either kill must resume bitwise)
    assert what in ("mid-step", "mid-checkpoint") and 0 < _done_steps(out) < STEPS, (what, _done_steps(out))
    again = subprocess.run(_cmd(*_lora_args(format_model, prepared, out), "--resume"), env=_env(), capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    _same_run(out, ref)
    for d in ("policy/adapter", "best/adapter", *(f"checkpoints/step_{n}/policy" for n in range(1, STEPS + 1))):
        assert (out / d / "adapter_model.safetensors").read_bytes() == (ref / d / "adapter_model.safetensors").read_bytes(), d
    import torch

    for n in range(1, STEPS + 1):
        a, b = (torch.load(d / "checkpoints" / f"step_{n}" / "policy_state" / "optim.pt", weights_only=True)["optimizer"] for d in (ref, out))
        assert a["param_groups"] == b["param_groups"] and a["state"].keys() == b["state"].keys(), n
        assert all(torch.equal(a["state"][i][k], b["state"][i][k]) for i in a["state"] for k in a["state"][i]), n
        assert not list((out / "checkpoints" / f"step_{n}" / "policy").glob("model*.safetensors"))  # (no frozen base)


#: One step off (--async-steps 1): the engine in its own process, one thread.
ASYNC = ["--async-steps", "1", "--engine-threads", "1"]
ASYNC_STOPS = 8


@pytest.fixture(scope="module")
def async_reference(format_model, reference) -> tuple[Path, Path, float, float]:
    """(data, the uninterrupted --async-steps 1 run, its start-up time, its time per step)."""
    data = reference[0]
    ref = reference[1].parent / "async_ref"
    t0 = time.monotonic()
    p = subprocess.Popen(_cmd(*_train_args(format_model, data, ref), *ASYNC), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while p.poll() is None and _lines(ref) < 1:
        time.sleep(0.05)
    startup = time.monotonic() - t0
    _, err = p.communicate(timeout=900)
    assert p.returncode == 0, err[-3000:]
    return data, ref, startup, max((time.monotonic() - t0 - startup) / (STEPS - 1), 0.05)


def test_async_steps_killed_anywhere_then_resumed_is_the_same_run(format_model, reference, async_reference) -> None:
    """--async-steps 1 stopped at random moments, SIGKILL and SIGTERM in turn (one SIGKILL timed to
    land while a checkpoint is being written, the SIGTERM launches alternating --save-every 1 and 0),
    and resumed each time: the uninterrupted async run, bitwise, each step's metrics once, no trained
    token more than one version old. Its first step is the synchronous run's (the same policy
    samples the same prompts with the same seeds)."""
    data, ref, startup, per_step = async_reference
    raw = [json.loads(x) for x in (ref / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert all(m.get("rollout/staleness_max", 0) <= 1 for m in raw if m["step"] > 0) and any(m.get("rollout/staleness_max") == 1 for m in raw)
    sync = {k: v for k, v in _metrics(reference[1])[1].items() if k.startswith("rollout/") and "stale" not in k}
    assert {k: v for k, v in _metrics(ref)[1].items() if k in sync} == sync  # (step 1: before any update, the same batch)
    out = ref.parent / "async_chaos"
    rng = random.Random(2)
    stops: list[str] = []
    launches = 0
    while True:
        done = _done_steps(out)
        sig = signal.SIGKILL if len(stops) % 2 == 0 else signal.SIGTERM
        save_every = 0 if sig == signal.SIGTERM and len(stops) % 4 == 3 else 1
        args = _train_args(format_model, data, out, save_every=save_every) + ASYNC + (["--resume"] if done else ["--overwrite"])
        proc = subprocess.Popen(_cmd(*args), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        launches += 1
        if len(stops) == ASYNC_STOPS:
            _, err = proc.communicate(timeout=900)
            assert proc.returncode == 0, err[-3000:]
            break
        target = rng.randint(done, STEPS - 2) if done < STEPS - 1 else done
        extra = rng.uniform(0.2, 1.0) * startup if target == done else rng.uniform(0.0, 1.0) * per_step
        what = _kill_when(proc, out, at_checkpoint=len(stops) == 4, after_lines=target, extra_s=extra, sig=sig)
        err = proc.stderr.read() if proc.stderr else ""
        if what == "finished" or proc.returncode == 0:  # (it ended first, or the signal came once the steps were over)
            assert proc.returncode == 0 and (out / "manifest.json").is_file(), (what, proc.returncode, err[-3000:])
            shutil.rmtree(out)
            continue
        assert proc.returncode == (-signal.SIGKILL if sig == signal.SIGKILL else 143), (what, proc.returncode, err[-3000:])
        if sig == signal.SIGTERM:
            assert len([ln for ln in err.splitlines() if ln.startswith("stopped by SIGTERM")]) == 1 and "Traceback" not in err, err[-3000:]
        logged = [m["step"] for m in _metrics(out)] if (out / "metrics.jsonl").is_file() else []
        assert len(logged) == len(set(logged)), logged  # (each step once, whatever the stop cut)
        stops.append(f"{signal_name(sig)} {what}")
        print(f"chaos async: {stops[-1]} (launch {launches}, {_done_steps(out)} steps checkpointed)", file=sys.stderr)
    _same_run(out, ref)
    for ck in (out / "checkpoints").glob("step_*"):
        assert json.loads((ck / "trainer_state.json").read_text()) == json.loads((ref / "checkpoints" / ck.name / "trainer_state.json").read_text())
    print(f"chaos async: {len(stops)} stops ({', '.join(stops)}) over {launches} launches; final weights bitwise equal", file=sys.stderr)


def signal_name(sig: int) -> str:
    return signal.Signals(sig).name
