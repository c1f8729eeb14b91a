"""Advantage estimators: GRPO group-relative advantages, GAE, decoupled GAE (VC-PPO), VAPO's
length-adaptive lambda, and the ``ADVANTAGE_ESTIMATORS`` registry behind ``AlgoSpec.advantage``
(each entry takes one :class:`AdvantageInputs`).

Shapes: B responses (rows), T token positions; ``mask`` (B, T) is 1 on a row's valid response
tokens (a prefix of the row). Every output is 0 outside the mask. Advantage estimation is
bookkeeping on rollout data: the functions here run under ``torch.no_grad()`` and return tensors
without gradient (they are targets, never differentiated through).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from reasonrl.algos.masked import as_bool_mask, pick

GROUP_STD_EPS = 1e-6
"""GRPO's epsilon added to the group std (A = (R - mean) / (std + eps))."""

VAPO_ALPHA = 0.05
"""VAPO's alpha of the length-adaptive lambda (``adaptive_lambda``): lam = 0.95 at 400 tokens, 0.99 at 2000."""


def _float_dtype(*xs: Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32 (bf16/fp16 inputs are computed in fp32)."""
    return torch.float64 if any(x.dtype == torch.float64 for x in xs) else torch.float32


def _check_bt(name: str, x: Tensor, ref: Tensor) -> None:
    if x.dim() != 2 or x.shape != ref.shape:
        raise ValueError(f"{name} must have shape (B, T) = {tuple(ref.shape)}, got {tuple(x.shape)}")


def _per_row(
    name: str, p: float | Tensor, B: int, dtype: torch.dtype, device: torch.device, lo: float, hi: float
) -> Tensor:
    """A float or a Tensor[B] parameter as a (B,) tensor, checked to lie in [lo, hi]."""
    t = torch.as_tensor(p, dtype=dtype, device=device)
    if t.dim() == 0:
        t = t.expand(B)
    elif t.shape != (B,):
        raise ValueError(f"{name} must be a float or a Tensor[B] with B={B}, got shape {tuple(t.shape)}")
    if t.numel() and (bool((t < lo).any()) or bool((t > hi).any())):
        raise ValueError(f"{name} must lie in [{lo}, {hi}]")
    return t


# --------------------------------------------------------------------------------------------
# GRPO
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def grpo_advantages(rewards: Tensor, group_size: int, *, scale_by_std: bool = True, eps: float = GROUP_STD_EPS) -> Tensor:
    """Group-relative advantages (GRPO; DAPO eq. 9 for the A_hat term).

        A_i = (R_i - mean(R_group)) / (std(R_group) + eps)        scale_by_std=True  (GRPO, DAPO)
        A_i =  R_i - mean(R_group)                                scale_by_std=False (Dr. GRPO)

    Args:
        rewards: float Tensor[N], laid out group after group (N = groups * group_size): rows
            ``[g*G, (g+1)*G)`` are the G responses to prompt g.
        group_size: G, the number of responses per prompt.
        scale_by_std: divide by the group's standard deviation.
        eps: added to the std (a constant group gives 0 / eps = 0).

    std uses Bessel's correction (n - 1), like verl and TRL (``torch.std``); a group of size 1 has
    std 0 and advantage 0. Returns Tensor[N] (float32, or float64 for float64 input), one
    advantage per response; the caller broadcasts it over the response's tokens.

    Raises:
        ValueError: rewards is not 1-D, group_size < 1, or N % group_size != 0.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D Tensor[N], got shape {tuple(rewards.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    n = rewards.numel()
    if n % group_size != 0:
        raise ValueError(f"number of rewards ({n}) is not a multiple of group_size ({group_size})")
    g = rewards.to(_float_dtype(rewards)).view(-1, group_size)
    centred = g - g.mean(dim=-1, keepdim=True)
    if scale_by_std:
        if group_size > 1:
            std = g.std(dim=-1, keepdim=True, unbiased=True)
        else:
            std = torch.zeros_like(centred)
        centred = centred / (std + eps)
    return centred.reshape(n)


# --------------------------------------------------------------------------------------------
# GAE
# --------------------------------------------------------------------------------------------


def _gae_loop(r: Tensor, v: Tensor, m: Tensor, gamma: Tensor, lam: Tensor) -> tuple[Tensor, Tensor]:
    """Backward GAE recursion over T, vectorised over B (all inputs already (B, T) / (B,))."""
    B, T = r.shape
    adv = torch.zeros_like(r)
    next_value = torch.zeros(B, dtype=r.dtype, device=r.device)
    next_adv = torch.zeros(B, dtype=r.dtype, device=r.device)
    gl = gamma * lam
    for t in range(T - 1, -1, -1):
        mt = m[:, t]
        vt = v[:, t]
        delta = r[:, t] + gamma * next_value - vt
        a = delta + gl * next_adv
        # Invalid positions leave the carried state untouched: the recursion runs over valid
        # tokens only (and after a row's last valid token the carried value/advantage is 0).
        next_adv = torch.where(mt, a, next_adv)
        next_value = torch.where(mt, vt, next_value)
        adv[:, t] = next_adv
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    adv = torch.where(m, adv, zero)
    returns = torch.where(m, adv + v, zero)
    return adv, returns


def _gae_inputs(token_rewards: Tensor, values: Tensor, mask: Tensor, **params: float | Tensor) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor]]:
    """Checked (B, T) inputs in the computation dtype, and each of ``params`` (in [0, 1]) as (B,)."""
    _check_bt("token_rewards", token_rewards, token_rewards)
    _check_bt("values", values, token_rewards)
    _check_bt("mask", mask, token_rewards)
    dtype = _float_dtype(token_rewards, values)
    B, dev = token_rewards.shape[0], token_rewards.device
    per_row = {k: _per_row(k, v, B, dtype, dev, 0.0, 1.0) for k, v in params.items()}
    return token_rewards.to(dtype), values.to(dtype), as_bool_mask(mask), per_row


@torch.no_grad()
def gae(
    token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float | Tensor, lam: float | Tensor
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016), per row, over valid tokens only.

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}  =  sum_l (gamma*lam)^l delta_{t+l}
        G_t     = A_t + V_t                          (value targets / returns)

    Args:
        token_rewards: (B, T) per-token rewards r_t (outcome reward on the last valid token, see
            :func:`outcome_token_rewards`, plus any per-token penalty).
        values: (B, T) critic values V_t of the state before token t.
        mask: (B, T), 1 on a row's valid response tokens (a prefix of the row).
        gamma: discount (a float, or a Tensor[B]).
        lam: GAE lambda in [0, 1], a float or a Tensor[B] (one lambda per response, e.g.
            :func:`adaptive_lambda`).

    The value after a row's last valid token is 0 (terminal). Positions with mask 0 are skipped by
    the recursion (a hole in the mask is bridged, not treated as terminal) and are 0 in both
    outputs. With gamma = lam = 1: A_t = (reward-to-go from t) - V_t, G_t = reward-to-go.
    No whitening here (see :func:`reasonrl.algos.masked_whiten`). Loops over T (backwards),
    vectorised over B. Computed in float32 (float64 if an input is float64).

    Returns:
        (advantages, returns), both (B, T), without gradient.
    """
    r, v, m, p = _gae_inputs(token_rewards, values, mask, gamma=gamma, lam=lam)
    return _gae_loop(r, v, m, p["gamma"], p["lam"])


@torch.no_grad()
def decoupled_gae(
    token_rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    *,
    gamma: float | Tensor,
    lam_actor: float | Tensor,
    lam_critic: float | Tensor,
) -> tuple[Tensor, Tensor]:
    """Decoupled GAE (VC-PPO): policy advantages with lam_actor, critic targets with lam_critic.

        advantages = gae(..., lam=lam_actor).advantages       (paper: lam_actor = 0.95)
        returns    = gae(..., lam=lam_critic).returns         (paper: lam_critic = 1.0; with
                                                               gamma = 1 the Monte-Carlo return)

    With lam < 1 the outcome reward decays as lam^(T - t) on its way to early tokens of a long
    response, which is fine for the (variance-sensitive) policy but biases the critic; the critic's
    MSE tolerates the variance of lam = 1. Same shapes and conventions as :func:`gae`; both
    recursions run in one pass over T (the batch is stacked twice).

    Returns:
        (advantages, returns), both (B, T), without gradient.
    """
    r, v, m, p = _gae_inputs(token_rewards, values, mask, gamma=gamma, lam_actor=lam_actor, lam_critic=lam_critic)
    g = p["gamma"]
    adv2, ret2 = _gae_loop(torch.cat([r, r]), torch.cat([v, v]), torch.cat([m, m]), torch.cat([g, g]), torch.cat([p["lam_actor"], p["lam_critic"]]))
    B = r.shape[0]
    return adv2[:B], ret2[B:]


def adaptive_lambda(lengths: Tensor | Sequence[int], alpha: float = VAPO_ALPHA) -> Tensor:
    """Length-adaptive GAE lambda (VAPO, arXiv 2504.05118): lam = 1 - 1 / (alpha * |o|).

    Args:
        lengths: response lengths |o|, Tensor[B] or a sequence of ints.
        alpha: VAPO's alpha (0.05: lam = 0.95 at 400 tokens, 0.99 at 2000).

    Returns:
        float32 Tensor[B]. Clamped to [0, 1]: lengths <= 1/alpha (20 tokens at alpha = 0.05),
        including 0, would give lam <= 0 (or -inf) and get lam = 0 (one-step TD advantages; such
        short responses barely need propagation).
    """
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    n = torch.as_tensor(lengths).to(torch.float32)
    with torch.no_grad():
        lam = 1.0 - 1.0 / (alpha * n)  # length 0 -> -inf -> clamped to 0
        return lam.clamp(0.0, 1.0)


def outcome_token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """Place each response's outcome reward on its last valid token.

    Args:
        rewards: Tensor[B], one scalar reward per response.
        mask: (B, T) response mask.

    Returns:
        (B, T) float tensor: rewards[i] at the last t with mask[i, t] = 1, 0 elsewhere. A row with
        no valid token (e.g. removed by overlong filtering) gets no reward at all.
    """
    if rewards.dim() != 1 or mask.dim() != 2 or rewards.shape[0] != mask.shape[0]:
        raise ValueError(
            f"rewards must be Tensor[B] and mask (B, T); got {tuple(rewards.shape)} and {tuple(mask.shape)}"
        )
    m = as_bool_mask(mask)
    B, T = m.shape
    dtype = _float_dtype(rewards)
    out = torch.zeros(B, T, dtype=dtype, device=rewards.device)
    if T == 0:
        return out
    pos = torch.arange(T, device=m.device).expand(B, T)
    last = torch.where(m, pos, torch.full_like(pos, -1)).max(dim=-1).values  # (B,)
    has = last >= 0
    rows = torch.nonzero(has, as_tuple=True)[0]
    out[rows, last[rows]] = rewards.to(dtype)[rows]
    return out


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdvantageInputs:
    """What every entry of ``ADVANTAGE_ESTIMATORS`` receives (each reads the fields it needs): the
    one declaration of the estimators' knobs and their defaults (``AlgoSpec`` takes its defaults
    from here).

    Fields:
        rewards: Tensor[B], one scalar reward per response (outcome + overlong penalty); for
            "grpo" laid out group after group.
        mask: (B, T) response mask (after overlong filtering, if used).
        group_size: G (required by "grpo").
        values: (B, T) critic values (required by "gae").
        token_rewards: optional (B, T) per-token rewards added to the outcome reward, e.g. a
            KL penalty ``-kl_coef * kl_penalty(...)`` ("gae" only).
        gamma: discount ("gae").
        lam_actor: lambda for the advantages, float or Tensor[B] (e.g. adaptive_lambda) ("gae").
        lam_critic: lambda for the returns ("gae").
        scale_by_std: divide by the group std ("grpo"; False = Dr. GRPO).
        eps: std epsilon ("grpo").
    """

    rewards: Tensor
    mask: Tensor
    group_size: int | None = None
    values: Tensor | None = None
    token_rewards: Tensor | None = None
    gamma: float = 1.0
    lam_actor: float | Tensor = 1.0
    lam_critic: float | Tensor = 1.0
    scale_by_std: bool = True
    eps: float = GROUP_STD_EPS


@torch.no_grad()
def _grpo_estimator(x: AdvantageInputs) -> tuple[Tensor, Tensor | None]:
    """GRPO: the response's group-relative advantage on every valid token; no returns."""
    if x.group_size is None:
        raise ValueError("the 'grpo' estimator needs group_size")
    if x.token_rewards is not None:
        raise ValueError("the 'grpo' estimator takes no token_rewards (put a KL penalty in the loss instead)")
    if x.mask.dim() != 2 or x.rewards.shape != (x.mask.shape[0],):
        raise ValueError(f"rewards must be Tensor[B] and mask (B, T); got {tuple(x.rewards.shape)} and {tuple(x.mask.shape)}")
    a = grpo_advantages(x.rewards, x.group_size, scale_by_std=x.scale_by_std, eps=x.eps)
    m = as_bool_mask(x.mask)
    adv = torch.where(m, a[:, None].expand(m.shape), torch.zeros((), dtype=a.dtype, device=a.device))
    return adv, None


