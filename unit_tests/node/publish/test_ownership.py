"""Two plugin instances of one node: only the holder of publisher.lock writes ResourceSlices, and
the other takes over when it stops, publishing its own content once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sliceapi import InMemorySliceApi

from dra_driver.node.publish.ownership import PublisherLock
from dra_driver.node.publish.publisher import SlicePublisher

DRIVER = "gpu.example.com"


def dev(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "attributes": {"index": {"int": 0}}, **extra}


def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def publisher(client: InMemorySliceApi, lock: Path) -> SlicePublisher:
    return SlicePublisher(client, DRIVER, "node-a", sync_delay=0.05, resync_interval=0.2, watch_timeout=1,
                          ownership=PublisherLock(lock, "node-a", retry_interval=0.05))


def writes(pub: SlicePublisher) -> int:
    return sum(pub.requests[v] for v in ("create", "update", "delete"))


def slices(client: InMemorySliceApi) -> list[tuple[int, list[dict[str, Any]]]]:
    return [(o["spec"]["pool"]["generation"], o["spec"]["devices"]) for o in client.objects.values()]


def test_only_the_lock_holder_publishes_and_the_other_takes_over(tmp_path: Path) -> None:
    client = InMemorySliceApi()
    old, new = publisher(client, tmp_path / "publisher.lock"), publisher(client, tmp_path / "publisher.lock")
    old.update([dev("gpu-0")])
    tainted = dev("gpu-0", taints=[{"key": "example.com/unhealthy", "effect": "NoSchedule",
                                    "timeAdded": "2026-01-01T00:00:00Z"}])
    new.update([tainted])
    stop_old, stop_new = threading.Event(), threading.Event()
    old_thread = old.start(stop_old)
    until(lambda: len(client.objects) == 1)
    new_thread = new.start(stop_new)
    try:
        time.sleep(0.5)  # several resync intervals and lock attempts
        assert old.ownership is not None and old.ownership.held.is_set()
        assert new.ownership is not None and not new.ownership.held.is_set()
        assert sum(new.requests.values()) == 0, "the waiting instance does not even read"
        ((generation, devices),) = slices(client)
        assert devices == [dev("gpu-0")]
        before = writes(old)
        # The old instance stops: the kernel (here: closing the file) releases its lock.
        stop_old.set()
        old_thread.join(timeout=5)
        old.ownership.release()
        until(new.ownership.held.is_set)
        until(lambda: slices(client)[0][1] == [tainted])
        time.sleep(0.5)
        assert writes(new) == 1, "its own content, once: one in-place update"
        assert slices(client) == [(generation, [tainted])], "no generation bump for one in-place update"
        assert writes(old) == before
    finally:
        stop_old.set()
        stop_new.set()
        old_thread.join(timeout=5)
        new_thread.join(timeout=5)


def test_a_taker_over_with_the_same_content_writes_nothing(tmp_path: Path) -> None:
    client = InMemorySliceApi()
    old, new = publisher(client, tmp_path / "publisher.lock"), publisher(client, tmp_path / "publisher.lock")
    for pub in (old, new):
        pub.update([dev("gpu-0"), dev("gpu-1")])
    stop = threading.Event()
    assert old.ownership is not None and old.ownership.wait(stop)
    assert old.sync() is not None
    published = slices(client)
    old.ownership.release()
    thread = new.start(stop)
    try:
        assert new.ownership is not None
        until(new.ownership.held.is_set)
        until(lambda: new.requests["list"] > 0)
        time.sleep(0.3)
        assert writes(new) == 0 and slices(client) == published
    finally:
        stop.set()
        thread.join(timeout=5)
