"""The loss variants against their slow references: GSPO, CISPO, Clip-Cov, KL-Cov, VAPO's
positive-example NLL (values, gradients, edge cases: empty masks, everything clipped)."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl.algos import (
    AGG_MODES,
    POLICY_LOSSES,
    LossParams,
    get_algo,
    policy_loss,
    positive_example_nll,
    token_covariance,
)
from reasonrl.algos import reference as ref

SHAPES = [(1, 1), (2, 5), (5, 17)]


def prefix_mask(B: int, T: int, seed: int) -> torch.Tensor:
    lengths = ref.prefix_mask_lengths(B, T, seed)
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]


def inputs(B: int, T: int, seed: int, spread: float = 0.8, per_row_adv: bool = False):
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    logp = (logp_old + torch.randn(B, T, generator=g, dtype=torch.float64) * spread).requires_grad_(True)
    adv = torch.randn(B, generator=g, dtype=torch.float64) if per_row_adv else torch.randn(B, T, generator=g, dtype=torch.float64)
    return logp, logp_old, adv, prefix_mask(B, T, seed=seed)


def run(name: str, logp, logp_old, adv, m, agg="token-mean", **params):
    logp.grad = None
    out = POLICY_LOSSES[name](logp, logp_old, adv, m, params=LossParams(**params), agg=agg, max_len=None)
    out.loss.backward()
    return out, logp.grad.clone()


def lists(*xs):
    return [x.detach().tolist() if isinstance(x, torch.Tensor) else x for x in xs]


# ---------------------------------------------------------------- GSPO


@pytest.mark.parametrize("B,T", SHAPES)
@pytest.mark.parametrize("agg", list(AGG_MODES))
@pytest.mark.parametrize("eps", [(3e-4, 4e-4), (0.2, 0.2)])
def test_gspo_matches_reference(B, T, agg, eps) -> None:
    logp, logp_old, adv, m = inputs(B, T, seed=B * 31 + T, spread=0.3)
    out, grad = run("gspo", logp, logp_old, adv, m, agg=agg, eps_low=eps[0], eps_high=eps[1])
    want, want_grad = ref.gspo(*lists(logp, logp_old, adv), m.int().tolist(), eps[0], eps[1], agg)
    assert out.loss.item() == pytest.approx(want, rel=1e-10, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor(want_grad, dtype=torch.float64))
    # the ratio it reports is the row's geometric-mean ratio on every counted token
    for i in range(B):
        n = int(m[i].sum())
        if n:
            s = math.exp(float((logp.detach()[i] - logp_old[i])[m[i]].mean()))
            assert torch.allclose(out.ratio[i][m[i]], torch.tensor(s, dtype=torch.float64))


def test_gspo_token_form_equals_sequence_gspo_for_per_response_advantages() -> None:
    # The paper's sequence objective: (1/G) sum_i -min(s_i A_i, clip(s_i) A_i), gradient through
    # every token of s_i. GSPO-token with seq-mean aggregation must match it in value and gradient.
    logp, logp_old, a, m = inputs(6, 9, seed=4, spread=0.002, per_row_adv=True)
    out, grad = run("gspo", logp, logp_old, a, m, agg="seq-mean-token-mean", eps_low=3e-4, eps_high=4e-4)
    lp = logp.detach().clone().requires_grad_(True)
    n = m.sum(-1)
    s = torch.exp(torch.where(m, lp - logp_old, 0.0).sum(-1) / n.clamp(min=1))
    seq = torch.maximum(-a * s, -a * s.clamp(1 - 3e-4, 1 + 4e-4))
    want = seq[n > 0].mean()
    want.backward()
    torch.testing.assert_close(out.loss, want)
    torch.testing.assert_close(grad, lp.grad)
    assert 0 < out.metrics["clipfrac"] < 1  # the tiny range clips some sequences, not all


def test_gspo_on_policy_equals_grpo_and_all_clipped_has_no_gradient() -> None:
    logp, _, adv, m = inputs(4, 6, seed=8, per_row_adv=True)
    old = logp.detach().clone()
    out, grad = run("gspo", logp, old, adv, m, agg="seq-mean-token-mean", eps_low=3e-4, eps_high=4e-4)
    out2, grad2 = run("ppo-clip", logp, old, adv, m, agg="seq-mean-token-mean")
    torch.testing.assert_close(out.loss, out2.loss)
    torch.testing.assert_close(grad, grad2)
    assert out.metrics["ratio_mean"] == pytest.approx(1.0) and out.metrics["clipfrac"] == 0.0
    # every sequence far outside the range on its advantage's side: no gradient anywhere
    adv_sign = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    shifted = old + 0.5 * adv_sign[:, None]
    out, grad = run("gspo", shifted.clone().requires_grad_(True), old, adv_sign, torch.ones(4, 6, dtype=torch.bool),
                    eps_low=3e-4, eps_high=4e-4)
    assert out.metrics["clipfrac"] == pytest.approx(1.0)
    assert out.metrics["clipfrac_upper"] == pytest.approx(0.5) and out.metrics["clipfrac_lower"] == pytest.approx(0.5)


# ---------------------------------------------------------------- CISPO


@pytest.mark.parametrize("B,T", SHAPES)
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("bounds", [(0.0, 5.0), (0.8, 1.2)])
def test_cispo_matches_reference(B, T, agg, bounds) -> None:
    logp, logp_old, adv, m = inputs(B, T, seed=B * 7 + T)
    out, grad = run("cispo", logp, logp_old, adv, m, agg=agg, cispo_weight_min=bounds[0], cispo_weight_max=bounds[1])
    want, want_grad = ref.cispo(*lists(logp, logp_old, adv), m.int().tolist(), bounds[0], bounds[1], agg)
    assert out.loss.item() == pytest.approx(want, rel=1e-10, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor(want_grad, dtype=torch.float64))
    r = torch.exp(logp - logp_old).detach()
    n = max(int(m.sum()), 1)
    assert out.metrics["clipfrac_upper"] == pytest.approx(float((m & (r > bounds[1])).sum()) / n)
    assert out.metrics["clipfrac_lower"] == pytest.approx(float((m & (r < bounds[0])).sum()) / n)


def test_cispo_keeps_the_gradient_of_tokens_ppo_clips() -> None:
    # r = 1.5 with A > 0: ppo-clip (eps 0.2) drops the token; CISPO keeps it with weight min(r, cap)
    logp = torch.full((1, 2), math.log(1.5), dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 2, dtype=torch.float64)
    adv = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    _, g_ppo = run("ppo-clip", logp, old, adv, torch.ones(1, 2))
    assert torch.equal(g_ppo, torch.zeros(1, 2, dtype=torch.float64))
    out, g = run("cispo", logp, old, adv, torch.ones(1, 2), cispo_weight_max=1.2)
    torch.testing.assert_close(g, torch.tensor([[-1.2 * 1.0 / 2, -1.2 * 2.0 / 2]], dtype=torch.float64))
    assert out.metrics["clipfrac_upper"] == 1.0  # both weights truncated, both still learning
    # on-policy (r = 1) the gradient is PPO's: -A / N
    logp2, _, adv2, m2 = inputs(3, 4, seed=2)
    _, g1 = run("cispo", logp2, logp2.detach(), adv2, m2)
    _, g2 = run("ppo-clip", logp2, logp2.detach(), adv2, m2)
    torch.testing.assert_close(g1, g2)


def test_cispo_weight_bounds_are_absolute_and_validated() -> None:
    with pytest.raises(ValueError, match="cispo_weight"):
        LossParams(cispo_weight_max=0.2)  # a relative "eps_high = 0.2" would mean weight 0.2: refused
    with pytest.raises(ValueError, match="cispo_weight"):
        LossParams(cispo_weight_min=1.5)


# ---------------------------------------------------------------- covariance selection


@pytest.mark.parametrize("B,T", SHAPES)
def test_token_covariance_matches_reference(B, T) -> None:
    logp, _, adv, m = inputs(B, T, seed=B + 3 * T)
    got = token_covariance(logp, adv, m)
    torch.testing.assert_close(got, torch.tensor(ref.token_covariance(*lists(logp, adv), m.int().tolist()), dtype=torch.float64))
    assert not got.requires_grad
    assert torch.equal(token_covariance(logp, adv, torch.zeros(B, T)), torch.zeros(B, T, dtype=torch.float64))


def cov_inputs(seed: int = 5):
    # wide log-probs and advantages so that many tokens have Cov in (1, 5)
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(6, 10, generator=g, dtype=torch.float64) * 8
    logp = (logp_old + torch.randn(6, 10, generator=g, dtype=torch.float64) * 0.1).requires_grad_(True)
    adv = torch.randn(6, 10, generator=g, dtype=torch.float64) * 2
    return logp, logp_old, adv, prefix_mask(6, 10, seed=seed)


def test_clip_cov_extremes_match_reference() -> None:
    logp, logp_old, adv, m = cov_inputs()
    cand = ref.clip_cov_candidates(*lists(logp, logp_old, adv), m.int().tolist(), 0.2, 0.28, 1.0, 5.0)
    assert 3 <= len(cand) < int(m.sum())
    for ratio, selected in ((0.0, set()), (1.0, cand)):  # r = 0: nothing cut; r = 1: every candidate
        out, grad = run("clip-cov", logp, logp_old, adv, m, eps_high=0.28, cov_clip_ratio=ratio)
        want, want_grad = ref.clip_cov(*lists(logp, logp_old, adv), m.int().tolist(), 0.2, 0.28, selected, "token-mean")
        assert out.loss.item() == pytest.approx(want, rel=1e-10)
        torch.testing.assert_close(grad, torch.tensor(want_grad, dtype=torch.float64))
        assert out.metrics["cov_selected_frac"] == pytest.approx(len(selected) / int(m.sum()))
    out0, g0 = run("clip-cov", logp, logp_old, adv, m, eps_high=0.28, cov_clip_ratio=0.0)
    out1, g1 = run("ppo-clip", logp, logp_old, adv, m, eps_high=0.28)
    torch.testing.assert_close(out0.loss, out1.loss)
    torch.testing.assert_close(g0, g1)


def test_clip_cov_takes_its_authors_clip_ratios_1_1() -> None:
    # The authors run Clip-Cov with clip ratios 1 / 1 (their verl recipe: clip range [0, 2], the
    # covariance cut instead of PPO's clip). Measured: d loss / d logp of a token with r = 1.5,
    # A = +1, in a token-mean over 2 counted tokens (the other r = 1, A = +1); the covariance
    # draw is off (cov_clip_ratio = 0) so that only the clip range acts.
    logp_old = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    logp = (logp_old + torch.tensor([[math.log(1.5), 0.0]], dtype=torch.float64)).requires_grad_(True)
    adv, m = torch.ones(1, 2, dtype=torch.float64), torch.ones(1, 2)
    _, g_ppo = run("clip-cov", logp, logp_old, adv, m, cov_clip_ratio=0.0)  # eps 0.2 / 0.2: r = 1.5 > 1.2 is clipped
    assert g_ppo[0, 0].item() == 0.0
    out, g = run("clip-cov", logp, logp_old, adv, m, cov_clip_ratio=0.0, eps_low=1.0, eps_high=1.0)
    assert g[0, 0].item() == pytest.approx(-1.5 * 1.0 / 2)  # -r A / N = -0.75: inside [0, 2], not clipped
    assert out.metrics["clipfrac"] == 0.0
    # the upper bound 2 still clips (r = 2.5, A > 0); the lower bound 0 never does (r = e^-3, A < 0)
    far = (logp_old + torch.tensor([[math.log(2.5), -3.0]], dtype=torch.float64)).requires_grad_(True)
    out, g = run("clip-cov", far, logp_old, torch.tensor([[1.0, -1.0]], dtype=torch.float64), m, cov_clip_ratio=0.0, eps_low=1.0, eps_high=1.0)
    assert g[0, 0].item() == 0.0 and g[0, 1].item() == pytest.approx(math.exp(-3.0) / 2)
    assert (out.metrics["clipfrac_upper"], out.metrics["clipfrac_lower"]) == (0.5, 0.0)
    # and the row takes it (--policy-loss clip-cov --eps-low 1 --eps-high 1)
    spec = get_algo("grpo").replace(policy_loss="clip-cov", eps_low=1.0, eps_high=1.0)
    assert (spec.loss_params().eps_low, spec.loss_params().eps_high) == (1.0, 1.0)
    with pytest.raises(ValueError, match="eps_low"):
        LossParams(eps_low=1.5)

@pytest.mark.parametrize("scale,selected", [(1.0, 0), (2.0, 2), (5.0, 0)])
def test_clip_cov_window_is_strict(scale, selected) -> None:
    # Cov = (logp - mean) (A - mean) = (+-1) (+-scale) = scale exactly on both tokens (r = 1, no
    # PPO clip): on a bound (1 or 5) a token is no candidate (paper, verl: omega_low < Cov <
    # omega_high); inside (2) both are, and ratio 1 cuts both
    logp = torch.tensor([[0.0, -2.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[scale, -scale]], dtype=torch.float64)
    m = torch.ones(1, 2)
    assert token_covariance(logp, adv, m).tolist() == [[scale, scale]]
    out, g = run("clip-cov", logp, logp.detach().clone(), adv, m, cov_clip_ratio=1.0)
    assert out.metrics["cov_selected_frac"] == selected / 2
    assert int((g == 0).sum()) == selected
    assert len(ref.clip_cov_candidates(*lists(logp, logp, adv), m.int().tolist(), 0.2, 0.2, 1.0, 5.0)) == selected

def test_clip_cov_random_draw_is_reproducible_and_among_candidates() -> None:
    logp, logp_old, adv, m = cov_inputs()
    cand = ref.clip_cov_candidates(*lists(logp, logp_old, adv), m.int().tolist(), 0.2, 0.2, 1.0, 5.0)
    _, g_ppo = run("ppo-clip", logp, logp_old, adv, m)
    n = int(m.sum())

    def draw(seed: int):
        out, g = run("clip-cov", logp, logp_old, adv, m, cov_clip_ratio=0.1, generator=torch.Generator().manual_seed(seed))
        cut = {(i, t) for i, t in zip(*torch.nonzero((g == 0) & (g_ppo != 0), as_tuple=True))}
        return out, {(int(i), int(t)) for i, t in cut}

    out_a, cut_a = draw(1)
    out_b, cut_b = draw(1)
    assert cut_a == cut_b and out_a.loss.item() == out_b.loss.item()  # same generator seed, same draw
    draws = [draw(s)[1] for s in range(2, 12)]
    assert any(d != cut_a for d in draws)  # another seed, another draw
    for d in [cut_a, *draws]:
        assert d <= cand
        assert len(d) in (math.floor(0.1 * n), math.ceil(0.1 * n))
    assert out_a.metrics["cov_selected_frac"] == pytest.approx(len(cut_a) / n)


def test_cov_count_is_unbiased_whatever_the_micro_batch() -> None:
    # stochastic rounding: the expected number of selected tokens is ratio * N, so splitting a
    # batch into micro-batches does not change the selected fraction on average
    logp, logp_old, adv, m = cov_inputs(7)
    gen = torch.Generator().manual_seed(0)
    ratio = 0.03  # N ~ 30: ratio * N < 1, verl's max(1, floor) would select 1 token every time
    fracs = [run("kl-cov", logp, logp_old, adv, m, kl_cov_ratio=ratio, generator=gen)[0].metrics["cov_selected_frac"] for _ in range(600)]
    assert sum(fracs) / len(fracs) == pytest.approx(ratio, rel=0.15)


def test_cov_draws_without_a_generator_come_fresh_from_the_global_rng() -> None:
    # params.generator = None: every call draws anew from torch's global RNG (not one fixed
    # number), so a seeded run (torch.manual_seed) stays reproducible
    logp, logp_old, adv, m = cov_inputs(7)
    n = int(m.sum())
    with torch.random.fork_rng():
        def counts(seed: int) -> list[int]:
            torch.manual_seed(seed)  # ratio * N = 0.5: the count is 0 or 1, each with probability 1/2
            return [round(run("kl-cov", logp, logp_old, adv, m, kl_cov_ratio=0.5 / n)[0].metrics["cov_selected_frac"] * n) for _ in range(40)]

        first = counts(0)
        assert set(first) == {0, 1}
        assert counts(0) == first

        def cut(seed: int | None = None) -> list[list[bool]]:
            if seed is not None:
                torch.manual_seed(seed)
            return (run("clip-cov", logp, logp_old, adv, m, cov_clip_ratio=0.1)[1] == 0).tolist()

        draws = [cut() for _ in range(10)]
        assert any(d != draws[0] for d in draws)  # the token draw is fresh too
        assert cut(1) == cut(1)

def test_cov_selection_is_the_micro_batchs_and_the_doc_says_how_micro_batches_are_cut() -> None:
    # Cov is centred over the call's tokens: a micro-batch holding one prompt group (as
    # Learner.micro_batches may cut a mini-batch) has other Clip-Cov candidates than the whole
    # mini-batch has in the same rows (r = 1: no PPO clip; ratio 1: every candidate cut)
    logp = torch.tensor([[-0.5, -1.0, -3.0], [-2.0, -2.5, -4.0], [-6.0, -6.5, -7.0], [-5.0, -8.0, -9.0]], dtype=torch.float64)
    adv = torch.tensor([1.5, -0.5, 1.0, -2.0], dtype=torch.float64)  # groups: rows {0, 1}, {2, 3}
    m = torch.ones(4, 3)

    def cut(rows: slice) -> set[tuple[int, int]]:
        lp = logp[rows].clone().requires_grad_(True)
        _, g = run("clip-cov", lp, logp[rows], adv[rows], m[rows], cov_clip_ratio=1.0)
        return {(int(i), int(t)) for i, t in (g == 0).nonzero().tolist()}

    assert {x for x in cut(slice(0, 4)) if x[0] < 2} == {(0, 2)}
    assert cut(slice(0, 2)) == {(0, 0), (0, 1), (1, 2)}
    # the docstring describes the learner's arrangement, not uniform micro-batches, by a name the learner has
    from reasonrl.train import micro
    from reasonrl.train.learner import Learner

    doc = " ".join(POLICY_LOSSES["clip-cov"].__doc__.split())
    assert "Learner.micro_batches" in doc and "reasonrl.train.micro.plan" in doc and "(a uniform sample of the shuffled mini-batch)" not in doc
    assert callable(Learner.micro_batches) and callable(micro.plan)

@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_kl_cov_matches_reference(agg) -> None:
    logp, logp_old, adv, m = cov_inputs(9)
    n = int(m.sum())
    for count in (0, 3, n):
        out, grad = run("kl-cov", logp, logp_old, adv, m, agg=agg, kl_cov_ratio=count / n, kl_cov_coef=1.0)
        want, want_grad = ref.kl_cov(*lists(logp, logp_old, adv), m.int().tolist(), count, 1.0, agg)
        assert out.loss.item() == pytest.approx(want, rel=1e-10)
        torch.testing.assert_close(grad, torch.tensor(want_grad, dtype=torch.float64))
        assert out.metrics["cov_selected_frac"] == pytest.approx(count / n)
        assert out.metrics["clipfrac"] == 0.0  # no ratio clip at all


def test_kl_cov_penalty_is_silent_on_the_first_on_policy_update() -> None:
    logp, _, adv, m = cov_inputs(3)
    old = logp.detach().clone()
    _, g_kl = run("kl-cov", logp, old, adv, m, kl_cov_ratio=1.0, kl_cov_coef=1.0)
    _, g_pg = run("kl-cov", logp, old, adv, m, kl_cov_ratio=0.0)
    torch.testing.assert_close(g_kl, g_pg)  # |logp - logp_old| has zero subgradient at 0


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
def test_every_loss_handles_empty_masks_and_extreme_ratios(name) -> None:
    logp = torch.tensor([[0.0, -200.0], [-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-200.0, 0.0], [-1.0, -2.0]], dtype=torch.float64)
    adv = torch.tensor([[-1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
    out, grad = run(name, logp, old, adv, torch.tensor([[1, 1], [0, 0]]), cov_clip_ratio=1.0, kl_cov_ratio=1.0)
    assert math.isfinite(out.loss.item()) and all(math.isfinite(v) for v in out.metrics.values())
    assert torch.isfinite(grad).all() and (grad[1] == 0).all()  # the empty row gets no gradient
    out, grad = run(name, logp, old, adv, torch.zeros(2, 2), cov_clip_ratio=1.0, kl_cov_ratio=1.0)
    assert out.loss.item() == 0.0 and out.loss.requires_grad and torch.equal(grad, torch.zeros(2, 2, dtype=torch.float64))
    assert out.metrics["clipfrac"] == 0.0 and out.metrics["ratio_mean"] == 0.0
    assert set(out.metrics) >= {"pg_loss", "clipfrac", "clipfrac_upper", "clipfrac_lower", "approx_kl", "ratio_mean", "ratio_max"}
    assert out.ratio.shape == out.clip_upper.shape == out.clip_lower.shape == (2, 2)


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
@pytest.mark.parametrize("agg", list(AGG_MODES))
def test_micro_batches_with_the_mini_batch_denominator_sum_to_the_whole(name, agg) -> None:
    logp, logp_old, adv, m = inputs(6, 7, seed=11, spread=0.2)
    full = POLICY_LOSSES[name](logp, logp_old, adv, m, params=LossParams(cov_clip_ratio=0.0, kl_cov_ratio=0.0), agg=agg, max_len=9)
    denom = m.sum() if agg == "token-mean" else (m.sum(-1) > 0).sum()
    parts = sum(POLICY_LOSSES[name](logp[i : i + 2], logp_old[i : i + 2], adv[i : i + 2], m[i : i + 2], params=LossParams(cov_clip_ratio=0.0, kl_cov_ratio=0.0),
                                    agg=agg, max_len=9, denominator=denom).loss for i in range(0, 6, 2))
    torch.testing.assert_close(parts, full.loss)


def test_policy_loss_by_name_and_unknown_name() -> None:
    logp, logp_old, adv, m = inputs(2, 3, seed=1)
    out = policy_loss(logp, logp_old, adv, m, loss="cispo", cispo_weight_max=2.0)
    assert "clipfrac" in out.metrics
    with pytest.raises(ValueError, match="ppo-clip, gspo, cispo, clip-cov, kl-cov"):
        policy_loss(logp, logp_old, adv, m, loss="reinforce")


# ---------------------------------------------------------------- VAPO's positive-example NLL


def test_positive_example_nll_matches_reference_and_micro_batches_add_up() -> None:
    logp, _, _, m = inputs(6, 5, seed=12)
    correct = torch.tensor([True, False, True, True, False, False])
    loss, met = positive_example_nll(logp, m, correct)
    assert loss.item() == pytest.approx(ref.positive_example_nll(logp.tolist(), m.int().tolist(), correct.tolist()), rel=1e-12)
    assert met["nll_loss"] == pytest.approx(loss.item())
    loss.backward()
    full_grad = logp.grad.clone()
    n_correct = float((m & correct[:, None]).sum())
    assert torch.equal(full_grad != 0, m & correct[:, None])  # only correct responses' counted tokens
    torch.testing.assert_close(full_grad[full_grad != 0], torch.full((int(n_correct),), -1.0 / n_correct, dtype=torch.float64))
    # micro-batches of 2 with the mini-batch's correct-token count: the same loss and gradient
    logp.grad = None
    parts = sum(positive_example_nll(logp[i : i + 2], m[i : i + 2], correct[i : i + 2], denominator=n_correct)[0] for i in range(0, 6, 2))
    parts.backward()
    torch.testing.assert_close(parts, loss)
    torch.testing.assert_close(logp.grad, full_grad)


def test_positive_example_nll_without_correct_responses_is_zero() -> None:
    logp = torch.tensor([[-1.0, float("nan")]], requires_grad=True)
    for correct, den in ((torch.tensor([False]), None), (torch.tensor([True]), 0.0)):
        loss, met = positive_example_nll(logp, torch.tensor([[1, 0]]), correct if den is None else torch.tensor([False]), denominator=den)
        assert loss.item() == 0.0 and met["nll_loss"] == 0.0 and loss.requires_grad
        loss.backward()
        assert torch.equal(logp.grad, torch.zeros(1, 2))
        logp.grad = None
    with pytest.raises(ValueError, match="correct"):
        positive_example_nll(logp, torch.ones(1, 2), torch.tensor([True, False]))
