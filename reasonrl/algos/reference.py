"""Slow, obvious pure-python versions of the formulas in ``reasonrl.algos``.

For tests and debugging only (never used in training): plain loops over python lists and floats,
written straight from the equations, so the vectorised torch versions can be checked against them.
Inputs are nested lists (``tensor.tolist()``); masks are lists of 0/1 (or bools).
"""

from __future__ import annotations

import math
from typing import Callable

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


def agg_weights(mask: Matrix, mode: str, max_len: int | None = None) -> Matrix:
    """d aggregate(l) / d l[i][t]: each counted token's weight in the aggregated loss."""
    counts = [sum(1 for m in mr if m) for mr in mask]
    rows = sum(1 for c in counts if c > 0)
    n = sum(counts)
    out = []
    for mr, c in zip(mask, counts):
        if mode == "token-mean":
            w = 1.0 / n if n else 0.0
        elif mode == "seq-mean-token-mean":
            w = 1.0 / (c * rows) if c else 0.0
        elif mode == "seq-mean-token-sum-norm":
            w = 1.0 / ((max_len if max_len is not None else len(mr)) * rows) if c else 0.0
        else:
            raise ValueError(mode)
        out.append([w if m else 0.0 for m in mr])
    return out


def _surrogate(r: float, adv: float, eps_low: float, eps_high: float) -> tuple[float, float]:
    """(-min(r A, clip(r) A), its derivative w.r.t. r)."""
    clipped = min(max(r, 1 - eps_low), 1 + eps_high)
    if r * adv <= clipped * adv:
        return -r * adv, -adv
    return -clipped * adv, 0.0


def _aggregated(mask: Matrix, mode: str, max_len: int | None, token: Callable[[int, int], tuple[float, float]]) -> tuple[float, Matrix]:
    """sum over counted tokens of weight * value, and the gradient matrix, from token(i, t) ->
    (per-token loss, its derivative w.r.t. logp[i][t])."""
    w = agg_weights(mask, mode, max_len)
    loss, grad = 0.0, [[0.0] * len(mr) for mr in mask]
    for i, mr in enumerate(mask):
        for t, m in enumerate(mr):
            if m:
                val, d = token(i, t)
                loss += w[i][t] * val
                grad[i][t] = w[i][t] * d
    return loss, grad


def gspo(logp: Matrix, logp_old: Matrix, adv: Matrix, mask: Matrix, eps_low: float, eps_high: float, mode: str,
         max_len: int | None = None) -> tuple[float, Matrix]:
    """GSPO, sequence form: s_i = exp(mean_t (logp - logp_old)); per token -min(s_i A, clip(s_i) A).
    Returns (loss, d loss / d logp), the gradient of GSPO-token: d s_i,t / d logp_i,t = s_i."""
    s = []
    for lr, lo, mr in zip(logp, logp_old, mask):
        idx = [t for t, m in enumerate(mr) if m]
        mean = sum(lr[t] - lo[t] for t in idx) / len(idx) if idx else 0.0
        s.append(math.exp(max(-20.0, min(20.0, mean))))

    def token(i: int, t: int) -> tuple[float, float]:
        val, d = _surrogate(s[i], adv[i][t], eps_low, eps_high)
        return val, d * s[i]

    return _aggregated(mask, mode, max_len, token)


def cispo(logp: Matrix, logp_old: Matrix, adv: Matrix, mask: Matrix, w_min: float, w_max: float, mode: str) -> tuple[float, Matrix]:
    """CISPO: per token -sg(clamp(r, w_min, w_max)) A logp. Returns (loss, d loss / d logp)."""

    def token(i: int, t: int) -> tuple[float, float]:
        c = min(max(math.exp(max(-20.0, min(20.0, logp[i][t] - logp_old[i][t]))), w_min), w_max)
        return -c * adv[i][t] * logp[i][t], -c * adv[i][t]

    return _aggregated(mask, mode, None, token)


