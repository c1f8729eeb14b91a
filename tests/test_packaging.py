"""A regular (non-editable) install has everything: the bundled eval sets and the stage recipes."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The wheel built from this tree, installed into a folder of its own (no editable finder)."""
    work = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(work), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = work.glob("reasonrl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "reasonrl/bundled/aime24.jsonl" in names and "reasonrl/recipes/train-dapo-cpu.toml" in names
    assert {p.relative_to(ROOT).as_posix() for p in (ROOT / "reasonrl").rglob("*.py")} <= set(names)
    site = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(site)}
    return site, env


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd="/", env=env, capture_output=True, text=True, timeout=300)


def test_eval_help_and_data_from_the_wheel(installed) -> None:
    site, env = installed
    p = _run(env, "-m", "reasonrl.cli", "eval", "aime", "--help")
    assert p.returncode == 0, p.stderr
    assert "--n" in p.stdout
    code = ("import reasonrl; from reasonrl.evaluation.sets import EVAL_SETS; from reasonrl.stages.eval import load_problems;"
            "from reasonrl.stages.main_job import recipes_dir;"
            "print(reasonrl.__file__); print(len(load_problems('aime', 'dapo'))); print(recipes_dir() / 'train-dapo-cpu.toml')")
    p = _run(env, "-c", code)
    assert p.returncode == 0, p.stderr
    where, n, recipe = p.stdout.split()
    assert where.startswith(str(site)), "the test must exercise the installed copy, not the source tree"
    assert int(n) == 60
    assert recipe.startswith(str(site)) and Path(recipe).is_file()
