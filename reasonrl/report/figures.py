"""The report's figures: one function per picture, each drawn from what the runs logged.

Every function takes the runs and the smoothing window and returns a :class:`Drawn`: a matplotlib
``Figure`` (None when no run logged anything it needs) and notes on what is missing. Rules: steps
on x, axes labelled with units, one colour per run (the same in every figure), the raw values
(a moving average only with ``smooth`` > 1, drawn over the faint raw curve), nothing filled in.
``FIGURES`` lists them in the report's order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from reasonrl.report.runs import Run

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


def _curves(ax: Any, runs: list[Run], all_runs: list[Run], key: str, smooth: int, notes: list[str], *, style: str = "-", what: str = "") -> bool:
    """One line per run that logged ``key`` (label ``run · what``); notes for those that did not."""
    drawn = False
    for r in runs:
        xs, ys = r.series(key)
        ys = [float(y) for y in ys]
        if not xs:
            notes.append(f"{r.label}: no {key}")
            continue
        c, label = color(r, all_runs), f"{r.label} · {what}" if what else r.label
        if smooth > 1:
            ax.plot(xs, ys, style, color=c, alpha=0.25, linewidth=1)
            ax.plot(xs, smoothed(ys, smooth), style, color=c, label=f"{label} (mean of {smooth})", linewidth=1.8)
        else:
            ax.plot(xs, ys, style, color=c, label=label, marker="." if len(xs) < 40 else None, linewidth=1.6)
        drawn = True
    return drawn


def _line_panels(runs: list[Run], all_runs: list[Run], smooth: int, panels: list[tuple[str, str, list[tuple[str, str, str]]]]) -> Drawn:
    """Panels of curves for ``runs``: (title, y label, [(metric, line style, what it is)]), one
    colour per run of ``all_runs``."""
    out = Drawn()
    fig, axes = _figure(len(panels))
    any_drawn = False
    for ax, (title, ylabel, series) in zip(axes, panels):
        for key, style, what in series:
            any_drawn |= _curves(ax, runs, all_runs, key, smooth, out.notes, style=style, what=what if len(series) > 1 else "")
        _axes(ax, ylabel, title)
    out.fig = fig if any_drawn else None
    return out


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
            lmax, lcache = r.config.get("max_response_len"), r.config.get("overlong_cache_len")
            if not lmax:
                d.notes.append(f"{r.label}: no max_response_len in config.json, L_max not drawn")
                continue
            c = color(r, runs)
            ax.axhline(lmax, color=c, linewidth=1, linestyle="-.", label=f"{r.label} · L_max = {lmax}")
            if lcache:
                punished = (r.config.get("resolved_algo") or {}).get("overlong_penalty")
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


def _buckets(r: Run, kind: str) -> tuple[list[str], list[int], list[list[float]]]:
    """(bucket names by probability, steps, [bucket][step] fraction) of ``actor/clipfrac_by_prob``."""
    steps, dicts = r.series("actor/clipfrac_by_prob")
    names = sorted({k.split("/", 1)[1] for d in dicts for k in d if k.startswith(kind + "/") and k.split("/", 1)[1].startswith("p")},
                   key=lambda b: float(b[1:].split("-")[0]))
    grid = [[float(d.get(f"{kind}/{b}", float("nan"))) for d in dicts] for b in names]
    return names, steps, grid


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
    for i, r in enumerate(have):
        for j, (kind, what) in enumerate((("clip_upper", "upper clip"), ("clip_lower", "lower clip"))):
            ax = axes[2 * i + j]
            names, steps, grid = _buckets(r, kind)
            if not names:
                out.notes.append(f"{r.label}: no {kind} buckets in actor/clipfrac_by_prob")
                continue
            # each column spans its step (steps may be missing: columns are drawn at their step)
            edges_x = [s - 0.5 for s in steps] + [steps[-1] + 0.5]
            top = max((v for row in grid for v in row if v == v), default=0.0)
            mesh = ax.pcolormesh(edges_x, range(len(names) + 1), grid, cmap="viridis", vmin=0, vmax=max(top, 1e-3), shading="flat")
            ax.set_yticks([k + 0.5 for k in range(len(names))], [n[1:] for n in names], fontsize=7)
            fig.colorbar(mesh, ax=ax, label="share of bucket's tokens clipped")
            _axes(ax, "sampling probability of the token", f"{r.label}: {what} by token probability")
    out.fig = fig
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
    return d


@figure("value_bias", "Value and advantage by position, before and after value pretraining")
def draw_bias(runs: list[Run], smooth: int) -> Drawn:
    """VC-PPO's picture, on the same held-out responses before (dashed, open markers) and after
    (solid) value pretraining: the paper finds that a critic initialised from a reward model
    values early tokens low, so early advantages are biased positive, and that value pretraining
    removes the bias."""
    out = Drawn()
    have = [r for r in runs if r.bias and isinstance(r.bias.get("before"), dict) and isinstance(r.bias.get("after"), dict)]
    out.notes += [f"{r.label}: no bias.json" for r in runs if r.stage == "pretrain-value" and r not in have]
    if not have:
        return out
    fig, axes = _figure(2)
    for ax, key, ylabel in ((axes[0], "value_by_position", "mean value V(s_t)"), (axes[1], "advantage_by_position", "mean advantage Â_t (GAE, λ_actor)")):
        for r in have:
            for when, style, fill in (("before", "--", "none"), ("after", "-", "full")):
                ys = r.bias[when].get(key) or []
                if not ys:
                    out.notes.append(f"{r.label}: no {key} {when} pretraining")
                    continue
                vl = r.bias[when].get("value_loss")
                ax.plot(range(len(ys)), ys, style, marker="o", markersize=4, fillstyle=fill, color=color(r, runs),
                        label=f"{r.label} · {when} pretraining" + (f" (value loss {vl:.3g})" if isinstance(vl, (int, float)) else ""))
        ax.axhline(0, color="grey", linewidth=0.8)
        _axes(ax, ylabel, key.replace("_", " ") + " (held-out responses)", xlabel="token position bin (0 = response start → end)")
    out.fig = fig
    return out


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
    for i, r in enumerate(evals):
        ms = r.results["metrics"]
        have = [(j, ms[k]) for j, k in enumerate(names) if k in ms]
        vals = [100 * float(m["value"]) for _, m in have]
        err = [[v - 100 * float(m["ci"][0]) for v, (_, m) in zip(vals, have)], [100 * float(m["ci"][1]) - v for v, (_, m) in zip(vals, have)]]
        bars = ax.bar([j + (i - (len(evals) - 1) / 2) * width for j, _ in have], vals, width, yerr=err, capsize=3, color=color(r, runs),
                      label=f"{r.label} ({problems(r)})")
        ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=2)
        out.notes += [f"{r.label}: no {k}" for k in names if k not in ms]
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
        ms = [m for m in r.metrics if "step" in m]
        steps = [int(m["step"]) for m in ms]
        bottom = [0.0] * len(ms)
        for i, (key, what) in enumerate(PHASES + (("perf/step_s", "other (rest of the step)"),)):
            if key == "perf/step_s":  # the part of the step no phase timer covers
                vals = [max(0.0, float(m[key]) - b) if m.get(key) is not None else 0.0 for m, b in zip(ms, bottom)]
            else:
                vals = [float(m.get(key) or 0.0) for m in ms]
            if any(vals):
                ax.bar(steps, vals, 0.8, bottom=bottom, color=cmap(i), label=what)
                bottom = [b + v for b, v in zip(bottom, vals)]
        _axes(ax, "seconds", f"{r.label}: time per step")
    out.fig = fig
    return out
