"""Hugging Face Hub names: ``ORG/NAME[@REVISION]`` models and ``hf:ORG/NAME[:CONFIG][@SPLIT]`` data.

Everything goes through ``huggingface_hub``'s own cache and settings, read when a name is
resolved: ``HF_HOME`` (or ``HF_HUB_CACHE``), ``HF_HUB_OFFLINE`` (then only the cache is read, and a
name that is not in it is one line: "not found in the hub cache and offline"), ``HF_TOKEN``.

- :func:`resolve_hub_model`: a model repository's snapshot directory, downloading only what a
  model needs (``config.json`` and the other JSON files, tokenizer files, ``*.safetensors``; pickle
  weights only with ``allow_pickle``). A repository whose weights are pickle files only is refused
  before anything is downloaded (online; offline or unreachable, the cached snapshot's files are checked).
  The directory is then an ordinary model directory: ``check_model_config`` and
  ``trust_remote_code=False`` apply as for a local folder.
- :func:`hub_snapshot`: the same for a dataset repository (its data files and README only).
- :func:`resolved` / :func:`manifest_records`: what was resolved in this process (repository,
  requested revision, commit; a dataset's config, split and fingerprint), for every manifest.

A local path always wins: callers ask here only when no file or directory of that spelling exists.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from reasonrl.errors import ReasonRLError

__all__ = ["DATA_PREFIX", "MODEL_FILES", "hub_cache", "hub_snapshot", "is_hub_data", "is_hub_name", "manifest_records", "offline",
           "record_resolved", "resolve_hub_model", "resolved", "split_hub_data", "split_hub_name"]

#: What a model needs from its repository: configs (config.json, generation_config.json,
#: tokenizer_config.json, special_tokens_map.json, model.safetensors.index.json, ...), tokenizer
#: files (tokenizer.json, merges.txt, vocab.*, SentencePiece's *.model, tiktoken files, chat
#: templates) and safetensors weights.
MODEL_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja", "vocab.*")
#: Pickle weights (loading one can run code): fetched only with --allow-pickle.
PICKLE_FILES = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
#: What a dataset repository gives load_dataset: its data files and the README (its configs).
DATA_FILES = ("*.parquet", "*.jsonl", "*.json", "*.csv", "*.tsv", "*.txt", "*.arrow", "README.md", "*.jsonl.gz", "*.json.gz")
DATA_PREFIX = "hf:"

_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_NAME = re.compile(rf"^({_PART}/{_PART})(?:@([A-Za-z0-9][A-Za-z0-9._/-]*))?$")
_DATA = re.compile(rf"^{DATA_PREFIX}({_PART}/{_PART})(?::([A-Za-z0-9][A-Za-z0-9._-]*))?(?:@([A-Za-z0-9][A-Za-z0-9._-]*))?$")

#: Spelling → what it resolved to, in this process (see :func:`manifest_records`).
_RESOLVED: dict[str, dict[str, Any]] = {}


def split_hub_name(name: str) -> tuple[str, str | None] | None:
    """(repo id, revision or None) of ``ORG/NAME[@REVISION]``; None for any other spelling."""
    m = _NAME.match(str(name))
    if m is None or ".." in m.group(1):
        return None
    return m.group(1), m.group(2)


def is_hub_name(name: Any) -> bool:
    """Whether ``name`` is spelled as a hub model (``ORG/NAME[@REVISION]``) and is no local path."""
    return isinstance(name, (str, os.PathLike)) and split_hub_name(str(name)) is not None and not Path(name).expanduser().exists()


def is_hub_data(spec: Any) -> bool:
    return isinstance(spec, str) and spec.startswith(DATA_PREFIX)


def split_hub_data(spec: str) -> tuple[str, str | None, str | None]:
    """(repo id, config, split) of ``hf:ORG/NAME[:CONFIG][@SPLIT]``; a malformed one is one line."""
    m = _DATA.match(spec)
    if m is None:
        raise ReasonRLError(f"{spec!r} is not a hub dataset name: write hf:ORG/NAME, hf:ORG/NAME:CONFIG, hf:ORG/NAME@SPLIT or hf:ORG/NAME:CONFIG@SPLIT")
    return m.group(1), m.group(2), m.group(3)


def _true(v: str | None) -> bool:
    return (v or "").strip().upper() in ("1", "ON", "YES", "TRUE")


def offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``), as set now or when huggingface_hub was imported."""
    from huggingface_hub import constants

    return _true(os.environ.get("HF_HUB_OFFLINE")) or _true(os.environ.get("TRANSFORMERS_OFFLINE")) or constants.is_offline_mode()


