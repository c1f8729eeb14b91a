"""The value model: a causal LM's backbone with a scalar head, saved as a normal HF directory.

It is ``AutoModelForTokenClassification`` with ``num_labels=1`` (e.g. ``LlamaForTokenClassification``):
per-token scalar output V(s_t), loadable by transformers without custom code. VC-PPO initialises it
from the policy (or a reward model) and pretrains it with a fixed policy before PPO.
"""

from __future__ import annotations

import os
from typing import Any

from reasonrl.errors import ReasonRLError
from reasonrl.models.loading import check_model_config, disable_dropout


def new_value_model(base: str | os.PathLike, *, seed: int = 0) -> Any:
    """A value model initialised from ``base`` (policy or reward model directory); new head is zero-mean small."""
    import torch
    from transformers import AutoModelForTokenClassification

    check_model_config(base)  # never the folder's own code (see reasonrl.models.loading)
    torch.manual_seed(seed)
    try:
        model = AutoModelForTokenClassification.from_pretrained(str(base), config=_config(base), dtype=torch.float32, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001
        raise ReasonRLError(f"cannot build a value model from {base} ({type(e).__name__}): pass a causal-LM directory") from None
    model.config.reasonrl_role = "value"
    return disable_dropout(model)


def _config(path: str | os.PathLike) -> Any:
    """The model's config with one scalar output and the head's dropout at 0 (transformers'
    token-classification head otherwise defaults to 0.1)."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(path), num_labels=1, trust_remote_code=False)
    cfg.classifier_dropout = 0.0
    return cfg


def load_value_model(path: str | os.PathLike) -> Any:
    import torch
    from transformers import AutoModelForTokenClassification

    check_model_config(path)
    try:
        model = AutoModelForTokenClassification.from_pretrained(str(path), config=_config(path), dtype=torch.float32, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001
        raise ReasonRLError(f"cannot load the critic from {path} ({type(e).__name__}): run `reasonrl pretrain-value` first") from None
    return disable_dropout(model)

