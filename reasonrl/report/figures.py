"""The report's figures: one function per picture, each drawn from what the runs logged.

Every function takes the runs and the smoothing window and returns a :class:`Drawn`: a matplotlib
``Figure`` (None when no run logged anything it needs) and notes on what is missing. Rules: steps
on x, axes labelled with units, one colour per run (the same in every figure), the raw values
(a moving average only with ``smooth`` > 1, drawn over the faint raw curve), nothing filled in.
A non-finite value (NaN, ±inf) leaves a gap in its curve and a × on the bottom edge at its step,
named in a note; a metric that is not finite at any step is not drawn, and says so.
``FIGURES`` lists them in the report's order.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from reasonrl.report.runs import Run, number, numbers, shown

STEP = "training step"


@dataclass
class Drawn:
    fig: Any = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FigureSpec:
    name: str  # the PNG's file name (without .png)
    title: str
    caption: str
    draw: Callable[[list[Run], int], Drawn]


FIGURES: list[FigureSpec] = []
"""Every figure of the report, in order: a draw function decorated with :func:`figure` (its
docstring is the caption)."""


def figure(name: str, title: str) -> Callable[[Callable[[list[Run], int], Drawn]], Callable[[list[Run], int], Drawn]]:
    """Register a draw function as the report's next figure, ``name`` its PNG's file name."""

    def register(draw: Callable[[list[Run], int], Drawn]) -> Callable[[list[Run], int], Drawn]:
        FIGURES.append(FigureSpec(name, title, " ".join((draw.__doc__ or "").split()), draw))
        return draw

    return register


def _figure(ncols: int, nrows: int = 1, height: float = 4.2) -> tuple[Any, list[Any]]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.6 * ncols, height * nrows), dpi=100, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def color(run: Run, runs: list[Run]) -> Any:
    from matplotlib import colormaps

    return colormaps["tab10"](runs.index(run) % 10)


def smoothed(values: list[float], n: int) -> list[float]:
    """Trailing moving average over ``n`` steps (the first points average what exists so far)."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= n:
            acc -= values[i - n]
        out.append(acc / min(i + 1, n))
    return out


def _axes(ax: Any, ylabel: str, title: str, xlabel: str = STEP) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    legend(ax)


def legend(ax: Any) -> None:
    """Under the axes, never over the data."""
    labels = ax.get_legend_handles_labels()[1]
    if labels:
        ncol = 2 if max(map(len, labels)) <= 40 else 1
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol, frameon=False, handlelength=3.5)


def nonfinite(xs: list[Any], ys: list[float]) -> list[tuple[Any, float]]:
    """The (x, y) points whose y is NaN or ±inf."""
    return [(x, y) for x, y in zip(xs, ys) if not math.isfinite(y)]


def nonfinite_note(what: str, bad: list[tuple[Any, float]], n: int | None = None, at: str = "step", shown_as: str = "marked × on the bottom edge") -> str:
    """'what not finite (NaN at steps 3, 5; inf at step 4): marked …', or '… not finite at every
    step (…): not drawn' when all its ``n`` points are."""
    groups: dict[str, list[str]] = {}
    for x, y in bad:
        at_x = groups.setdefault("NaN" if y != y else "inf" if y > 0 else "-inf", [])
        if str(x) not in at_x:
            at_x.append(str(x))
    parts = [f"{k} at {at}{'s' if len(v) > 1 else ''} {', '.join(v[:8])}{', …' if len(v) > 8 else ''}" for k, v in groups.items()]
    where = f"not finite at every {at} ({'; '.join(parts)}): not drawn" if len(bad) == n else f"not finite ({'; '.join(parts)}): {shown_as}"
    return f"{what} {where}"


