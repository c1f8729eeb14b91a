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
