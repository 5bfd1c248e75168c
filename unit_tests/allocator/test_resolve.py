"""Claim resolution with kube-scheduler semantics (dra_driver.allocation)."""

import json
from functools import partial
from typing import Any

import pytest

from dra_driver.allocator.inventory import AllocatedState, allocated_state, build_inventory
from dra_driver.allocator.resolve import resolve
from dra_driver.allocator.resolve import resolve as resolve_
from dra_driver.allocator.rules import SchedulerRules
from dra_driver.allocator.search import SCHEDULER_ABORTS
from e2e.bench.synthetic import benchmark_resolve
from e2e.suites.scenarios import generate, generate_many, validate_scenario

D = "gpu.dra-driver.io"
CLASSES = [
    {"metadata": {"name": "gpu"}, "spec": {
        "selectors": [{"cel": {"expression": f'device.driver == "{D}"'}}],
        "config": [{"opaque": {"driver": D, "parameters": {"sharing": "none"}}}]}},
    {"metadata": {"name": "broken"}, "spec": {"selectors": [{"cel": {"expression": "device.driver =="}}]}},
]  # fmt: skip


def dev(name: str, model: str = "H100", numa: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {"model": {"string": model}, "numa": {"int": numa}, "index": {"int": int(name.split("-")[-1])}},
        "capacity": {"memory": {"value": "80Gi"}},
        **extra,
    }


def slice_(node: str | None, devices: list[dict[str, Any]], pool: str | None = None, gen: int = 1,
           count: int = 1, name: str | None = None, **spec: Any) -> dict[str, Any]:  # fmt: skip
    body: dict[str, Any] = {"driver": D, "pool": {"name": pool or node or "shared", "generation": gen,
                                                  "resourceSliceCount": count}, "devices": devices, **spec}  # fmt: skip
    if node:
        body["nodeName"] = node
    elif not any(k in spec for k in ("allNodes", "nodeSelector", "perDeviceNodeSelection")):
        body["allNodes"] = True
    return {"metadata": {"name": name or f"{pool or node or 'shared'}-{gen}"}, "spec": body}


def request(name: str = "gpu", count: int | None = 1, selectors: tuple[str, ...] = (), cls: str = "gpu",
            **extra: Any) -> dict[str, Any]:  # fmt: skip
    body: dict[str, Any] = {"deviceClassName": cls, **extra}
    if count is not None:
        body["count"] = count
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": body}


def claim(*requests: dict[str, Any], constraints: list[Any] | None = None, config: list[Any] | None = None,
          uid: str = "uid-1") -> dict[str, Any]:  # fmt: skip
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return {"metadata": {"name": "c", "namespace": "ns", "uid": uid}, "spec": {"devices": devices}}


def picked(res: Any) -> list[str]:
    assert res.allocation is not None, res.explanation.render()
    return [f"{r['pool']}/{r['device']}" for r in res.allocation["devices"]["results"]]


NODE_A = slice_("node-a", [dev("gpu-0", numa=0), dev("gpu-1", "A100", numa=0), dev("gpu-2", numa=1), dev("gpu-3", numa=1)])
NODE_B = slice_("node-b", [dev("gpu-0", numa=0), dev("gpu-1", numa=1)])


def test_basic_first_fit_and_node_selector() -> None:
    res = resolve(claim(request(count=2)), build_inventory([NODE_A, NODE_B]), CLASSES)
    assert picked(res) == ["node-a/gpu-0", "node-a/gpu-1"]
    assert res.allocation is not None
    assert res.allocation["nodeSelector"] == {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}  # fmt: skip
    assert res.allocation["devices"]["config"] == [
        {"source": "FromClass", "opaque": {"driver": D, "parameters": {"sharing": "none"}}}]  # fmt: skip
    assert "allocated 2 device(s) on node node-a" in res.explanation.summary


def test_request_selectors_and_funnel() -> None:
    sel = f'device.attributes["{D}"].model == "A100"'
    res = resolve(claim(request(count=2, selectors=(sel,))), build_inventory([NODE_A, NODE_B]), CLASSES)
    assert res.allocation is None
    info = res.explanation.requests[0]
    assert [(s.stage, s.kept) for s in info.stages][:4] == [
        ("devices published", 6), ("in complete, valid pools", 6),
        ("class gpu selector #0", 6), ("request gpu selector #0", 1)]  # fmt: skip
    assert info.closest and "is false" in info.closest[0].failed
    assert "not enough devices" in res.explanation.summary


def test_all_nodes_tried_and_explained() -> None:
    res = resolve(claim(request(count=3)), build_inventory([NODE_B, NODE_A]), CLASSES, nodes=["node-b", "node-a"])
    assert picked(res)[0].startswith("node-a/")
    res = resolve(claim(request(count=3)), build_inventory([NODE_B]), CLASSES)
    assert res.allocation is None
    assert "not enough" in res.explanation.summary


