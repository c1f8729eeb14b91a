"""Whose directory is this? A stage's output directory: claimed, locked, and cleaned only of its own files.

Every stage writes into one output directory (``--out``). The rules, checked before anything is
written:

- ``/``, the home directory, the reasonrl checkout and the stage's inputs (model, critic, data) are
  never outputs, nor is a directory that holds one of the inputs.
- A stage writes only into an empty (or new) directory, or into a run of its own: a finished one
  (``manifest.json`` of that stage; replaced only with ``--overwrite``) or a crashed one (the run
  marker :data:`MARKER`, written first). A directory with anything else in it, or another stage's
  run, is refused: reasonrl never writes over a user's files or another stage's artifact.
- A claim killed at any instant leaves a directory the next run takes: nothing, the lock file, or
  the marker's temporary file (:data:`LEFTOVERS`: write_json's, killed before its rename). A
  directory holding nothing else is a crashed run of the stage that temporary file names, or, when it
  was torn before it named one, nobody's (any stage takes it). The next claim removes the leftovers.
- The run's own files (:data:`RUN_FILES`) are regular files, never links: each is opened without
  following one, and a link (or, for the lock, a file with other hard links) is refused in one line.
  reasonrl never decides whose directory it is by reading through a link, nor writes through one.
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
import stat
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

from reasonrl.artifacts import LOCK, MANIFEST, MARKER, TMP_SUFFIX, write_json
from reasonrl.errors import ReasonRLError

OURS = (MARKER, LOCK)
#: What a kill can leave of the bookkeeping's writes (write_json's temporary files, before their rename).
LEFTOVERS = (MARKER + TMP_SUFFIX, MANIFEST + TMP_SUFFIX)
#: The files reasonrl reads or writes to decide and record whose directory it is: regular files, never links.
RUN_FILES = (MANIFEST, MARKER, LOCK, *LEFTOVERS)

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
    """The JSON in one of the run's files, read without following a link (None: missing, a link, not
    a regular file, unreadable or not JSON)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with open(fd, "rb") as f:
            return json.loads(f.read().decode("utf-8")) if stat.S_ISREG(os.fstat(f.fileno()).st_mode) else None
    except (OSError, ValueError, RecursionError):
        return None


def _stage_of(info: Any) -> str | None:
    return info["stage"] if isinstance(info, dict) and isinstance(info.get("stage"), str) else None


def _owner(p: Path) -> tuple[str | None, bool]:
    """(the stage whose run ``p`` holds, finished?) from its manifest, else its run marker; (None, False) if neither."""
    found = _stage_of(_read_json(p / MANIFEST))
    if found is not None:
        return found, True
    return _stage_of(_read_json(p / MARKER)), False


