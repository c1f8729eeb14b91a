"""Samples: G responses per prompt from the generation engine, decoded, scored, recorded.

`reasonrl rollout`, `reasonrl eval` and every training step use this same code. A rollout record holds the prompt,
the response text and token ids, the sampling logprobs, the finish reason, whether it was
truncated, the rule reward, correctness and the group id; ``write_rollouts`` stores them as parquet.
"""

from __future__ import annotations

import time
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from reasonrl.artifacts import open_new
from reasonrl.engines.base import GenerationEngine, SamplingParams
from reasonrl.progress import phase


@dataclass
class Sample:
    group: int
    prompt_index: int
    prompt: str
    prompt_ids: list[int]
    response: str
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    truncated: bool
    ground_truth: str
    reward: float = 0.0  # rule reward (+1/-1), before shaping
    correct: bool = False
    extracted: str | None = None
    score_status: str = "ok"
    shaped_reward: float = 0.0  # reward + soft overlong punishment (when the algo uses it)
    data_source: str = ""
    kept: bool = True  # False when dynamic sampling dropped (or trimmed) its group
    pad: bool = False  # a copy that only evens out the ranks' shares: no loss, no metric
    versions: list[int] = field(default_factory=list)  # the policy version (training step) that sampled each response token (partial rollouts; empty: the collecting step's)

    @property
    def length(self) -> int:
        return len(self.response_ids)

    def to_dict(self) -> dict[str, Any]:
        """The fields, lists copied: ``dataclasses.asdict`` without its element-by-element deep copy
        (80x slower on long responses)."""
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), list) else v) for f in dataclasses.fields(self)}


@dataclass
class RolloutStats:
    prompts: int = 0
    samples: int = 0
    gen_tokens: int = 0
    gen_seconds: float = 0.0
    score_seconds: float = 0.0
    skipped_long_prompts: int = 0
    scorer: dict[str, int] = field(default_factory=dict)

    def merge(self, other: "RolloutStats") -> None:
        self.prompts += other.prompts
        self.samples += other.samples
        self.gen_tokens += other.gen_tokens
        self.gen_seconds += other.gen_seconds
        self.score_seconds += other.score_seconds
        self.skipped_long_prompts += other.skipped_long_prompts
        for k, v in other.scorer.items():
            self.scorer[k] = self.scorer.get(k, 0) + v


def prompt_text(row: dict[str, Any], tokenizer: Any) -> str:
    """The chat-formatted prompt (generation prompt appended) for a prepared row."""
    messages = row["prompt"]
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    messages = [dict(m) for m in messages]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n".join(m["content"] for m in messages) + "\n"


def problem_text(row: dict[str, Any]) -> str:
    """The problem as the user wrote it: the prompt's last user message (the whole prompt when it is one text)."""
    messages = row["prompt"]
    if isinstance(messages, str):
        return messages
    users = [m for m in messages if m.get("role") == "user"] or list(messages)
    return str(users[-1]["content"]) if users else ""


def reward_info(row: dict[str, Any], data_source: str) -> dict[str, Any]:
    """What a reward plug-in gets besides the response and the ground truth (docs/rewards.md)."""
    return {"prompt": problem_text(row), "data_source": data_source, "extra_info": dict(row.get("extra_info") or {})}


