"""Off-policy corrections: the rollout-correction family (a registry: ``ROLLOUT_CORRECTIONS``), the
decoupled and bypass modes, and the diagnostics of the gap between the behaviour policy and π_old.

Three policies meet in a step. The behaviour policy π_b sampled the tokens (the engine, in its own
precision and kernels; with partial rollouts a response's first tokens were sampled by older
weights, so π_b is per token). The proximal policy π_old is the trainer's before this step's updates
(the old log-probs). The current policy π_θ is the one the loss differentiates.

* **decoupled** (verl's default mode, AReaL's decoupled PPO): the PPO ratio is π_θ / π_old, and the
  gap π_b → π_old is corrected by a constant weight per token made from ρ_t = π_old(y_t) / π_b(y_t),
  the estimator below, multiplying the clipped per-token loss (``is_weights`` of every
  ``POLICY_LOSSES`` entry).
* **bypass** (verl's ``bypass_old_logprob_for_rollout``): π_old := π_b. The PPO ratio is
  π_θ / π_b and its clip bounds the step from the behaviour policy itself; no weight is applied
  (ρ ≡ 1 by construction). verl's doc calls using the trainer's π_old as the anchor while ignoring
  π_b "a critical implementation mistake": either mode avoids it.

Every estimator has one keyword signature (:class:`CorrectionFn`): ``(log_ratio, mask, *, cap, low)``
with ``log_ratio`` (B, T) = log π_old − log π_b of the sampled tokens, ``mask`` (B, T) bool the
tokens that count, ``cap`` the upper threshold C and ``low`` the lower one; it returns a
:class:`Correction`: weights (B, T), constants, 1 off the mask; the counted tokens it rejected
(weight 0) and those whose weight it truncated at C. Ratios are bounded before ``exp``: log-ratios
are clamped at +20 (ρ ≤ 4.9e8; below, ``exp`` only underflows to 0), so a gap of ±100 gives finite
weights, never ``inf`` and never ``0 · inf = nan`` through a mask.

A rejected token keeps weight 0 and stays in the loss's denominator (TRL's choice: the batch's
normalisation does not depend on the estimator; verl and slime take it out of the denominator).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from reasonrl.algos.masked import LOG_RATIO_CLAMP, as_bool_mask, masked_mean, pick

__all__ = ["Correction", "CorrectionFn", "ROLLOUT_CORRECTIONS", "CORRECTION_DEFAULTS", "CORRECTION_LEVELS", "CORRECTION_MODES",
           "correction_bounds", "proximal_logp", "rollout_correction", "offpolicy_diagnostics", "token_tis", "sequence_tis", "token_mask", "sequence_mask", "geo_rs", "icepop"]

CORRECTION_MODES = ("decoupled", "bypass")
"""How π_old relates to the behaviour policy: decoupled (three policies, weights ρ = π_old / π_b) or
bypass (π_old := π_b, no weight)."""


@dataclass
class Correction:
    """An estimator's output: ``weights`` (B, T) constants (1.0 off the mask, 0.0 on rejected
    tokens); ``rejected`` (B, T) bool, counted tokens given weight 0 by the estimator's band;
    ``truncated`` (B, T) bool, counted tokens whose ratio exceeded the cap and was set to it."""

    weights: Tensor
    rejected: Tensor
    truncated: Tensor


class CorrectionFn(Protocol):
    """The keyword signature of every ``ROLLOUT_CORRECTIONS`` entry."""

    def __call__(self, log_ratio: Tensor, mask: Tensor, *, cap: float, low: float) -> Correction: ...


def _ratio(log_ratio: Tensor) -> Tensor:
    return torch.exp(log_ratio.clamp(max=LOG_RATIO_CLAMP))


def _seq_log_ratio(log_ratio: Tensor, m: Tensor) -> Tensor:
    """(B, 1): the log of the product of a response's counted token ratios."""
    return torch.where(m, log_ratio, torch.zeros_like(log_ratio)).sum(-1, keepdim=True)


