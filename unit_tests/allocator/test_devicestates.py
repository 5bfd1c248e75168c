"""A device's state, decided once for the fleet views and the controller's metric: the first of
allocated, shared, tainted, blocked that holds, else free."""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Any

from dra_driver.allocator.devicestates import (
    Withheld,
    counters_fit,
    device_census,
    pool_states,
    remaining_counters,
    still_withheld,
)
from dra_driver.allocator.inventory import _digest_consumes, allocated_state, build_inventory

DRIVER = "gpu.dra-driver.io"


def gpu(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "attributes": {"type": {"string": "gpu"}, "productName": {"string": "H100"}}, **extra}


def one_pool(devices: list[dict[str, Any]], slice_count: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": "s"}, "spec": {"driver": DRIVER, "nodeName": "n", "devices": devices,
                                                "pool": {"name": "n", "generation": 1, "resourceSliceCount": slice_count}}}


def held(device: str, **result: Any) -> dict[str, Any]:
    return {"metadata": {"name": f"c-{device}", "namespace": "ns", "uid": device},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": DRIVER, "pool": "n", "device": device, **result}]}}}}


def states(devices: list[dict[str, Any]], claims: list[dict[str, Any]], slice_count: int = 1) -> dict[str, tuple[str, str]]:
    (pool,) = build_inventory([one_pool(devices, slice_count)]).pools
    return {s.device.key[2]: (s.state, s.detail) for s in pool_states(pool, allocated_state(claims))}


def test_the_first_state_that_holds() -> None:
    taint = {"key": "k", "effect": "NoExecute"}
    found = states(
        [gpu("whole", taints=[taint]), gpu("share", allowMultipleAllocations=True), gpu("admin"), gpu("tainted", taints=[taint]),
         gpu("soft", taints=[{"key": "k", "effect": "None"}]), gpu("free")],
        [held("whole"), held("share", shareID="s1", consumedCapacity={"memory": "1Gi"}), held("admin", adminAccess=True)])
    assert found == {"whole": ("allocated", ""), "share": ("shared", ""), "admin": ("free", ""),
                     "tainted": ("tainted", "NoExecute"), "soft": ("free", ""), "free": ("free", "")}


def test_a_pool_that_is_not_complete_blocks_its_devices() -> None:
    assert states([gpu("g")], [], slice_count=2) == {"g": ("blocked", f"pool {DRIVER}/n: incomplete")}


def test_the_census_counts_every_state_of_each_model_and_the_claims_sharing() -> None:
    inventory = build_inventory([one_pool([gpu("a"), gpu("b", allowMultipleAllocations=True), gpu("c")])])
    claims = [held("a"), held("b", shareID="1", consumedCapacity={"memory": "1Gi"}),
              {**held("b", shareID="2", consumedCapacity={"memory": "1Gi"}), "metadata": {"name": "other", "namespace": "ns"}}]
    census = device_census(inventory, allocated_state(claims), DRIVER)
    assert dict(census.devices) == {("H100", "free"): 1, ("H100", "allocated"): 1, ("H100", "shared"): 1,
                                    ("H100", "tainted"): 0, ("H100", "blocked"): 0, ("H100", "withheld"): 0}
    assert dict(census.shares) == {"H100": 2}
    assert device_census(inventory, allocated_state(claims), "other.example.com").devices == {}
    # The withheld devices (by the models their Events name) join the published ones' models.
    withheld = device_census(inventory, allocated_state(claims), DRIVER, withheld={"H100": 2, "L4": 1}).devices
    assert (withheld[("H100", "withheld")], withheld[("H100", "free")], withheld[("L4", "withheld")]) == (2, 1, 1)
    assert {s for m, s in withheld if m == "L4"} == {"free", "allocated", "shared", "tainted", "blocked", "withheld"}


def test_a_withheld_device_is_withheld_while_its_node_publishes_without_it() -> None:
    empty = {**one_pool([]), "metadata": {"name": "e"}}
    empty["spec"] = {**empty["spec"], "nodeName": "m", "pool": {"name": "m", "generation": 1, "resourceSliceCount": 1}}
    other = {**one_pool([gpu("gpu-9")]), "metadata": {"name": "o"}}
    other["spec"] = {**other["spec"], "driver": "other.example.com", "nodeName": "o",
                     "pool": {"name": "o", "generation": 1, "resourceSliceCount": 1}}
    inventory = build_inventory([one_pool([gpu("gpu-0")]), empty, other])
    told = [Withheld("n", "gpu-0", "r"), Withheld("n", "gpu-1", "r"), Withheld("m", "gpu-0", "r"),
            Withheld("gone", "gpu-0", "r"), Withheld("o", "gpu-1", "r"), Withheld("n", "gpu-2", "r", driver="x.io")]
    kept = still_withheld(told, inventory, DRIVER)
    # n's gpu-0 is published since; m publishes an empty pool (alive); gone publishes nothing; o's
    # plugin is another driver's; the last is another driver's device.
    assert [(w.node, w.device) for w in kept] == [("n", "gpu-1"), ("m", "gpu-0")]


def _counters_fit_with_fractions(dev: Any, left: dict[str, dict[str, Fraction]]) -> bool:
    """What counters_fit answered before it compared whole quantities as ints."""
    return all(name in left.get(cs, {}) and value <= left[cs][name] for cs, counters in dev.consumes
               for name, value in counters.items())


def test_counters_fit_answers_as_with_fractions() -> None:
    rng = random.Random(54)
    values = ["0", "1", "2", "7", "500m", "1500m", "1Gi", "1025Mi", "3"]
    for _ in range(300):
        consumes = [{"counterSet": rng.choice(["a", "b"]),
                     "counters": {rng.choice(["m", "s", "t"]): {"value": rng.choice(values)} for _ in range(rng.randint(0, 3))}}
                    for _ in range(rng.randint(1, 2))]
        sl = one_pool([gpu("g", consumesCounters=consumes)])
        sl["spec"]["sharedCounters"] = [{"name": "a", "counters": {n: {"value": rng.choice(values)} for n in "ms"}}]
        (pool,) = build_inventory([sl]).pools
        (dev,) = pool.devices
        left = remaining_counters(pool, set())
        assert counters_fit(dev, left) == _counters_fit_with_fractions(dev, left), consumes


def test_equal_counter_maps_are_digested_once_per_build_and_read_the_same() -> None:
    shared = {"memory": {"value": "10Gi"}, "slices": {"value": "1"}}
    devices = [gpu(f"mig-{i}", consumesCounters=[{"counterSet": "cs", "counters": shared}]) for i in range(3)]
    sl = one_pool(devices)
    sl["spec"]["sharedCounters"] = [{"name": "cs", "counters": {"memory": {"value": "20Gi"}, "slices": {"value": "2"}}}]
    (pool,) = build_inventory([sl]).pools
    assert all(d.consumes == _digest_consumes(d.raw.get("consumesCounters")) for d in pool.devices)
    assert pool.devices[0].consumes[0][1] is pool.devices[2].consumes[0][1]
    assert [s.state for s in pool_states(pool, allocated_state([held("mig-0")]))] == ["allocated", "free", "free"]
    assert [s.state for s in pool_states(pool, allocated_state([held("mig-0"), held("mig-1")]))] == [
        "allocated", "allocated", "blocked"]
