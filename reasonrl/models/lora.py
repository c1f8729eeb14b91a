"""LoRA through ``peft``: the trained model's linear layers get a low-rank update, the rest is frozen.

Each targeted linear layer W (out × in) of the transformer blocks computes ``W x + (α/R) B A x``
(A: R × in, initialised by peft's Kaiming-uniform; B: out × R, initialised to 0, so training starts
at the base model); only A and B (and, for a critic, its value head, trained in full as peft's
``modules_to_save``) are parameters of the optimiser. Dropout on the adapter is 0, like every other
dropout here: the trainer's old and new log-probabilities must come from the same function.

Everything reasonrl hands on is a plain HF model: the engines receive, and ``policy/`` holds, the
merged weights ``W + (α/R)·B A`` (:class:`MergedWeights`, computed out of place, one matrix at a
time: the frozen W is never modified, so nothing drifts and a resumed run continues bitwise); the
adapter itself (``adapter_config.json`` + ``adapter_model.safetensors``, peft's own format) is what
a checkpoint holds and what ``policy/adapter/`` keeps.

Target modules: ``all-linear`` (the default) is every ``nn.Linear`` of the backbone (the transformer
blocks: attention and MLP projections), never the LM head or a value head: peft's ``all-linear``
minus the output layer. Names (``q_proj,v_proj``) pick the backbone's linear layers whose module name
ends with one of them, as peft matches them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.errors import ReasonRLError

ALL_LINEAR = "all-linear"
#: The adapter's α when --lora-alpha is not given: 32 whatever the rank, as "LoRA Without Regret"
#: (Thinking Machines, 2025) and TRL's reproduction of it use; with the α/R scaling the best learning
#: rate then hardly moves with the rank (verl's and OpenRLHF's defaults are 16).
DEFAULT_ALPHA = 32.0
#: Where a merged model directory keeps its peft adapter (``policy/adapter/``).
ADAPTER_SUBDIR = "adapter"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model."
_ADAPTER = "default"


@dataclass(frozen=True)
class LoraSettings:
    """A LoRA run's settings: rank R >= 1, α, and the target module names (``("all-linear",)``)."""

    rank: int
    alpha: float = DEFAULT_ALPHA
    targets: tuple[str, ...] = (ALL_LINEAR,)

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def backbone_linears(model: Any) -> list[str]:
    """The full module names of every ``nn.Linear`` in ``model``'s backbone (transformers'
    ``base_model``: the embeddings and blocks; never the LM head or a task head), in module order."""
    import torch

    backbone = getattr(model, "base_model", None)
    if backbone is None or backbone is model:
        raise ReasonRLError(f"{type(model).__name__} has no separate backbone (transformers' base_model): LoRA needs an HF causal LM or value model")
    prefix = next(n for n, m in model.named_modules() if m is backbone)
    return [f"{prefix}.{n}" for n, m in backbone.named_modules() if isinstance(m, torch.nn.Linear)]


def resolve_targets(model: Any, targets: tuple[str, ...]) -> list[str]:
    """The full names of the modules LoRA wraps: every backbone linear layer for ``all-linear``, else
    those whose name is, or ends with ``.`` + , one of ``targets``. A name that matches none of them
    is a one-line error listing the names there are."""
    linears = backbone_linears(model)
    if tuple(targets) == (ALL_LINEAR,):
        return linears
    if ALL_LINEAR in targets:
        raise ReasonRLError(f"--lora-target-modules {','.join(targets)}: '{ALL_LINEAR}' already means every linear layer of the blocks; give it alone or give names")
    names = sorted({n.rsplit(".", 1)[-1] for n in linears})
    for t in targets:
        if not any(n == t or n.endswith("." + t) for n in linears):
            raise ReasonRLError(f"--lora-target-modules: '{t}' matches no linear layer of {type(model).__name__}'s blocks "
                                f"(theirs: {', '.join(names)}; the LM head and value head are never LoRA targets): use those names or {ALL_LINEAR}")
    return [n for n in linears if any(n == t or n.endswith("." + t) for t in targets)]


def value_head(model: Any) -> str:
    """The name of a value model's scalar head (``score`` for Llama/Qwen's token classification,
    ``classifier`` for others): the top-level ``nn.Linear`` with one output. None is a one-line error."""
    import torch

    heads = [n for n, m in model.named_children() if isinstance(m, torch.nn.Linear) and m.out_features == 1]
    if len(heads) != 1:
        raise ReasonRLError(f"a LoRA critic needs a value head (one linear layer with one output on top of the backbone); {type(model).__name__} has "
                            f"{'none' if not heads else ', '.join(heads)}: pass a value model (`reasonrl pretrain-value` makes one) or drop --lora-rank")
    return heads[0]


