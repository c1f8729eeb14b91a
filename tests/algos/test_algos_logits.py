"""Entropy and log-probs from logits: chunked == unchunked == torch references, with and
without gradients, for non-contiguous and half-precision logits."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl.algos import Sampling, entropy_from_logits, logprobs_from_logits, sampling_logits
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


# ------------------------------------------------------------------------------------------------
# The sampling distribution (temperature, top-k, top-p): one definition for engines and trainer

SETTINGS = [(1.0, -1, 1.0), (0.6, -1, 1.0), (1.0, -1, 0.7), (0.8, 20, 0.9), (1.3, 3, 1.0), (0.5, 5, 0.5)]


@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_sampling_distribution_matches_the_loop_reference(temperature, top_k, top_p) -> None:
    from reasonrl.algos import Sampling, sampling_logits

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 40, generator=g, dtype=torch.float64) * 2
    logits[0, :5] = logits[0, 0]  # ties at the top: top-k keeps every tied token
    logits[1] *= 0.1
    logits[1, 10:30] = 0.0  # 20 tied tokens mid-row: the top-p cut falls among them (kept in the order torch's ascending sort leaves them)
    sp = Sampling(temperature=temperature, top_p=top_p, top_k=top_k)
    got = torch.log_softmax(sampling_logits(logits, sp), -1)
    orders = torch.sort(logits / temperature, dim=-1)[1].tolist()
    want = torch.tensor([ref.sampling_logprobs(r, temperature, top_k, top_p, o) for r, o in zip(logits.tolist(), orders)], dtype=torch.float64)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    fin = torch.isfinite(want)
    torch.testing.assert_close(got[fin], want[fin])
    if top_p < 1.0 and (top_k <= 0 or top_k >= 20):
        assert 0 < int(fin[1, 10:30].sum()) < 20  # the ties straddle the cut
    ids = torch.multinomial(got.exp(), 1, generator=g).squeeze(-1)
    lp = logprobs_from_logits(logits, ids, chunk_size=2, sampling=sp)
    torch.testing.assert_close(lp, want.gather(-1, ids[:, None]).squeeze(-1))


@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_sampling_logprob_and_entropy_gradients_match_autograd(temperature, top_k, top_p) -> None:
    from reasonrl.algos import Sampling, sampling_logits

    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 4, 30, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 30, (3, 4), generator=g)
    sp = Sampling(temperature=temperature, top_p=top_p, top_k=top_k)
    w = torch.randn(3, 4, generator=g, dtype=torch.float64)
    lp = logprobs_from_logits(x, ids, chunk_size=5, sampling=sp)
    ent = entropy_from_logits(x, chunk_size=5, sampling=sp, token_ids=ids)
    (gl,) = torch.autograd.grad((lp * w).sum(), x)
    (ge,) = torch.autograd.grad((ent * w).sum(), x)
    # autograd through the plain formula, the kept set held fixed (the sampled token forced in)
    z = sampling_logits(x.detach(), sp)
    keep = torch.isfinite(z).scatter(-1, ids[..., None], True)
    zz = (x / temperature).masked_fill(~keep, float("-inf"))
    logp_all = torch.log_softmax(zz, -1)
    lp2 = logp_all.gather(-1, ids[..., None]).squeeze(-1)
    p = logp_all.exp()
    ent2 = -(p * logp_all.masked_fill(~keep, 0.0)).sum(-1)
    torch.testing.assert_close(lp, lp2)
    torch.testing.assert_close(ent, ent2)
    (gl2,) = torch.autograd.grad((lp2 * w).sum(), x, retain_graph=True)
    (ge2,) = torch.autograd.grad((ent2 * w).sum(), x)
    torch.testing.assert_close(gl, gl2)
    torch.testing.assert_close(ge, ge2)


def test_a_sampled_token_outside_the_filter_keeps_a_finite_logprob() -> None:
    from reasonrl.algos import Sampling

    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    lp = logprobs_from_logits(logits, torch.tensor([3]), sampling=Sampling(top_k=1))
    assert torch.isfinite(lp).all() and float(lp) < 0
    with pytest.raises(ValueError, match="temperature must be > 0"):
        Sampling(temperature=0.0)


def test_sampling_logits_top_k_keeps_the_k_largest() -> None:
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0], [0.0, -1.0, 2.0, 1.0, -2.0]])
    out = sampling_logits(logits, Sampling(top_k=2))
    assert torch.isfinite(out).sum(-1).tolist() == [2, 2]
    assert torch.isfinite(out[0]).tolist() == [False, True, False, True, False]
    assert torch.isfinite(out[1]).tolist() == [False, False, True, True, False]
    kept = torch.isfinite(out)
    assert torch.equal(out[kept], logits[kept])  # kept logits unchanged


def test_sampling_logits_top_p_keeps_the_smallest_prefix_reaching_p() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    # (thresholds away from the cumulative sums 0.5 / 0.8 / 0.95, where float rounding decides)
    assert torch.isfinite(sampling_logits(logits, Sampling(top_k=-1, top_p=0.1))).tolist() == [[True, False, False, False]]
    assert torch.isfinite(sampling_logits(logits, Sampling(top_k=-1, top_p=0.45))).tolist() == [[True, False, False, False]]
    assert torch.isfinite(sampling_logits(logits, Sampling(top_k=-1, top_p=0.55))).tolist() == [[True, True, False, False]]
    assert torch.isfinite(sampling_logits(logits, Sampling(top_k=-1, top_p=0.75))).tolist() == [[True, True, False, False]]
    assert torch.isfinite(sampling_logits(logits, Sampling(top_k=-1, top_p=0.85))).tolist() == [[True, True, True, False]]
    assert torch.isfinite(sampling_logits(logits, Sampling(top_k=-1, top_p=0.99))).all()
    # order of the vocabulary does not matter
    perm = torch.tensor([2, 0, 3, 1])
    assert torch.isfinite(sampling_logits(logits[:, perm], Sampling(top_p=0.55))).tolist() == [[False, True, False, True]]


def test_sampling_logits_disabled_and_combined() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, generator=g)
    assert torch.equal(sampling_logits(logits, Sampling(top_k=-1, top_p=1.0)), logits)
    assert torch.equal(sampling_logits(logits, Sampling(top_k=50, top_p=1.0)), logits)
    both = sampling_logits(logits, Sampling(top_k=10, top_p=0.5))
    assert (torch.isfinite(both).sum(-1) <= 10).all()
    assert (torch.isfinite(both).sum(-1) >= 1).all()
    # the argmax always survives
    assert torch.isfinite(both.gather(-1, logits.argmax(-1, keepdim=True))).all()


def test_auto_chunks_are_cache_sized_on_cpu_and_change_nothing() -> None:
    """The default chunk ("auto") splits a (12, 100k) bf16 batch into several cache-sized chunks
    (CPU_CHUNK_BYTES of float32 rows): the same values and gradients as one chunk; a bad size is an error."""
    from reasonrl.algos.logits import CPU_CHUNK_BYTES

    V = 100_000
    assert 1 <= CPU_CHUNK_BYTES // (4 * V) < 12
    x0 = (torch.randn(12, V, generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16)
    ids = torch.randint(0, V, (12,), generator=torch.Generator().manual_seed(1))
    out = {}
    for c in ("auto", None):
        x = x0.clone().requires_grad_(True)
        (logprobs_from_logits(x, ids, chunk_size=c).sum() + entropy_from_logits(x, chunk_size=c).sum()).backward()
        out[c] = (logprobs_from_logits(x0, ids, chunk_size=c), entropy_from_logits(x0, chunk_size=c), x.grad.float())
    for a, b in zip(out["auto"], out[None]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="chunk_size"):
        entropy_from_logits(x0, chunk_size="big")


# vLLM's CPU sampler (vLLM 0.32): settings (T, top_k, top_p) with both cuts alone and together
VLLM_CUTS = [(1.0, -1, 0.5), (1.0, -1, 0.9), (1.0, 5, 1.0), (1.0, 5, 0.7), (0.7, 10, 0.9), (1.3, 3, 0.6), (0.6, -1, 0.3)]


@pytest.mark.vllm
@pytest.mark.parametrize("V", [12, 40, 1000, 49152])
def test_sampling_keeps_the_tokens_vllms_cpu_sampler_keeps_where_ties_straddle_the_cuts(V) -> None:
    """Rows of a few distinct logits (many tokens tied at every cut): the trainer's kept set is
    the one vLLM's own top-k / top-p function (what its CPU sampler calls) keeps, and the kept
    tokens' log-probs are its processed log-probs."""
    pytest.importorskip("vllm")
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    n = 8
    rows = torch.randint(0, 6, (n, V), generator=torch.Generator().manual_seed(V)).float() * 0.75
    rows[0, :3] = 6.0  # a tied top
    straddled = {"top-k": False, "top-p": False}
    for T, k, p in VLLM_CUTS:
        scaled = rows.clone().div_(torch.full((n,), T).unsqueeze(1))  # vLLM's temperature step
        kk = torch.full((n,), k, dtype=torch.int32) if 0 < k < V else None
        pp = torch.full((n,), p, dtype=torch.float32) if p < 1.0 else None
        want = apply_top_k_top_p(scaled, kk, pp)
        got = sampling_logits(rows, Sampling(temperature=T, top_k=k, top_p=p))
        assert torch.equal(torch.isfinite(got), torch.isfinite(want)), (T, k, p)
        kept = torch.isfinite(want)
        torch.testing.assert_close(torch.log_softmax(got, -1)[kept], torch.log_softmax(want, -1)[kept], rtol=0, atol=1e-6)
        for r in range(n):  # some tokens of one logit value kept, others not: ties straddle the cut
            vals = rows[r].unique()
            split = any(kept[r][rows[r] == v].any() and not kept[r][rows[r] == v].all() for v in vals)
            straddled["top-p"] |= bool(split and p < 1.0)
            straddled["top-k"] |= bool(kk is not None and p == 1.0 and int(kept[r].sum()) > k)
    assert straddled["top-p"] and straddled["top-k"]
