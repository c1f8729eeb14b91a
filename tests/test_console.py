"""A quiet start: a stage's console in a log holds only reasonrl's lines (each within 80 columns),
--verbose brings the libraries' logs back, and the libraries' errors are never hidden."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from clihelp import assert_user_error, run_cli

from reasonrl.console import QUIET_ENV, error_line, wants_verbose

ROOT = Path(__file__).resolve().parent.parent
HAS_VLLM = importlib.util.find_spec("vllm") is not None
#: What the libraries print on this project's CPU machines when nothing quiets them.
NOISE = ("Triton is installed", "NUMA binding", "Loading safetensors checkpoint shards", "Setting accelerator", "LOAD REPORT",
         "Loading weights", "Writing model shards", "it/s]", "Warning:", "WARNING", "FutureWarning", "UserWarning", "INFO")
VLLM_LOG = re.compile(r"INFO \d\d-\d\d \d\d:\d\d:\d\d \[")  # a vLLM log line: "INFO 12-01 08:36:27 [file.py:123] ..."


def run(*args: str, env: dict[str, str] | None = None, code: str | None = None) -> subprocess.CompletedProcess:
    """``reasonrl ARGS`` (or ``python -c CODE``) with its output to a pipe, as in a CI log, in an
    environment without the switches the policy sets (so the test sees the defaults, not ours)."""
    base = {k: v for k, v in os.environ.items() if k not in QUIET_ENV and k != "REASONRL_DS_VERBOSE"}
    cmd = [sys.executable, "-c", code] if code is not None else [sys.executable, "-m", "reasonrl.cli", *args]
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
                          env={**base, "PYTHONPATH": str(ROOT), **(env or {})})


def test_a_stage_in_a_log_prints_only_its_own_lines_and_verbose_brings_the_libraries_back(tiny_model, prepared, tmp_path):
    """pretrain-value builds a critic from a causal LM (transformers' load report), saves it (which
    imports DeepSpeed: its accelerator warning) and starts a vLLM engine (Triton, NUMA, weight bar)."""
    args = ["pretrain-value", "--model", str(tiny_model), "--data", str(prepared), "--steps", "1", "--prompts-per-step", "2",
            "--group-size", "2", "--max-response-len", "8", "--engine", "vllm" if HAS_VLLM else "hf", "--dtype", "fp32", "--report-to", "none"]
    quiet = run(*args, "--out", str(tmp_path / "quiet"))
    assert quiet.returncode == 0, quiet.stdout[-3000:]
    lines = quiet.stdout.splitlines()
    assert any(ln.startswith("critic → ") for ln in lines), quiet.stdout
    assert [n for n in NOISE if n in quiet.stdout] == [], quiet.stdout
    assert [ln for ln in lines if len(ln) > 80] == [], quiet.stdout

    verbose = run(*args, "--out", str(tmp_path / "verbose"), "--verbose")
    assert verbose.returncode == 0, verbose.stdout[-3000:]
    assert "LOAD REPORT" in verbose.stdout  # transformers: the critic's new score head
    if HAS_VLLM:
        assert VLLM_LOG.search(verbose.stdout), verbose.stdout[-3000:]
    assert "critic → " in verbose.stdout


def test_library_errors_pass_and_the_users_own_switches_win():
    """Below ERROR the libraries' records and warnings are dropped; their errors are printed; a
    switch the user exported (here TRANSFORMERS_VERBOSITY=warning) is kept."""
    code = """
import logging, sys, warnings
from reasonrl.console import quiet_libraries
quiet_libraries()
from transformers.utils import logging as tl
tl.get_logger("transformers.x").warning("T-WARN")
tl.get_logger("transformers.x").error("T-ERR")
logging.getLogger("vllm.x").warning("V-WARN")
logging.getLogger("vllm.x").error("V-ERR")
ds = logging.getLogger("DeepSpeed")  # as DeepSpeed's LoggerFactory makes it when imported
ds.setLevel(logging.INFO); ds.propagate = False; ds.addHandler(logging.StreamHandler(sys.stdout))
ds.warning("D-WARN"); ds.error("D-ERR")
exec("import warnings; warnings.warn('L-WARN')", {"__name__": "vllm.fake"})
warnings.warn("OURS-WARN")
"""
    p = run(code=code, env={"TRANSFORMERS_VERBOSITY": "warning"})
    assert p.returncode == 0, p.stdout
    for shown in ("T-WARN", "T-ERR", "V-ERR", "D-ERR", "OURS-WARN"):
        assert shown in p.stdout, (shown, p.stdout)
    for hidden in ("V-WARN", "D-WARN", "L-WARN"):
        assert hidden not in p.stdout, (hidden, p.stdout)


def test_a_bad_model_dir_keeps_the_librarys_message(tiny_model, prepared, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in tiny_model.iterdir():
        (bad / f.name).write_bytes(f.read_bytes()[:100] if f.suffix == ".safetensors" else f.read_bytes())
    r = run_cli("rollout", "--model", bad, "--data", prepared, "--out", tmp_path / "ro", "--engine", "hf", "--dtype", "fp32",
                "--num-prompts", "1", "--group-size", "1", "--max-response-len", "2")
    assert_user_error(r, "cannot load a causal LM", "SafetensorError", "header")


def test_error_line_and_the_verbose_flag():
    import pydantic

    class Config(pydantic.BaseModel):
        x: int

        @pydantic.field_validator("x")
        @classmethod
        def positive(cls, v: int) -> int:
            raise ValueError("the header is not valid JSON")

    with pytest.raises(pydantic.ValidationError) as e:
        Config(x=1)
    assert error_line(e.value) == "ValidationError: Value error, the header is not valid JSON"  # not "1 validation error for Config"
    assert error_line(OSError("\n\n  disk full\nmore")) == "OSError: disk full"
    assert error_line(KeyError()) == "KeyError"
    assert wants_verbose(["train", "--steps", "2", "--verbose"]) and not wants_verbose(["train", "--", "--verbose"]) and not wants_verbose(["eval"])
