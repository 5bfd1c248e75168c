"""The work queue's client-go semantics."""

from __future__ import annotations

import threading
from typing import Any

from ctrlfix import FakeClock

from dra_driver.k8s.workqueue import WorkQueue


class TestWorkQueue:
    def test_dedup(self) -> None:
        q = WorkQueue()
        for _ in range(10):
            q.add("a")
        q.add("b")
        assert len(q) == 2
        assert q.get(0) == "a" and q.get(0) == "b" and q.get(0) is None

    def test_readd_while_processing_runs_again_after_done(self) -> None:
        q = WorkQueue()
        q.add("a")
        assert q.get(0) == "a"
        q.add("a")
        q.add("a")
        assert q.get(0) is None  # not handed to a second worker
        q.done("a")
        assert q.get(0) == "a"
        q.done("a")
        assert q.get(0) is None

    def test_add_after_and_backoff(self) -> None:
        clock = FakeClock()
        q = WorkQueue(clock=clock, base_delay=1.0, max_delay=4.0)
        q.add_after("a", 5)
        assert q.get(0) is None
        clock.advance(5)
        assert q.get(0) == "a"
        q.done("a")
        assert [q.add_rate_limited("b") for _ in range(4)] == [1.0, 2.0, 4.0, 4.0]
        q.forget("b")
        assert q.failures("b") == 0

    def test_shutdown_wakes_waiters(self) -> None:
        q = WorkQueue()
        got: list[Any] = []
        t = threading.Thread(target=lambda: got.append(q.get(None)))
        t.start()
        q.shutdown()
        t.join(5)
        assert got == [None]
