"""Write the report: one PNG per figure and one self-contained ``report.html`` (figures embedded
as data URIs, inline CSS, no script, no network)."""

from __future__ import annotations

import base64
import html
import io
import time
from dataclasses import dataclass, field
from pathlib import Path

from reasonrl.progress import open_bar
from reasonrl.report.figures import FIGURES, problems
from reasonrl.report.runs import Run, collect_runs


@dataclass
class Report:
    out: Path
    html: Path
    runs: list[Run]
    figures: list[Path] = field(default_factory=list)  # PNGs written, in order
    skipped: dict[str, list[str]] = field(default_factory=dict)  # figure name → why it was not drawn
    notes: dict[str, list[str]] = field(default_factory=dict)  # figure name → what is missing from it, or marked in it
    skipped_records: dict[str, int] = field(default_factory=dict)  # a run's file → how many of its records could not be read (skipped)
    unread: list[str] = field(default_factory=list)  # one note per such file: the count and the first reasons


SHOWN = 5  # reasons named per file with skipped records (the rest counted)
CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left}
img{max-width:100%;border:1px solid #eee}.note{color:#8a5300;font-size:.85em}.cap{color:#444}"""


def build_report(paths: list[str | Path], out: str | Path, *, smooth: int = 0, title: str = "reasonrl report") -> Report:
    """Read the runs under ``paths``, draw every figure the runs have data for, write the PNGs and
    ``report.html`` into ``out``."""
    runs, passed_over = collect_runs(paths)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rep = Report(out=out, html=out / "report.html", runs=runs)
    sections: list[str] = []
    bar = open_bar("report: figures", len(FIGURES), unit="figures")
    for spec in FIGURES:
        (out / f"{spec.name}.png").unlink(missing_ok=True)  # never leave a figure of an earlier report
        if bar is not None:
            bar.advance()
        drawn = spec.draw(runs, smooth)
        notes = list(dict.fromkeys(drawn.notes))
        body = f"<p class='cap'>{html.escape(spec.caption)}</p>"
        if drawn.fig is None:
            rep.skipped[spec.name] = notes or ["no run has the data for it"]
            body += f"<p class='note'>Not drawn: {html.escape('; '.join(rep.skipped[spec.name]))}.</p>"
        else:
            png, buf = out / f"{spec.name}.png", io.BytesIO()
            drawn.fig.savefig(buf, format="png")
            png.write_bytes(buf.getvalue())
            rep.figures.append(png)
            uri = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
            body += f"<img src='{uri}' alt='{html.escape(spec.title)}'>"
            if notes:
                rep.notes[spec.name] = notes
                body += "<p class='note'>Notes: " + html.escape("; ".join(notes)) + ".</p>"
        sections.append(f"<h2 id='{spec.name}'>{html.escape(spec.title)}</h2>{body}")
    for r in runs:  # after the figures: they count the values they could not read
        for name, why in r.skipped.items():
            path, reasons = str(r.path / name), list(why)
            rep.skipped_records[path] = len(reasons)
            rep.unread.append(f"{path}: {len(reasons)} record{'s' if len(reasons) > 1 else ''} skipped ({'; '.join(reasons[:SHOWN])}"
                              + (f"; and {len(reasons) - SHOWN} more" if len(reasons) > SHOWN else "") + ")")
    rows = "".join(f"<tr><td>{html.escape(r.label)}</td><td>{r.stage}</td><td>{_size(r)}</td><td>{html.escape(str(r.path))}</td>"
                   f"<td class='note'>{html.escape('; '.join(r.notes))}</td></tr>" for r in runs)
    smooth_note = f"Curves are smoothed with a trailing mean over {smooth} steps, drawn over the raw values." if smooth > 1 else "Curves show the raw logged values (no smoothing)."
    extra = "".join(f"<li>{html.escape(s)}</li>" for s in passed_over)
    unread = "".join(f"<li>{html.escape(s)}</li>" for s in rep.unread)
    doc = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
           f"<h1>{html.escape(title)}</h1><p>{time.strftime('%Y-%m-%d %H:%M')} · {len(rep.figures)} figures · {smooth_note} "
           f"Steps on x; a metric a run did not log is left out and named below its figure, a value that is not finite (NaN, ±inf) "
           f"is a gap in its curve with a × on the bottom edge, named below its figure.</p>"
           f"<table><tr><th>run</th><th>stage</th><th>logged</th><th>path</th><th>notes</th></tr>{rows}</table>"
           + (f"<p class='note'>Passed over:</p><ul class='note'>{extra}</ul>" if extra else "")
           + (f"<p class='note'>Not read (skipped, the rest drawn):</p><ul class='note' id='skipped'>{unread}</ul>" if unread else "")
           + "".join(sections) + "</body></html>")
    rep.html.write_text(doc, encoding="utf-8")
    return rep


def _size(r: Run) -> str:
    if r.stage == "eval":
        return problems(r) if r.results else "-"
    return f"{len(r.metrics)} steps"
