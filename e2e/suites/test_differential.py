"""Our allocator against the real kube-scheduler, scenario by scenario (issues 4 and 42).

A dedicated control plane (no kubelets, no plugins, no controller of ours) so the generated
slices meet nothing else; see ``e2e/suites/differential.py`` for how one scenario is staged and judged.

Two sets of scenarios, on whichever kube-scheduler the bed runs (1.37 by default; the 1.38
scheduler beside the 1.37 control plane with ``DRA_TESTBED_SCHEDULER=1.38``, ``make e2e-next``):

- the corpus (``e2e.generators.scenarios``): by default a sample of ``DIFF_SCENARIOS`` (50), 20 of them
  with shares; ``--long``: all 600 (240 with shares);
- the family aimed at the 1.38 rules (``e2e.generators.scenarios_names``): by default its first
  ``DIFF_NAMES_SCENARIOS`` (60: ten of each rule, since the rule is the seed's remainder); ``--long``: all 240.

``DIFF_SEED`` moves the corpus's first seed (it is otherwise fixed, so failures reproduce).
Agreement is exact (``diff.judge``): verdict class, the first failure as far as the scheduler names
it, and, where both allocate, every result.  The engine decides with the rules of the
**scheduler's** version (``SchedulerRules``), read from the binary the bed started; the scenarios
use only what the bed's feature gates enable, and the test fails at once if those gates select
another allocator variant than the one the engine mirrors for that version.  On 1.36 and 1.37, a
scenario whose selector reads a name a device publishes both as ``x`` and ``<driver>/x`` has no one
right answer (CEL reads either) and is left out of the count (``diff.chance_on``).

With ``--long`` the figures go to ``e2e/results/``: ``differential.json`` (the corpus on 1.37),
``differential-names.json`` (the family on 1.37) and ``differential-1.38.json`` (both on 1.38), each
with the scenarios where the engine decides differently under the 1.37 and 1.38 rules, and the last
one also with those where the two real schedulers did (from the other files' outcomes).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.allocator.rules import SchedulerRules, mirrored_variant, parse_minor, scheduler_features, scheduler_variant
from e2e.generators import scenarios, scenarios_names
from e2e.suites import differential as diff
from e2e.testbed import cluster as cluster_mod
from e2e.testbed.cluster import FEATURE_GATES, Cluster
from e2e.testbed.clusterview import REPO
from e2e.tooling import binaries

BATCH = 25
FULL = 600
FULL_SHARES = 200
NAMES_SAMPLE = 60
RESULTS = REPO / "e2e" / "results"

pytestmark = pytest.mark.testbed_only
# The tests marked next run against the next minor's kube-scheduler, only when the bed is asked for it.
next_only = pytest.mark.skipif(binaries.scheduler_minor() is None,
                               reason=f"needs the next minor's kube-scheduler ({binaries.SCHEDULER_ENV}=1.38: make e2e-next)")


@pytest.fixture(scope="module")
def diff_bed() -> Iterator[Cluster]:
    with cluster_mod.running(nodes=()) as cluster:
        yield cluster


def _kubectl_cmd(cluster: Cluster) -> list[str]:
    return [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(cluster.kubeconfig)]


MakeCase = Callable[[int, SchedulerRules], diff.Case]


def corpus_cases(features: frozenset[str]) -> MakeCase:
    return lambda seed, rules: diff.make_case(seed, features, rules)


def run_corpus(cluster: Cluster, first_seed: int, count: int, family: str = "corpus") -> dict[str, Any]:
    """Stage ``count`` scenarios from ``first_seed`` (``family``: "corpus" or "names") and judge them."""
    started = time.monotonic()
    version = scheduler_version(cluster)
    minor = parse_minor(version)
    assert minor is not None, f"cannot read the kube-scheduler's version: {version!r}"
    enabled = scheduler_features(FEATURE_GATES, minor)
    variant = scheduler_variant(enabled, minor)
    assert variant == mirrored_variant(minor), (
        f"the bed's gates {FEATURE_GATES} select the 1.{minor} scheduler's {variant} allocator; "
        f"the engine mirrors {mirrored_variant(minor)}")
    rules = SchedulerRules.for_version(version)
    rules_served = '"devicetaintrules"' in cluster.kubectl("get", "--raw", "/apis/resource.k8s.io/v1").stdout
    features = diff.scenario_features(enabled, taint_rules=rules_served)
    make: MakeCase = corpus_cases(features) if family == "corpus" else diff.make_names_case
    cases = [make(seed, rules) for seed in range(first_seed, first_seed + count)]
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
    excluded = [c for c in cases if diff.chance_on(c)]
    counted = [c for c in cases if not diff.chance_on(c)]
    agreements = [c for c in counted if c.agrees]
    features: Counter[str] = Counter(f for c in cases for f in c.scenario.features)
    between = engine_between_versions(make, [c.seed for c in cases])
    return {
        "family": family,
        "kubernetes": server_version(cluster),
        "scheduler": version,
        "rules": rules.minor,
        "allocator_variant": variant,
        "scheduler_features": sorted(enabled),
        "python": platform.python_version(),
        "first_seed": first_seed,
        "scenarios": len(counted),
        "excluded_reads_either_spelling": {"count": len(excluded), "seeds": [c.seed for c in excluded]},
        "share_scenarios": sum("shares" in c.scenario.features for c in counted),
        "taint_rules_served": rules_served,
        "taint_rule_scenarios": sum("taint-rules" in c.scenario.features for c in counted),
        "agreements": len(agreements),
        "disagreements": [c.record() for c in counted if not c.agrees],
        "failures_compared": {v: sum(c.scheduler_verdict == v and c.agrees for c in counted)
                              for v in ("error", "unschedulable")},
        "feasible": {"engine": sum(c.engine_feasible for c in counted),
                     "scheduler": sum(c.scheduler_verdict == "allocated" for c in counted)},
        "scheduler_verdicts": dict(Counter(str(c.scheduler_verdict) for c in counted)),
        "features": dict(sorted(features.items())),
        "engine_differs_between_versions": between,
        "outcomes": {str(c.seed): diff.outcome(c.scheduler_verdict, c.scheduler_allocation) for c in cases},
        "seconds": round(time.monotonic() - started, 1),
    }  # fmt: skip


def engine_between_versions(make: MakeCase, seeds: list[int]) -> dict[str, Any]:
    """The scenarios the engine decides differently under the 1.37 and the 1.38 rules, by feature."""
    differ = []
    for seed in seeds:
        old, new = make(seed, SchedulerRules(37)), make(seed, SchedulerRules(38))
        diff.run_engine(old)
        diff.run_engine(new)
        if diff.engine_outcome(old) != diff.engine_outcome(new):
            differ.append((seed, old.scenario.features))
    by: Counter[str] = Counter(f for _, features in differ for f in features if f.startswith("names:"))
    return {"count": len(differ), "seeds": [seed for seed, _ in differ], "by_feature": dict(sorted(by.items()))}


def schedulers_between_versions(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The scenarios the two real schedulers decided differently (each run's recorded outcomes),
    leaving out those where the older one decided by chance."""
    chance = {str(s) for run in (old, new) for s in run["excluded_reads_either_spelling"]["seeds"]}
    seeds = sorted(set(old["outcomes"]) & set(new["outcomes"]) - chance, key=int)
    differ = [s for s in seeds if old["outcomes"][s] != new["outcomes"][s]]
    return {"compared": len(seeds), "count": len(differ), "seeds": [int(s) for s in differ],
            "schedulers": [old["scheduler"], new["scheduler"]]}  # fmt: skip


