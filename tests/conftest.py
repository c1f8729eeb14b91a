"""Shared fixtures: the tiny in-process model (random, and one taught the answer format)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from isolation import ProcessState
from reasonrl.devices import reproducible_blas
from toyhelp import sft_answer_format, toy_rows

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
reproducible_blas()  # (as the CLI does)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True, scope="module")
def _module_process_state():
    """Module-scoped fixtures (an engine built once per module) change state for their module only."""
    state = ProcessState()
    yield
    state.restore()


@pytest.fixture(autouse=True)
def _process_state():
    """Every test sees the process as the test before it found it, whatever order they run in."""
    state = ProcessState()
    yield
    state.restore()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from reasonrl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def format_model(tiny_model, tmp_path_factory) -> Path:
    return sft_answer_format(tiny_model, tmp_path_factory.mktemp("fmt") / "model")


@pytest.fixture(scope="session")
def toy_data_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("toy") / "toy.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in toy_rows(200, seed=3)))
    return p


@pytest.fixture(scope="session")
def prepared(tmp_path_factory, toy_data_file) -> Path:
    """The toy data through `reasonrl prepare-data` (template none, 4 held out); read only (copy it to change it)."""
    from clihelp import run_cli

    out = tmp_path_factory.mktemp("toyprep") / "data"
    r = run_cli("prepare-data", toy_data_file, "--out", out, "--template", "none", "--val-size", "4")
    assert r.exit_code == 0, r.output
    return out
