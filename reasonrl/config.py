"""Stage configs: one documented dataclass per stage, filled from defaults < TOML recipe < --set.

Each field carries its documentation once, in ``field(metadata={"help": ...})``; the CLI's
``--help`` and the README are generated from it. Validation lives in each dataclass's
``__post_init__`` and raises :class:`ReasonRLError` with a message that says what to change.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from reasonrl.errors import ReasonRLError

T = TypeVar("T")


def opt(default: Any, help: str, **kw: Any) -> Any:
    """A documented config field (``help`` is shown by ``--help`` and in error messages)."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata={"help": help, **kw})
    return dataclasses.field(default=default, metadata={"help": help, **kw})


def section(cls: type, help: str, *, table: str, name_field: str | None = None) -> Any:
    """A config field holding overrides of another dataclass's fields (e.g. ``AlgoSpec``).

    The CLI gets one ``--option`` per field of ``cls`` (its help is that field's documentation);
    a recipe may give them flat, or in a ``[table]`` table; ``--set table.key=value`` also works.
    The section's ``name`` key, when given in the table, sets the config field ``name_field``
    (``[algo] name = "dapo"`` is ``--algo dapo``). The field's value is the dict of overrides.
    """
    return dataclasses.field(default_factory=dict, metadata={"help": help, "section": cls, "table": table, "name_field": name_field})


def sections(cls: type) -> list[dataclasses.Field]:
    """The section fields of a config class."""
    return [f for f in dataclasses.fields(cls) if "section" in f.metadata]


def section_keys(f: dataclasses.Field) -> list[str]:
    """The overridable keys of a section field (every field of its class but ``name``)."""
    return [g.name for g in dataclasses.fields(f.metadata["section"]) if g.name != "name"]


def field_help(cls: type, name: str) -> str:
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f.metadata.get("help", "")
    return ""


def base_type(tp: Any) -> tuple[Any, bool]:
    """(underlying type, optional?) for ``X | None`` / ``Optional[X]``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def coerce(cls: type, key: str, value: Any) -> Any:
    """Convert ``value`` (from TOML or a ``--set`` string) to the type of field ``key``."""
    hints = typing.get_type_hints(cls)
    if key not in hints:
        known = ", ".join(f.name for f in dataclasses.fields(cls))
        raise ReasonRLError(f"unknown key '{key}' for {cls.__name__}; known keys: {known}")
    tp, optional = base_type(hints[key])
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null", "")):
        if optional:
            return None
        raise ReasonRLError(f"'{key}' cannot be empty: give a {getattr(tp, '__name__', tp)}")
    origin = typing.get_origin(tp)
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
                return True
            if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if tp is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if tp is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if tp is str:
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ValueError
            return str(value)
        if origin is list:
            (inner,) = typing.get_args(tp) or (str,)
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, list):
                raise ValueError
            return [inner(v) for v in value if not (isinstance(v, str) and not v.strip())]  # "" is no entry
    except (TypeError, ValueError):
        raise ReasonRLError(
            f"'{key}' must be a {getattr(tp, '__name__', str(tp))}, got {value!r}: fix the recipe or --set {key}=..."
        ) from None
    return value


def load_recipe(path: str | Path | None) -> dict[str, Any]:
    """Read a TOML recipe (flat keys, or one table named after the stage)."""
    if path is None:
        return {}
    p = Path(path)
    if not p.is_file():
        raise ReasonRLError(f"recipe {p} not found: pass an existing file to --config (see stages/)")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ReasonRLError(f"recipe {p} is not valid TOML ({e}): fix that line") from None


def parse_sets(sets: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in sets or []:
        if "=" not in item:
            raise ReasonRLError(f"--set takes key=value, got '{item}'")
        k, v = item.split("=", 1)
        out[k.strip().replace("-", "_")] = v.strip()
    return out


def build_config(cls: type[T], *layers: dict[str, Any]) -> T:
    """Defaults < layers[0] < layers[1] < ...; unknown keys and wrong types are errors naming the key.

    Keys of a section (see :func:`section`) may come flat, as ``table.key``, or as a ``table`` dict.
    """
    values: dict[str, Any] = {}
    own = {f.name for f in dataclasses.fields(cls)}
    secs = sections(cls)
    overrides: dict[str, dict[str, Any]] = {f.name: {} for f in secs}

    def put_section(f: dataclasses.Field, key: str, v: Any) -> None:
        sub = f.metadata["section"]
        if key == "name" and f.metadata.get("name_field"):
            values[f.metadata["name_field"]] = coerce(cls, f.metadata["name_field"], v)
        elif key in section_keys(f):
            overrides[f.name][key] = coerce(sub, key, v)
        else:
            raise ReasonRLError(f"unknown key '{f.metadata['table']}.{key}'; known: {', '.join(section_keys(f))}")

    for layer in layers:
        for k, v in layer.items():
            if v is None:
                continue
            k = k.replace("-", "_")
            sec = next((f for f in secs if k == f.metadata["table"] or k.startswith(f.metadata["table"] + ".")), None)
            if sec is not None and k not in own or (sec is not None and isinstance(v, dict)):
                if isinstance(v, dict):
                    for kk, vv in v.items():
                        put_section(sec, kk.replace("-", "_"), vv)
                elif "." in k:
                    put_section(sec, k.split(".", 1)[1], v)
                else:
                    raise ReasonRLError(f"'{k}' must be a table of {sec.metadata['section'].__name__} fields")
                continue
            flat = next((f for f in secs if k not in own and k in section_keys(f)), None)
            if flat is not None:
                put_section(flat, k, v)
                continue
            values[k] = coerce(cls, k, v)
    for name, over in overrides.items():
        if over:
            values[name] = over
    try:
        return cls(**values)
    except TypeError as e:  # pragma: no cover - coerce already names unknown keys
        raise ReasonRLError(str(e)) from None


def recipe_layer(recipe: dict[str, Any], stage: str, cls: type | None = None, stages: Any = None) -> dict[str, Any]:
    """A recipe may be flat or hold ``[stage]`` tables; take the flat keys plus this stage's table.

    Tables named after a section of ``cls`` (e.g. ``[algo]``) are kept as keys. With ``stages``
    (every stage name), a table that names no stage and no section is an error (a misspelled
    ``[trian]`` is never silently ignored)."""
    kept = {f.metadata["table"] for f in sections(cls)} if cls is not None else set()
    if stages is not None:
        unknown = [k for k, v in recipe.items() if isinstance(v, dict) and k not in kept and k not in stages]
        if unknown:
            raise ReasonRLError(f"recipe table [{unknown[0]}] names no stage: use one of {', '.join(f'[{s}]' for s in stages)}")
    flat = {k: v for k, v in recipe.items() if not isinstance(v, dict) or k in kept}
    table = recipe.get(stage, {})
    if table and not isinstance(table, dict):
        raise ReasonRLError(f"recipe key '{stage}' must be a table")
    others = [k for k, v in recipe.items() if isinstance(v, dict) and k != stage and k not in kept]
    if others and not table and not flat:
        raise ReasonRLError(f"recipe has tables {others} but none named [{stage}]: add one or make keys flat")
    return {**flat, **(table or {})}


def to_dict(cfg: Any) -> dict[str, Any]:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def check(cond: bool, msg: str) -> None:
    """Validation helper for ``__post_init__``: raise a one-line ReasonRLError when ``cond`` is false."""
    if not cond:
        raise ReasonRLError(msg)
