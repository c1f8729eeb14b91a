"""A model directory's own Python never runs (issue 20, item 2), and a broken config.json is named
as such (item 16).

The evil directory is the tiny model whose config.json gains ``auto_map`` -> ``modeling_evil.py``
in the folder and a ``model_type`` transformers does not ship; importing that file writes a
sentinel. transformers, asked without ``trust_remote_code``, prompts "Do you wish to run the custom
code? [y/N]" and a typed ``y`` imports it: here a user types ``y`` (on a pseudo-terminal, and to
``input()`` in-process) and the sentinel must never appear.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clihelp import assert_user_error, run_cli

ROOT = Path(__file__).resolve().parents[2]

EVIL = '''
import pathlib
pathlib.Path({sentinel!r}).write_text("the model folder's code ran\\n")
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification


class EvilConfig(LlamaConfig):
    model_type = "evil_llama"


class EvilForCausalLM(LlamaForCausalLM):
    config_class = EvilConfig


class EvilForTokenClassification(LlamaForTokenClassification):
    config_class = EvilConfig
'''


def evil_model(src: Path, dst: Path, *, model_type: str = "evil_llama", tokenizer: bool = False) -> tuple[Path, Path]:
    """A copy of ``src`` that asks for its own code (config.json, or tokenizer_config.json with
    ``tokenizer``); returns (directory, sentinel path)."""
    shutil.copytree(src, dst)
    sentinel = dst.parent / f"{dst.name}.SENTINEL"
    (dst / "modeling_evil.py").write_text(EVIL.format(sentinel=str(sentinel)))
    if tokenizer:
        (dst / "tokenization_evil.py").write_text(EVIL.format(sentinel=str(sentinel)))
        t = json.loads((dst / "tokenizer_config.json").read_text())
        t["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", "tokenization_evil.EvilTokenizer"]}
        (dst / "tokenizer_config.json").write_text(json.dumps(t))
    else:
        c = json.loads((dst / "config.json").read_text())
        c.update(model_type=model_type, architectures=["EvilForCausalLM"],
                 auto_map={"AutoConfig": "modeling_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM",
                           "AutoModelForTokenClassification": "modeling_evil.EvilForTokenClassification"})
        (dst / "config.json").write_text(json.dumps(c))
    return dst, sentinel


@pytest.fixture
def evil(tiny_model, tmp_path, monkeypatch):
    """The evil directory; every ``input()`` in this process answers ``y`` (a user saying yes), and
    transformers' module cache of remote code lives under tmp_path."""
    import transformers.dynamic_module_utils as dmu

    monkeypatch.setattr("builtins.input", lambda *a, **k: "y")
    monkeypatch.setattr(dmu, "HF_MODULES_CACHE", str(tmp_path / "hf_modules"))
    return evil_model(tiny_model, tmp_path / "evil")


def _on_a_terminal(args: list[str], env: dict[str, str], deadline_s: float = 420.0) -> tuple[int, str]:
    """Run ``args`` with a pseudo-terminal as stdin, stdout and stderr, typing ``y`` + Enter every
    0.2 s (as a user answering any question with yes) until it exits; (exit code, what it printed)."""
    master, slave = os.openpty()
    p = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT, start_new_session=True)
    os.close(slave)
    os.set_blocking(master, False)
    out = bytearray()
    end = time.monotonic() + deadline_s
    try:
        while time.monotonic() < end:
            try:
                os.write(master, b"y\n")
            except (BlockingIOError, OSError):
                pass
            r, _, _ = select.select([master], [], [], 0.2)
            if r:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed its side
                    chunk = b""
                out += chunk
                if not chunk and p.poll() is not None:
                    break
            elif p.poll() is not None:
                break
        else:
            p.kill()
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)
    return rc, out.decode(errors="replace").replace("\r", "")


