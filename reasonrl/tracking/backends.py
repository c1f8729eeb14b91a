"""The trackers, each through its own client library (imported when the tracker is opened).

Every class takes ``(run_dir, *, name, config, start_step)``: the run directory, a display name,
the stage's config (logged once) and, for a resumed run, the checkpoint's step (> 0).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = str(v)
    return out


def _run_name(name: str, start_step: int) -> str:
    return name + (f" (resumed at step {start_step})" if start_step else "")


def _quiet_writer_threads() -> None:
    """TensorBoard writes events in a thread; a failed write (a full disk) is raised again in the
    main thread by the writer's next call (and becomes the run's one-line error), so the thread's own
    traceback is left out."""
    previous = threading.excepthook
    if getattr(previous, "_reasonrl", False):
        return

    def hook(args: Any) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and isinstance(args.exc_value, OSError):
            return
        previous(args)

    hook._reasonrl = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def _drop_events_after(log_dir: Path, step: int) -> None:
    """Rewrites each event file in ``log_dir`` that holds events after ``step`` without them. A file is
    replaced whole (``os.replace``), so a kill leaves the old file or the new one; a record cut short
    by a crash ends the read there and is dropped with what follows."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    tmp = log_dir / ".rewrite.partial"  # no "tfevents" in the name: TensorBoard never reads it
    for path in sorted(log_dir.glob("*tfevents*")):
        records = list(RawEventFileLoader(str(path)).Load())
        keep = [r for r in records if Event.FromString(r).step <= step]
        if len(keep) == len(records) and path.stat().st_size == sum(len(r) + 16 for r in records):
            continue
        with open(tmp, "wb") as f:
            writer = RecordWriter(f)
            for r in keep:
                writer.write(r)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


class TensorBoardTracker:
    """Event files in ``<run_dir>/tensorboard/`` (torch's ``SummaryWriter``). A fresh run clears the
    folder; a resumed run first rewrites the files there without their events after the
    checkpoint's step, so the curves hold each step once. (TensorBoard's own ``purge_step`` only
    drops what was read before the new file, and files are read in the order of their names, which
    begin with the wall clock: resumed where the clock is behind, the old steps would stay.)"""

    name = "tensorboard"

    def __init__(self, run_dir: Path, *, name: str, config: dict[str, Any], start_step: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        _quiet_writer_threads()
        self.log_dir = Path(run_dir) / "tensorboard"
        if not start_step:
            shutil.rmtree(self.log_dir, ignore_errors=True)
        elif self.log_dir.is_dir():
            _drop_events_after(self.log_dir, start_step)
        self.writer = SummaryWriter(str(self.log_dir))
        if not start_step:
            self.writer.add_text("config", "    " + json.dumps(config, indent=1, default=str).replace("\n", "\n    "), 0)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run (``wandb.init``; files in ``$WANDB_DIR`` or else ``<run_dir>/wandb/``). Project ``$WANDB_PROJECT`` (default
    "reasonrl"); ``WANDB_MODE=offline`` works without an account. A resumed run is a new W&B run
    named "... (resumed at step N)" in the same group, starting at step N + 1."""

    name = "wandb"

    def __init__(self, run_dir: Path, *, name: str, config: dict[str, Any], start_step: int = 0) -> None:
        import wandb

        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "reasonrl"), name=_run_name(name, start_step),
                              group=name, dir=os.environ.get("WANDB_DIR") or str(run_dir), config=config)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """An MLflow run, in ``$MLFLOW_TRACKING_URI`` or else the SQLite store ``<run_dir>/mlflow.db``
    (``mlflow ui --backend-store-uri sqlite:///<run_dir>/mlflow.db``; MLflow 3 refuses new file
    stores); experiment ``$MLFLOW_EXPERIMENT_NAME`` (default "reasonrl").
    MLflow's names allow letters, digits and ``_-. /``: other characters (``avg@4``) become ``_``."""

    name = "mlflow"

    def __init__(self, run_dir: Path, *, name: str, config: dict[str, Any], start_step: int = 0) -> None:
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(run_dir).resolve() / 'mlflow.db'}")
        mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", "reasonrl"))
        mlflow.start_run(run_name=_run_name(name, start_step))
        params = sorted(_flat(config).items())
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per call
            mlflow.log_params({self._key(k): v[:250] for k, v in params[i : i + 100]})

    @staticmethod
    def _key(k: str) -> str:
        return re.sub(r"[^\w\-. /]", "_", k)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.mlflow.log_metrics({self._key(k): v for k, v in scalars.items()}, step=step, timestamp=int(time.time() * 1000))

    def close(self) -> None:
        self.mlflow.end_run()


class TrackioTracker:
    """A Trackio run (``trackio.init``; Trackio's local database, or ``$TRACKIO_SPACE_ID``).
    Project ``$TRACKIO_PROJECT`` (default "reasonrl")."""

    name = "trackio"

    def __init__(self, run_dir: Path, *, name: str, config: dict[str, Any], start_step: int = 0) -> None:
        import trackio

        self.trackio = trackio
        trackio.init(project=os.environ.get("TRACKIO_PROJECT", "reasonrl"), name=_run_name(name, start_step),
                     group=name, config=config)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.trackio.log(scalars, step=step)

    def close(self) -> None:
        self.trackio.finish()
