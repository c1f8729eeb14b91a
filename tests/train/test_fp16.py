"""fp16 training on the torch backend: the forward runs in float16 under autocast, dynamic loss
scaling keeps gradients that fp16 would flush to zero, an overflowing step is skipped (the scale
halved, the weights untouched, ``overflow`` 1), and the scaler's state resumes exactly."""

from __future__ import annotations

import torch

from reasonrl.devices import grad_scaler
from reasonrl.train.backend import TorchBackend


def _backend(dtype: str, lr: float = 1e-2) -> TorchBackend:
    torch.manual_seed(0)
    return TorchBackend(torch.nn.Linear(4, 4), lr=lr, weight_decay=0.0, grad_clip=1.0, warmup_steps=0, dtype=dtype)


def _tiny_loss(seen: list):
    x = torch.ones(2, 4)

    def loss_fn(model, _mb):
        y = model(x)
        seen.append(y.dtype)
        return (y.float() * 1e-8).sum(), {}  # d loss / d y = 1e-8: below fp16's smallest subnormal (6e-8)

    return loss_fn


def test_fp16_computes_in_half_and_the_scaler_keeps_small_gradients() -> None:
    seen: list = []
    b = _backend("fp16")
    before = b.model.weight.detach().clone()
    m = b.step([0], _tiny_loss(seen))
    assert seen == [torch.float16]  # the forward ran in fp16 (autocast), the weights stay fp32
    assert b.model.weight.dtype == torch.float32
    assert m["loss_scale"] == 2.0**16 and m["overflow"] == 0.0
    # the true gradient of W is 1e-8 * x summed over the batch = 2e-8 per entry: kept (unscaled) by the scaler
    ref = _backend("fp32").step([0], _tiny_loss([]))["grad_norm"]
    assert m["grad_norm"] > 0 and abs(m["grad_norm"] - ref) / ref < 1e-2
    assert not torch.equal(b.model.weight, before)  # updated

    # without the scaler the same fp16 backward flushes the gradient to zero
    seen2: list = []
    c = _backend("fp16")
    c.scaler = None
    m2 = c.step([0], _tiny_loss(seen2))
    assert seen2 == [torch.float16] and m2["grad_norm"] == 0.0


def test_an_overflowing_step_is_skipped_and_the_scale_halved() -> None:
    b = _backend("fp16")

    def huge(model, _mb):
        return model(torch.full((1, 4), 6e4)).float().sum() * 1e4, {}  # fp16 max is 65504: the scaled backward overflows

    before = b.model.weight.detach().clone()
    m = b.step([0], huge)
    assert m["overflow"] == 1.0 and m["loss_scale"] == 2.0**16
    assert torch.equal(b.model.weight, before)  # no update
    assert float(b.scaler.get_scale()) == 2.0**15
    m = b.step([0], _tiny_loss([]))
    assert m["overflow"] == 0.0 and m["loss_scale"] == 2.0**15


def test_the_scalers_state_resumes_exactly(tmp_path) -> None:
    def run(b: TorchBackend, steps: int) -> list[float]:
        out = []
        for i in range(steps):
            x = torch.full((1, 4), 6e4 if i == 1 else 1.0)  # step 1 overflows: the scale moves
            out.append(b.step([0], lambda model, _mb, x=x: (model(x).float().sum() * (1e4 if i == 1 else 1e-3), {}))["loss_scale"])
        return out

    whole = _backend("fp16")
    scales = run(whole, 4)
    first = _backend("fp16")
    head = run(first, 2)
    first.save_state(tmp_path / "s")
    again = _backend("fp16")
    again.model.load_state_dict(first.model.state_dict())  # (a checkpoint saves the model beside optim.pt)
    again.load_state(tmp_path / "s")
    tail = []
    for i in range(2, 4):
        tail.append(again.step([0], lambda model, _mb: (model(torch.ones(1, 4)).float().sum() * 1e-3, {}))["loss_scale"])
    assert head + tail == scales and scales[:3] == [2.0**16, 2.0**16, 2.0**15]
    assert torch.equal(again.model.weight, whole.model.weight)


def test_no_scaler_outside_fp16() -> None:
    assert grad_scaler("bf16") is None and grad_scaler("fp32") is None
    assert _backend("fp32").scaler is None