def mark_nonfinite(ax: Any, xs: list[Any], c: Any, label: str) -> None:
    """A × on the bottom edge of ``ax`` at each x whose value is not finite (x in data, y in axes)."""
    ax.plot(xs, [0.0] * len(xs), linestyle="none", marker="x", markersize=7, markeredgewidth=1.6, color=c, clip_on=False,
            transform=ax.get_xaxis_transform(), label=f"{label} · not finite (×)")


def _curves(ax: Any, runs: list[Run], all_runs: list[Run], key: str, smooth: int, notes: list[str], *, style: str = "-", what: str = "") -> bool:
    """One line per run that logged ``key`` (label ``run · what``); notes for those that did not.
    A non-finite value is a gap in the line and a × on the bottom edge (noted); a run whose values
    are all non-finite draws nothing (noted)."""
    drawn = False
    for r in runs:
        xs, ys = r.series(key)
        if not xs:
            notes.append(f"{r.label}: {key} is not a number at any step (skipped)" if r.has(key) else f"{r.label}: no {key}")
            continue
        bad = nonfinite(xs, ys)
        if bad:
            notes.append(nonfinite_note(f"{r.label}: {key}", bad, len(xs)))
        if len(bad) == len(xs):
            continue
        c, label = color(r, all_runs), f"{r.label} · {what}" if what else r.label
        raw = [y if math.isfinite(y) else math.nan for y in ys]  # a gap at each non-finite step
        if smooth > 1:
            fin = [(x, y) for x, y in zip(xs, ys) if math.isfinite(y)]
            ax.plot(xs, raw, style, color=c, alpha=0.25, linewidth=1)
            ax.plot([x for x, _ in fin], smoothed([y for _, y in fin], smooth), style, color=c, label=f"{label} (mean of {smooth})", linewidth=1.8)
        else:
            ax.plot(xs, raw, style, color=c, label=label, marker="." if len(xs) < 40 else None, linewidth=1.6)
        if bad:
            mark_nonfinite(ax, [x for x, _ in bad], c, label)
        drawn = True
    return drawn


def empty_panel(ax: Any) -> None:
    ax.text(0.5, 0.5, "nothing to draw: see the notes below", transform=ax.transAxes, ha="center", va="center", color="grey")


def finish_panels(out: Drawn, fig: Any, axes: list[Any], drawn: list[bool]) -> Drawn:
    """``out`` with ``fig`` when any panel drew something (the empty ones say so), else no figure."""
    for ax, d in zip(axes, drawn):
        if any(drawn) and not d:
            empty_panel(ax)
    out.fig = fig if any(drawn) else None
    return out


def _line_panels(runs: list[Run], all_runs: list[Run], smooth: int, panels: list[tuple[str, str, list[tuple[str, str, str]]]]) -> Drawn:
    """Panels of curves for ``runs``: (title, y label, [(metric, line style, what it is)]), one
    colour per run of ``all_runs``."""
    out = Drawn()
    fig, axes = _figure(len(panels))
    drawn = []
    for ax, (title, ylabel, series) in zip(axes, panels):
        drawn.append(False)
        for key, style, what in series:
            drawn[-1] |= _curves(ax, runs, all_runs, key, smooth, out.notes, style=style, what=what if len(series) > 1 else "")
        _axes(ax, ylabel, title)
    return finish_panels(out, fig, axes, drawn)


def train_runs(runs: list[Run]) -> list[Run]:
    return [r for r in runs if r.stage == "train"]


@figure("reward_accuracy", "Reward and accuracy")
def draw_reward(runs: list[Run], smooth: int) -> Drawn:
    """Rule reward and accuracy over every response generated in the step (dynamic sampling's
    dropped groups included: the policy's real score) and over the batch that was trained on."""
    return _line_panels(train_runs(runs), runs, smooth, [
        ("reward", "rule reward (mean over responses, ±1)", [("rollout/reward_mean", "-", "all generated"), ("rollout/shaped_reward_mean", ":", "with overlong punishment")]),
        ("accuracy", "share of responses correct", [("rollout/acc_mean", "-", "all generated"), ("rollout/batch_acc_mean", "--", "trained batch")]),
    ])


