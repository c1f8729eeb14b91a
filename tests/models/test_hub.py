"""Hub names, offline: a hub-layout cache built here (``models--org--tiny/snapshots/<commit>`` with
``refs/main``, blobs linked from the snapshot as huggingface_hub writes them, and a
``datasets--org--chains`` snapshot of parquet files), ``HF_HOME`` pointing at it and
``HF_HUB_OFFLINE=1``: the real resolution code runs, only the network is missing."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from clihelp import assert_user_error, run_cli

ROOT = Path(__file__).resolve().parents[2]
REV = "0123456789abcdef0123456789abcdef01234567"
DATA_REV = "fedcba9876543210fedcba9876543210fedcba98"
ENGINE = ["--engine", "hf", "--dtype", "fp32", "--max-response-len", "12", "--seed", "0"]
SMALL = [*ENGINE, "--group-size", "4"]


def add_snapshot(hub: Path, kind: str, repo_id: str, commit: str, files: dict[str, bytes], ref: str | None = "main") -> Path:
    """Write ``files`` as huggingface_hub stores a snapshot: each file's bytes in ``blobs/<sha256>``,
    a symlink to it under ``snapshots/<commit>/``, and ``refs/<ref>`` naming the commit."""
    repo = hub / f"{kind}s--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / commit
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).symlink_to(os.path.relpath(blob, (snap / name).parent))
    if ref:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snap


def parquet_bytes(rows: list[dict]) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory, tiny_model) -> Path:
    """HF_HOME with org/tiny (safetensors), org/pickled (pytorch_model.bin only) and org/chains (data)."""
    home = tmp_path_factory.mktemp("hf_home")
    hub = home / "hub"
    model_files = {f.name: f.read_bytes() for f in Path(tiny_model).iterdir() if f.is_file()}
    add_snapshot(hub, "model", "org/tiny", REV, model_files)
    pickled = {k: v for k, v in model_files.items() if not k.endswith(".safetensors")}
    add_snapshot(hub, "model", "org/pickled", REV, {**pickled, "pytorch_model.bin": b"not really a pickle"})
    config = json.loads(model_files["config.json"])
    remote = {**model_files, "config.json": json.dumps({**config, "auto_map": {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}}).encode()}
    add_snapshot(hub, "model", "org/remote", REV, remote)
    chains = [json.loads(ln) for ln in (ROOT / "data" / "chains.jsonl").read_text().splitlines()[:40]]
    rows = [{"problem": r["problem"], "answer": r["answer"]} for r in chains]
    add_snapshot(hub, "dataset", "org/chains", DATA_REV, {"data/train-00000-of-00001.parquet": parquet_bytes(rows[:32]),
                                                          "data/validation-00000-of-00001.parquet": parquet_bytes(rows[32:])})
    return home


@pytest.fixture
def offline(hf_home, tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("REASONRL_CACHE", str(tmp_path / "rcache"))
    return hf_home


def test_hub_names_parse():
    from reasonrl.models.hub import split_hub_data, split_hub_name

    assert split_hub_name("Qwen/Qwen2.5-Math-7B") == ("Qwen/Qwen2.5-Math-7B", None)
    assert split_hub_name("org/tiny@refs/pr/1") == ("org/tiny", "refs/pr/1")
    for not_hub in ("default", "/abs/dir", "./org/x", "a/b/c", "~/x", "org/../x", "org/"):
        assert split_hub_name(not_hub) is None, not_hub
    assert split_hub_data("hf:BytedTsinghua-SIA/DAPO-Math-17k") == ("BytedTsinghua-SIA/DAPO-Math-17k", None, None)
    assert split_hub_data("hf:org/chains:main@test") == ("org/chains", "main", "test")


def test_resolves_from_the_cache_and_records_the_commit(offline):
    from reasonrl.models.hub import resolved
    from reasonrl.models.loading import check_weights, resolve_model

    snap = offline / "hub" / "models--org--tiny" / "snapshots" / REV
    assert resolve_model("org/tiny") == snap
    assert resolved("org/tiny")["commit"] == REV
    assert resolve_model(f"org/tiny@{REV}") == snap
    assert resolved(f"org/tiny@{REV}") == {"kind": "model", "repo_id": "org/tiny", "requested_revision": REV, "commit": REV, "path": str(snap)}
    assert check_weights("org/tiny") == snap  # (--critic-init goes this way)


def test_a_local_directory_of_the_same_spelling_wins(offline, tiny_model, tmp_path, monkeypatch):
    import shutil

    from reasonrl.models.loading import resolve_model

    shutil.copytree(tiny_model, tmp_path / "org" / "tiny")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("org/tiny") == Path("org/tiny")


def test_a_missing_name_is_one_line(offline, prepared, tmp_path):
    r = run_cli("rollout", "--model", "org/absent", "--data", prepared, "--out", tmp_path / "r", *SMALL)
    line = assert_user_error(r, "--model org/absent", "not found in the hub cache and offline", "hf download org/absent")
    assert str(offline / "hub") in line
    r = run_cli("rollout", "--model", "org/tiny@v9", "--data", prepared, "--out", tmp_path / "r", *SMALL)
    assert_user_error(r, "not found in the hub cache and offline", "org/tiny at revision v9")
    r = run_cli("eval", "file", "--dataset", "hf:org/absent", "--model", "org/tiny", "--out", tmp_path / "e", "--n", "1", *ENGINE)
    assert_user_error(r, "dataset hf:org/absent", "not found in the hub cache and offline")
    r = run_cli("eval", "file", "--dataset", "hf:org/chains@test", "--model", "org/tiny", "--out", tmp_path / "e", "--n", "1", *ENGINE)
    assert_user_error(r, "no split 'test'", "its splits: train, validation")
    r = run_cli("train", "--model", "org/tiny", "--data", "hf:org/chains", "--out", tmp_path / "t", *SMALL)
    assert_user_error(r, "reasonrl prepare-data hf:org/chains --out DIR")


def test_a_hub_model_that_asks_for_its_own_code_is_refused(offline, prepared, tmp_path):
    """The snapshot is checked as a local folder is (check_model_config; trust_remote_code stays off)."""
    r = run_cli("rollout", "--model", "org/remote", "--data", prepared, "--out", tmp_path / "r", *SMALL)
    assert_user_error(r, "models--org--remote", "asks to run the folder's own Python (auto_map: modeling_x.XForCausalLM", "reasonrl never runs a model's code")


def test_a_pickle_only_repository_is_refused(offline, prepared, tmp_path):
    r = run_cli("rollout", "--model", "org/pickled", "--data", prepared, "--out", tmp_path / "r", *SMALL)
    assert_user_error(r, "org/pickled", "pytorch_model.bin", "--allow-pickle")
    assert not (tmp_path / "r").exists()


def test_train_offline_from_hub_names(offline, tmp_path):
    """The issue's check: a hub dataset through prepare-data, a hub model at a commit, a hub
    validation split; each manifest names the commits."""
    data = tmp_path / "data"
    r = run_cli("prepare-data", "hf:org/chains", "--out", data, "--template", "chains", "--val-size", "2", "--decontaminate", "")
    assert r.exit_code == 0, r.output
    hub = json.loads((data / "manifest.json").read_text())["hub"]
    assert hub["inputs[0]"]["commit"] == DATA_REV and hub["inputs[0]"]["split"] == "train" and hub["inputs[0]"]["rows"] == 32
    assert hub["inputs[0]"]["fingerprint"]
    out = tmp_path / "run"
    r = run_cli("train", "--algo", "dapo", "--model", f"org/tiny@{REV}", "--data", data, "--out", out, "--steps", "1",
                "--prompts-per-step", "2", "--mini-batch-size", "8", "--micro-batch-size", "4", "--overlong-cache-len", "4",
                "--val-data", "hf:org/chains@validation", "--val-every", "1", "--val-n", "1", "--report-to", "none", *SMALL)
    assert r.exit_code == 0, r.output
    m = json.loads((out / "manifest.json").read_text())
    assert m["hub"]["model"] == {"name": f"org/tiny@{REV}", "kind": "model", "repo_id": "org/tiny", "requested_revision": REV, "commit": REV,
                                 "path": str(offline / "hub" / "models--org--tiny" / "snapshots" / REV)}
    assert m["hub"]["val_data"]["commit"] == DATA_REV and m["hub"]["val_data"]["split"] == "validation"
    assert m["inputs"]["policy"]["path"].endswith(REV)
    assert (out / "policy" / "config.json").is_file()


ONLINE = """
import json, sys
from reasonrl.errors import ReasonRLError
from reasonrl.models.hub import resolved
from reasonrl.models.loading import resolve_model
from reasonrl.data.readers import input_files
out = {}
for name, kw in [("org/both", {}), ("org/pickled", {}), ("org/pickled@main", {"allow_pickle": True}), ("org/absent", {}), ("org/both@v2", {})]:
    try:
        out[name] = [str(resolve_model(name, **kw)), resolved(name)["commit"]]
    except ReasonRLError as e:
        out[name] = "error: " + str(e)
