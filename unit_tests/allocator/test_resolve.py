"""Claim resolution with kube-scheduler semantics (dra_driver.allocator.resolve): the allocation it writes,
the precheck, generated scenarios and its speed."""

from __future__ import annotations

import time

from allocfix import CLASSES, NODE_A, NODE_B, D, claim, mig_node, picked, request

from dra_driver.allocator.context import SCHEDULER_ABORTS
from dra_driver.allocator.inventory import AllocatedState, build_inventory
from dra_driver.allocator.resolve import resolve
from e2e.generators import fleet
from e2e.generators.scenarios import generate, generate_many, validate_scenario


def test_basic_first_fit_and_node_selector() -> None:
    res = resolve(claim(request(count=2)), build_inventory([NODE_A, NODE_B]), CLASSES)
    assert picked(res) == ["node-a/gpu-0", "node-a/gpu-1"]
    assert res.allocation is not None
    assert res.allocation["nodeSelector"] == {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}  # fmt: skip
    assert res.allocation["devices"]["config"] == [
        {"source": "FromClass", "opaque": {"driver": D, "parameters": {"sharing": "none"}}}]  # fmt: skip
    assert "allocated 2 device(s) on node node-a" in res.explanation.summary


def test_huge_count_precheck_is_fast() -> None:
    start = time.perf_counter()
    res = resolve(claim(request(count=32), request("b", count=32)), build_inventory([NODE_A]), CLASSES)
    assert res.allocation is None and "exceeds the claim limit" in res.explanation.summary
    assert time.perf_counter() - start < 0.5


def test_claim_config_order() -> None:
    cfg = [{"requests": ["a"], "opaque": {"driver": D, "parameters": {"x": 1}}},
           {"opaque": {"driver": D, "parameters": {"y": 2}}}]  # fmt: skip
    res = resolve(claim(request("a"), request("b"), config=cfg), build_inventory([NODE_A]), CLASSES)
    assert res.allocation is not None
    configs = res.allocation["devices"]["config"]
    assert [c["source"] for c in configs] == ["FromClass", "FromClaim", "FromClaim"]
    assert "requests" not in configs[0]  # class config applies to both requests
    assert configs[1]["requests"] == ["a"]


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
    # The slices our plugin publishes for 100 simulated nodes (800 GPUs, H100, A100, L4 and T4 in
    # turn); each claim takes two H100s with 40Gi or more on one NUMA node, the last ones counting as used.
    inventory = build_inventory(fleet.plugin_slices(100, driver=D))
    bench = claim(request("gpus", count=2, selectors=(
        f'device.attributes["{D}"].productName == "NVIDIA H100 80GB HBM3" && '
        f'device.capacity["{D}"].memory.compareTo(quantity("40Gi")) >= 0',)),
        constraints=[{"matchAttribute": "resource.kubernetes.io/numaNode"}])
    allocated = AllocatedState()
    timings = []
    for _ in range(10):
        start = time.perf_counter()
        res = resolve(bench, inventory, CLASSES, allocated)
        timings.append(time.perf_counter() - start)
        assert res.allocation is not None, res.explanation.summary
        allocated.devices.update((r["driver"], r["pool"], r["device"]) for r in res.allocation["devices"]["results"])
    assert len(allocated.devices) == 20
    assert sorted(timings)[len(timings) // 2] * 1000 < 50


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