def apply_lora(model: Any, settings: LoraSettings, *, seed: int, base_path: str | os.PathLike, critic: bool = False) -> Any:
    """``model`` wrapped by peft with a fresh adapter (its A drawn from ``seed``, the global RNG left
    alone); a critic's value head is trained in full (``modules_to_save``). ``base_path`` is written
    into the adapter's config as its base model. The wrapped model keeps ``reasonrl_linears``, the
    backbone's linear layers (HF names): the weights an engine gets at each sync."""
    import torch
    from peft import LoraConfig, get_peft_model

    if settings.rank < 1:
        raise ReasonRLError(f"--lora-rank must be >= 1 to train an adapter, got {settings.rank}")
    wrapped = resolve_targets(model, settings.targets)
    linears = backbone_linears(model)
    short = sorted({n.rsplit(".", 1)[-1] for n in wrapped})
    others = [n for n, _ in model.named_modules() if n not in wrapped]
    # peft matches a name by suffix: the short names when they pick exactly the resolved modules, else the full names.
    exact = not any(n.rsplit(".", 1)[-1] in short for n in others)
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=0.0, bias="none", target_modules=short if exact else wrapped,
                        modules_to_save=[value_head(model)] if critic else None, task_type="TOKEN_CLS" if critic else "CAUSAL_LM")
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, config)
    peft_model.peft_config[_ADAPTER].base_model_name_or_path = str(Path(base_path).resolve())
    peft_model.reasonrl_linears = tuple(n for n in linears)
    return peft_model


def is_lora(model: Any) -> bool:
    """Whether ``model`` is a peft model (its ``state_dict`` keys are peft's). peft is imported only
    when ``model`` comes from it (a full fine-tuning run never imports it)."""
    if not type(model).__module__.startswith("peft"):
        return False
    from peft import PeftModel

    return isinstance(model, PeftModel)


def lora_scaling(model: Any) -> float:
    """α / R of a peft model's adapter."""
    cfg = model.peft_config[_ADAPTER]
    return float(cfg.lora_alpha) / int(cfg.r)


class MergedWeights(Mapping):
    """The HF state dict of a peft model, merged, computed lazily from ``state_dict`` (peft's keys,
    e.g. a backend's ``full_state_dict()``): a LoRA-wrapped layer's ``weight`` is
    ``W + (B @ A) * scaling`` (peft's ``merge``, in float32, cast back to W's dtype), a value head
    trained in full is its trained copy, everything else is the frozen tensor itself. ``only``: the
    module names (HF) whose parameters to include (the engine sync: the backbone's linear layers).
    Each access computes one tensor, so a sync holds one merged matrix at a time."""

    def __init__(self, state_dict: Mapping[str, Any], scaling: float, only: tuple[str, ...] | None = None) -> None:
        self.sd, self.scaling = state_dict, scaling
        self.partial = only is not None  # (the engines: weights left out are unchanged)
        self.keys_: dict[str, str] = {}  # HF key → peft key (its base weight for a merged one)
        self.merged: set[str] = set()
        wanted = set(only) if only is not None else None
        for k in state_dict:
            name = k[len(_PREFIX):] if k.startswith(_PREFIX) else k
            if f".lora_A.{_ADAPTER}." in name or f".lora_B.{_ADAPTER}." in name or ".original_module." in name:
                continue
            hf = name.replace(f".modules_to_save.{_ADAPTER}.", ".").replace(".base_layer.", ".")
            if wanted is not None and hf.rsplit(".", 1)[0] not in wanted:
                continue
            self.keys_[hf] = k
            if ".base_layer." in name and name.endswith(".base_layer.weight") and k.replace(".base_layer.weight", f".lora_A.{_ADAPTER}.weight") in state_dict:
                self.merged.add(hf)

    def __getitem__(self, key: str) -> Any:
        import torch

        k = self.keys_[key]
        w = self.sd[k]
        if key not in self.merged:
            return w.detach() if isinstance(w, torch.Tensor) else w
        a = self.sd[k.replace(".base_layer.weight", f".lora_A.{_ADAPTER}.weight")]
        b = self.sd[k.replace(".base_layer.weight", f".lora_B.{_ADAPTER}.weight")]
        with torch.no_grad():
            delta = (b.detach().float() @ a.detach().float()) * self.scaling
            return (w.detach().float() + delta.to(w.device)).to(w.dtype)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys_)

    def __len__(self) -> int:
        return len(self.keys_)


def engine_weights(model: Any, state_dict: Mapping[str, Any]) -> Mapping[str, Any]:
    """What an engine loads after an update, from the trained ``model``'s ``state_dict`` (gathered
    by its backend): the state dict itself for full fine-tuning; for LoRA the merged weights of the
    backbone's linear layers only (embeddings, norms and the head never change). Every linear layer
    goes, targeted or not: vLLM loads fused layers (qkv, gate-up) whole."""
    if not is_lora(model):
        return state_dict
    return MergedWeights(state_dict, lora_scaling(model), only=getattr(model, "reasonrl_linears", None))


