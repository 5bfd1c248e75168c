"""What the claims hold: the informer's claims with the controller's own recent writes laid over them
until the watch brings them or they expire, and a version that counts every change."""

from __future__ import annotations

from ctrlfix import DRIVER, FakeClock, allocated_status, claim

from dra_driver.allocator.resolve import Engine
from dra_driver.controller.accounting import LEDGER_TTL_SECONDS, Accounting
from dra_driver.k8s.informer import Store
from dra_driver.k8s.objects import Obj


def stored(name: str, uid: str, devices: list[str] | None = None, rv: str = "1") -> Obj:
    c = claim(name)
    c["metadata"].update(uid=uid, resourceVersion=rv)
    if devices is not None:
        c["status"] = allocated_status(devices)
    return c


def accounting(*claims: Obj) -> tuple[Accounting, Store, FakeClock, list[int]]:
    store, clock, changes = Store(), FakeClock(), []
    for c in claims:
        store.put(c)
    return Accounting(store, Engine(), clock, lambda: changes.append(1)), store, clock, changes


def held_devices(acc: Accounting, c: Obj) -> set[str]:
    return {device for _, _, device in acc.held_by_others(c)[1].devices}


def test_an_allocation_written_stands_in_until_the_watch_brings_it() -> None:
    pending = stored("c1", "u1")
    acc, store, _, changes = accounting(pending, stored("c2", "u2"))
    written = stored("c1", "u1", ["gpu-0"], rv="2")
    acc.track(written)
    assert acc.tracks("u1") and acc.written() == [written] and changes == [1]
    assert held_devices(acc, stored("c2", "u2")) == {"gpu-0"}  # the store still has c1 pending
    assert [c["metadata"]["name"] for c in acc.claims()] == ["c1", "c2"]
    store.put(written)  # the watch delivered it: the store's copy wins, the same devices
    assert held_devices(acc, stored("c2", "u2")) == {"gpu-0"}


def test_a_written_allocation_expires_and_is_forgotten_once() -> None:
    acc, _, clock, changes = accounting(stored("c1", "u1"))
    acc.track(stored("c1", "u1", ["gpu-1"], rv="2"))
    version = acc.version
    clock.advance(LEDGER_TTL_SECONDS + 1)
    assert acc.claims()[0].get("status") is None  # expired: the store's pending claim again
    assert not acc.tracks("u1") and acc.version == version + 1 and len(changes) == 2
    acc.forget("u1")
    assert acc.version == version + 1  # nothing left to forget: no change


def test_the_sum_of_holdings_is_made_once_per_version() -> None:
    acc, store, _, _ = accounting(stored("c1", "u1", ["gpu-0"]))
    first = acc.held()
    assert acc.held()[1] is first[1]  # the same sum, not made again
    store.put(stored("c2", "u2", ["gpu-1"]))
    assert acc.held()[1] is first[1]  # the store changed, but nobody said so
    acc.changed()
    version, state = acc.held()
    assert version == first[0] + 1 and {d for _, _, d in state.devices} == {"gpu-0", "gpu-1"}


def test_a_claim_with_devices_of_its_own_is_not_counted_against_itself() -> None:
    mine = stored("c1", "u1", ["gpu-0"])
    acc, _, _, _ = accounting(mine, stored("c2", "u2", ["gpu-1"]))
    version, state = acc.held_by_others(mine)
    assert version is None and {d for _, _, d in state.devices} == {"gpu-1"}
    version, state = acc.held_by_others(stored("c3", "u3"))
    assert version == acc.version and {(DRIVER, "node-a", "gpu-0"), (DRIVER, "node-a", "gpu-1")} <= state.devices


def test_keep_lays_our_write_into_the_store_unless_the_watch_moved_on() -> None:
    base = stored("c1", "u1", rv="5")
    acc, store, _, changes = accounting(base)
    acc.keep(stored("c1", "u1", ["gpu-0"], rv="6"), base)
    assert store.get("default/c1") is not None and len(changes) == 1  # devices taken: a change
    acc.keep(stored("c1", "u1", ["gpu-1"], rv="7"), base)  # made against an older version
    kept = store.get("default/c1")
    assert kept is not None and kept["metadata"]["resourceVersion"] == "6" and len(changes) == 1
