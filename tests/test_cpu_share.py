"""reasonrl.cpu_share: how the OpenMP threads wait, chosen before torch loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reasonrl import cpu_share
from reasonrl.stages.ablation.jobs import child_env

ROOT = Path(__file__).resolve().parents[1]


def test_auto_yields_when_other_processes_are_busy_and_spins_when_not():
    env: dict[str, str] = {}
    assert cpu_share.choose_wait(env, measure=lambda: 1.0) == "yield"
    assert env["GOMP_SPINCOUNT"] == cpu_share.SHORT_SPIN
    env = {}
    assert cpu_share.choose_wait(env, measure=lambda: 0.1) == "spin"
    assert env == {}


def test_explicit_modes_and_the_users_own_settings():
    def never() -> float:
        raise AssertionError("an explicit mode does not measure")

    env = {cpu_share.ENV: "yield"}
    assert cpu_share.choose_wait(env, measure=never) == "yield" and env["GOMP_SPINCOUNT"] == cpu_share.SHORT_SPIN
    env = {cpu_share.ENV: "spin"}
    assert cpu_share.choose_wait(env, measure=never) == "spin" and "GOMP_SPINCOUNT" not in env
    for own in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "5"}):
        env = {cpu_share.ENV: "yield", **own}
        assert cpu_share.choose_wait(env, measure=never) == "user" and env == {cpu_share.ENV: "yield", **own}
    with pytest.raises(ValueError, match="REASONRL_CPU_WAIT='fast'"):
        cpu_share.choose_wait({cpu_share.ENV: "fast"}, measure=never)


def test_a_busy_process_is_seen():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert cpu_share.others_busy(0.5) >= cpu_share.BUSY_FROM
    finally:
        busy.kill()
        busy.wait()


def test_the_cli_chooses_before_torch_loads():
    # libgomp reads GOMP_SPINCOUNT when it loads: the CLI module must not import torch before main() chooses
    code = "import sys, reasonrl.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_a_bad_mode_is_a_one_line_error():
    env = {**os.environ, cpu_share.ENV: "fast"}
    r = subprocess.run([sys.executable, "-m", "reasonrl.cli", "--help"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == ["error: REASONRL_CPU_WAIT='fast': use one of auto, spin, yield"]


def test_ablate_runs_side_by_side_yield_unless_the_user_chose():
    assert child_env(2, {"A": "1"}) == {"A": "1", cpu_share.ENV: "yield"}
    assert child_env(1, {"A": "1"}) == {"A": "1"}
    assert child_env(3, {cpu_share.ENV: "spin"}) == {cpu_share.ENV: "spin"}
