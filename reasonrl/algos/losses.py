"""Policy losses (a registry: ``POLICY_LOSSES``) and the clipped value loss.

Shapes: B responses, T token positions; per-token tensors are (B, T), ``mask`` (B, T) marks
counted tokens. Every policy loss has the same keyword signature (:class:`PolicyLoss`) and returns
a :class:`PolicyLossOutput`: the scalar loss, python-float metrics (computed without gradient,
one device sync per call), and the detached ratio and clip masks the trainer logs, so nothing is
recomputed. A new variant is one function here, one registry entry and one ``AlgoSpec`` row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

import torch
from torch import Tensor

from reasonrl.algos.aggregation import aggregate
from reasonrl.algos.masked import LOG_RATIO_CLAMP, as_bool_mask, masked_mean, masked_sum, pick
from reasonrl.algos.diagnostics import explained_variance

__all__ = ["LossParams", "PolicyLossOutput", "PolicyLoss", "POLICY_LOSSES", "ppo_clip_loss", "gspo_loss", "cispo_loss", "clip_cov_loss",
           "kl_cov_loss", "token_covariance", "positive_example_nll", "policy_loss", "value_loss"]


@dataclass(frozen=True)
class LossParams:
    """The knobs of every policy loss (each loss reads the ones it uses; ``AlgoSpec.loss_params``).

    ``eps_low`` / ``eps_high`` / ``dual_clip``: the PPO clip (ppo-clip, gspo, clip-cov); ``eps_low
    = 1`` puts the lower bound at 0, i.e. no lower clip (Clip-Cov's authors run 1 / 1).
    ``cispo_weight_min`` / ``cispo_weight_max``: CISPO's IS-weight bounds, **absolute** values of
    the weight (clamp(r, min, max)), never 1 ± eps (verl's "clip_ratio_high" is relative, TRL's
    "epsilon_high" absolute: these names say which). ``cov_clip_ratio`` / ``cov_clip_low`` /
    ``cov_clip_high``: Clip-Cov's r, omega_low, omega_high; ``kl_cov_ratio`` / ``kl_cov_coef``:
    KL-Cov's k and beta. ``generator``: the source of the covariance losses' random draws (the
    learner passes its seeded one; None: torch's global RNG, fresh draws on every call, which
    ``torch.manual_seed`` makes reproducible).
    """

    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    cispo_weight_min: float = 0.0
    cispo_weight_max: float = 5.0
    cov_clip_ratio: float = 2e-4
    cov_clip_low: float = 1.0
    cov_clip_high: float = 5.0
    kl_cov_ratio: float = 2e-3
    kl_cov_coef: float = 1.0
    generator: torch.Generator | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.eps_low <= 1 or self.eps_high < 0:
            raise ValueError(f"need 0 <= eps_low <= 1 (1: no lower clip) and eps_high >= 0, got {self.eps_low}, {self.eps_high}")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (or None), got {self.dual_clip}")
        if not 0.0 <= self.cispo_weight_min <= 1.0 <= self.cispo_weight_max:
            raise ValueError(f"need 0 <= cispo_weight_min <= 1 <= cispo_weight_max, got {self.cispo_weight_min}, {self.cispo_weight_max}")
        if not (0.0 <= self.cov_clip_ratio <= 1.0 and 0.0 <= self.kl_cov_ratio <= 1.0):
            raise ValueError(f"cov_clip_ratio and kl_cov_ratio are fractions of tokens in [0, 1], got {self.cov_clip_ratio}, {self.kl_cov_ratio}")
        if self.cov_clip_low > self.cov_clip_high:
            raise ValueError(f"need cov_clip_low <= cov_clip_high, got {self.cov_clip_low}, {self.cov_clip_high}")
        if self.kl_cov_coef < 0:
            raise ValueError(f"kl_cov_coef must be >= 0, got {self.kl_cov_coef}")


@dataclass
class PolicyLossOutput:
    """What a policy loss returns. ``ratio`` (B, T) is detached (the ratio the loss used: the
    sequence ratio for gspo); ``clip_upper`` / ``clip_lower`` (B, T) bool mark the counted tokens
    whose gradient the upper / lower clip cuts (cispo: whose IS weight the cap / floor truncates).
    Unpacks as ``loss, metrics = out``."""

    loss: Tensor
    metrics: dict[str, float]
    ratio: Tensor
    clip_upper: Tensor
    clip_lower: Tensor

    def __iter__(self) -> Iterator[object]:
        yield self.loss
        yield self.metrics


class PolicyLoss(Protocol):
    """The keyword signature every entry of ``POLICY_LOSSES`` has."""

    def __call__(self, logp: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor, *, params: LossParams, agg: str = ...,
                 max_len: int | None = ..., denominator: float | Tensor | None = ..., is_weights: Tensor | None = ...) -> PolicyLossOutput: ...


def _check_shapes(logp: Tensor, logp_old: Tensor, advantages: Tensor) -> Tensor:
    """Validate (B, T) shapes; returns the advantages as (B, T), detached, in logp's dtype."""
    if logp.dim() != 2 or logp_old.shape != logp.shape:
        raise ValueError(f"logp and logp_old must both be (B, T); got {tuple(logp.shape)}, {tuple(logp_old.shape)}")
    if advantages.dim() == 1:
        if advantages.shape[0] != logp.shape[0]:
            raise ValueError(f"advantages (B,) must have B={logp.shape[0]}, got {tuple(advantages.shape)}")
        advantages = advantages[:, None].expand_as(logp)
    elif advantages.shape != logp.shape:
        raise ValueError(f"advantages must be (B, T) or (B,), got {tuple(advantages.shape)}")
    return advantages.detach().to(logp.dtype)


@dataclass
class LossTerms:
    """A policy loss's per-token result, before importance weights and aggregation: ``loss_mat``
    (B, T) with grad; ``log_ratio`` (B, T) token log-ratio (for ``approx_kl``); ``ratio`` (B, T) the
    ratio the loss used; ``upper`` / ``lower`` (B, T) bool clip masks; ``counts``: more bool (B, T)
    masks, each reported as a share of counted tokens under its name."""

    loss_mat: Tensor
    log_ratio: Tensor
    ratio: Tensor
    upper: Tensor
    lower: Tensor
    counts: dict[str, Tensor] = field(default_factory=dict)


Formula = Callable[[Tensor, Tensor, Tensor, Tensor, LossParams], LossTerms]


def _registered(formula: Formula) -> PolicyLoss:
    """A ``POLICY_LOSSES`` entry (the one keyword signature) from ``formula(logp, logp_old, adv, m,
    params) -> LossTerms`` (adv (B, T) detached, m bool): shapes checked, then the terms weighted by
    ``is_weights``, aggregated with ``agg`` and measured. The entry keeps the formula's name and
    docstring."""

    def loss(logp: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor, *, params: LossParams, agg: str = "token-mean",
             max_len: int | None = None, denominator: float | Tensor | None = None, is_weights: Tensor | None = None) -> PolicyLossOutput:
        m = as_bool_mask(mask, logp)
        t = formula(logp, logp_old, _check_shapes(logp, logp_old, advantages), m, params)
        return _finish(t, m, agg=agg, max_len=max_len, denominator=denominator, is_weights=is_weights)

    loss.__name__, loss.__qualname__, loss.__doc__ = formula.__name__, formula.__qualname__, formula.__doc__
    return loss


def _finish(t: LossTerms, m: Tensor, *, agg: str, max_len: int | None, denominator: float | Tensor | None,
            is_weights: Tensor | None) -> PolicyLossOutput:
    """Weight (is_weights), aggregate, and compute the metrics every policy loss reports: ``pg_loss``,
    ``clipfrac_upper`` / ``clipfrac_lower`` / ``clipfrac`` (shares of counted tokens), ``approx_kl``
    (token-mean k3 of the token log-ratio), ``ratio_mean`` / ``ratio_max`` (of ``t.ratio``), and one
    share of counted tokens per entry of ``t.counts``. One device sync."""
    loss_mat = t.loss_mat if is_weights is None else t.loss_mat * is_weights.detach().to(t.loss_mat.dtype)
    loss = aggregate(loss_mat, m, agg, max_len=max_len, denominator=denominator)
    with torch.no_grad():
        r, lr = t.ratio.detach(), t.log_ratio.detach()
        if r.dtype in (torch.float16, torch.bfloat16):
            r, lr = r.float(), lr.float()
        n = m.sum().clamp(min=1).to(r.dtype)
        stats = [loss.detach().to(r.dtype), t.upper.sum() / n, t.lower.sum() / n, masked_mean(torch.expm1(lr) - lr, m),
                 masked_mean(r, m), torch.where(m, r, torch.zeros((), dtype=r.dtype, device=r.device)).amax() if r.numel() else n * 0]
        stats += [(m & c).sum() / n for c in t.counts.values()]
        names = ["pg_loss", "clipfrac_upper", "clipfrac_lower", "approx_kl", "ratio_mean", "ratio_max", *t.counts]
        vals = torch.stack([s.to(r.dtype) for s in stats]).tolist()
    metrics = dict(zip(names, vals))
    metrics["clipfrac"] = metrics["clipfrac_upper"] + metrics["clipfrac_lower"]
    return PolicyLossOutput(loss, metrics, r, t.upper, t.lower)


def _log_ratio(logp: Tensor, logp_old: Tensor) -> Tensor:
    return (logp - logp_old.detach().to(logp.dtype)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _clipped(ratio: Tensor, log_ratio: Tensor, adv: Tensor, m: Tensor, params: LossParams) -> LossTerms:
    """The clipped surrogate -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) (dual-clipped for A < 0
    when set), with the masks of the counted tokens whose gradient the clip cuts."""
    loss_mat = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - params.eps_low, 1.0 + params.eps_high))
    r = ratio.detach()
    t = LossTerms(loss_mat, log_ratio, ratio, m & (adv > 0) & (r > 1.0 + params.eps_high), m & (adv < 0) & (r < 1.0 - params.eps_low))
    if params.dual_clip is not None:
        cap = -params.dual_clip * adv
        neg = adv < 0
        t.counts["clipfrac_dual"] = neg & (loss_mat > cap)
        t.loss_mat = torch.where(neg, torch.minimum(loss_mat, cap), loss_mat)
    return t


