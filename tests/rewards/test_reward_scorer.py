"""RewardScorer: batches, the integer fast path, and math-verify in killable worker processes.

Real math-verify throughout. The pathological answer ``9^{9^{9^{9}}}`` makes math-verify's
``verify`` evaluate an enormous integer power in sympy: against ``5`` it did not return within
10 minutes without a timeout (and a worker stuck in it can only be killed), against ``5.5`` not
within 25 s. Against an integer the rule now decides it (arithmetic left undone), so the tests
that need a stuck worker score it against ``5.5``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from reasonrl.rewards import RewardScorer, Score, ScoreStats

PATHOLOGICAL = "Answer: 9^{9^{9^{9}}}"
STUCK_GT = "5.5"  # not an integer: math-verify must decide, and cannot in time
TIMEOUT_S = 1.5
# Slack for killing the stuck pool and starting a new one (spawn + math-verify imports) on a
# loaded 2-core machine.
SLACK_S = 12.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def scorer() -> Iterator[RewardScorer]:
    with RewardScorer(num_workers=2, timeout_s=TIMEOUT_S) as s:
        yield s


def test_mixed_batch(scorer: RewardScorer) -> None:
    responses = [
        "work\nAnswer: 025",  # fast path
        "work\nAnswer: 3,000",  # fast path
        "work\nAnswer: 24",  # fast path, wrong
        "no final answer",  # no answer
        "so \\boxed{\\frac{1}{2}}",  # math-verify
        "so \\boxed{0.5}",  # math-verify, same pair as below: verified once
        "so \\boxed{0.5}",
        "Answer: 2\\sqrt{3}",  # math-verify
        "Answer: -\\frac{3}{4}",  # math-verify, wrong sign
    ]
    gts = ["25", "3000", "25", "1", "0.5", "1/2", "1/2", "\\sqrt{12}", "0.75"]
    scores, stats = scorer.score_batch(responses, gts)
    assert [s.reward for s in scores] == [1.0, 1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0, -1.0]
    assert [s.status for s in scores] == ["ok", "ok", "ok", "no_answer"] + ["ok"] * 5
    assert scores[0] == Score(1.0, True, "025", "ok")
    assert scores[3] == Score(-1.0, False, None, "no_answer")
    assert (stats.total, stats.fast_path, stats.no_answer, stats.verified) == (9, 3, 1, 5)
    assert stats.verifier_calls == 4
    assert (stats.timeouts, stats.errors) == (0, 0)
    assert stats.as_dict()["fast_path"] == 3.0


def test_integer_only_batch_needs_no_pool() -> None:
    s = RewardScorer(num_workers=1)
    scores, stats = s.score_batch(["Answer: 7", "\\boxed{08}", "nothing"], ["7", 8, "1"])
    assert [x.reward for x in scores] == [1.0, 1.0, -1.0]
    assert stats.fast_path == 2 and stats.no_answer == 1
    assert s.pool_pids == []  # the pool starts lazily, only for math-verify items
    s.close()


def test_pathological_item_times_out_and_pool_recovers(scorer: RewardScorer) -> None:
    scorer.score_batch(["Answer: 0.5"], ["1/2"])  # make sure the pool is up
    old_pids = scorer.pool_pids
    t0 = time.monotonic()
    scores, stats = scorer.score_batch(
        [PATHOLOGICAL, "Answer: \\frac{2}{4}", "Answer: 12"], [STUCK_GT, "0.5", "12"]
    )
    elapsed = time.monotonic() - t0
    assert elapsed < TIMEOUT_S + SLACK_S
    assert scores[0] == Score(-1.0, False, "9^{9^{9^{9}}}", "timeout")
    assert scores[1].status == "ok" and scores[1].reward == 1.0  # collateral item was rerun
    assert scores[2].reward == 1.0
    assert stats.timeouts == 1 and stats.errors == 0 and stats.pool_restarts == 1
    # The stuck worker was killed, not left running.
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in old_pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in old_pids)
    # The next batch works on a fresh pool.
    scores, stats = scorer.score_batch(["Answer: \\sqrt{12}"], ["2\\sqrt{3}"])
    assert scores[0].reward == 1.0 and stats.timeouts == 0


def test_equivalent_pairs(scorer: RewardScorer) -> None:
    """Answer against answer, the reward's rule: integers here, the rest in the pool, deduplicated."""
    pairs = [("025", "25"), ("7", 8), ("0.5", "\\frac{1}{2}"), ("1/2", "0.5"), ("0.5", "\\frac{1}{2}"), ("2\\sqrt{3}", "\\sqrt{12}"),
             ("-\\frac{3}{4}", "0.75"), ("x+1", "x+2")]
    stats = ScoreStats()
    assert scorer.equivalent(pairs, stats=stats) == [True, False, True, True, True, True, False, False]
    assert (stats.total, stats.fast_path, stats.verified, stats.verifier_calls) == (8, 2, 6, 5)
    assert (stats.timeouts, stats.errors) == (0, 0)
    assert scorer.equivalent([]) == []