def scheduler_version(cluster: Cluster) -> str:
    """The gitVersion of the kube-scheduler the bed started (its ``--version``), which may be another
    minor's than the API server's (the mixed bed)."""
    return cluster.scheduler_version or "unknown"


def server_version(cluster: Cluster) -> str:
    out = subprocess.run([*_kubectl_cmd(cluster), "version", "-o", "json"], capture_output=True, text=True, check=False)
    try:
        return str(json.loads(out.stdout)["serverVersion"]["gitVersion"])
    except (ValueError, KeyError):
        return "unknown"


def _assert_agreement(summary: dict[str, Any]) -> None:
    details = "\n".join(f"seed {d['seed']} ({d['describe']}): {d['problems']}" for d in summary["disagreements"][:10])
    assert summary["agreements"] == summary["scenarios"], (
        f"{len(summary['disagreements'])} of {summary['scenarios']} scenarios disagree with {summary['scheduler']}:\n{details}")
    # A corpus where one verdict dominates proves little: both must occur.
    assert 0 < summary["feasible"]["scheduler"] < summary["scenarios"], summary["feasible"]


def _result_file(summary: dict[str, Any]) -> Path:
    if summary["rules"] >= 38:
        return RESULTS / "differential-1.38.json"
    return RESULTS / ("differential.json" if summary["family"] == "corpus" else "differential-names.json")