def test_missing_class_is_clear_error() -> None:
    res = resolve(claim(request(cls="nope")), build_inventory([NODE_A]), CLASSES)
    assert res.allocation is None
    assert "device class nope not found" in res.explanation.summary


def test_malformed_cel_is_error_not_crash() -> None:
    res = resolve(claim(request(selectors=("device.attributes[",))), build_inventory([NODE_A]), CLASSES)
    assert res.allocation is None
    assert "CEL compile error" in res.explanation.summary
    res = resolve(claim(request(cls="broken")), build_inventory([NODE_A]), CLASSES)
    assert res.allocation is None and "compile" in res.explanation.summary


def test_cel_runtime_error_aborts_not_false() -> None:
    # gpu-1 has no "mig" attribute: the scheduler reports a runtime error, not "no match".
    inv = build_inventory([slice_("node-a", [dev("gpu-0", attributes={"mig": {"bool": False}}), dev("gpu-1")])])
    res = resolve(claim(request(selectors=(f'device.attributes["{D}"].mig',))), inv, CLASSES)
    assert res.allocation is None
    info = res.explanation.requests[0]
    assert info.cel_errors and info.cel_errors[0].device == f"{D}/node-a/gpu-1"
    assert "CEL runtime error" in res.explanation.summary


@pytest.mark.parametrize("count", [0, -1, 10**12, True])
def test_bad_counts(count: Any) -> None:
    res = resolve(claim(request(count=count)), build_inventory([NODE_A]), CLASSES)
    assert res.allocation is None
    assert res.explanation.summary.startswith("cannot allocate")


def test_huge_count_precheck_is_fast() -> None:
    import time

    start = time.perf_counter()
    res = resolve(claim(request(count=32), request("b", count=32)), build_inventory([NODE_A]), CLASSES)
    assert res.allocation is None and "exceeds the claim limit" in res.explanation.summary
    assert time.perf_counter() - start < 0.5


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


def test_incomplete_pool_not_used_and_generations() -> None:
    old = slice_("node-a", [dev("gpu-0")], gen=1, name="old")
    new_part = slice_("node-a", [dev("gpu-5")], gen=2, count=2, name="new")
    inv = build_inventory([old, new_part])
    assert inv.pools[0].generation == 2 and not inv.pools[0].complete
    res = resolve(claim(request()), inv, CLASSES)
    assert res.allocation is None
    assert any("incomplete" in p for p in res.explanation.pools)
    inv = build_inventory([old, new_part, slice_("node-a", [dev("gpu-6")], gen=2, count=2, name="new2")])
    assert picked(resolve(claim(request()), inv, CLASSES)) == ["node-a/gpu-5"]


def test_duplicate_device_names_invalidate_pool() -> None:
    bad = slice_("node-a", [dev("gpu-0"), dev("gpu-0")])
    res = resolve(claim(request()), build_inventory([bad]), CLASSES)
    assert res.allocation is None
    assert any("duplicate device name" in p for p in res.explanation.pools)


def test_garbage_slices_do_not_raise() -> None:
    garbage: list[Any] = [
        {}, {"spec": None}, {"spec": {"driver": D}}, "nonsense",
        {"spec": {"driver": D, "pool": {"name": "p", "generation": "x", "resourceSliceCount": None},
                  "nodeName": "n", "devices": [{"name": 5}, {"name": "ok", "attributes": {"a": {"int": 1, "string": "x"}},
                                                             "capacity": {"m": {"value": "huge"}}}, None]}},
    ]  # fmt: skip
    inv = build_inventory(garbage)
    res = resolve(claim(request()), inv, CLASSES)
    assert res.allocation is None
    res = resolve({"spec": "garbage"}, inv, CLASSES)  # type: ignore[arg-type]
    assert res.allocation is None and res.explanation.summary


def test_already_allocated_and_exclude_uid() -> None:
    other = {"metadata": {"uid": "other"}, "status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": D, "pool": "node-b", "device": "gpu-0"},
        {"request": "gpu", "driver": D, "pool": "node-b", "device": "gpu-1", "adminAccess": True}]}}}}  # fmt: skip
    state = allocated_state([other])
    assert state.devices == {(D, "node-b", "gpu-0")}
    assert allocated_state([other], exclude_uid="other").devices == set()
    res = resolve(claim(request(count=2)), build_inventory([NODE_B]), CLASSES, state)
    assert res.allocation is None
    stages = {s.stage: s.kept for s in res.explanation.requests[0].stages}
    assert stages["not allocated to other claims"] == 1


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


