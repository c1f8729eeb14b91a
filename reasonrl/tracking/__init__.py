"""Experiment trackers behind one small interface: ``--report-to tensorboard|wandb|mlflow|trackio|none``.

``TRACKERS`` is the registry (one row per tracker: its class, imported lazily, and the package it
needs); :class:`RunLog` writes a run's ``metrics.jsonl`` and its trackers together, one call per
step. To add a tracker: a class with ``log(step, scalars)`` and ``close()`` in ``backends.py`` and
one ``TRACKERS`` row.
"""

from reasonrl.tracking.base import TRACKERS, Tracker, TrackerEntry, make_trackers, scalars, tracker_names
from reasonrl.tracking.runlog import RunLog

__all__ = ["TRACKERS", "RunLog", "Tracker", "TrackerEntry", "make_trackers", "scalars", "tracker_names"]