def save_merged(model: Any, state_dict: Mapping[str, Any], out_dir: Path, tokenizer: Any = None, *, adapter_from: Path | None = None) -> None:
    """Write ``out_dir`` as a plain HF directory with the merged weights (safetensors; transformers
    and vLLM load it as any model) and ``out_dir/adapter/`` the peft adapter (saved from ``model``, or
    copied from the adapter directory ``adapter_from``). ``state_dict``: the peft model's full state
    dict (on CPU or not; written from CPU copies)."""
    import shutil

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    merged = {k: v.to("cpu", copy=True) for k, v in MergedWeights(state_dict, lora_scaling(model)).items()}
    _tie(model, merged)
    base = model.get_base_model()
    base.save_pretrained(out_dir, state_dict=merged, safe_serialization=True)
    if adapter_from is not None:
        shutil.copytree(adapter_from, out_dir / ADAPTER_SUBDIR, dirs_exist_ok=True)
    else:
        save_adapter(model, state_dict, out_dir / ADAPTER_SUBDIR, tokenizer)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)


def merge_checkpoint(base_dir: Path, adapter_dir: Path, out_dir: Path, tokenizer: Any = None) -> None:
    """A LoRA run's final ``policy/``: ``base_dir``'s model (from disk, float32 on CPU) with the
    checkpoint's adapter ``adapter_dir`` merged, written by :func:`save_merged` (the adapter copied
    as it is): a function of the checkpoint alone, as full fine-tuning's copy of it is."""
    import torch
    from peft import PeftModel

    from reasonrl.models.loading import load_causal_lm

    model = PeftModel.from_pretrained(load_causal_lm(base_dir, dtype=torch.float32), str(adapter_dir))
    save_merged(model, model.state_dict(), out_dir, tokenizer, adapter_from=Path(adapter_dir))


