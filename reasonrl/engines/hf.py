"""Generation with transformers: batched, left padding, KV cache, our own sampling loop.

Each distinct prompt of a batch is prefilled once and its KV cache shared by its samples (the n
samples of a prompt sit in the same batch as far as ``batch_size`` allows), as vLLM's prefix cache
does; only the last position's logits are computed in the prefill.

The loop keeps only the sampled token's log-probability per step (never the full logits), so a
batch of 256 × 1000 tokens with a 49k vocabulary costs no extra memory. Log-probabilities are
those of the distribution actually sampled from, ``reasonrl.algos.sampling_logits`` (temperature,
then top-k, then top-p over the renormalised top-k set, as vLLM's sampler), the same definition
the trainer scores tokens with; at temperature 0 (greedy) they are ``log_softmax(logits)``.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from reasonrl.algos.logits import Sampling, sampling_logits
from reasonrl.engines.base import Completion, ProgressFn, SamplingParams, prompt_seeds


class HFEngine:
    """The transformers engine. ``batch_size`` rows (prompt × sample) decode together."""

    name = "hf"

    def __init__(self, model_dir: str, *, dtype: str = "auto", seed: int = 0, batch_size: int = 64, model: Any = None) -> None:
        from reasonrl.devices import default_device, torch_dtype
        from reasonrl.models.loading import load_causal_lm, load_tokenizer

        self.dtype = torch_dtype(dtype)
        self.device = torch.device(default_device())
        self.model = model if model is not None else load_causal_lm(model_dir, dtype=self.dtype, device=str(self.device))
        self.model.eval()
        tok = load_tokenizer(model_dir)
        self.eos_ids = {tok.eos_token_id} | set(_as_list(self.model.generation_config.eos_token_id))
        self.eos_ids.discard(None)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else next(iter(self.eos_ids))
        self.batch_size = batch_size
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def update_weights(self, state_dict: dict[str, Any]) -> None:
        with torch.no_grad():
            own = self.model.state_dict()
            for k, v in state_dict.items():
                if k in own:
                    own[k].copy_(v.to(own[k].dtype))

    def close(self) -> None:
        self.model = None

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, progress: ProgressFn | None = None) -> list[list[Completion]]:
        seeds = prompt_seeds(params, len(prompts))
        if seeds and seeds[0] is None:  # unseeded: the engine's own stream picks the prompts' seeds
            seeds = torch.randint(0, 2**62, (len(prompts),), generator=self.generator).tolist()
        rows = [(i, list(p)) for i, p in enumerate(prompts) for _ in range(params.n)]
        row_seeds = [seeds[i] + j for i in range(len(prompts)) for j in range(params.n)]
        # Sort by prompt length so each batch pads little (stable: a prompt's samples stay
        # adjacent, so they share one prefill); results go back by index.
        order = sorted(range(len(rows)), key=lambda j: len(rows[j][1]))
        results: list[Completion | None] = [None] * len(rows)
        for s in range(0, len(order), self.batch_size):
            chunk = order[s : s + self.batch_size]
            outs = self._generate_batch([rows[j][1] for j in chunk], params, [rows[j][0] for j in chunk], [row_seeds[j] for j in chunk])
            for j, c in zip(chunk, outs):
                results[j] = c
            if progress is not None:
                progress(len(outs), sum(len(c.token_ids) for c in outs))
        grouped: list[list[Completion]] = [[] for _ in prompts]
        for (i, _), c in zip(rows, results):
            assert c is not None
            grouped[i].append(c)
        return grouped

    def _generate_batch(self, prompts: list[list[int]], p: SamplingParams, keys: list[int], seeds: list[int]) -> list[Completion]:
        """Rows ``prompts`` (equal ``keys`` = the same prompt) → one completion per row. Each row
        samples with its own generator (``seeds``), so its tokens do not depend on the batch."""
        from transformers import DynamicCache

        B = len(prompts)
        first: dict[int, int] = {}
        for k in keys:
            first.setdefault(k, len(first))
        uniq = [prompts[keys.index(k)] for k in first]
        dev = self.device
        expand = torch.tensor([first[k] for k in keys], dtype=torch.long, device=dev)  # (B,) row → unique prompt
        L = max(len(x) for x in uniq)
        ids = torch.full((len(uniq), L), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(uniq), L), dtype=torch.long)
        for b, x in enumerate(uniq):
            ids[b, L - len(x) :] = torch.tensor(x, dtype=torch.long)
            attn[b, L - len(x) :] = 1
        ids, attn = ids.to(dev), attn.to(dev)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        # Prefill the distinct prompts once, then give every row its prompt's cache.
        logits0 = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1, :]
        if len(uniq) < B:
            cache.reorder_cache(expand)
        logits0, attn, pos = logits0[expand], attn[expand], pos[expand]
        eos = torch.tensor(sorted(self.eos_ids | set(p.stop_token_ids)), dtype=torch.long, device=dev)
        out_tok = torch.full((B, p.max_tokens), self.pad_id, dtype=torch.long, device=dev)
        out_lp = torch.zeros((B, p.max_tokens), dtype=torch.float32, device=dev)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        lengths = torch.full((B,), p.max_tokens, dtype=torch.long, device=dev)
        stopped = torch.zeros(B, dtype=torch.bool, device=dev)
        cur_pos = pos[:, -1:]
        cur_ids = ids[expand, -1:]  # each step's input (set from the sampled token; step 0 uses logits0)
        sampling = Sampling(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k) if p.temperature > 0 else None
        gens = [torch.Generator(device=dev).manual_seed(int(s) % 2**63) for s in seeds] if sampling is not None else []
        for t in range(p.max_tokens):
            if t == 0:
                logits = logits0.float()
            else:
                logits = self.model(input_ids=cur_ids, attention_mask=attn, position_ids=cur_pos, past_key_values=cache, use_cache=True).logits[:, -1, :].float()
            if p.temperature == 0:
                nxt = logits.argmax(-1)
                lp = torch.log_softmax(logits, -1).gather(-1, nxt[:, None]).squeeze(-1)
            else:
                logp = torch.log_softmax(sampling_logits(logits, sampling), -1)
                nxt = _inverse_cdf(logp.exp(), torch.stack([torch.rand((), generator=g, device=dev) for g in gens]))
                lp = logp.gather(-1, nxt[:, None]).squeeze(-1)
            nxt = torch.where(done, torch.full_like(nxt, self.pad_id), nxt)
            out_tok[:, t] = nxt
            out_lp[:, t] = torch.where(done, torch.zeros_like(lp), lp)
            is_eos = torch.isin(nxt, eos) & ~done
            lengths = torch.where(is_eos, torch.full_like(lengths, t + 1), lengths)
            stopped |= is_eos
            done |= is_eos
            if bool(done.all()):
                break
            attn = torch.cat([attn, torch.ones((B, 1), dtype=torch.long, device=dev)], dim=1)
            cur_ids = nxt[:, None]
            cur_pos = cur_pos + 1
        out_tok, out_lp, lengths, stopped = out_tok.cpu(), out_lp.cpu(), lengths.cpu(), stopped.cpu()
        res = []
        for b in range(B):
            n = int(lengths[b])
            res.append(Completion(out_tok[b, :n].tolist(), out_lp[b, :n].tolist(), "stop" if bool(stopped[b]) else "length"))
        return res


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs`` (B, V) from its uniform draw ``u`` (B,): the first token whose
    cumulative probability reaches u (probability-0 tokens are never chosen)."""
    cdf = probs.cumsum(-1)
    return torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1)).squeeze(-1).clamp(max=probs.shape[-1] - 1)


def _as_list(x: Any) -> list[Any]:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]
