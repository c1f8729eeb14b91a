"""`reasonrl eval SET|file` (sets: ``reasonrl.evaluation.sets.EVAL_SETS``): n samples per problem, scored by rule.

Reports avg@n (mean accuracy over all samples = pass@1 estimated from n), pass@k (unbiased
estimator; k = 1, 8, n) and maj@n (majority vote of the extracted answers), each with a percentile
bootstrap confidence interval over problems; writes results.json and samples.jsonl and prints a
rich table. DAPO's AIME settings: n = 32, temperature 1.0, top_p 0.7.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.artifacts import prepare_out_dir, write_json, write_manifest
from reasonrl.config import check, opt, to_dict
from reasonrl.errors import ReasonRLError
from reasonrl.evaluation.sets import EVAL_SETS
from reasonrl.stages.options import ModelOpts, TrackOpts

@dataclass
class EvalConfig(ModelOpts, TrackOpts):
    dataset: str = opt("aime", f"A bundled set ({', '.join(EVAL_SETS)}), a data file, or a prepare-data directory (its validation split).")
    n: int = opt(32, "Samples per problem (DAPO: 32).")
    temperature: float = opt(1.0, "Sampling temperature (DAPO eval: 1.0).")
    top_p: float = opt(0.7, "Nucleus sampling mass (DAPO eval: 0.7).")
    top_k: int = opt(-1, "Top-k sampling (-1 = off).")
    max_response_len: int = opt(1024, "Generation cap in tokens.")
    max_prompt_len: int = opt(2048, "Prompts longer than this are skipped and counted.")
    max_problems: int | None = opt(None, "Evaluate only the first N problems.")
    template: str = opt("dapo", "Prompt template for raw problems: dapo, boxed, none, fewshot or dapo-fewshot.")
    ks: list[int] = opt([1, 8], "pass@k values reported besides pass@n.")
    bootstrap: int = opt(1000, "Bootstrap resamples for the confidence intervals.")
    out: str = opt("runs/eval", "Output directory: results.json, samples.jsonl, manifest.json.")
    overwrite: bool = opt(True, "Replace a previous evaluation in out/.")

    def __post_init__(self) -> None:
        self._check_model()
        self._check_tracking()
        check(self.n >= 1, "n must be >= 1")
        check(self.temperature >= 0 and 0 < self.top_p <= 1, "temperature must be >= 0 and top_p in (0, 1]")
        check(self.max_response_len >= 1, "max_response_len must be >= 1")
        check(self.max_problems is None or self.max_problems >= 1, "max_problems must be >= 1")
        from reasonrl.data.templates import ALL_TEMPLATES

        check(self.template in ALL_TEMPLATES, f"template must be one of {', '.join(ALL_TEMPLATES)}")
        check(all(k >= 1 for k in self.ks), "ks must be positive")


def load_problems(dataset: str, template: str) -> list[dict[str, Any]]:
    """Rows in the prepared (verl) shape: prompt messages, reward_model.ground_truth, data_source."""
    from reasonrl.data.readers import BadRow, NoAnswer, extract_fields, input_files, read_records
    from reasonrl.data.templates import messages_for

    if dataset in EVAL_SETS:
        paths = EVAL_SETS[dataset].paths()
    else:
        p = Path(dataset)
        if p.is_dir() and (p / "validation.parquet").is_file():
            from reasonrl.data import load_prepared

            return load_prepared(p, "validation")
        if not p.exists():
            raise ReasonRLError(f"dataset '{dataset}' not found: use one of {', '.join(EVAL_SETS)} or a data file path")
        paths = [p]
    rows: list[dict[str, Any]] = []
    for path in paths:
        for f in input_files(path):
            bad: list[BadRow] = []
            for rec in read_records(f, skip_bad_rows=False, bad=bad):
                try:
                    fields = extract_fields(rec)
                except (BadRow, NoAnswer) as e:
                    raise ReasonRLError(f"{e}: every evaluation row needs a problem and an answer") from None
                rows.append({
                    "prompt": messages_for(template, fields.problem),
                    "reward_model": {"style": "rule", "ground_truth": str(fields.answer)},
                    "data_source": f.stem,
                    "extra_info": {"where": rec.where},
                })
    if not rows:
        raise ReasonRLError(f"dataset '{dataset}' has no rows")
    return rows


def val_metrics(results: dict[str, Any]) -> dict[str, float]:
    """What the trackers get from results.json: ``val/<metric>`` (with ``_ci_low`` / ``_ci_high``),
    ``val/<source>/<metric>`` per data source, and the response statistics."""
    out: dict[str, float] = {}
    for prefix, metrics in [("val", results["metrics"])] + [(f"val/{src}", m) for src, m in (results.get("by_source") or {}).items()]:
        for k, v in metrics.items():
            out[f"{prefix}/{k}"] = v["value"]
            out[f"{prefix}/{k}_ci_low"], out[f"{prefix}/{k}_ci_high"] = v["ci"]
    for k in ("truncated_frac", "no_answer_frac", "response_length_mean"):
        if k in results:
            out[f"val/{k}"] = results[k]
    return out


def run_eval(cfg: EvalConfig, console: Any = None, *, title: str | None = None) -> dict[str, Any]:
    from rich.console import Console
    from rich.table import Table

    from reasonrl.engines.base import SamplingParams
    from reasonrl.evaluation.metrics import summarize
    from reasonrl.progress import Display
    from reasonrl.samples import generate_rollouts
    from reasonrl.stages.options import open_generation
    from reasonrl.tracking import RunLog

    console = console or Console(stderr=True)
    rows = load_problems(cfg.dataset, cfg.template)
    if cfg.max_problems:
        rows = rows[: cfg.max_problems]
    out = prepare_out_dir(cfg.out, overwrite=cfg.overwrite)
    gen = open_generation(cfg)
    try:
        params = SamplingParams(n=cfg.n, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, max_tokens=cfg.max_response_len, seed=cfg.seed)
        with Display(console, quiet=cfg.quiet) as display:
            display.status(f"eval {cfg.dataset}: {len(rows)} problems × {cfg.n} samples ({gen.engine.name})")
            groups, st = generate_rollouts(gen.engine, gen.tokenizer, gen.scorer, rows, params, max_prompt_len=cfg.max_prompt_len)
    finally:
        gen.close()
    if not groups:
        raise ReasonRLError(f"no problem fits max_prompt_len={cfg.max_prompt_len}: raise --max-prompt-len")
    correct = [[s.correct for s in g] for g in groups]
    answers = [[s.extracted for s in g] for g in groups]
    truths = [g[0].ground_truth for g in groups]
    ks = sorted({*cfg.ks, cfg.n})
    metrics = summarize(correct, answers, truths, ks=ks, n_boot=cfg.bootstrap, seed=cfg.seed)
    by_source: dict[str, Any] = {}
    sources = sorted({g[0].data_source for g in groups})
    if len(sources) > 1:
        for src in sources:
            idx = [i for i, g in enumerate(groups) if g[0].data_source == src]
            by_source[src] = summarize([correct[i] for i in idx], [answers[i] for i in idx], [truths[i] for i in idx], ks=ks, n_boot=cfg.bootstrap, seed=cfg.seed)
    flat = [s for g in groups for s in g]
    results = {
        "dataset": cfg.dataset,
        "model": str(gen.model_dir),
        "problems": len(groups),
        "n": cfg.n,
        "metrics": metrics,
        "by_source": by_source,
        "truncated_frac": sum(s.truncated for s in flat) / len(flat),
        "no_answer_frac": sum(s.extracted is None for s in flat) / len(flat),
        "response_length_mean": sum(s.length for s in flat) / len(flat),
        "skipped_long_prompts": st.skipped_long_prompts,
        "verifier": st.scorer,
        "gen_tokens_per_s": st.gen_tokens / st.gen_seconds if st.gen_seconds else 0.0,
        "engine": gen.engine.name,
    }
    with open(out / "samples.jsonl", "w", encoding="utf-8") as f:
        for g in groups:
            for j, s in enumerate(g):
                f.write(json.dumps({"problem": s.prompt_index, "sample": j, "source": s.data_source, "ground_truth": s.ground_truth,
                                    "extracted": s.extracted, "correct": s.correct, "finish_reason": s.finish_reason,
                                    "length": s.length, "response": s.response}) + "\n")
    write_json(out / "results.json", results)
    with RunLog(out, cfg.report_to, name=str(out), config=to_dict(cfg)) as runlog:
        runlog.log(0, val_metrics(results))
    write_manifest(out, "eval", to_dict(cfg), {"model": str(gen.model_dir)})
    table = Table(title=title or f"eval {cfg.dataset}: {len(groups)} problems × {cfg.n} samples — {gen.model_dir}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("95% CI", justify="right")
    for k, v in metrics.items():
        table.add_row(k, f"{100 * v['value']:.1f}%", f"[{100 * v['ci'][0]:.1f}, {100 * v['ci'][1]:.1f}]")
    console.print(table)
    console.print(f"no answer line in {100 * results['no_answer_frac']:.0f}% of responses, truncated {100 * results['truncated_frac']:.0f}% → {out}")
    return results
