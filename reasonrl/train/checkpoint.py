"""A training run's directory: checkpoints, resume, and what a rerun may delete.

``out/checkpoints/step_N/`` holds the policy and critic (HF directories), their optimizer and
scheduler state, the RNG state and the data position: the run's stateful parts (:class:`Parts`,
one table: files under their names, JSON states in ``trainer_state.json``), saved by
:func:`save_checkpoint` and put back by :func:`load_checkpoint`. It is written to ``.step_N.tmp``, every file
and directory fsynced, and renamed into place, so a ``step_N`` directory is always complete;
``checkpoints/latest`` names the newest and is itself replaced atomically, after the rename is on
disk (when it is missing or torn, the newest complete ``step_N`` is used). A checkpoint is never
written with a non-finite weight.

A run resumes only from its own checkpoints, and only from an intact one
(:func:`resume_checkpoint`): a ``step_N`` or ``latest`` that is a symbolic link (to another run, or
anywhere) is skipped with a line, and a checkpoint whose files do not all read back whole (a
truncated ``optim.pt`` or safetensors file, a ``trainer_state.json`` without its keys, a missing
part: :func:`checkpoint_damage`) is passed over for the newest intact one, with a line that says so.

``best/`` (``--save-best``) is written to ``.best.tmp`` and fsynced; the old ``best/`` is renamed
aside to ``.best.old``, the new one renamed in, and the old one removed, so a kill at any moment
leaves a complete ``best/`` or ``.best.old`` (:func:`recover_best` puts it back on the next start).

A rerun never silently deletes a run: an unfinished run (checkpoints or metrics but no manifest)
must be resumed (``--resume``) or started over (``--overwrite``), and ``--overwrite`` deletes only
what ``train`` writes (:data:`RUN_OUTPUTS`), never the directory itself or anything else in it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import torch

from reasonrl.artifacts import MANIFEST, open_new, write_json
from reasonrl.devices import resolve_dtype
from reasonrl.errors import ReasonRLError
from reasonrl.rundir import RunDir, claim, write_failure
from reasonrl.tracking.base import TRACKER_OUTPUTS

#: What `reasonrl train` writes in its run directory (all an --overwrite may delete).
RUN_OUTPUTS = ("checkpoints", "rollouts", "policy", "best", ".best.tmp", ".best.old", "metrics.jsonl", "validation.jsonl", "summary.json", "config.json",
               *TRACKER_OUTPUTS, MANIFEST)
#: Config keys a --resume may change: they do not change what the run computes (``out``: a run
#: directory may be moved).
RESUMABLE_CHANGES = {"out", "steps", "save_every", "log_every", "keep_last", "resume", "overwrite", "report_to", "quiet", "max_bad_steps",
                     "keep_rollouts"}
_STEP_DIR = re.compile(r"^step_(\d+)$")


def _steps(out: Path) -> list[tuple[int, Path]]:
    """The run's own ``step_N`` directories with a trainer_state.json (never a symbolic link), oldest first."""
    d = out / "checkpoints"
    if not d.is_dir() or d.is_symlink():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir()
             if (m := _STEP_DIR.match(p.name)) and not p.is_symlink() and (p / "trainer_state.json").is_file()]
    return sorted(found)


def _links(out: Path) -> list[Path]:
    """``checkpoints/step_N`` and ``checkpoints/latest`` entries that are symbolic links (never a run's own)."""
    d = out / "checkpoints"
    if not d.is_dir() or d.is_symlink():
        return []
    return sorted(p for p in d.iterdir() if (p.name == "latest" or _STEP_DIR.match(p.name)) and p.is_symlink())


def _named_latest(out: Path) -> Path | None:
    """The ``step_N`` that ``checkpoints/latest`` names (a regular file holding a step name, never a
    path or a link), if that is one of the run's own checkpoints."""
    f = out / "checkpoints" / "latest"
    try:
        if f.is_symlink() or not f.is_file():
            return None
        name = f.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    p = out / "checkpoints" / name
    return p if _STEP_DIR.match(name) and not p.is_symlink() and (p / "trainer_state.json").is_file() else None


