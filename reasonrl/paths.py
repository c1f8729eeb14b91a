"""Where bundled data lives: the repository's top-level ``data/`` (installed editable)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"


def bundled(name: str) -> Path:
    """Path of a bundled data file (``data/NAME``)."""
    return DATA / name