@_registered
def ppo_clip_loss(logp: Tensor, logp_old: Tensor, adv: Tensor, m: Tensor, params: LossParams) -> LossTerms:
    """Clipped surrogate policy loss with decoupled clip range (DAPO "Clip-Higher", eq. 10).

        r_t   = exp(clamp(logp_t - logp_old_t, -20, 20))
        l_t   = -min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t)
        dual clip (c > 1, Ye et al. 2020), for A_t < 0 only:  l_t = min(l_t, -c * A_t)

    then aggregated with ``aggregate(l, mask, agg, max_len=..., denominator=...)``.
    PPO/GRPO use eps_low = eps_high = 0.2; DAPO eps_high = 0.28. With A > 0 the gradient vanishes
    once r > 1 + eps_high (a token of probability 0.01 can be pushed to 0.012 at most with
    eps_high = 0.2, to 0.0128 with 0.28); with A < 0 once r < 1 - eps_low; the dual clip also
    zeroes it once r > c for A < 0.

    Args (the keyword signature of every ``POLICY_LOSSES`` entry, :class:`PolicyLoss`):
        logp: (B, T) log-probs of the sampled tokens under the policy being trained (with grad).
        logp_old: (B, T) log-probs under the sampling policy (treated as constant).
        advantages: (B, T), or (B,) broadcast over T (treated as constant).
        mask: (B, T) counted tokens.
        params: ``eps_low``, ``eps_high`` (clip range [1 - eps_low, 1 + eps_high]) and
            ``dual_clip`` (c > 1, or None for no dual clip).
        agg, max_len, denominator: see :func:`reasonrl.algos.aggregation.aggregate` (default
            token-mean).
        is_weights: optional (B, T) importance weights (constant), multiplied onto each token's
            clipped loss before aggregation (rollout/trainer mismatch correction, e.g. truncated IS).

    Returns:
        :class:`PolicyLossOutput`: the loss, the ratio and the clip masks, and metrics (python floats; 0.0 when no token is counted):
        ``pg_loss``; ``clipfrac_upper`` share of counted tokens with A > 0 and r > 1 + eps_high
        (upper clip active: their gradient is cut); ``clipfrac_lower`` A < 0 and r < 1 - eps_low;
        ``clipfrac`` their sum; ``clipfrac_dual`` (only when dual_clip is set) A < 0 and the dual
        cap active; ``approx_kl`` token-mean of the k3 estimator of KL(pi_old || pi_theta),
        (r - 1) - log r, which is >= 0 and unbiased for samples from pi_old; ``ratio_mean``,
        ``ratio_max`` over counted tokens.
    """
    log_ratio = _log_ratio(logp, logp_old)
    return _clipped(torch.exp(log_ratio), log_ratio, adv, m, params)


