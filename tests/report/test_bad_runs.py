"""`reasonrl report` on run directories it cannot fully read (issue 20, items 11, 12 and 16's corrupt
manifest): a real main job's files (tests/report/data/main) with one thing broken in each test.
What cannot be read is skipped, counted (the manifest's ``skipped_records``, the console line) and
named in report.html, the rest still drawn; non-finite values are marked, never dropped silently;
rc 0, no traceback."""

from __future__ import annotations

import html as htmllib
import json
import math
import shutil
from pathlib import Path

import pytest

from clihelp import assert_user_error, run_cli

DATA = Path(__file__).parent / "data" / "main"
STEPS = [1, 2, 3, 4, 5, 6]  # the train run's metrics.jsonl
TRAIN_FIGURES = ["reward_accuracy", "entropy", "response_length", "clip_fractions", "clip_by_probability", "rollout_gap", "dynamic_sampling",
                 "time_split"]


@pytest.fixture
def runs(tmp_path) -> Path:
    """A copy of the main job's train, critic (pretrain-value) and eval runs, to break."""
    shutil.copytree(DATA, tmp_path / "main")
    return tmp_path / "main"


def report(tmp_path: Path, *paths: Path) -> tuple[dict, str, str]:
    """Run `reasonrl report` on ``paths`` into a new folder: rc 0, no traceback; (its manifest,
    report.html, console)."""
    out = tmp_path / f"rep{len(list(tmp_path.glob('rep*')))}"
    r = run_cli("report", *paths, "--out", out)
    assert r.exit_code == 0 and r.exception is None, r.output
    assert "Traceback" not in r.output
    return json.loads((out / "manifest.json").read_text()), htmllib.unescape((out / "report.html").read_text()), r.output


def lines(run: Path) -> list[str]:
    return (run / "metrics.jsonl").read_text().splitlines()


def write_lines(run: Path, rows: list[str | bytes]) -> None:
    (run / "metrics.jsonl").write_bytes(b"".join((r if isinstance(r, bytes) else r.encode()) + b"\n" for r in rows))


def set_metric(run: Path, step: int, key: str, value) -> None:
    """Rewrite the real line of ``step`` with ``key`` set to ``value`` (NaN/inf as Python's json writes them)."""
    rows = lines(run)
    rec = json.loads(rows[step - 1])
    assert rec["step"] == step and key in rec
    rec[key] = value
    rows[step - 1] = json.dumps(rec)
    write_lines(run, rows)


def drawn_x(run: Path, draw: str, label: str | None = None) -> dict[str, list]:
    """The x data of each line of a figure drawn from ``run`` alone (label → xs)."""
    from reasonrl.report import collect_runs
    from reasonrl.report import figures

    runs, _ = collect_runs([run])
    fig = getattr(figures, draw)(runs, 0).fig
    return {ln.get_label(): [float(x) for x in ln.get_xdata()] for ax in fig.axes for ln in ax.get_lines()}


def unread_note(html: str, path: Path) -> str:
    """The line of report.html's 'Not read' list that names ``path``."""
    assert "<ul class='note' id='skipped'>" in html, "no list of skipped records in report.html"
    items = html.split("<ul class='note' id='skipped'>")[1].split("</ul>")[0].split("<li>")
    named = [i for i in items if i.startswith(f"{path}: ")]
    assert len(named) == 1, items
    return named[0]


