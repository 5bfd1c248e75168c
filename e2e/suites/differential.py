"""Differential testing of our resolution engine against the real kube-scheduler.

Each generated scenario (``e2e.generators.scenarios``) gets its own Node objects, namespace, DeviceClass
and ResourceSlices on a dedicated control plane; a Pod pinned to those nodes references the
scenario's claim.  The scheduler either writes ``status.allocation`` on the claim (feasible) or
leaves the pod ``PodScheduled=False/Unschedulable`` (infeasible).  The same objects go through
:func:`dra_driver.allocator.resolve.resolve`, and :func:`judge` compares exactly:

- the verdict class: allocated, unschedulable, or a scheduler error (``PodScheduled`` reason
  ``SchedulerError``, which the engine predicts with :data:`SCHEDULER_ABORTS`);
- the first failing request, as far as the scheduler names it (:func:`scheduler_failure`).  Its
  error message names the request (``claim ns/c, request r1: ...``; a subrequest by its own name),
  the device where there is one, and for a CEL runtime error the selector (class or claim, and its
  index; 1.37 adds the device): all of these must be what the engine's error names.  An
  unschedulable pod's condition names no request: the allocator's ``Allocate`` returns no result
  and no error when a claim does not fit (``allocator_incubating.go``, ``if !done { return nil,
  nil }``), and the DynamicResources plugin's Filter turns that into the fixed per-node reason
  "cannot allocate all claims" (``dynamicresources.go``), which the message counts per node.  So
  for that verdict the comparison is that reason on every node of the scenario (the allocator
  itself, not another filter, said no), and a request the engine names as the one no node can
  satisfy is re-checked by :func:`check_unsatisfiable_request`, which reads the spec directly;
- where both allocate, the allocation results in order: request (with the chosen ``firstAvailable``
  subrequest), device, shareID present or absent (its value is random on the scheduler's side),
  ``consumedCapacity`` as written, adminAccess and tolerations.  Which of several fitting nodes the
  scheduler takes is its scoring's choice, not the allocator's, so the engine's results are the ones
  it computes for the scheduler's node.

The engine decides with the rules of the API server's version (:class:`SchedulerRules`: 1.36's
distinctAttribute, 1.37's claim limit and ``All`` sizing) and the generator uses only what the
bed's feature gates enable (:func:`scenario_features`), which select the allocator variant the
engine mirrors (:data:`dra_driver.allocator.rules.MIRRORED_VARIANT`).  Every allocation either side
makes is also re-checked by :func:`check_allocation`, which reads the spec directly instead of
trusting either allocator.

Scenarios run in batches: everything of a batch is created with one kubectl call, the claims and
pods with a second one once the slices are visible, and one ``kubectl get`` per poll reads all
verdicts.  Names carry the seed, so scenarios of a batch never see each other's devices (the pods'
nodeSelector pins them to their own nodes; the class selects on the driver, which all share).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from dra_driver.allocator.cel.compile import compile_selector
from dra_driver.allocator.cel.errors import CelError
from dra_driver.allocator.context import SCHEDULER_ABORTS
from dra_driver.allocator.inventory import allocated_state, build_inventory
from dra_driver.allocator.resolve import Resolution, resolve
from dra_driver.allocator.rules import SchedulerRules
from dra_driver.allocator.taintrules import taint_rules, with_taint_rules
from dra_driver.k8s.quantity import parse_quantity
from e2e.generators import scenarios, scenarios_names

LABEL = "diff.dra-driver.io/scenario"
BATCH_LABEL = "diff.dra-driver.io/batch"
# A pod the scheduler has called unschedulable is only believed after this long without an
# allocation: a first attempt may have raced the scheduler's informers (slices or class not yet
# seen); their add events requeue the pod, and the retry would then allocate.
SETTLE_S = 6.0
Kubectl = Callable[..., Any]
# The per-node reason of the DynamicResources plugin when the allocator finds no allocation.
CANNOT_ALLOCATE = "cannot allocate all claims"
# Scenario features (e2e.generators.scenarios) and the scheduler features (structured.Features) they need.
_NEEDS = {"shares": "ConsumableCapacity", "taints": "DeviceTaints", "taint-none": "DeviceTaints", "taint-rules": "DeviceTaints",
          "counters": "PartitionableDevices", "firstAvailable": "PrioritizedList"}  # fmt: skip


@dataclass
class Case:
    seed: int
    scenario: scenarios.Scenario
    namespace: str
    nodes: tuple[str, ...]
    engine_allocation: dict[str, Any] | None = None
    engine_node: str | None = None
    engine_summary: str = ""
    engine_aborts: bool = False  # the engine predicts a scheduler error, not a plain "unschedulable"
    scheduler_verdict: str | None = None  # "allocated" | "unschedulable" | "error" | None (undecided)
    scheduler_allocation: dict[str, Any] | None = None
    scheduler_node: str | None = None
    scheduler_message: str = ""
    unschedulable_since: float | None = None
    problems: list[str] = field(default_factory=list)
    rules: SchedulerRules = field(default_factory=SchedulerRules)
    engine_failure: dict[str, str] = field(default_factory=dict)  # what the engine's error names

    @property
    def claim_name(self) -> str:
        return str(self.scenario.claim["metadata"]["name"])

    @property
    def engine_feasible(self) -> bool:
        return self.engine_allocation is not None

    @property
    def engine_verdict(self) -> str:
        return "allocated" if self.engine_feasible else "error" if self.engine_aborts else "unschedulable"

    @property
    def agrees(self) -> bool:
        """Exact agreement (judged): same verdict class, failing request and, when allocated, results."""
        return self.scheduler_verdict is not None and not self.problems

    def record(self) -> dict[str, Any]:
        return {
            "seed": self.seed, "features": self.scenario.features, "describe": self.scenario.describe(),
            "engine": {"feasible": self.engine_feasible, "aborts": self.engine_aborts, "node": self.engine_node,
                       "allocation": self.engine_allocation, "summary": self.engine_summary,
                       "failure": self.engine_failure, "rules": self.rules.minor},
            "scheduler": {"verdict": self.scheduler_verdict, "node": self.scheduler_node,
                          "allocation": self.scheduler_allocation, "message": self.scheduler_message},
            "problems": self.problems,
        }  # fmt: skip


def make_case(seed: int, features: frozenset[str] = scenarios.DEFAULT_FEATURES, rules: SchedulerRules | None = None) -> Case:
    nodes = (f"diff-{seed}-n0", f"diff-{seed}-n1")
    ns = f"diff-{seed}"
    return Case(seed, scenarios.generate(seed, nodes=nodes, features=features, namespace=ns), ns, nodes,
                rules=rules or SchedulerRules())


def make_names_case(seed: int, rules: SchedulerRules | None = None) -> Case:
    """A case of the family aimed at the 1.38 rules (:mod:`e2e.generators.scenarios_names`)."""
    nodes = (f"diff-{seed}-n0", f"diff-{seed}-n1")
    ns = f"diff-{seed}"
    return Case(seed, scenarios_names.generate(seed, nodes=nodes, namespace=ns), ns, nodes,
                rules=rules or SchedulerRules())


def chance_on(case: Case) -> list[str]:
    """Names whose value the scheduler of the case's rules reads at random: a selector reading an
    attribute or capacity that a device publishes both as ``x`` and ``<driver>/x``, before 1.38.
    Such a scenario has no one right answer on that scheduler, so it is left out of its count."""
    return scenarios.cel_reads_both_spellings(case.scenario) if not case.rules.qualified_names else []


def scenario_features(enabled: frozenset[str], taint_rules: bool = False) -> frozenset[str]:
    """The generator's features a scheduler with the structured.Features ``enabled`` supports;
    ``taint_rules``: the API server serves resource.k8s.io/v1 DeviceTaintRules (whose taints the
    scheduler's slice tracker merges into the devices)."""
    wanted = scenarios.DEFAULT_FEATURES | {"taint-none", "shares"} | ({"taint-rules"} if taint_rules else set())
    return frozenset(f for f in wanted if _NEEDS.get(f) is None or _NEEDS[f] in enabled)


# --------------------------------------------------------------------------- objects


def _labels(case: Case, batch: str) -> dict[str, str]:
    return {LABEL: str(case.seed), BATCH_LABEL: batch}


def node_object(case: Case, name: str, batch: str) -> dict[str, Any]:
    # Nodes may be created with their status; no kubelet ever updates them.  The pods tolerate
    # every taint, so the node lifecycle controller marking them unreachable later changes nothing.
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **_labels(case, batch)}},
        "status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "10"},
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "10"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "differential bed"}],
        },
    }  # fmt: skip