@_registered
def gspo_loss(logp: Tensor, logp_old: Tensor, adv: Tensor, m: Tensor, params: LossParams) -> LossTerms:
    """GSPO, Group Sequence Policy Optimization (Zheng et al., Qwen, arXiv 2507.18071), in its
    GSPO-token form (as verl), which also takes per-token advantages.

        s_i     = (pi(y_i|x) / pi_old(y_i|x))^(1/|y_i|) = exp((1/|y_i|) sum_t M (logp - logp_old))
        s_i,t   = sg[s_i] * pi(y_i,t) / sg[pi(y_i,t)]         (value s_i; gradient through logp_i,t)
        l_i,t   = -min(s_i,t A_i,t, clip(s_i,t, 1 - eps_low, 1 + eps_high) A_i,t)   (+ dual clip if set)

    aggregated with ``agg``. GSPO's objective is (1/G) sum_i of the sequence term, i.e.
    ``seq-mean-token-mean`` (verl forces it; the ``gspo`` row sets it): with a per-response A_i
    every token of a response then has the same weight s_i A_i / |y_i|, and value, clipping and
    gradient equal sequence-level GSPO. Another ``agg`` (token-mean) weights responses by length,
    which is not GSPO (TRL warns about it). The paper's clip range is tiny, eps_low = 3e-4,
    eps_high = 4e-4 (ratios are geometric means); it clips far more tokens than GRPO yet learns
    faster, so a clipfrac near 0.1 is expected. With one mini-batch and one epoch s_i = 1 and
    GSPO equals GRPO with seq-mean aggregation; the paper splits each rollout batch into 4
    mini-batches. The mean log-ratio is clamped to [-20, 20] (verl: above at 10) on its
    stop-gradient part only, so the gradient is never cut by the clamp.

    Args: as :func:`ppo_clip_loss`; the lengths |y_i| are the rows' counted tokens (a row with
    none gets s_i = 1 and counts nowhere).

    Returns:
        :class:`PolicyLossOutput` with ``ratio`` = s_i broadcast to the row's tokens; the clip
        masks and ``clipfrac_*`` mark the tokens of clipped sequences (a token-weighted share of
        sequences, as verl); ``ratio_mean`` / ``ratio_max`` are of s_i over counted tokens;
        ``approx_kl`` is the token-level k3 as in :func:`ppo_clip_loss`.
    """
    log_ratio = _log_ratio(logp, logp_old)
    seq_log_ratio = masked_sum(log_ratio.detach(), m, dim=-1) / m.sum(-1).clamp(min=1).to(logp.dtype)  # (B,)
    ratio = torch.exp(logp - logp.detach() + seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)[:, None])
    return _clipped(ratio, log_ratio, adv, m, params)