def test_equivalent_times_out_to_none(scorer: RewardScorer) -> None:
    stats = ScoreStats()
    out = scorer.equivalent([("9^{9^{9^{9}}}", STUCK_GT), ("\\frac{2}{4}", "0.5"), ("9^{9^{9^{9}}}", STUCK_GT), ("12", "12")], stats=stats)
    assert out == [None, True, None, True]  # undecided, never raised; the collateral pair was rerun
    assert stats.timeouts == 2 and stats.verifier_calls == 2 and stats.pool_restarts == 1  # 2 items, 1 call
    assert scorer.equivalent([("\\sqrt{12}", "2\\sqrt{3}")], stats=stats) == [True]  # a fresh pool
    assert stats.total == 5 and stats.timeouts == 2  # the stats add up over calls


def test_score_batch_from_a_thread(scorer: RewardScorer) -> None:
    result: list[tuple[list[Score], ScoreStats]] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.append(
                scorer.score_batch(["Answer: \\frac{1}{2}", "Answer: 025", PATHOLOGICAL], ["0.5", "25", STUCK_GT])
            )
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t0 = time.monotonic()
    t = threading.Thread(target=target)
    t.start()
    t.join(TIMEOUT_S + SLACK_S)
    assert not t.is_alive(), "score_batch hung in a thread"
    assert not errors
    assert time.monotonic() - t0 < TIMEOUT_S + SLACK_S
    scores, stats = result[0]
    assert [s.status for s in scores] == ["ok", "ok", "timeout"]
    assert [s.reward for s in scores] == [1.0, 1.0, -1.0]
    assert stats.timeouts == 1


def test_worker_crash_scores_error_and_recovers() -> None:
    """A worker that dies (here: killed from outside) scores its item 'error', not a hang."""
    with RewardScorer(num_workers=1, timeout_s=60) as s:
        s.score_batch(["Answer: 0.5"], ["1/2"])
        pids = s.pool_pids
        out: list[tuple[list[Score], ScoreStats]] = []
        t = threading.Thread(target=lambda: out.append(s.score_batch([PATHOLOGICAL], [STUCK_GT])))
        t.start()
        time.sleep(0.5)
        for pid in pids:
            os.kill(pid, 9)
        t.join(20)
        assert not t.is_alive()
        scores, stats = out[0]
        assert scores[0].status == "error" and scores[0].reward == -1.0
        assert stats.errors == 1
        assert s.score_batch(["Answer: 0.5"], ["1/2"])[0][0].reward == 1.0


def test_without_context_manager_and_close() -> None:
    baseline_threads = threading.active_count()
    s = RewardScorer(num_workers=1, timeout_s=TIMEOUT_S)
    scores, _ = s.score_batch(["\\boxed{\\frac{6}{8}}"], ["0.75"])
    assert scores[0].reward == 1.0
    pids = s.pool_pids
    assert len(pids) == 1
    s.close()
    assert s.pool_pids == [] and not any(_alive(p) for p in pids)
    # Still usable after close (a new pool starts lazily); then closed again.
    assert s.score("Answer: 1/2", "0.5").reward == 1.0
    s.close()
    deadline = time.monotonic() + 5
    while threading.active_count() > baseline_threads and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= baseline_threads


def test_close_returns_after_the_pools_manager_thread_has_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that exits right after a close must find no process pool still shutting down: CPython's
    exit hook wakes every live manager thread without the lock the thread closes its pipe under, and
    on a loaded machine that wake-up wrote to a closed pipe (a traceback on a stopped run's stderr).
    The manager thread's own shutdown is slowed here (the real one), so a close that returned before
    it ended would be caught."""
    import concurrent.futures.process as cfp

    real = cfp._ExecutorManagerThread.join_executor_internals

    def slow(self: cfp._ExecutorManagerThread) -> None:
        time.sleep(1.0)
        real(self)

    monkeypatch.setattr(cfp._ExecutorManagerThread, "join_executor_internals", slow)
    others = set(threading.enumerate())  # (the module's shared scorer may have a pool running)
    s = RewardScorer(num_workers=1, timeout_s=TIMEOUT_S)
    assert s.score("\\boxed{\\frac{6}{8}}", "0.75").reward == 1.0
    managers = [t for t in threading.enumerate() if isinstance(t, cfp._ExecutorManagerThread) and t not in others]
    assert len(managers) == 1 and managers[0].is_alive()
    s.close()
    assert not managers[0].is_alive()


def test_in_process_mode() -> None:
    s = RewardScorer(num_workers=0)
    scores, stats = s.score_batch(["Answer: 0.5", "Answer: 3"], ["1/2", "3"])
    assert [x.reward for x in scores] == [1.0, 1.0] and s.pool_pids == []


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        RewardScorer(mp_context="fork")
    with pytest.raises(ValueError):
        RewardScorer(timeout_s=0)
    with pytest.raises(ValueError, match="pair up"):
        RewardScorer().score_batch(["a"], [])
