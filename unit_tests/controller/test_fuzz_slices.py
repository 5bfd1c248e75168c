"""Fuzzing the resolution engine and the controller's decisions with ResourceSlices of a buggy driver.

Garbage fields, duplicate device names, wrong types and huge counts must end as explanation
entries (pool problems, per-request notes), never as an exception or an "internal error".
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from fuzzing import TEXT, examples, json_values, mutate
from hypothesis import given, settings
from hypothesis import strategies as st
from nodefix import build_devices

from dra_driver.allocator.inventory import allocated_state, build_inventory
from dra_driver.allocator.resolve import Engine, resolve
from dra_driver.controller.allocating import allocation_conflicts
from dra_driver.controller.annotations import desired_annotations, explanation_document
from dra_driver.controller.keys import MAX_EXPLANATION_BYTES, REPORTING_CONTROLLER
from dra_driver.controller.verdicts import Verdict, evaluate
from dra_driver.k8s.client import CLAIMS as CLAIM_RESOURCE
from dra_driver.k8s.events import Occurrence, event_body, object_ref
from dra_driver.node.describe.devices import describe

OURS = "gpu.dra-driver.io"
BUGGY = "buggy.example.com"
CLASSES = {
    "gpu.gpu.dra-driver.io": {"metadata": {"name": "gpu.gpu.dra-driver.io"}, "spec": {"selectors": [
        {"cel": {"expression": f"device.driver == '{OURS}'"}}]}},
    "buggy": {"metadata": {"name": "buggy"}, "spec": {"selectors": [
        {"cel": {"expression": f"device.driver == '{BUGGY}'"}}]}},
}
OUR_DEVICES = describe(build_devices(), OURS, False)[0][:3]


def good_slice(driver: str, node: str, devices: list[dict[str, Any]], gen: int = 1, count: int = 1) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}-{gen}"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": gen,
                                                                  "resourceSliceCount": count},
                     "devices": devices}}


BUGGY_DEVICES = [
    {"name": "dev-0", "attributes": {"model": {"string": "X"}, "index": {"int": 0}}, "capacity": {"mem": {"value": "1Gi"}}},
    {"name": "dev-1", "attributes": {"model": {"string": "Y"}, "index": {"int": 1}}, "capacity": {"mem": {"value": "2Gi"}}},
]
BASE = [good_slice(OURS, "node-a", OUR_DEVICES), good_slice(BUGGY, "node-a", BUGGY_DEVICES)]


def claim_for(cls: str, count: Any = 1, mode: str = "ExactCount", selector: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "allocationMode": mode}
    if mode == "ExactCount":
        exactly["count"] = count
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": "uid-1"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": exactly}]}}}


CLAIMS = st.one_of(
    st.builds(claim_for, st.sampled_from([*sorted(CLASSES), "missing"]),
              st.one_of(st.integers(-2, 5), st.integers(2**31, 2**70), json_values(3)),
              st.sampled_from(["ExactCount", "All", "Bogus"]),
              st.one_of(st.none(), st.sampled_from([
                  f"device.attributes['{BUGGY}'].model == 'X'", "device.capacity['buggy.example.com'].mem.isGreaterThan("
                  "quantity('1Gi'))", f"device.attributes['{BUGGY}'].index > 0", "device.driver ==",
              ]))),
)


def check(slices: list[Any], claim: dict[str, Any]) -> None:
    inventory = build_inventory(slices)  # must not raise
    res = resolve(claim, inventory, CLASSES)
    errors = res.explanation.errors
    assert not any("internal error" in e for e in errors), errors
    assert isinstance(res.explanation.summary, str)
    res.explanation.render()
    json.dumps(res.explanation.to_dict())
    outcome = evaluate(Engine(), claim, inventory, CLASSES,
                       allocated_state([]), driver=OURS, require_own_driver=True)
    assert outcome.verdict is not Verdict.ERROR, outcome.summary
    doc = explanation_document(outcome)
    assert len(doc.encode()) <= MAX_EXPLANATION_BYTES
    json.loads(doc)
    annotations = desired_annotations(outcome, OURS)
    assert annotations is None or all(isinstance(v, str) for v in annotations.values())
    event_body(object_ref(claim, CLAIM_RESOURCE), Occurrence("Warning", str(outcome.verdict), "Allocate", outcome.summary),
               controller=REPORTING_CONTROLLER, instance="fuzz", now=datetime.now(UTC))
    if res.allocation is not None:
        other = {**claim, "metadata": {**claim["metadata"], "uid": "uid-2"}, "status": {"allocation": res.allocation}}
        assert allocation_conflicts(res.allocation, "uid-1", [other])


@settings(max_examples=examples(1.5))
@given(st.data(), CLAIMS)
def test_mutated_slices_of_a_buggy_driver(data: st.DataObject, claim: dict[str, Any]) -> None:
    slices = list(BASE)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(slices) - 1))
        slices[i] = mutate(slices[i], data)
    check(slices, claim)


@given(st.lists(json_values(20), max_size=4), CLAIMS)
def test_arbitrary_slice_lists(slices: list[Any], claim: dict[str, Any]) -> None:
    check(slices, claim)


@given(st.fixed_dictionaries({
    "name": st.one_of(TEXT, json_values(2)),
    "attributes": st.dictionaries(TEXT, json_values(3), max_size=3),
    "capacity": st.dictionaries(TEXT, st.one_of(json_values(3), st.builds(lambda v: {"value": v}, TEXT)), max_size=3),
    "taints": st.lists(json_values(3), max_size=2),
    "consumesCounters": json_values(3),
}), st.integers(0, 3), st.one_of(st.integers(-5, 5), st.integers(2**40, 2**80), json_values(2)), CLAIMS)
def test_garbage_devices_duplicates_and_huge_counts(device: dict[str, Any], copies: int, count: Any,
                                                    claim: dict[str, Any]) -> None:
    devices = [*BUGGY_DEVICES, *[device] * copies, BUGGY_DEVICES[0]]  # always one duplicate name
    buggy = good_slice(BUGGY, "node-a", devices)
    buggy["spec"]["pool"]["resourceSliceCount"] = count
    buggy["spec"]["pool"]["generation"] = count
    check([BASE[0], buggy], claim)
    inventory = build_inventory([BASE[0], buggy])
    assert any("duplicate device name" in p for p in inventory.problems) or any(
        "incomplete" in p for p in inventory.problems), inventory.problems


def test_duplicate_names_are_explained_and_ours_still_allocate() -> None:
    buggy = good_slice(BUGGY, "node-a", [*BUGGY_DEVICES, BUGGY_DEVICES[0]])
    inventory = build_inventory([BASE[0], buggy])
    assert any("duplicate device name dev-0" in p for p in inventory.problems)
    assert resolve(claim_for("gpu.gpu.dra-driver.io"), inventory, CLASSES).allocated
    res = resolve(claim_for("buggy"), inventory, CLASSES)
    assert not res.allocated
    assert "duplicate device name" in res.explanation.render()


ATTRIBUTE_VALUES = st.one_of(
    json_values(3),
    st.sampled_from([{"int": 1}, {"int": True}, {"int": 1.0}, {"bool": 1}, {"bool": False}, {"string": 5},
                     {"string": "x"}, {"version": "1.2.3"}, {"version": "01.2.3"}, {"version": "v1"},
                     {"version": 3}, {"int": 1, "string": "a"}, {"int": None}, {}, "flat"]),
)
CAPACITY_VALUES = st.one_of(json_values(2), st.builds(lambda v: {"value": v}, st.one_of(
    TEXT, st.integers(), st.sampled_from(["1Gi", "80Gi", "1.5", "-1", "1e3", "0.1m", "abc"]))))


@settings(max_examples=examples(2))
@given(st.dictionaries(TEXT, ATTRIBUTE_VALUES, max_size=4), st.dictionaries(TEXT, CAPACITY_VALUES, max_size=3),
       st.booleans(), st.sampled_from([BUGGY, OURS]))
def test_driver_fast_path_agrees_with_cel(attributes: dict[str, Any], capacity: dict[str, Any], multi: bool,
                                          driver: str) -> None:
    """The engine decides ``device.driver == "x"`` without CEL for devices it digested as clean;
    that must be exactly what CEL says, runtime errors of broken devices included."""
    device = {"name": "dev-0", "attributes": attributes, "capacity": capacity, "allowMultipleAllocations": multi}
    inventory = build_inventory([good_slice(driver, "node-a", [device])])
    for dev in inventory.devices:
        assert dev.cel_clean == (dev.activation.error is None), (dev.raw, dev.activation.error)
    for cls in CLASSES:  # the same verdicts with the fast path and through CEL
        fast = resolve(claim_for(cls), inventory, CLASSES)
        slow_classes = {name: {**c, "spec": {"selectors": [{"cel": {"expression": (
            c["spec"]["selectors"][0]["cel"]["expression"] + " && true")}}]}} for name, c in CLASSES.items()}
        slow = resolve(claim_for(cls), inventory, slow_classes)
        assert fast.allocation == slow.allocation
        assert fast.explanation.errors == slow.explanation.errors
        for f, s in zip(fast.explanation.requests, slow.explanation.requests, strict=True):
            assert [(c.source, c.message, c.device) for c in f.cel_errors] == [
                (c.source, c.message, c.device) for c in s.cel_errors]
            assert [x.kept for x in f.stages] == [x.kept for x in s.stages]
