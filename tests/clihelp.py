"""Drive the real `reasonrl` CLI in-process, the way a user types it."""

from __future__ import annotations

from typer.testing import CliRunner

from reasonrl import cli

_registered = False


def run_cli(*args: str):
    global _registered
    if not _registered:
        cli._register()
        _registered = True
    return CliRunner().invoke(cli.app, [str(a) for a in args])


def assert_user_error(result, *needles: str) -> str:
    """Exit code 1, one 'error: ...' line naming the fix, no traceback."""
    out = result.output
    assert result.exit_code == 1, out
    assert "Traceback" not in out, out
    lines = [ln for ln in out.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1, out
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def run_and_resume(args, whole, resumed, *, steps: int, first: int = 1) -> None:
    """The train command ``args`` run to ``steps`` in ``whole``; and in ``resumed`` run to step
    ``first``, then resumed to ``steps``."""
    assert run_cli(*args, "--out", whole, "--steps", str(steps)).exit_code == 0
    assert run_cli(*args, "--out", resumed, "--steps", str(first)).exit_code == 0
    r = run_cli(*args, "--out", resumed, "--steps", str(steps), "--resume")
    assert r.exit_code == 0, r.output


def step_rollouts(run, step: int) -> list[dict]:
    """A train run's ``rollouts/step_N.parquet`` (--keep-rollouts), its rows."""
    import pyarrow.parquet as pq

    return pq.read_table(run / "rollouts" / f"step_{step}.parquet").to_pylist()


def crashed_copy(full, out, *, step: int, steps: int) -> None:
    """``out``: a copy of the finished train run ``full`` as if it had crashed right after
    checkpointing step ``step`` (of ``steps``, one checkpoint per step): the later checkpoints and
    the final outputs gone, ``latest`` naming step ``step``."""
    import shutil
    from pathlib import Path

    shutil.copytree(full, out)
    for p in ("policy", "manifest.json", "summary.json"):
        (shutil.rmtree if (out / p).is_dir() else Path.unlink)(out / p)
    for s in range(step + 1, steps + 1):
        shutil.rmtree(out / "checkpoints" / f"step_{s}")
    (out / "checkpoints" / "latest").write_text(f"step_{step}\n")


def assert_same_run(full, out) -> None:
    """Runs ``full`` and ``out`` logged the same metrics (``perf/…`` left out) and ended with bitwise
    the same policy weights."""
    import json

    from safetensors.torch import load_file

    metrics = lambda d: [{k: v for k, v in json.loads(ln).items() if not k.startswith("perf/")}  # noqa: E731
                         for ln in (d / "metrics.jsonl").read_text().splitlines() if ln]
    assert metrics(out) == metrics(full)
    weights = lambda d: {k: v for f in sorted((d / "policy").glob("*.safetensors")) for k, v in load_file(f).items()}  # noqa: E731
    a, b = weights(full), weights(out)
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)
