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