def node_objects(case: Case, batch: str = "") -> list[dict[str, Any]]:
    return [node_object(case, n, batch) for n in case.nodes]


def _with_labels(obj: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any]:
    out = json.loads(json.dumps(obj))
    meta = out.setdefault("metadata", {})
    meta.pop("uid", None)
    meta["labels"] = {**meta.get("labels", {}), **labels}
    return dict(out)


def setup_objects(case: Case, batch: str) -> list[dict[str, Any]]:
    """Namespace, nodes, class, slices and other claims (their allocations are written by
    :func:`held_status_patches`): everything the claim's pod will be scheduled against."""
    labels = _labels(case, batch)
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": case.namespace, "labels": labels}}
    held = [{k: v for k, v in _with_labels(c, labels).items() if k != "status"} for c in case.scenario.allocated]
    return [ns, *node_objects(case, batch),
            *(_with_labels(c, labels) for c in case.scenario.classes),
            *(_with_labels(s, labels) for s in case.scenario.slices),
            *(_with_labels(r, labels) for r in case.scenario.taint_rules), *held]  # fmt: skip


def held_status_patches(case: Case) -> list[tuple[str, str, str]]:
    """(namespace, claim, merge patch) writing each already allocated claim's status."""
    return [(case.namespace, c["metadata"]["name"], json.dumps({"status": c["status"]})) for c in case.scenario.allocated]


