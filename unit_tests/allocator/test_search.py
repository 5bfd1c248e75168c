"""The search (dra_driver.allocator.search): first fit, constraints, firstAvailable, All, taints, counters,
shared capacity, the claim limit and the errors that stop the whole scheduling attempt."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
from allocfix import CLASSES, NODE_A, NODE_B, D, claim, dev, mig_node, picked, request, slice_

from dra_driver.allocator.context import SCHEDULER_ABORTS
from dra_driver.allocator.inventory import AllocatedState, allocated_state, build_inventory
from dra_driver.allocator.resolve import resolve
from dra_driver.allocator.resolve import resolve as resolve_
from dra_driver.allocator.rules import SchedulerRules


def test_cel_runtime_error_aborts_not_false() -> None:
    # gpu-1 has no "mig" attribute: the scheduler reports a runtime error, not "no match".
    inv = build_inventory([slice_("node-a", [dev("gpu-0", attributes={"mig": {"bool": False}}), dev("gpu-1")])])
    res = resolve(claim(request(selectors=(f'device.attributes["{D}"].mig',))), inv, CLASSES)
    assert res.allocation is None
    info = res.explanation.requests[0]
    assert info.cel_errors and info.cel_errors[0].device == f"{D}/node-a/gpu-1"
    assert "CEL runtime error" in res.explanation.summary


def test_combinatorial_search_bounded() -> None:
    # 64 devices, constraint only satisfiable by none: the search must stop quickly.
    devices = [dev(f"gpu-{i}", numa=i) for i in range(64)]
    inv = build_inventory([slice_("node-a", devices)])
    c = claim(request(count=8), constraints=[{"matchAttribute": f"{D}/numa"}])
    res = resolve(c, inv, CLASSES)
    assert res.allocation is None


def test_numa_match_attribute() -> None:
    c = claim(request(count=2, selectors=(f'device.attributes["{D}"].model == "H100"',)),
              constraints=[{"matchAttribute": f"{D}/numa"}])  # fmt: skip
    # node-a H100s: gpu-0 (numa 0), gpu-2 and gpu-3 (numa 1): backtracking skips gpu-0.
    assert picked(resolve(c, build_inventory([NODE_A]), CLASSES)) == ["node-a/gpu-2", "node-a/gpu-3"]
    res = resolve(c, build_inventory([NODE_B]), CLASSES)
    assert res.allocation is None
    assert any("matchAttribute" in x for x in res.explanation.constraints)


def test_constraint_scoped_to_requests() -> None:
    c = claim(request("a", count=1), request("b", count=1), request("c", count=1),
              constraints=[{"matchAttribute": f"{D}/numa", "requests": ["a", "c"]}])  # fmt: skip
    res = resolve(c, build_inventory([NODE_A]), CLASSES)
    got = picked(res)
    by_name = {r["request"]: r["device"] for r in res.allocation["devices"]["results"]}  # type: ignore[index]
    assert len(set(got)) == 3
    numa = {"gpu-0": 0, "gpu-1": 0, "gpu-2": 1, "gpu-3": 1}
    assert numa[by_name["a"]] == numa[by_name["c"]]


def test_distinct_attribute() -> None:
    c = claim(request(count=2), constraints=[{"distinctAttribute": f"{D}/numa"}])
    assert picked(resolve(c, build_inventory([NODE_A]), CLASSES)) == ["node-a/gpu-0", "node-a/gpu-2"]


def test_first_available_fallback_order() -> None:
    req = {"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu", "count": 4},
        {"name": "h100", "deviceClassName": "gpu", "count": 2,
         "selectors": [{"cel": {"expression": f'device.attributes["{D}"].model == "H100"'}}]},
        {"name": "one", "deviceClassName": "gpu", "count": 1}]}  # fmt: skip
    res = resolve(claim(req), build_inventory([NODE_B]), CLASSES)
    assert res.allocation is not None
    assert {r["request"] for r in res.allocation["devices"]["results"]} == {"gpu/h100"}
    res = resolve(claim(req), build_inventory([NODE_A]), CLASSES)
    assert res.allocation is not None
    assert {r["request"] for r in res.allocation["devices"]["results"]} == {"gpu/big"}


def test_first_available_backtracks_across_requests() -> None:
    req = {"name": "x", "firstAvailable": [{"name": "two", "deviceClassName": "gpu", "count": 2},
                                           {"name": "one", "deviceClassName": "gpu", "count": 1}]}  # fmt: skip
    res = resolve(claim(req, request("y", count=1)), build_inventory([NODE_B]), CLASSES)
    assert [r["request"] for r in res.allocation["devices"]["results"]] == ["x/one", "y"]  # type: ignore[index]


def test_all_mode() -> None:
    res = resolve(claim(request(count=None, allocationMode="All")), build_inventory([NODE_A]), CLASSES)
    assert len(picked(res)) == 4
    allocated = AllocatedState(devices={(D, "node-a", "gpu-1")})
    res = resolve(claim(request(count=None, allocationMode="All")), build_inventory([NODE_A]), CLASSES, allocated)
    assert res.allocation is None  # All needs every matching device, one is taken


def test_all_mode_with_incomplete_pool_is_error() -> None:
    incomplete = slice_("node-a", [dev("gpu-0")], count=2)
    res = resolve(claim(request(count=None, allocationMode="All")), build_inventory([incomplete]), CLASSES)
    assert res.allocation is None
    assert "incomplete" in res.explanation.summary


def test_admin_access_ignores_allocations() -> None:
    state = AllocatedState(devices={(D, "node-b", "gpu-0"), (D, "node-b", "gpu-1")})
    res = resolve(claim(request(count=2, adminAccess=True)), build_inventory([NODE_B]), CLASSES, state)
    assert res.allocation is not None
    assert all(r["adminAccess"] is True for r in res.allocation["devices"]["results"])


def test_taints() -> None:
    taints = [{"key": "gpu.dra-driver.io/unhealthy", "value": "xid", "effect": "NoSchedule"}]
    info = [{"key": "note", "value": "x", "effect": "None"}]
    inv = build_inventory([slice_("node-a", [dev("gpu-0", taints=taints), dev("gpu-1", taints=info)])])
    assert picked(resolve(claim(request()), inv, CLASSES)) == ["node-a/gpu-1"]  # None is informational
    res = resolve(claim(request(count=2)), inv, CLASSES)
    assert res.allocation is None
    assert any("not tolerated" in c.failed for c in res.explanation.requests[0].closest)
    tol = [{"key": "gpu.dra-driver.io/unhealthy", "operator": "Exists"}]
    res = resolve(claim(request(count=2, tolerations=tol)), inv, CLASSES)
    assert res.allocation is not None and res.allocation["devices"]["results"][0]["tolerations"] == tol
    wrong = [{"key": "gpu.dra-driver.io/unhealthy", "operator": "Equal", "value": "other"}]
    assert resolve(claim(request(count=2, tolerations=wrong)), inv, CLASSES).allocation is None
    exec_only = [{"operator": "Exists", "effect": "NoExecute"}]
    assert resolve(claim(request(count=2, tolerations=exec_only)), inv, CLASSES).allocation is None


def partitioned(consumed: str = "48Gi") -> list[dict[str, Any]]:
    counters = slice_("node-a", [], pool="node-a", count=2, name="counters",
                      sharedCounters=[{"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}])  # fmt: skip
    del counters["spec"]["devices"]
    parts = [dev(f"part-{i}", consumesCounters=[{"counterSet": "gpu-0", "counters": {"memory": {"value": consumed}}}])
             for i in range(3)]  # fmt: skip
    return [counters, slice_("node-a", parts, pool="node-a", count=2, name="parts")]


def test_counters_exhausted() -> None:
    inv = build_inventory(partitioned("48Gi"))
    assert picked(resolve(claim(request()), inv, CLASSES)) == ["node-a/part-0"]
    assert resolve(claim(request(count=2)), inv, CLASSES).allocation is None
    inv = build_inventory(partitioned("40Gi"))
    assert len(picked(resolve(claim(request(count=2)), inv, CLASSES))) == 2
    state = allocated_state([{"status": {"allocation": {"devices": {"results": [
        {"request": "x", "driver": D, "pool": "node-a", "device": "part-0"}]}}}}])  # fmt: skip
    res = resolve(claim(request(count=2)), inv, CLASSES, state)
    assert res.allocation is None  # each remaining part fits alone (40Gi left), two do not
    stages = {s.stage: s.kept for s in res.explanation.requests[0].stages}
    assert stages["shared counters available"] == 2
    res = resolve(claim(request()), build_inventory(partitioned("48Gi")), CLASSES, state)
    assert res.allocation is None
    stages = {s.stage: s.kept for s in res.explanation.requests[0].stages}
    assert stages["not allocated to other claims"] == 2 and stages["shared counters available"] == 0
    assert any("exhausted" in c.failed for c in res.explanation.requests[0].closest)


def test_capacity_sharing() -> None:
    shared = dev("gpu-0", allowMultipleAllocations=True)
    shared["capacity"] = {"memory": {"value": "80Gi", "requestPolicy": {
        "default": "10Gi", "validRange": {"min": "10Gi", "step": "10Gi"}}}}  # fmt: skip
    inv = build_inventory([slice_("node-a", [shared])])
    req = request(count=1, capacity={"requests": {"memory": "25Gi"}})
    res = resolve(claim(req), inv, CLASSES)
    assert res.allocation is not None
    result = res.allocation["devices"]["results"][0]
    assert result["consumedCapacity"] == {"memory": "30Gi"}  # 25Gi rounded up, written in canonical form
    assert len(result["shareID"]) == 36
    # The same device twice in one claim, then the third request does not fit.
    res = resolve(claim(req, request("b", capacity={"requests": {"memory": "50Gi"}})), inv, CLASSES)
    assert [r["device"] for r in res.allocation["devices"]["results"]] == ["gpu-0", "gpu-0"]  # type: ignore[index]
    state = allocated_state([{"status": {"allocation": {"devices": {"results": [
        {"request": "x", "driver": D, "pool": "node-a", "device": "gpu-0", "shareID": "a",
         "consumedCapacity": {"memory": "60Gi"}}]}}}}])  # fmt: skip
    assert resolve(claim(req), inv, CLASSES, state).allocation is None
    assert resolve(claim(request(capacity={"requests": {"memory": "10Gi"}})), inv, CLASSES, state).allocation


def test_capacity_request_on_exclusive_device() -> None:
    inv = build_inventory([NODE_B])
    assert resolve(claim(request(capacity={"requests": {"memory": "100Gi"}})), inv, CLASSES).allocation is None
    res = resolve(claim(request(capacity={"requests": {"memory": "10Gi"}})), inv, CLASSES)
    assert res.allocation is not None and "consumedCapacity" not in res.allocation["devices"]["results"][0]


def shareable(name: str, capacity: dict[str, Any]) -> dict[str, Any]:
    return dev(name, allowMultipleAllocations=True, capacity=capacity)


def test_capacity_names_are_looked_up_exactly_as_written_up_to_137() -> None:
    # Like the 1.37 scheduler (requestsContainNonExistCapacity): no driver domain is added to either
    # side, so "<driver>/memory" does not name a device's "memory"; the device is skipped.
    # (1.38: test_rules_138.py.)
    resolve = partial(resolve_, rules=SchedulerRules(37))
    plain = shareable("gpu-0", {"memory": {"value": "80Gi"}})
    qualified = shareable("gpu-1", {f"{D}/memory": {"value": "80Gi"}})
    inv = build_inventory([slice_("node-a", [plain])])
    res = resolve(claim(request(capacity={"requests": {f"{D}/memory": "10Gi"}})), inv, CLASSES)
    assert res.allocation is None
    [note] = res.explanation.requests[0].closest
    assert note.failed == f"capacity `{D}/memory` is not published by this device; it publishes `memory`"
    assert resolve(claim(request(capacity={"requests": {"memory": "10Gi"}})), inv, CLASSES).allocation is not None
    # The other way round: an unqualified request does not name a qualified capacity.
    inv = build_inventory([slice_("node-a", [plain, qualified])])
    res = resolve(claim(request(capacity={"requests": {f"{D}/memory": "10Gi"}})), inv, CLASSES)
    assert picked(res) == ["node-a/gpu-1"]
    assert res.allocation is not None
    assert res.allocation["devices"]["results"][0]["consumedCapacity"] == {f"{D}/memory": "10Gi"}
    # firstAvailable: the first subrequest's name is not published, so the second one is chosen.
    inv = build_inventory([slice_("node-a", [plain])])
    fa = {"name": "gpu", "firstAvailable": [
        {"name": "qualified", "deviceClassName": "gpu", "capacity": {"requests": {f"{D}/memory": "10Gi"}}},
        {"name": "plain", "deviceClassName": "gpu", "capacity": {"requests": {"memory": "10Gi"}}}]}  # fmt: skip
    res = resolve(claim(fa), inv, CLASSES)
    assert res.allocation is not None and res.allocation["devices"]["results"][0]["request"] == "gpu/plain"


def test_all_request_checks_constraints_before_capacity() -> None:
    # Differential seed 281: r0 takes a share of gpu-0, then the All request r1 must take gpu-0 as
    # well (sized alone, its full 80Gi fit).  The scheduler's allocateDevice checks the claim's
    # constraints before capacity, so the repeated numa is an error, not a quiet misfit.
    inv = build_inventory([slice_("node-a", [shareable("gpu-0", {"memory": {"value": "80Gi"}})])])
    c = claim(request("r0", capacity={"requests": {"memory": "1Gi"}}), request("r1", count=None, allocationMode="All"),
              constraints=[{"distinctAttribute": f"{D}/numa"}])  # fmt: skip
    res = resolve(c, inv, CLASSES)
    assert res.allocation is None
    assert any(SCHEDULER_ABORTS in e and "constraint" in e for e in res.explanation.errors), res.explanation.errors
    # Without the constraint, the capacity check alone rejects gpu-0 for r1: unschedulable, no error.
    res = resolve(claim(*c["spec"]["devices"]["requests"]), inv, CLASSES)
    assert res.allocation is None and not any(SCHEDULER_ABORTS in e for e in res.explanation.errors)


def test_capacity_spelled_both_ways_is_two_capacities_up_to_137() -> None:
    resolve = partial(resolve_, rules=SchedulerRules(37))
    both = shareable("gpu-0", {"memory": {"value": "80Gi"}, f"{D}/memory": {"value": "40Gi"}})
    inv = build_inventory([slice_("node-a", [both])])
    res = resolve(claim(request(capacity={"requests": {"memory": "50Gi", f"{D}/memory": "30Gi"}})), inv, CLASSES)
    assert res.allocation is not None
    assert res.allocation["devices"]["results"][0]["consumedCapacity"] == {"memory": "50Gi", f"{D}/memory": "30Gi"}
    state = allocated_state([{"status": {"allocation": {"devices": {"results": [
        {"request": "x", "driver": D, "pool": "node-a", "device": "gpu-0", "shareID": "a",
         "consumedCapacity": {f"{D}/memory": "20Gi"}}]}}}}])  # fmt: skip
    # Only the qualified capacity is used by the other claim: 20Gi of it are left, 80Gi of "memory".
    assert resolve(claim(request(capacity={"requests": {"memory": "70Gi", f"{D}/memory": "20Gi"}})), inv, CLASSES,
                   state).allocation is not None  # fmt: skip
    assert resolve(claim(request(capacity={"requests": {"memory": "1Gi", f"{D}/memory": "21Gi"}})), inv, CLASSES,
                   state).allocation is None  # fmt: skip


def test_unrequested_capacity_must_satisfy_the_request_policy() -> None:
    # Unrequested capacity is consumed at the policy's default, else in full, and the scheduler
    # checks that amount against the policy like a requested one (violatesPolicy).
    no_default = shareable("gpu-0", {"memory": {"value": "80Gi", "requestPolicy": {"validRange": {"min": "1Gi", "max": "40Gi"}}}})
    with_default = shareable("gpu-1", {"memory": {"value": "80Gi", "requestPolicy": {
        "default": "8Gi", "validRange": {"min": "1Gi", "max": "40Gi"}}}})  # fmt: skip
    inv = build_inventory([slice_("node-a", [no_default, with_default])])
    res = resolve(claim(request()), inv, CLASSES)
    assert picked(res) == ["node-a/gpu-1"]
    assert res.allocation is not None and res.allocation["devices"]["results"][0]["consumedCapacity"] == {"memory": "8Gi"}


# --- regressions found by the differential corpus (e2e/suites/test_differential.py) against kube-scheduler 1.36


def test_must_constraint_error_on_one_node_fails_the_claim() -> None:
    # Differential seed 8: an All request whose matchAttribute cannot hold on node-a is an error
    # in the scheduler's allocator, and an error ends the whole scheduling attempt even though
    # node-b could serve the claim; the pod stays pending with reason SchedulerError.
    a = slice_("node-a", [dev("gpu-0", numa=0), dev("gpu-2", numa=1)])
    b = slice_("node-b", [dev("gpu-0", numa=0), dev("gpu-1", numa=0)])
    c = claim(request(count=None, allocationMode="All"), constraints=[{"matchAttribute": f"{D}/numa"}])
    res = resolve(c, build_inventory([a, b]), CLASSES, nodes=["node-a", "node-b"])
    assert res.allocation is None
    assert "constraint would not be satisfied" in res.explanation.summary
    assert "stops the whole scheduling attempt" in res.explanation.summary
    # Listing node-b first changes nothing: the scheduler filters every node.
    res = resolve(c, build_inventory([a, b]), CLASSES, nodes=["node-b", "node-a"])
    assert res.allocation is None
    # Without the bad node the claim fits.
    assert picked(resolve(c, build_inventory([b]), CLASSES)) == ["node-b/gpu-0", "node-b/gpu-1"]


def test_cel_runtime_error_on_a_later_node_fails_the_claim() -> None:
    good = slice_("node-b", [dev("gpu-0", attributes={"mig": {"bool": True}})])
    bad = slice_("node-a", [dev("gpu-0")])  # no "mig" attribute: runtime error
    c = claim(request(selectors=(f'device.attributes["{D}"].mig',)))
    res = resolve(c, build_inventory([good, bad]), CLASSES, nodes=["node-b", "node-a"])
    assert res.allocation is None
    assert "CEL runtime error" in res.explanation.summary and "node-a" in res.explanation.summary


def test_all_request_is_sized_before_the_search() -> None:
    # On node-a the first request already fails, but the scheduler sizes the All request of the
    # second one before searching and hits the CEL error there.
    a = slice_("node-a", [dev("gpu-0")])  # H100 without "mig"
    b = slice_("node-b", [dev("gpu-0", "A100", attributes={"model": {"string": "A100"}, "mig": {"bool": False}}),
                          dev("gpu-1", attributes={"mig": {"bool": True}})])  # fmt: skip
    c = claim(request("first", count=1, selectors=(f'device.attributes["{D}"].model == "A100"',)),
              request("rest", count=None, allocationMode="All", selectors=(f'device.attributes["{D}"].mig',)))  # fmt: skip
    assert picked(resolve(c, build_inventory([b]), CLASSES)) == ["node-b/gpu-0", "node-b/gpu-1"]
    res = resolve(c, build_inventory([a, b]), CLASSES, nodes=["node-a", "node-b"])
    assert res.allocation is None and "CEL runtime error" in res.explanation.summary


def test_search_budget_is_not_fatal() -> None:
    # Running out of steps is the scheduler's per-node timeout: other nodes are still tried.
    from dra_driver.allocator import search

    big = slice_("node-a", [dev(f"gpu-{i}", numa=i % 2) for i in range(16)])
    small = slice_("node-b", [dev("gpu-0"), dev("gpu-1")])
    c = claim(request(count=2), constraints=[{"matchAttribute": f"{D}/numa"}])
    old = search.MAX_SEARCH_STEPS
    search.MAX_SEARCH_STEPS = 1
    try:
        res = resolve(c, build_inventory([big, small]), CLASSES, nodes=["node-a", "node-b"])
    finally:
        search.MAX_SEARCH_STEPS = old
    assert res.allocation is None and not res.explanation.errors
    assert any("too complex" in r for r in res.explanation.nodes["reasons"])


@pytest.mark.parametrize(("version", "message"), [
    ("v1.36.3", "number of requested devices 33 exceeds the claim limit of 32"),
    ("v1.37.2", "request b: adding 29 devices exceeds the claim limit of 32, with 4 already accounted for"),
])  # fmt: skip
def test_claim_limit_counts_all_requests_at_their_size_and_is_an_error(version: str, message: str) -> None:
    # The scheduler sizes "All" requests per node and checks the claim limit (1.36: after validating
    # every request; 1.37: request by request, naming the one that crosses it); exceeding it is an
    # error (SchedulerError), never a plain "unschedulable".
    devices = [dev(f"gpu-{i}") for i in range(4)]
    rules = SchedulerRules.for_version(version)
    c = claim(request("all", count=None, allocationMode="All"), request("b", count=29))
    res = resolve(c, build_inventory([slice_("node-a", devices)]), CLASSES, rules=rules)
    assert message in res.explanation.summary
    assert SCHEDULER_ABORTS in res.explanation.summary
    assert res.explanation.failure == ({"request": "b"} if version.startswith("v1.37") else {})
    c = claim(request("all", count=None, allocationMode="All"), request("b", count=28))
    res = resolve(c, build_inventory([slice_("node-a", devices)]), CLASSES, rules=rules)
    assert res.allocation is None and SCHEDULER_ABORTS not in res.explanation.summary  # 32: within the limit


def test_all_request_sizing_by_version() -> None:
    # A device that other claims' shares have filled: 1.36 leaves it out of "All" (the rest is
    # allocated), 1.37 sizes against the device's total, keeps it in and the request fails.
    def shareable(name: str) -> dict[str, Any]:
        return dev(name, allowMultipleAllocations=True)

    inv = build_inventory([slice_("node-a", [shareable("gpu-0"), shareable("gpu-1")])])
    other = {"metadata": {"uid": "o", "namespace": "ns", "name": "other"}, "status": {"allocation": {"devices": {"results": [
        {"request": "r", "driver": D, "pool": "node-a", "device": "gpu-0", "shareID": "s",
         "consumedCapacity": {"memory": "60Gi"}}]}}}}  # fmt: skip
    c = claim(request("all", count=None, allocationMode="All", capacity={"requests": {"memory": "30Gi"}}))
    used = allocated_state([other])
    old = resolve(c, inv, CLASSES, used, rules=SchedulerRules.for_version("v1.36.3"))
    assert picked(old) == ["node-a/gpu-1"]
    new = resolve(c, inv, CLASSES, used, rules=SchedulerRules.for_version("v1.37.2"))
    assert new.allocation is None


def test_first_available_evaluates_a_subrequest_that_cannot_fit() -> None:
    # Issue 20: "big" wants 3 devices of 2.  The scheduler still tries them in order, evaluates
    # the selector on mig-1 (no such key) and stops with an error instead of moving on to "one".
    fa = {"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu", "count": 3,
         "selectors": [{"cel": {"expression": f'device.attributes["{D}"].profile == "full"'}}]},
        {"name": "one", "deviceClassName": "gpu", "count": 1}]}  # fmt: skip
    res = resolve(claim(fa), build_inventory([mig_node()]), CLASSES)
    assert res.allocation is None
    assert "request gpu/big selector #0 on device" in res.explanation.summary
    assert SCHEDULER_ABORTS in res.explanation.summary
    # Where no remaining device errors, giving up early is still exact: "one" is chosen.
    fa["firstAvailable"][0]["selectors"] = [{"cel": {"expression": f'device.attributes["{D}"].index >= 0'}}]
    res = resolve(claim(fa), build_inventory([mig_node()]), CLASSES)
    assert res.allocation is not None and res.allocation["devices"]["results"][0]["request"] == "gpu/one"