@torch.no_grad()
def _gae_estimator(x: AdvantageInputs) -> tuple[Tensor, Tensor | None]:
    """PPO / VC-PPO: outcome reward on the last valid token (+ token_rewards), decoupled GAE."""
    if x.values is None:
        raise ValueError("the 'gae' estimator needs values (B, T) from the critic")
    r = outcome_token_rewards(x.rewards, x.mask)
    if x.token_rewards is not None:
        _check_bt("token_rewards", x.token_rewards, r)
        r = r + x.token_rewards.to(r.dtype)
    if not isinstance(x.lam_actor, Tensor) and not isinstance(x.lam_critic, Tensor) and float(x.lam_actor) == float(x.lam_critic):
        return gae(r, x.values, x.mask, gamma=x.gamma, lam=x.lam_actor)
    return decoupled_gae(r, x.values, x.mask, gamma=x.gamma, lam_actor=x.lam_actor, lam_critic=x.lam_critic)


ADVANTAGE_ESTIMATORS: dict[str, Callable[[AdvantageInputs], tuple[Tensor, Tensor | None]]] = {
    "grpo": _grpo_estimator,
    "gae": _gae_estimator,
}
"""name -> estimator, each ``fn(AdvantageInputs) -> (advantages, returns or None)``."""


def compute_advantages(estimator: str, **inputs: Any) -> tuple[Tensor, Tensor | None]:
    """Advantages (and critic targets) for a batch of responses, by estimator name.

    Args:
        estimator: a key of ``ADVANTAGE_ESTIMATORS`` ("grpo" or "gae"; ``AlgoSpec.advantage``).
        inputs: the fields of :class:`AdvantageInputs` by keyword (``rewards`` and ``mask``
            always; the rest as the estimator needs).

    Returns:
        (advantages (B, T), returns (B, T) or None). "grpo" broadcasts each response's advantage
        to its valid tokens and returns None for returns; "gae" puts the outcome reward on each
        row's last valid token and runs (decoupled) GAE. 0 outside the mask. No whitening: the
        caller applies ``masked_whiten`` when ``AlgoSpec.whiten_advantages``.

    Raises:
        ValueError: unknown estimator (the message names the valid ones), or a missing input.
    """
    fn = pick(ADVANTAGE_ESTIMATORS, estimator, "advantage estimator")
    return fn(AdvantageInputs(**inputs))
