"""Slow, obvious pure-python versions of the formulas in ``reasonrl.algos``.

For tests and debugging only (never used in training): plain loops over python lists and floats,
written straight from the equations, so the vectorised torch versions can be checked against them.
Inputs are nested lists (``tensor.tolist()``); masks are lists of 0/1 (or bools).
"""

from __future__ import annotations

import math

Matrix = list[list[float]]


def grpo(rewards: list[float], group_size: int, scale_by_std: bool = True, eps: float = 1e-6) -> list[float]:
    out: list[float] = []
    for start in range(0, len(rewards), group_size):
        g = rewards[start : start + group_size]
        mean = sum(g) / len(g)
        if len(g) > 1:
            std = math.sqrt(sum((x - mean) ** 2 for x in g) / (len(g) - 1))
        else:
            std = 0.0
        for x in g:
            out.append((x - mean) / (std + eps) if scale_by_std else x - mean)
    return out


def gae(rewards: Matrix, values: Matrix, mask: Matrix, gamma: float, lam: float | list[float]) -> tuple[Matrix, Matrix]:
    B = len(rewards)
    T = len(rewards[0]) if B else 0
    adv = [[0.0] * T for _ in range(B)]
    ret = [[0.0] * T for _ in range(B)]
    for i in range(B):
        li = lam[i] if isinstance(lam, list) else lam
        valid = [t for t in range(T) if mask[i][t]]
        # A_t = sum_l (gamma*lam)^l delta_{t+l} over the row's valid tokens, V after the last = 0
        deltas = []
        for k, t in enumerate(valid):
            v_next = values[i][valid[k + 1]] if k + 1 < len(valid) else 0.0
            deltas.append(rewards[i][t] + gamma * v_next - values[i][t])
        for k, t in enumerate(valid):
            a = sum((gamma * li) ** l * deltas[k + l] for l in range(len(valid) - k))
            adv[i][t] = a
            ret[i][t] = a + values[i][t]
    return adv, ret


def aggregate(loss: Matrix, mask: Matrix, mode: str, max_len: int | None = None) -> float:
    rows = [(sum(l for l, m in zip(lr, mr) if m), sum(1 for m in mr if m)) for lr, mr in zip(loss, mask)]
    if mode == "token-mean":
        n = sum(c for _, c in rows)
        return sum(s for s, _ in rows) / n if n else 0.0
    kept = [(s, c) for s, c in rows if c > 0]
    if not kept:
        return 0.0
    if mode == "seq-mean-token-mean":
        return sum(s / c for s, c in kept) / len(kept)
    if mode == "seq-mean-token-sum-norm":
        norm = max_len if max_len is not None else len(loss[0])
        return sum(s / norm for s, _ in kept) / len(kept)
    raise ValueError(mode)


def policy_loss_token(
    logp: float, logp_old: float, adv: float, eps_low: float, eps_high: float, dual_clip: float | None = None
) -> float:
    r = math.exp(max(-20.0, min(20.0, logp - logp_old)))
    clipped = min(max(r, 1 - eps_low), 1 + eps_high)
    loss = -min(r * adv, clipped * adv)
    if dual_clip is not None and adv < 0:
        loss = min(loss, -dual_clip * adv)
    return loss


def value_loss_token(v: float, v_old: float, g: float, clip: float | None) -> float:
    if clip is None:
        return 0.5 * (v - g) ** 2
    vc = min(max(v, v_old - clip), v_old + clip)
    return 0.5 * max((v - g) ** 2, (vc - g) ** 2)


def overlong_penalty(length: int, max_len: int, cache_len: int) -> float:
    if length <= max_len - cache_len:
        return 0.0
    if length <= max_len:
        return ((max_len - cache_len) - length) / cache_len
    return -1.0


def entropy(logits_row: list[float]) -> float:
    mx = max(logits_row)
    z = sum(math.exp(x - mx) for x in logits_row)
    ps = [math.exp(x - mx) / z for x in logits_row]
    return -sum(p * math.log(p) for p in ps if p > 0)


def kl(logp: float, logp_ref: float, kind: str) -> float:
    if kind == "k1":
        return logp - logp_ref
    if kind == "k2":
        return 0.5 * (logp - logp_ref) ** 2
    if kind == "k3":
        d = logp_ref - logp
        return math.exp(d) - d - 1.0
    raise ValueError(kind)