def _write(summary: dict[str, Any]) -> None:
    """Record a full run (a 1.38 run holds both families), then compare the two schedulers where
    both have run."""
    path = _result_file(summary)
    path.parent.mkdir(parents=True, exist_ok=True)
    if summary["rules"] < 38:
        path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    else:
        recorded = json.loads(path.read_text()) if path.exists() else {}
        recorded[summary["family"]] = summary
        path.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
    _compare_recorded()


def _compare_recorded() -> None:
    """``schedulers_differ`` in each family of differential-1.38.json that 1.37 has a run of too."""
    new_path = RESULTS / "differential-1.38.json"
    if not new_path.exists():
        return
    recorded = json.loads(new_path.read_text())
    for family, old_name in (("corpus", "differential.json"), ("names", "differential-names.json")):
        if family in recorded and (RESULTS / old_name).exists():
            old = json.loads((RESULTS / old_name).read_text())
            recorded[family]["schedulers_differ"] = schedulers_between_versions(old, recorded[family])
    new_path.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")


def _corpus_sample(cluster: Cluster) -> None:
    count = int(os.environ.get("DIFF_SCENARIOS", "50"))
    summary = run_corpus(cluster, int(os.environ.get("DIFF_SEED", "0")), count)
    if count >= FULL:
        _write(summary)
    _assert_agreement(summary)
    # Where the bed serves DeviceTaintRules, the corpus has scenarios with them (issue 50).
    assert not summary["taint_rules_served"] or summary["taint_rule_scenarios"] >= count // 10, summary


def _corpus_full(cluster: Cluster) -> None:
    summary = run_corpus(cluster, int(os.environ.get("DIFF_SEED", "0")), FULL)
    _write(summary)
    _assert_agreement(summary)
    assert summary["share_scenarios"] >= FULL_SHARES, summary["share_scenarios"]


def _names_family(cluster: Cluster, config: pytest.Config) -> None:
    full = bool(config.getoption("--long"))
    count = scenarios_names.FAMILY_SIZE if full else int(os.environ.get("DIFF_NAMES_SCENARIOS", str(NAMES_SAMPLE)))
    summary = run_corpus(cluster, scenarios_names.FIRST_SEED, count, family="names")
    if full:
        _write(summary)
    _assert_agreement(summary)
    if summary["rules"] < 38:
        # Only the selectors that read a name published both ways are left out, and the family has some.
        assert 0 < summary["excluded_reads_either_spelling"]["count"] < count // 4, summary
    # The proof that the engine's switch does something: the family is decided differently by the rule sets.
    assert summary["engine_differs_between_versions"]["count"] > 0, summary["engine_differs_between_versions"]


@pytest.mark.timeout(600)
def test_engine_agrees_with_scheduler_sample(diff_bed: Cluster) -> None:
    _corpus_sample(diff_bed)


@pytest.mark.timeout(900)  # with --long, 240 scenarios in 10 batches: longer than the suite's 300 s per test
def test_names_family_agrees_with_scheduler(diff_bed: Cluster, pytestconfig: pytest.Config) -> None:
    _names_family(diff_bed, pytestconfig)


@pytest.mark.long
@pytest.mark.timeout(1800)  # 600 scenarios in 24 batches: longer than the suite's 300 s per test
def test_engine_agrees_with_scheduler_full(diff_bed: Cluster) -> None:
    _corpus_full(diff_bed)


def _assert_next_scheduler(cluster: Cluster) -> None:
    version = scheduler_version(cluster)
    asked = binaries.scheduler_minor()
    assert asked and parse_minor(version) == parse_minor(asked), f"asked for kube-scheduler {asked}, the bed runs {version}"


