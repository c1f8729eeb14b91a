"""One in-process vLLM engine per rank inside a 2-process torch.distributed job (as under DeepSpeed):
each rank generates on its own (different workloads, no hang), takes a weight update, and closing
the engine leaves the trainer's process group usable."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("vllm")

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SCRIPT = textwrap.dedent(
    """
    import os
    import sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    MODEL, INIT = sys.argv[1], sys.argv[2]

    def worker(rank):
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method="file://" + INIT, rank=rank, world_size=2)
        from reasonrl.engines.base import SamplingParams
        from reasonrl.engines.vllm_engine import VLLMEngine
        from reasonrl.models import load_causal_lm

        eng = VLLMEngine(MODEL, dtype="fp32", seed=rank, max_model_len=512)
        p = SamplingParams(temperature=0, max_tokens=4 + 12 * rank)
        before = eng.generate([[5, 6, 7 + rank]] * (1 + 2 * rank), p)
        sd = {k: v + 0.3 * torch.randn_like(v) for k, v in load_causal_lm(MODEL).state_dict().items()}
        eng.update_weights(sd)
        after = eng.generate([[5, 6, 7 + rank]] * (1 + 2 * rank), p)
        eng.close()
        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t)
        ok = len(before) == 1 + 2 * rank and len(before[0][0].token_ids) == 4 + 12 * rank
        changed = before[0][0].token_ids != after[0][0].token_ids
        # one write() per line: a pipe write under PIPE_BUF is atomic, so the ranks' lines never interleave
        os.write(1, f"RANK {rank} ok={ok} changed={changed} allreduce={t.item()}\\n".encode())
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(worker, nprocs=2)
    """
)


def test_one_engine_per_rank_and_the_group_survives(tiny_model: Path, tmp_path: Path) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    res = subprocess.run([sys.executable, str(script), str(tiny_model), str(tmp_path / "init")], capture_output=True, text=True,
                         timeout=900, cwd=Path(__file__).resolve().parents[2])
    lines = sorted(line for line in res.stdout.splitlines() if line.startswith("RANK"))
    # the ranks' lines with the failure: they say whether a rank died before its result or after (at exit)
    assert res.returncode == 0, (lines, res.stderr[-3000:])
    assert lines == ["RANK 0 ok=True changed=True allreduce=3.0", "RANK 1 ok=True changed=True allreduce=3.0"], res.stderr[-3000:]