@_registered
def cispo_loss(logp: Tensor, logp_old: Tensor, adv: Tensor, m: Tensor, params: LossParams) -> LossTerms:
    """CISPO, Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv 2506.13585).

        r_t  = exp(clamp(logp_t - logp_old_t, -20, 20))
        w_t  = sg[clamp(r_t, cispo_weight_min, cispo_weight_max)]
        l_t  = -w_t * A_t * logp_t

    aggregated with ``agg`` (the paper: token-mean over the batch). The IS weight is clipped and
    detached instead of the surrogate, so no token loses its gradient (w_t A_t grad logp_t):
    the rare high-ratio "fork" tokens that PPO's clip drops after the first update keep
    learning, with a bounded weight. At r = 1 the gradient equals PPO's. The bounds are absolute
    values of the weight (not 1 ± eps): the paper has no lower bound in practice (min 0) and
    tunes the cap; the default cap 5 is ScaleRL's (arXiv 2510.13786) as TRL documents it (verl's
    example script caps at 1.2 with its relative clip_ratio_high = 0.2). The loss value scales
    with log-probs (about the entropy): do not compare it with ppo-clip's pg_loss.

    Args: as :func:`ppo_clip_loss`; reads ``params.cispo_weight_min`` / ``cispo_weight_max``
    (eps_low, eps_high and dual_clip are not used).

    Returns:
        :class:`PolicyLossOutput`: ``clip_upper`` / ``clip_lower`` (and ``clipfrac_upper`` /
        ``clipfrac_lower``) mark the counted tokens whose weight the cap / floor truncated (any
        sign of A: their gradient is kept, scaled); other metrics as :func:`ppo_clip_loss`.
    """
    log_ratio = _log_ratio(logp, logp_old)
    ratio = torch.exp(log_ratio.detach())
    weight = ratio.clamp(params.cispo_weight_min, params.cispo_weight_max)
    return LossTerms(-weight * adv * logp, log_ratio, ratio, m & (ratio > params.cispo_weight_max), m & (ratio < params.cispo_weight_min))


