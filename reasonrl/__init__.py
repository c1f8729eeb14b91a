"""reasonrl: RL for long chain-of-thought reasoning (DAPO, VC-PPO).

The Python API (docs/api.md): ``prepare_data``, ``pretrain_value``, ``rollout``, ``train``,
``evaluate``, ``report`` and ``ablate`` (``reasonrl.api``), their config dataclasses
(``TrainConfig``, ...), ``Result`` and ``ReasonRLError``. They are imported when first used, so
``import reasonrl`` stays light (no torch).
"""

from __future__ import annotations

import sys
import types
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


def _api_function(name: str) -> property:
    def get(self: types.ModuleType) -> Any:
        import importlib

        return getattr(importlib.import_module("reasonrl.api"), name)

    def keep_function(self: types.ModuleType, value: Any) -> None:
        """The import system sets ``reasonrl.<name>`` to the subpackage when it is first imported; the
        subpackage stays reachable as ``sys.modules["reasonrl.<name>"]`` (``from reasonrl.<name> import …``)."""

    return property(get, keep_function, doc=f"reasonrl.api.{name}")


class _Package(types.ModuleType):
    """reasonrl's module type: ``reasonrl.train`` and ``reasonrl.report`` are the API's functions,
    although ``reasonrl/train/`` and ``reasonrl/report/`` are also subpackages, whose first import
    would otherwise replace the attribute. Code inside reasonrl imports from them with ``from
    reasonrl.train.x import y`` (never ``import reasonrl.train.x`` and then attribute access;
    tests/test_api.py checks)."""

    train = _api_function("train")
    report = _api_function("report")


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'reasonrl' has no attribute {name!r}")
    import importlib

    module, attr = _LAZY[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), "report", "train", *_LAZY])
