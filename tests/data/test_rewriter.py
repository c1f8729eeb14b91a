"""--rewriter: a model may phrase the sentence, never change the question or the integer."""

from __future__ import annotations

import json

from reasonrl.data.rewriter import ModelRewriter, keeps_meaning


def test_keeps_meaning():
    s = "Write the answer as $\\frac{m}{n}$ with $m$ and $n$ coprime, and give $m+n$."
    assert keeps_meaning(s, "Express it as $\\frac{m}{n}$ in lowest terms ($m$, $n$ coprime); report $m+n$.")
    assert not keeps_meaning(s, "Express it as a fraction and give m+n.")
    assert not keeps_meaning("Give the sum of the 3 parts.", "Give the sum of the 4 parts.")
    assert not keeps_meaning(s, "")


def test_prepare_with_model_rewriter(tiny_model, tmp_path):
    from reasonrl.stages.prepare_data import PrepareConfig, run_prepare

    f = tmp_path / "in.jsonl"
    f.write_text(json.dumps({"problem": "Compute 3/6 + 1/6.", "answer": "\\frac{2}{3}"}) + "\n"
                 + json.dumps({"problem": "What is 2+2?", "answer": "4"}) + "\n")
    rep = run_prepare(PrepareConfig(inputs=[str(f)], out=str(tmp_path / "out"), decontaminate=[], val_size=0, rewriter=str(tiny_model)))
    # The random tiny model's phrasing never keeps the formulas: it is rejected, the rule's sentence stays.
    assert rep["rewriter_stats"]["asked"] == 1
    assert rep["rewriter_stats"]["rejected"] == 1
    from reasonrl.engines.base import EngineOptions
    from reasonrl.engines.registry import make_engine
    from reasonrl.models.loading import load_tokenizer

    engine = make_engine(EngineOptions(engine="hf"), str(tiny_model), seed=0, max_model_len=2048)
    try:
        assert ModelRewriter(engine, load_tokenizer(tiny_model))("p", "fraction", "Give $m+n$.") == ""
    finally:
        engine.close()
