"""Fixtures for the engine tests: the tokenizer of the session's tiny model (``tiny_model``, tests/conftest.py), prompts and HF helpers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The tiny model's matmuls are microseconds: with 2 OpenMP threads on 2 cores shared with other
    jobs, every op waits for a descheduled thread (measured 80× slower). One thread is robust; the
    root conftest puts the count back after the module (other tests' numerics depend on it)."""
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_tok(tiny_model: Path):
    from reasonrl.models import load_tokenizer

    return load_tokenizer(tiny_model)


@pytest.fixture(scope="session")
def prompts(tiny_tok) -> list[list[int]]:
    texts = ["What is 12 + 30? Answer:", "Solve the following math problem step by step.", "7"]
    return [tiny_tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def _hf_logprobs(model, prompt: list[int], completion: list[int], *, temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """Log-probabilities of ``completion`` after ``prompt`` under ``model``, from one full forward, of
    the distribution sampled from (temperature, then top-k / top-p renormalised; temperature 0 = raw)."""
    from reasonrl.algos import Sampling, sampling_logits

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    if temperature > 0:
        logits = sampling_logits(logits, Sampling(temperature=temperature, top_p=top_p, top_k=top_k))
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


@pytest.fixture(scope="session")
def hf_logprobs():
    """``hf_logprobs(model, prompt, completion, temperature=, top_k=, top_p=)`` → (T,) tensor."""
    return _hf_logprobs


def _check_progress(engine, prompts: list[list[int]], n: int = 3, max_tokens: int = 10) -> None:
    """The engine's progress callback hears every completion and every token, and changes nothing:
    seeded generation gives the same tokens with and without it."""
    from reasonrl.engines.base import SamplingParams

    p = SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, seed=5)
    plain = engine.generate(prompts, p)
    heard: list[tuple[int, int]] = []
    shown = engine.generate(prompts, p, progress=lambda c, t: heard.append((c, t)))
    assert [[c.token_ids for c in g] for g in shown] == [[c.token_ids for c in g] for g in plain]
    assert heard and all(c > 0 for c, _ in heard)
    assert sum(c for c, _ in heard) == len(prompts) * n
    assert sum(t for _, t in heard) == sum(len(c.token_ids) for g in shown for c in g)


@pytest.fixture(scope="session")
def check_progress():
    return _check_progress
