"""A training run's directory: checkpoints, resume, and what a rerun may delete.

``out/checkpoints/step_N/`` holds the policy and critic (HF directories), their optimizer and
scheduler state, the RNG state and the data position. It is written to ``.step_N.tmp`` and renamed
into place, so a ``step_N`` directory is always complete; ``checkpoints/latest`` names the newest
and is itself replaced atomically (when it is missing or torn, the newest complete ``step_N`` is
used). A checkpoint is never written with a non-finite weight.

A rerun never silently deletes a run: an unfinished run (checkpoints or metrics but no manifest)
must be resumed (``--resume``) or started over (``--overwrite``), and ``--overwrite`` deletes only
what ``train`` writes (:data:`RUN_OUTPUTS`), never the directory itself or anything else in it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from reasonrl.artifacts import MANIFEST, write_json
from reasonrl.errors import ReasonRLError
from reasonrl.rundir import RunDir, claim, write_failure
from reasonrl.tracking.base import TRACKER_OUTPUTS

#: What `reasonrl train` writes in its run directory (all an --overwrite may delete).
RUN_OUTPUTS = ("checkpoints", "rollouts", "policy", "best", ".best.tmp", "metrics.jsonl", "validation.jsonl", "summary.json", "config.json",
               *TRACKER_OUTPUTS, MANIFEST)
#: Config keys a --resume may change: they do not change what the run computes (``out``: a run
#: directory may be moved).
RESUMABLE_CHANGES = {"out", "steps", "save_every", "log_every", "keep_last", "resume", "overwrite", "report_to", "quiet", "max_bad_steps",
                     "keep_rollouts"}
_STEP_DIR = re.compile(r"^step_(\d+)$")


def _steps(out: Path) -> list[tuple[int, Path]]:
    d = out / "checkpoints"
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _STEP_DIR.match(p.name)) and (p / "trainer_state.json").is_file()]
    return sorted(found)


def latest_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint of a run directory (``latest``, else the newest ``step_N``), or None.

    ``latest`` holds a step name (``step_N``), never a path: anything else is ignored, so a run only
    ever resumes from its own checkpoints."""
    f = out / "checkpoints" / "latest"
    try:
        name = f.read_text(encoding="utf-8").strip()
        p = out / "checkpoints" / name
        if _STEP_DIR.match(name) and (p / "trainer_state.json").is_file():
            return p
    except (OSError, UnicodeDecodeError):
        pass
    steps = _steps(out)
    return steps[-1][1] if steps else None


def start_run(out: Path, *, resume: bool, overwrite: bool, model_dir: Path, config: dict[str, Any],
              inputs: tuple[str | Path | None, ...] = ()) -> tuple[RunDir, Path | None]:
    """Claim ``out`` for a run (``reasonrl.rundir``: never another stage's run or a user's files, one
    process at a time) and make it ready; return the claim and the checkpoint to resume from (None: a
    fresh run).

    Refuses: a model directory as ``out``; a finished run without --overwrite; an unfinished run
    without --resume or --overwrite; a --resume with no checkpoint, or with changed settings.
    On resume, metrics.jsonl and rollouts/ are cut back to the checkpoint's step.
    """
    if out.exists() and not out.is_dir():
        raise ReasonRLError(f"output {out} is a file: choose a directory with --out")
    if out.resolve() == Path(model_dir).resolve() or (out / "config.json").is_file() and "model_type" in _json(out / "config.json"):
        raise ReasonRLError(f"--out {out} is a model directory: writing the run there would overwrite the model; choose another --out")
    run = claim(out, stage="train", inputs=(model_dir, *inputs))
    if resume:
        ckpt = latest_checkpoint(out)
        if ckpt is None:
            raise ReasonRLError(f"--resume: {out}/checkpoints holds no complete checkpoint: start over with --overwrite (or check --out)")
        _check_same_config(out, config)
        _cut_back(out, int(_json(ckpt / "trainer_state.json")["step"]))
        return run, ckpt
    unfinished = _steps(out) or (out / "metrics.jsonl").is_file()
    if (run.finished or unfinished) and not overwrite:
        if run.finished:
            raise ReasonRLError(f"{out} already holds a finished run: pass --overwrite to replace it or choose another --out")
        last = latest_checkpoint(out)
        if last is None:
            raise ReasonRLError(f"{out} holds an unfinished run that stopped before its first checkpoint (nothing to resume): "
                                "start over with --overwrite or choose another --out")
        raise ReasonRLError(f"{out} holds an unfinished run (checkpoints up to {last.name}): resume it with --resume or start over with --overwrite")
    run.clear(RUN_OUTPUTS)  # the manifest first: a half-written run is never taken for a finished one
    return run, None


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _check_same_config(out: Path, config: dict[str, Any]) -> None:
    saved = _json(out / "config.json")
    if not saved:
        raise ReasonRLError(f"--resume: {out}/config.json is missing or unreadable, so the run's settings cannot be checked against "
                            "this one's: start over with --overwrite")
    changed = [k for k, v in config.items() if k in saved and k not in RESUMABLE_CHANGES and _norm(saved[k]) != _norm(v)]
    if changed:
        what = ", ".join(f"{k} ({saved[k]!r} → {config[k]!r})" for k in changed)
        raise ReasonRLError(f"--resume with changed settings: {what}; resume with the run's settings or start over with --overwrite")


def _norm(v: Any) -> Any:
    return json.loads(json.dumps(v, default=str))