def generate_rollouts(
    engine: GenerationEngine,
    tokenizer: Any,
    scorer: Any,
    rows: Sequence[dict[str, Any]],
    params: SamplingParams,
    *,
    max_prompt_len: int,
    group_ids: Sequence[int] | None = None,
    row_offset: int = 0,
    display: Any = None,
) -> tuple[list[list[Sample]], RolloutStats]:
    """Sample ``params.n`` responses for each row; return one list of samples per kept prompt.

    ``group_ids[i]`` names row i's group (default: its position); ``params.seeds``, when given, has
    one seed per row. Rows whose prompt is longer than ``max_prompt_len`` are skipped and counted
    (one with more characters than that many tokens can have without being tokenised:
    :func:`reasonrl.models.tokens.fitting_ids`).

    Progress goes to ``display`` (a ``reasonrl.progress.Display``; default: the current one, if
    any): a generation bar fed by the engine's ``progress`` callback (responses done of all, tok/s,
    ETA) and a scoring line. Without a display the engine gets one plain call, as always."""
    stats = RolloutStats()
    texts, ids, kept = [], [], []
    for i, row in enumerate(rows):
        text, tok_ids = fit_prompt(row, tokenizer, max_prompt_len)
        if tok_ids is None:
            stats.skipped_long_prompts += 1
            continue
        texts.append(text)
        ids.append(tok_ids)
        kept.append(i)
    if params.seeds is not None and len(kept) < len(rows):
        params = dataclasses.replace(params, seeds=tuple(params.seeds[i] for i in kept))
    outs = generate_timed(engine, ids, params, stats, unit=f"responses ({len(ids)} prompts × {params.n})", display=display)
    groups = [[new_sample(tokenizer, rows[i], group=group_ids[i] if group_ids is not None else g, prompt_index=row_offset + i, prompt=text,
                          prompt_ids=p_ids, response_ids=c.token_ids, logprobs=c.logprobs, finish_reason=c.finish_reason) for c in comps]
              for g, (i, text, p_ids, comps) in enumerate(zip(kept, texts, ids, outs))]
    stats.prompts = len(groups)
    stats.gen_tokens = sum(s.length for g in groups for s in g)
    score_groups(scorer, groups, [rows[i] for i in kept], stats, display=display)
    return groups, stats


def fit_prompt(row: dict[str, Any], tokenizer: Any, max_prompt_len: int) -> tuple[str, list[int] | None]:
    """``row``'s chat-formatted prompt and its token ids; None for the ids when the prompt is longer
    than ``max_prompt_len`` (one with more characters than that many tokens can have is not
    tokenised: :func:`reasonrl.models.tokens.fitting_ids`)."""
    from reasonrl.models.tokens import fitting_ids

    text = prompt_text(row, tokenizer)
    return text, fitting_ids(text, tokenizer, max_prompt_len)


def generate_timed(engine: GenerationEngine, prompts: Sequence[Sequence[int]], params: SamplingParams, stats: RolloutStats, *, unit: str,
                   display: Any = None) -> list[Any]:
    """One engine call: ``params.n`` completions of each of ``prompts`` (token ids), behind a
    generation bar of ``len(prompts) × params.n`` responses (``unit`` names them); its time is added
    to ``stats.gen_seconds``. Made even with no prompt: with --engine-tp N, generate is collective
    over the N ranks of an engine group (each brings its prompts, the group generates their union)."""
    t0 = time.perf_counter()
    with phase("generate", len(prompts) * params.n, unit=unit, display=display) as bar:
        outs = engine.generate(prompts, params, progress=None if bar is None else bar.generated)
    stats.gen_seconds += time.perf_counter() - t0
    return outs


def score_groups(scorer: Any, groups: Sequence[Sequence[Sample]], rows: Sequence[dict[str, Any]], stats: RolloutStats, *, display: Any = None) -> None:
    """Score every sample of ``groups`` (``rows[i]``: group i's prepared row) with
    :func:`score_samples`, counted in ``stats.samples``; the scorer is not called for no sample."""
    flat = [s for g in groups for s in g]
    if flat:
        score_samples(scorer, flat, [row for g, row in zip(groups, rows) for _ in g], stats, display=display)
    stats.samples += len(flat)


def new_sample(tokenizer: Any, row: dict[str, Any], *, group: int, prompt_index: int, prompt: str, prompt_ids: Sequence[int],
               response_ids: Sequence[int], logprobs: Sequence[float], finish_reason: str, versions: Sequence[int] = ()) -> Sample:
    """An unscored sample of ``row``: the response decoded, its ground truth and data source read
    from the row; truncated when the engine stopped it at ``max_tokens`` ("length"); ``versions``:
    the policy version of each token (partial rollouts)."""
    from reasonrl.data.prepared import ground_truth  # (reasonrl.data imports sympy: lazily)

    return Sample(group=group, prompt_index=prompt_index, prompt=prompt, prompt_ids=list(prompt_ids),
                  response=tokenizer.decode(list(response_ids), skip_special_tokens=True), response_ids=list(response_ids),
                  logprobs=list(logprobs), finish_reason=finish_reason, truncated=finish_reason == "length", ground_truth=ground_truth(row),
                  data_source=str(row.get("data_source", "")), versions=list(versions))