def _out(w: Tensor, m: Tensor, rejected: Tensor, truncated: Tensor) -> Correction:
    w = torch.where(m, w, torch.ones_like(w))
    return Correction(w, m & rejected, m & truncated)


def _no(x: Tensor) -> Tensor:
    return torch.zeros_like(x, dtype=torch.bool)


def token_tis(log_ratio: Tensor, mask: Tensor, *, cap: float, low: float = 0.0) -> Correction:
    """Token-level truncated IS (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
    Off-Policy RL Training"; verl's ``token_is``; TRL's ``token_truncate``):

        w_t = min(ρ_t, C)          (``low`` unused)
    """
    m = as_bool_mask(mask, log_ratio)
    d = log_ratio.masked_fill(~m, 0.0)
    r = _ratio(d)
    return _out(r.clamp(max=cap), m, _no(d), torch.exp(d) > cap)


def sequence_tis(log_ratio: Tensor, mask: Tensor, *, cap: float, low: float = 0.0) -> Correction:
    """Sequence-level truncated IS (verl's ``seq_is``; TRL's ``sequence_truncate``): one weight per
    response, on all its tokens,

        w_t = min(prod_{s in o} ρ_s, C)          (``low`` unused)
    """
    m = as_bool_mask(mask, log_ratio)
    d = log_ratio.masked_fill(~m, 0.0)
    seq = _seq_log_ratio(d, m)
    w = _ratio(seq).clamp(max=cap).expand_as(d)
    return _out(w, m, _no(d), (torch.exp(seq) > cap).expand_as(d))


def token_mask(log_ratio: Tensor, mask: Tensor, *, cap: float, low: float = 0.0) -> Correction:
    """Token-level masked IS (TRL's ``token_mask``; verl's token rejection sampling with IS weights):
    the ratio is kept as the weight inside the band, the token rejected outside it,

        w_t = ρ_t if low <= ρ_t <= C else 0          (TRL: low = 0)
    """
    m = as_bool_mask(mask, log_ratio)
    d = log_ratio.masked_fill(~m, 0.0)
    r = _ratio(d)
    out = (r > cap) | (r < low)
    return _out(torch.where(out, torch.zeros_like(r), r), m, out, _no(d))


def sequence_mask(log_ratio: Tensor, mask: Tensor, *, cap: float, low: float = 0.0) -> Correction:
    """Sequence-level masked IS, MIS (Liu, Li et al. 2025, "When Speed Kills Stability"; verl's
    ``seq_mis``; TRL's ``sequence_mask``, its default with C = 3): a response whose ratio leaves the
    band is rejected whole, the others weighted by their ratio,

        ρ_o = prod_{s in o} ρ_s;   w_t = ρ_o if low <= ρ_o <= C else 0   for every t of o
    """
    m = as_bool_mask(mask, log_ratio)
    d = log_ratio.masked_fill(~m, 0.0)
    r = _ratio(_seq_log_ratio(d, m))
    out = ((r > cap) | (r < low)).expand_as(d)
    return _out(torch.where(out, torch.zeros_like(d), r.expand_as(d)), m, out, _no(d))


def geo_rs(log_ratio: Tensor, mask: Tensor, *, cap: float, low: float) -> Correction:
    """Geometric-mean rejection sampling, Geo-RS (verl's ``geo_rs`` preset, ``rollout_rs:
    geometric``): a response is kept, with weight 1, when the geometric mean of its token ratios is
    inside the band, else rejected whole (no IS weight; verl: C = 1.001, low = 0.999),

        g_o = exp(mean_{s in o} log ρ_s);   w_t = 1 if low <= g_o <= C else 0   for every t of o
    """
    m = as_bool_mask(mask, log_ratio)
    d = log_ratio.masked_fill(~m, 0.0)
    n = m.sum(-1, keepdim=True).clamp(min=1).to(d.dtype)
    g = _ratio(_seq_log_ratio(d, m) / n)
    out = ((g > cap) | (g < low)).expand_as(d)
    return _out(torch.where(out, torch.zeros_like(d), torch.ones_like(d)), m, out, _no(d))


