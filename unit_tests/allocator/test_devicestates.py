"""A device's state, decided once for the fleet views and the controller's metric: the first of
allocated, shared, tainted, blocked that holds, else free."""

from __future__ import annotations

from typing import Any

from dra_driver.allocator.devicestates import device_census, pool_states
from dra_driver.allocator.inventory import allocated_state, build_inventory

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
                                    ("H100", "tainted"): 0, ("H100", "blocked"): 0}
    assert dict(census.shares) == {"H100": 2}
    assert device_census(inventory, allocated_state(claims), "other.example.com").devices == {}