def _val_key(r: Run) -> str | None:
    """The run's ``val/avg@n`` metric (``train --val-every``), or None."""
    keys = sorted({k for m in r.metrics for k in m if re.fullmatch(r"val/avg@\d+", k)})
    return keys[0] if keys else None


@figure("validation", "Validation during training")
def draw_validation(runs: list[Run], smooth: int) -> Drawn:
    """Held-out accuracy of the policy during training (``train --val-every``): avg@n at step 0
    (before any update), every N steps and at the last step, with its 95% percentile-bootstrap
    interval over the problems as a band; and the validation responses' mean length."""
    out = Drawn()
    vruns = [(r, k) for r in train_runs(runs) if (k := _val_key(r))]
    if not vruns:
        out.notes.append("no train run validated (train --val-every N)")
        return out
    fig, (ax, ax_len) = _figure(2)
    drawn = False
    for r, key in vruns:
        xs, ys = r.series(key)
        lo, hi = dict(zip(*r.series(key + "_ci_low"))), dict(zip(*r.series(key + "_ci_high")))
        bad = nonfinite(xs, ys)
        if bad:
            out.notes.append(nonfinite_note(f"{r.label}: {key}", bad, len(xs)))
        pts = [(x, y) for x, y in zip(xs, ys) if math.isfinite(y)]
        if not pts:
            continue
        c = color(r, runs)
        ax.plot([x for x, _ in pts], [y for _, y in pts], "-", color=c, marker="o", markersize=3, label=f"{r.label} · {key.split('/')[-1]}")
        band = [(x, lo[x], hi[x]) for x, _ in pts if x in lo and x in hi and math.isfinite(lo[x]) and math.isfinite(hi[x])]
        if band:
            ax.fill_between([b[0] for b in band], [b[1] for b in band], [b[2] for b in band], color=c, alpha=0.18, linewidth=0)
        else:
            out.notes.append(f"{r.label}: no interval logged for {key}")
        if bad:
            mark_nonfinite(ax, [x for x, _ in bad], c, r.label)
        drawn = True
    _axes(ax, "held-out accuracy (band: 95% CI)", "validation accuracy")
    len_drawn = _curves(ax_len, [r for r, _ in vruns], runs, "val/response_length_mean", 0, out.notes)
    _axes(ax_len, "tokens", "validation response length")
    if not len_drawn:
        empty_panel(ax_len)
    out.fig = fig if drawn else None
    return out


