"""Coverage of `reasonrl ablate`'s intervals, by simulation of its crossed design (seeds × problems).

In an ablation every seed is scored on the same validation problems, so a problem's difficulty is
shared by all the seeds (and by all the rungs). This simulates that design and counts how often
each nominal 95% interval covers the true mean:

- ``old``: the two-level percentile bootstrap (``two_level_bootstrap_ci``: the seeds, then each
  drawn seed's problems drawn afresh), what `ablate` used before;
- ``pigeonhole``: the two-way percentile bootstrap (Owen 2007): the seeds, and one shared draw of
  the problems for all the drawn seeds;
- ``new``: ``crossed_mean_ci``, the two-way random-effects t interval with Satterthwaite's df
  (what `ablate` uses now).

The model (logit scale; the run effects are the training seed's, shared by the rungs of a seed):

    η_rsp = μ + δ·r + a_s + b_p + c_sp + r·(g_s + h_p + f_sp),   r = 0 (a rung), 1 (the next rung)

with a_s ~ N(0, σ_seed²), b_p ~ N(0, σ_problem²), c_sp ~ N(0, σ_inter²), and for the next rung its
own seed (g), problem (h) and interaction (f) parts; each cell is the mean of ``n`` binary samples
with probability logistic(η). The truth is the mean over the populations of seeds and problems:
``E[logistic(μ + N(0, Σσ²))]`` by Gauss–Hermite quadrature; for the paired Δ (the next rung minus
the rung, paired by seed and problem) the difference of the two. Two regimes: the problems' spread
dominates (σ_seed 0.2), or the seeds' (σ_seed 0.8, σ_g 0.6: like VC-PPO's ladder, whose seeds ended
at 11.5 / 15.6 / 55.2%).

    python bench/interval_coverage.py [--replicates 1000] [--boot 400]

prints a markdown table (coverage % and mean width in points, per method). Its Monte Carlo error
is about ±1.4 points (1.96 √(0.95·0.05/R)) at R = 1000 replicates. Results in bench/README.md.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from reasonrl.evaluation.scores import crossed_mean_ci

REGIMES = {
    # name: (σ_seed, σ_problem, σ_inter, σ_g, σ_h, σ_f)
    "problems dominate": (0.2, 1.5, 0.3, 0.1, 0.5, 0.3),
    "seeds dominate": (0.8, 1.5, 0.3, 0.6, 0.5, 0.3),
}
MU, DELTA, N_SAMPLES = -0.5, 0.3, 2


def expected_accuracy(mu: float, sd: float) -> float:
    """E[logistic(mu + sd Z)], Z ~ N(0, 1), by 80-point Gauss–Hermite quadrature."""
    x, w = np.polynomial.hermite_e.hermegauss(80)
    return float(np.sum(w / (1.0 + np.exp(-(mu + sd * x)))) / math.sqrt(2.0 * math.pi))


def truths(regime: tuple[float, ...]) -> tuple[float, float]:
    """The rung's true accuracy and the true Δ (next rung − rung)."""
    sa, sb, sc, sg, sh, sf = regime
    t0 = expected_accuracy(MU, math.sqrt(sa**2 + sb**2 + sc**2))
    t1 = expected_accuracy(MU + DELTA, math.sqrt(sa**2 + sg**2 + sb**2 + sh**2 + sc**2 + sf**2))
    return t0, t1 - t0


def simulate(rng: np.random.Generator, regime: tuple[float, ...], k: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """One ablation's validation: the rung's k × m values and the paired differences to the next rung."""
    sa, sb, sc, sg, sh, sf = regime
    a, b, c = sa * rng.standard_normal((k, 1)), sb * rng.standard_normal((1, m)), sc * rng.standard_normal((k, m))
    g, h, f = sg * rng.standard_normal((k, 1)), sh * rng.standard_normal((1, m)), sf * rng.standard_normal((k, m))
    eta0 = MU + a + b + c
    eta1 = eta0 + DELTA + g + h + f
    y0 = rng.binomial(N_SAMPLES, 1.0 / (1.0 + np.exp(-eta0))) / N_SAMPLES
    y1 = rng.binomial(N_SAMPLES, 1.0 / (1.0 + np.exp(-eta1))) / N_SAMPLES
    return y0, y1 - y0


def old_ci(rng: np.random.Generator, y: np.ndarray, boot: int) -> tuple[float, float]:
    """The two-level bootstrap (two_level_bootstrap_ci's resampling, vectorised): seeds, then each drawn seed's own problems."""
    k, m = y.shape
    s = rng.integers(0, k, (boot, k))
    p = rng.integers(0, m, (boot, k, m))
    means = y[s[:, :, None], p].mean(axis=(1, 2))
    lo, hi = np.quantile(means, [0.025, 0.975])
    return float(lo), float(hi)


def pigeonhole_ci(rng: np.random.Generator, y: np.ndarray, boot: int) -> tuple[float, float]:
    """The two-way bootstrap: seeds, and one shared draw of problems for all the drawn seeds."""
    k, m = y.shape
    s = rng.integers(0, k, (boot, k))
    p = rng.integers(0, m, (boot, m))
    means = y[s[:, :, None], p[:, None, :]].mean(axis=(1, 2))
    lo, hi = np.quantile(means, [0.025, 0.975])
    return float(lo), float(hi)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicates", type=int, default=1000)
    ap.add_argument("--boot", type=int, default=400, help="bootstrap resamples per replicate (old, pigeonhole)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t_start = time.perf_counter()
    print(f"{args.replicates} replicates a row, {args.boot} bootstrap resamples each, {N_SAMPLES} samples per (seed, problem); "
          f"coverage of the nominal 95% interval in %, mean width in points in brackets\n")
    print("| regime | quantity | seeds | problems | truth | old (two-level) | pigeonhole | new (crossed t) |")
    print("|---|---|---|---|---|---|---|---|")
    for ri, (name, regime) in enumerate(REGIMES.items()):
        t_acc, t_delta = truths(regime)
        for k in (3, 5):
            for m in (24, 48, 96):
                rng = np.random.default_rng([args.seed, ri, k, m])
                hits = {q: {meth: 0 for meth in ("old", "pigeonhole", "new")} for q in ("acc", "delta")}
                width = {q: {meth: 0.0 for meth in ("old", "pigeonhole", "new")} for q in ("acc", "delta")}
                for _ in range(args.replicates):
                    y0, d = simulate(rng, regime, k, m)
                    for q, y, truth, bounds in (("acc", y0, t_acc, (0.0, 1.0)), ("delta", d, t_delta, (-1.0, 1.0))):
                        for meth, (lo, hi) in (("old", old_ci(rng, y, args.boot)), ("pigeonhole", pigeonhole_ci(rng, y, args.boot)),
                                               ("new", crossed_mean_ci(y.tolist(), bounds=bounds))):
                            hits[q][meth] += lo <= truth <= hi
                            width[q][meth] += hi - lo
                for q, label, truth in (("acc", "rung accuracy", t_acc), ("delta", "paired Δ", t_delta)):
                    cells = " | ".join(f"{100 * hits[q][meth] / args.replicates:.1f} ({100 * width[q][meth] / args.replicates:.1f})"
                                       for meth in ("old", "pigeonhole", "new"))
                    print(f"| {name} | {label} | {k} | {m} | {100 * truth:.1f}% | {cells} |", flush=True)
    print(f"\n{time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
