"""Rewards users bring: ``--reward FILE.py:FUNCTION`` or ``--reward package.module:FUNCTION``.

The contract (docs/rewards.md): ``FUNCTION(response: str, ground_truth: str, **info) -> float | bool``
where ``info`` holds ``prompt`` (the problem text: the prompt's last user message), ``data_source``
and ``extra_info`` (the row's dict). ``True``/``False`` mean +1/-1, a float is the reward; a response
is correct when its reward is > 0. A function without ``**info`` gets only the keywords it names.

- :func:`check_reward_spec`: load and validate a spec in this process (a one-line
  :class:`~reasonrl.errors.ReasonRLError` for a missing file, module or function, or a function
  that does not take two positional arguments); what a stage config's ``__post_init__`` calls.
- :func:`reward_record`: the spec and the plug-in file's sha256, for the manifest and resume.
- :func:`callable_spec`: a Python function (the API's ``reward=fn``) as the spec its workers import
  (``package.module:FUNCTION``, or ``FILE.py:FUNCTION`` for a script's or file-loaded module's
  function), registered in this process so that it is not imported again here.
- :func:`call_plugin`: one item, in a worker process of :class:`reasonrl.rewards.RewardScorer`:
  ("ok", reward) or ("error", "ExcType: message"); never raises (a ``sys.exit`` in the function
  scores an error too).

Importing a plug-in (here, and in every scorer worker) captures what it prints (shown, when the
check runs with ``--verbose``, as one block naming the plug-in; in the error when the import fails),
and a plug-in that calls ``sys.exit`` or ``os._exit`` while imported is a one-line error naming it
(``os._exit`` is replaced for the importing thread while the import runs; it used to end the CLI
silently, with the exit code it chose).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import contextlib
import inspect
import io
import math
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from reasonrl.errors import ReasonRLError

__all__ = ["MATH", "call_plugin", "callable_spec", "check_reward_spec", "load_plugin", "plugin_file", "reward_record", "split_spec"]

MATH = "math"
#: What ``info`` holds for every response (docs/rewards.md).
INFO_KEYS = ("prompt", "data_source", "extra_info")

_loaded: dict[str, Callable[..., Any]] = {}


def split_spec(spec: str) -> tuple[str, str]:
    """(FILE.py or package.module, FUNCTION) of a plug-in spec; a malformed one is a one-line error."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise ReasonRLError(f"--reward {spec!r}: expected 'math', FILE.py:FUNCTION or package.module:FUNCTION")
    return where, name


def plugin_file(spec: str) -> Path | None:
    """The plug-in's source file (None for 'math' or a module that has no file)."""
    if spec == MATH:
        return None
    where, _ = split_spec(spec)
    if where.endswith(".py"):
        return Path(where).expanduser().resolve()
    found = importlib.util.find_spec(where)
    return Path(found.origin) if found is not None and found.origin and Path(found.origin).is_file() else None


class _ExitAtImport(BaseException):
    """``os._exit(code)`` called by a plug-in while it is imported (a BaseException: no ``except
    Exception`` in the plug-in swallows it)."""

    def __init__(self, code: Any) -> None:
        super().__init__(code)
        self.code = code


@contextlib.contextmanager
def _importing(printed: io.StringIO) -> Iterator[None]:
    """While a plug-in is imported: what it prints goes to ``printed``, and ``os._exit`` called from
    this thread raises :class:`_ExitAtImport` (from any other thread it exits, as ever)."""
    real_exit, me = os._exit, threading.get_ident()

    def refuse(code: int) -> None:
        if threading.get_ident() != me:
            real_exit(code)
        raise _ExitAtImport(code)

    os._exit = refuse  # type: ignore[assignment]
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            yield
    finally:
        os._exit = real_exit


def _said(printed: io.StringIO) -> str:
    """The last line a plug-in printed while imported, for its error (or "")."""
    last = next((ln.strip() for ln in reversed(printed.getvalue().splitlines()) if ln.strip()), "")
    return f" (it printed: {last[:200]!r})" if last else ""


def _exec(where: str, spec: str, load: Callable[[], Any], echo: bool) -> Any:
    printed = io.StringIO()
    try:
        with _importing(printed):
            module = load()
    except ModuleNotFoundError as e:
        if where.endswith(".py"):
            raise ReasonRLError(f"--reward {spec}: importing {where} failed: {type(e).__name__}: {e}{_said(printed)}") from None
        raise ReasonRLError(f"--reward {spec}: module {where} not found ({e}): install it, or pass FILE.py:FUNCTION") from None
    except (SystemExit, _ExitAtImport) as e:
        call = f"sys.exit({e.code!r})" if isinstance(e, SystemExit) else f"os._exit({e.code!r})"
        raise ReasonRLError(f"--reward {spec}: importing {where} called {call}{_said(printed)}: a reward plug-in must not exit "
                            "when imported (it is imported by every stage and every scorer worker); remove the call") from None
    except Exception as e:  # noqa: BLE001 - the user's module failed while importing
        raise ReasonRLError(f"--reward {spec}: importing {where} failed: {type(e).__name__}: {e}{_said(printed)}") from None
    if echo and printed.getvalue().strip():
        sys.stderr.write(f"reward plug-in {spec} printed while imported: {printed.getvalue().rstrip()}\n")
    return module


def _import(where: str, spec: str, echo: bool = False) -> Any:
    if where.endswith(".py"):
        path = Path(where).expanduser().resolve()
        if not path.is_file():
            raise ReasonRLError(f"--reward {spec}: file {where} not found: pass FILE.py:FUNCTION with an existing file")
        name = "reasonrl_reward_plugin_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
        mod_spec = importlib.util.spec_from_file_location(name, path)
        assert mod_spec is not None and mod_spec.loader is not None
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        try:
            return _exec(where, spec, lambda: mod_spec.loader.exec_module(module) or module, echo)  # type: ignore[union-attr]
        except BaseException:
            sys.modules.pop(name, None)
            raise
    return _exec(where, spec, lambda: importlib.import_module(where), echo)