@pytest.mark.next
@next_only
@pytest.mark.timeout(600)
def test_engine_agrees_with_next_scheduler_sample(diff_bed: Cluster) -> None:
    _assert_next_scheduler(diff_bed)
    _corpus_sample(diff_bed)


@pytest.mark.next
@next_only
@pytest.mark.timeout(900)
def test_names_family_agrees_with_next_scheduler(diff_bed: Cluster, pytestconfig: pytest.Config) -> None:
    _assert_next_scheduler(diff_bed)
    _names_family(diff_bed, pytestconfig)


@pytest.mark.next
@next_only
@pytest.mark.long
@pytest.mark.timeout(1800)
def test_engine_agrees_with_next_scheduler_full(diff_bed: Cluster) -> None:
    _assert_next_scheduler(diff_bed)
    _corpus_full(diff_bed)


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


def test_taint_rules_bind_the_engine_and_the_checker() -> None:
    """A scenario's DeviceTaintRules taint the devices they select for the engine (as the
    scheduler's tracker does) and for the independent checker, which must be able to fail."""
    features = diff.scenario_features(scheduler_features(FEATURE_GATES, 37), taint_rules=True)
    assert "taint-rules" in features
    assert "taint-rules" not in diff.scenario_features(scheduler_features(FEATURE_GATES, 37))
    for seed in range(200):
        case = diff.make_case(seed, features, SchedulerRules(37))
        if "taint-rules" not in case.scenario.features or _engine(case) is None:
            continue
        alloc = json.loads(json.dumps(case.engine_allocation))
        assert diff.check_allocation(case.scenario, alloc, case.engine_node, case.rules) == []
        res = alloc["devices"]["results"][0]
        body = next(r for r in case.scenario.claim["spec"]["devices"]["requests"]
                    if r["name"] == res["request"].partition("/")[0])
        if "exactly" not in body or body["exactly"].get("tolerations"):
            continue
        blocked = json.loads(json.dumps(case.scenario.taint_rules[0]))
        blocked["spec"] = {"deviceSelector": {"driver": res["driver"], "pool": res["pool"], "device": res["device"]},
                           "taint": {"key": "gpu.dra-driver.io/maintenance", "effect": "NoSchedule"}}
        case.scenario.taint_rules.append(blocked)
        assert any("untolerated taints" in p for p in diff.check_allocation(case.scenario, alloc, case.engine_node))
        diff.run_engine(case)
        again = case.engine_allocation
        assert again is None or (res["pool"], res["device"]) not in {
            (r["pool"], r["device"]) for r in again["devices"]["results"]}, "the engine took the tainted device"
        return
    raise AssertionError("no scenario with taint rules allocated a device without tolerations")


def _engine(case: diff.Case) -> dict[str, Any] | None:
    diff.run_engine(case)
    return case.engine_allocation


def test_checker_catches_selector_and_constraint_violations() -> None:
    from e2e.generators.scenarios import Scenario

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
    assert scheduler_variant(scheduler_features(FEATURE_GATES, 36), 36) == mirrored_variant(36) == "incubating"
    assert scheduler_variant(scheduler_features(FEATURE_GATES, 37), 37) == mirrored_variant(37) == "incubating"
    assert scheduler_variant(scheduler_features(FEATURE_GATES, 38), 38) == mirrored_variant(38) == "stable"
    off = scheduler_features({**FEATURE_GATES, "DRAConsumableCapacity": False, "DRADeviceBindingConditions": False}, 36)
    assert scheduler_variant(off, 36) == "stable" and "shares" not in diff.scenario_features(off)
    listed = scheduler_features({**FEATURE_GATES, "DRAListTypeAttributes": True}, 36)
    assert scheduler_variant(listed, 36) == "experimental"
    assert "shares" in diff.scenario_features(scheduler_features(FEATURE_GATES, 36))


# --------------------------------------------------------------------------- the judge under the 1.38 rules


def _names_case(feature: str, rules: SchedulerRules) -> diff.Case:
    """The family's first case with ``names:<feature>``."""
    return next(c for c in (diff.make_names_case(s, rules) for s in range(scenarios_names.FIRST_SEED, 10**6))
                if f"names:{feature}" in c.scenario.features)  # fmt: skip


