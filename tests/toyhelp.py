"""The toy task and the format-taught tiny model (shared by tests; a plain module, not a conftest)."""

from __future__ import annotations

import random
from pathlib import Path


def toy_rows(n: int, seed: int = 0, total: int | None = None) -> list[dict]:
    """'What is a + b?' with small a, b (a + b == total when given): tasks for the tiny model."""
    rng = random.Random(seed)
    phrasings = ["What is {a} + {b}?", "Compute {a} + {b}.", "Add {a} and {b}."]
    rows = []
    for _ in range(n):
        a = rng.randint(0, 2 if total is None else total)
        b = rng.randint(0, 2) if total is None else total - a
        rows.append({"problem": rng.choice(phrasings).format(a=a, b=b), "answer": str(a + b)})
    return rows


def sft_answer_format(model_dir: Path, out_dir: Path, steps: int = 60, seed: int = 0) -> Path:
    """Teach the random tiny model the *format* 'Answer: d' with a random digit d in 0..4.

    The digit is independent of the question, so accuracy starts near chance (~20%); only RL
    can teach which digit is right.
    """
    import torch

    from reasonrl.models.loading import load_causal_lm, load_tokenizer

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tok = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rows = toy_rows(256, seed=seed + 1)
    for _ in range(steps):
        batch = rng.sample(rows, 32)
        texts = []
        for r in batch:
            prompt = tok.apply_chat_template([{"role": "user", "content": r["problem"]}], add_generation_prompt=True, tokenize=False)
            texts.append(prompt + f"Answer: {rng.randint(0, 4)}<|im_end|>")
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        loss = model(**enc, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


class CountingTokenizer:
    """A real tokenizer, the length of each text it is called on recorded in ``calls``; a text
    longer than ``refuse_over`` characters raises instead (a test then fails at once rather than
    spending a minute and gigabytes tokenising it)."""

    def __init__(self, tok, refuse_over: int | None = None):
        self.__dict__.update(tok=tok, calls=[], refuse_over=refuse_over)

    def __getattr__(self, name):
        return getattr(self.tok, name)

    def __call__(self, text, **kw):
        self.calls.append(len(text))
        if self.refuse_over is not None and len(text) > self.refuse_over:
            raise AssertionError(f"the tokenizer was called on a text of {len(text)} characters")
        return self.tok(text, **kw)


def jsonl_records(path: Path) -> list[dict]:
    """The records of a ``.jsonl`` a run may still be appending to: its complete lines only (a line
    the writer has not finished yet, without its newline, is not read; a reader can see a write
    half-copied), [] while the file does not exist. A complete line that is not JSON still fails."""
    import json

    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    return [json.loads(ln) for ln in text.split("\n")[:-1] if ln.strip()]