def test_network_attached_and_node_selector_slices() -> None:
    shared = slice_(None, [dev("gpu-0")], pool="fabric")
    res = resolve(claim(request()), build_inventory([shared]), CLASSES)
    assert res.allocation is not None and "nodeSelector" not in res.allocation
    sel = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}
    rack = slice_(None, [dev("gpu-0")], pool="rack", nodeSelector=sel)
    nodes = [{"metadata": {"name": "n1", "labels": {"zone": "b"}}}, {"metadata": {"name": "n2", "labels": {"zone": "a"}}}]
    res = resolve(claim(request()), build_inventory([rack]), CLASSES, nodes=nodes)
    assert res.allocation is not None and res.allocation["nodeSelector"] == sel
    assert res.node == "n2"


def test_per_device_node_selection() -> None:
    devices = [dev("gpu-0", nodeName="n1"), dev("gpu-1", nodeName="n2")]
    inv = build_inventory([slice_(None, devices, pool="p", perDeviceNodeSelection=True)])
    res = resolve(claim(request()), inv, CLASSES, nodes=["n2"])
    assert picked(res) == ["p/gpu-1"]
    assert res.allocation is not None
    assert res.allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["n2"]


def test_claim_config_order() -> None:
    cfg = [{"requests": ["a"], "opaque": {"driver": D, "parameters": {"x": 1}}},
           {"opaque": {"driver": D, "parameters": {"y": 2}}}]  # fmt: skip
    res = resolve(claim(request("a"), request("b"), config=cfg), build_inventory([NODE_A]), CLASSES)
    assert res.allocation is not None
    configs = res.allocation["devices"]["config"]
    assert [c["source"] for c in configs] == ["FromClass", "FromClaim", "FromClaim"]
    assert "requests" not in configs[0]  # class config applies to both requests
    assert configs[1]["requests"] == ["a"]


def test_explanation_outputs() -> None:
    sel = tuple(f'device.attributes["{D}"].model == "{"X" * 300}{i}"' for i in range(5))
    res = resolve(claim(request(count=2, selectors=sel)), build_inventory([NODE_A, NODE_B]), CLASSES)
    assert len(res.explanation.summary.encode()) <= 1024
    assert "request gpu" in res.explanation.render()
    json.dumps(res.explanation.to_dict())


def test_scenarios_are_deterministic_valid_and_resolvable() -> None:
    assert generate(7).claim == generate(7).claim and generate(7).slices == generate(7).slices
    seen: set[str] = set()
    for sc in generate_many(0, 150):
        assert validate_scenario(sc) == [], sc.describe()
        seen.update(sc.features)
        res = resolve(sc.claim, build_inventory(sc.slices), sc.classes)
        assert res.explanation.summary
        assert not any(e.startswith("internal error") for e in res.explanation.errors), sc.describe()
    assert {"selectors", "all", "constraints", "firstAvailable", "counters", "taints"} <= seen


def test_benchmark_800_devices_fast() -> None:
    stats = benchmark_resolve(claims=10)
    assert stats["median_ms"] < 50


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


# ============================================================================ inventory reuse


MODEL_B = f'device.attributes["{D}"].model == "B"'


def models(*names: str, node: str = "node-a") -> dict[str, Any]:
    return slice_(node, [dev(f"gpu-{i}", m) for i, m in enumerate(names)])


def test_previous_inventory_lends_unchanged_pools() -> None:
    a, b = models("A", "A"), models("A", node="node-b")
    first = build_inventory([a, b])
    again = build_inventory([a, json.loads(json.dumps(b))], previous=first)  # the same object, and an equal one
    assert all(d is first.by_key[d.key] for d in again.devices)
    assert again.pools[0] is first.pools[0] and again.pools[1] is first.pools[1]


def test_a_changed_slice_rebuilds_its_pool_only() -> None:
    first = build_inventory([models("A", "A"), models("A", node="node-b")])
    assert not resolve(claim(request(selectors=(MODEL_B,))), first, CLASSES).allocated
    # node-a's gpu-1 now publishes model B: node-a is digested again, node-b is taken over.
    second = build_inventory([models("A", "B"), models("A", node="node-b")], previous=first)
    assert all(d is not first.by_key[d.key] for d in second.pool_map[(D, "node-a")].devices)
    assert second.by_key[(D, "node-b", "gpu-0")] is first.by_key[(D, "node-b", "gpu-0")]
    assert picked(resolve(claim(request(selectors=(MODEL_B,))), second, CLASSES)) == ["node-a/gpu-1"]
    # And back: what the previous inventory knew about gpu-1 is not reused either.
    third = build_inventory([models("A", "A"), models("A", node="node-b")], previous=second)
    assert not resolve(claim(request(selectors=(MODEL_B,))), third, CLASSES).allocated


