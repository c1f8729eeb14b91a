"""`reasonrl rollout`: G responses per prompt from a policy, scored, written as parquet.

The artifact feeds the next stages: `pretrain-value --rollouts DIR` trains a critic on its responses
(VC-PPO's offline value pretraining; the manifest names the policy that sampled them, with its
weights' sha256), and `train --filter-rollouts DIR` keeps only the prompts whose pass rate says there is
something to learn."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reasonrl.artifacts import hash_weights, write_json, write_manifest
from reasonrl.config import check, opt, to_dict
from reasonrl.engines.base import engine_label
from reasonrl.interrupts import last_write
from reasonrl.rundir import open_output, releases_claims
from reasonrl.stages.options import ModelOpts, ProgressOpts, RolloutOpts, open_generation


@dataclass
class RolloutConfig(ModelOpts, RolloutOpts, ProgressOpts):
    data: str = opt("runs/data", "Prepared data directory (output of `reasonrl prepare-data`).")
    split: str = opt("train", "Which split to sample prompts from: train or validation.")
    num_prompts: int | None = opt(None, "Prompts to use (in a seeded order); all when omitted.")
    out: str = opt("runs/rollouts", "Output directory: rollouts.parquet, summary.json, manifest.json.")
    overwrite: bool = opt(False, "Replace a finished output directory.")

    def __post_init__(self) -> None:
        self._check_model()
        self._check_rollout()
        check(self.split in ("train", "validation"), "split must be train or validation")
        check(self.num_prompts is None or self.num_prompts >= 1, "num_prompts must be >= 1")


@releases_claims
def run_rollout(cfg: RolloutConfig, console: Any = None) -> dict[str, Any]:
    import random

    from rich.console import Console

    from reasonrl.data import load_prepared
    from reasonrl.engines.base import SamplingParams
    from reasonrl.progress import Display
    from reasonrl.rollouts import generate_rollouts, write_rollouts

    console = console or Console(stderr=True)
    rows = load_prepared(cfg.data, cfg.split)
    if cfg.num_prompts is not None:
        random.Random(cfg.seed).shuffle(rows)
        rows = rows[: cfg.num_prompts]
    outputs = ("rollouts.parquet", "summary.json")
    run = open_output(cfg.out, stage="rollout", outputs=outputs, overwrite=cfg.overwrite, inputs=(cfg.data, cfg.model))
    out = run.path
    gen = open_generation(cfg, rows=len(rows) * cfg.group_size)
    try:
        params = SamplingParams(n=cfg.group_size, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, max_tokens=cfg.max_response_len, seed=cfg.seed)
        with Display(console, quiet=cfg.quiet) as display:
            display.status(f"rollout: {len(rows)} prompts × {cfg.group_size} responses ({engine_label(gen.engine)})")
            groups, st = generate_rollouts(gen.engine, gen.tokenizer, gen.scorer, rows, params, max_prompt_len=cfg.max_prompt_len)
    finally:
        gen.close()
    flat = [s for g in groups for s in g]
    with run.writing(outputs):
        write_rollouts(out / "rollouts.parquet", flat)
    summary = {
        "prompts": st.prompts,
        "samples": st.samples,
        "accuracy": sum(s.correct for s in flat) / len(flat) if flat else 0.0,
        "reward_mean": sum(s.reward for s in flat) / len(flat) if flat else 0.0,
        "truncated_frac": sum(s.truncated for s in flat) / len(flat) if flat else 0.0,
        "gen_tokens": st.gen_tokens,
        "gen_tokens_per_s": st.gen_tokens / st.gen_seconds if st.gen_seconds else 0.0,
        "skipped_long_prompts": st.skipped_long_prompts,
        "scorer": st.scorer,
        "reward": cfg.reward,
        "reward_errors": st.scorer.get("reward_errors", 0),
        "engine": gen.engine.name,
    }
    with run.writing(outputs):
        write_json(out / "summary.json", summary)
        policy = {"path": str(gen.model_dir), "weights_sha256": hash_weights(gen.model_dir)}  # (pretrain-value --rollouts checks it)
        with last_write():  # (a SIGTERM or Ctrl-C from here on is only noted: the run is finished, exit 0)
            write_manifest(out, "rollout", to_dict(cfg), {"data": cfg.data, "model": str(gen.model_dir)}, extra={"reward": cfg.reward_record(), "policy": policy})
    errs = f", {summary['reward_errors']} scored -1 because the reward failed (reward_errors)" if summary["reward_errors"] else ""
    console.print(f"rollout: {st.samples} responses, accuracy {summary['accuracy']:.3f}{errs}, {summary['gen_tokens_per_s']:.0f} tok/s → {out / 'rollouts.parquet'}")
    return summary
