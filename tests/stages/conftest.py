"""What the stage tests share: the toy data prepared once (read only; copy it to change it)."""

from __future__ import annotations

import pytest
from clihelp import run_cli


@pytest.fixture(scope="session")
def prepared(tmp_path_factory, toy_data_file):
    """``toy_data_file`` through ``reasonrl prepare-data`` (no template, 4 validation rows)."""
    out = tmp_path_factory.mktemp("prepared") / "data"
    r = run_cli("prepare-data", toy_data_file, "--out", out, "--template", "none", "--val-size", "4")
    assert r.exit_code == 0, r.output
    return out
