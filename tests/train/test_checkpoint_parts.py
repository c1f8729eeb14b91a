"""The run's stateful parts and the one function pair that saves and loads them
(``reasonrl.train.checkpoint``: ``Parts``, ``save_checkpoint``, ``load_checkpoint``): what is saved
comes back, on the layout older checkpoints have (a checkpoint written before a part existed loads,
that part keeping its start), and a checkpoint written from the table passes the resume's damage check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from reasonrl.train.checkpoint import JsonState, ModelState, Parts, RngState, checkpoint_damage, load_checkpoint, open_checkpoint, save_checkpoint


class Counter:
    """A stateful part with a JSON state (as the data stream, the learner and validation's best are)."""

    def __init__(self, n: int = 0) -> None:
        self.n = n

    def state(self) -> dict[str, Any]:
        return {"n": self.n} if self.n else {}

    def load(self, state: dict[str, Any] | None) -> None:
        self.n = int(state["n"]) if state else 0


def _backend(model_dir: Path) -> Any:
    from reasonrl.models.loading import load_causal_lm
    from reasonrl.train.backend import TorchBackend

    return TorchBackend(load_causal_lm(model_dir), lr=1e-2, weight_decay=0.0, grad_clip=1.0, warmup_steps=2, dtype="fp32")


def _update(backend: Any) -> None:
    """One optimiser step and one scheduler step: the optimiser and scheduler now hold state."""
    ids = torch.tensor([[1, 2, 3, 4]])
    backend.step([ids], lambda model, x: (model(input_ids=x).logits.float().pow(2).mean(), {}))
    backend.scheduler_step()


def _parts(backend: Any, data: Counter, learner: Counter, tok: Any = None) -> Parts:
    return Parts(files={"policy": ModelState(backend, tok), "rng": RngState()},
                 states={"data": JsonState(data.state, data.load), "learner": learner})


def test_what_is_saved_is_loaded_back(tiny_model: Path, tmp_path: Path) -> None:
    backend, data, learner = _backend(tiny_model), Counter(5), Counter(7)
    _update(backend)
    out = tmp_path / "run"
    rng = torch.get_rng_state()
    d = save_checkpoint(out, 3, _parts(backend, data, learner), rank=0, world=1)
    assert d == out / "checkpoints" / "step_3" and checkpoint_damage(d) is None  # the layout a resume checks
    assert {p.name for p in d.iterdir()} == {"policy", "policy_state", "rng.pt", "trainer_state.json"}
    assert json.loads((d / "trainer_state.json").read_text()) == {"step": 3, "data": {"n": 5}, "learner": {"n": 7}}
    saved_opt = backend.optimizer.state_dict()

    torch.rand(100)  # everything moves on
    fresh, data2, learner2 = _backend(d / "policy"), Counter(), Counter()
    resumed = open_checkpoint(d)
    assert resumed is not None and resumed.step == 3
    load_checkpoint(resumed, _parts(fresh, data2, learner2))
    assert (data2.n, learner2.n) == (5, 7)
    assert torch.equal(torch.get_rng_state(), rng)
    assert fresh.scheduler.state_dict()["last_epoch"] == backend.scheduler.state_dict()["last_epoch"] == 1
    got = fresh.optimizer.state_dict()["state"]
    assert got.keys() == saved_opt["state"].keys()
    assert all(torch.equal(got[k]["exp_avg"], saved_opt["state"][k]["exp_avg"]) for k in got)
    a, b = backend.full_state_dict(), fresh.full_state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # (the weights: read where the model is built, from policy/)


def test_an_empty_state_is_left_out_and_an_older_checkpoint_loads(tiny_model: Path, tmp_path: Path) -> None:
    """A part whose state is empty writes no key; a checkpoint without a part's key (written before
    the part existed, e.g. before the learner's state was kept) loads it as None: its start values."""
    backend = _backend(tiny_model)
    d = save_checkpoint(tmp_path / "run", 1, _parts(backend, Counter(2), Counter(0)), rank=0, world=1)
    st = json.loads((d / "trainer_state.json").read_text())
    assert st == {"step": 1, "data": {"n": 2}}
    learner = Counter(9)
    load_checkpoint(open_checkpoint(d), _parts(_backend(d / "policy"), Counter(), learner))
    assert learner.n == 0


def test_a_non_finite_weight_writes_nothing(tiny_model: Path, tmp_path: Path) -> None:
    import pytest

    from reasonrl.errors import ReasonRLError

    backend = _backend(tiny_model)
    with torch.no_grad():
        next(backend.model.parameters()).view(-1)[0] = float("nan")
    with pytest.raises(ReasonRLError, match="not finite"):
        save_checkpoint(tmp_path / "run", 1, _parts(backend, Counter(1), Counter()), rank=0, world=1)
    assert not (tmp_path / "run" / "checkpoints" / "step_1").exists()
