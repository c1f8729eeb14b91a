"""Whose directory is this? A stage's output directory: claimed, locked, and cleaned only of its own files.

Every stage writes into one output directory (``--out``). The rules, checked before anything is
written:

- ``/``, the home directory, the reasonrl checkout and the stage's inputs (model, critic, data) are
  never outputs, nor is a directory that holds one of the inputs.
- A stage writes only into an empty (or new) directory, or into a run of its own: a finished one
  (``manifest.json`` of that stage; replaced only with ``--overwrite``) or a crashed one (the run
  marker :data:`MARKER`, written first). A directory with anything else in it, or another stage's
  run, is refused: reasonrl never writes over a user's files or another stage's artifact.
- One process per run directory: an OS lock on :data:`LOCK` (``flock``, released by the kernel when
  the process dies, so a SIGKILL leaves nothing stale). A second writer gets a one-line error
  naming the holder's PID. Under torchrun, rank 0 holds it for the whole job.
- Before a rerun writes, :meth:`RunDir.clear` removes the manifest first, then every output the
  stage declares: never a file it did not write, and never a stale output beside new ones.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

from reasonrl.artifacts import LOCK, MANIFEST, MARKER, write_json
from reasonrl.errors import ReasonRLError

OURS = (MARKER, LOCK)

#: Processes hold their claims here: a stage never blocks a later stage of the same process (a
#: claim left behind by an exception is taken over) and the lock lives as long as the claim.
_HELD: dict[Path, "RunDir"] = {}


def write_failure(e: OSError) -> str:
    """The cause of a failed write, in words, with the one thing to do."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the disk is full: free space"
    if e.errno == errno.EFBIG:
        return "a file-size limit was hit (ulimit -f, or the file system's limit): raise the limit or free space"
    if e.errno in (errno.EACCES, errno.EPERM):
        return "permission denied: choose a directory you can write"
    if e.errno == errno.EROFS:
        return "the file system is read-only: choose another --out"
    return f"{e.strerror or type(e).__name__}"


def _checkout_root() -> Path | None:
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() and (root / "reasonrl").is_dir() else None


def _forbidden(p: Path) -> str | None:
    """Why ``p`` (resolved) can never be an output, or None."""
    if p == Path(p.anchor):
        return "the file system's root"
    if p == Path.home().resolve():
        return "your home directory"
    root = _checkout_root()
    if root is not None and p == root:
        return "the reasonrl checkout"
    return None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _owner(p: Path) -> tuple[str | None, bool]:
    """(the stage whose run ``p`` holds, finished?) from its manifest, else its run marker; (None, False) if neither."""
    m = _read_json(p / MANIFEST)
    if isinstance(m, dict) and isinstance(m.get("stage"), str):
        return m["stage"], True
    marker = _read_json(p / MARKER)
    if isinstance(marker, dict) and isinstance(marker.get("stage"), str):
        return marker["stage"], False
    return None, False


def _holder(lock: Path) -> str:
    info = _read_json(lock)
    if isinstance(info, dict) and "pid" in info:
        return f"PID {info['pid']}, `reasonrl {info.get('stage', '?')}`"
    return "another process"