@figure("ablation", "Ablation: the rungs overlaid")
def draw_ablation(runs: list[Run], smooth: int) -> Drawn:
    """``reasonrl ablate``: one colour per rung, its mean over seeds at each step (the steps every
    seed of the rung logged), the band from the lowest to the highest seed: held-out avg@n
    (validation during training), the policy's entropy (DAPO fig. 2), the mean response length
    and the share cut at L_max. A rung with finished runs is drawn from those (a running seed
    would cut its curve short); one with none from what its runs logged so far."""
    out = Drawn()
    groups: dict[str, list[Run]] = {}
    for r in train_runs(runs):
        if r.rung:
            groups.setdefault(r.rung, []).append(r)
    if not groups:
        out.notes.append("no ablation among these runs (reasonrl ablate)")
        return out
    for rung, members in groups.items():
        done = [m for m in members if m.complete]
        if done and len(done) < len(members):
            out.notes.append(f"{rung}: {len(members) - len(done)} unfinished run(s) left out ({', '.join(m.label for m in members if not m.complete)})")
            groups[rung] = done
    from matplotlib import colormaps

    fig, axes = _figure(2, 2)
    drawn = [False] * 4
    panels = ((axes[0], "validation accuracy", "held-out avg@n (band: lowest … highest seed)", None),
              (axes[1], "policy entropy", "entropy (nats / token)", "actor/entropy"),
              (axes[2], "response length", "tokens per response (mean)", "rollout/response_length_mean"),
              (axes[3], "truncation", "share of responses cut at L_max", "rollout/truncated_frac"))
    for i, (ax, title, ylabel, metric) in enumerate(panels):
        for g, (rung, members) in enumerate(groups.items()):
            key = _val_key(members[0]) if metric is None else metric
            if key is None:
                out.notes.append(f"{rung}: no validation (train --val-every)")
                continue
            per = [dict((x, y) for x, y in zip(*m.series(key)) if math.isfinite(y)) for m in members]
            steps = sorted(set.intersection(*(set(d) for d in per)))
            if not steps:
                out.notes.append(f"{rung}: no step where every seed logged {key}")
                continue
            c = colormaps["tab10"](g % 10)
            ys = [[d[x] for d in per] for x in steps]
            ax.plot(steps, [sum(v) / len(v) for v in ys], "-", color=c, marker="o" if len(steps) < 40 else None, markersize=3,
                    label=f"{rung} ({len(members)} seed{'s' if len(members) > 1 else ''})")
            if len(members) > 1:
                ax.fill_between(steps, [min(v) for v in ys], [max(v) for v in ys], color=c, alpha=0.18, linewidth=0)
            drawn[i] = True
        _axes(ax, ylabel, title)
    return finish_panels(out, fig, axes, drawn)


@figure("entropy", "Policy entropy")
def draw_entropy(runs: list[Run], smooth: int) -> Drawn:
    """Token-mean entropy of the policy on the trained batch. DAPO fig. 2: without clip-higher
    it collapses."""
    return _line_panels(train_runs(runs), runs, smooth, [("policy entropy", "entropy (nats / token)", [("actor/entropy", "-", "")])])


@figure("response_length", "Response length and truncation")
def draw_length(runs: list[Run], smooth: int) -> Drawn:
    """Mean and longest response; the shaded band is L_max − L_cache … L_max, where DAPO's soft
    overlong punishment (eq. 13) grows; right: the share cut at L_max."""
    trains = train_runs(runs)
    d = _line_panels(trains, runs, smooth, [
        ("response length", "tokens per response", [("rollout/response_length_mean", "-", "mean"), ("rollout/response_length_max", "--", "max")]),
        ("truncation", "share of responses cut at L_max", [("rollout/truncated_frac", "-", "")]),
    ])
    if d.fig is not None:
        ax = d.fig.axes[0]
        for r in trains:
            lmax, lcache = number(r.config.get("max_response_len")), number(r.config.get("overlong_cache_len"))
            if not lmax or not math.isfinite(lmax):
                d.notes.append(f"{r.label}: no max_response_len in config.json" + (f" (it is {shown(r.config['max_response_len'])})" if r.config.get("max_response_len") else "")
                               + ", L_max not drawn")
                continue
            c = color(r, runs)
            ax.axhline(lmax, color=c, linewidth=1, linestyle="-.", label=f"{r.label} · L_max = {lmax:g}")
            if lcache and math.isfinite(lcache):
                algo = r.config.get("resolved_algo")
                punished = algo.get("overlong_penalty") if isinstance(algo, dict) else None
                ax.axhspan(lmax - lcache, lmax, color=c, alpha=0.12,
                           label=f"{r.label} · L_max − L_cache … L_max" + (" (soft punishment)" if punished else " (no punishment in this algo)" if punished is False else ""))
        legend(ax)
    return d


@figure("clip_fractions", "Clip fractions")
def draw_clipfrac(runs: list[Run], smooth: int) -> Drawn:
    """Share of counted tokens whose gradient the upper and the lower clip remove."""
    return _line_panels(train_runs(runs), runs, smooth, [
        ("clip fractions", "share of counted tokens clipped", [("actor/clipfrac_upper", "-", "upper (A > 0, r > 1 + ε_high)"), ("actor/clipfrac_lower", "--", "lower (A < 0, r < 1 − ε_low)")]),
    ])