out["hf:org/chains@validation"] = [str(input_files("hf:org/chains@validation")[0]), resolved("hf:org/chains@validation")]
print(json.dumps(out))
"""


def test_online_through_a_hub_on_loopback(tiny_model, tmp_path):
    """The online path against a hub on loopback (tests/models/fakehub.py): the commit of main is
    resolved, only the model's files are fetched (never a .bin beside safetensors), a pickle-only
    repository is refused before any file is fetched (fetched with allow_pickle), an unknown
    repository or revision is one line, and a dataset's split comes through datasets."""
    from fakehub import FakeHub

    model = {f.name: f.read_bytes() for f in Path(tiny_model).iterdir() if f.is_file()}
    pickled = {k: v for k, v in model.items() if not k.endswith(".safetensors")}
    rows = [{"problem": "What is 1 + 2?", "answer": "3"}, {"problem": "What is 2 + 2?", "answer": "4"}]
    hub = FakeHub()
    try:
        hub.add("model", "org/both", REV, {**model, "pytorch_model.bin": b"pickle", "training_args.pt": b"pickle"})
        hub.add("model", "org/pickled", DATA_REV, {**pickled, "pytorch_model.bin": b"pickle"})
        hub.add("dataset", "org/chains", DATA_REV, {"data/train-00000-of-00001.parquet": parquet_bytes(rows * 3),
                                                    "data/validation-00000-of-00001.parquet": parquet_bytes(rows), "extra/big.bin": b"x"})
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_OFFLINE"))}
        env.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"), REASONRL_CACHE=str(tmp_path / "rc"), HF_HUB_DISABLE_XET="1",
                   PYTHONPATH=str(ROOT))
        import subprocess
        import sys

        r = subprocess.run([sys.executable, "-c", ONLINE], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        out = json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        hub.close()
    snap = tmp_path / "hf" / "hub" / "models--org--both" / "snapshots" / REV
    assert out["org/both"] == [str(snap), REV]
    assert (tmp_path / "hf" / "hub" / "models--org--both" / "refs" / "main").read_text() == REV
    assert sorted(p.name for p in snap.iterdir()) == sorted(model)  # no pytorch_model.bin, no training_args.pt
    assert out["org/pickled"].startswith("error: --model org/pickled: org/pickled holds weights only as pickle files (pytorch_model.bin)")
    assert "--allow-pickle" in out["org/pickled"]
    assert out["org/pickled@main"][1] == DATA_REV
    fetched = [q for q in hub.requests if "/resolve/" in q]
    assert not [q for q in fetched if "org/both" in q and (q.endswith(".bin") or q.endswith(".pt"))], fetched
    pickled_calls = [q for q in hub.requests if "org/pickled" in q]
    second = [i for i, q in enumerate(pickled_calls) if "/tree/" in q][1]  # (the allow_pickle call's listing)
    assert not [q for q in pickled_calls[:second] if "/resolve/" in q], pickled_calls  # refused with nothing fetched
    assert [q for q in pickled_calls[second:] if q.endswith("pytorch_model.bin")]  # fetched with allow_pickle
    assert out["org/absent"].startswith("error: --model org/absent: no such local directory, and no model repository org/absent on the hub (or it is private: set HF_TOKEN)")
    assert out["org/both@v2"] == "error: --model org/both@v2: org/both has no revision 'v2': pass a branch, tag or commit it has"
    path, rec = out["hf:org/chains@validation"]
    assert Path(path).name == "chains.parquet" and rec["commit"] == DATA_REV and rec["split"] == "validation" and rec["rows"] == 2
    assert not [q for q in fetched if q.endswith("big.bin")]


def test_a_missing_relative_critic_still_names_pretrain_value(offline, prepared, tmp_path, monkeypatch):
    """A relative path spelled like a hub name (runs/critic) that is not there: the line names both
    readings, and the fix of the local one (run pretrain-value)."""
    monkeypatch.chdir(tmp_path)
    r = run_cli("train", "--algo", "vcppo", "--model", "org/tiny", "--data", prepared, "--critic", "runs/critic", "--out", tmp_path / "t", *SMALL)
    assert_user_error(r, "--critic runs/critic: no such local directory, and not found in the hub cache and offline",
                      "run `reasonrl pretrain-value --out runs/critic` first")


def test_train_on_a_hub_dataset_in_verl_format(offline, prepared, tmp_path):
    """`train --data hf:ORG/NAME` reads a hub dataset already in verl's RL format (here a
    prepare-data output pushed as a dataset repository) as it is; a dataset in another form, and
    validation without --val-data, are one line naming the fix."""
    rev = "00112233445566778899aabbccddeeff00112233"
    add_snapshot(offline / "hub", "dataset", "org/chains-rl", rev, {"data/train-00000-of-00001.parquet": (prepared / "train.parquet").read_bytes()})
    out = tmp_path / "run"
    args = ["train", "--algo", "grpo", "--model", f"org/tiny@{REV}", "--steps", "1", "--prompts-per-step", "2", "--mini-batch-size", "8",
            "--micro-batch-size", "4", "--report-to", "none", *SMALL]
    r = run_cli(*args, "--data", "hf:org/chains-rl", "--out", out, "--val-every", "0")
    assert r.exit_code == 0, r.output
    m = json.loads((out / "manifest.json").read_text())
    assert m["hub"]["data"]["commit"] == rev and m["hub"]["data"]["split"] == "train"
    assert m["hub"]["model"]["commit"] == REV
    assert_user_error(run_cli(*args, "--data", "hf:org/chains", "--out", tmp_path / "raw", "--val-every", "0"), "prepare-data hf:org/chains")
    assert_user_error(run_cli(*args, "--data", "hf:org/chains-rl", "--out", tmp_path / "val", "--val-every", "1"), "--val-data")
