"""Stage configs: one documented dataclass per stage, filled from defaults < TOML recipe < --set.

Each field carries its documentation once, in ``field(metadata={"help": ...})``; the CLI's
``--help`` and the README are generated from it. Validation lives in each dataclass's
``__post_init__`` and raises :class:`ReasonRLError` with a message that says what to change.

Every value from a recipe, ``--set`` or an option passes :func:`coerce` first, which holds what is
true of every field of a type: a float is never NaN, nor infinite unless its field says
``inf_ok=True`` (an upper bound that ``inf`` turns off); an int fits C's 64 bits (torch, numpy and
vLLM take no larger one); each item of a list is of the list's type. A recipe that is not UTF-8
text or not TOML is one line naming the file.
"""

from __future__ import annotations

import dataclasses
import math
import sys
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


@dataclasses.dataclass(frozen=True)
class HelpPanel:
    """The ``--help`` panel of an option group (a mixin of config fields, e.g. ``BackendOpts``),
    declared once on the group as its ``help_panel`` class attribute: the panel's title, and its
    place among a command's panels (lower first; the command's own options come before all)."""

    title: str
    order: int


def field_panel(cls: type, name: str) -> HelpPanel | None:
    """The ``--help`` panel of field ``name`` of the config class ``cls``: that of the first option
    group in its bases (in method resolution order) that holds the field, a redefinition in ``cls``
    included (eval's ``top_p`` stays under sampling); None for a field of ``cls``'s own (the
    command's 'Options' panel)."""
    for base in cls.__mro__[1:]:
        panel = getattr(base, "help_panel", None)
        if isinstance(panel, HelpPanel) and name in getattr(base, "__dataclass_fields__", {}):
            return panel
    return None


def renamed_fields(cls: type) -> dict[str, str]:
    """{old name: field} of the fields of ``cls`` renamed with ``opt(..., renamed_from=OLD)``: the
    old name still works (a recipe key, ``--set``, its option), with a one-line note."""
    return {f.metadata["renamed_from"]: f.name for f in dataclasses.fields(cls) if f.metadata.get("renamed_from")}


noted_renames: set[str] = set()
"""The old names already noted in this process."""


def _note_renamed(old: str, new: str) -> None:
    """One line on stderr, once per process and old name (an ablation builds many configs)."""
    if old not in noted_renames:
        noted_renames.add(old)
        flag = "--" + new.replace("_", "-")
        print(f"note: '{old}' (--{old.replace('_', '-')}) is now '{new}' ({flag}); the old name still works", file=sys.stderr)


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


INT_LIMIT = 2**63
"""Every int field is in [-2**63, 2**63): C's long long, what torch, numpy and vLLM take."""
SEED_MAX = 2**32 - 1
"""The largest seed: vLLM seeds numpy's global generator, which takes 0 <= seed < 2**32."""


def check_seed(seed: int, key: str = "seed") -> None:
    """A seed every generator of a run accepts (numpy's range, through vLLM; torch's is wider)."""
    check(0 <= seed <= SEED_MAX, f"{key} must be in [0, 2**32 - 1] (numpy's seed range, which vLLM uses), got {seed}")


def _type_name(tp: Any) -> str:
    name = getattr(tp, "__name__", str(tp))
    if typing.get_origin(tp) is list:
        (inner,) = typing.get_args(tp) or (str,)
        return f"list of {getattr(inner, '__name__', inner)}"
    return name


def _a(name: str) -> str:
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


class _NotFinite(ValueError):
    """A float that is NaN, or infinite where the field does not allow it."""


class _TooLarge(ValueError):
    """An int outside [-2**63, 2**63)."""


