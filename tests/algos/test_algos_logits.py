"""Entropy and log-probs from logits: chunked == unchunked == torch references, with and
without gradients, for non-contiguous and half-precision logits."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl.algos import entropy_from_logits, logprobs_from_logits
from reasonrl.algos import reference as ref


@pytest.mark.parametrize("shape", [(7,), (3, 7), (2, 5, 11), (2, 3, 4, 9)])
@pytest.mark.parametrize("chunk", [1, 3, 1024, None])
def test_entropy_matches_torch_distributions(shape: tuple[int, ...], chunk) -> None:
    g = torch.Generator().manual_seed(len(shape))
    logits = torch.randn(*shape, generator=g, dtype=torch.float64) * 3
    got = entropy_from_logits(logits, chunk_size=chunk)
    want = torch.distributions.Categorical(logits=logits).entropy()
    assert got.shape == shape[:-1]
    torch.testing.assert_close(got, want)


def test_entropy_matches_python_loop_and_chunking_is_invisible() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 6, 13, generator=g, dtype=torch.float64)
    full = entropy_from_logits(logits, chunk_size=None)
    for c in (1, 5, 7, 24, 100):
        torch.testing.assert_close(entropy_from_logits(logits, chunk_size=c), full, rtol=0, atol=1e-12)
    loop = [[ref.entropy(row) for row in b] for b in logits.tolist()]
    torch.testing.assert_close(full, torch.tensor(loop, dtype=torch.float64))


def test_entropy_gradient_chunked_equals_unchunked() -> None:
    g = torch.Generator().manual_seed(1)
    base = torch.randn(3, 5, 17, generator=g, dtype=torch.float64)
    w = torch.randn(3, 5, generator=g, dtype=torch.float64)
    grads = []
    for c in (None, 4):
        x = base.clone().requires_grad_(True)
        (entropy_from_logits(x, chunk_size=c) * w).sum().backward()
        grads.append(x.grad)
    x = base.clone().requires_grad_(True)
    (torch.distributions.Categorical(logits=x).entropy() * w).sum().backward()
    torch.testing.assert_close(grads[0], x.grad)
    torch.testing.assert_close(grads[1], x.grad)


def test_entropy_no_grad_and_special_values() -> None:
    with torch.no_grad():
        h = entropy_from_logits(torch.zeros(2, 8), chunk_size=1)
    torch.testing.assert_close(h, torch.full((2,), math.log(8)))
    # -inf logits are probability 0: uniform over the 2 finite entries
    x = torch.tensor([[0.0, 0.0, float("-inf"), float("-inf")]], requires_grad=True)
    h = entropy_from_logits(x, chunk_size=1)
    torch.testing.assert_close(h, torch.tensor([math.log(2)]))
    h.sum().backward()
    assert torch.isfinite(x.grad).all()
    # bf16 in, float32 out
    assert entropy_from_logits(torch.zeros(2, 3, 4, dtype=torch.bfloat16)).dtype == torch.float32
    # empty leading dims
    assert entropy_from_logits(torch.zeros(0, 5)).shape == (0,)


def test_entropy_non_contiguous_logits_need_no_copy() -> None:
    g = torch.Generator().manual_seed(2)
    full = torch.randn(3, 6, 10, generator=g, dtype=torch.float64)
    sliced = full[:, :-1]  # causal-LM shift: not viewable as (-1, V)
    assert not sliced.is_contiguous()
    torch.testing.assert_close(entropy_from_logits(sliced, chunk_size=4), torch.distributions.Categorical(logits=sliced).entropy())


@pytest.mark.parametrize("shape", [(3, 7), (2, 5, 11), (2, 3, 4, 9)])
@pytest.mark.parametrize("chunk", [1, 4, None])
def test_logprobs_equal_log_softmax_gather(shape: tuple[int, ...], chunk) -> None:
    g = torch.Generator().manual_seed(len(shape) + 10)
    logits = torch.randn(*shape, generator=g, dtype=torch.float64) * 2
    ids = torch.randint(0, shape[-1], shape[:-1], generator=g)
    got = logprobs_from_logits(logits, ids, chunk_size=chunk)
    want = torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(got, want)


def test_logprobs_gradient_and_non_contiguous() -> None:
    g = torch.Generator().manual_seed(4)
    base = torch.randn(2, 7, 12, generator=g, dtype=torch.float64)
    ids = torch.randint(0, 12, (2, 7), generator=g)
    x1 = base.clone().requires_grad_(True)
    logprobs_from_logits(x1[:, :-1], ids[:, 1:], chunk_size=3).sum().backward()
    x2 = base.clone().requires_grad_(True)
    torch.log_softmax(x2[:, :-1], -1).gather(-1, ids[:, 1:, None]).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad)


def test_logprobs_half_precision_and_errors() -> None:
    logits = torch.randn(2, 3, 5).bfloat16()
    ids = torch.zeros(2, 3, dtype=torch.long)
    out = logprobs_from_logits(logits, ids)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.log_softmax(logits.float(), -1)[..., 0])
    with pytest.raises(ValueError):
        logprobs_from_logits(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError):
        logprobs_from_logits(logits, torch.zeros(2, 3))


def test_gradcheck_both() -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 6, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 6, (2, 3), generator=g)
    assert torch.autograd.gradcheck(lambda t: entropy_from_logits(t, chunk_size=4), (x,))
    assert torch.autograd.gradcheck(lambda t: logprobs_from_logits(t, ids, chunk_size=4), (x,))


def test_autograd_saves_no_full_size_temporaries() -> None:
    # Only the logits themselves (same storage) may be kept for backward: no softmax copies.
    x = torch.randn(4, 6, 50, requires_grad=True)
    ids = torch.randint(0, 50, (4, 6))
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        h = entropy_from_logits(x, chunk_size=5)
        lp = logprobs_from_logits(x, ids, chunk_size=5)
    big = [t for t in saved if t.numel() >= x.numel()]
    assert big and all(t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() for t in big)
    (h.sum() + lp.sum()).backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_half_precision_gradients_keep_dtype() -> None:
    base = torch.randn(2, 3, 7)
    ids = torch.randint(0, 7, (2, 3))
    xb = base.bfloat16().requires_grad_(True)
    (entropy_from_logits(xb).sum() + logprobs_from_logits(xb, ids).sum()).backward()
    xf = base.bfloat16().float().requires_grad_(True)
    (entropy_from_logits(xf).sum() + logprobs_from_logits(xf, ids).sum()).backward()
    assert xb.grad.dtype == torch.bfloat16
    torch.testing.assert_close(xb.grad.float(), xf.grad, atol=1e-2, rtol=1e-2)
