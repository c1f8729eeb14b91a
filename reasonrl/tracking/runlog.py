"""A run's metric log: ``metrics.jsonl`` (the ground truth) and the trackers, written together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reasonrl.artifacts import append_jsonl
from reasonrl.errors import ReasonRLError
from reasonrl.rundir import write_failure
from reasonrl.tracking.base import Tracker, make_trackers, scalars


class RunLog:
    """One call per finished step: :meth:`append` writes the step's line to ``metrics.jsonl``, then
    the same metrics (same names, vectors as per-bin scalars) to every tracker. One place, in that
    order: a tracker never holds a step that ``metrics.jsonl`` lacks (a crash between the two
    leaves the trackers one step behind, never ahead), and no step is logged twice. Only rank 0
    opens trackers or writes; other ranks get an inert log.

    Args:
        run_dir: the run directory (``metrics.jsonl`` and the trackers' files go there).
        report_to: ``--report-to`` names (checked by ``reasonrl.tracking.tracker_names``).
        name: the run's display name in the trackers.
        config: the stage's config, logged once by each tracker.
        start_step: the checkpoint's step when resuming (the next step appended must be later).
        rank: the process's rank.
        then: what a write failure means for the run, appended to its one-line error.

    A write that fails (a full disk, a file-size limit) is a one-line error naming the file, the
    cause and ``then``.
    """

    def __init__(self, run_dir: str | Path, report_to: list[str], *, name: str, config: dict[str, Any], start_step: int = 0, rank: int = 0,
                 then: str = "") -> None:
        # (a fresh run may log a step 0: training's validation before any update)
        self.run_dir, self.rank, self.last_step, self.then = Path(run_dir), rank, start_step if start_step else -1, then
        self.trackers: list[Tracker] = []
        if rank == 0:
            with self._writing("the trackers' files", 0):
                self.trackers = make_trackers(report_to, self.run_dir, name=name, config=config, start_step=start_step)

    def _writing(self, what: str, step: int) -> "_Writing":
        return _Writing(self, what, step)

    def append(self, m: dict[str, Any]) -> None:
        """Record a finished step (``m["step"]``) in metrics.jsonl, then in the trackers."""
        if self.rank != 0:
            return
        step = int(m["step"])
        if step <= self.last_step:
            raise RuntimeError(f"step {step} logged after step {self.last_step}: every step is logged once, in order")
        self.last_step = step
        with self._writing(str(self.run_dir / "metrics.jsonl"), step):
            append_jsonl(self.run_dir / "metrics.jsonl", m)
        self.log(step, m)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """To the trackers only (evaluation: its ground truth is results.json)."""
        flat = scalars(metrics)
        for t in self.trackers:
            with self._writing(f"the {t.name} tracker's files", step):
                t.log(step, flat)

    def close(self) -> None:
        """Close every tracker (all of them, even when one fails; then the first failure is raised)."""
        trackers, self.trackers = self.trackers, []
        failed: ReasonRLError | None = None
        for t in trackers:
            try:
                with self._writing(f"the {t.name} tracker's files", self.last_step):
                    t.close()
            except ReasonRLError as e:
                failed = failed or e
        if failed is not None:
            raise failed

    def __enter__(self) -> "RunLog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Writing:
    """An OSError inside → the run log's one-line error."""

    def __init__(self, log: RunLog, what: str, step: int) -> None:
        self.log, self.what, self.step = log, what, step

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: Any, e: Any, tb: Any) -> bool:
        if et is not None and issubclass(et, OSError):
            at = f" at step {self.step}" if self.step > 0 else ""
            then = f"; {self.log.then}" if self.log.then else ""
            raise ReasonRLError(f"could not write {self.what}{at}: {write_failure(e)}{then}") from None
        return False