def token_covariance(logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Per-token centred covariance of log-prob and advantage (Cui et al., "The Entropy Mechanism
    of Reinforcement Learning for Reasoning Language Models", arXiv 2505.22617, Clip-Cov / KL-Cov):

        Cov_t = (logp_t - (1/N) sum_j logp_j) * (A_t - (1/N) sum_j A_j)

    over the N counted tokens of the batch (a product per token, not a mean). Large positive
    Cov marks confident tokens pushed further up (or unlikely ones pushed down): the updates
    that drain entropy.

    Args:
        logp: (B, T) log-probs (detached here). advantages: (B, T) or (B,). mask: (B, T).

    Returns:
        (B, T) detached; 0 outside the mask (and everywhere when nothing is counted).
    """
    with torch.no_grad():
        lp = logp.detach()
        adv = _check_shapes(lp, lp, advantages)
        m = as_bool_mask(mask, lp)
        cov = (lp - masked_mean(lp, m)) * (adv - masked_mean(adv, m))
        return torch.where(m, cov, torch.zeros((), dtype=cov.dtype, device=cov.device))


def _cov_count(ratio: float, m: Tensor, params: LossParams) -> tuple[int, torch.Generator | None]:
    """floor(ratio * N + u), u ~ U[0, 1) from ``params.generator`` (None: torch's global RNG), and
    the generator: stochastic rounding, so the expected count is ratio * N whatever the micro-batch
    size (verl's max(floor(ratio * N), 1) selects at least one token per micro-batch)."""
    gen = params.generator
    return int(math.floor(ratio * int(m.sum()) + float(torch.rand((), generator=gen)))), gen


def _as_mask(flat_idx: Tensor, m: Tensor) -> Tensor:
    return torch.zeros(m.numel(), dtype=torch.bool, device=m.device).index_fill_(0, flat_idx.to(m.device), True).view_as(m)


@_registered
def clip_cov_loss(logp: Tensor, logp_old: Tensor, adv: Tensor, m: Tensor, params: LossParams) -> LossTerms:
    """Clip-Cov (Cui et al., arXiv 2505.22617): the clipped surrogate of :func:`ppo_clip_loss`,
    with the gradient of a few high-covariance tokens cut.

        Cov_t     = token_covariance(logp, A, M)            (current log-probs, detached)
        candidates: counted tokens with omega_low < Cov_t < omega_high (strict, as the paper and verl), not already cut by the PPO clip
        I_clip    = floor(r * N + u) of them drawn uniformly at random (N = counted tokens)
        l_t       = 0 (no gradient) for t in I_clip, the clipped surrogate otherwise

    aggregated with ``agg``; the selected tokens still count in the denominator (as verl). Paper
    defaults r = 2e-4, omega = (1, 5) (``cov_clip_ratio``, ``cov_clip_low``, ``cov_clip_high``).
    The authors' recipes (verl) set the clip ratios to 1 / 1, ``eps_low = eps_high = 1``: the
    range [0, 2], so the covariance cut all but replaces PPO's clip (only r > 2 with A > 0 is
    clipped); with the row's 0.2 a token with r = 1.5, A > 0 has no gradient, with 1 / 1 it keeps it.
    The draw uses ``params.generator`` (None: torch's global RNG) and is made over the
    tokens of this call: the learner calls the loss per micro-batch (as verl), because the
    covariance needs the current log-probs, which exist only inside that micro-batch's forward
    (a mini-batch-wide selection would need a second forward, or pi_old instead of pi). The
    count is stochastically rounded so that its expectation, r * N, does not depend on the
    micro-batch size. The centring means and the candidates are the micro-batch's, and a
    micro-batch is not a uniform sample of the mini-batch: the learner (``Learner.micro_batches``:
    ``reasonrl.train.micro.plan``) cuts the mini-batch in one of two orders, by prompt group (a
    group's responses together) or by response length (longest first), whichever runs fewer tokens
    (every ``--micro-batch-size`` rows, or to ``--max-tokens-per-micro-batch``). So Cov_t is
    measured against the few groups (whose group-relative advantages then centre near 0) or the
    similar-length responses of its micro-batch, and the tokens cut are drawn among that
    micro-batch's candidates, not the mini-batch's (the two coincide only when a mini-batch is one
    micro-batch). KL-Cov's top-k is per micro-batch alike. The selection acts from the first,
    on-policy update on.

    Returns:
        :class:`PolicyLossOutput` as :func:`ppo_clip_loss`, plus metric ``cov_selected_frac``
        (share of counted tokens whose gradient the covariance selection cut; ``clipfrac`` stays
        the PPO clip's, unlike verl which overwrites it).
    """
    log_ratio = _log_ratio(logp, logp_old)
    t = _clipped(torch.exp(log_ratio), log_ratio, adv, m, params)
    cov = token_covariance(logp, adv, m)
    cand = m & ~t.upper & ~t.lower & ~t.counts.get("clipfrac_dual", torch.zeros_like(m))
    cand &= (cov > params.cov_clip_low) & (cov < params.cov_clip_high)
    count, gen = _cov_count(params.cov_clip_ratio, m, params)
    idx = cand.flatten().nonzero().squeeze(1)
    selected = _as_mask(idx[torch.randperm(idx.numel(), generator=gen)[:count].to(idx.device)], m)
    t.loss_mat = torch.where(selected, torch.zeros((), dtype=t.loss_mat.dtype, device=m.device), t.loss_mat)
    t.counts["cov_selected_frac"] = selected
    return t


@_registered
def kl_cov_loss(logp: Tensor, logp_old: Tensor, adv: Tensor, m: Tensor, params: LossParams) -> LossTerms:
    """KL-Cov (Cui et al., arXiv 2505.22617): the unclipped surrogate, plus a KL penalty on the
    tokens of largest covariance.

        Cov_t = token_covariance(logp, A, M)
        I_KL  = the floor(k * N + u) counted tokens with the largest Cov_t
        l_t   = -r_t A_t + beta * |logp_t - logp_old_t|   for t in I_KL
        l_t   = -r_t A_t                                  otherwise (no ratio clip)

    aggregated with ``agg``. Paper defaults: beta = 1 (``kl_cov_coef``), k = 2e-3 for
    Qwen2.5-7B, 2e-4 for 32B (``kl_cov_ratio``, a plain fraction: the authors' fork read 0.2 as
    a percentage). Selection per call (micro-batch) with a stochastically rounded count, as
    :func:`clip_cov_loss`. On-policy caveat: on the first update of a step logp = logp_old, and
    |x| has zero (sub)gradient at 0 in PyTorch, so the penalty does nothing there (up to
    floating-point noise between the old-log-prob pass and the update, whose sign it then
    follows); it acts on later mini-batches and epochs. ``eps_low`` / ``eps_high`` are unused.

    Returns:
        :class:`PolicyLossOutput`: no clip (masks all False, ``clipfrac_*`` 0), plus metric
        ``cov_selected_frac`` (share of counted tokens penalised).
    """
    log_ratio = _log_ratio(logp, logp_old)
    ratio = torch.exp(log_ratio)
    cov = token_covariance(logp, adv, m)
    count, _ = _cov_count(params.kl_cov_ratio, m, params)
    score = torch.where(m, cov, torch.full((), -math.inf, dtype=cov.dtype, device=cov.device)).flatten()
    selected = _as_mask(torch.topk(score, count).indices, m)  # count <= the counted tokens (ratio <= 1)
    penalty = torch.where(selected, params.kl_cov_coef * log_ratio.abs(), torch.zeros((), dtype=ratio.dtype, device=m.device))
    none = torch.zeros_like(m)
    return LossTerms(-adv * ratio + penalty, log_ratio, ratio, none, none, {"cov_selected_frac": selected})


POLICY_LOSSES: dict[str, PolicyLoss] = {
    "ppo-clip": ppo_clip_loss,
    "gspo": gspo_loss,
    "cispo": cispo_loss,
    "clip-cov": clip_cov_loss,
    "kl-cov": kl_cov_loss,
}
"""name → policy loss (``AlgoSpec.policy_loss``; ``--policy-loss``)."""


def positive_example_nll(logp: Tensor, mask: Tensor, correct: Tensor, *, denominator: float | Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """VAPO's positive-example LM loss (self-imitation; arXiv 2504.05118, §4.3): the negative
    log-likelihood of the correct responses' tokens, token-mean over those tokens.

        L_NLL = -(1 / D) sum_{i in T} sum_t M_i,t logp_i,t,    T = {i : correct_i}
        D     = sum_{i in T} |o_i|    (default: this call's count)

    added to the policy loss as mu * L_NLL (VAPO: mu = 0.1). For gradient accumulation pass D =
    the correct-response tokens of the whole mini-batch (over all processes): the sum of the
    micro-batch terms is then exactly the mini-batch's L_NLL, whatever the micro-batch size
    (NeMo-RL normalises per micro-batch, which scales mu with the number of micro-batches). No
    correct response (D = 0) gives 0, connected to the graph (zero gradient), never nan.

    Args:
        logp: (B, T) log-probs of the sampled tokens (with grad). mask: (B, T) counted tokens.
        correct: (B,) bool, the responses that count as positive examples.
        denominator: D, or None for this call's correct-token count.

    Returns:
        (loss, metrics) with ``nll_loss`` (the loss value).
    """
    if logp.dim() != 2 or correct.shape != logp.shape[:1]:
        raise ValueError(f"logp must be (B, T) and correct (B,); got {tuple(logp.shape)}, {tuple(correct.shape)}")
    m = as_bool_mask(mask, logp) & as_bool_mask(correct, logp[:, 0])[:, None]
    total = -masked_sum(logp, m)
    d = m.sum() if denominator is None else denominator
    loss = total / d if float(d) > 0 else total * 0.0
    return loss, {"nll_loss": float(loss.detach())}


def policy_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss: str = "ppo-clip",
    agg: str = "token-mean",
    max_len: int | None = None,
    denominator: float | Tensor | None = None,
    is_weights: Tensor | None = None,
    **params: float | None,
) -> PolicyLossOutput:
    """The policy loss ``loss`` (a key of ``POLICY_LOSSES``) with ``LossParams(**params)``.

    Raises:
        ValueError: unknown loss (the message names the valid ones) or bad parameters.
    """
    fn = pick(POLICY_LOSSES, loss, "policy loss")
    return fn(logp, logp_old, advantages, mask, params=LossParams(**params), agg=agg, max_len=max_len, denominator=denominator,
              is_weights=is_weights)


def value_loss(
    values: Tensor,
    values_old: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None = None,
    agg: str = "token-mean",
    max_len: int | None = None,
    denominator: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped value loss (PPO; SPEC "Value loss").

        l_t = 0.5 * max((V_t - G_t)^2, (clip(V_t, V_old_t - clip, V_old_t + clip) - G_t)^2)
        l_t = 0.5 * (V_t - G_t)^2                                       (clip=None)

    aggregated like the policy loss (``aggregate(l, mask, agg, ...)``, default token-mean).

    Args:
        values: (B, T) current critic values (with grad).
        values_old: (B, T) critic values at rollout time (constant).
        returns: (B, T) targets G (constant), e.g. from :func:`decoupled_gae`.
        mask: (B, T) counted tokens.
        clip: eps_v > 0, or None for the plain MSE.

    Returns:
        (loss, metrics) with ``vf_loss``; ``vf_clipfrac`` share of counted tokens where the clipped
        term is the larger one (0.0 with clip=None); ``value_mean`` and ``returns_mean`` (masked
        token means); ``explained_variance`` of the returns by the values
        (:func:`reasonrl.algos.diagnostics.explained_variance`).
    """
    if values.dim() != 2 or values_old.shape != values.shape or returns.shape != values.shape:
        raise ValueError(
            "values, values_old and returns must all be (B, T); got "
            f"{tuple(values.shape)}, {tuple(values_old.shape)}, {tuple(returns.shape)}"
        )
    if clip is not None and clip <= 0:
        raise ValueError(f"value clip must be > 0 (or None), got {clip}")
    m = as_bool_mask(mask, values)
    g = returns.detach().to(values.dtype)
    unclipped = (values - g) ** 2
    if clip is None:
        loss_mat = 0.5 * unclipped
        clipped_active = torch.zeros_like(m)
    else:
        v_old = values_old.detach().to(values.dtype)
        v_clipped = v_old + (values - v_old).clamp(-clip, clip)
        clipped = (v_clipped - g) ** 2
        loss_mat = 0.5 * torch.maximum(unclipped, clipped)
        clipped_active = clipped.detach() > unclipped.detach()
    loss = aggregate(loss_mat, m, agg, max_len=max_len, denominator=denominator)
    with torch.no_grad():
        v = values.detach()
        if v.dtype in (torch.float16, torch.bfloat16):
            v, g = v.float(), g.float()
        n = m.sum().clamp(min=1).to(v.dtype)
        vals = torch.stack(
            [loss.detach().to(v.dtype), (m & clipped_active).sum() / n, masked_mean(v, m), masked_mean(g, m)]
        ).tolist()
    metrics = dict(zip(["vf_loss", "vf_clipfrac", "value_mean", "returns_mean"], vals))
    metrics["explained_variance"] = explained_variance(v, g, m)
    return loss, metrics