def latest_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint of a run directory (``latest``, else the newest ``step_N``), or None.

    ``latest`` holds a step name (``step_N``), never a path: anything else is ignored, and a
    ``step_N`` or ``latest`` that is a symbolic link is never followed, so a run only ever resumes
    from its own checkpoints. (Files are not read: :func:`resume_checkpoint` checks them.)"""
    named = _named_latest(out)
    if named is not None:
        return named
    steps = _steps(out)
    return steps[-1][1] if steps else None


def _safetensors_damage(f: Path) -> str | None:
    """Why ``f`` is not a whole safetensors file (its header unreadable, or shorter than the tensors it lists), or None."""
    try:
        size = f.stat().st_size
        with open(f, "rb") as fh:
            head = fh.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 2 or 8 + n > size:
                return "truncated (no whole header)"
            header = json.loads(fh.read(n))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return "not a safetensors file"
    return None if 8 + n + max(ends, default=0) <= size else f"truncated ({size} of {8 + n + max(ends)} bytes)"


def _torch_file_damage(f: Path) -> str | None:
    """Why ``f`` is not a whole ``torch.save`` file (a zip archive whose members all lie inside it), or None.
    Read without unpickling anything."""
    import zipfile

    try:
        size = f.stat().st_size
        with zipfile.ZipFile(f) as z:
            infos = z.infolist()
            if not infos:
                return "empty"
            for i in infos:
                if i.header_offset + 30 + len(i.filename) + i.compress_size > size:
                    return "truncated"
    except (OSError, zipfile.BadZipFile, ValueError):
        return "truncated or not a torch file"
    return None


def checkpoint_damage(p: Path) -> str | None:
    """Why checkpoint directory ``p`` cannot be trusted, in words naming the file, or None when it is
    intact: every part a checkpoint has is there (trainer_state.json with its step and data position,
    rng.pt, the policy and its optimizer state, the critic's when there is a critic), and every file
    reads back whole (safetensors headers and lengths, torch.save archives, JSON), no symbolic link
    anywhere in it. Cheap: headers and sizes are read, not the weights."""
    if p.is_symlink() or not p.is_dir():
        return "a symbolic link, not a checkpoint of this run" if p.is_symlink() else "missing"
    try:
        st = json.loads((p / "trainer_state.json").read_text(encoding="utf-8"))
        if not (isinstance(st, dict) and isinstance(st.get("step"), int) and isinstance(st.get("data"), dict)):
            return "trainer_state.json lacks its step or data position"
        m = _STEP_DIR.match(p.name)
        if m and int(m.group(1)) != st["step"]:
            return f"trainer_state.json is for step {st['step']}"
    except (OSError, ValueError, UnicodeDecodeError):
        return "trainer_state.json is missing or not JSON"
    required = ["rng.pt", "policy", "policy_state"] + (["critic_state"] if (p / "critic").exists() else [])
    for part in required:
        if not (p / part).exists():
            return f"{part} is missing"
    if not any(f.suffix == ".safetensors" for f in (p / "policy").rglob("*")):
        return "policy/ holds no safetensors file"
    for f in sorted(p.rglob("*")):
        rel = f.relative_to(p)
        if f.is_symlink():
            return f"{rel} is a symbolic link"
        if not f.is_file():
            continue
        why = None
        if f.suffix == ".safetensors":
            why = _safetensors_damage(f)
        elif f.suffix == ".pt":
            why = _torch_file_damage(f)
        elif f.suffix == ".json":
            try:
                json.loads(f.read_text(encoding="utf-8"))
            except (OSError, ValueError, UnicodeDecodeError):
                why = "not JSON (truncated?)"
        if why:
            return f"{rel} is {why}"
    return None


def resume_checkpoint(out: Path, notes: list[str] | None = None) -> Path | None:
    """The checkpoint a --resume continues from: the newest intact one of the run's own (``latest``
    first, then the ``step_N`` newest first), or None when there is none at all. Symbolic links
    among them are skipped and damaged checkpoints passed over, each with a line in ``notes``;
    when every checkpoint is damaged, a one-line error naming them."""
    links = _links(out)
    for link in links:
        if notes is not None:
            notes.append(f"checkpoints/{link.name} is a symbolic link (to {os.readlink(link)}), not a checkpoint of this run: skipped")
    named = _named_latest(out)
    candidates = ([named] if named is not None else []) + [p for _, p in reversed(_steps(out)) if p != named]
    damaged: list[str] = []
    for p in candidates:
        why = checkpoint_damage(p)
        if why is None:
            if damaged and notes is not None:
                notes.append(f"checkpoints/{', '.join(damaged)}: damaged, passed over; resuming from {p.name}, the newest intact checkpoint")
            return p
        damaged.append(f"{p.name} ({why})")
    if damaged:
        raise ReasonRLError(f"--resume: no intact checkpoint in {out}/checkpoints ({'; '.join(damaged)}): start over with --overwrite")
    return None


def start_run(out: Path, *, resume: bool, overwrite: bool, model_dir: Path, config: dict[str, Any],
              inputs: tuple[str | Path | None, ...] = (), notes: list[str] | None = None) -> tuple[RunDir, Path | None]:
    """Claim ``out`` for a run (``reasonrl.rundir``: never another stage's run or a user's files, one
    process at a time) and make it ready; return the claim and the checkpoint to resume from (None: a
    fresh run).

    Refuses: a model directory as ``out``; a finished run without --overwrite; an unfinished run
    without --resume or --overwrite; a --resume with no (intact) checkpoint, or with changed settings.
    On resume (:func:`resume_checkpoint`; what it skipped goes to ``notes``), metrics.jsonl and
    rollouts/ are cut back to the checkpoint's step, ``latest`` names it, and ``best/`` is put back
    from a write a kill interrupted (:func:`recover_best`).
    """
    if out.exists() and not out.is_dir():
        raise ReasonRLError(f"output {out} is a file: choose a directory with --out")
    if out.resolve() == Path(model_dir).resolve() or (out / "config.json").is_file() and "model_type" in _json(out / "config.json"):
        raise ReasonRLError(f"--out {out} is a model directory: writing the run there would overwrite the model; choose another --out")
    run = claim(out, stage="train", inputs=(model_dir, *inputs))
    if resume:
        ckpt = resume_checkpoint(out, notes)
        if ckpt is None:
            raise ReasonRLError(f"--resume: {out}/checkpoints holds no complete checkpoint: start over with --overwrite (or check --out)")
        _check_same_config(out, config)
        _cut_back(out, int(_json(ckpt / "trainer_state.json")["step"]))
        if _named_latest(out) != ckpt:
            write_latest(out, ckpt.name)
        recover_best(out)
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
    known = "dtype_resolved" in saved  # (the dtype is checked as it resolves, below)
    changed = [k for k, v in config.items() if k in saved and k not in RESUMABLE_CHANGES and not (known and k == "dtype") and _norm(saved[k]) != _norm(v)]
    if changed:
        what = ", ".join(f"{k} ({saved[k]!r} → {config[k]!r})" for k in changed)
        raise ReasonRLError(f"--resume with changed settings: {what}; resume with the run's settings or start over with --overwrite")
    if known and isinstance(config.get("dtype"), str):
        _check_same_dtype(saved, config["dtype"])


def _check_same_dtype(saved: dict[str, Any], dtype: str) -> None:
    """A run computes in the dtype it started in (config.json's ``dtype_resolved``: "auto" resolved on
    the machine it started on). Resumed where ``--dtype`` resolves to another (auto on a CPU with
    native bf16 after one without, or the reverse), it would go on in that dtype and be another run:
    one line naming the ``--dtype`` that keeps it (an explicit dtype that resolves the same may
    replace "auto")."""
    was, now = saved["dtype_resolved"], resolve_dtype(dtype)  # (dtype was checked with the config: EngineOptions)
    if now != was:
        where = " where it started" if saved.get("dtype") == "auto" else ""
        raise ReasonRLError(f"--resume: the run computes in {was} (--dtype {saved.get('dtype', was)}{where}), and --dtype {dtype} is {now} here; "
                            f"resume with --dtype {was} to go on with the same run, or start over with --overwrite")


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
        with open_new(tmp) as f:  # (a link planted at the temporary path is removed, never written through)
            f.write("".join(ln + "\n" for ln in keep))
        os.replace(tmp, log)
    for p in (out / "rollouts").glob("step_*.parquet") if (out / "rollouts").is_dir() else []:
        m = re.match(r"step_(\d+)\.parquet$", p.name)
        if m and int(m.group(1)) > step:
            p.unlink()
    for p in (out / "checkpoints").glob(".step_*.tmp"):
        shutil.rmtree(p, ignore_errors=True)
    for p in _links(out):  # (the link itself, never what it points to)
        p.unlink()
    for n, p in _steps(out):
        if n > step:
            shutil.rmtree(p)


def _fsync(path: Path) -> None:
    """fsync a file or directory (a directory: its entries, so a rename in it is on disk)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (itself included), so what was written there
    survives a power loss once it is renamed into place."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            _fsync(Path(dirpath) / name)
        _fsync(Path(dirpath))


