"""Packages that are also the API's functions: ``reasonrl.train`` and ``reasonrl.report``.

``import reasonrl`` gives one function per stage (``reasonrl.api``, docs/api.md), and two of the
names, ``train`` and ``report``, are also subpackages (``reasonrl/train/``, ``reasonrl/report/``).
Each of those packages marks its own module with :func:`callable_package`, so the one object is
both: ``reasonrl.train(...)`` calls ``reasonrl.api.train``, and ``reasonrl.train.backend``,
``import reasonrl.train.backend as B`` and ``from reasonrl.train.backend import …`` reach the
subpackage, whichever was imported first. Stdlib only: importing a package stays as light as it was.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


class StagePackage(types.ModuleType):
    """A package module that, called, runs the API function of its name (``reasonrl.api.<name>``)."""

    def api_function(self) -> Any:
        """``reasonrl.api``'s function of this package's name."""
        return getattr(importlib.import_module("reasonrl.api"), self.__name__.rsplit(".", 1)[-1])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.api_function()(*args, **kwargs)

    @property
    def __signature__(self) -> Any:  # (inspect.signature and help() show the API function's)
        import inspect

        return inspect.signature(self.api_function())


def callable_package(name: str) -> None:
    """Make the module ``name`` (a package's ``__name__``) a :class:`StagePackage`."""
    sys.modules[name].__class__ = StagePackage
