"""reasonrl: RL for long chain-of-thought reasoning (DAPO, VC-PPO).

The Python API (docs/api.md): ``prepare_data``, ``pretrain_value``, ``rollout``, ``train``,
``evaluate``, ``report`` and ``ablate`` (``reasonrl.api``), their config dataclasses
(``TrainConfig``, ...), ``Result`` and ``ReasonRLError``. They are imported when first used, so
``import reasonrl`` stays light (no torch).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

#: name → (module, attribute), imported on first use.
_LAZY = {
    **{name: ("reasonrl.api", name) for name in ("prepare_data", "pretrain_value", "rollout", "evaluate", "ablate", "Result")},
    "ReasonRLError": ("reasonrl.errors", "ReasonRLError"),
    "PrepareConfig": ("reasonrl.stages.prepare_data", "PrepareConfig"),
    "PretrainValueConfig": ("reasonrl.stages.pretrain_value", "PretrainValueConfig"),
    "RolloutConfig": ("reasonrl.stages.rollout", "RolloutConfig"),
    "TrainConfig": ("reasonrl.stages.train", "TrainConfig"),
    "EvalConfig": ("reasonrl.stages.eval", "EvalConfig"),
    "ReportConfig": ("reasonrl.stages.report", "ReportConfig"),
    "AblateConfig": ("reasonrl.stages.ablate", "AblateConfig"),
}

__all__ = ["__version__", "report", "train", *_LAZY]


def __getattr__(name: str) -> Any:
    import importlib

    if name in ("train", "report"):  # the subpackages, callable as the API's functions (reasonrl.stage_package)
        return importlib.import_module(f"reasonrl.{name}")
    if name not in _LAZY:
        raise AttributeError(f"module 'reasonrl' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), "report", "train", *_LAZY])