# one bad line among the real ones (put after the 2nd): skipped, counted, the 6 real steps still drawn
BAD_LINES = {
    "a list": ("[1, 2]", "line 3: a list, not an object"),
    "a number": ("3", "line 3: an integer, not an object"),
    "a string": ('"abc"', "line 3: a string, not an object"),
    "step a string": ('{"step": "abc", "actor/entropy": 9.0}', "line 3: step is a string (\"abc\"), not an integer"),
    "step null": ('{"step": null, "actor/entropy": 9.0}', "line 3: step is null (null), not an integer"),
    "step a float": ('{"step": 2.5, "actor/entropy": 9.0}', "line 3: step is a number (2.5), not an integer"),
    "no step": ('{"actor/entropy": 9.0}', "line 3: step is missing, not an integer"),
    "not UTF-8": (b'{"step": 9, "actor/entropy": 9.0, "note": "\xff"}', "line 3: not UTF-8 (byte 0xff"),
    "not JSON": ('{"step": 9, "actor/entropy": ', "line 3: not JSON"),
    "nested too deep": ("[" * 100_000, "line 3: not JSON (nested too deep)"),
}


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_a_bad_metrics_line_is_skipped_counted_and_named(runs, tmp_path, case):
    bad, why = BAD_LINES[case]
    train = runs / "train"
    rows = lines(train)
    write_lines(train, rows[:2] + [bad] + rows[2:])
    man, html, console = report(tmp_path, train)
    path = train / "metrics.jsonl"
    assert man["skipped_records"] == {str(path): 1}
    assert why in unread_note(html, path)
    assert "1 unreadable record(s) skipped in 1 file(s)" in " ".join(console.split())
    assert [f"{f}.png" for f in TRAIN_FIGURES] == man["figures"][:len(TRAIN_FIGURES)]  # every train figure, from the good lines
    assert drawn_x(train, "draw_entropy")["train"] == STEPS


def test_a_torn_last_line_is_a_run_stopped_mid_write(runs, tmp_path):
    train = runs / "train"
    (train / "manifest.json").unlink()  # a run killed while it wrote a line
    data = (train / "metrics.jsonl").read_bytes()
    (train / "metrics.jsonl").write_bytes(data + data.splitlines()[0][:40])
    man, html, _ = report(tmp_path, train)
    assert man["skipped_records"] == {str(train / "metrics.jsonl"): 1}
    assert "line 7: torn (the run stopped mid-write)" in unread_note(html, train / "metrics.jsonl")
    assert "incomplete (no manifest.json yet)" in html
    assert drawn_x(train, "draw_entropy")["train"] == STEPS


# one value of a real line made unreadable: that value skipped (counted), the metric drawn at its other steps
BAD_VALUES = {
    "a string": ("actor/entropy", "abc", "draw_entropy", "train", 'actor/entropy at step 2 is a string ("abc"), not a number'),
    "a list": ("actor/entropy", [1, 2], "draw_entropy", "train", "actor/entropy at step 2 is a list ([1, 2]), not a number"),
    "an object": ("rollout/acc_mean", {"a": 1}, "draw_reward", "train · all generated", 'rollout/acc_mean at step 2 is an object ({"a": 1}), not a number'),
    "a boolean": ("actor/clipfrac_upper", True, "draw_clipfrac", "train · upper (A > 0, r > 1 + ε_high)", "actor/clipfrac_upper at step 2 is a boolean (true)"),
    "a phase time": ("perf/generate_s", "slow", "draw_time", None, 'perf/generate_s at step 2 is a string ("slow"), not a number'),
    "clip buckets a string": ("actor/clipfrac_by_prob", "abc", "draw_clip_by_prob", None, "actor/clipfrac_by_prob at step 2 is a string (\"abc\"), not an object"),
}


@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_a_bad_metric_value_is_skipped_counted_and_named(runs, tmp_path, case):
    key, value, draw, label, why = BAD_VALUES[case]
    train = runs / "train"
    set_metric(train, 2, key, value)
    man, html, _ = report(tmp_path, train)
    path = train / "metrics.jsonl"
    assert man["skipped_records"] == {str(path): 1}
    assert why in unread_note(html, path)
    assert [f"{f}.png" for f in TRAIN_FIGURES] == man["figures"][:len(TRAIN_FIGURES)]
    xs = drawn_x(train, draw)
    if label is not None:
        assert xs[label] == [1, 3, 4, 5, 6]  # the other steps still drawn


def test_a_corrupt_manifest_is_named_and_the_run_read_as_unfinished(runs, tmp_path):
    train = runs / "train"
    for bad, why in (("[1, 2]", "a list, not an object"), ('"train"', "a string, not an object"), ('{"stage": "tr', "not JSON"),
                     (b'{"stage": "train\xff"}', "not UTF-8"), ('{"config": {}}', "it names no stage")):
        (train / "manifest.json").write_bytes(bad if isinstance(bad, bytes) else bad.encode())
        man, html, _ = report(tmp_path, train)
        assert f"{train / 'manifest.json'} is corrupt ({why}" in html
        assert man["skipped_records"] == {str(train / "manifest.json"): 1}
        assert why in unread_note(html, train / "manifest.json")
        assert [f"{f}.png" for f in TRAIN_FIGURES] == man["figures"][:len(TRAIN_FIGURES)]


