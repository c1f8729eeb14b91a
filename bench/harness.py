"""What the bench scripts share: the regimes' prepared data, `reasonrl train` run as a
subprocess of the real CLI, and the per-step records read back from its ``metrics.jsonl``.

Not a package: the scripts next to it import it by name (Python puts a script's folder first on
``sys.path``).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this tree's reasonrl, in the scripts' own process too
    sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Regime:
    """A benchmark setting: the data `prepare-data` makes and the step's shape."""

    name: str
    inputs: tuple[str, ...]
    prepare_args: tuple[str, ...]
    max_response_len: int
    prompts: int = 8
    group_size: int = 8


def _math500() -> str:
    shared = ROOT.parent / "shared" / "data" / "math500.jsonl"
    return str(shared if shared.is_file() else ROOT / "data" / "math500.jsonl")


REGIMES = {
    # The main job's: the bundled arithmetic set in the few-shot template (a ~107-token prompt shared
    # by the group), answers of ~17 tokens; 32 rows held out as the main job does.
    "fewshot": Regime("fewshot", (str(ROOT / "data" / "addition.jsonl"),), ("--template", "fewshot", "--val-size", "32"), 64),
    # Decode-heavy: MATH-500 problems in the DAPO template (SmolLM2 writes past 256 tokens on most),
    # kept whole (no decontamination against MATH-500 itself, no held-out rows).
    "math": Regime("math", (_math500(),), ("--template", "dapo", "--set", "decontaminate=", "--val-size", "0"), 256),
    # Where long CoT lives, in miniature: the main job's addition chains in their worked-steps
    # template (3-6 numbers, one addition a line), L_max 512, so the lengths' spread and tail count.
    "long": Regime("long", (str(ROOT / "data" / "chains.jsonl"),), ("--template", "chains", "--val-size", "0"), 512),
}


def chat_prompt_ids(tok: Any, template: str, problem: str) -> list[int]:
    """A problem's prompt as the trainer's token ids: ``template``'s messages in the tokenizer's
    chat format, the generation prompt appended."""
    from reasonrl.data.templates import messages_for

    ids = tok.apply_chat_template(messages_for(template, problem), tokenize=True, add_generation_prompt=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def random_response(tok: Any, n: int, g: Any) -> list[int]:
    """``n`` random token ids drawn from ``g`` (a torch.Generator): a forward's time does not depend
    on the tokens' values."""
    import torch

    return torch.randint(3, tok.vocab_size, (n,), generator=g).tolist()


def cli_env() -> dict[str, str]:
    """This tree's reasonrl first on PYTHONPATH; OMP_NUM_THREADS as the `reasonrl` CLI sets it, so
    every framework's process gets the same threads."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), for a result's record and a cache's key."""
    from reasonrl.devices import machine

    return machine()["cpu"]


def cpu_key() -> dict[str, Any]:
    """What makes two timings comparable: the CPU (model name and its bf16/AMX/AVX-512 flags, which
    decide ``--dtype auto`` and the GEMM kernels), the CPUs available and torch's version: a stage
    manifest's ``machine`` (:func:`reasonrl.devices.machine`) under this cache's key names."""
    import torch

    from reasonrl.devices import machine

    m = machine()
    return {"cpu": m["cpu"], "flags": m["cpu_flags"], "cpus": m["cpus"], "torch": torch.__version__}


def run_logged(cmd: list[str], log: Path) -> None:
    """Run ``cmd`` with stdout + stderr into ``log``; a failure exits naming the log and its tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=cli_env(), cwd=ROOT).returncode
    if rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        sys.exit(f"failed (exit {rc}): {' '.join(map(str, cmd))}\n--- {log} (last lines) ---\n{tail}")


def prepare(regime: Regime, workdir: Path) -> Path:
    """The regime's prepared data directory (made once by `reasonrl prepare-data`)."""
    out = workdir / f"data-{regime.name}"
    if not (out / "manifest.json").is_file():
        run_logged([sys.executable, "-m", "reasonrl.cli", "prepare-data", *regime.inputs, *regime.prepare_args, "--out", str(out),
                    "--overwrite"], workdir / "logs" / f"prepare-{regime.name}.log")
    return out


def train(args: list[str], out: Path, log: Path) -> list[dict[str, Any]]:
    """Run ``reasonrl train ARGS --out OUT`` in a fresh process; its metrics, one dict per step.
    The run directory keeps ``metrics.jsonl`` and ``config.json`` (for ``bench/limits.py --run``);
    its checkpoints and final policy are deleted (1.6 GB for SmolLM2-135M)."""
    run_logged([sys.executable, "-m", "reasonrl.cli", "train", *map(str, args), "--out", str(out), "--overwrite"], log)
    for sub in ("checkpoints", "policy"):
        shutil.rmtree(out / sub, ignore_errors=True)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def reasonrl_step(m: dict[str, Any]) -> dict[str, float]:
    """One reasonrl step's record in the bench's common form."""
    return {"step_s": m["perf/step_s"], "gen_tokens": m["rollout/gen_tokens"], "gen_s": m["perf/generate_s"], "score_s": m["perf/score_s"],
            "prompt_len": m.get("rollout/prompt_length_mean", float("nan")),
            **{f"len_{k}": m.get(f"rollout/response_length_{k}", float("nan")) for k in ("mean", "p50", "p90", "p99", "max")}}


def summarize(steps: list[dict[str, float]]) -> dict[str, float]:
    """Median / min / max seconds per step, generated tokens per step and per second (of the step
    and of generation alone), over the timed steps."""
    s = [r["step_s"] for r in steps]
    tok, gen_s = sum(r["gen_tokens"] for r in steps), sum(r["gen_s"] for r in steps)
    return {"steps": len(steps), "s_median": statistics.median(s), "s_min": min(s), "s_max": max(s), "tok_per_step": tok / len(steps),
            "tok_per_s": tok / sum(s), "gen_tok_per_s": tok / gen_s if gen_s else float("nan"),
            "prompt_len": statistics.fmean(r["prompt_len"] for r in steps)}