def check_targets(model_dir: str | os.PathLike, settings: LoraSettings, *, critic: bool = False) -> None:
    """:func:`resolve_targets` (and a critic's :func:`value_head`) on ``model_dir``'s architecture
    built on the meta device (no weights read), so bad ``--lora-target-modules`` is refused before
    anything is written. A config transformers cannot build here is left to the real load."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    try:
        cfg = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=False, **({"num_labels": 1} if critic else {}))
        with torch.device("meta"):
            model = (AutoModelForTokenClassification if critic else AutoModelForCausalLM).from_config(cfg, trust_remote_code=False)
    except Exception:  # noqa: BLE001 - the load itself names what is wrong with the directory
        return
    resolve_targets(model, settings.targets)
    if critic:
        value_head(model)


def trainable_line(model: Any) -> str:
    """``LoRA r=8 α=32 on 196 layers: 20.2M of 7.6B parameters trained (0.27%)``."""
    cfg = model.peft_config[_ADAPTER]
    def count(p: Any) -> int:
        return int(getattr(p, "ds_numel", p.numel()))  # (ZeRO-3: a rank holds a shard; ds_numel is the whole)

    total = sum(count(p) for p in model.parameters())
    trained = sum(count(p) for p in model.parameters() if p.requires_grad)
    layers = sum(1 for n, _ in model.named_modules() if n.endswith(f".lora_A.{_ADAPTER}"))

    def size(n: int) -> str:
        return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"

    return f"LoRA r={cfg.r} α={cfg.lora_alpha:g} on {layers} layers: {size(trained)} of {size(total)} parameters trained ({100 * trained / total:.2g}%)"


def reference_model(model: Any) -> Any:
    """The frozen base of a LoRA policy as a module (a KL penalty's reference, with no second copy of
    the weights): ``model`` with its adapter off, in eval mode for the call, which is the base model's
    forward exactly (peft's LoRA layers then call only their base layer)."""
    import torch

    class AdapterOff(torch.nn.Module):
        def __init__(self, peft_model: Any) -> None:
            super().__init__()
            object.__setattr__(self, "peft_model", peft_model)  # (not a submodule: its parameters stay the policy's)

        @property
        def config(self) -> Any:
            """The base's config (what the trainer's forward-mode choice reads)."""
            return self.peft_model.config

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            m = self.peft_model
            was = m.training
            m.eval()  # (gradient checkpointing in training mode would drop the KV cache the shared-prompt passes use)
            try:
                with m.disable_adapter():
                    return m(*args, **kwargs)
            finally:
                m.train(was)

    return AdapterOff(model).eval()


def _tie(model: Any, merged: dict[str, Any]) -> None:
    """Tied embeddings: the LM head is the embedding's tensor (transformers saves it once)."""
    cfg = model.get_base_model().config
    if getattr(cfg, "tie_word_embeddings", False) and "lm_head.weight" in merged:
        emb = next((k for k in merged if k.endswith("embed_tokens.weight")), None)
        if emb is not None:
            merged["lm_head.weight"] = merged[emb]


def save_adapter(model: Any, state_dict: Mapping[str, Any] | None, out_dir: Path, tokenizer: Any = None) -> None:
    """peft's adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``: A, B and a
    critic's value head) from ``state_dict`` (default: the model's own)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    kw = {"state_dict": dict(state_dict)} if state_dict is not None else {}
    model.save_pretrained(out_dir, safe_serialization=True, save_embedding_layers=False, **kw)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)


def load_adapter_weights(model: Any, adapter_dir: Path) -> None:
    """Set a peft model's adapter (and trained value head) from ``adapter_dir``'s safetensors,
    bit for bit; a key that does not fit the model is a one-line error."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    f = Path(adapter_dir) / ADAPTER_WEIGHTS
    if not f.is_file():
        raise ReasonRLError(f"{adapter_dir} holds no {ADAPTER_WEIGHTS}: the checkpoint is not a LoRA checkpoint (was the run trained without --lora-rank?)")
    result = set_peft_model_state_dict(model, load_file(str(f)))
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise ReasonRLError(f"{f} does not fit this run's adapter ({len(unexpected)} unexpected keys, e.g. {unexpected[0]}): "
                            "resume with the run's --lora-* settings")


# ------------------------------------------------------------------ adapter directories (eval --model)


def is_adapter_dir(path: str | os.PathLike) -> bool:
    """A bare peft adapter directory: ``adapter_config.json`` and no ``config.json``."""
    p = Path(path)
    return (p / ADAPTER_CONFIG).is_file() and not (p / "config.json").is_file()


def adapter_base(adapter_dir: str | os.PathLike) -> Path:
    """The base model an adapter directory names (``base_model_name_or_path``); a missing name or a
    path that does not exist is a one-line error naming it."""
    from reasonrl.models.loading import read_json_object

    p = Path(adapter_dir)
    cfg = read_json_object(p / ADAPTER_CONFIG, "restore the adapter directory (save it with peft's save_pretrained)")
    base = cfg.get("base_model_name_or_path")
    if not base or not isinstance(base, str):
        raise ReasonRLError(f"{p / ADAPTER_CONFIG} names no base model (base_model_name_or_path): set it to the base model's directory")
    b = Path(base).expanduser()
    if not b.is_absolute() and not b.exists():
        b = p / b  # (a path relative to the adapter)
    if not (b / "config.json").is_file():
        raise ReasonRLError(f"{p / ADAPTER_CONFIG} names the base model {base}, which is not a model directory here: "
                            "put the base model there or edit base_model_name_or_path to its directory")
    return b


def adapter_merged_weights(adapter_dir: str | os.PathLike, base_dir: Path, *, allow_pickle: bool = False) -> dict[str, Any]:
    """The HF state dict of ``base_dir``'s model with ``adapter_dir``'s adapter merged (peft's
    ``merge_and_unload``: any peft LoRA variant), float32 on CPU. Pickled adapter weights are refused
    unless ``allow_pickle``."""
    import torch
    from peft import PeftModel

    from reasonrl.console import error_line
    from reasonrl.models.loading import load_causal_lm

    p = Path(adapter_dir)
    if not (p / ADAPTER_WEIGHTS).is_file():
        pickled = sorted(f.name for f in p.glob("adapter_model.*") if f.suffix in (".bin", ".pt", ".pth"))
        if not pickled:
            raise ReasonRLError(f"{p} holds no {ADAPTER_WEIGHTS}: pass a peft adapter directory")
        if not allow_pickle:
            raise ReasonRLError(f"{p} holds its adapter only as a pickle file ({pickled[0]}), which can run code when loaded: "
                                "convert it to safetensors, or pass --allow-pickle if you trust the source")
    cfg = json.loads((p / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    if str(cfg.get("peft_type", "")).upper() != "LORA":
        raise ReasonRLError(f"{p} is a {cfg.get('peft_type')} adapter: reasonrl merges LoRA adapters only")
    base = load_causal_lm(base_dir, dtype=torch.float32)
    try:
        model = PeftModel.from_pretrained(base, str(p)).merge_and_unload()
    except Exception as e:  # noqa: BLE001 - any peft failure is a bad adapter for this base
        raise ReasonRLError(f"cannot apply the adapter {p} to {base_dir} ({error_line(e, 200)}): pass the adapter of this base model") from None
    return {k: v.detach() for k, v in model.state_dict().items()}
