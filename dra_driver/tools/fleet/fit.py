"""``fit``: how many more of a claim, a template's claim or a pod's claims fit now, on which nodes
and on devices of which model, and the first that would not, in ``explain``'s words.

Each try is the controller's evaluation (:func:`dra_driver.controller.verdicts.evaluate`: the
engine and the opaque config's validation) under the cluster scheduler's rules, against what is
allocated now plus what the earlier tries took: existing allocations, taints, counters and shares
all count. A pod's claims must fit on one node: its first claim picks the node and the others are
tried there; where they do not fit, the whole pod is tried on each other node in turn. A
claim the pod names directly is one claim for all pods: allocated, it pins the pod to its node;
not allocated, it is fitted with the first pod only. Only devices are counted: the node's CPU,
memory, its taints and the pod's node selectors are not. Nothing is written: the tries live in
memory, and the client the command is given can only read (:class:`~dra_driver.tools.fleet.reads.ReadOnly`).

:func:`workload_fitter` is the same fit for ``migrate``'s report: each workload's pods, with the
claim each would get after the switch, against the fleet as it is now.
"""

from __future__ import annotations

import copy
import functools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, cast

import yaml

from dra_driver.allocator.devicestates import string_attribute
from dra_driver.allocator.inventory import AllocatedState, Inventory
from dra_driver.allocator.resolve import Engine
from dra_driver.allocator.rules import SchedulerRules
from dra_driver.controller.verdicts import Verdict, claim_config_errors, evaluate
from dra_driver.k8s.bodies import DeviceClasses, RawBody, RawDeviceClass
from dra_driver.k8s.claims import classes_by_name, device_ids, is_allocated, status_of
from dra_driver.k8s.client import CLAIM_TEMPLATES, CLAIMS, PODS, ApiError, KubeApi
from dra_driver.k8s.objects import as_mapping, as_mappings, meta
from dra_driver.tools.explain.command import rules_for
from dra_driver.tools.explain.drivers import claim_drivers
from dra_driver.tools.fleet.args import FitTarget, FleetError
from dra_driver.tools.fleet.reads import ReadApi, ReadOnly, read_fleet
from dra_driver.tools.migrate.workloads import FitAsk, FitFn
from dra_driver.tools.terminal import api_error_line

MAX_COUNT = 100_000


@dataclass
class Unit:
    """What one more of the thing asked about needs: the claims to allocate (fresh copies for
    each try), and the node it is pinned to by a claim already allocated."""

    label: str
    claims: list[dict[str, Any]]
    once: list[dict[str, Any]]
    """A pod's named, unallocated claims: allocated with the first try only."""
    held: frozenset[tuple[str, str, str]] = frozenset()
    """The devices of a pod's named claims already allocated: the pod goes where they are."""


def claim_from_document(doc: Any, source: str, namespace: str) -> dict[str, Any]:
    """A ResourceClaim (or a template's claim) from a parsed file."""
    body = as_mapping(doc)
    kind = body.get("kind")
    name = str(meta(body).get("name") or "fit")
    ns = str(meta(body).get("namespace") or namespace)
    if kind == "ResourceClaim":
        return {"metadata": {"name": name, "namespace": ns}, "spec": copy.deepcopy(dict(as_mapping(body.get("spec"))))}
    if kind == "ResourceClaimTemplate":
        return template_claim(body, ns)
    raise FleetError(f"{source}: expected a ResourceClaim or ResourceClaimTemplate, got kind {kind!r}")


