"""Data shipped with the package (see README.md here): the evaluation sets and the main job's
arithmetic task. This folder is the repository's top-level ``data/`` and ships as the package
``reasonrl.bundled``; its files are read with ``importlib.resources``, so a regular (non-editable)
install has them."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def bundled(name: str) -> Path:
    """Path of a bundled data file (``data/NAME`` in the repository)."""
    return Path(str(resources.files(__name__).joinpath(name)))
