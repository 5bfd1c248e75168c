"""kube-scheduler 1.38's allocator rules (the ``stable`` variant of v0.38) against 1.37's: each test
decides one claim under both rule sets and requires the answer each scheduler gives."""

from typing import Any

import pytest

from dra_driver.allocator.context import SCHEDULER_ABORTS
from dra_driver.allocator.inventory import AllocatedState, allocated_state, build_inventory
from dra_driver.allocator.resolve import Resolution, resolve
from dra_driver.allocator.rules import (
    SchedulerRules,
    locked_gates,
    mirrored_variant,
    scheduler_features,
    scheduler_variant,
)

D = "gpu.dra-driver.io"
CLASSES = [{"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{D}"'}}]}},
           {"metadata": {"name": "any"}, "spec": {}}]  # no selector: no CEL meets a device's attributes
R37, R38 = SchedulerRules(37), SchedulerRules(38)


def gpu(name: str, attributes: dict[str, Any] | None = None, capacity: dict[str, Any] | None = None,
        **extra: Any) -> dict[str, Any]:  # fmt: skip
    return {"name": name, "attributes": attributes or {}, "capacity": capacity or {"memory": {"value": "80Gi"}}, **extra}


def slice_(node: str, devices: list[dict[str, Any]], count: int = 1, name: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name or f"{node}-slice"}, "spec": {
        "driver": D, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": count},
        "devices": devices}}  # fmt: skip