def nonfinite(state_dict: dict[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors holding a NaN or an infinity."""
    return [k for k, v in state_dict.items() if torch.is_floating_point(v) and not bool(torch.isfinite(v).all())]


# ---------------------------------------------------------------- the run's stateful parts

class StatePart(Protocol):
    """A part of the run whose state is JSON, kept in the checkpoint's trainer_state.json under the
    part's name (the data stream with its partial pool, the learner's state, validation's best)."""

    def state(self) -> Any: ...

    def load(self, state: Any) -> None: ...


class FilePart(Protocol):
    """A part of the run kept as files of the checkpoint, at ``where`` (the checkpoint directory /
    the part's name): written by every rank (ZeRO state is sharded), read back by every rank."""

    def save(self, where: Path) -> None: ...

    def load(self, where: Path) -> None: ...


@dataclass
class JsonState:
    """A :class:`StatePart` from a getter and a setter (an object whose methods have other names)."""

    get: Callable[[], Any]
    put: Callable[[Any], None]

    def state(self) -> Any:
        return self.get()

    def load(self, state: Any) -> None:
        self.put(state)


@dataclass
class ModelState:
    """A trained model: its weights in ``NAME/`` (an HF directory; LoRA: the adapter alone), its
    optimiser, LR scheduler (and fp16 loss scaler) in ``NAME_state/``, through its backend.

    :meth:`load` puts back the optimiser state; the weights are read where the model is built, from
    ``NAME/`` of the checkpoint (:attr:`Resumed.path`), before its backend wraps it (ZeRO-3
    partitions a model as its engine is made)."""

    backend: Any
    tokenizer: Any = None
    label: str = ""  # the prefix of its tensors' names in a refusal ("critic.")

    def nonfinite(self) -> list[str]:
        return [f"{self.label}{k}" for k in nonfinite(self.backend.full_state_dict())]

    def save(self, where: Path) -> None:
        self.backend.save_model(where, self.tokenizer)
        self.backend.save_state(where.with_name(f"{where.name}_state"))

    def load(self, where: Path) -> None:
        self.backend.load_state(where.with_name(f"{where.name}_state"))


@dataclass
class RngState:
    """torch's RNG, in ``NAME.pt``: written by rank 0, the same state read back by every rank."""

    rank: int = 0

    def save(self, where: Path) -> None:
        if self.rank == 0:
            torch.save({"torch": torch.get_rng_state()}, where.with_suffix(".pt"))

    def load(self, where: Path) -> None:
        torch.set_rng_state(torch.load(where.with_suffix(".pt"), weights_only=True)["torch"])


@dataclass
class Parts:
    """The run's stateful parts by name: what a checkpoint saves and a resume loads, both by
    :func:`save_checkpoint` and :func:`load_checkpoint` from this one table (a new stateful feature
    is one more entry). ``files``: kept as files under their names, loaded in their order (the RNG
    last: after everything the run's setup draws); ``states``: kept in trainer_state.json under
    their names (a state that is empty is left out; a name missing from an older checkpoint loads
    None: the part keeps its start)."""

    files: dict[str, FilePart]
    states: dict[str, StatePart]


@dataclass
class Resumed:
    """The checkpoint a run continues from, its trainer_state.json read once."""

    path: Path
    state: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.state["step"])


def open_checkpoint(ckpt: Path | None) -> Resumed | None:
    """``ckpt`` (None: a fresh run) with its trainer_state.json."""
    return None if ckpt is None else Resumed(ckpt, json.loads((ckpt / "trainer_state.json").read_text()))


def load_checkpoint(resumed: Resumed, parts: Parts) -> None:
    """Put every part back as ``resumed`` holds it: the states, then the files in their order."""
    for name, part in parts.states.items():
        part.load(resumed.state.get(name))
    for name, fpart in parts.files.items():
        fpart.load(resumed.path / name)


def save_checkpoint(out: Path, step: int, parts: Parts, *, rank: int, world: int, keep_last: int = 0) -> Path:
    """Write ``out/checkpoints/step_{step}`` from ``parts`` (every rank takes part: ZeRO state is
    sharded): each file part under its name (every rank's, before rank 0 moves the directory into
    place), then trainer_state.json (``step`` and each part's state under its name).

    Refuses (one-line error) when a weight is not finite. A failed write (a full disk) removes the
    partial directory and leaves the previous checkpoint as the latest. ``keep_last`` > 0 keeps
    only that many newest checkpoints.
    """
    d = out / "checkpoints" / f"step_{step}"
    tmp = out / "checkpoints" / f".step_{step}.tmp"
    bad = [k for p in parts.files.values() if isinstance(p, ModelState) for k in p.nonfinite()]
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
        for name, fpart in parts.files.items():
            fpart.save(tmp / name)
        if world > 1:  # (every rank's files are in place before rank 0 renames the directory: --async-steps' per-rank batches)
            torch.distributed.barrier()
        if rank == 0:
            write_json(tmp / "trainer_state.json", {"step": step, **{name: s for name, p in parts.states.items() if (s := p.state())}})
            fsync_tree(tmp)
            if d.is_symlink():  # (a link in its place is never written through)
                d.unlink()
            shutil.rmtree(d, ignore_errors=True)
            tmp.rename(d)
            _fsync(d.parent)
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


def _remove(p: Path) -> None:
    """Remove ``p`` whatever it is (a symbolic link: the link only)."""
    if p.is_symlink() or p.is_file():
        p.unlink()
    elif p.exists():
        shutil.rmtree(p)


def recover_best(out: Path) -> None:
    """Put ``best/`` back after a :func:`save_best` a kill interrupted: ``.best.old`` (the previous
    best, renamed aside) becomes ``best/`` again when no complete ``best/`` took its place; a
    leftover ``.best.tmp`` or ``.best.old`` is removed."""
    d, old, tmp = out / "best", out / ".best.old", out / ".best.tmp"
    complete = d.is_dir() and not d.is_symlink() and (d / "best.json").is_file()
    if not complete and old.is_dir() and not old.is_symlink() and (old / "best.json").is_file():
        _remove(d)
        old.rename(d)
    for p in (tmp, old):
        _remove(p)


def best_step(out: Path) -> int | None:
    """The step of the policy in ``out/best/`` (its best.json), or None."""
    st = _json(out / "best" / "best.json") if not (out / "best").is_symlink() else {}
    return st.get("step") if isinstance(st.get("step"), int) else None


def save_best(out: Path, best: Any, step: int, *, policy_backend: Any, tokenizer: Any, rank: int) -> Path:
    """``out/best/`` := the current policy (an HF directory; LoRA: merged, and its ``adapter/``) with a ``best.json`` naming the step,
    the metric and its value (every rank takes part: ZeRO-3 gathers the shards).

    Written to ``.best.tmp`` and fsynced; then the old ``best/`` is renamed to ``.best.old``, the new
    one renamed in, and the old one removed: a kill at any moment leaves a complete ``best/`` or a
    ``.best.old`` that :func:`recover_best` renames back. A failed write (a full disk) removes
    ``.best.tmp``, leaves ``best/`` as it was and raises a one-line ReasonRLError."""
    from reasonrl.train.backend import save_policy

    d, tmp, old = out / "best", out / ".best.tmp", out / ".best.old"
    try:
        if rank == 0:
            recover_best(out)
        save_policy(policy_backend, tmp, tokenizer)  # (LoRA: merged, with its adapter/)
        if rank == 0:
            write_json(tmp / "best.json", {"step": step, "metric": best.metric, "value": best.value})
            fsync_tree(tmp)
            if d.is_symlink():
                d.unlink()
            if d.exists():
                d.rename(old)
            tmp.rename(d)
            _fsync(out)
            _remove(old)
    except Exception as e:  # noqa: BLE001 - as in save_checkpoint
        why = write_failure(e) if isinstance(e, OSError) else _write_error(e, out)
        if why is None:
            raise
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        kept = f"best/ still holds step {best_step(out)}" if best_step(out) is not None else "no best/ was written"
        raise ReasonRLError(f"could not write best/ for step {step} ({why}): .best.tmp was removed, {kept}") from None
    return d


def write_latest(out: Path, name: str) -> None:
    """``checkpoints/latest`` := name, atomically."""
    f = out / "checkpoints" / "latest"
    tmp = f.with_name("latest.tmp")
    _remove(tmp)  # (never written through a link)
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(name + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, f)
    _fsync(f.parent)