def workload_objects(case: Case, batch: str) -> list[dict[str, Any]]:
    labels = _labels(case, batch)
    claim = _with_labels(case.scenario.claim, labels)
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "pod", "namespace": case.namespace, "labels": labels},
        "spec": {
            "nodeSelector": {LABEL: str(case.seed)},
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": case.claim_name}],
            "containers": [{"name": "c", "image": "registry.invalid/pause:1", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }  # fmt: skip
    return [claim, pod]


# --------------------------------------------------------------------------- our side


def _resolve(case: Case, nodes: Sequence[str]) -> Resolution:
    s = case.scenario
    slices = with_taint_rules(s.slices, taint_rules(s.taint_rules))
    return resolve(s.claim, build_inventory(slices), s.classes, allocated_state(s.allocated),
                   nodes=[node_object(case, n, "") for n in nodes], rules=case.rules)


def run_engine(case: Case) -> None:
    res = _resolve(case, case.nodes)
    case.engine_allocation = res.allocation
    case.engine_node = res.node
    case.engine_aborts = any(SCHEDULER_ABORTS in e for e in res.explanation.errors)
    case.engine_failure = dict(res.explanation.failure)
    summary = [*res.explanation.errors, f"nodes: {json.dumps(res.explanation.nodes, sort_keys=True)}"]
    case.engine_summary = "; ".join(summary)[:2000]


# --------------------------------------------------------------------------- independent checker


def _tolerated(taint: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        op = tol.get("operator", "Equal")
        if not tol.get("key"):
            if op == "Exists":
                return True
            continue
        if tol["key"] != taint.get("key"):
            continue
        if op == "Exists" or tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def _rule_taints(s: scenarios.Scenario, key: tuple[str, str, str]) -> list[Mapping[str, Any]]:
    """The taints of the scenario's DeviceTaintRules on the device ``key``: a selector field that
    is set must equal the device's driver, pool or name."""
    out = []
    for rule in s.taint_rules:
        sel = rule["spec"]["deviceSelector"]
        if all(sel.get(f, own) == own for f, own in zip(("driver", "pool", "device"), key, strict=True)):
            out.append(rule["spec"]["taint"])
    return out


def _blocking_taints(device: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]],
                     ruled: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    return [f"{t.get('key')}:{t.get('effect')}" for t in [*device.get("taints", []), *ruled]
            if t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(t, tolerations)]  # fmt: skip


def _matches(expressions: Iterable[str], device: Any, rules: SchedulerRules) -> str | None:
    """None when all selectors are true; else why not (a name published both as ``x`` and
    ``<driver>/x`` read as the rules' scheduler reads it)."""
    activation = device.activation_for(rules.qualified_names, rules.cel_converts_on_read)
    for expr in expressions:
        try:
            if not compile_selector(expr).evaluate(activation):
                return f"selector false: {expr}"
        except CelError as exc:
            return f"selector error: {expr}: {exc}"
    return None


def _attribute(device: Mapping[str, Any], driver: str, name: str, semver_equal: bool = False) -> Any:
    """(type, value) of the attribute a constraint compares; the driver's domain wins over the
    unqualified spelling in every version.  ``semver_equal`` (1.38): a version as semver's
    equality sees it, without its build metadata."""
    domain, _, ident = name.rpartition("/")
    attrs = device.get("attributes", {})
    raw = attrs.get(name) or (attrs.get(ident) if domain == driver else None)
    if raw is None:
        return None
    kind, value = next(iter(raw.items()))
    return (kind, value.partition("+")[0]) if kind == "version" and semver_equal else (kind, value)


def _published_name(name: str, published: Mapping[str, Any], driver: str, resolved: bool) -> str | None:
    """The capacity of a device that a request's ``name`` means: the same key, or with ``resolved``
    (1.38) the other spelling in the device's driver's domain, the qualified one first."""
    if not resolved:
        return name if name in published else None
    ident = name.removeprefix(f"{driver}/")
    return next((k for k in (f"{driver}/{ident}", ident) if k in published), None)


def _held_by_shares(s: scenarios.Scenario) -> dict[tuple[str, str, str], str]:
    """Devices other claims hold a share of, and the first such claim."""
    out: dict[tuple[str, str, str], str] = {}
    for claim in s.allocated:
        for res in claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", []):
            if res.get("shareID") is not None:
                out.setdefault((res["driver"], res["pool"], res["device"]), claim["metadata"]["name"])
    return out


def _consumed_by_shares(s: scenarios.Scenario) -> dict[tuple[str, str, str], dict[str, Any]]:
    """What other claims' shares consume of each device, by capacity name as written."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for claim in s.allocated:
        for res in claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", []):
            if res.get("shareID") is not None:
                used = out.setdefault((res["driver"], res["pool"], res["device"]), {})
                for cname, q in res.get("consumedCapacity", {}).items():
                    used[cname] = used.get(cname, 0) + parse_quantity(q).value
    return out


def _shares_leave_too_little(s: scenarios.Scenario, key: tuple[str, str, str], raw: Mapping[str, Any],
                             wanted: Mapping[str, Any]) -> bool:  # fmt: skip
    """Whether other claims' shares of a device used alone consume too much for ``wanted`` beside
    them (every version's CmpRequestOverCapacity counts them; an unrequested capacity is consumed
    whole).  Names as written: from 1.38 on any share holds the device anyway."""
    used = _consumed_by_shares(s).get(key, {})
    for cname, cap in raw.get("capacity", {}).items():
        if cname in used:
            amount = wanted.get(cname) or (cap.get("requestPolicy") or {}).get("default") or cap["value"]
            if used[cname] + parse_quantity(amount).value > parse_quantity(cap["value"]).value:
                return True
    return False


def check_allocation(s: scenarios.Scenario, allocation: Mapping[str, Any], node: str | None,
                     rules: SchedulerRules | None = None) -> list[str]:
    """Everything an allocation must satisfy, read from the scenario's own objects (where
    scheduler versions differ, as ``rules`` decide)."""
    rules = rules or SchedulerRules()
    held = _held_by_shares(s) if rules.shares_block_exclusive else {}
    problems: list[str] = []
    inventory = build_inventory(s.slices)
    raw_devices = {(sl["spec"]["driver"], sl["spec"]["pool"]["name"], d["name"]): (sl, d)
                   for sl in s.slices for d in sl["spec"].get("devices", [])}  # fmt: skip
    classes = {c["metadata"]["name"]: c for c in s.classes}
    requests = {r["name"]: r for r in s.claim["spec"]["devices"]["requests"]}
    results = allocation.get("devices", {}).get("results", [])
    if not results:
        problems.append("allocation has no results")
    if len(results) > 32:
        problems.append(f"{len(results)} results, more than 32")
    by_request: dict[str, list[tuple[str, Mapping[str, Any], Any]]] = {}
    seen: set[tuple[str, str, str]] = set()
    used_counters: dict[tuple[str, str, str], dict[str, Any]] = {}
    shared: dict[tuple[tuple[str, str, str], str], Any] = {}
    for res in results:
        key = (res.get("driver", ""), res.get("pool", ""), res.get("device", ""))
        label = "/".join(key)
        if key not in raw_devices or key not in inventory.by_key:
            problems.append(f"{label}: no such device")
            continue
        sl, raw = raw_devices[key]
        dev = inventory.by_key[key]
        if not inventory.pool_of(dev).usable:
            problems.append(f"{label}: pool not usable")
        if sl["spec"].get("nodeName") != node:
            problems.append(f"{label}: on node {sl['spec'].get('nodeName')}, pod on {node}")
        if raw.get("allowMultipleAllocations") is True:
            if res.get("shareID") is None:
                problems.append(f"{label}: a share without shareID")
            for cname, q in res.get("consumedCapacity", {}).items():
                if cname not in raw.get("capacity", {}):
                    problems.append(f"{label}: consumes capacity {cname} it does not publish")
                    continue
                shared[(key, cname)] = shared.get((key, cname), 0) + parse_quantity(q).value
        elif key in seen:
            problems.append(f"{label}: allocated twice")
        elif key in held:
            problems.append(f"{label}: exclusive, but claim {held[key]} still holds a share of it")
        elif res.get("shareID") is not None or res.get("consumedCapacity"):
            problems.append(f"{label}: shareID or consumedCapacity on a device that cannot be shared")
        seen.add(key)
        base, _, sub = str(res.get("request", "")).partition("/")
        req = requests.get(base)
        if req is None:
            problems.append(f"{label}: unknown request {res.get('request')}")
            continue
        body = next((b for b in req.get("firstAvailable", []) if b["name"] == sub), None) if sub else req.get("exactly")
        if body is None:
            problems.append(f"{label}: request {res.get('request')} does not match the claim's shape")
            continue
        by_request.setdefault(base, []).append((sub, body, dev))
        if raw.get("allowMultipleAllocations") is not True and _shares_leave_too_little(
                s, key, raw, body.get("capacity", {}).get("requests", {})):
            problems.append(f"{label}: exclusive, but other claims' shares still consume its capacity")
        cls = classes.get(body["deviceClassName"])
        if cls is None:
            problems.append(f"{label}: class {body['deviceClassName']} missing")
            continue
        exprs = [x["cel"]["expression"] for x in cls["spec"].get("selectors", []) + body.get("selectors", [])]
        why = _matches(exprs, dev, rules)
        if why:
            problems.append(f"{label} for {res.get('request')}: {why}")
        blocking = _blocking_taints(raw, body.get("tolerations", []), _rule_taints(s, key))
        if blocking:
            problems.append(f"{label}: untolerated taints {blocking}")
        for entry in raw.get("consumesCounters", []):
            target = used_counters.setdefault((key[0], key[1], entry["counterSet"]), {})
            for cname, c in entry["counters"].items():
                target[cname] = target.get(cname, 0) + parse_quantity(c["value"]).value
    for base in requests:
        got = by_request.get(base, [])
        subs = {sub for sub, _, _ in got}
        if len(subs) > 1:
            problems.append(f"request {base}: results from several subrequests {sorted(subs)}")
        if not got:
            problems.append(f"request {base}: no devices")
            continue
        body = got[0][1]
        if body.get("allocationMode") == "All":
            exprs = [x["cel"]["expression"]
                     for x in classes[body["deviceClassName"]]["spec"].get("selectors", []) + body.get("selectors", [])]
            wanted = {d.key for d in inventory.devices if d.node_name == node and inventory.pool_of(d).usable
                      and _matches(exprs, d, rules) is None}  # fmt: skip
            have = {d.key for _, _, d in got}
            # With capacity requests, a device the request does not fit is left out, not an error.
            required = set() if body.get("capacity", {}).get("requests") else wanted
            if not required <= have <= wanted:
                problems.append(f"request {base} (All): got {sorted(have)}, matching devices {sorted(wanted)}")
        elif len(got) != body.get("count", 1):
            problems.append(f"request {base}: {len(got)} devices, count {body.get('count', 1)}")
    for c in s.claim["spec"]["devices"].get("constraints", []):
        scope = set(c.get("requests", [])) or set(requests)
        found: list[str] = []
        for base in scope:
            for _, _, dev in by_request.get(base, []):
                sl, raw = raw_devices[dev.key]
                name = c.get("matchAttribute") or c["distinctAttribute"]
                found.append(json.dumps(_attribute(raw, sl["spec"]["driver"], name, semver_equal=rules.versions_ignore_build)))
        if "matchAttribute" in c and (len(set(found)) > 1 or "null" in found):
            problems.append(f"matchAttribute {c['matchAttribute']} over {sorted(scope)}: values {sorted(set(found))}")
        if "distinctAttribute" in c and (len(set(found)) < len(found) or "null" in found):
            problems.append(f"distinctAttribute {c['distinctAttribute']} over {sorted(scope)}: values {sorted(found)}")
    for (key, cname), total in shared.items():
        if total > parse_quantity(raw_devices[key][1]["capacity"][cname]["value"]).value:
            problems.append(f"{'/'.join(key)}: {cname} consumed beyond its capacity ({total} bytes)")
    for (_, pool, cs), counters in used_counters.items():
        available: dict[str, Any] | None = next((x["counters"] for sl in s.slices if sl["spec"]["pool"]["name"] == pool
                     for x in sl["spec"].get("sharedCounters", []) if x["name"] == cs), None)  # fmt: skip
        if available is None:
            problems.append(f"counter set {pool}/{cs} does not exist")
            continue
        for cname, total in counters.items():
            if cname not in available or total > parse_quantity(available[cname]["value"]).value:
                problems.append(f"counter {pool}/{cs}/{cname}: {total} consumed of {available.get(cname)}")
    sel = allocation.get("nodeSelector")
    if node is not None and sel is not None:
        terms = sel.get("nodeSelectorTerms", [])
        ok = any(all(f.get("key") == "metadata.name" and f.get("operator") == "In" and node in f.get("values", [])
                     for f in t.get("matchFields", [])) and not t.get("matchExpressions") for t in terms)  # fmt: skip
        if not ok:
            problems.append(f"nodeSelector {sel} does not select {node}")
    return problems


# --------------------------------------------------------------------------- the scheduler's side


def _items(kubectl: Kubectl, what: str, batch: str) -> list[dict[str, Any]]:
    out = kubectl("get", what, "-A", "-l", f"{BATCH_LABEL}={batch}", "-o", "json").stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def _not_scheduled(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(verdict, message) when the last attempt failed: no fitting node, or an allocator error."""
    for cond in pod.get("status", {}).get("conditions", []):
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            verdict = {"Unschedulable": "unschedulable", "SchedulerError": "error"}.get(str(cond.get("reason")))
            if verdict:
                return verdict, str(cond.get("message", ""))
    return None


class ClaimWatch:
    """Every allocation any claim of a batch ever had, from a ``kubectl get -w`` stream.

    Polling is not enough: when the scheduler allocates a device whose NoExecute taint the claim
    tolerates, kube-controller-manager's device-taint eviction may still delete the pod, and the
    claim controller then drops the allocation within a second.
    """

    def __init__(self, kubectl_cmd: Sequence[str], batch: str) -> None:
        self.allocations: dict[tuple[str, str], dict[str, Any]] = {}  # by (namespace, claim)
        self._proc = subprocess.Popen([*kubectl_cmd, "get", "resourceclaims", "-A", "-l", f"{BATCH_LABEL}={batch}",
                                       "-w", "-o", "json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        decoder, buf = json.JSONDecoder(), ""
        for line in self._proc.stdout:
            buf += line
            while buf.strip():
                try:
                    obj, end = decoder.raw_decode(buf.lstrip())
                except json.JSONDecodeError:
                    break
                buf = buf.lstrip()[end:]
                alloc = obj.get("status", {}).get("allocation")
                if alloc:
                    self.allocations.setdefault((obj["metadata"]["namespace"], obj["metadata"]["name"]), alloc)

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=5)
        self._thread.join(timeout=5)


def _selected_node(allocation: Mapping[str, Any]) -> str | None:
    for term in allocation.get("nodeSelector", {}).get("nodeSelectorTerms", []):
        for f in term.get("matchFields", []):
            if f.get("key") == "metadata.name" and f.get("operator") == "In" and len(f.get("values", [])) == 1:
                return str(f["values"][0])
    return None


def run_batch(kubectl: Kubectl, kubectl_cmd: Sequence[str], cases: Sequence[Case], batch: str,
              timeout: float = 150.0) -> None:
    """Create a batch, wait for every scheduler verdict, fill in the cases; cleanup is separate."""
    watch = ClaimWatch(kubectl_cmd, batch)
    try:
        _run_batch(kubectl, watch, cases, batch, timeout)
    finally:
        watch.stop()


def _run_batch(kubectl: Kubectl, watch: ClaimWatch, cases: Sequence[Case], batch: str, timeout: float) -> None:
    setup = [o for c in cases for o in setup_objects(c, batch)]
    kubectl("create", "-f", "-", input_text=yaml.safe_dump_all(setup))
    want_slices = sum(len(c.scenario.slices) for c in cases)
    want_sa = {c.namespace for c in cases}

    def ready() -> bool:
        slices = _items(kubectl, "resourceslices", batch)
        accounts = json.loads(kubectl("get", "serviceaccounts", "-A", "-o", "json").stdout)["items"]
        have_sa = {a["metadata"]["namespace"] for a in accounts if a["metadata"]["name"] == "default"}
        return len(slices) == want_slices and want_sa <= have_sa

    _wait("slices and service accounts of batch " + batch, ready, 60)
    for ns, name, patch in (p for c in cases for p in held_status_patches(c)):
        kubectl("patch", "resourceclaim", name, "-n", ns, "--subresource=status", "--type=merge", "-p", patch)
    time.sleep(1.0)  # the scheduler's informers trail the API server a little; the settle rule covers the rest
    work = [o for c in cases for o in workload_objects(c, batch)]
    kubectl("create", "-f", "-", input_text=yaml.safe_dump_all(work))
    by_ns = {c.namespace: c for c in cases}
    deadline = time.monotonic() + timeout
    while True:
        now = time.monotonic()
        claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in _items(kubectl, "resourceclaims", batch)}
        pods = {p["metadata"]["namespace"]: p for p in _items(kubectl, "pods", batch)}
        for ns, case in by_ns.items():
            key = (ns, case.claim_name)
            claim, pod = claims.get(key, {}), pods.get(ns, {})
            alloc = watch.allocations.get(key) or claim.get("status", {}).get("allocation")
            if alloc:
                case.scheduler_verdict, case.scheduler_allocation = "allocated", alloc
                case.scheduler_node = _selected_node(alloc) or pod.get("spec", {}).get("nodeName")
                continue
            failed = _not_scheduled(pod)
            if failed is None:
                case.unschedulable_since, case.scheduler_verdict = None, None
                continue
            verdict, case.scheduler_message = failed
            case.unschedulable_since = case.unschedulable_since or now
            if now - case.unschedulable_since >= SETTLE_S:
                case.scheduler_verdict = verdict
        # An allocated claim whose pod is not yet bound: wait for the binding to know the node.
        pending = [c for c in cases
                   if c.scheduler_verdict is None or (c.scheduler_verdict == "allocated" and not c.scheduler_node)]  # fmt: skip
        if not pending or now > deadline:
            break
        time.sleep(1.0)


def cleanup_batch(kubectl: Kubectl, batch: str) -> None:
    sel = f"{BATCH_LABEL}={batch}"
    kubectl("delete", "pods", "-A", "-l", sel, "--force", "--grace-period=0", "--wait=false", check=False)
    kubectl("delete", "namespaces,nodes,resourceslices,deviceclasses", "-l", sel, "--wait=false", check=False)
    # Apart: a server that does not serve them would fail the whole command above.
    kubectl("delete", "devicetaintrules", "-l", sel, "--wait=false", check=False)


def comparable(allocation: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The results as compared: all the scheduler decides, the shareID reduced to its presence."""
    out = []
    for res in allocation.get("devices", {}).get("results", []):
        row = {k: res[k] for k in ("request", "driver", "pool", "device", "consumedCapacity", "tolerations") if k in res}
        row["shareID"] = res.get("shareID") is not None
        row["adminAccess"] = bool(res.get("adminAccess"))
        out.append(row)
    return out


def outcome(verdict: str | None, allocation: Mapping[str, Any] | None) -> str:
    """One scenario's decision, to compare two schedulers (or rule sets) on it: the verdict and,
    when allocated, each result's request, device, consumedCapacity and share.  Not the pool:
    which of several fitting nodes a scheduler takes is its scoring's choice."""
    if verdict != "allocated" or allocation is None:
        return str(verdict)
    rows = [{k: v for k, v in row.items() if k not in ("driver", "pool")} for row in comparable(allocation)]
    return "allocated " + json.dumps(rows, sort_keys=True)


def engine_outcome(case: Case) -> str:
    return outcome(case.engine_verdict, case.engine_allocation)


def judge(case: Case) -> None:
    """Fill ``case.problems``: the exact comparison, and invalid allocations on either side."""
    if case.scheduler_verdict is None:
        case.problems.append("the scheduler gave no verdict in time")
    elif case.engine_verdict != case.scheduler_verdict:
        case.problems.append(f"verdicts differ: engine {case.engine_verdict}, scheduler {case.scheduler_verdict}"
                             + (f": {case.scheduler_message}" if case.scheduler_message else ""))  # fmt: skip
    elif case.scheduler_verdict == "error":
        theirs, ours = scheduler_failure(case.scheduler_message), case.engine_failure
        node = _node_of(case.scenario, theirs.get("device", ""))
        if node is not None and theirs.get("device") != ours.get("device"):
            # The scheduler filters nodes in parallel and reports the first error to come back,
            # from whichever node that was: compare with the engine's error on that node.
            ours = dict(_resolve(case, [node]).explanation.failure)
        case.problems += compare_failures(ours, theirs)
    elif case.scheduler_verdict == "unschedulable":
        reasons, expected = dra_node_reasons(case.scheduler_message), expected_node_reasons(case)
        if reasons != expected:
            case.problems.append(f"scheduler's per-node reasons {reasons}, expected {expected}: {case.scheduler_message}")
        if case.engine_failure.get("request"):
            case.problems += [f"engine: {p}" for p in
                              check_unsatisfiable_request(case.scenario, case.engine_failure["request"], case.nodes,
                                                          case.rules)]
    elif case.scheduler_allocation is not None:
        engine = case.engine_allocation
        if case.scheduler_node != case.engine_node:
            engine = _resolve(case, [case.scheduler_node] if case.scheduler_node else []).allocation
        if engine is None:
            case.problems.append(f"the engine allocates on {case.engine_node} but not on the scheduler's node "
                                 f"{case.scheduler_node}")  # fmt: skip
        elif comparable(engine) != comparable(case.scheduler_allocation):
            case.problems.append(f"allocations differ on {case.scheduler_node}: engine {comparable(engine)}, "
                                 f"scheduler {comparable(case.scheduler_allocation)}")  # fmt: skip
    for side, allocation, node in (("engine", case.engine_allocation, case.engine_node),
                                   ("scheduler", case.scheduler_allocation, case.scheduler_node)):
        if allocation is not None:
            case.problems += [f"{side}: {p}" for p in _checked(case, allocation, node)]


def _checked(case: Case, allocation: Mapping[str, Any], node: str | None) -> list[str]:
    problems = check_allocation(case.scenario, allocation, node, case.rules)
    if case.rules.distinct_latest_only and not _distinct_136_violations(case.scenario, allocation):
        # Breaking the API's distinctAttribute is the 1.36 rule where the allocation keeps that
        # rule (replayed in the order the results were added).
        problems = [p for p in problems if not p.startswith("distinctAttribute ")]
    return problems


_CLAIM_REQUEST = re.compile(r"claim [^ ,:]+, (?:sub)?request ([^ :]+): (.*)", re.DOTALL)
_SELECTOR = re.compile(r"(?:claim [^ ,:]+|class ([^ :]+)): selector #(\d+)(?: on device ([^ :]+))?: CEL runtime error: ")
# The device a request's error names: a constraint not met, and from 1.38 an attribute value a
# constraint cannot compare, or a capacity request that cannot be resolved (a full device ID only).
_DEVICE = re.compile(r"cannot add device ([^ ]+) because|(?:^|for )device ([^ /:]+/[^ /:]+/[^ :]+): ")


def scheduler_failure(message: str) -> dict[str, str]:
    """What a scheduler error names (the DynamicResources Filter's error, in the pod's condition):
    ``request`` (a subrequest by its own name), ``device``, ``selector`` (``class <name> #i`` or
    ``claim #i``); ``{}`` when the message is none of the allocator's."""
    text = message.split('filter plugin: ', 1)[-1]
    out: dict[str, str] = {}
    m = _CLAIM_REQUEST.match(text)
    if m:
        out["request"] = m.group(1)
        dev = _DEVICE.search(m.group(2))
        if dev:
            out["device"] = dev.group(1) or dev.group(2)
        return out
    m = _SELECTOR.match(text)
    if m:
        out["selector"] = f"class {m.group(1)} #{m.group(2)}" if m.group(1) else f"claim #{m.group(2)}"
        if m.group(3):
            out["device"] = m.group(3)
    return out


def _node_of(s: scenarios.Scenario, device: str) -> str | None:
    for sl in s.slices:
        prefix = f"{sl['spec']['driver']}/{sl['spec']['pool']['name']}/"
        if device.startswith(prefix) and any(d["name"] == device[len(prefix):] for d in sl["spec"].get("devices", [])):
            return str(sl["spec"].get("nodeName")) if sl["spec"].get("nodeName") else None
    return None


def compare_failures(engine: Mapping[str, str], scheduler: Mapping[str, str]) -> list[str]:
    """Problems where the engine's error names something else than the scheduler's does."""
    if not scheduler:
        return [f"the scheduler's error names nothing the differential knows; engine: {dict(engine)}"]
    ours: dict[str, str] = {}
    if engine.get("request"):
        ours["request"] = engine["request"].rpartition("/")[2]  # the scheduler names a subrequest alone
    if engine.get("device"):
        ours["device"] = engine["device"]
    label = engine.get("selector", "")
    m = re.fullmatch(r"class (\S+) selector #(\d+)|request \S+ selector #(\d+)", label)
    if m:
        ours["selector"] = f"class {m.group(1)} #{m.group(2)}" if m.group(1) else f"claim #{m.group(3)}"
    differ = {k: (ours.get(k), v) for k, v in scheduler.items() if ours.get(k) != v}
    if "selector" in scheduler:
        differ.pop("request", None)  # a CEL runtime error names no request on the scheduler's side
    return [f"first failure differs in {k}: engine {a!r}, scheduler {b!r}" for k, (a, b) in differ.items()]


_INCOMPLETE = re.compile(r"claim [^ ,]+, request ([^ :]+): asks for all devices, but resource pool (\S+) "
                         r"is currently being updated")
_NODE_REASON = re.compile(r"(\d+) (.+?)(?:, (?=\d+ )|$)")


def dra_node_reasons(message: str) -> dict[str, int]:
    """The per-node reasons of an unschedulable pod's condition other than the pods' nodeSelector
    (``0/50 nodes are available: 2 cannot allocate all claims, 48 node(s) didn't match ...``).  A
    reason may hold commas itself (1.38 names an ``All`` request's incomplete pool, which fails only
    its node: ``1 claim ns/c, request r0: asks for all devices, but resource pool d/p is currently
    being updated``); such a reason is shortened to :func:`incomplete_pool_reason`."""
    head = message.split(" nodes are available: ", 1)[-1].split(". ", 1)[0].rstrip(".")
    out: dict[str, int] = {}
    for count, reason in _NODE_REASON.findall(head):
        if "node affinity/selector" in reason:
            continue
        m = _INCOMPLETE.fullmatch(reason)
        reason = incomplete_pool_reason(m.group(2), m.group(1)) if m else reason
        out[reason] = out.get(reason, 0) + int(count)
    return out


def incomplete_pool_reason(pool: str, request: str) -> str:
    return f"incomplete pool {pool} for request {request} (All)"


def expected_node_reasons(case: Case) -> dict[str, int]:
    """The per-node reasons of an unschedulable verdict: the allocator found nothing on each node,
    except (1.38) on a node with an incomplete pool, where the claim's first ``All`` request fails
    that node by name before any search."""
    out: dict[str, int] = {}
    first_all = next((r["name"] for r in case.scenario.claim["spec"]["devices"]["requests"]
                      if r.get("exactly", {}).get("allocationMode") == "All"), None)  # fmt: skip
    incomplete = _incomplete_pools(case.scenario)
    for node in case.nodes:
        pool = incomplete.get(node) if case.rules.all_fails_node_only and first_all else None
        reason = incomplete_pool_reason(pool, first_all) if pool and first_all else CANNOT_ALLOCATE
        out[reason] = out.get(reason, 0) + 1
    return out


def _incomplete_pools(s: scenarios.Scenario) -> dict[str, str]:
    """node -> ``driver/pool`` of a pool on that node with fewer slices than it declares."""
    present: dict[tuple[str, str], int] = {}
    for sl in s.slices:
        key = (sl["spec"]["driver"], sl["spec"]["pool"]["name"])
        present[key] = present.get(key, 0) + 1
    return {sl["spec"]["nodeName"]: "/".join(key) for sl in s.slices
            for key in [(sl["spec"]["driver"], sl["spec"]["pool"]["name"])]
            if sl["spec"]["pool"]["resourceSliceCount"] > present[key]}  # fmt: skip


def _could_hold(raw: Mapping[str, Any], asked: Mapping[str, Any], driver: str, resolved: bool) -> bool:
    """Whether a device can take a request's capacity on its own (the requestPolicy read directly);
    ``resolved``: request names resolved against the device's driver (1.38)."""
    published = raw.get("capacity", {})
    names = {name: _published_name(name, published, driver, resolved) for name in asked}
    if None in names.values():
        return False
    requests = {names[name]: v for name, v in asked.items()}
    if requests and not raw.get("allowMultipleAllocations"):
        return all(name in published and parse_quantity(v).value <= parse_quantity(published[name]["value"]).value
                   for name, v in requests.items())  # fmt: skip
    if any(name not in published for name in requests):
        return False
    for name, entry in published.items():
        total, policy = parse_quantity(entry["value"]).value, entry.get("requestPolicy") or {}
        asked = requests.get(name) or policy.get("default")
        if asked is None:
            continue  # the whole capacity, which always fits
        want = parse_quantity(asked).value
        rng, values = policy.get("validRange"), policy.get("validValues")
        if rng:
            low = parse_quantity(rng.get("min", "0")).value
            want = max(want, low)
            if rng.get("step"):
                step = parse_quantity(rng["step"]).value
                want = low + -((low - want) // step) * step
            if rng.get("max") and want > parse_quantity(rng["max"]).value:
                return False
        elif values:
            fitting = sorted(v for v in (parse_quantity(x).value for x in values) if v >= want)
            if not fitting:
                return False
            want = fitting[0]
        if want > total:
            return False
    return True


def check_unsatisfiable_request(s: scenarios.Scenario, request: str, nodes: Sequence[str],
                                rules: SchedulerRules | None = None) -> list[str]:
    """Problems if the engine's "no node can satisfy ``request``" is wrong: a node with enough
    devices for one of its alternatives, judged from the spec (selectors, taints, capacity, what
    other claims' shares consume of a device used alone, and from 1.38 on, exclusive devices other
    claims still hold shares of)."""
    rules = rules or SchedulerRules()
    in_use = set(_held_by_shares(s)) if rules.shares_block_exclusive else set()
    inventory = build_inventory(s.slices)
    raw = {(sl["spec"]["driver"], sl["spec"]["pool"]["name"], d["name"]): d
           for sl in s.slices for d in sl["spec"].get("devices", [])}  # fmt: skip
    classes = {c["metadata"]["name"]: c for c in s.classes}
    req = next((r for r in s.claim["spec"]["devices"]["requests"] if r["name"] == request), None)
    if req is None:
        return [f"names request {request}, which the claim does not have"]
    problems = []
    for body in [req["exactly"]] if "exactly" in req else req["firstAvailable"]:
        exprs = [x["cel"]["expression"] for x in classes[body["deviceClassName"]]["spec"].get("selectors", [])
                 + body.get("selectors", [])]  # fmt: skip
        wanted = body.get("capacity", {}).get("requests", {})
        for node in nodes:
            fit = [d for d in inventory.devices if d.node_name == node and inventory.pool_of(d).usable
                   and _matches(exprs, d, rules) is None
                   and not _blocking_taints(raw[d.key], body.get("tolerations", []), _rule_taints(s, d.key))
                   and _could_hold(raw[d.key], wanted, d.key[0], rules.qualified_names)
                   and (raw[d.key].get("allowMultipleAllocations")
                        or (d.key not in in_use and not _shares_leave_too_little(s, d.key, raw[d.key], wanted)))]  # fmt: skip
            if len(fit) >= body.get("count", 1):
                problems.append(f"says no node can satisfy request {request}, but {node} has {len(fit)} devices "
                                f"for {body.get('name', request)} (count {body.get('count', 1)})")  # fmt: skip
    return problems


def _distinct_136_violations(s: scenarios.Scenario, allocation: Mapping[str, Any]) -> list[str]:
    """The 1.36 distinctAttribute rule replayed over the results in order (the order the scheduler
    added them): each device against the latest device of every request."""
    raw_devices = {(sl["spec"]["driver"], sl["spec"]["pool"]["name"], d["name"]): (sl, d)
                   for sl in s.slices for d in sl["spec"].get("devices", [])}  # fmt: skip
    problems = []
    for c in s.claim["spec"]["devices"].get("constraints", []):
        if "distinctAttribute" not in c:
            continue
        scope = set(c.get("requests", []))
        last: dict[str, str] = {}  # request name -> the attribute value its latest device added
        for res in allocation.get("devices", {}).get("results", []):
            request = str(res["request"])
            base = request.partition("/")[0]
            if scope and base not in scope and request not in scope:
                continue
            sl, raw = raw_devices[(res["driver"], res["pool"], res["device"])]
            value = json.dumps(_attribute(raw, sl["spec"]["driver"], c["distinctAttribute"]))
            if value == "null" or value in last.values():
                problems.append(f"{res['device']}: {c['distinctAttribute']} {value} repeats {last}")
            last[base] = value
    return problems


def _wait(what: str, probe: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
