"""Before/after evidence for a pure refactor: a set of small full runs whose weights and metrics must
come out bitwise the same.

    python bench/refactor_golden.py --out /tmp/golden-before.json          # on the commit before
    python bench/refactor_golden.py --out /tmp/golden-after.json           # on the commit after
    python bench/refactor_golden.py --compare /tmp/golden-before.json /tmp/golden-after.json

Each case is an ordinary CLI run on the tiny random model taught the answer format (tests/toyhelp.py),
fp32 on the HF engine unless it names vLLM, in its own process (clean torch state, one thread). What
is recorded per case: sha256 of every tensor of the final policy (and critic, LoRA adapter), the
metrics.jsonl and validation.jsonl records without the timing keys (``perf/``, ``*_s``, tokens per
second, memory), the checkpoint's trainer state. Same machine, same CPU, both sides: fp32 rounding
differs between CPUs, so a JSON from another machine is not a baseline.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

SMALL = ["--dtype", "fp32", "--group-size", "4", "--max-response-len", "8", "--seed", "3", "--prompts-per-step", "2",
         "--mini-batch-size", "4", "--micro-batch-size", "2", "--overlong-cache-len", "2", "--lr", "1e-3", "--max-gen-rounds", "2",
         "--save-every", "1"]
VAL = ["--val-every", "2", "--val-n", "2", "--val-bootstrap", "50", "--val-max-response-len", "8", "--save-best", "val/avg@2"]

# name → (extra train args, needs the pretrained critic)
CASES: dict[str, tuple[list[str], bool]] = {
    "dapo-val": (["--algo", "dapo", "--engine", "hf", "--steps", "4", *VAL], False),
    "dapo-partial": (["--algo", "dapo", "--engine", "hf", "--steps", "4", "--partial-rollout-len", "2", "--max-gen-rounds", "4", "--keep-rollouts"], False),
    "dapo-partial-stale": (["--algo", "dapo", "--engine", "hf", "--steps", "4", "--partial-rollout-len", "2", "--max-gen-rounds", "4", "--max-staleness", "1",
                            "--mask-stale-prefix"], False),
    "dapo-lora": (["--algo", "dapo", "--engine", "hf", "--steps", "3", "--lora-rank", "4", "--lr", "1e-2"], False),
    "grpo-vllm": (["--algo", "grpo", "--engine", "vllm", "--steps", "3", *VAL], False),
    "ppo": (["--algo", "ppo", "--engine", "hf", "--steps", "3"], False),
    "vcppo": (["--algo", "vcppo", "--engine", "hf", "--steps", "3"], True),
    "dapo-entropy": (["--algo", "dapo", "--engine", "hf", "--steps", "3", "--entropy-coef", "0.004", "--entropy-target", "1.0"], False),
    "dapo-async": (["--algo", "dapo", "--engine", "hf", "--steps", "4", "--async-steps", "1", "--engine-threads", "1", *VAL], False),
}
TIMING = ("perf/", "time", "_s", "tok/s", "tokens_per_s", "mem", "rss", "elapsed", "eta", "wall")


def _cli(*args: object, env: dict) -> None:
    r = subprocess.run([sys.executable, "-m", "reasonrl.cli", *[str(a) for a in args]], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{args[:1]} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")


def _tensors(d: Path) -> dict[str, str]:
    import torch
    from safetensors.torch import load_file

    out: dict[str, str] = {}
    for f in sorted(d.rglob("*.safetensors")):
        for k, t in sorted(load_file(str(f)).items()):
            out[f"{f.relative_to(d)}:{k}"] = hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest() + str(t.dtype)
    return out


def _records(p: Path) -> list[dict]:
    if not p.is_file():
        return []
    keep = []
    for ln in p.read_text().splitlines():
        if ln:
            r = json.loads(ln)
            keep.append({k: v for k, v in r.items() if not any(t in k for t in TIMING)})
    return keep


def _state(out: Path) -> dict:
    ck = out / "checkpoints"
    steps = sorted((p for p in ck.glob("step_*") if p.is_dir()), key=lambda p: int(p.name.split("_")[1])) if ck.is_dir() else []
    if not steps:
        return {}
    f = steps[-1] / "trainer_state.json"
    if not f.is_file():
        return {}
    s = json.loads(f.read_text())
    return {k: v for k, v in s.items() if not any(t in k for t in TIMING)}


def run(out_json: Path, only: list[str]) -> None:
    from toyhelp import sft_answer_format, toy_rows

    from reasonrl.models.tiny import build_tiny_model

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    result: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="golden-") as tmp:
        t = Path(tmp)
        import torch

        torch.manual_seed(0)
        model = sft_answer_format(build_tiny_model(t / "tiny"), t / "fmt")
        data_file = t / "toy.jsonl"
        data_file.write_text("".join(json.dumps(r) + "\n" for r in toy_rows(200, seed=3)))
        data = t / "data"
        _cli("prepare-data", data_file, "--out", data, "--template", "none", "--val-size", "4", env=env)
        critic = t / "critic"
        for name, (extra, needs_critic) in CASES.items():
            if only and name not in only:
                continue
            if needs_critic and not critic.is_dir():
                _cli("pretrain-value", "--model", model, "--data", data, "--out", critic, "--engine", "hf", "--steps", "2",
                     "--eval-prompts", "2", "--dtype", "fp32", "--group-size", "4", "--max-response-len", "8", "--seed", "3",
                     "--prompts-per-step", "2", "--mini-batch-size", "4", "--micro-batch-size", "2", env=env)
                result["_critic"] = {"weights": _tensors(critic / "critic"), "metrics": _records(critic / "metrics.jsonl")}
            out = t / name
            args = ["train", "--model", model, "--data", data, "--out", out, *SMALL, *extra]
            if needs_critic:
                args += ["--critic", critic]
            _cli(*args, env=env)
            result[name] = {"weights": _tensors(out / "policy"), "metrics": _records(out / "metrics.jsonl"),
                            "validation": _records(out / "validation.jsonl"), "state": _state(out)}
            print(f"{name}: {len(result[name]['weights'])} tensors, {len(result[name]['metrics'])} steps", flush=True)
    out_json.write_text(json.dumps(result, indent=1, sort_keys=True))


def compare(a: Path, b: Path) -> int:
    x, y = json.loads(a.read_text()), json.loads(b.read_text())
    bad = 0
    for name in sorted(set(x) | set(y)):
        if name not in x or name not in y:
            print(f"{name}: only in {'before' if name in x else 'after'}")
            bad += 1
            continue
        for part in sorted(set(x[name]) | set(y[name])):
            if x[name].get(part) != y[name].get(part):
                bad += 1
                u, v = x[name].get(part), y[name].get(part)
                diff = ""
                if isinstance(u, dict) and isinstance(v, dict):
                    diff = ", ".join(k for k in sorted(set(u) | set(v)) if u.get(k) != v.get(k))[:400]
                elif isinstance(u, list) and isinstance(v, list):
                    diff = "; ".join(f"step {i}: " + ", ".join(k for k in sorted(set(p) | set(q)) if p.get(k) != q.get(k))
                                     for i, (p, q) in enumerate(zip(u, v)) if p != q)[:400] or f"{len(u)} vs {len(v)} records"
                print(f"{name}/{part} differs: {diff}")
            else:
                print(f"{name}/{part}: same")
    print("SAME" if not bad else f"{bad} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--compare", nargs=2, type=Path)
    a = ap.parse_args()
    if a.compare:
        raise SystemExit(compare(*a.compare))
    if not a.out:
        ap.error("--out or --compare")
    run(a.out, a.only)