def token_covariance(logp: Matrix, adv: Matrix, mask: Matrix) -> Matrix:
    toks = [(lp, a) for lr, ar, mr in zip(logp, adv, mask) for lp, a, m in zip(lr, ar, mr) if m]
    if not toks:
        return [[0.0] * len(r) for r in logp]
    mlp = sum(lp for lp, _ in toks) / len(toks)
    ma = sum(a for _, a in toks) / len(toks)
    return [[(lp - mlp) * (a - ma) if m else 0.0 for lp, a, m in zip(lr, ar, mr)] for lr, ar, mr in zip(logp, adv, mask)]


def clip_cov_candidates(logp: Matrix, logp_old: Matrix, adv: Matrix, mask: Matrix, eps_low: float, eps_high: float,
                        low: float, high: float) -> set[tuple[int, int]]:
    """Clip-Cov's candidates: counted, not cut by the PPO clip, low < Cov < high."""
    cov = token_covariance(logp, adv, mask)
    out = set()
    for i, (lr, lo, ar, mr) in enumerate(zip(logp, logp_old, adv, mask)):
        for t, m in enumerate(mr):
            r = math.exp(lr[t] - lo[t])
            cut = (ar[t] > 0 and r > 1 + eps_high) or (ar[t] < 0 and r < 1 - eps_low)
            if m and not cut and low < cov[i][t] < high:
                out.add((i, t))
    return out


def clip_cov(logp: Matrix, logp_old: Matrix, adv: Matrix, mask: Matrix, eps_low: float, eps_high: float,
             selected: set[tuple[int, int]], mode: str) -> tuple[float, Matrix]:
    """Clip-Cov with a given selection: the clipped surrogate, 0 (no gradient) on ``selected``."""

    def token(i: int, t: int) -> tuple[float, float]:
        if (i, t) in selected:
            return 0.0, 0.0
        r = math.exp(logp[i][t] - logp_old[i][t])
        val, d = _surrogate(r, adv[i][t], eps_low, eps_high)
        return val, d * r

    return _aggregated(mask, mode, None, token)


def kl_cov(logp: Matrix, logp_old: Matrix, adv: Matrix, mask: Matrix, count: int, coef: float, mode: str) -> tuple[float, Matrix]:
    """KL-Cov: -r A on every token, + coef |logp - logp_old| on the ``count`` tokens of largest Cov."""
    cov = token_covariance(logp, adv, mask)
    ranked = sorted(((cov[i][t], i, t) for i, mr in enumerate(mask) for t, m in enumerate(mr) if m), reverse=True)
    selected = {(i, t) for _, i, t in ranked[:count]}

    def token(i: int, t: int) -> tuple[float, float]:
        d = logp[i][t] - logp_old[i][t]
        r = math.exp(d)
        on = (i, t) in selected
        return -r * adv[i][t] + (coef * abs(d) if on else 0.0), -r * adv[i][t] + (coef * ((d > 0) - (d < 0)) if on else 0.0)

    return _aggregated(mask, mode, None, token)


def positive_example_nll(logp: Matrix, mask: Matrix, correct: list[bool]) -> float:
    toks = [lp for lr, mr, c in zip(logp, mask, correct) if c for lp, m in zip(lr, mr) if m]
    return -sum(toks) / len(toks) if toks else 0.0


def value_loss_token(v: float, v_old: float, g: float, clip: float | None) -> float:
    if clip is None:
        return 0.5 * (v - g) ** 2
    vc = min(max(v, v_old - clip), v_old + clip)
    return 0.5 * max((v - g) ** 2, (vc - g) ** 2)


def soft_overlong_punishment(length: int, max_len: int, cache_len: int) -> float:
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


def entropy_bonus(entropy_mat: Matrix, mask: Matrix, coef: float, mode: str, max_len: int | None = None) -> tuple[float, Matrix]:
    """-coef * agg(H) and its gradient w.r.t. each token's entropy (-coef times the token's weight)."""
    w = agg_weights(mask, mode, max_len)
    loss = -coef * sum(w[i][t] * entropy_mat[i][t] for i in range(len(mask)) for t in range(len(mask[i])) if mask[i][t])
    return loss, [[-coef * w[i][t] for t in range(len(mask[i]))] for i in range(len(mask))]


