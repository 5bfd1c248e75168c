"""Informer (list + watch + relist on 410) and work-queue semantics."""

from __future__ import annotations

import threading
from typing import Any

from ctrlfix import FakeClock, claim
from kubefake import FakeKube

from dra_driver.k8s.client import CLAIMS, ApiError
from dra_driver.k8s.informer import Informer, WorkQueue


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, old: Any, new: Any) -> None:
        kind = "add" if old is None else "delete" if new is None else "update"
        self.seen.append((kind, (new or old)["metadata"]["name"]))


def test_list_then_watch_then_relist_diff() -> None:
    kube = FakeKube()
    kube.add(CLAIMS, claim("a"))
    kube.add(CLAIMS, claim("b"))
    rec = Recorder()
    inf = Informer(kube, CLAIMS, rec)
    inf.relist()
    assert sorted(rec.seen) == [("add", "a"), ("add", "b")] and inf.synced.is_set()
    kube.add(CLAIMS, claim("c"))
    obj = kube.obj(CLAIMS, "default/a")
    obj["metadata"]["labels"] = {"x": "1"}
    kube.set(CLAIMS, obj)
    inf.watch_once()
    assert rec.seen[2:] == [("add", "c"), ("update", "a")]
    assert inf.resource_version == str(kube.rv)
    assert inf.store.get("default/a")["metadata"]["labels"] == {"x": "1"}
    # Deletion missed while disconnected: a relist notices.
    kube.delete(CLAIMS, "default/b")
    kube.log.clear()
    rec.seen.clear()
    inf.relist()
    assert rec.seen == [("delete", "b")]
    assert sorted(inf.store.keys()) == ["default/a", "default/c"]


def test_unchanged_objects_do_not_fire_on_relist() -> None:
    kube = FakeKube()
    kube.add(CLAIMS, claim("a"))
    rec = Recorder()
    inf = Informer(kube, CLAIMS, rec)
    inf.relist()
    inf.relist()
    assert rec.seen == [("add", "a")]


def test_bookmark_and_junk_events() -> None:
    inf = Informer(FakeKube(), CLAIMS, Recorder())
    inf.apply({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "77"}}})
    inf.apply({"type": "ADDED", "object": "junk"})
    inf.apply({"type": "WHAT", "object": {"metadata": {"name": "x", "resourceVersion": "80"}}})
    assert inf.resource_version == "77" and len(inf.store) == 0


def test_handler_exception_does_not_stop_the_informer() -> None:
    def bad(old: Any, new: Any) -> None:
        raise RuntimeError("handler bug")

    kube = FakeKube()
    kube.add(CLAIMS, claim("a"))
    inf = Informer(kube, CLAIMS, bad)
    inf.relist()
    assert len(inf.store) == 1


def test_run_relists_after_410_and_errors() -> None:
    kube = FakeKube()
    kube.add(CLAIMS, claim("a"))
    stop = threading.Event()
    calls: list[str] = []

    class Flaky(FakeKube):
        pass

    real_watch = kube.watch
    real_list = kube.list
    plan = ["gone", "error", "ok"]

    def watch(res: Any, **kw: Any) -> Any:
        step = plan.pop(0) if plan else "stop"
        calls.append(f"watch:{step}")
        if step == "gone":
            raise ApiError(410, "Expired", "too old")
        if step == "error":
            raise ApiError(0, "ConnectionError", "refused")
        if step == "stop":
            stop.set()
        return real_watch(res, **kw)

    def list_(res: Any, **kw: Any) -> Any:
        calls.append("list")
        return real_list(res, **kw)

    kube.watch = watch  # type: ignore[method-assign]
    kube.list = list_  # type: ignore[method-assign]
    inf = Informer(kube, CLAIMS, Recorder(), max_backoff=0.01)
    t = threading.Thread(target=inf.run, args=(stop,))
    t.start()
    t.join(10)
    assert not t.is_alive()
    assert calls[:5] == ["list", "watch:gone", "list", "watch:error", "list"]
    assert inf.errors == 2


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