def test_an_all_request_beside_an_incomplete_pool_fails_its_node_alone_from_138() -> None:
    old, new = (_names_case("all-incomplete/one", SchedulerRules(minor)) for minor in (37, 38))
    pool = f"{scenarios.DRIVER}/s{new.seed}-{new.nodes[0]}"
    reason = (f"claim {new.namespace}/{new.claim_name}, request r0: asks for all devices, but resource pool {pool} "
              "is currently being updated")  # fmt: skip
    message = (f"0/50 nodes are available: 1 cannot allocate all claims, 1 {reason}, 48 node(s) didn't match Pod's node "
               "affinity/selector. still not schedulable, preemption: 0/50 nodes are available: 50 Preemption is not "
               "helpful for scheduling.")  # fmt: skip
    incomplete = diff.incomplete_pool_reason(pool, "r0")
    assert diff.dra_node_reasons(message) == {diff.CANNOT_ALLOCATE: 1, incomplete: 1}
    assert diff.expected_node_reasons(old) == {diff.CANNOT_ALLOCATE: 2}
    assert diff.expected_node_reasons(new) == {diff.CANNOT_ALLOCATE: 1, incomplete: 1}
    for case, agrees in ((new, True), (old, False)):
        diff.run_engine(case)
        case.engine_allocation, case.engine_aborts, case.engine_failure = None, False, {}
        case.scheduler_verdict, case.scheduler_message = "unschedulable", message
        diff.judge(case)
        assert case.agrees == agrees, case.problems


def test_versions_are_compared_as_the_schedulers_version_does() -> None:
    def dev(name: str, version: str) -> dict[str, Any]:
        return {"name": name, "attributes": {"driverVersion": {"version": version}}}

    s, _ = _three_numa_devices()
    s.slices[0]["spec"]["devices"] = [dev("a", "570.86.10+a"), dev("b", "570.86.10+b")]
    s.claim["spec"]["devices"]["requests"][0]["exactly"] = {"deviceClassName": "k", "count": 2}
    alloc = {"devices": {"results": [{"request": "r", "driver": scenarios.DRIVER, "pool": "p", "device": n}
                                     for n in ("a", "b")]}}  # fmt: skip
    s.claim["spec"]["devices"]["constraints"] = [{"matchAttribute": f"{scenarios.DRIVER}/driverVersion"}]
    assert any("matchAttribute" in p for p in diff.check_allocation(s, alloc, "n", SchedulerRules(37)))
    assert diff.check_allocation(s, alloc, "n", SchedulerRules(38)) == []
    s.claim["spec"]["devices"]["constraints"] = [{"distinctAttribute": f"{scenarios.DRIVER}/driverVersion"}]
    assert diff.check_allocation(s, alloc, "n", SchedulerRules(37)) == []
    assert any("distinctAttribute" in p for p in diff.check_allocation(s, alloc, "n", SchedulerRules(38)))


def test_a_share_left_on_an_exclusive_device_blocks_it_from_138() -> None:
    case = _names_case("exclusive-shares", SchedulerRules(38))
    held = case.scenario.allocated[0]["status"]["allocation"]["devices"]["results"][0]
    alloc = {"devices": {"results": [{"request": "r0", "driver": held["driver"], "pool": held["pool"],
                                      "device": held["device"]}]}}  # fmt: skip
    node = case.nodes[0]
    case.scenario.claim["spec"]["devices"]["requests"][0]["exactly"]["count"] = 1
    # A share with a consumedCapacity: every version's capacity check refuses the device.
    held["consumedCapacity"] = {"memory": "8Gi"}
    assert any("shares still consume its capacity" in p
               for p in diff.check_allocation(case.scenario, alloc, node, SchedulerRules(37)))
    held.pop("consumedCapacity")
    assert any("still holds a share" in p for p in diff.check_allocation(case.scenario, alloc, node, SchedulerRules(38)))
    assert not any("share" in p for p in diff.check_allocation(case.scenario, alloc, node, SchedulerRules(37)))
    # The same device does not count for "no node can satisfy r0" from 1.38 on.
    one_device = [d for d in case.scenario.slices[0]["spec"]["devices"] if d["name"] == held["device"]]
    case.scenario.slices[0]["spec"]["devices"] = one_device
    case.scenario.slices[1]["spec"]["devices"] = []
    case.scenario.claim["spec"]["devices"]["requests"][0]["exactly"].pop("selectors", None)
    assert diff.check_unsatisfiable_request(case.scenario, "r0", case.nodes, SchedulerRules(37))
    assert diff.check_unsatisfiable_request(case.scenario, "r0", case.nodes, SchedulerRules(38)) == []