def adaptive_entropy_control(coef0: float, entropies: list[float], target: float, delta: float, coef_max: float) -> list[float]:
    """Skywork-OR1's controller run over steps: the coefficient each step applies (the bonus is on
    at step 1, as Skywork-OR1 starts it; then only after a step whose entropy was below the target)."""
    alpha, on, applied = coef0, True, []
    for e in entropies:
        applied.append(alpha if on else 0.0)
        if e < target:
            alpha = alpha + delta
        else:
            alpha = alpha - delta
        if alpha < 0.0:
            alpha = 0.0
        if alpha > coef_max:
            alpha = coef_max
        on = e < target
    return applied


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
    constant = vt <= 1e-12 * sum(t * t for t in ts) / len(ts)  # (a constant target up to float32 rounding)
    return 0.0 if constant else 1.0 - var(ds) / vt


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


def sampling_logprobs(logits_row: list[float], temperature: float, top_k: int, top_p: float,
                      order: list[int] | None = None) -> list[float]:
    """log-probabilities of the sampling distribution (vLLM's CPU rule: /T, top-k with ties kept,
    then top-p over the renormalised top-k set: the tokens in ascending order, a token dropped iff
    the cumulative mass up to it is <= 1 - p, the last one always kept); -inf for the filtered
    tokens. ``order``: the token indices in the ascending order the sampler's sort leaves them
    (it decides between tied tokens at the cut); None: by value, ties by index."""
    z = [x / temperature for x in logits_row]
    keep = [True] * len(z)
    if 0 < top_k < len(z):
        kth = sorted(z, reverse=True)[top_k - 1]
        keep = [x >= kth for x in z]
    if top_p < 1.0:
        mx = max(x for x, k in zip(z, keep) if k)
        w = [math.exp(x - mx) if k else 0.0 for x, k in zip(z, keep)]
        total = sum(w)
        ranked = order if order is not None else sorted(range(len(z)), key=lambda i: (z[i], i))
        cum = 0.0
        for pos, i in enumerate(ranked):
            cum += w[i] / total
            if cum <= 1 - top_p and pos < len(ranked) - 1:
                keep[i] = False
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


_CORRECTION_DEFAULTS = {"token-tis": (2.0, 0.0), "sequence-tis": (2.0, 0.0), "token-mask": (3.0, 0.0), "sequence-mask": (3.0, 0.0),
                        "geo-rs": (1.001, 0.999), "icepop": (5.0, 0.5)}


def rollout_correction(logp_old: Matrix, logp_b: Matrix, mask: Matrix, name: str, cap: float | None = None, low: float | None = None,
                       scope: Matrix | None = None) -> tuple[Matrix, Matrix, Matrix]:
    """(weights, rejected 0/1, truncated 0/1) of estimator ``name`` for rho = pi_old / pi_b, one
    response at a time; weights 1 off the mask and off the scope (a sequence estimator: off the
    responses without a token in scope)."""
    dc, dl = _CORRECTION_DEFAULTS[name]
    cap = dc if cap is None else cap
    low = dl if low is None else low
    W, REJ, TR = [], [], []
    for i, (ro, rb, rm) in enumerate(zip(logp_old, logp_b, mask)):
        ds = [o - b for o, b, m in zip(ro, rb, rm) if m]
        n = len(ds)
        seq = sum(ds)
        w_row, rej_row, tr_row = [], [], []
        for t, (o, b, m) in enumerate(zip(ro, rb, rm)):
            if not m:
                w_row.append(1.0), rej_row.append(0), tr_row.append(0)
                continue
            d = o - b
            rho = math.exp(min(d, 20.0))
            rho_seq = math.exp(min(seq, 20.0))
            if name == "token-tis":
                w, rej, tr = min(rho, cap), 0, int(rho > cap)
            elif name == "sequence-tis":
                w, rej, tr = min(rho_seq, cap), 0, int(rho_seq > cap)
            elif name in ("token-mask", "icepop"):
                inside = low <= rho <= cap
                w, rej, tr = (rho if inside else 0.0), int(not inside), 0
            elif name == "sequence-mask":
                inside = low <= rho_seq <= cap
                w, rej, tr = (rho_seq if inside else 0.0), int(not inside), 0
            elif name == "geo-rs":
                g = math.exp(min(seq / n, 20.0))
                inside = low <= g <= cap
                w, rej, tr = (1.0 if inside else 0.0), int(not inside), 0
            else:
                raise ValueError(name)
            if scope is not None:
                in_scope = bool(scope[i][t]) if name in ("token-tis", "token-mask", "icepop") else any(
                    s and m2 for s, m2 in zip(scope[i], rm))
                if not in_scope:
                    w, rej, tr = 1.0, 0, 0
            w_row.append(w), rej_row.append(rej), tr_row.append(tr)
        W.append(w_row), REJ.append(rej_row), TR.append(tr_row)
    return W, REJ, TR