def score_samples(scorer: Any, samples: Sequence[Sample], rows: Sequence[dict[str, Any]], stats: RolloutStats, *, display: Any = None) -> None:
    """Score ``samples`` (``rows[i]``: sample i's prepared row) with the rule reward: each gets its
    reward, correctness, extracted answer and status (``shaped_reward`` = reward); the time and the
    scorer's counts are added to ``stats``."""
    t0 = time.perf_counter()
    with phase(f"score {len(samples)} responses", display=display):
        infos = [reward_info(row, s.data_source) for s, row in zip(samples, rows)]
        scores, sstats = scorer.score_batch([s.response for s in samples], [s.ground_truth for s in samples], infos)
    stats.score_seconds += time.perf_counter() - t0
    for k, v in sstats.as_dict().items():
        if k != "seconds":
            stats.scorer[k] = stats.scorer.get(k, 0) + int(v)
    for s, sc in zip(samples, scores):
        s.reward = float(sc.reward)
        s.correct = bool(sc.correct)
        s.extracted = sc.extracted
        s.score_status = sc.status
        s.shaped_reward = s.reward


def write_rollouts(path: str | Path, samples: Sequence[Sample], step: int | None = None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    recs = []
    for s in samples:
        d = s.to_dict()
        d["length"] = s.length
        if step is not None:
            d["step"] = step
        recs.append(d)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(str(path) + ".tmp")
    with open_new(tmp, "wb") as f:  # (a link planted at the temporary path is removed, never written through)
        pq.write_table(pa.Table.from_pylist(recs), f)
    tmp.replace(path)


def read_rollouts(path: str | Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


#: The columns of a rollout artifact that its readers need (`train --filter-rollouts`, `pretrain-value
#: --rollouts`): (the kind of values, what they are). Any other column a `reasonrl rollout` writes
#: has a harmless default (``extracted``, ``score_status``, ``data_source``, ``kept``, ``pad``).
ROLLOUT_COLUMNS: dict[str, tuple[str, str]] = {
    "group": ("int", "the prompt's group"), "prompt_index": ("int", "the prompt's row"), "prompt": ("str", "the chat-formatted prompt"),
    "prompt_ids": ("ids", "the prompt's token ids"), "response": ("str", "the response text"), "response_ids": ("ids", "the response's token ids"),
    "logprobs": ("floats", "the sampling log-probs"), "finish_reason": ("str", "why each response ended"), "truncated": ("bool", "cut at max_response_len"),
    "ground_truth": ("str", "the answer"), "reward": ("number", "the rule reward"), "correct": ("bool", "the pass rates' correctness"),
    "shaped_reward": ("number", "the rewards a critic learns from"),
}


def check_rollout_columns(table: Any, where: str, fix: str) -> None:
    """Every column of :data:`ROLLOUT_COLUMNS` present, of its kind, with no null: else a one-line
    error (``where``: the artifact as the message names it; ``fix``: what to run). A missing
    ``shaped_reward`` trained a critic on all-zero targets, a missing ``correct`` made every prompt
    unsolved, the others were a traceback."""
    import pyarrow.types as pt

    from reasonrl.errors import ReasonRLError

    kinds = {"int": (pt.is_integer, "integers"), "str": (lambda t: pt.is_string(t) or pt.is_large_string(t), "text"),
             "bool": (pt.is_boolean, "booleans"), "number": (lambda t: pt.is_integer(t) or pt.is_floating(t), "numbers"),
             "ids": (lambda t: (pt.is_list(t) or pt.is_large_list(t)) and pt.is_integer(t.value_type), "lists of token ids"),
             "floats": (lambda t: (pt.is_list(t) or pt.is_large_list(t)) and (pt.is_floating(t.value_type) or pt.is_null(t.value_type)), "lists of numbers")}
    names = table.column_names
    for col, (kind, what) in ROLLOUT_COLUMNS.items():
        if col not in names:
            raise ReasonRLError(f"{where}: rollouts.parquet has no '{col}' column ({what}; its columns: {', '.join(names) or 'none'}): "
                                f"not a whole `reasonrl rollout` artifact; run `{fix}`")
        typ = table.schema.field(col).type
        ok, values = kinds[kind]
        if not ok(typ):
            raise ReasonRLError(f"{where}: rollouts.parquet's '{col}' holds {typ}, not {values} ({what}): not a `reasonrl rollout` artifact; run `{fix}`")
        if table.column(col).null_count:
            row = next(i for i, v in enumerate(table.column(col).to_pylist(), 1) if v is None)
            raise ReasonRLError(f"{where}: rollouts.parquet's '{col}' is empty (null) in row {row} ({what}): run `{fix}`")


def _json_object(path: Path) -> dict[str, Any]:
    """A small JSON object file's content, or {} (missing, unreadable, not an object)."""
    import json

    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


@dataclass
class RolloutArtifact:
    """A finished `reasonrl rollout` directory: its manifest and its responses, one group per prompt
    in the order they were sampled."""

    path: Path
    manifest: dict[str, Any]
    groups: list[list[Sample]]

    @property
    def policy(self) -> dict[str, Any]:
        """The policy that sampled it: ``{"path", "weights_sha256"}`` ({} in artifacts older than the record)."""
        return dict(self.manifest.get("policy") or {})

    @property
    def reward(self) -> dict[str, Any]:
        """The reward its responses were scored with (the manifest's record; 'math' before plug-ins)."""
        return dict(self.manifest.get("reward") or {"spec": "math", "file": None, "sha256": None})

    def pass_rates(self) -> dict[str, tuple[int, int]]:
        """(correct, samples) per chat-formatted prompt, over every group of that prompt."""
        out: dict[str, tuple[int, int]] = {}
        for g in self.groups:
            c, n = out.get(g[0].prompt, (0, 0))
            out[g[0].prompt] = (c + sum(s.correct for s in g), n + len(g))
        return out


def load_rollout_artifact(path: str | Path, *, option: str) -> RolloutArtifact:
    """The rollout artifact at ``path`` (a `reasonrl rollout` output directory, or its rollouts.parquet),
    read whole. A missing, unfinished or foreign directory, or an empty one, is a one-line error
    naming ``option`` and the stage to run."""
    from reasonrl.artifacts import MANIFEST, MARKER, read_manifest
    from reasonrl.errors import ReasonRLError

    p = Path(path)
    if p.name == "rollouts.parquet":
        p = p.parent
    hint = f"reasonrl rollout --out {p}"
    wants = (f"{option} takes the directory of a `reasonrl rollout --model … --data … --out DIR` (its rollouts.parquet: each prompt's "
             "responses and rewards); sample one and pass that directory")
    marker = _json_object(p / MARKER)  # (the run marker: whose directory it is, finished or not)
    if marker.get("stage") not in (None, "rollout") and not (p / MANIFEST).is_file():
        raise ReasonRLError(f"{option} {p} is an unfinished `{marker['stage']}` run, not a rollout artifact: {wants}")
    manifest = read_manifest(p, stage="rollout", hint=hint)
    if manifest.get("stage") != "rollout":
        stage = manifest.get("stage")
        raise ReasonRLError(f"{option} {p} is {'a' if stage != 'eval' else 'an'} `{stage}` {'run' if stage == 'train' else 'output'}, not a rollout artifact: {wants}")
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(p / "rollouts.parquet")
    except (OSError, ValueError) as e:
        raise ReasonRLError(f"{option} {p}: rollouts.parquet is unreadable ({type(e).__name__}): run `{hint} --overwrite`") from None
    check_rollout_columns(table, f"{option} {p}", f"{hint} --overwrite")
    recs = table.to_pylist()
    names = {f.name for f in dataclasses.fields(Sample)}
    groups: dict[int, list[Sample]] = {}
    for r in recs:
        s = Sample(**{k: v for k, v in r.items() if k in names})
        groups.setdefault(s.group, []).append(s)
    if not groups:
        raise ReasonRLError(f"{option} {p} holds no responses: run `{hint} --overwrite` on more prompts")
    return RolloutArtifact(p, manifest, list(groups.values()))
