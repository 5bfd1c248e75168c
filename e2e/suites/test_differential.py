"""Our allocator against the real kube-scheduler, scenario by scenario (issue 4).

A dedicated control plane (no kubelets, no plugins, no controller of ours) so the generated
slices meet nothing else; see ``e2e/suites/differential.py`` for how one scenario is staged and judged.

- default: a sample of ``DIFF_SCENARIOS`` (50) scenarios, 20 of them with shares;
- ``--long``: the full corpus of 600 (240 with shares), recorded in ``e2e/results/differential.json``.
``DIFF_SEED`` moves the first seed (the corpus is otherwise fixed, so failures reproduce).

Agreement is exact (``diff.judge``): verdict class, the first failure as far as the scheduler names
it, and, where both allocate, every result.  The engine decides with the rules of the server's
version (``SchedulerRules``); the scenarios use only what the bed's feature gates enable, and the
test fails at once if those gates select another allocator variant than the one the engine mirrors.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.allocator.rules import MIRRORED_VARIANT, SchedulerRules, parse_minor, scheduler_features, scheduler_variant
from e2e.suites import differential as diff
from e2e.suites import scenarios
from e2e.testbed import cluster as cluster_mod
from e2e.testbed.cluster import FEATURE_GATES, Cluster
from e2e.testbed.clusterview import REPO

BATCH = 25
FULL = 600
FULL_SHARES = 200
RESULTS = REPO / "e2e" / "results" / "differential.json"

pytestmark = pytest.mark.testbed_only


@pytest.fixture(scope="module")
def diff_bed() -> Iterator[Cluster]:
    with cluster_mod.running(nodes=()) as cluster:
        yield cluster


def _kubectl_cmd(cluster: Cluster) -> list[str]:
    return [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(cluster.kubeconfig)]


def run_corpus(cluster: Cluster, first_seed: int, count: int) -> dict[str, Any]:
    started = time.monotonic()
    version = _server_version(cluster)
    minor = parse_minor(version)
    assert minor is not None, f"cannot read the API server's version: {version!r}"
    enabled = scheduler_features(FEATURE_GATES, minor)
    variant = scheduler_variant(enabled)
    assert variant == MIRRORED_VARIANT, (
        f"the bed's gates {FEATURE_GATES} select the scheduler's {variant} allocator; the engine mirrors {MIRRORED_VARIANT}")
    features = diff.scenario_features(enabled)
    rules = SchedulerRules(minor)
    cases = [diff.make_case(seed, features, rules) for seed in range(first_seed, first_seed + count)]
    for case in cases:
        problems = scenarios.validate_scenario(case.scenario)
        assert not problems, f"seed {case.seed}: generator produced objects the API server would reject: {problems}"
        diff.run_engine(case)
    for start in range(0, len(cases), BATCH):
        batch = f"b{first_seed + start}"
        try:
            diff.run_batch(cluster.kubectl, _kubectl_cmd(cluster), cases[start:start + BATCH], batch)
        finally:
            diff.cleanup_batch(cluster.kubectl, batch)
    for case in cases:
        diff.judge(case)
    agreements = [c for c in cases if c.agrees]
    features: Counter[str] = Counter(f for c in cases for f in c.scenario.features)
    return {
        "kubernetes": version,
        "allocator_variant": variant,
        "scheduler_features": sorted(enabled),
        "python": platform.python_version(),
        "first_seed": first_seed,
        "scenarios": len(cases),
        "share_scenarios": sum("shares" in c.scenario.features for c in cases),
        "agreements": len(agreements),
        "disagreements": [c.record() for c in cases if not c.agrees],
        "failures_compared": {v: sum(c.scheduler_verdict == v and c.agrees for c in cases)
                              for v in ("error", "unschedulable")},
        "feasible": {"engine": sum(c.engine_feasible for c in cases),
                     "scheduler": sum(c.scheduler_verdict == "allocated" for c in cases)},
        "scheduler_verdicts": dict(Counter(str(c.scheduler_verdict) for c in cases)),
        "features": dict(sorted(features.items())),
        "seconds": round(time.monotonic() - started, 1),
    }  # fmt: skip


def _server_version(cluster: Cluster) -> str:
    out = subprocess.run([*_kubectl_cmd(cluster), "version", "-o", "json"], capture_output=True, text=True, check=False)
    try:
        return str(json.loads(out.stdout)["serverVersion"]["gitVersion"])
    except (ValueError, KeyError):
        return "unknown"


def _assert_agreement(summary: dict[str, Any]) -> None:
    details = "\n".join(f"seed {d['seed']}: {d['problems']}" for d in summary["disagreements"][:10])
    assert summary["agreements"] == summary["scenarios"], (
        f"{len(summary['disagreements'])} of {summary['scenarios']} scenarios disagree:\n{details}")
    # A corpus where one verdict dominates proves little: both must occur.
    assert 0 < summary["feasible"]["scheduler"] < summary["scenarios"], summary["feasible"]


def test_engine_agrees_with_scheduler_sample(diff_bed: Cluster) -> None:
    count = int(os.environ.get("DIFF_SCENARIOS", "50"))
    first = int(os.environ.get("DIFF_SEED", "0"))
    summary = run_corpus(diff_bed, first, count)
    if count >= FULL:
        _write(summary)
    _assert_agreement(summary)


@pytest.mark.long
@pytest.mark.timeout(1800)  # 600 scenarios in 24 batches: longer than the suite's 300 s per test
def test_engine_agrees_with_scheduler_full(diff_bed: Cluster) -> None:
    summary = run_corpus(diff_bed, int(os.environ.get("DIFF_SEED", "0")), FULL)
    _write(summary)
    _assert_agreement(summary)
    assert summary["share_scenarios"] >= FULL_SHARES, summary["share_scenarios"]


def _write(summary: dict[str, Any]) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def test_checker_rejects_wrong_allocations() -> None:
    """The independent checker must be able to fail, or agreement on allocations means nothing."""
    case = next(c for c in (diff.make_case(s) for s in range(50)) if c.scenario.claim["spec"]["devices"].get("constraints")
                and _engine(c) is not None)  # fmt: skip
    alloc = json.loads(json.dumps(case.engine_allocation))
    assert diff.check_allocation(case.scenario, alloc, case.engine_node) == []
    assert diff.check_allocation(case.scenario, alloc, "elsewhere"), "wrong node accepted"
    dup = json.loads(json.dumps(alloc))
    dup["devices"]["results"].append(dict(dup["devices"]["results"][0]))
    assert any("twice" in p for p in diff.check_allocation(case.scenario, dup, case.engine_node))
    bogus = json.loads(json.dumps(alloc))
    bogus["devices"]["results"][0]["device"] = "no-such-gpu"
    assert any("no such device" in p for p in diff.check_allocation(case.scenario, bogus, case.engine_node))
    short = json.loads(json.dumps(alloc))
    short["devices"]["results"] = []
    assert diff.check_allocation(case.scenario, short, case.engine_node)


def _engine(case: diff.Case) -> dict[str, Any] | None:
    diff.run_engine(case)
    return case.engine_allocation


def test_checker_catches_selector_and_constraint_violations() -> None:
    from e2e.suites.scenarios import Scenario

    def dev(name: str, model: str, numa: int) -> dict[str, Any]:
        return {"name": name, "attributes": {"model": {"string": model}, "numaNode": {"int": numa}}}

    slices = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
               "spec": {"driver": scenarios.DRIVER, "nodeName": "n",
                        "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                        "devices": [dev("a", "H100", 0), dev("b", "H100", 1), dev("c", "L4", 0)]}}]  # fmt: skip
    classes = [{"metadata": {"name": "k"}, "spec": {"selectors": [{"cel": {"expression": "true"}}]}}]
    sel = f'device.attributes["{scenarios.DRIVER}"].model == "H100"'
    claim = {"metadata": {"name": "c"}, "spec": {"devices": {
        "requests": [{"name": "r", "exactly": {"deviceClassName": "k", "count": 2, "selectors": [{"cel": {"expression": sel}}]}}],
        "constraints": [{"matchAttribute": f"{scenarios.DRIVER}/numaNode"}]}}}  # fmt: skip
    s = Scenario(0, slices, classes, claim)

    def alloc(*names: str) -> dict[str, Any]:
        return {"devices": {"results": [{"request": "r", "driver": scenarios.DRIVER, "pool": "p", "device": n} for n in names]}}

    assert any("selector false" in p for p in diff.check_allocation(s, alloc("a", "c"), "n"))
    assert any("matchAttribute" in p for p in diff.check_allocation(s, alloc("a", "b"), "n"))
    assert any("count 2" in p for p in diff.check_allocation(s, alloc("a"), "n"))



def _three_numa_devices(rules: SchedulerRules | None = None) -> tuple[scenarios.Scenario, diff.Case]:
    def dev(name: str, numa: int) -> dict[str, Any]:
        return {"name": name, "attributes": {"numaNode": {"int": numa}}, "allowMultipleAllocations": True,
                "capacity": {"memory": {"value": "80Gi", "requestPolicy": {
                    "default": "8Gi", "validRange": {"min": "8Gi", "max": "80Gi", "step": "8Gi"}}}}}  # fmt: skip

    slices = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
               "spec": {"driver": scenarios.DRIVER, "nodeName": "n",
                        "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                        "devices": [dev("a", 0), dev("b", 1), dev("c", 0)]}}]  # fmt: skip
    classes = [{"metadata": {"name": "k"}, "spec": {"selectors": [{"cel": {"expression": "true"}}]}}]
    claim = {"metadata": {"name": "c"}, "spec": {"devices": {
        "requests": [{"name": "r", "exactly": {"deviceClassName": "k", "count": 3,
                                               "capacity": {"requests": {"memory": "7Gi"}}}}],
        "constraints": [{"distinctAttribute": f"{scenarios.DRIVER}/numaNode"}]}}}  # fmt: skip
    s = scenarios.Scenario(0, slices, classes, claim)
    return s, diff.Case(0, s, "ns", ("n",), rules=rules or SchedulerRules())


def _shares(*names: str, consumed: str = "8Gi") -> dict[str, Any]:
    return {"devices": {"results": [{"request": "r", "driver": scenarios.DRIVER, "pool": "p", "device": n,
                                     "shareID": f"id-{i}", "consumedCapacity": {"memory": consumed}}
                                    for i, n in enumerate(names)]}}  # fmt: skip


def _allocated_by_scheduler(case: diff.Case, alloc: dict[str, Any]) -> None:
    case.problems, case.scheduler_verdict, case.scheduler_node, case.scheduler_allocation = [], "allocated", "n", alloc


def test_the_engine_decides_distinct_attribute_as_the_servers_version() -> None:
    # 1.36 allocates numaNode 0, 1, 0 (each device compared with its request's latest one); the
    # engine replays that under 1.36 rules and agrees exactly.  Under 1.37 rules (the API's) it
    # does not allocate, and the same scheduler allocation is a disagreement.
    _, case = _three_numa_devices(SchedulerRules.for_version("v1.36.3"))
    diff.run_engine(case)
    _allocated_by_scheduler(case, _shares("a", "b", "c"))
    diff.judge(case)
    assert case.agrees, case.problems
    _allocated_by_scheduler(case, _shares("a", "c", "b"))  # 0, 0, 1: breaks the 1.36 rule too
    diff.judge(case)
    assert not case.agrees
    _, case = _three_numa_devices(SchedulerRules.for_version("v1.37.2"))
    diff.run_engine(case)
    assert case.engine_allocation is None
    _allocated_by_scheduler(case, _shares("a", "b", "c"))
    diff.judge(case)
    assert any("verdicts differ" in p for p in case.problems)
    assert any(p.startswith("scheduler: distinctAttribute") for p in case.problems)


def test_exact_comparison_sees_devices_and_consumed_capacity_not_share_ids() -> None:
    s, case = _three_numa_devices()
    s.claim["spec"]["devices"]["constraints"] = []
    s.claim["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    diff.run_engine(case)
    engine = case.engine_allocation
    assert engine is not None and [r["consumedCapacity"] for r in engine["devices"]["results"]] == [{"memory": "8Gi"}] * 2
    # The shareIDs differ (each side makes its own); the scheduler, too, takes the next share of a
    # request from the next device on (allocateOne's nextLocation), so "a", "a" is a difference.
    for alloc, agrees in ((_shares("a", "b"), True), (_shares("a", "a"), False),
                          (_shares("a", "b", consumed="7Gi"), False)):  # fmt: skip
        _allocated_by_scheduler(case, alloc)
        diff.judge(case)
        assert case.agrees == agrees, (alloc, case.problems)


UNSCHEDULABLE = ("0/50 nodes are available: 2 cannot allocate all claims, 48 node(s) didn't match Pod's node "
                 "affinity/selector. still not schedulable, preemption: 0/50 nodes are available: 50 Preemption is "
                 "not helpful for scheduling.")  # fmt: skip


def test_first_failure_is_compared_where_the_scheduler_names_it() -> None:
    # Messages as kube-scheduler 1.36.3 and 1.37.2 write them in the pod's PodScheduled condition.
    cel_136 = 'running "DynamicResources" filter plugin: claim d/c: selector #1: CEL runtime error: no such key: x'
    cel_137 = ('running "DynamicResources" filter plugin: claim d/c: selector #1 on device gpu.dra-driver.io/p/gpu-2: '
               "CEL runtime error: no such key: x")  # fmt: skip
    constraint = ('running "DynamicResources" filter plugin: claim d/c, request r0: cannot add device '
                  "gpu.dra-driver.io/p/gpu-2 because a claim constraint would not be satisfied")  # fmt: skip
    assert diff.scheduler_failure(cel_136) == {"selector": "claim #1"}
    assert diff.scheduler_failure(cel_137) == {"selector": "claim #1", "device": "gpu.dra-driver.io/p/gpu-2"}
    assert diff.scheduler_failure(constraint) == {"request": "r0", "device": "gpu.dra-driver.io/p/gpu-2"}
    engine = {"request": "r0/alt1", "selector": "request r0/alt1 selector #1", "device": "gpu.dra-driver.io/p/gpu-2"}
    assert diff.compare_failures(engine, diff.scheduler_failure(cel_136)) == []
    assert diff.compare_failures(engine, diff.scheduler_failure(cel_137)) == []
    assert diff.compare_failures({**engine, "selector": "request r0/alt1 selector #0"}, diff.scheduler_failure(cel_137))
    assert diff.compare_failures({**engine, "device": "gpu.dra-driver.io/p/gpu-1"}, diff.scheduler_failure(cel_137))
    assert diff.compare_failures({"request": "r1"}, diff.scheduler_failure(constraint))
    assert diff.compare_failures(engine, diff.scheduler_failure("something else"))  # not understood: a problem
    assert diff.dra_node_reasons(UNSCHEDULABLE) == {diff.CANNOT_ALLOCATE: 2}


def test_a_scheduler_error_from_another_node_is_compared_on_that_node() -> None:
    # Seed 23 on 1.37.2: both nodes have a device where the selector errors; the scheduler reported
    # the other node's (its Filter runs nodes in parallel), so the engine is asked about that node.
    case = diff.make_case(23, diff.scenario_features(scheduler_features(FEATURE_GATES, 37)), SchedulerRules(37))
    diff.run_engine(case)
    assert case.engine_aborts and case.engine_failure["device"].startswith(f"{scenarios.DRIVER}/s23-diff-23-n0/")
    other = case.engine_failure["device"].replace("-n0/", "-n1/")
    case.scheduler_verdict = "error"
    case.scheduler_message = ('running "DynamicResources" filter plugin: claim diff-23/s23-claim: selector #1 on device '
                              f"{other}: CEL runtime error: no such key: migCapable")  # fmt: skip
    diff.judge(case)
    assert case.agrees, case.problems
    case.problems, case.scheduler_message = [], case.scheduler_message.replace("selector #1", "selector #0")
    diff.judge(case)
    assert not case.agrees


def test_a_request_the_engine_calls_unsatisfiable_is_rechecked() -> None:
    s, _ = _three_numa_devices()
    assert diff.check_unsatisfiable_request(s, "r", ("n",))  # three devices fit count 3: the claim is wrong
    s.claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = "81Gi"
    assert diff.check_unsatisfiable_request(s, "r", ("n",)) == []
    s.claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = "7Gi"
    s.claim["spec"]["devices"]["requests"][0]["exactly"]["count"] = 4
    assert diff.check_unsatisfiable_request(s, "r", ("n",)) == []


def test_scenarios_follow_the_gates() -> None:
    assert scheduler_variant(scheduler_features(FEATURE_GATES, 36)) == MIRRORED_VARIANT
    assert scheduler_variant(scheduler_features(FEATURE_GATES, 37)) == MIRRORED_VARIANT
    off = scheduler_features({**FEATURE_GATES, "DRAConsumableCapacity": False, "DRADeviceBindingConditions": False}, 36)
    assert scheduler_variant(off) == "stable" and "shares" not in diff.scenario_features(off)
    assert scheduler_variant(scheduler_features({**FEATURE_GATES, "DRAListTypeAttributes": True}, 36)) == "experimental"
    assert "shares" in diff.scenario_features(scheduler_features(FEATURE_GATES, 36))