def hub_cache() -> Path:
    """The hub cache as the environment says now: ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else huggingface_hub's default."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _download_hint(repo_id: str, revision: str | None, repo_type: str) -> str:
    rev = f" --revision {revision}" if revision else ""
    kind = " --repo-type dataset" if repo_type == "dataset" else ""
    return f"`hf download {repo_id}{kind}{rev}` where the hub is reachable, with the same HF_HOME"


def _hub_error(e: Exception, what: str, repo_id: str, revision: str | None, repo_type: str, local_hint: str) -> ReasonRLError:
    """One line for a failed hub call: what went wrong, then the fix."""
    from huggingface_hub import errors

    from reasonrl.console import error_line

    if isinstance(e, errors.GatedRepoError):
        return ReasonRLError(f"{what}: {repo_id} is gated: accept its terms on huggingface.co and set HF_TOKEN to a token of that account")
    local = "no such local directory, and " if repo_type == "model" else ""
    if isinstance(e, errors.RepositoryNotFoundError):
        return ReasonRLError(f"{what}: {local}no {repo_type} repository {repo_id} on the hub (or it is private: set HF_TOKEN); {local_hint}")
    if isinstance(e, errors.RevisionNotFoundError):
        return ReasonRLError(f"{what}: {repo_id} has no revision {revision!r}: pass a branch, tag or commit it has")
    if isinstance(e, (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled)) and offline():
        rev = f" at revision {revision}" if revision else ""
        return ReasonRLError(f"{what}: {local}not found in the hub cache and offline: {repo_id}{rev} is not in {hub_cache()} and HF_HUB_OFFLINE is set; "
                             f"download it first ({_download_hint(repo_id, revision, repo_type)}), or {local_hint}")
    return ReasonRLError(f"{what}: cannot reach the hub for {repo_id} ({error_line(e, 160)}): check the network, "
                         f"or set HF_HUB_OFFLINE=1 to use the cache ({_download_hint(repo_id, revision, repo_type)})")


def hub_snapshot(repo_id: str, revision: str | None, *, repo_type: str, allow_patterns: tuple[str, ...], what: str, local_hint: str) -> Path:
    """The snapshot directory of ``repo_id`` at ``revision`` (default: its main branch): from the
    cache, downloading the files ``allow_patterns`` match unless offline. Failures are one line."""
    from huggingface_hub import snapshot_download

    from reasonrl.console import library_bars

    if not library_bars():  # (quiet: the libraries' bars are off unless --verbose, reasonrl.console)
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    try:
        path = snapshot_download(repo_id, repo_type=repo_type, revision=revision, allow_patterns=list(allow_patterns),
                                 cache_dir=str(hub_cache()), local_files_only=offline())
    except ReasonRLError:
        raise
    except Exception as e:  # noqa: BLE001 - every hub failure is a user-facing line
        raise _hub_error(e, what, repo_id, revision, repo_type, local_hint) from None
    return Path(path)


def _repo_files(repo_id: str, revision: str | None, what: str, local_hint: str) -> list[str] | None:
    """The repository's file names at ``revision``; None when the hub cannot be reached (then
    snapshot_download falls back on the cache, as huggingface_hub does, and the cached snapshot's
    files are checked instead). A missing repository or revision, or a gated one, is one line."""
    from huggingface_hub import HfApi, errors

    try:
        return HfApi().list_repo_files(repo_id, revision=revision)
    except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError) as e:  # (GatedRepoError is a RepositoryNotFoundError)
        raise _hub_error(e, what, repo_id, revision, "model", local_hint) from None
    except Exception:  # noqa: BLE001 - the network: the download below says what it finds
        return None


def _weights_line(files: list[str], where: str, allow_pickle: bool, pickle_option: bool = True) -> str | None:
    """Why a repository's file list cannot give a model, or None (``pickle_option``: the stage has --allow-pickle)."""
    from fnmatch import fnmatch

    names = [f.rsplit("/", 1)[-1] for f in files]
    if any(fnmatch(n, "*.safetensors") for n in names):
        return None
    pickled = sorted(n for n in names if any(fnmatch(n, p) for p in PICKLE_FILES))
    if pickled and not allow_pickle:
        return (f"{where} holds weights only as pickle files ({', '.join(pickled[:3])}), which can run code when loaded: "
                "use a repository (or revision) with safetensors weights" + (", or pass --allow-pickle if you trust the source" if pickle_option else ""))
    if not pickled:
        return f"{where} holds no model weights (no *.safetensors file): pass a model repository"
    return None