def _bucket_low(name: str) -> float | None:
    """The lower edge of a probability bucket 'p0.1-0.2' (None when the name is not one)."""
    try:
        low = float(name[1:].split("-")[0]) if name.startswith("p") else None
    except ValueError:
        return None
    return low if low is not None and math.isfinite(low) else None


def _buckets(r: Run, kind: str) -> tuple[list[str], list[int], list[list[float]], list[tuple[int, float]]]:
    """(bucket names by probability, steps, [bucket][step] fraction, the non-finite (step, value)s)
    of ``actor/clipfrac_by_prob``: a missing, non-numeric (skipped, counted) or non-finite cell is
    NaN (left blank)."""
    steps, dicts = r.objects("actor/clipfrac_by_prob")
    names = sorted({k.split("/", 1)[1] for d in dicts for k in d if k.startswith(kind + "/") and _bucket_low(k.split("/", 1)[1]) is not None},
                   key=_bucket_low)
    grid, bad = [], []
    for b in names:
        row = []
        for s, d in zip(steps, dicts):
            v = d.get(f"{kind}/{b}")
            x = number(v)
            if x is None and v is not None:
                r.skip("metrics.jsonl", f"actor/clipfrac_by_prob.{kind}/{b} at step {s} is {shown(v)}, not a number")
            if x is not None and not math.isfinite(x):
                bad.append((s, x))
                x = None
            row.append(math.nan if x is None else x)
        grid.append(row)
    return names, steps, grid, bad


@figure("clip_by_probability", "Clipping by token probability")
def draw_clip_by_prob(runs: list[Run], smooth: int) -> Drawn:
    """Share of each sampling-probability bucket's tokens that the clip removes, per step (DAPO
    fig. 3a: the upper clip hits low-probability tokens, which clip-higher frees)."""
    out = Drawn()
    have = [r for r in train_runs(runs) if r.has("actor/clipfrac_by_prob")]
    out.notes += [f"{r.label}: no actor/clipfrac_by_prob" for r in train_runs(runs) if r not in have]
    if not have:
        return out
    fig, axes = _figure(2, len(have), height=3.2)
    any_drawn = False
    for i, r in enumerate(have):
        for j, (kind, what) in enumerate((("clip_upper", "upper clip"), ("clip_lower", "lower clip"))):
            ax = axes[2 * i + j]
            names, steps, grid, bad = _buckets(r, kind)
            if not names:
                out.notes.append(f"{r.label}: no {kind} buckets in actor/clipfrac_by_prob")
                continue
            if bad:
                out.notes.append(nonfinite_note(f"{r.label}: actor/clipfrac_by_prob {kind}", bad, shown_as="left blank, × on the bottom edge"))
            # each column spans its step (steps may be missing: columns are drawn at their step)
            edges_x = [s - 0.5 for s in steps] + [steps[-1] + 0.5]
            top = max((v for row in grid for v in row if math.isfinite(v)), default=0.0)
            mesh = ax.pcolormesh(edges_x, range(len(names) + 1), grid, cmap="viridis", vmin=0, vmax=max(top, 1e-3), shading="flat")
            ax.set_yticks([k + 0.5 for k in range(len(names))], [n[1:] for n in names], fontsize=7)
            fig.colorbar(mesh, ax=ax, label="share of bucket's tokens clipped")
            if bad:
                mark_nonfinite(ax, sorted({s for s, _ in bad}), "red", "a bucket")
            _axes(ax, "sampling probability of the token", f"{r.label}: {what} by token probability")
            any_drawn = True
    out.fig = fig if any_drawn else None
    return out


GAP_KEYS = ("rollout/logprob_diff_mean", "rollout/logprob_diff_max", "rollout/mismatch_kl")