def test_capacity_requests_are_resolved_against_the_device_from_138() -> None:
    s, _ = _three_numa_devices()
    for dev in s.slices[0]["spec"]["devices"]:
        dev["capacity"] = {f"{scenarios.DRIVER}/memory": dev["capacity"]["memory"]}
    # "memory" is not a capacity these devices publish under 1.37; from 1.38 it is <driver>/memory.
    assert diff.check_unsatisfiable_request(s, "r", ("n",), SchedulerRules(37)) == []
    assert diff.check_unsatisfiable_request(s, "r", ("n",), SchedulerRules(38))


def test_consumed_capacity_keys_and_errors_are_compared_as_written() -> None:
    written = {"devices": {"results": [{"request": "r", "driver": scenarios.DRIVER, "pool": "p", "device": "a",
                                        "shareID": "x", "consumedCapacity": {"memory": "8Gi"}}]}}  # fmt: skip
    qualified = json.loads(json.dumps(written).replace('"memory"', f'"{scenarios.DRIVER}/memory"'))
    assert diff.comparable(written) != diff.comparable(qualified)
    moved = json.loads(json.dumps(written).replace('"pool": "p"', '"pool": "q"'))
    assert diff.outcome("allocated", written) == diff.outcome("allocated", moved) != diff.outcome("allocated", qualified)
    assert diff.outcome("error", None) != diff.outcome("unschedulable", None)
    # 1.38's errors that name a device: a value a constraint cannot compare, a capacity asked for both ways.
    device = f"{scenarios.DRIVER}/p/gpu-1"
    uncomparable = (f'running "DynamicResources" filter plugin: claim d/c, request r0: device {device}: unsupported '
                    f"attribute value for {scenarios.DRIVER}/firmwareVersion")  # fmt: skip
    both = (f'running "DynamicResources" filter plugin: claim d/c, request r0: checking capacity for device {device}: '
            'capacity "memory" requested both as "memory" and as "gpu.dra-driver.io/memory"')  # fmt: skip
    for message in (uncomparable, both):
        assert diff.scheduler_failure(message) == {"request": "r0", "device": device}


def test_selectors_that_read_either_spelling_are_left_out_before_138_only() -> None:
    chance = [c for c in (diff.make_names_case(s, SchedulerRules(37)) for s in
                          range(scenarios_names.FIRST_SEED, scenarios_names.FIRST_SEED + scenarios_names.FAMILY_SIZE))
              if diff.chance_on(c)]  # fmt: skip
    assert chance and all(scenarios_names.rule_of(c.seed) == "dual-attribute" for c in chance)
    assert not any(diff.chance_on(diff.make_names_case(c.seed, SchedulerRules(38))) for c in chance)


def test_the_checker_reads_a_name_published_both_ways_as_the_rules_scheduler() -> None:
    def dev(name: str) -> dict[str, Any]:
        # Unqualified first: the 1.37 rules read the later entry, 1.38's the qualified one.
        return {"name": name, "attributes": {"model": {"string": "L4"}, f"{scenarios.DRIVER}/model": {"string": "H100"}}}

    s, _ = _three_numa_devices()
    s.slices[0]["spec"]["devices"] = [dev("a")]
    body = {"deviceClassName": "k", "count": 1,
            "selectors": [{"cel": {"expression": f'device.attributes["{scenarios.DRIVER}"].model == "H100"'}}]}
    s.claim["spec"]["devices"] = {"requests": [{"name": "r", "exactly": body}]}
    alloc = {"devices": {"results": [{"request": "r", "driver": scenarios.DRIVER, "pool": "p", "device": "a"}]}}
    assert diff.check_allocation(s, alloc, "n", SchedulerRules(38)) == []
    s.slices[0]["spec"]["devices"][0]["attributes"][f"{scenarios.DRIVER}/model"] = {"string": "A100"}
    assert any("selector false" in p for p in diff.check_allocation(s, alloc, "n", SchedulerRules(38)))
