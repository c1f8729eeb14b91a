"""The LR schedules (``lr_factor``): warm-up, constant and cosine values against OpenRLHF's
(transformers') cosine-with-min-LR, and a resumed backend's LR equal to the uninterrupted one's."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl.train.backend import TorchBackend, lr_factor


def test_warmup_then_constant() -> None:
    assert [lr_factor(s, warmup_steps=4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert [lr_factor(s) for s in range(3)] == [1.0, 1.0, 1.0]  # no warm-up


@pytest.mark.parametrize("warmup,total,m", [(0, 10, 0.1), (3, 13, 0.1), (2, 7, 0.0), (0, 1, 0.5), (5, 5, 0.1)])
def test_cosine_warmup_mid_end_and_floor(warmup: int, total: int, m: float) -> None:
    f = [lr_factor(s, schedule="cosine", warmup_steps=warmup, total_steps=total, min_lr_ratio=m) for s in range(total + 3)]
    assert f[:warmup] == [(s + 1) / warmup for s in range(warmup)]  # the warm-up is the constant schedule's
    if total > warmup:
        assert f[warmup] == 1.0  # the first step after the warm-up runs at the full LR
        assert f[total] == pytest.approx(m, abs=1e-15) and f[total - 1] > m  # the floor is reached at step T
    after = f[warmup:]
    assert all(a >= b for a, b in zip(after, after[1:])), after  # never rises again
    assert min(after) >= m - 1e-15 and after[-1] == pytest.approx(m, abs=1e-15)  # past T it stays at the floor
    if (total - warmup) % 2 == 0 and total > warmup:
        assert f[warmup + (total - warmup) // 2] == pytest.approx((1 + m) / 2, rel=1e-12)  # half way: the mean of 1 and m


@pytest.mark.parametrize("warmup,total,m", [(0, 20, 0.1), (4, 20, 0.1), (3, 11, 0.0)])
def test_cosine_is_openrlhfs_cosine_with_min_lr_after_the_warmup(warmup: int, total: int, m: float) -> None:
    """OpenRLHF: get_scheduler("cosine_with_min_lr", num_warmup_steps=W, num_training_steps=T, min_lr=0.1 * lr)."""
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = get_cosine_with_min_lr_schedule_with_warmup(opt, num_warmup_steps=warmup, num_training_steps=total, min_lr_rate=m)
    for s in range(total + 1):
        if s >= warmup:  # (its warm-up is s / W: the first step at LR 0)
            want = opt.param_groups[0]["lr"]
            assert lr_factor(s, schedule="cosine", warmup_steps=warmup, total_steps=total, min_lr_ratio=m) == pytest.approx(want, rel=1e-12, abs=1e-15)
        opt.step()
        sched.step()
    # the formula, written out: m + (1 - m) (1 + cos(pi p)) / 2
    s = warmup + 3
    p = (s - warmup) / (total - warmup)
    assert lr_factor(s, schedule="cosine", warmup_steps=warmup, total_steps=total, min_lr_ratio=m) == pytest.approx(
        m + (1 - m) * (1 + math.cos(math.pi * p)) / 2, rel=1e-12)


@pytest.mark.parametrize("warmup,total,m,last", [(0, 8, 0.1, 0.134254), (1, 8, 0.1, 0.144564)])
def test_cosine_s_last_update_is_above_the_floor(warmup: int, total: int, m: float, last: float) -> None:
    """What docs/algorithms.md says of a short run: its last step (T - 1) runs at
    m + (1 - m) (1 - cos(pi / (T - W))) / 2, 0.134 of lr at T = 8 (the floor m comes at step T, never run)."""
    f = lr_factor(total - 1, schedule="cosine", warmup_steps=warmup, total_steps=total, min_lr_ratio=m)
    assert f == pytest.approx(m + (1 - m) * (1 - math.cos(math.pi / (total - warmup))) / 2, rel=1e-12)
    assert f == pytest.approx(last, abs=1e-6)


def test_unknown_schedule_is_refused_at_construction() -> None:
    from reasonrl.train.backend import lr_lambda

    with pytest.raises(ValueError, match="constant, cosine"):
        lr_lambda("linear", warmup_steps=2)


def _backend(schedule: dict) -> TorchBackend:
    torch.manual_seed(0)
    return TorchBackend(torch.nn.Linear(3, 2), lr=1e-2, weight_decay=0.0, grad_clip=0.0, dtype="fp32", **schedule)


def _lrs(backend: TorchBackend, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        out.append(backend.optimizer.param_groups[0]["lr"])
        backend.scheduler_step()
    return out


def test_a_resumed_cosine_schedule_continues_bitwise(tmp_path) -> None:
    """The scheduler's state (its step count) is in optim.pt; the lambda is rebuilt from the settings."""
    schedule = dict(lr_schedule="cosine", warmup_steps=2, total_steps=9, min_lr_ratio=0.1)
    whole = _lrs(_backend(schedule), 9)
    first = _backend(schedule)
    head = _lrs(first, 4)
    first.save_state(tmp_path / "state")
    again = _backend(schedule)
    again.load_state(tmp_path / "state")
    assert head + _lrs(again, 5) == whole  # bitwise: the same floats
    assert whole[1] == 1e-2 and whole[2] == 1e-2 and whole[-1] > 1e-3 and whole == sorted(whole[:2]) + sorted(whole[2:], reverse=True)