@figure("rollout_gap", "Rollout / trainer gap")
def draw_gap(runs: list[Run], smooth: int) -> Drawn:
    """How far the engine's sampling log-probabilities are from the trainer's for the same
    tokens."""
    trains = train_runs(runs)
    if not any(r.has(k) for r in trains for k in GAP_KEYS):
        return Drawn(notes=[f"not logged by these runs ({', '.join(GAP_KEYS)}): nothing to draw"])
    return _line_panels(trains, runs, smooth, [
        ("log-prob gap", "|log π_rollout − log π_trainer| (nats / token)", [("rollout/logprob_diff_mean", "-", "mean"), ("rollout/logprob_diff_max", "--", "max")]),
        ("mismatch KL", "KL(rollout ‖ trainer) (nats / token)", [("rollout/mismatch_kl", "-", "")]),
    ])


@figure("dynamic_sampling", "Dynamic sampling")
def draw_dynamic_sampling(runs: list[Run], smooth: int) -> Drawn:
    """Generation rounds per step and what happened to the prompt groups: kept, or dropped
    because every response was correct or every one wrong (DAPO §3.2)."""
    from matplotlib.ticker import MaxNLocator

    d = _line_panels(train_runs(runs), runs, smooth, [
        ("generation rounds", "rounds per step", [("rollout/ds_rounds", "-", "")]),
        ("prompt groups per step", "groups (G responses each)", [("rollout/ds_kept_groups", "-", "kept"), ("rollout/ds_dropped_all_correct", "--", "dropped: all correct"),
                                                                  ("rollout/ds_dropped_all_wrong", ":", "dropped: all wrong")]),
    ])
    for ax in d.fig.axes if d.fig is not None else []:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts
    return d


@figure("value", "Value model")
def draw_value(runs: list[Run], smooth: int) -> Drawn:
    """Critic loss and explained variance of the values (pretrain-value: on freshly sampled
    responses of the fixed policy)."""
    critics = [r for r in runs if r.stage == "pretrain-value" or (r.stage == "train" and r.has("critic/vf_loss"))]
    d = _line_panels(critics, runs, smooth, [
        ("value loss", "critic/vf_loss (squared error)", [("critic/vf_loss", "-", "")]),
        ("explained variance", "1 − Var(G − V) / Var(G)", [("critic/explained_variance", "-", "")]),
    ])
    if d.fig is not None and any(r.stage == "pretrain-value" for r in critics):
        for ax in d.fig.axes:
            ax.set_xlabel("step (pretrain-value: value steps)")
    for ax in d.fig.axes if d.fig is not None else []:
        if ax.get_title() == "explained variance":
            _floor(ax, EV_FLOOR)
    return d


#: Explained variance is unbounded below (a critic worse than the mean predictor); below this it is
#: drawn at the floor, so that one bad step does not flatten the curves that matter (0 … 1).
EV_FLOOR = -1.0


def _floor(ax: Any, lo: float) -> None:
    """Draw the axis's values below ``lo`` at ``lo``, marked ▼, and say so in the title."""
    import numpy as np

    clipped = False
    for line in ax.get_lines():
        y = np.asarray(line.get_ydata(), dtype=float)
        below = y < lo
        if below.any():
            clipped = True
            line.set_ydata(np.where(below, lo, y))
            x = np.asarray(line.get_xdata(), dtype=float)
            ax.plot(x[below], np.full(below.sum(), lo), linestyle="none", marker="v", color=line.get_color(), markersize=7)
    if clipped:
        ax.relim()  # (the limits were autoscaled to the values before they were clipped)
        ax.autoscale_view()
        ax.set_ylim(bottom=lo - 0.05 * (1 - lo))
        ax.set_title(f"{ax.get_title()} (▼: below {lo:g}, drawn at it)")


