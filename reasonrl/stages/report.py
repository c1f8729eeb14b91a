"""`reasonrl report RUN [RUN ...]`: the runs' curves as PNG figures and one self-contained report.html.

Reads train, pretrain-value and eval run directories (or folders of them, such as the main job's
``runs/main``); several runs overlay on the same axes, one colour each. See ``reasonrl.report``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reasonrl.artifacts import write_manifest
from reasonrl.config import check, opt, to_dict
from reasonrl.interrupts import last_write
from reasonrl.rundir import open_output, releases_claims
from reasonrl.stages.options import ProgressOpts


@dataclass
class ReportConfig(ProgressOpts):
    runs: list[str] = opt([], "Run directories (train, pretrain-value, eval) or folders of them (e.g. the main job's runs/main); several overlay on the same axes.")
    out: str = opt("runs/report", "Output directory: one PNG per figure, report.html (self-contained), manifest.json.")
    smooth: int = opt(0, "Moving average over N steps, drawn over the faint raw curve (0 or 1: raw values only).")
    title: str = opt("reasonrl report", "Title of report.html.")

    def __post_init__(self) -> None:
        check(len(self.runs) >= 1, "give at least one run directory: reasonrl report RUN [RUN ...] --out DIR")
        check(self.smooth >= 0, "smooth must be >= 0")


@releases_claims
def run_report(cfg: ReportConfig, console: Any = None) -> Any:
    from rich.console import Console

    from reasonrl.progress import Display
    from reasonrl.report import FIGURES, build_report

    console = console or Console(stderr=True)
    # the old manifest first, then every figure and the page: a rerun killed midway leaves no manifest
    # beside a mix of old and new figures
    outputs = ("report.html", *(f"{f.name}.png" for f in FIGURES))
    run = open_output(cfg.out, stage="report", outputs=outputs, overwrite=True, inputs=cfg.runs)
    with run.writing(outputs):
        with Display(console, quiet=cfg.quiet):
            rep = build_report(cfg.runs, cfg.out, smooth=cfg.smooth, title=cfg.title)
        inputs = {f"{r.label}/{f}": r.path / f for r in rep.runs for f in ("metrics.jsonl", "bias.json", "results.json") if (r.path / f).is_file()}
        with last_write():  # (a SIGTERM or Ctrl-C from here on is only noted: the run is finished, exit 0)
            write_manifest(rep.out, "report", to_dict(cfg), inputs,
                           extra={"figures": [p.name for p in rep.figures], "skipped": rep.skipped, "skipped_records": rep.skipped_records})
    unread = sum(rep.skipped_records.values())
    console.print(f"report: {len(rep.runs)} run(s), {len(rep.figures)} figures" + (f", not drawn: {', '.join(rep.skipped)}" if rep.skipped else "")
                  + (f", {unread} unreadable record(s) skipped in {len(rep.skipped_records)} file(s) (named in report.html)" if unread else "")
                  + f" → {rep.html}")
    return rep