def offpolicy_diagnostics(logp_old: Matrix, logp_b: Matrix, mask: Matrix) -> dict[str, float]:
    """k1, k3 (per token and per response), chi2 (both), the max ratio and the token multiplicative
    probability error, with exponents bounded at 20, over counted tokens / responses with one."""
    toks = [o - b for ro, rb, rm in zip(logp_old, logp_b, mask) for o, b, m in zip(ro, rb, rm) if m]
    seqs = [sum(o - b for o, b, m in zip(ro, rb, rm) if m) for ro, rb, rm in zip(logp_old, logp_b, mask) if any(rm)]
    if not toks:
        return dict.fromkeys(["k1", "k3", "k1_seq", "k3_seq", "chi2", "chi2_seq", "ratio_max", "mult_prob_error"], 0.0)

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs)

    rho = [math.exp(min(d, 20.0)) for d in toks]
    Rho = [math.exp(min(D, 20.0)) for D in seqs]
    return {"k1": mean([-d for d in toks]), "k3": mean([r - 1 - min(d, 20.0) for r, d in zip(rho, toks)]),
            "k1_seq": mean([-D for D in seqs]), "k3_seq": mean([R - 1 - min(D, 20.0) for R, D in zip(Rho, seqs)]),
            "chi2": mean([r * r for r in rho]) - 1, "chi2_seq": mean([R * R for R in Rho]) - 1, "ratio_max": max(rho),
            "mult_prob_error": mean([math.exp(min(abs(d), 20.0)) for d in toks])}


def corrected_ppo(logp: Matrix, logp_old: Matrix, logp_b: Matrix, adv: Matrix, mask: Matrix, eps_low: float, eps_high: float, agg: str,
                  mode: str, name: str | None, cap: float | None = None, low: float | None = None,
                  scope: Matrix | None = None) -> tuple[float, Matrix]:
    """The clipped surrogate under an off-policy correction, (loss, d loss / d logp). decoupled: r =
    pi / pi_old, each token's loss times the estimator's weight from pi_old / pi_b; bypass: r = pi / pi_b,
    no weight. r = exp(clamp(logp - anchor, -20, 20)) (no gradient where clamped)."""
    anchor = logp_b if mode == "bypass" else logp_old
    W = rollout_correction(logp_old, logp_b, mask, name, cap, low, scope)[0] if (mode == "decoupled" and name) else None

    def token(i: int, t: int) -> tuple[float, float]:
        x = logp[i][t] - anchor[i][t]
        r = math.exp(max(-20.0, min(20.0, x)))
        val, dr = _surrogate(r, adv[i][t], eps_low, eps_high)
        dx = dr * r if -20.0 < x < 20.0 else 0.0
        w = W[i][t] if W is not None else 1.0
        return w * val, w * dx

    return _aggregated(mask, agg, None, token)