def resolve_hub_model(name: str, *, allow_pickle: bool = False, what: str = "--model", pickle_option: bool = True,
                      local_hint: str = "pass an existing local model directory") -> Path:
    """The snapshot directory of the hub model ``ORG/NAME[@REVISION]`` (see the module doc);
    ``pickle_option``: whether the stage has --allow-pickle (named in the refusal); ``local_hint``:
    the fix when the name is meant as a local path that is not there."""
    parts = split_hub_name(name)
    if parts is None:
        raise ReasonRLError(f"{what} {name}: not a local directory nor a hub name ORG/NAME[@REVISION]: pass an HF model directory")
    repo_id, revision = parts
    label = f"{what} {name}"
    if not offline():  # look before downloading: a pickle-only repository is refused with nothing fetched
        files = _repo_files(repo_id, revision, label, local_hint)
        line = _weights_line(files, f"{label}: {repo_id}", allow_pickle, pickle_option) if files is not None else None
        if line:
            raise ReasonRLError(line)
    patterns = MODEL_FILES + (PICKLE_FILES if allow_pickle else ())
    path = hub_snapshot(repo_id, revision, repo_type="model", allow_patterns=patterns, what=label, local_hint=local_hint)
    if not (path / "config.json").is_file():
        raise ReasonRLError(f"{label}: its snapshot {path} has no config.json (not a transformers model, or not fully downloaded): "
                            f"download it again ({_download_hint(repo_id, revision, 'model')}) or pass another model")
    cached = [str(f.relative_to(path)) for f in path.rglob("*") if f.is_file()]
    line = _weights_line(cached, f"{label}: the cached snapshot {path}", allow_pickle, pickle_option)
    if line:
        raise ReasonRLError(line)
    record_resolved(name, {"kind": "model", "repo_id": repo_id, "requested_revision": revision or "main", "commit": path.name, "path": str(path)})
    return path


def record_resolved(spelling: str, record: dict[str, Any]) -> None:
    """Remember what ``spelling`` resolved to in this process, for :func:`manifest_records`."""
    _RESOLVED[str(spelling)] = dict(record)


def resolved(spelling: str) -> dict[str, Any] | None:
    """What ``spelling`` (a hub model or ``hf:`` dataset name) resolved to in this process, or None."""
    rec = _RESOLVED.get(str(spelling))
    return dict(rec) if rec is not None else None


def manifest_records(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """For a stage's resolved config: each field (``inputs[0]`` for a list's items) whose value is a
    hub name resolved in this process, with the repository, the commit and (a dataset) its config,
    split and fingerprint; {} when none is."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in config.items():
        items = [(key, value)] if not isinstance(value, (list, tuple)) else [(f"{key}[{i}]", v) for i, v in enumerate(value)]
        for k, v in items:
            if isinstance(v, str) and v in _RESOLVED:
                out[k] = {"name": v, **_RESOLVED[v]}
    return out