@figure("value_bias", "Value and advantage by position, before and after value pretraining")
def draw_bias(runs: list[Run], smooth: int) -> Drawn:
    """VC-PPO's picture, on the same held-out responses before (dashed, open markers) and after
    (solid) value pretraining: the paper finds that a critic initialised from a reward model
    values early tokens low, so early advantages are biased positive, and that value pretraining
    removes the bias."""
    out = Drawn()
    have = [r for r in runs if r.bias is not None]  # runs.read_run checked that before and after are objects
    out.notes += [f"{r.label}: no {'readable ' if (r.path / 'bias.json').is_file() else ''}bias.json" for r in runs if r.stage == "pretrain-value" and r not in have]
    if not have:
        return out
    fig, axes = _figure(2)
    drawn = [False, False]
    for i, (ax, key, ylabel) in enumerate(((axes[0], "value_by_position", "mean value V(s_t)"), (axes[1], "advantage_by_position", "mean advantage Â_t (GAE, λ_actor)"))):
        for r in have:
            for when, style, fill in (("before", "--", "none"), ("after", "-", "full")):
                raw = r.bias[when].get(key)
                ys = numbers(raw) if raw is not None else []
                if ys is None:
                    r.skip("bias.json", f"{when}.{key} is {shown(raw)}, not a list of numbers")
                if not ys:
                    out.notes.append(f"{r.label}: no {'readable ' if raw else ''}{key} {when} pretraining")
                    continue
                xs, bad = list(range(len(ys))), nonfinite(range(len(ys)), ys)
                if bad:
                    out.notes.append(nonfinite_note(f"{r.label}: {key} {when} pretraining", bad, len(ys), at="bin"))
                if len(bad) == len(ys):
                    continue
                vl, c = number(r.bias[when].get("value_loss")), color(r, runs)
                ax.plot(xs, [y if math.isfinite(y) else math.nan for y in ys], style, marker="o", markersize=4, fillstyle=fill, color=c,
                        label=f"{r.label} · {when} pretraining" + (f" (value loss {vl:.3g})" if vl is not None else ""))
                if bad:
                    mark_nonfinite(ax, [x for x, _ in bad], c, f"{r.label} · {when} pretraining")
                drawn[i] = True
        ax.axhline(0, color="grey", linewidth=0.8)
        _axes(ax, ylabel, key.replace("_", " ") + " (held-out responses)", xlabel="token position bin (0 = response start → end)")
    return finish_panels(out, fig, axes, drawn)