def icepop(log_ratio: Tensor, mask: Tensor, *, cap: float, low: float) -> Correction:
    """IcePop (the Ling team's Ring-1T report, "Every Step Evolves", 2025): a token's gradient is
    kept, weighted by its ratio, only inside the band [α, β] = [low, C] (the paper: [0.5, 5]),

        w_t = ρ_t if α <= ρ_t <= β else 0

    (the same rule as ``token-mask`` with a lower bound; its own entry for its band's defaults).
    """
    return token_mask(log_ratio, mask, cap=cap, low=low)


ROLLOUT_CORRECTIONS: dict[str, CorrectionFn] = {
    "token-tis": token_tis,
    "sequence-tis": sequence_tis,
    "token-mask": token_mask,
    "sequence-mask": sequence_mask,
    "geo-rs": geo_rs,
    "icepop": icepop,
}
"""name → estimator (the one keyword signature of :class:`CorrectionFn`)."""

CORRECTION_DEFAULTS: dict[str, tuple[float, float]] = {
    "token-tis": (2.0, 0.0),  # Yao et al.'s C = 2 (verl's rollout_is_threshold default)
    "sequence-tis": (2.0, 0.0),  # verl's seq_is threshold
    "token-mask": (3.0, 0.0),  # TRL's vllm_importance_sampling_cap
    "sequence-mask": (3.0, 0.0),  # TRL's default mode and cap
    "geo-rs": (1.001, 0.999),  # verl's geo_rs preset
    "icepop": (5.0, 0.5),  # the IcePop band
}
"""name → (cap C, low) when the run gives none."""

CORRECTION_LEVELS: dict[str, str] = {"token-tis": "token", "sequence-tis": "sequence", "token-mask": "token", "sequence-mask": "sequence",
                                     "geo-rs": "sequence", "icepop": "token"}
"""name → "token" (one weight per token) or "sequence" (one per response)."""


def proximal_logp(logp_old: Tensor, logp_behaviour: Tensor, *, mode: str) -> Tensor:
    """The anchor of the PPO ratio π_θ / π_anchor (the ``logp_old`` every ``POLICY_LOSSES`` entry
    takes): π_old in decoupled mode (the behaviour → π_old gap is then the correction's weight),
    the behaviour policy's log-probs in bypass mode (π_old := π_b, no weight)."""
    if mode not in CORRECTION_MODES:
        raise ValueError(f"unknown correction mode '{mode}'; valid: {', '.join(CORRECTION_MODES)}")
    return logp_behaviour.detach() if mode == "bypass" else logp_old


def correction_bounds(name: str, cap: float | None = None, low: float | None = None) -> tuple[float, float]:
    """(C, low) for estimator ``name``: the given ones, else its defaults."""
    dc, dl = pick(CORRECTION_DEFAULTS, name, "rollout correction")
    return (dc if cap is None else cap), (dl if low is None else low)


