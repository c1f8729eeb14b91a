"""Models: the embedded default (SmolLM2-135M-Instruct from a GGUF), any local HF directory,
the tiny test model, the value model (policy backbone + scalar head), and ``tokens`` (how many
characters a prompt of N tokens can have: a longer one is skipped without being tokenised)."""

from reasonrl.models.loading import (
    DEFAULT_MODEL,
    embedded_model_dir,
    load_causal_lm,
    load_tokenizer,
    resolve_model,
)
from reasonrl.models.tiny import build_tiny_model
from reasonrl.models.value import load_value_model, new_value_model

__all__ = [
    "DEFAULT_MODEL",
    "build_tiny_model",
    "embedded_model_dir",
    "load_causal_lm",
    "load_tokenizer",
    "load_value_model",
    "new_value_model",
    "resolve_model",
]
