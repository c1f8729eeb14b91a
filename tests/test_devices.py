"""reasonrl.devices: what the CLI asks of torch's BLAS before the first matmul."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_cli_asks_mkl_for_alignment_free_results_and_keeps_the_users_choice():
    """A CLI process (and what it starts) runs with MKL_CBWR=AUTO,STRICT unless the user set it:
    the resumed run's last bits (tests/stages/test_train_reliability.py) depend on it on AVX-512 AMD."""
    probe = ("import os, sys; from reasonrl import cli; sys.argv = ['reasonrl', 'make-tiny-model', '--help']\n"
             "try: cli.main()\nexcept SystemExit: pass\nprint('MKL_CBWR=' + os.environ.get('MKL_CBWR', '-'))")
    base = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"} | {"PYTHONPATH": str(ROOT)}
    for env, want in ((base, "AUTO,STRICT"), (base | {"MKL_CBWR": "COMPATIBLE"}, "COMPATIBLE")):
        p = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-1500:]
        assert p.stdout.strip().splitlines()[-1] == f"MKL_CBWR={want}"


def test_a_manifest_says_what_computed_it(tmp_path):
    """write_manifest records the machine: the CPU (its bf16 flags decide `--dtype auto`) and the
    dtype "auto" resolved to, so a result can be told from one of another CPU or dtype; a stage
    without a dtype records no dtype."""
    import platform

    from reasonrl.artifacts import write_manifest
    from reasonrl.devices import hardware_bf16, resolve_dtype

    m = write_manifest(tmp_path / "a", "train", {"dtype": "auto"}, {})["machine"]
    assert m["dtype"] == resolve_dtype("auto") == ("bf16" if hardware_bf16() else "fp32")
    assert m["cpu"] and m["cpus"] >= 1 and isinstance(m["cpu_flags"], list)
    if platform.machine().lower() in ("x86_64", "amd64") and Path("/proc/cpuinfo").exists():
        assert hardware_bf16() == any(f in m["cpu_flags"] for f in ("avx512_bf16", "amx_bf16", "amx_tile"))
    assert write_manifest(tmp_path / "b", "prepare-data", {"data": "x"}, {})["machine"].keys() == {"cpu", "cpu_flags", "cpus"}
    assert write_manifest(tmp_path / "c", "eval", {"dtype": "fp32"}, {})["machine"]["dtype"] == "fp32"
