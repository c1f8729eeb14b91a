"""A tiny Llama model built in-process (byte-level BPE tokenizer + random weights), for tests; with
``sliding_window`` a tiny Mistral, the same but for its sliding-window attention.

head_dim is 32 so vLLM's CPU attention accepts it. It trains in seconds and saves as a normal HF
directory, so every stage treats it exactly like a real model.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _corpus(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        lines.append(f"What is {a} + {b}? Answer: {a + b}")
        lines.append(f"Solve the following math problem step by step. The answer is {a * b}.")
    return lines


def build_tiny_model(
    out_dir: str | Path,
    *,
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    max_position_embeddings: int = 1024,
    seed: int = 0,
    sliding_window: int | None = None,
) -> Path:
    """Write a tokenizer + random ``LlamaForCausalLM`` to ``out_dir`` and return it; with
    ``sliding_window`` w a ``MistralForCausalLM`` whose every layer attends to the last w tokens."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(_corpus(2000, seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(seed)
    config_class, model_class = (LlamaConfig, LlamaForCausalLM) if sliding_window is None else (MistralConfig, MistralForCausalLM)
    window = {} if sliding_window is None else {"sliding_window": sliding_window}
    cfg = config_class(
        vocab_size=len(fast),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        dtype="float32",
        **window,
    )
    model = model_class(cfg)
    model.generation_config.eos_token_id = fast.eos_token_id
    model.generation_config.pad_token_id = fast.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    (out / "reasonrl_tiny.json").write_text(json.dumps({"seed": seed, "vocab_size": len(fast)}) + "\n")
    return out