def explained_variance(pred: Matrix, target: Matrix, mask: Matrix) -> float:
    ts = [t for tr, mr in zip(target, mask) for t, m in zip(tr, mr) if m]
    ds = [t - p for tr, pr, mr in zip(target, pred, mask) for t, p, m in zip(tr, pr, mr) if m]
    if not ts:
        return 0.0

    def var(xs: list[float]) -> float:
        mu = sum(xs) / len(xs)
        return sum((x - mu) ** 2 for x in xs) / len(xs)

    vt = var(ts)
    return 0.0 if vt <= 0 else 1.0 - var(ds) / vt


def mean_by_position(x: Matrix, mask: Matrix, n_bins: int | None) -> list[float]:
    T = len(x[0]) if x else 0
    cols = [[x[i][t] for i in range(len(x)) if mask[i][t]] for t in range(T)]
    L = max((t + 1 for t in range(T) if cols[t]), default=0)
    if L == 0:
        return []
    if n_bins is None or L <= n_bins:
        groups = [[t] for t in range(L)]
    else:
        groups = [list(range(k * L // n_bins, (k + 1) * L // n_bins)) for k in range(n_bins)]
    out = []
    for g in groups:
        vals = [v for t in g for v in cols[t]]
        out.append(sum(vals) / len(vals) if vals else float("nan"))
    return out


def prefix_mask_lengths(B: int, T: int, seed: int) -> list[int]:
    """Random response lengths in [0, T] for B rows, including 0 and T when B >= 2 (tests)."""
    import random

    rng = random.Random(seed)
    lengths = [rng.randint(0, T) for _ in range(B)]
    if B >= 1:
        lengths[0] = 0
    if B >= 2:
        lengths[1] = T
    return lengths


def sampling_logprobs(logits_row: list[float], temperature: float, top_k: int, top_p: float) -> list[float]:
    """log-probabilities of the sampling distribution (vLLM's order: /T, top-k with ties kept, top-p
    over the renormalised top-k set keeping a token iff the mass ranked above it is < p); -inf for
    the filtered tokens."""
    z = [x / temperature for x in logits_row]
    keep = [True] * len(z)
    if 0 < top_k < len(z):
        kth = sorted(z, reverse=True)[top_k - 1]
        keep = [x >= kth for x in z]
    if top_p < 1.0:
        mx = max(x for x, k in zip(z, keep) if k)
        w = [math.exp(x - mx) if k else 0.0 for x, k in zip(z, keep)]
        total = sum(w)
        order = sorted(range(len(z)), key=lambda i: -z[i])
        before = 0.0
        for rank, i in enumerate(order):
            if keep[i] and not (before < top_p or rank == 0):
                keep[i] = False
            before += w[i] / total
    mx = max(x for x, k in zip(z, keep) if k)
    lse = mx + math.log(sum(math.exp(x - mx) for x, k in zip(z, keep) if k))
    return [x - lse if k else float("-inf") for x, k in zip(z, keep)]


def mismatch(logp_old: Matrix, logp_sampler: Matrix, mask: Matrix) -> tuple[float, float, float]:
    """(mean |d|, max |d|, mean k3) over counted tokens, d = logp_old - logp_sampler."""
    ds = [o - s for ro, rs, rm in zip(logp_old, logp_sampler, mask) for o, s, m in zip(ro, rs, rm) if m]
    if not ds:
        return 0.0, 0.0, 0.0
    return (sum(abs(d) for d in ds) / len(ds), max(abs(d) for d in ds), sum(math.exp(d) - 1 - d for d in ds) / len(ds))


def tis_weights(logp_old: Matrix, logp_sampler: Matrix, mask: Matrix, cap: float, level: str) -> Matrix:
    out = []
    for ro, rs, rm in zip(logp_old, logp_sampler, mask):
        if level == "token":
            out.append([min(math.exp(o - s), cap) if m else 1.0 for o, s, m in zip(ro, rs, rm)])
        else:
            prod = math.exp(sum(o - s for o, s, m in zip(ro, rs, rm) if m))
            out.append([min(prod, cap) if m else 1.0 for m in rm])
    return out
