"""Fixtures for the data tests: the shared public data sets live in ../shared/data (CI has them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared() -> Path:
    assert SHARED.is_dir(), f"{SHARED} is missing: the data tests read the shared public data sets"
    return SHARED


@pytest.fixture
def write_jsonl() -> Callable[[Path, list], Path]:
    def write(path: Path, rows: list) -> Path:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        return path

    return write