def _not_own(path: Path, *, lock: bool) -> str | None:
    """Why ``path`` (one of :data:`RUN_FILES`) is not a file reasonrl may read or write, or None (a
    regular file, or none at all)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            return f"is a symbolic link (to {os.readlink(path)})"
        except OSError:
            return "is a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if lock and st.st_nlink > 1:  # (written in place: the same file under another name would be overwritten)
        return f"has {st.st_nlink} hard links (the same file is elsewhere too)"
    return None


def _refuse_not_own(path: Path, why: str, option: str) -> ReasonRLError:
    return ReasonRLError(f"{path} {why}, not a file of reasonrl's: reasonrl never reads or writes a run's own files "
                         f"({LOCK}, {MARKER}, {MANIFEST}) through a link; remove {path} and rerun, or choose another {option}")


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
                if q.name in OURS or q.name in LEFTOVERS:
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
        it found it: our marker and lock file removed (and any leftover of ours), and the directory too
        if the claim made it. Otherwise the lock file stays (ours, and meaningless once unlocked)."""
        if self._lock is not None:
            try:
                if {q.name for q in self.path.iterdir()} <= {*OURS, *LEFTOVERS}:
                    for name in (*LEFTOVERS, *OURS):
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
        if _stage_of(_read_json(p / MARKER)) != stage:
            write_json(p / MARKER, {"stage": stage, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        for name in LEFTOVERS:  # (a killed claim's marker, a killed run's manifest: never renamed, and nobody writes here but us)
            (p / name).unlink(missing_ok=True)
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
            lock = _open_lock(p / LOCK, option)
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
            if os.fstat(lock.fileno()).st_ino == os.lstat(p / LOCK).st_ino:
                return lock
        except OSError:
            pass
        lock.close()  # the holder removed the file as we opened it (it wrote nothing): lock the new one
    raise ReasonRLError(f"cannot lock {p / LOCK}: it keeps being replaced; is another process writing {p}?")


def _open_lock(path: Path, option: str) -> Any:
    """``path`` opened for reading and writing, created if missing, never through a link; one-line
    errors for a link, something not a regular file, or a file with other hard links."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)  # (NONBLOCK: a FIFO)
    except OSError as e:
        why = _not_own(path, lock=True) if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO) else None
        if why:
            raise _refuse_not_own(path, why, option) from None
        raise
    st = os.fstat(fd)
    why = ("is not a regular file" if not stat.S_ISREG(st.st_mode) else
           f"has {st.st_nlink} hard links (the same file is elsewhere too)" if st.st_nlink > 1 else None)
    if why:
        os.close(fd)
        raise _refuse_not_own(path, why, option)
    return open(fd, "r+", encoding="utf-8")


def _check_owner(p: Path, stage: str, option: str) -> tuple[str | None, bool]:
    if not p.is_dir():
        return None, False
    try:
        names = sorted(q.name for q in p.iterdir())
    except OSError as e:
        raise ReasonRLError(f"cannot read {option} {p}: {write_failure(e)}") from None
    for name in RUN_FILES:
        why = _not_own(p / name, lock=name == LOCK) if name in names else None
        if why:
            raise _refuse_not_own(p / name, why, option)
    found, finished = _owner(p)
    leftover = ""
    if found is None:
        others = [n for n in names if n not in OURS and n not in LEFTOVERS]
        if others:
            shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
            if MANIFEST in names:
                raise ReasonRLError(f"{option} {p} is not empty ({shown}) and holds a corrupt manifest.json (it names no stage): "
                                    f"reasonrl cannot tell whose run it is; choose a new {option}")
            raise ReasonRLError(f"{option} {p} is not empty ({shown}) and holds no reasonrl run: reasonrl writes only into an empty "
                                f"directory or a run of its own; move {'it' if len(others) == 1 else 'them'} out or choose a new {option}")
        # nothing but reasonrl's own files: the lock, and what a claim killed in its marker's write leaves
        # (a whole marker not yet renamed names its stage; a torn one names none: nobody's, any stage takes it)
        found = _stage_of(_read_json(p / LEFTOVERS[0]))
        leftover = f" (only its {LEFTOVERS[0]}: it was killed as it began)" if found else ""
    if found is not None and found != stage:
        state = "a finished" if finished else "an unfinished"
        todo = f"choose another {option}" if finished else f"finish it with `reasonrl {found}` or choose another {option}"
        raise ReasonRLError(f"{option} {p} holds {state} `reasonrl {found}` run{leftover}: `reasonrl {stage}` will not write over it; {todo}")
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
    (a stage that runs others, like the main job, releases only its own claims); its start and end
    for SIGTERM (``reasonrl.interrupts.stage_starts`` / ``stage_finished``)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from reasonrl.interrupts import stage_finished, stage_starts

        before = set(_HELD)
        try:
            stage_starts()  # (a SIGTERM noted after the previous stage of a main job finished: stop here)
            result = fn(*args, **kwargs)
            stage_finished()  # (returned: its run is finished, a SIGTERM from now on is only noted)
            return result
        finally:
            for p in [p for p in _HELD if p not in before]:
                _HELD[p].release()

    return wrapper  # type: ignore[return-value]