def request(name: str = "gpu", count: int | None = 1, selectors: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": "gpu"} | extra
    if count is not None:
        body["count"] = count
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": body}


def claim(*requests: dict[str, Any], constraints: list[Any] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    return {"metadata": {"name": "c", "namespace": "ns", "uid": "uid-c"}, "spec": {"devices": devices}}


def picked(res: Resolution) -> list[str]:
    assert res.allocation is not None, res.explanation.render()
    return [f"{r['pool']}/{r['device']}" for r in res.allocation["devices"]["results"]]


def aborted(res: Resolution) -> str:
    assert res.allocation is None
    errors = [e for e in res.explanation.errors if SCHEDULER_ABORTS in e]
    assert errors, res.explanation.render()
    return errors[0]


def both(c: dict[str, Any], slices: list[dict[str, Any]],
         allocated: AllocatedState | None = None) -> tuple[Resolution, Resolution]:
    inv = build_inventory(slices)
    return resolve(c, inv, CLASSES, allocated, rules=R37), resolve(c, inv, CLASSES, allocated, rules=R38)


# --------------------------------------------------------------------------- versions and gates


def test_the_mirrored_variant_follows_the_minor() -> None:
    assert [mirrored_variant(m) for m in (36, 37, 38)] == ["incubating", "incubating", "stable"]
    # 1.38's stable covers consumable capacity, 1.37's does not: the version and the gates choose together.
    sharing = scheduler_features({}, 37)
    assert "ConsumableCapacity" in sharing and scheduler_variant(sharing, 37) == "incubating"
    assert scheduler_variant(sharing, 38) == "stable"
    assert scheduler_variant(scheduler_features({"DRAListTypeAttributes": True}, 38), 38) == "incubating"
    # Locked gates stay on whatever the flags say (a 1.38 component refuses to start otherwise).
    assert "DRADeviceTaints" in locked_gates(38) and "DRADeviceTaints" not in locked_gates(37)
    assert "DeviceTaints" in scheduler_features({"DRADeviceTaints": False}, 38)
    assert "DeviceTaints" not in scheduler_features({"DRADeviceTaints": False}, 37)


@pytest.mark.parametrize(("version", "minor"), [("v1.35.9", 36), ("v1.36.3", 36), ("v1.37.2", 37),
                                                ("v1.38.0-beta.0", 38), ("v1.39.1", 38), ("", 38), ("vX", 38)])
def test_rules_for_a_version(version: str, minor: int) -> None:
    rules = SchedulerRules.for_version(version)
    assert rules.minor == minor
    assert rules.label == f"kube-scheduler 1.{minor} ({mirrored_variant(minor)} allocator)"


# --------------------------------------------------------------------------- (a) qualified names


def test_cel_reads_the_qualified_spelling_of_an_attribute_published_both_ways() -> None:
    # The unqualified spelling comes last: 1.37 (the engine's pick of its random map order) reads
    # it, 1.38 always the qualified one.
    d = gpu("gpu-0", {f"{D}/model": {"string": "H100"}, "model": {"string": "A100"}})
    c = claim(request(selectors=(f'device.attributes["{D}"].model == "H100"',)))
    old, new = both(c, [slice_("node-a", [d])])
    assert old.allocation is None
    assert picked(new) == ["node-a/gpu-0"]


def test_cel_reads_the_qualified_spelling_of_a_capacity_published_both_ways() -> None:
    d = gpu("gpu-0", capacity={f"{D}/memory": {"value": "80Gi"}, "memory": {"value": "40Gi"}})
    c = claim(request(selectors=(f'device.capacity["{D}"].memory.compareTo(quantity("80Gi")) == 0',)))
    old, new = both(c, [slice_("node-a", [d])])
    assert old.allocation is None
    assert picked(new) == ["node-a/gpu-0"]


def test_constraints_read_the_qualified_spelling_in_every_version() -> None:
    # 1.37's lookupAttribute already tried the qualified name first: both versions agree.
    a = gpu("gpu-0", {f"{D}/numa": {"int": 0}, "numa": {"int": 1}})
    b = gpu("gpu-1", {"numa": {"int": 0}})
    c = claim(request(count=2), constraints=[{"matchAttribute": f"{D}/numa"}])
    old, new = both(c, [slice_("node-a", [a, b])])
    assert picked(old) == picked(new) == ["node-a/gpu-0", "node-a/gpu-1"]


# --------------------------------------------------------------------------- (b) capacity requests


def shareable(name: str, capacity: dict[str, Any]) -> dict[str, Any]:
    return gpu(name, capacity=capacity, allowMultipleAllocations=True)


def test_a_qualified_capacity_request_names_an_unqualified_capacity() -> None:
    c = claim(request(capacity={"requests": {f"{D}/memory": "10Gi"}}))
    old, new = both(c, [slice_("node-a", [shareable("gpu-0", {"memory": {"value": "80Gi"}})])])
    assert old.allocation is None
    assert picked(new) == ["node-a/gpu-0"]
    # (c) written under the name the device published.
    assert new.allocation is not None
    assert new.allocation["devices"]["results"][0]["consumedCapacity"] == {"memory": "10Gi"}


def test_an_unqualified_capacity_request_names_a_qualified_capacity() -> None:
    c = claim(request(capacity={"requests": {"memory": "10Gi"}}))
    old, new = both(c, [slice_("node-a", [shareable("gpu-0", {f"{D}/memory": {"value": "80Gi"}})])])
    assert old.allocation is None
    assert new.allocation is not None
    assert new.allocation["devices"]["results"][0]["consumedCapacity"] == {f"{D}/memory": "10Gi"}


def test_one_capacity_requested_both_ways_is_an_error() -> None:
    c = claim(request(capacity={"requests": {"memory": "10Gi", f"{D}/memory": "10Gi"}}))
    d = shareable("gpu-0", {"memory": {"value": "80Gi"}, f"{D}/memory": {"value": "80Gi"}})
    old, new = both(c, [slice_("node-a", [d])])
    assert picked(old) == ["node-a/gpu-0"]  # two capacities to 1.37
    assert f'capacity "memory" requested both as "{D}/memory" and as "memory"' in aborted(new)


def test_a_capacity_the_device_lacks_skips_it_before_the_double_name_counts() -> None:
    c = claim(request(capacity={"requests": {"memory": "10Gi", f"{D}/memory": "10Gi", "bandwidth": "1"}}))
    old, new = both(c, [slice_("node-a", [shareable("gpu-0", {"memory": {"value": "80Gi"}})])])
    assert old.allocation is None and new.allocation is None
    assert not any(SCHEDULER_ABORTS in e for e in new.explanation.errors)


def test_a_capacity_published_both_ways_is_one_capacity() -> None:
    d = shareable("gpu-0", {"memory": {"value": "80Gi"}, f"{D}/memory": {"value": "40Gi"}})
    c = claim(request(capacity={"requests": {"memory": "50Gi"}}))
    old, new = both(c, [slice_("node-a", [d])])
    # 1.37: 50Gi of "memory" and all 40Gi of the other one; 1.38: only the qualified 40Gi exist.
    assert old.allocation is not None
    assert old.allocation["devices"]["results"][0]["consumedCapacity"] == {"memory": "50Gi", f"{D}/memory": "40Gi"}
    assert new.allocation is None


def test_other_claims_consumption_adds_up_across_spellings() -> None:
    d = shareable("gpu-0", {"memory": {"value": "80Gi"}})
    state = allocated_state([{"metadata": {"name": "x", "namespace": "ns"}, "status": {"allocation": {"devices": {
        "results": [{"request": "r", "driver": D, "pool": "node-a", "device": "gpu-0", "shareID": "a",
                     "consumedCapacity": {f"{D}/memory": "60Gi"}}]}}}}])  # fmt: skip
    c = claim(request(capacity={"requests": {"memory": "30Gi"}}))
    old, new = both(c, [slice_("node-a", [d])], state)
    # 1.37 adds the other claim's "<driver>/memory" to a capacity the device does not have.
    assert picked(old) == ["node-a/gpu-0"]
    assert new.allocation is None


# --------------------------------------------------------------------------- (d) constraints


def test_match_attribute_ignores_build_metadata_of_versions() -> None:
    a = gpu("gpu-0", {"driverVersion": {"version": "570.86.10+a"}})
    b = gpu("gpu-1", {"driverVersion": {"version": "570.86.10+b"}})
    c = claim(request(count=2), constraints=[{"matchAttribute": f"{D}/driverVersion"}])
    old, new = both(c, [slice_("node-a", [a, b])])
    assert old.allocation is None
    assert picked(new) == ["node-a/gpu-0", "node-a/gpu-1"]
    # distinctAttribute: the same versions are one value to 1.38.
    c = claim(request(count=2), constraints=[{"distinctAttribute": f"{D}/driverVersion"}])
    old, new = both(c, [slice_("node-a", [a, b])])
    assert picked(old) == ["node-a/gpu-0", "node-a/gpu-1"]
    assert new.allocation is None


def test_an_attribute_a_constraint_cannot_compare_is_an_error() -> None:
    listed = gpu("gpu-0", {"numa": {"ints": [0, 1]}})
    plain = gpu("gpu-1", {"numa": {"int": 0}})
    c = claim(request(count=1, deviceClassName="any"), constraints=[{"matchAttribute": f"{D}/numa"}])
    old, new = both(c, [slice_("node-a", [listed, plain])])
    assert picked(old) == ["node-a/gpu-1"]  # 1.37 skips the device
    assert f"device {D}/node-a/gpu-0: unsupported attribute value for {D}/numa" in aborted(new)


HUGE = "100000000000000000000.0.0"  # past 2^64 - 1: the 1.37 API server takes it, semver's uint64s do not


@pytest.mark.parametrize("kind", ["matchAttribute", "distinctAttribute"])
def test_a_version_semver_cannot_hold_is_an_error_under_a_constraint(kind: str) -> None:
    huge, plain = gpu("gpu-0", {"firmwareVersion": {"version": HUGE}}), gpu("gpu-1", {"firmwareVersion": {"version": "1.2.3"}})
    c = claim(request(count=2, deviceClassName="any"), constraints=[{kind: f"{D}/firmwareVersion"}])
    old, new = both(c, [slice_("node-a", [huge, plain])])
    # 1.37 compares the two as strings (no CEL here: the class has no selector).
    if kind == "matchAttribute":
        assert old.allocation is None and not old.explanation.errors
    else:
        assert picked(old) == ["node-a/gpu-0", "node-a/gpu-1"]
    assert f"device {D}/node-a/gpu-0: unsupported attribute value for {D}/firmwareVersion" in aborted(new)
    assert new.explanation.failure == {"request": "gpu", "device": f"{D}/node-a/gpu-0"}
    assert "in plain words: a matchAttribute or distinctAttribute constraint met a device" in new.explanation.render()


def test_the_uncomparable_device_is_tried_even_where_too_few_devices_are_left() -> None:
    # Two devices for a request of three: the scheduler still tries the first and stops at it.
    devices = [gpu("gpu-0", {"firmwareVersion": {"version": HUGE}}), gpu("gpu-1", {"firmwareVersion": {"version": HUGE}})]
    c = claim(request(count=3, deviceClassName="any"), constraints=[{"matchAttribute": f"{D}/firmwareVersion"}])
    old, new = both(c, [slice_("node-a", devices)])
    assert old.allocation is None and not any(SCHEDULER_ABORTS in e for e in old.explanation.errors)
    assert f"device {D}/node-a/gpu-0: unsupported attribute value" in aborted(new)


def test_a_version_semver_cannot_hold_fails_every_selector_up_to_137_and_only_a_reading_one_in_138() -> None:
    slices = [slice_("node-a", [gpu("gpu-0", {"firmwareVersion": {"version": HUGE}, "model": {"string": "A"}})])]
    old, new = both(claim(request()), slices)
    # 1.37 converts every attribute for CEL first: even the class's driver check fails.
    assert ('attribute firmwareVersion: parse semantic version: strconv.ParseUint: parsing "100000000000000000000": '
            "value out of range") in aborted(old)
    assert old.explanation.failure == {"request": "gpu", "selector": "class gpu selector #0", "device": f"{D}/node-a/gpu-0"}
    assert "in plain words: the device publishes a version with a number larger than" in old.explanation.render()
    assert picked(new) == ["node-a/gpu-0"]
    inv = build_inventory(slices)
    model = claim(request(selectors=(f'device.attributes["{D}"].model == "A"',)))
    assert picked(resolve(model, inv, CLASSES, rules=R38)) == ["node-a/gpu-0"]
    version = claim(request(selectors=(f'device.attributes["{D}"].firmwareVersion.isGreaterThan(semver("1.0.0"))',)))
    res = resolve(version, inv, CLASSES, rules=R38)
    assert "attribute firmwareVersion: value is invalid or its type is not supported by this version" in aborted(res)
    assert res.explanation.failure == {"request": "gpu", "selector": "request gpu selector #0", "device": f"{D}/node-a/gpu-0"}
    assert "in plain words: the selector reads an attribute kube-scheduler 1.38 could not read" in res.explanation.render()


# --------------------------------------------------------------------------- (e) All and incomplete pools


def test_all_beside_an_incomplete_pool_fails_that_node_only() -> None:
    incomplete = slice_("node-a", [gpu("gpu-0")], count=2)
    whole = slice_("node-b", [gpu("gpu-0"), gpu("gpu-1")])
    c = claim(request(count=None, allocationMode="All"))
    old, new = both(c, [incomplete, whole])
    assert "being updated" in aborted(old)
    assert picked(new) == ["node-b/gpu-0", "node-b/gpu-1"]


# --------------------------------------------------------------------------- (f) shares and exclusive use


def held(device: str, consumed: dict[str, str] | None) -> AllocatedState:
    """Another claim's share of ``device`` on node-a, from when its slice still allowed shares."""
    result: dict[str, Any] = {"request": "r", "driver": D, "pool": "node-a", "device": device, "shareID": "a"}
    if consumed is not None:
        result["consumedCapacity"] = consumed
    return allocated_state([{"metadata": {"name": "x", "namespace": "ns"},
                             "status": {"allocation": {"devices": {"results": [result]}}}}])


def test_a_device_that_stopped_allowing_shares_is_in_use_while_shares_remain() -> None:
    # A share without a consumedCapacity: nothing for the capacity check to count.
    state = held("gpu-0", None)
    slices = [slice_("node-a", [gpu("gpu-0"), gpu("gpu-1")])]
    old, new = both(claim(request()), slices, state)
    assert picked(old) == ["node-a/gpu-0"]  # double allocation
    assert picked(new) == ["node-a/gpu-1"]
    # Admin access is not held back.
    admin = claim(request(adminAccess=True))
    assert picked(resolve(admin, build_inventory(slices), CLASSES, state, rules=R38)) == ["node-a/gpu-0"]


@pytest.mark.parametrize("minor", [36, 37, 38])
def test_a_share_with_consumed_capacity_leaves_an_exclusive_device_too_little_in_every_version(minor: int) -> None:
    # Every version checks capacity on every device (CmpRequestOverCapacity): 10Gi held plus the
    # exclusive allocation's whole 80Gi do not fit, for admin access too.
    state = held("gpu-0", {"memory": "10Gi"})
    inv = build_inventory([slice_("node-a", [gpu("gpu-0"), gpu("gpu-1")])])
    rules = SchedulerRules(minor)
    assert picked(resolve(claim(request()), inv, CLASSES, state, rules=rules)) == ["node-a/gpu-1"]
    assert picked(resolve(claim(request(adminAccess=True)), inv, CLASSES, state, rules=rules)) == ["node-a/gpu-1"]
    # Asking for less than is left fits, until 1.38 holds the device as in use while shared.
    small = claim(request(capacity={"requests": {"memory": "70Gi"}}))
    assert picked(resolve(small, inv, CLASSES, state, rules=rules)) == [f"node-a/gpu-{int(minor >= 38)}"]
    alone = resolve(claim(request()), build_inventory([slice_("node-a", [gpu("gpu-0")])]), CLASSES, state, rules=rules)
    assert alone.allocation is None
    assert "memory: 10Gi of 80Gi still consumed by shares of ns/x" in alone.explanation.render()


# --------------------------------------------------------------------------- (g) negative consumedCapacity


def test_a_negative_consumed_capacity_fails_every_allocation_naming_the_claim() -> None:
    state = allocated_state([{"metadata": {"name": "broken", "namespace": "team"}, "status": {"allocation": {"devices": {
        "results": [{"request": "r", "driver": D, "pool": "node-b", "device": "gpu-0", "shareID": "a",
                     "consumedCapacity": {"memory": "-1Gi"}}]}}}}])  # fmt: skip
    old, new = both(claim(request()), [slice_("node-a", [gpu("gpu-0")])], state)
    assert picked(old) == ["node-a/gpu-0"]
    error = aborted(new)
    # The claim resolved is not in team: the broken claim is not named to its author, only said to be.
    assert "a claim in another namespace, device" in error and "team/broken" not in new.explanation.render()
    assert 'consumed capacity "memory" must not be negative, got -1Gi' in error
    in_team = claim(request())
    in_team["metadata"]["namespace"] = "team"
    mine = resolve(in_team, build_inventory([slice_("node-a", [gpu("gpu-0")])]), CLASSES,
                   state, rules=SchedulerRules(38))
    assert "claim team/broken, device" in aborted(mine) and "team/broken" in mine.explanation.render()
