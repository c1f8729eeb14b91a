"""The suite's isolation (tests/conftest.py): what a test changes process-wide is put back after it."""

from __future__ import annotations

import os
import random


def test_process_state_restores_what_a_test_changed():
    import torch

    from isolation import ProcessState

    state = ProcessState()
    threads, draw = torch.get_num_threads(), torch.rand(1)
    torch.set_rng_state(state.rng[0])
    noop = lambda n: None  # noqa: E731 - what vLLM's CPU worker puts in place of set_num_threads
    torch.set_num_threads(1 if threads > 1 else 2)
    torch.set_num_threads = noop
    os.environ["REASONRL_TEST_LEAK"] = "1"
    torch.set_default_dtype(torch.float64)
    random.seed(99)
    torch.manual_seed(99)
    state.restore()
    assert torch.set_num_threads is not noop
    assert torch.get_num_threads() == threads
    assert "REASONRL_TEST_LEAK" not in os.environ
    assert torch.get_default_dtype() == torch.float32
    assert torch.equal(torch.rand(1), draw)  # the RNG continues as if nothing had drawn
