"""A regular (non-editable) install has everything: the bundled data sets (the top-level data/,
shipped as the package reasonrl.bundled) and the stage recipes (stages/, shipped as reasonrl.recipes).

The wheel is built from a clean copy of this tree and installed into a fresh venv that borrows this
interpreter's dependencies (torch, transformers, ...) but not its reasonrl, and is run from outside
the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA_FILES = sorted(p.name for p in (ROOT / "data").iterdir() if p.is_file() and p.suffix != ".pyc")

pytestmark = pytest.mark.slow

# Not part of the build: version control, environments and build outputs (a stale build/lib would
# put files in the wheel that the configuration no longer ships).
_TOP_LEVEL_SKIP = {".git", ".venv", "build", "dist", "runs", ".cache", ".whl", "shared"}


def _skip(folder: str, names: list[str]) -> set[str]:
    top = Path(folder) == ROOT
    return {n for n in names if n == "__pycache__" or n.endswith(".egg-info") or (top and n in _TOP_LEVEL_SKIP)}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    shutil.copytree(ROOT, src, ignore=_skip, symlinks=True)
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(work), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    (whl,) = work.glob("reasonrl-*.whl")
    return whl


def _borrowed_dependencies(deps: Path, site_packages: Path) -> None:
    """Link every entry of this interpreter's site-packages into ``deps`` except reasonrl's own (an
    install, its dist-info, an editable finder), and carry over the .pth hooks that are not reasonrl's.
    ``deps`` is named site-packages: some libraries (dill, under datasets) tell installed modules by it."""
    deps.mkdir(parents=True)
    own = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    pth_lines = [str(deps)]
    for site_dir in map(Path, own):
        for entry in sorted(site_dir.iterdir()):
            name = entry.name
            if name.startswith(("reasonrl", "__editable__")) or "reasonrl" in name.lower():
                continue
            if name.endswith(".pth"):
                for line in entry.read_text().splitlines():
                    if line.startswith(("import ", "import\t")):
                        pth_lines.append(line)
                    elif line.strip() and not line.startswith("#"):
                        path = (site_dir / line.strip()).resolve()
                        if not (path / "reasonrl").exists():
                            pth_lines.append(str(path))
                continue
            if not (deps / name).exists():
                (deps / name).symlink_to(entry)
    (site_packages / "_borrowed_dependencies.pth").write_text("\n".join(pth_lines) + "\n")


@pytest.fixture(scope="module")
def fresh(tmp_path_factory, wheel) -> tuple[Path, dict[str, str], Path]:
    """(the venv, the environment to run it in, a working directory outside the checkout)."""
    base = tmp_path_factory.mktemp("fresh")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True, timeout=300)
    py = venv / "bin" / "python"
    site_packages = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        check=True, capture_output=True, text=True, timeout=60).stdout.strip())
    assert site_packages.is_relative_to(venv)
    _borrowed_dependencies(base / "borrowed" / "site-packages", site_packages)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    p = subprocess.run([py, "-m", "pip", "install", "--no-deps", "--no-compile", "-q", str(wheel)], env=env, cwd=base,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    cwd = base / "elsewhere"
    cwd.mkdir()
    assert not cwd.is_relative_to(ROOT)
    return venv, env, cwd


def test_the_wheel_holds_the_data_sets_and_the_recipes(wheel) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"aime24.jsonl", "aime25.jsonl", "math500.jsonl", "gsm8k_test.jsonl", "addition.jsonl", "__init__.py"} <= set(DATA_FILES)
    assert {f"reasonrl/bundled/{f}" for f in DATA_FILES} <= names, "data/ must ship as reasonrl/bundled/"
    assert {f"reasonrl/recipes/{p.name}" for p in (ROOT / "stages").glob("*.toml")} <= names
    assert {p.relative_to(ROOT).as_posix() for p in (ROOT / "reasonrl").rglob("*.py")} <= names
    assert not any(n.startswith(("data/", "stages/", "tests/")) for n in names)


def test_the_install_is_its_own_and_has_its_data(fresh) -> None:
    venv, env, cwd = fresh
    code = ("import reasonrl, reasonrl.bundled; from reasonrl.evaluation.datasets import load_problems;"
            "from reasonrl.stages.main_job import recipes_dir;"
            "print(reasonrl.__file__); print(reasonrl.bundled.__file__); print(len(load_problems('aime', 'dapo')));"
            "print(recipes_dir() / 'train-dapo-cpu.toml')")
    p = subprocess.run([venv / "bin" / "python", "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    pkg, data, n, recipe = p.stdout.split()
    assert Path(pkg).is_relative_to(venv), "the test must exercise the installed copy, not the source tree"
    assert Path(data).is_relative_to(venv) and Path(recipe).is_relative_to(venv) and Path(recipe).is_file()
    assert int(n) == 60


def test_eval_help_from_the_install(fresh) -> None:
    venv, env, cwd = fresh
    p = subprocess.run([venv / "bin" / "reasonrl", "eval", "aime", "--help"], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "--n" in p.stdout and "--max-problems" in p.stdout


def test_one_problem_eval_from_the_install(fresh, tiny_model) -> None:
    venv, env, cwd = fresh
    p = subprocess.run([venv / "bin" / "reasonrl", "eval", "aime24", "--model", str(tiny_model), "--out", "aime", "--n", "1",
                        "--max-problems", "1", "--engine", "hf", "--max-response-len", "2", "--bootstrap", "10"],
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads((cwd / "aime" / "results.json").read_text())
    assert (res["dataset"], res["problems"], res["n"]) == ("aime24", 1, 1)
    (data_file,) = res["data"]["files"]
    assert Path(data_file).is_relative_to(venv) and Path(data_file).name == "aime24.jsonl", data_file
    (sample,) = (cwd / "aime" / "samples.jsonl").read_text().splitlines()
    assert json.loads(sample)
