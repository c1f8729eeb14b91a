"""Live progress: bars with ETA on a terminal, nothing on a pipe or with --quiet, the generation bar
fed by the engine, and a real pseudo-terminal running the CLI."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def text(buf: io.StringIO) -> str:
    return ANSI.sub("", buf.getvalue().replace("\r", "\n"))


def terminal() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=160), buf


def test_display_is_off_without_a_terminal_or_with_quiet():
    from reasonrl import progress

    for console, quiet in ((Console(file=io.StringIO()), False), (terminal()[0], True)):
        with progress.Display(console, quiet=quiet) as d:
            assert not d.active and progress.current() is None
            with progress.phase("generate", 4) as bar:
                assert bar is None
            progress.status("step 1: update actor")
        assert console.file.getvalue() == ""
    console, buf = terminal()
    with progress.Display(console) as d:
        assert progress.current() is d
        with progress.phase("generate", 8, unit="responses") as bar:
            bar.advance(4, tokens=100)
            d.progress.refresh()  # (the display redraws 10 times a second; here: now)
    assert progress.current() is None
    out = text(buf)
    assert "generate" in out and "4/8" in out and "tok/s" in out and "eta" in out


def test_generate_rollouts_shows_the_generation_bar_and_changes_nothing(tiny_model):
    """The same seeded rollouts with and without a display; with one, a bar counting responses."""
    from reasonrl.engines.base import SamplingParams
    from reasonrl.engines.hf import HFEngine
    from reasonrl.models.loading import load_tokenizer
    from reasonrl.progress import Display
    from reasonrl.rewards import RewardScorer
    from reasonrl.rollouts import generate_rollouts

    tok = load_tokenizer(tiny_model)
    eng = HFEngine(str(tiny_model), dtype="fp32", batch_size=4)
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}], "reward_model": {"ground_truth": str(i + 1)}} for i in range(3)]
    params = SamplingParams(n=2, temperature=1.0, max_tokens=6, seed=3)
    scorer = RewardScorer()
    try:
        plain, _ = generate_rollouts(eng, tok, scorer, rows, params, max_prompt_len=64)
        console, buf = terminal()
        with Display(console) as d:
            shown, _ = generate_rollouts(eng, tok, scorer, rows, params, max_prompt_len=64, display=d)
    finally:
        scorer.close()
    assert [[s.response_ids for s in g] for g in shown] == [[s.response_ids for s in g] for g in plain]
    out = text(buf)
    assert "generate" in out and "/6 responses (3 prompts × 2)" in out and "eta" in out
    assert "score 6 responses" in out


@pytest.mark.slow
def test_cli_on_a_pseudo_terminal_draws_bars_and_quiet_does_not(tiny_model, tmp_path):
    """`reasonrl eval` under a real pseudo-terminal (what a user's shell is): a generation bar with
    ETA; the same command with --quiet draws none, and the summary table stays."""
    import pty

    def run(*extra: str) -> str:
        args = [sys.executable, "-m", "reasonrl.cli", "eval", "aime", "--model", str(tiny_model), "--n", "2", "--max-problems", "3",
                "--engine", "hf", "--dtype", "fp32", "--max-response-len", "48", "--bootstrap", "20", "--report-to", "none", "--out", str(tmp_path / "ev"), *extra]
        pid, fd = pty.fork()
        if pid == 0:  # the child: the CLI with the pty as its terminal
            os.environ.update({"PYTHONPATH": str(ROOT), "COLUMNS": "160"})
            os.execv(sys.executable, args)
        chunks = []
        while True:
            try:
                b = os.read(fd, 65536)
            except OSError:
                break
            if not b:
                break
            chunks.append(b)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, b"".join(chunks).decode(errors="replace")[-3000:]
        return ANSI.sub("", b"".join(chunks).decode(errors="replace").replace("\r", "\n"))

    shown = run()
    assert re.search(r"generate .*\d+/6 responses \(3 prompts × 2\).*eta", shown), shown[-3000:]
    quiet = run("--quiet")
    assert "eta" not in quiet and "responses (3 prompts" not in quiet
    assert "avg@2" in quiet and "avg@2" in shown


def test_no_terminal_no_bars_in_the_cli(tiny_model, tmp_path):
    """A pipe (CI logs): summary lines only."""
    p = subprocess.run([sys.executable, "-m", "reasonrl.cli", "eval", "aime", "--model", str(tiny_model), "--n", "1", "--max-problems", "1",
                        "--engine", "hf", "--dtype", "fp32", "--max-response-len", "4", "--bootstrap", "10", "--report-to", "none",
                        "--out", str(tmp_path / "ev")], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "eta" not in p.stderr + p.stdout and "avg@1" in p.stderr + p.stdout