def load_plugin(spec: str, echo: bool = False) -> Callable[..., Any]:
    """The function a spec names, imported once per process and checked (see the module doc);
    ``echo``: write what the import printed to stderr (one block naming the plug-in)."""
    if spec in _loaded:
        return _loaded[spec]
    where, name = split_spec(spec)
    module = _import(where, spec, echo)
    fn = getattr(module, name, None)
    if fn is None:
        raise ReasonRLError(f"--reward {spec}: {where} has no function {name}")
    _check_function(spec, where, name, fn)
    _loaded[spec] = fn
    return fn


def _check_function(spec: str, where: str, name: str, fn: Any) -> None:
    if not callable(fn):
        raise ReasonRLError(f"--reward {spec}: {where}.{name} is {type(fn).__name__}, not a function")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        try:
            sig.bind("response", "ground_truth", **_keywords(fn, dict.fromkeys(INFO_KEYS, "")))
        except TypeError:
            raise ReasonRLError(f"--reward {spec}: {name}{sig} must take two positional arguments, "
                                "FUNCTION(response, ground_truth, **info) (docs/rewards.md)") from None


def callable_spec(fn: Any) -> str:
    """The spec the scorer's worker processes import ``fn`` by (they are started with "spawn", so a
    reward crosses to them by name, never pickled by value): ``package.module:FUNCTION`` for a
    function at the top level of an importable module, ``FILE.py:FUNCTION`` for one at the top level
    of a script (``__main__``, whose ``if __name__ == "__main__":`` guard spawn requires anyway) or
    of a module loaded from a file. Checked as a plug-in is, and registered here: this process calls
    ``fn`` itself. A lambda, a nested function, a bound method or a ``functools.partial`` cannot be
    imported by name: one line naming the fix."""
    import types

    how = ("define it with `def` at the top level of a module or script (the scorer's worker processes import it by name), "
           "or pass reward='FILE.py:FUNCTION'")
    name = getattr(fn, "__name__", None)
    if not isinstance(fn, types.FunctionType) or not name or getattr(fn, "__qualname__", None) != name:
        raise ReasonRLError(f"reward {fn!r:.80} is not a function defined at the top level of a module: {how}")
    module = sys.modules.get(fn.__module__)
    if module is None or getattr(module, name, None) is not fn:
        raise ReasonRLError(f"reward {fn.__module__}.{name} is not reachable as {name} in module {fn.__module__}: {how}")
    spec = f"{fn.__module__}:{name}"
    try:
        found = importlib.util.find_spec(fn.__module__) if fn.__module__ != "__main__" else None
    except (ImportError, ValueError):
        found = None
    file = getattr(module, "__file__", None)
    if found is None or not found.origin or file is None or Path(found.origin).resolve() != Path(file).resolve():
        if not file or not str(file).endswith(".py"):
            raise ReasonRLError(f"reward {fn.__module__}.{name} comes from no importable module nor .py file "
                                f"(an interactive session or a notebook): put it in a .py file and {how}")
        spec = f"{Path(file).resolve()}:{name}"
    where, _ = split_spec(spec)
    _check_function(spec, where, name, fn)
    _loaded[spec] = fn
    return spec


def check_reward_spec(spec: str) -> None:
    """Validate ``--reward`` in this process (before any model loads): 'math' or a loadable plug-in.
    What the plug-in prints while imported is shown only with ``--verbose`` (the console's policy:
    :func:`reasonrl.console.library_bars` is False once the CLI quieted the libraries)."""
    if spec != MATH:
        from reasonrl.console import library_bars

        load_plugin(spec, echo=library_bars())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def reward_record(spec: str) -> dict[str, Any]:
    """What the manifest records of a run's reward: the spec, its file and the file's sha256."""
    f = plugin_file(spec)
    return {"spec": spec, "file": str(f) if f else None, "sha256": _sha256(f) if f else None}


def _keywords(fn: Callable[..., Any], info: dict[str, Any]) -> dict[str, Any]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return info
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return info
    names = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    return {k: v for k, v in info.items() if k in names and k not in ("response", "ground_truth")}


#: The largest |reward| a plug-in may return (docs/rewards.md). Beyond it (±1e300 overflowed the
#: group std, and fp32 squares it in the value loss) the response scores -1 as an error, like NaN.
REWARD_BOUND = 1e6


def as_reward(value: Any) -> float:
    """A plug-in's return value as a reward: bool → ±1, a real number in [-REWARD_BOUND,
    REWARD_BOUND] → float; else ValueError."""
    if isinstance(value, bool):
        return 1.0 if value else -1.0
    try:
        import numbers

        if not isinstance(value, numbers.Real):
            raise TypeError
        reward = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"returned {type(value).__name__} {value!r:.60}, not a float or bool") from None
    if not math.isfinite(reward):
        raise ValueError(f"returned {reward}, not a finite number")
    if abs(reward) > REWARD_BOUND:
        raise ValueError(f"returned {reward:g}, beyond the bound on a reward, ±{REWARD_BOUND:g}")
    return reward


def call_plugin(spec: str, response: str, ground_truth: str, info: dict[str, Any]) -> tuple[str, Any]:
    """One reward, never raising: ("ok", float) or ("error", "ExcType: message")."""
    try:
        fn = load_plugin(spec)
        return "ok", as_reward(fn(response, ground_truth, **_keywords(fn, info)))
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's code: any failure scores -1 and is counted
        return "error", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