def test_pools_taken_over_are_renumbered_when_an_earlier_pool_changes_size() -> None:
    first = build_inventory([models("A"), models("A", "B", node="node-b")])
    second = build_inventory([models("A", "A"), models("A", "B", node="node-b")], previous=first)
    assert [d.index for d in second.devices] == list(range(4))
    moved = second.by_key[(D, "node-b", "gpu-1")]
    assert moved is not first.by_key[moved.key] and moved.index == 3 and first.by_key[moved.key].index == 2
    assert picked(resolve(claim(request(selectors=(MODEL_B,))), second, CLASSES)) == ["node-b/gpu-1"]


def test_unnamed_slices_are_not_taken_over() -> None:
    unnamed = models("A")
    del unnamed["metadata"]
    first = build_inventory([unnamed])
    second = build_inventory([models("A", node="node-b"), unnamed], previous=first)
    assert second.by_key[(D, "node-a", "gpu-0")] is not first.by_key[(D, "node-a", "gpu-0")]
    assert second.pool_map[(D, "node-a")].slices == ["slice-1"]  # named after its new position


def test_problems_of_pools_taken_over_are_kept() -> None:
    broken = slice_("node-a", [dev("gpu-0"), {"name": "gpu-1", "capacity": {"memory": {"value": "lots"}}}])
    first = build_inventory([broken, models("A", node="node-b")])
    second = build_inventory([broken, models("A", node="node-b")], previous=first)
    assert second.problems == first.problems and any("gpu-1: capacity memory" in p for p in second.problems)


def test_devices_sharing_a_broken_map_each_report_it() -> None:
    """Decoded slices share equal maps between devices; each device still names its own problems."""
    attributes = {"model": {"string": "A", "int": 1}, "ok": {"string": "x"}}
    capacity = {"memory": {"value": "lots"}}
    devices = [{"name": f"gpu-{i}", "attributes": attributes, "capacity": capacity} for i in range(2)]
    devices.append({"name": "gpu-2", "attributes": {"model": {"string": "A"}}, "capacity": {"memory": {"value": "8Gi"}}})
    inv = build_inventory([slice_("node-a", devices)])
    for name in ("gpu-0", "gpu-1"):
        d = inv.by_key[(D, "node-a", name)]
        assert not d.cel_clean
        assert d.problems == ("attribute model: exactly one value type must be set", "capacity memory: invalid quantity")
        assert sum(f"/{name}: " in p for p in inv.problems) == 2
    assert inv.by_key[(D, "node-a", "gpu-2")].cel_clean and not inv.by_key[(D, "node-a", "gpu-2")].problems


def test_allocated_state_over_many_claims() -> None:
    claims = [{"metadata": {"uid": f"u{i}"}, "status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": D, "pool": f"node-{i // 8}", "device": f"gpu-{i % 8}"}]}}}} for i in range(800)]
    claims.append({"metadata": {"uid": "shared"}, "status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": D, "pool": "node-0", "device": "gpu-0", "shareID": "s",
         "consumedCapacity": {"memory": "1Gi"}}]}}}})
    claims.append({"metadata": {"uid": "pending"}})
    state = allocated_state(claims, exclude_uid="u0")
    assert len(state.devices) == 799 and (D, "node-0", "gpu-0") not in state.devices
    assert state.shared == {(D, "node-0", "gpu-0"): {"memory": 2**30}}  # as written, like the device's name


def mig_node() -> dict[str, Any]:
    # gpu-1 is a MIG device without a "profile" attribute: selecting on it is a CEL runtime error.
    full = dev("gpu-0")
    full["attributes"]["profile"] = {"string": "full"}
    return slice_("node-a", [full, {"name": "mig-1", "attributes": {"index": {"int": 1}}}])


def test_earlier_cel_error_beats_a_later_unsatisfiable_request() -> None:
    # Issue 20: the scheduler searches requests in order and stops with an error on request "a"
    # (no such key on mig-1) before it finds "b" unsatisfiable; the precheck must not answer first.
    c = claim(request("a", selectors=(f'device.attributes["{D}"].profile == "1g"',)), request("b", count=10))
    res = resolve(c, build_inventory([mig_node()]), CLASSES)
    assert res.allocation is None
    assert "CEL runtime error" in res.explanation.summary and SCHEDULER_ABORTS in res.explanation.summary
    assert not any("not enough devices match" in e for e in res.explanation.errors)
    # Without the error the precheck still answers for the later request.
    c = claim(request("a", selectors=(f'device.attributes["{D}"].index == 0',)), request("b", count=10))
    res = resolve(c, build_inventory([mig_node()]), CLASSES)
    assert res.explanation.errors == ["request b: not enough devices match"]


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