@pytest.mark.slow
def test_remote_code_refused_on_a_terminal_with_y_typed(tiny_model, tmp_path):
    """`reasonrl eval file` on a pseudo-terminal, a user typing y: exit 1, one error line, the folder's code never ran."""
    model, sentinel = evil_model(tiny_model, tmp_path / "evil")
    data = tmp_path / "p.jsonl"
    data.write_text('{"problem": "What is 2 + 2?", "answer": "4"}\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400", "HF_MODULES_CACHE": str(tmp_path / "hf_modules"), "HF_HUB_OFFLINE": "1"}
    args = [sys.executable, "-m", "reasonrl.cli", "eval", "file", "--dataset", str(data), "--model", str(model), "--out", str(tmp_path / "ev"),
            "--engine", "hf", "--dtype", "fp32", "--n", "1", "--max-response-len", "4", "--bootstrap", "10", "--report-to", "none"]
    rc, shown = _on_a_terminal(args, env)
    assert not sentinel.exists(), shown[-3000:]
    assert rc == 1, shown[-3000:]
    assert "Traceback" not in shown and "Do you wish to run the custom code" not in shown, shown[-3000:]
    errors = re.findall(r"error: .*", shown)  # (the terminal echoes the typed y's, so a line may start with them)
    assert len(errors) == 1, shown[-3000:]
    assert "auto_map" in errors[0] and "evil_llama" in errors[0] and "never runs a model's code" in errors[0], errors[0]


def test_loaders_refuse_and_never_run_the_code(evil):
    from reasonrl.errors import ReasonRLError
    from reasonrl.models.loading import check_weights, load_causal_lm, load_tokenizer, resolve_policy
    from reasonrl.models.value import load_value_model, new_value_model

    model, sentinel = evil
    for load in (load_tokenizer, load_causal_lm, load_value_model, new_value_model, check_weights, lambda p: check_weights(resolve_policy(p))):
        with pytest.raises(ReasonRLError, match="asks to run the folder's own Python .*auto_map.*never runs a model's code"):
            load(model)
        assert not sentinel.exists()


def test_past_the_check_every_load_still_says_no(evil, monkeypatch):
    """Belt and braces: with the up-front refusal switched off, each loader passes
    trust_remote_code=False, so transformers refuses too (no prompt, no import)."""
    import reasonrl.models.loading as loading
    import reasonrl.models.value as value
    from reasonrl.errors import ReasonRLError

    model, sentinel = evil
    monkeypatch.setattr(loading, "check_model_config", lambda p: {}, raising=False)
    monkeypatch.setattr(value, "check_model_config", lambda p: {}, raising=False)
    loading.load_tokenizer(model)  # its tokenizer_config.json names a transformers class: no code asked for
    assert not sentinel.exists()
    for load in (loading.load_causal_lm, value.load_value_model, value.new_value_model):
        with pytest.raises(ReasonRLError):
            load(model)
        assert not sentinel.exists(), load


def test_vllm_engine_options_never_trust_remote_code(evil, monkeypatch):
    """The in-process vLLM engine passes trust_remote_code=False and refuses the directory before
    vLLM is imported for it."""
    pytest.importorskip("vllm")
    from reasonrl.engines.vllm_engine import VLLMEngine
    from reasonrl.errors import ReasonRLError

    model, sentinel = evil
    with pytest.raises(ReasonRLError, match="auto_map"):
        VLLMEngine(str(model))
    assert not sentinel.exists()
    eng = object.__new__(VLLMEngine)
    eng.model_dir, eng.dtype, eng.seed, eng.max_model_len, eng.tp = str(model), "float32", 0, 64, 1
    kw = eng._llm_options(on_gpu=False, enforce_eager=True, gpu_memory_utilization=None, kv_cache_gib=None, max_num_seqs=None,
                          max_num_batched_tokens=None, enable_prefix_caching=True, enable_chunked_prefill=None, enable_sleep_mode=False, block_size=None)
    assert kw["trust_remote_code"] is False


def test_tokenizer_auto_map_and_unknown_model_type_are_refused(tiny_model, tmp_path, monkeypatch):
    from reasonrl.errors import ReasonRLError
    from reasonrl.models.loading import check_weights, load_tokenizer

    monkeypatch.setattr("builtins.input", lambda *a, **k: "y")
    tok_model, sentinel = evil_model(tiny_model, tmp_path / "tok", tokenizer=True)
    with pytest.raises(ReasonRLError, match="tokenizer_config.json asks to run the folder's own Python.*delete the auto_map entry"):
        load_tokenizer(tok_model)
    assert not sentinel.exists()

    known, _ = evil_model(tiny_model, tmp_path / "known", model_type="llama")  # auto_map beside a type transformers ships
    with pytest.raises(ReasonRLError, match="transformers ships model_type 'llama' itself, so delete the auto_map entry from config.json"):
        check_weights(known)

    unknown = tmp_path / "unknown"
    shutil.copytree(tiny_model, unknown)
    c = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps({**c, "model_type": "no_such_arch"}))
    with pytest.raises(ReasonRLError, match="model_type 'no_such_arch', which transformers .* does not ship: .*use a model whose architecture"):
        load_tokenizer(unknown)


