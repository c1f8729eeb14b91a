"""`reasonrl report` and the main job's end: a real main job on the format-taught tiny model (every
stage with a live bar and ETA on a terminal console), its report's PNGs and report.html opened in
headless Chromium; several runs overlaid; missing metrics named, never drawn."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess

import pytest

from clihelp import assert_user_error, run_cli

pytestmark = pytest.mark.slow

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RECIPES = {  # the main job's recipes, shrunk for the tiny model (same keys as stages/*-cpu.toml)
    "prepare-data-cpu.toml": 'template = "none"\nval_size = 4\nseed = 0\ndecontaminate = []\n',
    "pretrain-value-cpu.toml": 'steps = 2\nprompts_per_step = 2\ngroup_size = 4\nmax_response_len = 8\nmini_batch_size = 8\nmicro_batch_size = 4\neval_prompts = 2\ndtype = "fp32"\n',
    "train-dapo-cpu.toml": ('algo = "dapo"\nsteps = 3\nprompts_per_step = 2\ngroup_size = 4\noversample = 1.5\nmax_gen_rounds = 3\nmax_response_len = 8\n'
                            'overlong_cache_len = 2\nlr = 1e-4\nmini_batch_size = 8\nmicro_batch_size = 4\ndtype = "fp32"\n'
                            'val_every = 3\nval_n = 2\nval_bootstrap = 50\nval_max_response_len = 8\n'),
    "eval-cpu.toml": 'n = 4\nmax_response_len = 8\nks = [1, 4]\nbootstrap = 100\ndtype = "fp32"\n',
    "eval-aime-cpu.toml": 'n = 1\nmax_response_len = 4\nks = [1]\nbootstrap = 20\ndtype = "fp32"\n',
}
STAGES = [("1/5 prepare-data  (", "prepare-data: dedupe + decontaminate"), ("2/5 pretrain-value (VC-PPO)  (", "pretrain-value"),
          ("3/5 train --algo dapo  (", "train --algo dapo"), ("4/5 eval: base vs trained on held-out problems  (", "generate"),
          ("5/5 eval aime (a few samples)  (", "generate"), (" report  (", "report: figures")]  # (the main job's rule, a bar under it)


@pytest.fixture(scope="module")
def main_job(tmp_path_factory, format_model, toy_data_file):
    from rich.console import Console

    from reasonrl.stages.main_job import MainJobConfig, run_main_job

    tmp = tmp_path_factory.mktemp("mainjob")
    recipes = tmp / "recipes"
    recipes.mkdir()
    for name, body in RECIPES.items():
        (recipes / name).write_text(body)
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=200)  # a terminal: the bars are drawn
    res = run_main_job(MainJobConfig(model=str(format_model), data=str(toy_data_file), out=str(tmp / "main"), recipes=str(recipes), engine="hf",
                                     aime_problems=1, seed=0), console)
    return tmp / "main", res, ANSI.sub("", buf.getvalue().replace("\r", "\n"))


def test_main_job_shows_a_bar_with_eta_in_every_stage_and_ends_with_the_report(main_job):
    out, res, console = main_job
    heads = [console.index(h) for h, _ in STAGES]
    assert heads == sorted(heads), "stages out of order"
    for (head, bar), start, end in zip(STAGES, heads, heads[1:] + [len(console)]):
        seg = console[start:end]
        assert re.search(re.escape(bar) + r".*\d+/\d+.*eta", seg), f"{head}: no '{bar}' bar with ETA in\n{seg[:2000]}"
    report = out / "report" / "report.html"
    assert res["report"] == str(report) and report.is_file()
    assert console.rstrip().endswith(f"report: {report}")


def test_main_job_writes_the_paired_gain(main_job):
    """trained − base in avg@n over the same held-out problems, with a paired bootstrap interval."""
    out, res, console = main_job
    summary = json.loads((out / "summary.json").read_text())
    d = summary["delta"]["avg@4"]
    base, trained = res["base"]["per_problem"]["avg@4"], res["trained"]["per_problem"]["avg@4"]
    assert d["problems"] == len(base) == len(trained) == 4
    assert abs(d["value"] - (sum(trained) - sum(base)) / 4) < 1e-12 and d["ci"][0] <= d["value"] <= d["ci"][1]
    assert summary["base"] == res["base"]["metrics"] and summary["minutes"] > 0
    assert "paired gain (trained − base, same 4 problems) avg@4:" in console
    val = [json.loads(ln) for ln in (out / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in val if "val/avg@2" in m] == [0, 3]  # validation on in the main job


def _figures(html: str) -> list[str]:
    return re.findall(r"<img src='data:image/png;base64,[A-Za-z0-9+/=]+' alt='([^']+)'>", html)


def test_report_of_the_main_job_writes_the_pngs_and_a_self_contained_html(main_job):
    from PIL import Image

    from reasonrl.report import FIGURES

    out, _, _ = main_job
    rep = out / "report"
    pngs = sorted(p.stem for p in rep.glob("*.png"))
    # the main job has every picture, the rollout/trainer gap included (logged every step)
    assert pngs == sorted(f.name for f in FIGURES if f.name != "ablation")  # (the rungs of a `reasonrl ablate`: tests/stages/test_ablate.py)
    for p in rep.glob("*.png"):
        im = Image.open(p).convert("L")
        lo, hi = im.getextrema()
        assert im.width >= 400 and im.height >= 250 and hi - lo > 100, p.name  # drawn, not blank
    html = (rep / "report.html").read_text()
    assert len(_figures(html)) == len(pngs)
    assert "alt='Rollout / trainer gap'" in html  # the trainer logs the gap every step
    assert not re.search(r"(src|href)=['\"]?(https?:|//)", html) and "<script" not in html  # no network, nothing to run
    for label in ("critic", "train", "eval_base", "eval_trained", "eval_aime"):
        assert f"<td>{label}</td>" in html
    man = json.loads((rep / "manifest.json").read_text())
    assert man["stage"] == "report" and len(man["figures"]) == len(pngs)


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)  # type: ignore[return-value]
    pytest.skip("no Chromium: scripts/install.sh installs Debian's chromium package")


def test_report_html_in_headless_chromium_shows_every_figure(main_job, tmp_path):
    """Chromium loads report.html from disk: every <img> decodes (naturalWidth > 0, read back from
    the DOM after a load handler marks them), and the page screenshot is not blank."""
    from PIL import Image

    out, _, _ = main_job
    html = (out / "report" / "report.html").read_text()
    n = len(_figures(html))
    probe = tmp_path / "probe.html"  # the report plus a load handler that records what decoded
    probe.write_text(html.replace("</body>", "<script>addEventListener('load', () => { const ok = [...document.images].filter("
                                  "i => i.complete && i.naturalWidth > 0); document.body.dataset.loaded = ok.length; "
                                  "document.body.dataset.widths = ok.map(i => i.naturalWidth).join(','); });</script></body>"))
    chrome = _chromium()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars"]
    dom = subprocess.run([chrome, *flags, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'<body[^>]*data-loaded="(\d+)"[^>]*data-widths="([\d,]*)"', dom)
    assert m, dom[:500]
    assert int(m.group(1)) == n == len(list((out / "report").glob("*.png")))
    assert all(int(w) >= 400 for w in m.group(2).split(","))
    shot = tmp_path / "report.png"
    subprocess.run([chrome, *flags, "--window-size=1280,2400", f"--screenshot={shot}", (out / "report" / "report.html").as_uri()],
                   capture_output=True, timeout=120, check=True)
    im = Image.open(shot).convert("RGB")
    assert im.size == (1280, 2400)
    colours = im.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # text, axes, curves: far from a uniform page
    dark = sum(c for c, rgb in colours if sum(rgb) < 300)
    assert dark > 0.002 * im.width * im.height
    shutil.copy(shot, out / "chromium-screenshot.png")  # kept beside the report for a look (not in it: another test lists its PNGs)


@pytest.fixture(scope="module")
def second_run(main_job, format_model):
    """A GRPO run on the main job's data, to overlay on its DAPO run."""
    out, _, _ = main_job
    grpo = out.parent / "grpo"
    r = run_cli("train", "--algo", "grpo", "--model", format_model, "--data", out / "data", "--out", grpo, "--steps", "2", "--prompts-per-step", "2",
                "--group-size", "4", "--max-response-len", "8", "--mini-batch-size", "8", "--micro-batch-size", "4", "--engine", "hf", "--dtype", "fp32",
                "--report-to", "none")
    assert r.exit_code == 0, r.output
    return grpo


