"""The tracker interface, the registry of trackers, and how a step's metrics become scalars.

A tracker receives ``log(step, scalars)`` once per finished step and ``close()`` at the end. Vector
metrics (``actor/advantage_by_position``, ``critic/value_by_position``: a list per step;
``actor/clipfrac_by_prob``: a dict of per-bucket values) are values *of* a bin (a position range, a
probability bucket), not samples of a distribution, so every tracker gets them as per-bin scalars
(``critic/value_by_position/bin_03``, ``actor/clipfrac_by_prob/clip_upper/p0.0-0.1``): a histogram
would show their spread and lose which bin is which. TensorBoard, W&B, MLflow and Trackio all
group such names under their prefix.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from reasonrl.errors import ReasonRLError


class Tracker(Protocol):
    name: str

    def log(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class TrackerEntry:
    """A registry row: the class (``module:Class``, imported only when used) and the package it needs."""

    target: str
    package: str
    install: str

    def load(self) -> type:
        mod, cls = self.target.split(":")
        return getattr(importlib.import_module(mod), cls)


TRACKERS: dict[str, TrackerEntry] = {
    "tensorboard": TrackerEntry("reasonrl.tracking.backends:TensorBoardTracker", "tensorboard", "pip install tensorboard"),
    "wandb": TrackerEntry("reasonrl.tracking.backends:WandbTracker", "wandb", "pip install 'reasonrl[wandb]'"),
    "mlflow": TrackerEntry("reasonrl.tracking.backends:MlflowTracker", "mlflow", "pip install 'reasonrl[mlflow]'"),
    "trackio": TrackerEntry("reasonrl.tracking.backends:TrackioTracker", "trackio", "pip install 'reasonrl[trackio]'"),
}
NONE = "none"
#: What the trackers may write in a run directory (a rerun of the stage removes them; Trackio and a
#: $WANDB_DIR / $MLFLOW_TRACKING_URI write elsewhere).
TRACKER_OUTPUTS = ("tensorboard", "wandb", "mlflow.db")


def tracker_names(report_to: list[str]) -> list[str]:
    """Normalise ``--report-to`` (repeated and/or comma-separated) and check every name is known
    and installed; ``none`` alone means no tracker. One-line errors naming the fix."""
    names = [n.strip().lower() for item in report_to for n in str(item).split(",") if n.strip()]
    if names == [NONE] or not names:
        return []
    for n in names:
        if n == NONE:
            raise ReasonRLError("--report-to none cannot be combined with a tracker: give only 'none', or only trackers")
        if n not in TRACKERS:
            raise ReasonRLError(f"unknown tracker '{n}' in --report-to: choose from {', '.join([*TRACKERS, NONE])}")
        e = TRACKERS[n]
        if importlib.util.find_spec(e.package) is None:
            raise ReasonRLError(f"--report-to {n} needs the '{e.package}' package, which is not installed: {e.install} (or drop {n} from --report-to)")
    return list(dict.fromkeys(names))


def make_trackers(names: list[str], run_dir: Path, *, name: str, config: dict[str, Any], start_step: int = 0) -> list[Tracker]:
    """Open each named tracker for the run in ``run_dir``; ``start_step`` > 0 is a resumed run."""
    return [TRACKERS[n].load()(run_dir, name=name, config=config, start_step=start_step) for n in tracker_names(names)]


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """A step's metrics as flat scalars: numbers as they are, lists as ``name/bin_NN``, dicts as
    ``name/key``; the ``step`` key, None, nan and non-numbers are left out."""
    out: dict[str, float] = {}

    def put(name: str, v: Any) -> None:
        if isinstance(v, bool):
            v = int(v)
        if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)):
            out[name] = float(v)
        elif isinstance(v, (list, tuple)):
            width = max(2, len(str(len(v) - 1)))
            for i, x in enumerate(v):
                put(f"{name}/bin_{i:0{width}d}", x)
        elif isinstance(v, dict):
            for k, x in v.items():
                put(f"{name}/{k}", x)

    for k, v in metrics.items():
        if k != "step" and not k.startswith("_"):
            put(k, v)
    return out