def _cut_back(out: Path, step: int) -> None:
    """Forget what happened after checkpoint ``step``: later metrics and validation lines, rollouts, partial checkpoints."""
    for log in (out / "metrics.jsonl", out / "validation.jsonl"):
        if not log.is_file():
            continue
        keep = []
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                if line.strip() and int(json.loads(line)["step"]) <= step:
                    keep.append(line)
            except (ValueError, KeyError, TypeError):
                break  # a torn last line
        tmp = log.with_name(log.name + ".tmp")
        tmp.write_text("".join(ln + "\n" for ln in keep), encoding="utf-8")
        os.replace(tmp, log)
    for p in (out / "rollouts").glob("step_*.parquet") if (out / "rollouts").is_dir() else []:
        m = re.match(r"step_(\d+)\.parquet$", p.name)
        if m and int(m.group(1)) > step:
            p.unlink()
    for p in (out / "checkpoints").glob(".step_*.tmp"):
        shutil.rmtree(p, ignore_errors=True)
    for n, p in _steps(out):
        if n > step:
            shutil.rmtree(p)


def nonfinite(state_dict: dict[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors holding a NaN or an infinity."""
    return [k for k, v in state_dict.items() if torch.is_floating_point(v) and not bool(torch.isfinite(v).all())]


def save_checkpoint(out: Path, step: int, *, policy_backend: Any, critic_backend: Any, tokenizer: Any, data_state: dict[str, Any],
                    rank: int, world: int, keep_last: int = 0, val_state: dict[str, Any] | None = None,
                    learner_state: dict[str, Any] | None = None) -> Path:
    """Write ``out/checkpoints/step_{step}`` (every rank takes part: ZeRO state is sharded);
    ``val_state`` and ``learner_state`` go into its trainer_state.json as ``val`` and ``learner``.

    Refuses (one-line error) when a weight is not finite. A failed write (a full disk) removes the
    partial directory and leaves the previous checkpoint as the latest. ``keep_last`` > 0 keeps
    only that many newest checkpoints.
    """
    d = out / "checkpoints" / f"step_{step}"
    tmp = out / "checkpoints" / f".step_{step}.tmp"
    bad = nonfinite(policy_backend.full_state_dict())
    if critic_backend is not None:
        bad += [f"critic.{k}" for k in nonfinite(critic_backend.full_state_dict())]
    if bad:
        raise ReasonRLError(f"step {step}: {len(bad)} weights are not finite (e.g. {bad[0]}): no checkpoint written; "
                            "lower --lr or --grad-clip and --resume from the last good checkpoint")
    prev = latest_checkpoint(out)
    try:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        if world > 1:
            torch.distributed.barrier()
        policy_backend.save_model(tmp / "policy", tokenizer)
        policy_backend.save_state(tmp / "policy_state")
        if critic_backend is not None:
            critic_backend.save_model(tmp / "critic")
            critic_backend.save_state(tmp / "critic_state")
        if rank == 0:
            torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
            write_json(tmp / "trainer_state.json", {"step": step, "data": data_state, **({"val": val_state} if val_state else {}),
                                                    **({"learner": learner_state} if learner_state else {})})
            shutil.rmtree(d, ignore_errors=True)
            tmp.rename(d)
            write_latest(out, d.name)
    except Exception as e:  # noqa: BLE001 - an OSError, torch.save's RuntimeError on a short write, safetensors' SafetensorError
        why = write_failure(e) if isinstance(e, OSError) else _write_error(e, out)
        if why is None:
            raise
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        if prev is not None:
            raise ReasonRLError(f"could not write checkpoint step {step} ({why}): the partial checkpoint was removed, "
                                f"{prev.name} is intact and the latest; then rerun with --resume") from None
        raise ReasonRLError(f"could not write checkpoint step {step} ({why}): the partial checkpoint was removed and no earlier "
                            "checkpoint exists; then start over with --overwrite") from None
    if world > 1:
        torch.distributed.barrier()
    if rank == 0 and keep_last > 0:
        for _, p in _steps(out)[:-keep_last]:
            shutil.rmtree(p, ignore_errors=True)
    return d


def _write_error(e: BaseException, where: Path) -> str | None:
    """The cause of a checkpoint write that failed without an OSError (torch.save's RuntimeError on a
    short write, safetensors' SafetensorError), or None if ``e`` is not such an error."""
    if not (isinstance(e, RuntimeError) or type(e).__name__ == "SafetensorError"):
        return None
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft != resource.RLIM_INFINITY:
        return f"a write failed under a file-size limit (ulimit -f: {soft} bytes): raise the limit"
    try:
        if shutil.disk_usage(where).free < 64 << 20:
            return "the disk is full: free space"
    except OSError:
        pass
    text = str(e).strip().splitlines()
    return f"a write failed: {text[-1][:160] if text else type(e).__name__}"


def save_best(out: Path, best: Any, step: int, *, policy_backend: Any, tokenizer: Any, rank: int) -> Path:
    """``out/best/`` := the current policy (an HF directory; LoRA: merged, and its ``adapter/``) with a ``best.json`` naming the step,
    the metric and its value; written to ``.best.tmp`` and renamed into place (every rank takes
    part: ZeRO-3 gathers the shards)."""
    from reasonrl.train.backend import save_policy

    d, tmp = out / "best", out / ".best.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    save_policy(policy_backend, tmp, tokenizer)  # (LoRA: merged, with its adapter/)
    if rank == 0:
        write_json(tmp / "best.json", {"step": step, "metric": best.metric, "value": best.value})
        shutil.rmtree(d, ignore_errors=True)
        tmp.rename(d)
    return d


def write_latest(out: Path, name: str) -> None:
    """``checkpoints/latest`` := name, atomically."""
    f = out / "checkpoints" / "latest"
    tmp = f.with_name("latest.tmp")
    tmp.write_text(name + "\n")
    os.replace(tmp, f)