@dataclass
class RunDir:
    """A claimed output directory: the lock is held until :meth:`release` (or the process ends)."""

    path: Path
    stage: str
    #: The stage whose run the directory held when claimed (None: it was empty or new).
    found: str | None
    #: Whether it held a finished run (a manifest) of this stage.
    finished: bool
    #: Whether the claim created the directory.
    created: bool = False
    _lock: Any = field(default=None, repr=False)

    def clear(self, outputs: Iterable[str]) -> None:
        """Remove the manifest, then each of ``outputs`` (names or glob patterns inside the directory)."""
        (self.path / MANIFEST).unlink(missing_ok=True)
        for pattern in outputs:
            for q in sorted(self.path.glob(pattern)) if any(c in pattern for c in "*?[") else [self.path / pattern]:
                if q.name in OURS:
                    continue
                if q.is_dir() and not q.is_symlink():
                    shutil.rmtree(q)
                elif q.exists() or q.is_symlink():
                    q.unlink()

    @contextmanager
    def writing(self, outputs: Iterable[str] = ()) -> Iterator[None]:
        """Write outputs inside: a failed write (a full disk, a file-size limit, a permission) removes
        ``outputs`` (the partial files) and is a one-line error naming the file and the cause."""
        try:
            yield
        except OSError as e:
            try:
                self.clear(outputs)
            except OSError:
                pass
            what = e.filename or f"the outputs in {self.path}"
            raise ReasonRLError(f"could not write {what}: {write_failure(e)}; the partial outputs were removed (no manifest), "
                                f"then rerun `reasonrl {self.stage}`") from None

    def release(self) -> None:
        """Give the directory up. A stage that wrote nothing (it failed first) leaves the directory as
        it found it: our marker and lock file removed, and the directory too if the claim made it.
        Otherwise the lock file stays (ours, and meaningless once unlocked)."""
        if self._lock is not None:
            try:
                if {q.name for q in self.path.iterdir()} <= set(OURS):
                    for name in OURS:
                        (self.path / name).unlink(missing_ok=True)
                    if self.created:
                        self.path.rmdir()
            except OSError:
                pass
        self.drop()

    def drop(self) -> None:
        """Drop the lock, removing nothing."""
        if self._lock is not None:
            self._lock.close()  # closing the descriptor drops the flock
            self._lock = None
        if _HELD.get(self.path) is self:
            del _HELD[self.path]

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def claim(out: str | os.PathLike, *, stage: str, inputs: Iterable[str | os.PathLike | None] = (), option: str = "--out") -> RunDir:
    """Take ``out`` for one run of ``stage`` (see the module's rules); one-line errors otherwise.

    ``inputs`` are the stage's input paths (model, critic, data): the output may not be one of them
    or hold one. The caller then decides what to keep: :attr:`RunDir.finished` needs --overwrite,
    and :meth:`RunDir.clear` removes the old outputs before new ones are written.
    """
    p = Path(out)
    rp = p.resolve()
    why = _forbidden(rp)
    if why:
        raise ReasonRLError(f"{option} {p} is {why}: a stage writes into a directory of its own; choose a new directory, e.g. {option} runs/{stage}")
    for inp in inputs:
        if inp is None or str(inp) == "" or not Path(inp).exists():
            continue  # (a name: the embedded model, a bundled eval set)
        ri = Path(inp).resolve()
        if ri == rp or rp in ri.parents:
            what = "is" if ri == rp else "holds"
            raise ReasonRLError(f"{option} {p} {what} the input {inp}: writing there could overwrite it; choose another {option}")
    if p.exists() and not p.is_dir():
        raise ReasonRLError(f"{option} {p} is a file: choose a directory")
    _check_owner(p, stage, option)
    created = not p.exists()
    held = _HELD.pop(rp, None)
    if held is not None:
        held.drop()  # an earlier stage of this process that did not release it (it raised): taken over
    lock = _lock(p, option)
    try:
        lock.seek(0)
        lock.truncate()
        lock.write(json.dumps({"pid": os.getpid(), "stage": stage}) + "\n")
        lock.flush()
        found, finished = _check_owner(p, stage, option)  # again, now that we hold it
        marker = _read_json(p / MARKER)
        if not (isinstance(marker, dict) and marker.get("stage") == stage):
            write_json(p / MARKER, {"stage": stage, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    except ReasonRLError:
        lock.close()
        raise
    except OSError as e:
        lock.close()
        raise ReasonRLError(f"cannot write in {option} {p}: {write_failure(e)}") from None
    run = RunDir(rp, stage, found, finished, created, lock)
    _HELD[rp] = run
    return run


def _lock(p: Path, option: str) -> Any:
    """Open and flock ``p/LOCK`` (non-blocking); the open file holds the lock."""
    for _ in range(5):
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ReasonRLError(f"cannot create {option} {p}: {write_failure(e)}") from None
        try:
            lock = open(p / LOCK, "a+", encoding="utf-8")
        except FileNotFoundError:
            continue  # the holder removed the directory as we made it (it wrote nothing)
        except OSError as e:
            raise ReasonRLError(f"cannot create {option} {p}: {write_failure(e)}") from None
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            lock.close()
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ReasonRLError(f"{p} is in use by {_holder(p / LOCK)}: one process writes a run directory; "
                                    f"wait for it to finish or choose another {option}") from None
            raise ReasonRLError(f"cannot lock {p / LOCK}: {write_failure(e)}") from None
        try:
            if os.fstat(lock.fileno()).st_ino == os.stat(p / LOCK).st_ino:
                return lock
        except OSError:
            pass
        lock.close()  # the holder removed the file as we opened it (it wrote nothing): lock the new one
    raise ReasonRLError(f"cannot lock {p / LOCK}: it keeps being replaced; is another process writing {p}?")


def _check_owner(p: Path, stage: str, option: str) -> tuple[str | None, bool]:
    if not p.is_dir():
        return None, False
    found, finished = _owner(p)
    if found is None:
        try:
            others = sorted(q.name for q in p.iterdir() if q.name not in OURS)
        except OSError as e:
            raise ReasonRLError(f"cannot read {option} {p}: {write_failure(e)}") from None
        if others:
            shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
            bad = "a corrupt manifest.json" if (p / MANIFEST).exists() else "no reasonrl run"
            raise ReasonRLError(f"{option} {p} is not empty ({shown}) and holds {bad}: reasonrl writes only into an empty directory "
                                f"or a run of its own; choose a new {option}")
    elif found != stage:
        state = "finished" if finished else "unfinished"
        raise ReasonRLError(f"{option} {p} holds a {state} `reasonrl {found}` run: `reasonrl {stage}` will not write over it; "
                            f"choose another {option}")
    return found, finished


def open_output(out: str | os.PathLike, *, stage: str, outputs: Iterable[str], overwrite: bool,
                inputs: Iterable[str | os.PathLike | None] = ()) -> RunDir:
    """Claim ``out`` for a stage that reruns from scratch: a finished run of its own needs
    ``overwrite``; a crashed one is rerun. The old outputs (manifest first) are removed."""
    run = claim(out, stage=stage, inputs=inputs)
    if run.finished and not overwrite:
        run.release()
        raise ReasonRLError(f"{out} already holds a finished `reasonrl {stage}` run: pass --overwrite to replace it or choose another --out")
    run.clear(outputs)
    return run


F = TypeVar("F", bound=Callable[..., Any])


def releases_claims(fn: F) -> F:
    """Decorate a stage's ``run_…``: every directory it claimed is released when it returns or raises
    (a stage that runs others, like the main job, releases only its own claims)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        before = set(_HELD)
        try:
            return fn(*args, **kwargs)
        finally:
            for p in [p for p in _HELD if p not in before]:
                _HELD[p].release()

    return wrapper  # type: ignore[return-value]