def _scalar(tp: Any, value: Any, inf_ok: bool) -> Any:
    """``value`` as a ``tp`` (bool, int, float or str); ValueError / TypeError when it is not one."""
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
        out = int(value)
        if not -INT_LIMIT <= out < INT_LIMIT:
            raise _TooLarge
        return out
    if tp is float:
        if isinstance(value, bool):
            raise ValueError
        out = float(value)
        if math.isnan(out) or (math.isinf(out) and not inf_ok):
            raise _NotFinite
        return out
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ValueError
        return str(value)
    return value


def coerce(cls: type, key: str, value: Any) -> Any:
    """Convert ``value`` (from TOML, a ``--set`` string or an option) to the type of field ``key``."""
    hints = typing.get_type_hints(cls)
    if key not in hints:
        known = ", ".join(f.name for f in dataclasses.fields(cls))
        raise ReasonRLError(f"unknown key '{key}' for {cls.__name__}; known keys: {known}")
    tp, optional = base_type(hints[key])
    inf_ok = bool(next((f.metadata.get("inf_ok") for f in dataclasses.fields(cls) if f.name == key), False))
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null", "")):
        if optional:
            return None
        raise ReasonRLError(f"'{key}' cannot be empty: give {_a(_type_name(tp))}")
    origin = typing.get_origin(tp)
    try:
        if origin is list:
            (inner,) = typing.get_args(tp) or (str,)
            if isinstance(value, str):
                text = value.strip()
                if text.startswith("[") and text.endswith("]"):  # --set key=[a, b] or key=[]
                    text = text[1:-1]
                value = [v.strip().strip("'\"") for v in text.split(",") if v.strip().strip("'\"")]
            if not isinstance(value, list):
                raise ValueError
            return [_scalar(inner, v, inf_ok) for v in value if not (isinstance(v, str) and not v.strip())]  # "" is no entry
        return _scalar(tp, value, inf_ok)
    except _NotFinite:
        finite = "a finite float, or inf (no bound)" if inf_ok else "a finite float"
        raise ReasonRLError(f"'{key}' must be {finite}, got {value!r}: fix the recipe or --set {key}=...") from None
    except _TooLarge:
        raise ReasonRLError(f"'{key}' is out of range, got {value!r}: an int option takes -2**63 <= value < 2**63 (torch's, numpy's and vLLM's "
                            f"64-bit integers); fix the recipe or --set {key}=...") from None
    except (TypeError, ValueError, OverflowError):
        raise ReasonRLError(
            f"'{key}' must be {_a(_type_name(tp))}, got {value!r}: fix the recipe or --set {key}=..."
        ) from None


def load_recipe(path: str | Path | None) -> dict[str, Any]:
    """Read a TOML recipe (flat keys, or one table named after the stage)."""
    if path is None:
        return {}
    p = Path(path)
    if not p.is_file():
        raise ReasonRLError(f"recipe {p} not found: pass an existing file to --config (see stages/)")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ReasonRLError(f"recipe {p} cannot be read ({e.strerror or type(e).__name__}): pass a readable file to --config") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ReasonRLError(f"recipe {p} is not UTF-8 text (byte 0x{raw[e.start]:02x} on line {line}): save it as UTF-8") from None
    try:
        return tomllib.loads(text)
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

    renamed = {old: new for old, new in renamed_fields(cls).items() if old not in own}
    for layer in layers:
        for k, v in layer.items():
            if v is None:
                continue
            k = k.replace("-", "_")
            if k in renamed:
                if any(kk.replace("-", "_") == renamed[k] and vv is not None for kk, vv in layer.items()):
                    raise ReasonRLError(f"'{k}' and '{renamed[k]}' both given: '{k}' is the old name of '{renamed[k]}'; give it once, as '{renamed[k]}'")
                _note_renamed(k, renamed[k])
                k = renamed[k]
            whole = next((f for f in secs if k == f.name and k != f.metadata["table"]), None)
            if whole is not None:
                t = whole.metadata["table"]
                raise ReasonRLError(f"'{k}' is set key by key: --set {t}.KEY=VALUE, the recipe's [{t}] table, or the options in `--help`")
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
