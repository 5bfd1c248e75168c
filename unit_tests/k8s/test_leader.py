"""Lease-based leader election."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ctrlfix import FakeClock
from kubefake import FakeKube

from dra_driver.k8s.client import LEASES, ApiError
from dra_driver.k8s.leader import LeaderElector, LeaseConfig

KEY = "kube-system/dra-driver-controller"


def elector(kube: FakeKube, identity: str, clock: FakeClock) -> LeaderElector:
    return LeaderElector(kube, LeaseConfig("kube-system", "dra-driver-controller", identity), clock=clock,
                         wall=lambda: datetime(2025, 1, 1, tzinfo=UTC))


def holder(kube: FakeKube) -> Any:
    return kube.obj(LEASES, KEY)["spec"].get("holderIdentity")


def test_first_candidate_creates_and_holds() -> None:
    kube, clock = FakeKube(), FakeClock()
    a = elector(kube, "a", clock)
    assert a.try_acquire_or_renew() and a.is_leader()
    spec = kube.obj(LEASES, KEY)["spec"]
    assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 15
    assert spec["renewTime"] == "2025-01-01T00:00:00.000000Z"


def test_second_candidate_waits_until_the_lease_expires() -> None:
    kube, clock = FakeKube(), FakeClock()
    a, b = elector(kube, "a", clock), elector(kube, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew() and not b.is_leader()
    clock.advance(10)
    assert a.try_acquire_or_renew()  # renewal changes the record: b's observation restarts
    clock.advance(10)
    assert not b.try_acquire_or_renew()
    # a dies; 15 s after b last saw a change, b takes over
    clock.advance(16)
    assert not a.is_leader()  # a's own view: renew deadline long passed
    assert b.try_acquire_or_renew() and b.is_leader()
    lease = kube.obj(LEASES, KEY)["spec"]
    assert lease["holderIdentity"] == "b" and lease["leaseTransitions"] == 1


def test_leader_stops_acting_after_renew_deadline() -> None:
    kube, clock = FakeKube(), FakeClock()
    a = elector(kube, "a", clock)
    a.try_acquire_or_renew()
    kube.fail["get:leases"] = ApiError(0, "ConnectionError", "down")
    clock.advance(5)
    assert not a.try_acquire_or_renew() and a.is_leader()
    clock.advance(6)
    assert not a.is_leader()


def test_conflict_loses() -> None:
    kube, clock = FakeKube(), FakeClock()
    a = elector(kube, "a", clock)
    a.try_acquire_or_renew()

    def other_writes(k: FakeKube, res: Any, _: Any) -> None:
        obj = k.obj(LEASES, KEY)
        obj["spec"]["holderIdentity"] = "z"
        k.set(LEASES, obj)

    kube.hooks["replace:leases"] = other_writes
    clock.advance(11)
    assert not a.try_acquire_or_renew() and not a.is_leader()


def test_release_hands_over_at_once() -> None:
    kube, clock = FakeKube(), FakeClock()
    a, b = elector(kube, "a", clock), elector(kube, "b", clock)
    a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.release() and not a.is_leader()
    assert holder(kube) is None
    assert b.try_acquire_or_renew() and holder(kube) == "b"
    assert not a.release()  # not the holder any more: leaves it alone


def test_callback_on_change() -> None:
    kube, clock = FakeKube(), FakeClock()
    seen: list[bool] = []
    a = LeaderElector(kube, LeaseConfig("kube-system", "dra-driver-controller", "a"), clock=clock,
                      on_change=seen.append)
    a.try_acquire_or_renew()
    a.try_acquire_or_renew()
    a.release()
    assert seen == [True, False]


def test_run_loop_releases_on_stop() -> None:
    import threading

    kube, clock = FakeKube(), FakeClock()
    a = LeaderElector(kube, LeaseConfig("kube-system", "dra-driver-controller", "a", retry_period=0.01), clock=clock)
    stop = threading.Event()
    t = a.start(stop)
    for _ in range(500):
        if a.is_leader():
            break
        threading.Event().wait(0.01)
    assert a.is_leader()
    stop.set()
    t.join(5)
    assert holder(kube) is None
