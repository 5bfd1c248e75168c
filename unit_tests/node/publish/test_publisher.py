"""The publisher keeps the node's slices equal to the devices it is given: one write per slice,
fields the API server drops settle, updates replace, a wipe is republished, errors are retried,
and it works over the real API client."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from kubefake import FakeKube
from sliceapi import InMemorySliceApi

from dra_driver.k8s.client import NODES, SLICES, ApiError, Resource
from dra_driver.node.describe.devices import describe, enumerate_devices
from dra_driver.node.discovery.simulated import SimulatedBackend
from dra_driver.node.publish.publisher import SlicePublisher

DRIVER = "gpu.example.com"


def dev(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "attributes": {"type": {"string": "gpu"}}, "capacity": {"memory": {"value": "80Gi"}},
            **extra}


def test_publisher_one_write_per_slice_and_dropped_fields_settle() -> None:
    client = InMemorySliceApi(drop_fields=["consumesCounters", "sharedCounters"])
    pub = SlicePublisher(client, DRIVER, "node-a")
    gpus = SimulatedBackend("a100-mig", "node-a").discover()
    devices, counters = describe(enumerate_devices(gpus, True), DRIVER, True)
    pub.update(devices, counters)
    first = pub.sync()
    assert first is not None
    n = first.slice_count
    assert pub.requests["create"] == n and pub.requests["update"] == 0 and pub.requests["get"] == 1
    assert pub.dropped == ["DRAPartitionableDevices"]
    again = pub.sync()  # what the server stored is accepted: no update loop
    assert again is not None and again.ops == []
    assert pub.requests["create"] + pub.requests["update"] + pub.requests["delete"] == n
    assert pub.requests["list"] == 2


def test_publisher_update_replaces_devices() -> None:
    client = InMemorySliceApi()
    pub = SlicePublisher(client, DRIVER, "node-a", node_uid="u")
    pub.update([dev("gpu-0"), dev("gpu-1")])
    pub.sync()
    devices = pub.devices
    devices[1]["taints"] = [{"key": "gpu.example.com/xid", "value": "79", "effect": "NoSchedule"}]
    pub.update(devices)
    p = pub.sync()
    assert p is not None and [op.kind for op in p.ops] == ["update"]
    assert pub.requests["get"] == 0
    with pytest.raises(ValueError):
        pub.update([dev("a"), dev("a")])


def test_publisher_run_republishes_after_wipe() -> None:
    client = InMemorySliceApi()
    pub = SlicePublisher(client, DRIVER, "node-a", sync_delay=0.05, resync_interval=60, watch_timeout=2)
    pub.update([dev("gpu-0")])
    stop = threading.Event()
    thread = pub.start(stop)
    try:
        deadline = time.monotonic() + 5
        while not client.objects and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(client.objects) == 1
        creates = pub.requests["create"]
        time.sleep(0.3)  # our own write's watch event must not cause another write
        assert pub.requests["create"] == creates and pub.requests["update"] == 0
        client.wipe()
        deadline = time.monotonic() + 5
        while not client.objects and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(client.objects) == 1 and pub.requests["create"] == creates + 1
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()


def test_publisher_retries_after_errors() -> None:
    class Flaky(InMemorySliceApi):
        fail = 2

        def create(self, res: Resource, body: dict[str, Any], *, namespace: str | None = None) -> dict[str, Any]:
            if self.fail:
                self.fail -= 1
                raise ApiError(500, "InternalError", "boom")
            return super().create(res, body)

    client = Flaky()
    pub = SlicePublisher(client, DRIVER, "node-a", max_backoff=0.05, watch_timeout=1)
    pub.update([dev("gpu-0")])
    stop = threading.Event()
    thread = pub.start(stop)
    try:
        deadline = time.monotonic() + 8
        while not client.objects and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(client.objects) == 1
    finally:
        stop.set()
        thread.join(timeout=5)


def test_publisher_backs_off_while_the_api_server_is_unreachable_past_a_resync() -> None:
    """A periodic resync that fails stays due: the retries must still wait out their backoff."""
    class Down(InMemorySliceApi):
        calls = 0

        def list(self, res: Resource, **kwargs: Any) -> dict[str, Any]:
            self.calls += 1
            raise ApiError(0, "Unreachable", "API server not reached (ConnectionRefusedError)")

    client = Down()
    pub = SlicePublisher(client, DRIVER, "node-a", max_backoff=0.2, resync_interval=0.05, watch_timeout=1)
    pub.update([dev("gpu-0")])
    stop = threading.Event()
    thread = pub.start(stop)
    try:
        time.sleep(1.5)
    finally:
        stop.set()
        thread.join(timeout=5)
    # Backoff 0.05, 0.1, 0.2, 0.2, ... is under a dozen tries in 1.5 s; a loop that ignores it makes thousands.
    assert 3 <= client.calls <= 15, client.calls


# --- the publisher over the project's Kubernetes boundary ----------------------------------------


def test_publisher_over_kube_api() -> None:
    kube = FakeKube()
    kube.add(NODES, {"metadata": {"name": "node-a", "uid": "node-uid-a"}})
    kube.add(SLICES, {"metadata": {"name": "someone-else"}, "spec": {"nodeName": "node-b", "driver": DRIVER}})
    pub = SlicePublisher(kube, DRIVER, "node-a")
    pub.update([dev(f"gpu-{i}") for i in range(130)])
    first = pub.sync()
    assert first is not None and first.slice_count == 2
    assert pub.requests == {"get": 1, "list": 1, "create": 2}
    mine = [o for k, o in kube.objects["resourceslices"].items() if k != "someone-else"]
    assert len(mine) == 2 and all(o["metadata"]["ownerReferences"][0]["uid"] == "node-uid-a" for o in mine)
    assert {len(o["spec"]["devices"]) for o in mine} == {128, 2}
    again = pub.sync()
    assert again is not None and not again.ops  # the other node's slice is not ours to delete
    pub.update([dev("gpu-0")])
    shrink = pub.sync()
    assert shrink is not None and shrink.count("delete") == len(kube.writes("delete")) == 1
    assert sorted(kube.objects["resourceslices"])[-1] == "someone-else" and len(kube.objects["resourceslices"]) == 2
    events = list(kube.watch(SLICES, resource_version="0", timeout_seconds=1, field_selector="spec.nodeName=node-a"))
    assert events and all(e["object"]["spec"]["nodeName"] == "node-a" for e in events)


def test_publisher_errors_are_the_api_clients() -> None:
    kube = FakeKube()
    pub = SlicePublisher(kube, DRIVER, "node-a", node_uid="u")
    pub.update([dev(f"gpu-{i}") for i in range(130)])
    pub.sync()
    pub.update([dev("gpu-0")])
    kube.fail["delete:resourceslices"] = ApiError(404, "NotFound", "gone")
    shrink = pub.sync()  # a slice someone else deleted first is deleted
    assert shrink is not None and shrink.count("delete") == 1
    kube.fail["delete:resourceslices"] = ApiError(409, "Conflict", "precondition failed")
    pub.update([dev(f"gpu-{i}") for i in range(130)])
    pub.sync()
    pub.update([dev("gpu-0")])
    with pytest.raises(ApiError) as e:
        pub.sync()
    assert e.value.conflict