def template_claim(template: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    spec = as_mapping(as_mapping(as_mapping(template.get("spec"))).get("spec"))
    return {"metadata": {"name": str(meta(template).get("name") or "fit"), "namespace": namespace},
            "spec": copy.deepcopy(dict(spec))}


def parse_file(text: str, source: str, namespace: str) -> dict[str, Any]:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise FleetError(f"{source}: not YAML or JSON: {' '.join(str(exc).split())}") from None
    if len(docs) != 1:
        raise FleetError(f"{source}: expected one ResourceClaim or ResourceClaimTemplate, found {len(docs)} documents")
    return claim_from_document(docs[0], source, namespace)


def read_unit(api: ReadApi, target: FitTarget, file_text: str | None, classes: Sequence[RawDeviceClass],
              claims: Sequence[RawBody], driver: str) -> Unit:
    """What one more of ``target`` needs (reads the template, or the pod and its claims). FleetError for
    an object not there, one of another driver, a pod with no claim of the driver."""
    class_map = classes_by_name(classes)
    if target.kind == "file":
        unit = Unit(target.name, [parse_file(file_text or "", target.name, target.namespace)], [])
    elif target.kind == "template":
        unit = Unit(f"ResourceClaimTemplate {target.namespace}/{target.name}",
                    [template_claim(_get(api, CLAIM_TEMPLATES, target), target.namespace)], [])
    else:
        return _pod_unit(api, target, class_map, claims, driver)
    for claim in unit.claims:
        _own(claim, class_map, driver, unit.label)
    return unit


def _get(api: ReadApi, res: Any, target: FitTarget) -> dict[str, Any]:
    try:
        return dict(api.get(res, target.name, namespace=target.namespace))
    except ApiError as exc:
        if exc.not_found:
            raise FleetError(f"{res.kind} {target.namespace}/{target.name} not found") from None
        raise


def _own(claim: Mapping[str, Any], class_map: DeviceClasses, driver: str, label: str) -> None:
    drivers = claim_drivers(claim, class_map)
    if drivers and driver not in drivers:
        raise FleetError(f"{label} is a claim of {', '.join(sorted(drivers))}, not of {driver}")


def _pod_unit(api: ReadApi, target: FitTarget, class_map: DeviceClasses,
              claims: Sequence[RawBody], driver: str) -> Unit:
    pod = _get(api, PODS, target)
    unit = Unit(f"pod {target.namespace}/{target.name}", [], [])
    allocations = {f"{meta(c).get('namespace')}/{meta(c).get('name')}": c for c in claims}
    other = 0
    for rc in as_mappings(as_mapping(pod.get("spec")).get("resourceClaims")):
        if rc.get("resourceClaimTemplateName"):
            template = _get(api, CLAIM_TEMPLATES, FitTarget("template", target.namespace,
                                                              str(rc["resourceClaimTemplateName"])))
            claim = template_claim(template, target.namespace)
            drivers = claim_drivers(claim, class_map)
            if drivers and driver not in drivers:
                other += 1
                continue
            unit.claims.append(claim)
        elif rc.get("resourceClaimName"):
            ref = FitTarget("claim", target.namespace, str(rc["resourceClaimName"]))
            named = allocations.get(f"{ref.namespace}/{ref.name}")
            if named is not None and is_allocated(named):
                ids = device_ids(status_of(named).get("allocation"))
                if ids and all(d != driver for d, _, _ in ids):
                    other += 1
                unit.held |= ids
                continue
            claim = _get(api, CLAIMS, ref)
            drivers = claim_drivers(claim, class_map)
            if drivers and driver not in drivers:
                other += 1
                continue
            unit.once.append({"metadata": {"name": ref.name, "namespace": ref.namespace},
                              "spec": copy.deepcopy(dict(as_mapping(claim.get("spec"))))})
    if not unit.claims and not unit.once:
        why = (f"its {other} claim(s) are another driver's" if other
               else "its claims are allocated already, shared by every pod that names them" if unit.held
               else "it has no ResourceClaim to allocate")
        raise FleetError(f"{unit.label}: nothing of {driver} to fit ({why})")
    return unit


def merge(state: AllocatedState, added: AllocatedState) -> None:
    """``added``'s holdings into ``state``, as if its claims had been among those listed."""
    state.devices |= added.devices
    for mine, theirs in ((state.shared, added.shared), (state.shared_qualified, added.shared_qualified)):
        for key, used in theirs.items():
            have = mine.setdefault(key, {})
            for name, value in used.items():
                have[name] = have.get(name, Fraction(0)) + value
    for key, owners in added.consumers.items():
        state.consumers.setdefault(key, []).extend(owners)
    state.invalid.update(added.invalid)


def _named(claim: Mapping[str, Any], index: int) -> dict[str, Any]:
    m = meta(claim)
    name = f"{m.get('name') or 'fit'}-fit-{index}"
    return {"metadata": {"name": name, "namespace": m.get("namespace") or "default", "uid": f"fit-{index}-{name}"},
            "spec": claim.get("spec") or {}}


def fit_report(unit: Unit, count: int, *, inventory: Inventory, classes: Sequence[RawDeviceClass], claims: Sequence[RawBody],
               engine: Engine, rules: SchedulerRules, driver: str) -> dict[str, Any]:
    """The document ``fit -o json`` prints (docs/fleet.md): ``fits`` of ``count``, by node and by
    model, and the first that did not fit (its claim, the summary and the engine's explanation)."""
    class_map = classes_by_name(classes)
    state = engine.allocated_state(claims)
    pinned = next((n for k in sorted(unit.held) if (dev := inventory.by_key.get(k)) and (n := dev.node_name)), None)
    by_node: Counter[str] = Counter()
    by_model: Counter[str] = Counter()
    first_failure: dict[str, Any] | None = None
    fits = 0
    many = len(unit.claims) + len(unit.once) > 1
    # One claim, on any node: the nodes before the one the last try took fitted none of the tries
    # so far, and each try only takes more, so the next try's search starts there.
    first_fit = 0
    for i in range(count):
        claims_now = [*unit.claims, *(unit.once if i == 0 else [])]
        tried = _try(claims_now, i, pinned, state, many, engine=engine, inventory=inventory, classes=class_map,
                     driver=driver, rules=rules, skip_before=first_fit if len(claims_now) == 1 else 0)
        if isinstance(tried, dict) and many and pinned is None and tried.get("node"):
            # The node the first claim picked has no room for the others: as the scheduler, try the others.
            for other in inventory.node_names:
                if other == tried["node"]:
                    continue
                again = _try(claims_now, i, other, state, many, engine=engine, inventory=inventory, classes=class_map,
                             driver=driver, rules=rules)
                if not isinstance(again, dict):
                    tried = again
                    break
        if isinstance(tried, dict):
            first_failure = tried
            break
        state, placed, taken = tried
        fits += 1
        if len(claims_now) == 1 and pinned is None and placed is not None:
            first_fit = inventory.node_positions.get(placed, 0)
        by_node[placed or "<any node>"] += 1
        for key in taken:
            dev = inventory.by_key.get(key)
            by_model[(string_attribute(dev, "productName") or "unknown") if dev is not None else "unknown"] += 1
    report: dict[str, Any] = {
        "kind": "GpuFit", "target": unit.label, "rules": rules.label, "asked": count, "fits": fits,
        "nodes": dict(sorted(by_node.items())), "models": dict(sorted(by_model.items())),
    }
    if first_failure is not None:
        report["firstFailure"] = first_failure
    return report


Tried = tuple[AllocatedState, str | None, list[tuple[str, str, str]]] | dict[str, Any]


def _try(claims: Sequence[Mapping[str, Any]], index: int, node: str | None, state: AllocatedState, copy_state: bool, *,
         engine: Engine, inventory: Inventory, classes: DeviceClasses, driver: str,
         rules: SchedulerRules, skip_before: int = 0) -> Tried:
    """Try ``index`` (on ``node``, else where its first claim goes): the state with its claims
    allocated, its node and devices; or the failure (its claim, summary and explanation).
    ``skip_before``: see :func:`dra_driver.allocator.resolve.allocate`, for the first claim."""
    trial = copied(state) if copy_state else state
    taken: list[tuple[str, str, str]] = []
    for claim in claims:
        attempt = _named(claim, index)
        placed = _allocation(attempt, node, trial, engine=engine, inventory=inventory, classes=classes, driver=driver,
                             rules=rules, skip_before=skip_before if not taken else 0)
        if "devices" not in placed:
            return {"try": index + 1, **placed, **({"node": node} if node else {})}
        merge(trial, engine.allocated_state([{**attempt, "status": {"allocation": placed}}]))
        ids = sorted(device_ids(placed))
        taken += ids
        node = node or next((n for k in ids if (dev := inventory.by_key.get(k)) and (n := dev.node_name)), None)
    return trial, node, taken


def _allocation(attempt: dict[str, Any], node: str | None, state: AllocatedState, *, engine: Engine,
                inventory: Inventory, classes: DeviceClasses, driver: str,
                rules: SchedulerRules, skip_before: int = 0) -> dict[str, Any]:
    """The claim's allocation (``devices``, the node selector), or why it does not fit (its claim,
    state, summary and text). The engine allocates without explaining (a try's cost at 40,000
    devices was the explanation it did not need); only a claim it does not allocate, or one whose
    configuration is invalid, goes through the controller's whole evaluation, which decides."""
    nodes = [node] if node else None
    if not claim_config_errors(attempt, classes, driver):
        allocation = engine.allocate(attempt, inventory, classes, state, nodes, rules, skip_before)
        if allocation is not None:
            return allocation
    outcome = evaluate(engine, attempt, inventory, classes, state, driver=driver, nodes=nodes, rules=rules)
    if outcome.verdict is Verdict.SATISFIABLE and outcome.allocation is not None:
        return outcome.allocation
    return {"claim": f"{meta(attempt)['namespace']}/{meta(attempt)['name']}",
            "state": "invalid-config" if outcome.verdict is Verdict.INVALID_CONFIG else "unsatisfiable",
            "summary": outcome.summary, "text": outcome.text}


def copied(state: AllocatedState) -> AllocatedState:
    """A copy of ``state`` that the next claim's holdings can be merged into (a deep copy's
    content: keys and quantities are immutable; it took a pod's try tens of ms at 30,000 claims)."""
    return AllocatedState(set(state.devices), {k: dict(v) for k, v in state.shared.items()},
                          {k: dict(v) for k, v in state.shared_qualified.items()},
                          {k: list(v) for k, v in state.consumers.items()}, dict(state.invalid))


def render_fit(report: Mapping[str, Any]) -> str:
    lines = [f"{report['fits']} of {report['asked']} more of {report['target']} fit now"]
    nodes = cast(Mapping[str, int], report.get("nodes") or {})
    if nodes:
        lines.append("on nodes: " + ", ".join(f"{n} ({c})" for n, c in nodes.items()))
    models = cast(Mapping[str, int], report.get("models") or {})
    if models:
        lines.append("devices: " + ", ".join(f"{m} x{c}" for m, c in models.items()))
    failure = report.get("firstFailure")
    if failure:
        where = f" on node {failure['node']}" if failure.get("node") else ""
        label = "invalid configuration" if failure["state"] == "invalid-config" else "unsatisfiable"
        lines += ["", f"try {failure['try']} does not fit{where}: claim {failure['claim']}",
                  f"{label}: {failure['summary']}"]
        text = str(failure.get("text") or "").rstrip()
        if text and text != failure["summary"]:
            lines += ["", text]
    lines += ["", f"rules: {report['rules']}"]
    if report.get("rulesWarning"):
        lines.append(f"warning: {report['rulesWarning']}")
    return "\n".join(lines)



# --- a workload, for migrate ---------------------------------------------------------------------


def _nodes_text(nodes: Mapping[str, int]) -> str:
    return ", ".join(f"{n} ({c})" for n, c in nodes.items())


def workload_fit(ask: FitAsk, *, inventory: Inventory, classes: Sequence[RawDeviceClass], claims: Sequence[RawBody],
                 engine: Engine, rules: SchedulerRules, driver: str) -> str:
    """Whether ``ask``'s pods fit now, and where, in a few words: ``yes, all 3 pods, on node-a (2), node-b (1)``;
    ``no: 1 of 3 pods fit (on node-a (1)); the next: <summary>``; a DaemonSet's pod, one node at a time."""
    m = meta(ask.workload)
    claim = {"metadata": {"name": str(m.get("name") or "workload"), "namespace": str(m.get("namespace") or "default")},
             "spec": {"devices": {"requests": [copy.deepcopy(r) for r in ask.requests]}}}
    known = [*classes, *cast(Sequence[RawDeviceClass], ask.classes)]  # the planned class wins over one of its name
    if ask.pods is None:
        class_map = classes_by_name(known)
        state = engine.allocated_state(claims)
        nodes = list(inventory.node_names)
        fits = [n for n in nodes if not isinstance(_try([claim], 0, n, state, True, engine=engine, inventory=inventory,
                                                        classes=class_map, driver=driver, rules=rules), dict)]
        return f"one pod on each node: fits on {len(fits)} of {len(nodes)} nodes" + (f" ({', '.join(fits)})" if fits else "")
    if ask.pods == 0:
        return "no pods to fit (0 replicas)"
    report = fit_report(Unit(f"{m.get('namespace')}/{m.get('name')}", [claim], []), ask.pods, inventory=inventory,
                        classes=known, claims=claims, engine=engine, rules=rules, driver=driver)
    where = _nodes_text(report["nodes"])
    if report["fits"] == ask.pods:
        return f"yes, on {where}" if ask.pods == 1 else f"yes, all {ask.pods} pods, on {where}"
    failure = report["firstFailure"]
    done = f"{report['fits']} of {ask.pods} pods fit (on {where}); the next: " if report["fits"] else ""
    return f"no: {done}{failure['summary']}"


def workload_fitter(api: KubeApi, *, driver: str, server_version: Callable[[], str] | None = None,
                    scheduler_rules: str = "auto", engine: Engine | None = None) -> FitFn:
    """:func:`workload_fit` over the fleet as ``api`` reads it (through :class:`ReadOnly`, once, at
    the first workload asked about), with the rules of the cluster's scheduler. Where the fleet
    cannot be read, each answer says why instead."""
    reader = ReadOnly(api, server_version)
    resolver = engine or Engine()

    @functools.cache
    def fleet_now() -> FitFn:
        try:
            objects, inventory = read_fleet(reader, None, engine=resolver, pods=False)
        except ApiError as exc:
            why = f"not computed: {api_error_line(exc)}"
            return lambda _ask: why
        rules, _ = rules_for(scheduler_rules, reader.server_version)
        return lambda ask: workload_fit(ask, inventory=inventory, classes=objects.classes, claims=objects.claims,
                                        engine=resolver, rules=rules, driver=driver)

    return lambda ask: fleet_now()(ask)