@figure("eval", "Evaluation")
def draw_eval(runs: list[Run], smooth: int) -> Drawn:
    """avg@n, pass@k and maj@n with 95% percentile-bootstrap confidence intervals over problems."""
    out = Drawn()
    evals = [r for r in runs if r.stage == "eval" and r.results]
    if not evals:
        return out
    names: list[str] = []
    for r in evals:
        names += [k for k in r.results["metrics"] if k not in names]
    fig, axes = _figure(1, height=3.8)
    fig.set_size_inches(max(6.0, 1.0 + len(names) * (0.6 + 0.5 * len(evals))), 3.8)
    ax, width = axes[0], 0.8 / len(evals)
    any_drawn, not_finite = False, []
    for i, r in enumerate(evals):
        ms = r.results["metrics"]  # name -> {"value": float, "ci": [lo, hi] or None} (runs.eval_metrics)
        out.notes += [f"{r.label}: no {k}" for k in names if k not in ms]
        bad = [(k, ms[k]["value"]) for k in names if k in ms and not math.isfinite(ms[k]["value"])]
        not_finite += [f"{r.label}: {k} is not finite ({v}): not drawn" for k, v in bad]
        at = {k: j + (i - (len(evals) - 1) / 2) * width for j, k in enumerate(names)}
        have = [(at[k], {"name": k, **ms[k]}) for k in names if k in ms and math.isfinite(ms[k]["value"])]
        if bad:
            mark_nonfinite(ax, [at[k] for k, _ in bad], color(r, runs), r.label)
        if not have:
            continue
        bars = ax.bar([x for x, _ in have], [100 * m["value"] for _, m in have], width, color=color(r, runs), label=f"{r.label} ({problems(r)})")
        ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=2)
        with_ci = [(x, m) for x, m in have if m["ci"] is not None and all(map(math.isfinite, m["ci"]))]
        for _, m in have:
            if m["ci"] is None or not all(map(math.isfinite, m["ci"])):
                out.notes.append(f"{r.label}: {m['name']} has no {'finite ' if m['ci'] else ''}confidence interval: drawn without error bars")
        if with_ci:
            v = [100 * m["value"] for _, m in with_ci]
            err = [[max(0.0, y - 100 * m["ci"][0]) for y, (_, m) in zip(v, with_ci)], [max(0.0, 100 * m["ci"][1] - y) for y, (_, m) in zip(v, with_ci)]]
            ax.errorbar([x for x, _ in with_ci], v, yerr=err, fmt="none", ecolor="k", capsize=3)
        any_drawn = True
    out.notes += [n + " (× on the bottom edge)" if any_drawn else n for n in not_finite]
    if not any_drawn:
        return out
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(0, 100)
    ax.set_ylabel("accuracy (%), bars: 95% bootstrap CI")
    ax.set_title("evaluation", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    legend(ax)
    out.fig = fig
    return out


def problems(r: Run) -> str:
    """An eval run's size: 'P problems × n samples'."""
    res = r.results or {}
    p = res.get("problems", "?")
    return f"{p} problem{'' if p == 1 else 's'} × {res.get('n', '?')} samples"


PHASES = (("perf/generate_s", "generate"), ("perf/score_s", "score"), ("perf/prepare_s", "prepare (old log-probs, values)"),
          ("perf/update_critic_s", "update critic"), ("perf/update_actor_s", "update actor"), ("perf/weight_sync_s", "weight sync"))


@figure("time_split", "Time per step")
def draw_time(runs: list[Run], smooth: int) -> Drawn:
    """Seconds per step in each phase (perf/*_s); 'other' is the rest of perf/step_s."""
    from matplotlib import colormaps

    out = Drawn()
    have = [r for r in train_runs(runs) if any(r.has(k) for k, _ in PHASES)]
    out.notes += [f"{r.label}: no perf/*_s phase times" for r in train_runs(runs) if r not in have]
    if not have:
        return out
    fig, axes = _figure(len(have))
    cmap = colormaps["Set2"]
    for ax, r in zip(axes, have):
        ms = r.metrics  # each with an integer step (runs.read_metrics)
        steps = [m["step"] for m in ms]
        bottom = [0.0] * len(ms)
        marked: set[int] = set()
        for i, (key, what) in enumerate(PHASES + (("perf/step_s", "other (rest of the step)"),)):
            raw = [r.value(m, key) for m in ms]  # None: not logged (or not a number: skipped, counted)
            bad = [(s, x) for s, x in zip(steps, raw) if x is not None and not math.isfinite(x)]
            if bad:
                out.notes.append(nonfinite_note(f"{r.label}: {key}", bad, shown_as="left out of the bar, × on the bottom edge"))
                marked |= {s for s, _ in bad}
            vals = [x if x is not None and math.isfinite(x) else 0.0 for x in raw]
            if key == "perf/step_s":  # the part of the step no phase timer covers
                vals = [max(0.0, v - b) if v else 0.0 for v, b in zip(vals, bottom)]
            if any(vals):
                ax.bar(steps, vals, 0.8, bottom=bottom, color=cmap(i), label=what)
                bottom = [b + v for b, v in zip(bottom, vals)]
        if marked:
            mark_nonfinite(ax, sorted(marked), "red", "a phase time")
        _axes(ax, "seconds", f"{r.label}: time per step")
    out.fig = fig
    return out
