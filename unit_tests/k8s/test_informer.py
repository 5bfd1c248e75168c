"""Informer (list + watch + relist on 410)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from ctrlfix import claim
from kubefake import FakeKube
from structlog.testing import capture_logs

from dra_driver.k8s.client import CLAIMS, ApiError
from dra_driver.k8s.informer import Informer


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


def _streaming_run(kube: FakeKube, inf: Informer, until: Any) -> None:
    stop = threading.Event()
    t = threading.Thread(target=inf.run, args=(stop,), daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not until() and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    t.join(10)
    assert until()


def test_a_streamed_list_fills_the_store_then_the_same_stream_goes_on_watching() -> None:
    kube = FakeKube()
    kube.add(CLAIMS, claim("a"))
    kube.add(CLAIMS, claim("b"))
    watches: list[dict[str, Any]] = []
    real_watch = kube.watch

    def watch(res: Any, **kw: Any) -> Any:
        watches.append(kw)
        for event in real_watch(res, **kw):
            yield event
            if event["type"] == "BOOKMARK" and len(watches) == 1:
                kube.add(CLAIMS, claim("c"))  # a change after the listed state, on the same stream

    kube.watch = watch  # type: ignore[method-assign]
    kube.list = None  # type: ignore[assignment,method-assign]  # never listed in pages
    rec = Recorder()
    inf = Informer(kube, CLAIMS, rec, watch_timeout=1)
    with capture_logs() as logs:
        _streaming_run(kube, inf, lambda: ("add", "c") in rec.seen)
    assert rec.seen[:3] == [("add", "a"), ("add", "b"), ("add", "c")] and inf.synced.is_set()
    assert watches[0]["send_initial_events"] is True and watches[0]["resource_version"] == ""
    # The stream ended (the fake ends every watch at once): watched on from there, not listed again.
    assert not any(w.get("send_initial_events") for w in watches[1:])
    listed = [e for e in logs if e["event"] == "listed"]
    assert listed[0]["kept"] == 2 and listed[0]["streamed"] is True


def test_a_stream_cut_before_the_list_ends_lists_again_and_keeps_nothing_half_listed() -> None:
    kube = FakeKube()
    kube.add(CLAIMS, claim("a"))
    kube.add(CLAIMS, claim("b"))
    real_watch = kube.watch
    cut = [True]

    def watch(res: Any, **kw: Any) -> Any:
        events = real_watch(res, **kw)
        if cut[0]:
            cut[0] = False
            return iter([next(events)])  # one object, then the connection ends
        return events

    kube.watch = watch  # type: ignore[method-assign]
    rec = Recorder()
    inf = Informer(kube, CLAIMS, rec, max_backoff=0.01)
    with pytest.raises(ApiError, match="before every object was sent"):
        inf.stream()
    assert not inf.synced.is_set() and len(inf.store) == 0 and rec.seen == []
    _streaming_run(kube, inf, inf.synced.is_set)
    assert sorted(rec.seen) == [("add", "a"), ("add", "b")]


def test_a_server_that_cannot_stream_lists_is_listed_in_pages() -> None:
    kube = FakeKube()
    kube.streaming_lists = False
    kube.add(CLAIMS, claim("a"))
    rec = Recorder()
    inf = Informer(kube, CLAIMS, rec)
    with capture_logs() as logs:
        _streaming_run(kube, inf, inf.synced.is_set)
    assert rec.seen == [("add", "a")] and not inf.streaming and inf.errors == 0
    assert [e["event"] for e in logs][:2] == ["the API server does not stream lists; listing in pages", "listed"]


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
    inf = Informer(kube, CLAIMS, Recorder(), max_backoff=0.01, streaming=False)
    t = threading.Thread(target=inf.run, args=(stop,))
    t.start()
    t.join(10)
    assert not t.is_alive()
    assert calls[:5] == ["list", "watch:gone", "list", "watch:error", "list"]
    assert inf.errors == 2


def test_memory_freed_by_watch_events_is_handed_back_every_so_many_events(monkeypatch: pytest.MonkeyPatch) -> None:
    from dra_driver.k8s import informer

    trims: list[int] = []
    monkeypatch.setattr(informer, "_trim", lambda: trims.append(1))
    inf = Informer(FakeKube(), CLAIMS, Recorder())
    for i in range(2 * informer.TRIM_EVERY + 1):
        inf.apply({"type": "ADDED", "object": claim(f"c{i}")})
    assert len(trims) == 2