@torch.no_grad()
def rollout_correction(logp_old: Tensor, logp_behaviour: Tensor, mask: Tensor, *, name: str, cap: float | None = None,
                       low: float | None = None, scope: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """The weights of estimator ``name`` for ρ = π_old / π_b, constant (no gradient), and their metrics.

    Args:
        logp_old, logp_behaviour: (B, T) log-probs of the sampled tokens under π_old and under the
            policy that sampled them; ``mask`` (B, T) the counted tokens.
        cap, low: the band (None: the estimator's ``CORRECTION_DEFAULTS``).
        scope: (B, T) bool, the tokens the correction applies to (None: all): weights are 1
            elsewhere. A sequence-level estimator applies to every token of a response that holds
            one token in scope (its ratio is the response's).

    Returns (B, T) weights (in the inputs' dtype; 1.0 off the mask and off the scope) and, over
    the counted tokens in scope, ``weight_mean``, ``masked_frac`` (rejected: weight 0) and
    ``truncated_frac`` (ratio above C, set to C); ``scope_frac``: the share of counted tokens in scope.

    Raises:
        ValueError: an unknown estimator, cap <= 0, low < 0 or low > cap, or shapes that differ.
    """
    fn = pick(ROLLOUT_CORRECTIONS, name, "rollout correction")
    cap, low = correction_bounds(name, cap, low)
    if cap <= 0 or low < 0 or low > cap:
        raise ValueError(f"rollout correction '{name}' needs 0 <= low <= cap and cap > 0, got low {low}, cap {cap}")
    if logp_old.shape != logp_behaviour.shape or logp_old.dim() != 2:
        raise ValueError(f"logp_old and logp_behaviour must both be (B, T); got {tuple(logp_old.shape)}, {tuple(logp_behaviour.shape)}")
    m = as_bool_mask(mask, logp_old)
    c = fn(logp_old - logp_behaviour, m, cap=cap, low=low)
    w, rejected, truncated = c.weights, c.rejected, c.truncated
    if scope is not None:
        s = as_bool_mask(scope, logp_old) & m
        if CORRECTION_LEVELS[name] == "sequence":
            s = s.any(-1, keepdim=True).expand_as(m) & m
        w = torch.where(s, w, torch.ones_like(w))
        rejected, truncated, m_in = rejected & s, truncated & s, s
    else:
        m_in = m
    stats = torch.stack([masked_mean(w, m_in).double(), masked_mean(rejected.double(), m_in), masked_mean(truncated.double(), m_in),
                         masked_mean(m_in.double(), m)]).tolist()
    return w, dict(zip(["weight_mean", "masked_frac", "truncated_frac", "scope_frac"], stats))


@torch.no_grad()
def offpolicy_diagnostics(logp_old: Tensor, logp_behaviour: Tensor, mask: Tensor) -> dict[str, float]:
    """How far the behaviour policy π_b is from π_old on the batch's counted tokens (fp64).

    With d_t = log π_old(y_t) − log π_b(y_t), ρ_t = exp(min(d_t, 20)), D_o = sum_{t in o} d_t and
    ρ_o = exp(min(D_o, 20)) (responses with a counted token):

        k1       = mean_t (−d_t)                  KL(π_b ‖ π_old), unbiased, may be < 0 (verl's ``kl``)
        k3       = mean_t (ρ_t − 1 − d_t)         KL(π_b ‖ π_old), >= 0 (verl's ``k3_kl``)
        k1_seq   = mean_o (−D_o)                  the same per response (sum over its tokens)
        k3_seq   = mean_o (ρ_o − 1 − D_o)
        chi2     = mean_t ρ_t² − 1                χ²(π_old ‖ π_b), the IS weights' second moment (verl's ``chi2_token``)
        chi2_seq = mean_o ρ_o² − 1                (verl's ``chi2_seq``)
        ratio_max = max_t ρ_t
        mult_prob_error = mean_t exp(min(|d_t|, 20))   NeMo-RL's ``token_mult_prob_error`` (1 when equal)

    Bounded exponents keep every value finite at any gap. Also ``tokens`` and ``sequences``, the
    counts the means are over (to combine processes). All 0.0 (counts 0) when nothing counts.
    """
    m = as_bool_mask(mask, logp_old)
    names = ["k1", "k3", "k1_seq", "k3_seq", "chi2", "chi2_seq", "ratio_max", "mult_prob_error", "tokens", "sequences"]
    if not bool(m.any()):
        return dict.fromkeys(names, 0.0)
    d = (logp_old.double() - logp_behaviour.double()).masked_fill(~m, 0.0)
    dc = d.clamp(max=LOG_RATIO_CLAMP)
    r = torch.exp(dc)
    rows = m.any(-1)
    D = d.sum(-1)[rows]
    Dc = D.clamp(max=LOG_RATIO_CLAMP)
    R = torch.exp(Dc)
    vals = torch.stack([masked_mean(-d, m), masked_mean(r - 1 - dc, m), (-D).mean(), (R - 1 - Dc).mean(), masked_mean(r * r, m) - 1,
                        (R * R).mean() - 1, torch.where(m, r, torch.zeros_like(r)).max(), masked_mean(torch.exp(d.abs().clamp(max=LOG_RATIO_CLAMP)), m),
                        m.sum().double(), rows.sum().double()]).tolist()
    return dict(zip(names, vals))