def test_a_corrupt_manifest_with_nothing_else_to_read_is_named_not_called_missing(runs, tmp_path):
    """Issue 20 item 16: not 'holds no run (no manifest.json, metrics.jsonl …)'."""
    broken = runs / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text("[1, 2]")
    line = assert_user_error(run_cli("report", broken, "--out", tmp_path / "r"), f"{broken / 'manifest.json'} is corrupt: a list, not an object",
                             "rerun the stage that wrote it")
    assert "no manifest.json" not in line
    # in a folder of runs: passed over, named, the other runs drawn
    man, html, _ = report(tmp_path, runs)
    assert f"{broken / 'manifest.json'} is corrupt: a list, not an object" in html.split("Passed over:")[1].split("</ul>")[0]
    assert "eval.png" in man["figures"] and "value_bias.png" in man["figures"]


# eval's results.json broken: the readable metrics still drawn
BAD_RESULTS = {  # (how to break it, records skipped, why, the note under the figure)
    "value a string": (lambda r: r["metrics"]["pass@1"].update(value="abc"), 1, 'metrics.pass@1.value is a string ("abc"), not a number', None),
    "value missing": (lambda r: r["metrics"]["pass@1"].pop("value"), 1, "metrics.pass@1.value is missing, not a number", None),
    "ci a string": (lambda r: r["metrics"]["pass@1"].update(ci="wide"), 1, 'metrics.pass@1.ci is "wide", not [low, high] numbers', "pass@1 has no confidence interval"),
    "ci missing": (lambda r: r["metrics"]["pass@1"].pop("ci"), 0, None, "pass@1 has no confidence interval: drawn without error bars"),
    "ci not around the value": (lambda r: r["metrics"]["pass@1"].update(ci=[0.5, 0.9]), 1, "metrics.pass@1.ci [0.5, 0.9] does not hold the value 0.1875",
                                "pass@1 has no confidence interval"),
    "a metric a list": (lambda r: r["metrics"].update({"pass@1": [0.1]}), 1, "metrics.pass@1 is a list, not an object", None),
}


@pytest.mark.parametrize("case", list(BAD_RESULTS))
def test_a_bad_eval_metric_is_skipped_and_the_others_drawn(runs, tmp_path, case):
    break_it, n, why, note = BAD_RESULTS[case]
    ev = runs / "eval"
    res = json.loads((ev / "results.json").read_text())
    break_it(res)
    (ev / "results.json").write_text(json.dumps(res))
    man, html, _ = report(tmp_path, ev)
    assert man["skipped_records"] == ({str(ev / "results.json"): n} if n else {})
    if why:
        assert why in unread_note(html, ev / "results.json")
    assert man["figures"] == ["eval.png"]
    if note:
        assert note in html.split("<h2 id='eval'>")[1].split("<h2")[0]
    from reasonrl.report import collect_runs
    from reasonrl.report.figures import draw_eval

    ticks = [t.get_text() for t in draw_eval(collect_runs([ev])[0], 0).fig.axes[0].get_xticklabels()]
    assert ticks == (["avg@4", "pass@1", "pass@4", "maj@4"] if n == 0 or "ci" in case else ["avg@4", "pass@4", "maj@4"])  # the readable ones drawn