def test_several_runs_overlay_on_the_same_axes_and_missing_metrics_are_named(main_job, second_run, tmp_path):
    from reasonrl.report import collect_runs
    from reasonrl.report.figures import draw_entropy, draw_reward

    out, _, _ = main_job
    # a copy of the GRPO run whose step 2 lost actor/entropy: drawn where logged, named where not
    holey = tmp_path / "holey"
    shutil.copytree(second_run, holey, ignore=shutil.ignore_patterns("checkpoints", "policy", "tensorboard"))
    lines = [json.loads(ln) for ln in (holey / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    lines[1].pop("actor/entropy")
    (holey / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))

    r = run_cli("report", out / "train", second_run, holey, "--out", tmp_path / "rep", "--smooth", "2")
    assert r.exit_code == 0, r.output
    runs, _ = collect_runs([out / "train", second_run, holey])
    labels = [x.label for x in runs]
    assert len(set(labels)) == 3
    ax = draw_reward(runs, 0).fig.axes[1]  # accuracy panel: every run on the same axes, one colour each
    drawn = {ln.get_label(): ln for ln in ax.get_lines()}
    for lab in labels:
        assert f"{lab} · all generated" in drawn
    assert len({str(drawn[f"{lab} · all generated"].get_color()) for lab in labels}) == 3
    ent = draw_entropy(runs, 0)
    xs = {ln.get_label(): list(ln.get_xdata()) for ln in ent.fig.axes[0].get_lines()}
    assert xs[labels[2]] == [1]  # only the step that logged it
    smooth = draw_entropy(runs, 2).fig.axes[0].get_lines()
    assert any("(mean of 2)" in ln.get_label() for ln in smooth) and any(ln.get_alpha() == 0.25 for ln in smooth)  # raw stays visible
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "trailing mean over 2 steps" in html
    assert f"{labels[2]}: no actor/entropy" not in html  # it has it at step 1: drawn there, not called missing
    bias = html.split("<h2 id='value_bias'>")[1].split("<h2")[0]
    assert "Not drawn" in bias  # no pretrain-value run here: its figure is skipped with a note


def test_smoothing_is_a_trailing_mean():
    from reasonrl.report.figures import smoothed

    assert smoothed([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert smoothed([2.0, 4.0], 1) == [2.0, 4.0]


def test_report_bad_input_is_a_one_line_error(tmp_path):
    (tmp_path / "empty").mkdir()
    assert_user_error(run_cli("report", tmp_path / "empty", "--out", tmp_path / "r"), "holds no run")
    assert_user_error(run_cli("report", tmp_path / "nope", "--out", tmp_path / "r"), "is not a run directory")
    assert_user_error(run_cli("report", "--out", tmp_path / "r"), "at least one run directory")