@pytest.mark.parametrize("text, says", [
    ('{"model_type": "llama",', "is not valid JSON"),
    ("[1, 2]", "holds a JSON list, not an object"),
    ('"llama"', "holds a JSON str, not an object"),
    (b"\xff\xfe{}", "is not UTF-8 text"),
    ('{"hidden_size": 64}', "has no model_type"),
])
def test_a_bad_config_json_is_named_not_blamed_on_tokenizer_files(tiny_model, tmp_path, text, says):
    """Item 16: a broken config.json was reported as "the model directory needs tokenizer files"."""
    from reasonrl.errors import ReasonRLError
    from reasonrl.models.loading import check_weights, load_causal_lm, load_tokenizer
    from reasonrl.models.value import new_value_model

    model = tmp_path / "m"
    shutil.copytree(tiny_model, model)
    (model / "config.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    for load in (load_tokenizer, load_causal_lm, new_value_model, check_weights):
        with pytest.raises(ReasonRLError) as e:
            load(model)
        msg = str(e.value)
        assert "config.json" in msg and says in msg and "restore the directory's config.json" in msg, msg
        assert "tokenizer files" not in msg and "\n" not in msg, msg


@pytest.mark.slow
def test_every_stage_refuses_a_remote_code_model_or_critic(evil, prepared, tmp_path):
    """--model of train, eval, rollout and pretrain-value, --critic of train, --critic-init of
    pretrain-value, --rewriter of prepare-data: one line, nothing of the folder ran (input() says y)."""
    model, sentinel = evil
    data = tmp_path / "p.jsonl"
    data.write_text('{"problem": "What is 2 + 2?", "answer": "4"}\n')
    good = tmp_path / "good"  # the same weights without the code, for the runs whose --model is fine
    shutil.copytree(model, good)
    c = json.loads((good / "config.json").read_text())
    c.pop("auto_map")
    (good / "config.json").write_text(json.dumps({**c, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    (good / "modeling_evil.py").unlink()
    # small runs, should a folder's code ever be let through (then it is not refused and would train)
    common = ["--engine", "hf", "--dtype", "fp32", "--report-to", "none", "--max-prompt-len", "64", "--max-response-len", "4"]
    steps = ["--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--mini-batch-size", "4", "--micro-batch-size", "2"]
    runs = {
        "train --model": ["train", "--model", model, "--data", prepared, "--out", tmp_path / "t1", *common, *steps],
        "train --critic": ["train", "--algo", "vcppo", "--model", good, "--critic", model, "--data", prepared, "--out", tmp_path / "t2", *common, *steps],
        "eval --model": ["eval", "file", "--dataset", data, "--model", model, "--out", tmp_path / "e", "--n", "1", "--bootstrap", "10", *common],
        "rollout --model": ["rollout", "--model", model, "--data", prepared, "--out", tmp_path / "r", "--engine", "hf", "--num-prompts", "1",
                            "--group-size", "1", "--max-response-len", "4"],
        "pretrain-value --model": ["pretrain-value", "--model", model, "--data", prepared, "--out", tmp_path / "v1", "--eval-prompts", "1", *common, *steps],
        "pretrain-value --critic-init": ["pretrain-value", "--model", good, "--critic-init", model, "--data", prepared, "--out", tmp_path / "v2",
                                         "--eval-prompts", "1", *common, *steps],
        "prepare-data --rewriter": ["prepare-data", data, "--out", tmp_path / "d", "--decontaminate", "", "--rewriter", model],
    }
    for what, args in runs.items():
        r = run_cli(*args)
        assert not sentinel.exists(), (what, r.output)
        assert_user_error(r, "auto_map", "never runs a model's code")