# a whole JSON file unreadable: skipped (1 record), named, what does not need it still drawn
BAD_FILES = {
    "results.json a list": ("eval", "results.json", b"[1, 2]", "the file is a list, not an object", "eval", False),
    "results.json metrics a list": ("eval", "results.json", b'{"metrics": [1]}', "its metrics is a list, not an object", "eval", False),
    "results.json not UTF-8": ("eval", "results.json", b'{"metrics": {"\xff": 1}}', "the file is not UTF-8 (byte 0xff", "eval", False),
    "bias.json a list": ("critic", "bias.json", b"[1, 2]", "the file is a list, not an object", "value_bias", False),
    "bias.json before a string": ("critic", "bias.json", b'{"before": "abc", "after": {}}', "its before is a string, not an object", "value_bias", False),
    "bias.json not UTF-8": ("critic", "bias.json", b'{"before": "\xfe"}', "the file is not UTF-8 (byte 0xfe", "value_bias", False),
    "config.json a list": ("train", "config.json", b"[1, 2]", "the file is a list, not an object", "response_length", True),
    "config.json not JSON": ("train", "config.json", b'{"max_response_len": ', "the file is not JSON", "response_length", True),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_an_unreadable_json_file_is_skipped_and_named(runs, tmp_path, case):
    run, name, content, why, figure, still_drawn = BAD_FILES[case]
    (runs / run / name).write_bytes(content)
    man, html, _ = report(tmp_path, runs)
    path = runs / run / name
    assert man["skipped_records"] == {str(path): 1}
    assert why in unread_note(html, path)
    assert (f"{figure}.png" in man["figures"]) == still_drawn
    assert "reward_accuracy.png" in man["figures"]  # the other runs' figures


def test_a_bad_bias_series_is_skipped_and_the_other_drawn(runs, tmp_path):
    critic = runs / "critic"
    bias = json.loads((critic / "bias.json").read_text())
    bias["after"]["value_by_position"] = ["a", 1]
    (critic / "bias.json").write_text(json.dumps(bias))
    man, html, _ = report(tmp_path, critic)
    assert man["skipped_records"] == {str(critic / "bias.json"): 1}
    assert 'after.value_by_position is ["a", 1], not a list of numbers' in unread_note(html, critic / "bias.json")
    assert "value_bias.png" in man["figures"]
    assert "critic: no readable value_by_position after pretraining" in html


def test_non_finite_values_are_marked_at_their_steps_and_named(runs, tmp_path):
    train = runs / "train"
    set_metric(train, 3, "actor/entropy", math.nan)
    set_metric(train, 4, "actor/entropy", math.inf)
    assert "NaN" in lines(train)[2] and "Infinity" in lines(train)[3]  # as Python's json writes them
    man, html, _ = report(tmp_path, train)
    assert "entropy.png" in man["figures"] and man["skipped_records"] == {}
    note = "train: actor/entropy not finite (NaN at step 3; inf at step 4): marked × on the bottom edge"
    assert note in html.split("<h2 id='entropy'>")[1].split("<h2")[0]
    xs = drawn_x(train, "draw_entropy")
    assert xs["train"] == STEPS  # the line has a gap at 3 and 4 …
    assert xs["train · not finite (×)"] == [3, 4]  # … and a × at each
    from reasonrl.report import collect_runs
    from reasonrl.report.figures import draw_entropy

    mean = [ln for ln in draw_entropy(collect_runs([train])[0], 2).fig.axes[0].get_lines() if ln.get_label() == "train (mean of 2)"]
    assert list(mean[0].get_xdata()) == [1, 2, 5, 6] and all(map(math.isfinite, mean[0].get_ydata()))  # the mean of the finite values only


def test_a_metric_not_finite_at_every_step_is_not_drawn_and_says_why(runs, tmp_path):
    train = runs / "train"
    for s in STEPS:
        set_metric(train, s, "actor/entropy", math.inf)
    man, html, console = report(tmp_path, train)
    assert "entropy.png" not in man["figures"] and not (tmp_path / "rep0" / "entropy.png").exists()
    assert man["skipped"]["entropy"] == ["train: actor/entropy not finite at every step (inf at steps 1, 2, 3, 4, 5, 6): not drawn"]
    assert "Not drawn: train: actor/entropy not finite at every step" in html.split("<h2 id='entropy'>")[1].split("<h2")[0]
    assert "not drawn: " in console and "entropy" in console.split("not drawn: ")[1]
    # in a figure of several panels, the others still drawn; the empty panel says so
    set_metric(train, 1, "actor/entropy", 1.0)
    for s in STEPS:
        set_metric(train, s, "rollout/truncated_frac", math.nan)
    man, html, _ = report(tmp_path, train)
    assert "response_length.png" in man["figures"] and "entropy.png" in man["figures"]
    assert "train: rollout/truncated_frac not finite at every step (NaN at steps 1, 2, 3, 4, 5, 6): not drawn" in html


def test_a_non_finite_eval_value_is_not_drawn_and_named(runs, tmp_path):
    ev = runs / "eval"
    res = json.loads((ev / "results.json").read_text())
    res["metrics"]["pass@1"]["value"] = math.nan
    (ev / "results.json").write_text(json.dumps(res))
    man, html, _ = report(tmp_path, ev)
    assert man["figures"] == ["eval.png"]
    assert "eval: pass@1 is not finite (nan): not drawn" in html
    for k in res["metrics"]:
        res["metrics"][k]["value"] = math.inf
    (ev / "results.json").write_text(json.dumps(res))
    man, _, _ = report(tmp_path, ev)
    assert man["figures"] == [] and "eval: avg@4 is not finite (inf): not drawn" in man["skipped"]["eval"]


def test_explained_variance_below_its_floor_is_drawn_at_it_and_marked():
    """The critic's log holds an explained variance of −4.6e13 (every return of a batch equal, before
    that read 0): drawn at −1 with a ▼, so the other steps' curve (−0.004 …) stays readable."""
    from reasonrl.report.figures import EV_FLOOR, draw_value
    from reasonrl.report.runs import read_run

    d = draw_value([read_run(DATA / "critic", "pretrain-value", True)], 1)
    ax = next(a for a in d.fig.axes if a.get_title().startswith("explained variance"))
    assert "▼" in ax.get_title() and EV_FLOOR - 0.2 <= ax.get_ylim()[0] and ax.get_ylim()[1] <= 1.2
    ys = [y for line in ax.get_lines() for y in line.get_ydata()]
    assert min(ys) == EV_FLOOR and any(-1 < y < 0 for y in ys)
    loss = next(a for a in d.fig.axes if a.get_title() == "value loss")
    assert "▼" not in loss.get_title()


def test_a_run_named_with_a_leading_underscore_is_in_the_legend(tmp_path):
    """An ablation's critics live in _critic/seed-k; matplotlib hides a legend label that starts with
    "_", so the report labels them with their parent (abl/_critic/seed-0)."""
    from reasonrl.report import collect_runs
    from reasonrl.report.figures import draw_value

    shutil.copytree(DATA / "critic", tmp_path / "abl" / "_critic" / "seed-0")
    shutil.copytree(DATA / "train", tmp_path / "abl" / "ppo" / "seed-0")
    runs, _ = collect_runs([tmp_path / "abl" / "_critic" / "seed-0", tmp_path / "abl" / "ppo" / "seed-0"])
    assert [r.label for r in runs] == ["abl/_critic/seed-0", "ppo/seed-0"]
    fig = draw_value(runs, 1).fig
    shown = {t.get_text() for ax in fig.axes for leg in [ax.get_legend()] if leg for t in leg.get_texts()} \
        | {t.get_text() for leg in fig.legends for t in leg.get_texts()}
    assert any("abl/_critic/seed-0" in t for t in shown), shown


def test_the_ablation_figure_draws_a_rung_from_its_finished_runs(tmp_path):
    """A rung whose third seed is still running is drawn from its finished seeds (the running one
    would cut every curve to the steps it has logged), and says so; four panels: validation,
    entropy, response length, truncation."""
    from reasonrl.report import collect_runs
    from reasonrl.report.figures import draw_ablation

    abl = tmp_path / "abl"
    for s in (0, 1, 2):
        shutil.copytree(DATA / "train", abl / "ppo" / f"seed-{s}")
    (abl / "plan.json").write_text(json.dumps({"rungs": [{"name": "ppo"}], "seeds": [0, 1, 2]}))
    running = abl / "ppo" / "seed-2"
    (running / "manifest.json").unlink()
    lines = (running / "metrics.jsonl").read_text().splitlines()
    (running / "metrics.jsonl").write_text(lines[0] + "\n")  # one step so far
    runs, _ = collect_runs([abl])
    assert sorted((r.label, r.complete) for r in runs) == [("seed-0", True), ("seed-1", True), ("seed-2", False)]
    d = draw_ablation(runs, 1)
    assert any("ppo: 1 unfinished run(s) left out (seed-2)" in n for n in d.notes), d.notes
    titles = [ax.get_title() for ax in d.fig.axes]
    assert titles == ["validation accuracy", "policy entropy", "response length", "truncation"]
    ent = d.fig.axes[1]
    assert [t.get_text() for t in ent.get_legend().get_texts()] == ["ppo (2 seeds)"] and len(ent.get_lines()[0].get_xdata()) == len(STEPS)
