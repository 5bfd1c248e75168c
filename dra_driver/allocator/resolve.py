"""Resolve one claim: the entry point of the engine, and the allocation result it writes.

The engine is a pure library: inputs are API-shaped dicts (``resource.k8s.io/v1`` JSON), the output
is a ``status.allocation`` dict plus an :class:`Explanation`. Its search mirrors the scheduler's
structured allocator: requests in order, firstAvailable subrequests in order, devices in (pool,
slice, device) order, first fit with backtracking, devices of one request chosen as combinations
(never permutations). Devices from incomplete or invalid pools are not allocated; an ``All``
request fails when a pool is incomplete or invalid. Differences (documented): pools are ordered by
(driver, name) where the scheduler uses map order; shareIDs are deterministic UUIDs; when a node
list is not given, nodes are the ones named by slices (or one anonymous node that only matches
``allNodes`` / node-selector slices).
"""

from __future__ import annotations

import uuid
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.allocator.capacity import capacities, rounding_note, status_name
from dra_driver.allocator.context import SCHEDULER_ABORTS, Abort, Ctx
from dra_driver.allocator.explanation import Explanation, ResultNote
from dra_driver.allocator.funnel import evaluate_selectors, explain_failure, funnel
from dra_driver.allocator.groups import Group
from dra_driver.allocator.inventory import (
    AllocatedState,
    Device,
    Inventory,
    Prebuilt,
    allocated_state,
    build_inventory,
    key_str,
)
from dra_driver.allocator.requests import Alt, parse_constraints, parse_requests, prepare_alt
from dra_driver.allocator.rules import SchedulerRules
from dra_driver.allocator.search import MAX_RESULTS, SHARE_NS, Search
from dra_driver.k8s.bodies import DeviceClasses, RawDeviceClass, RawSlice
from dra_driver.k8s.claims import classes_by_name
from dra_driver.k8s.objects import Node, as_list, as_mapping, as_str
from dra_driver.k8s.quantity import Quantity

# =========================================================================== resolution


@dataclass
class Resolution:
    allocation: dict[str, Any] | None
    explanation: Explanation
    node: str | None = None

    @property
    def allocated(self) -> bool:
        return self.allocation is not None


class Engine:
    """The engine's three entry points as one object, so a caller can be handed another (a spy in
    tests) where it would otherwise call the module's functions."""

    def build_inventory(self, slices: Iterable[RawSlice], previous: Inventory | None = None,
                        prebuilt: Prebuilt | None = None) -> Inventory:
        """``previous``: an inventory built before, whose per-device work may be reused;
        ``prebuilt``: pools digested as the slices arrived."""
        return build_inventory(slices, previous, prebuilt)

    def allocated_state(self, claims: Iterable[Mapping[str, Any]], exclude_uid: str | None = None) -> AllocatedState:
        return allocated_state(claims, exclude_uid)

    def resolve(self, claim: Mapping[str, Any], inventory: Inventory,
                classes: DeviceClasses | Iterable[RawDeviceClass], allocated: AllocatedState | None = None,
                nodes: Sequence[Any] | None = None, rules: SchedulerRules | None = None) -> Resolution:
        return resolve(claim, inventory, classes, allocated, nodes, rules)

    def allocate(self, claim: Mapping[str, Any], inventory: Inventory,
                 classes: DeviceClasses | Iterable[RawDeviceClass], allocated: AllocatedState | None = None,
                 nodes: Sequence[Any] | None = None, rules: SchedulerRules | None = None,
                 skip_before: int = 0) -> dict[str, Any] | None:
        return allocate(claim, inventory, classes, allocated, nodes, rules, skip_before)

    def prime(self, inventory: Inventory, class_name: str, classes: DeviceClasses) -> None:
        prime(inventory, class_name, classes)


def prime(inventory: Inventory, class_name: str, classes: DeviceClasses) -> None:
    """Group the inventory's devices the way a request for one device of ``class_name``, with no
    selectors of its own (the commonest claim), groups them: at 5,000 nodes that is a few tenths of
    a second the first such claim then does not wait for."""
    request = {"name": "prime", "exactly": {"deviceClassName": class_name, "count": 1}}
    resolve({"metadata": {"name": f"prime-{class_name}"}, "spec": {"devices": {"requests": [request]}}},
            inventory, classes)


def resolve(
    claim: Mapping[str, Any],
    inventory: Inventory,
    classes: DeviceClasses | Iterable[RawDeviceClass],
    allocated: AllocatedState | None = None,
    nodes: Sequence[Any] | None = None,
    rules: SchedulerRules | None = None,
) -> Resolution:
    """Allocate ``claim`` like the kube-scheduler would; never raises on bad input.

    ``rules``: the scheduler version to decide as where versions differ (the newest by default)."""
    claim = as_mapping(claim)
    explanation = Explanation(claim=_label(claim), pools=list(inventory.problems))
    try:
        return _resolve(claim, inventory, classes_by_name(classes), allocated or AllocatedState(), nodes, explanation,
                        rules or SchedulerRules())
    except Exception as exc:  # last resort: bad input must not crash callers (the explanation names it)
        explanation.errors.append(f"internal error: {type(exc).__name__}: {exc}")
        return Resolution(None, explanation)


def allocate(
    claim: Mapping[str, Any],
    inventory: Inventory,
    classes: DeviceClasses | Iterable[RawDeviceClass],
    allocated: AllocatedState | None = None,
    nodes: Sequence[Any] | None = None,
    rules: SchedulerRules | None = None,
    skip_before: int = 0,
) -> dict[str, Any] | None:
    """The allocation :func:`resolve` makes for ``claim``, without its explanation: None where it
    may not allocate (then :func:`resolve` says why, and may still allocate: callers ask it).

    ``skip_before``: with ``nodes`` None, a position in the inventory's node list before which the
    caller knows no node fits the claim (none did with fewer devices taken: taking more never
    makes room), searched again only where the search must reach every node (see ``_resolve``).

    The same search over the same context, less the funnel's counting (every stage of every
    request over the whole fleet, a claim's main cost at 40,000 devices), which decides nothing
    an allocation depends on: the selectors' verdicts it leaves behind (whether a CEL error was
    seen) are evaluated here too, and its early failure (:func:`_precheck`) only anticipates the
    search's. For a caller that tries many claims and explains only the one that does not fit
    (``fit``)."""
    claim = as_mapping(claim)
    explanation = Explanation(claim=_label(claim), pools=[])  # the label: a shareID's seed where the claim has no UID
    try:
        res = _resolve(claim, inventory, classes_by_name(classes), allocated or AllocatedState(), nodes, explanation,
                       rules or SchedulerRules(), explain=False, skip_before=skip_before if nodes is None else 0)
    except Exception:  # resolve() says what went wrong
        return None
    return res.allocation


def _label(claim: Mapping[str, Any]) -> str:
    meta = as_mapping(claim.get("metadata"))
    return f"{as_str(meta.get('namespace')) or 'default'}/{as_str(meta.get('name')) or '<unnamed>'}"


def _resolve(
    claim: Mapping[str, Any],
    inventory: Inventory,
    classes: DeviceClasses,
    allocated: AllocatedState,
    nodes: Sequence[Any] | None,
    explanation: Explanation,
    rules: SchedulerRules,
    *,
    explain: bool = True,
    skip_before: int = 0,
) -> Resolution:
    errors = explanation.errors
    if rules.negative_capacity_fails and allocated.invalid:
        namespace = as_str(as_mapping(claim.get("metadata")).get("namespace")) or "default"
        errors.append(negative_capacity_error(allocated, namespace))
        return Resolution(None, explanation)
    requests = parse_requests(claim, errors)
    constraints = parse_constraints(claim, errors, distinct_latest_only=rules.distinct_latest_only)
    for alts in requests:
        for alt in alts:
            prepare_alt(alt, classes)
    ctx = Ctx(claim, inventory, allocated, requests, constraints, rules)
    if not explain:
        for alts in requests:
            for alt in alts:
                evaluate_selectors(ctx, alt)
        if errors:
            return Resolution(None, explanation)
    else:
        explanation.requests = [funnel(ctx, alt) for alts in requests for alt in alts]
        if errors:
            return Resolution(None, explanation)
        _precheck(ctx, explanation)
    if explanation.errors:
        explain_failure(ctx, explanation)
        return Resolution(None, explanation)
    node_list = as_nodes(nodes, inventory)
    reasons: Counter[str] = Counter()
    passed_over: set[int] = set()  # positions of nodes the best node is not chosen from
    tried_lists: set[tuple[int, ...]] = set()
    # The scheduler filters every candidate node and one fatal error anywhere fails the pod, so
    # a success only counts once no other node can produce such an error.  Only All requests
    # and CEL runtime errors can; other claims keep the first-fit shortcut.
    fatal_possible = (any(a.mode == "All" for alts in requests for a in alts) or ctx.cel_error_seen()
                      or _fatal_by_rules(ctx))
    narrow = None if fatal_possible else node_filter(ctx, whole_list=nodes is None)
    visit: Sequence[int] = narrow.visit if narrow is not None and narrow.visit is not None else range(len(node_list))
    if skip_before and narrow is not None:  # first fit: the nodes before the first that fits are not looked at
        visit = visit[bisect_left(visit, skip_before):]
    found: tuple[Search, Node, int] | None = None
    last = -1
    for pos in visit:
        if pos > last + 1:  # nodes not visited: too few devices their selectors accept
            reasons[NOT_ENOUGH] += pos - last - 1
        last = pos
        node, number = node_list[pos], pos + 1
        if narrow is not None and node.name in inventory.local and not narrow.may_fit(node):
            reasons[NOT_ENOUGH] += 1
            continue
        devices = inventory.devices_on(node)
        if node.name is not None and not any(d.node_name for d in devices) and tuple(d.index for d in devices) in tried_lists:
            reasons["same devices as an earlier node"] += 1
            passed_over.add(pos)
            continue
        tried_lists.add(tuple(d.index for d in devices))
        search = Search(ctx, node, devices)
        try:
            ok = search.run()
        except Abort as exc:
            if exc.fatal:
                where = f"node {node.name}" if node.name else "a node"
                explanation.errors.append(f"{exc} (on {where}; {SCHEDULER_ABORTS} on this error, "
                                          "so no other node is used either)")  # fmt: skip
                explanation.failure = {k: v for k, v in (("request", exc.request), ("selector", exc.selector),
                                                         ("device", key_str(exc.device) if exc.device else None)) if v}
                explanation.nodes = {"tried": number, "reasons": dict(reasons)}
                if explain:
                    explain_failure(ctx, explanation)
                return Resolution(None, explanation)
            reasons[str(exc)] += 1
            passed_over.add(pos)
            continue
        if ok:
            found = found or (search, node, number)
            if not fatal_possible:
                break
            continue
        reasons[NOT_ENOUGH if devices else "no devices on node"] += 1
    if found is not None:
        search, node, number = found
        explanation.nodes = {"tried": number, "reasons": dict(reasons)}
        return _success(ctx, search, node, explanation)
    if not explain:
        return Resolution(None, explanation)
    if len(node_list) > last + 1:
        reasons[NOT_ENOUGH] += len(node_list) - last - 1
    explanation.nodes = {"tried": len(node_list), "reasons": dict(reasons)}
    best = _best_node(ctx, node_list, passed_over)
    if best is not None:
        explanation.nodes["best"] = {"node": best[1], "selector_matches": best[0]}
    explain_failure(ctx, explanation)
    return Resolution(None, explanation)


NOT_ENOUGH = "not enough suitable devices"


def as_nodes(nodes: Sequence[Any] | None, inventory: Inventory) -> list[Node]:
    """The nodes a claim is resolved for: those given (names or Node objects), else the inventory's."""
    if nodes is None:
        return inventory.nodes

    out: list[Node] = []
    for n in nodes:
        if isinstance(n, str):
            out.append(Node(n))
        else:
            meta = as_mapping(as_mapping(n).get("metadata"))
            labels = {str(k): str(v) for k, v in as_mapping(meta.get("labels")).items()}
            out.append(Node(as_str(meta.get("name")), tuple(sorted(labels.items()))))
    return out


def negative_capacity_error(allocated: AllocatedState, namespace: str) -> str:
    """What kube-scheduler 1.38 says while claims with a negative consumedCapacity are allocated
    (``allocateddevices.go``): the first of their complaints, by text. A claim of ``namespace``
    (the one being resolved) is named; one of another namespace is not, as everywhere the engine
    explains (its author may not see that namespace)."""
    complaints = sorted(text if owner.partition("/")[0] == namespace
                        else text.replace(f"claim {owner},", "a claim in another namespace,", 1)
                        for owner, text in allocated.invalid.items())
    more = f" (and {len(complaints) - 1} more claims with invalid consumed capacity)" if len(complaints) > 1 else ""
    return (f"gather allocation state: {complaints[0]}{more}; {SCHEDULER_ABORTS} for every claim while that "
            "claim is allocated (kube-scheduler 1.38, DRAConsumableCapacity on): fix or delete it")


def _fatal_by_rules(ctx: Ctx) -> bool:
    """Whether the 1.38 rules may end the attempt on some node: a constraint over devices whose
    attributes do not all convert cleanly (an attribute it cannot compare), or a request naming a
    capacity both unqualified and qualified."""
    rules = ctx.rules
    if rules.constraint_type_errors and ctx.constraints and ctx.inventory.unclean:
        return True
    if rules.qualified_names:
        for alts in ctx.requests:
            for alt in alts:
                short = {n for n in alt.capacity if "/" not in n}
                if any("/" in n and n.partition("/")[2] in short for n in alt.capacity):
                    return True
    return False


@dataclass
class NodeFilter:
    """Which nodes can fit, known before searching any (see :func:`node_filter`)."""

    may_fit: Callable[[Node], bool]
    # Positions in the inventory's node list worth visiting, in order: the nodes with as many
    # devices as every request asks for that its selectors accept (in use or not), and the nodes
    # without allocatable devices (the search tells those apart). None: visit every node.
    visit: list[int] | None


def node_filter(ctx: Ctx, whole_list: bool) -> NodeFilter | None:
    """A cheap test that a node can fit the claim: every request has, among the node's devices,
    as many as it asks for that its selectors accept and that are not in use (the search's own two
    first checks). A node it turns down would fail the search too; the search still decides on
    every node it lets through. Like the kube-scheduler, which filters nodes before its allocator
    runs, this spares the search the nodes that cannot fit. ``whole_list``: the claim is resolved
    over the inventory's own node list (the nodes to visit are then known in advance).

    None where turning a node down without a search could change the outcome: devices not bound
    to a node (every node sees them), a broken request or the claim's result limit (the search
    fails the claim on the first node it tries), ``All`` requests and CEL errors (checked by the
    caller: the search must reach every node).
    """
    inventory = ctx.inventory
    if inventory.shared or sum(min(a.count for a in alts) for alts in ctx.requests) > MAX_RESULTS:
        return None
    if any(a.error or a.mode != "ExactCount" for alts in ctx.requests for a in alts):
        return None
    devices = inventory.devices
    allocated = ctx.taken_keys()
    # Per request, per alternative: how many it asks for, whether in-use devices count (admin
    # access), and the devices its selectors accept, by node (and in groups, for visit below).
    accepted: list[list[tuple[int, bool, list[dict[str, list[Device]]]]]] = []
    groups: list[list[tuple[int, list[Group], dict[str, list[Device]]]]] = []
    for alts in ctx.requests:
        entries, grouped = [], []
        for alt in alts:
            part = ctx.partition(alt)
            single = inventory.unclean if part is not None else [d for p in inventory.pools if p.usable for d in p.devices]
            passing = [grp for g, grp in enumerate(part.groups) if ctx.group_verdict(alt, part, g) is None] if part else []
            alone: dict[str, list[Device]] = {}
            for d in single:
                if ctx.verdict(alt, d) is None:
                    alone.setdefault(d.node_name or "", []).append(d)
            by_node = [grp.by_node(devices) for grp in passing] + ([alone] if alone else [])
            entries.append((alt.count, alt.admin, by_node))
            grouped.append((alt.count, passing, alone))
        accepted.append(entries)
        groups.append(grouped)

    def may_fit(node: Node) -> bool:
        name = node.name or ""
        for entries in accepted:
            for count, admin, by_node in entries:
                n = 0
                for candidates in by_node:
                    for d in candidates.get(name, ()):
                        if admin or d.allow_multi or d.key not in allocated:
                            n += 1
                    if n >= count:
                        break
                if n >= count:
                    break
            else:
                return False
        return True

    visit = None
    if whole_list:
        positions = inventory.node_positions
        only = groups[0][0] if len(groups) == 1 and len(groups[0]) == 1 else None
        if only is not None and len(only[1]) == 1 and not only[2] and not inventory.idle_positions:
            visit = only[1][0].positions_with(only[0], devices, positions)  # the usual claim: one group of devices
        else:
            visit = _visit(inventory, groups)
    return NodeFilter(may_fit, visit)


MAX_VISITS = 256
"""The node lists an inventory keeps (:func:`_visit`): one per shape of claim."""


def _visit(inventory: Inventory, groups: list[list[tuple[int, list[Group], dict[str, list[Device]]]]]) -> list[int]:
    """The positions :class:`NodeFilter` visits, for requests whose alternatives accept the devices
    of ``groups`` (count, passing groups, devices looked at alone). Without devices looked at alone
    they depend on the groups and counts only, and are kept on the inventory: ``fit --count 1000``
    asks a thousand times, and each asked for the union and the sort of thousands of nodes."""
    key = None
    if all(not alone for grouped in groups for _, _, alone in grouped):
        key = tuple(tuple((count, tuple(map(id, passing))) for count, passing, _ in grouped) for grouped in groups)
        found = inventory.visits.get(key)
        if found is not None:
            return found[1]
    devices, positions = inventory.devices, inventory.node_positions
    able: frozenset[str] | None = None
    for grouped in groups:
        names = frozenset().union(*(_nodes_with(passing, alone, count, devices) for count, passing, alone in grouped))
        able = names if able is None else able & names
    visit = sorted([positions[n] for n in able or ()] + inventory.idle_positions)
    if key is not None:
        if len(inventory.visits) >= MAX_VISITS:
            inventory.visits.clear()  # a controller's inventory lives on: bounded
        # The groups kept with it: their ids in the key stay theirs.
        inventory.visits[key] = ([g for grouped in groups for _, passing, _ in grouped for g in passing], visit)
    return visit


def _nodes_with(passing: list[Group], alone: dict[str, list[Device]], count: int, devices: list[Device]) -> frozenset[str]:
    """The nodes with at least ``count`` devices among the groups' members and ``alone``."""
    if not alone and len(passing) == 1:
        return passing[0].nodes_with(count, devices)
    if not alone and passing:
        return passing[0].nodes_with_others(passing[1:], count, devices)
    total: Counter[str] = Counter()
    for by_node in [grp.by_node(devices) for grp in passing] + [alone]:
        for n, ds in by_node.items():
            total[n] += len(ds)
    return frozenset(n for n, c in total.items() if c >= count)


def _best_node(ctx: Ctx, node_list: list[Node], passed_over: set[int]) -> tuple[int, str | None] | None:
    """The node with the most devices that some request's selectors accept (the first of equals),
    among the nodes where the search found no fit."""
    alts = [a for alts_ in ctx.requests for a in alts_ if not a.error]
    accepted = _accepted_by_node(ctx, alts)
    best: tuple[int, str | None] | None = None
    for pos, node in enumerate(node_list):
        if pos in passed_over:
            continue
        if accepted is not None:
            usable = len(accepted.get(node.name or "", ()))
        else:
            usable = sum(1 for d in ctx.inventory.devices_on(node) if any(ctx.verdict(a, d) is None for a in alts))
        if best is None or usable > best[0]:
            best = (usable, node.name)
    return best


def _accepted_by_node(ctx: Ctx, alts: list[Alt]) -> dict[str, set[int]] | None:
    """Per node, the devices some of ``alts`` accept; None where devices are not all bound to a node."""
    inventory = ctx.inventory
    if inventory.shared:
        return None
    out: dict[str, set[int]] = {}
    for alt in alts:
        part = ctx.partition(alt)
        if part is not None:
            for g, grp in enumerate(part.groups):
                if ctx.group_verdict(alt, part, g) is None:
                    for name, ds in grp.by_node(inventory.devices).items():
                        out.setdefault(name, set()).update(d.index for d in ds)
        single = inventory.unclean if part is not None else [d for p in inventory.pools if p.usable for d in p.devices]
        for d in single:
            if ctx.verdict(alt, d) is None:
                out.setdefault(d.node_name or "", set()).add(d.index)
    return out


def _precheck(ctx: Ctx, explanation: Explanation) -> None:
    """Fail fast, without a search, on a request that no device of the cluster can satisfy.

    Only where the scheduler cannot come to another verdict first: it validates every request
    on each node before searching (an error there, an ``All`` request's sizing and the claim's
    result limit can each make it stop with an error), and it searches the requests in order,
    so a CEL runtime error in an earlier request (or in this one) stops it before it finds this
    request unsatisfiable; so can, under the 1.38 rules, a device it tries (:func:`_fatal_by_rules`).
    In any of these cases the search decides.
    """
    alternatives = [a for alts in ctx.requests for a in alts]
    if any(a.error or a.mode == "All" for a in alternatives) or _fatal_by_rules(ctx):
        return
    if sum(min(a.count for a in alts) for alts in ctx.requests) > MAX_RESULTS:
        return
    by_name = {r.request: r for r in explanation.requests}
    for alts in ctx.requests:
        infos = [by_name[a.name] for a in alts]
        if any(info.cel_errors for info in infos):
            return
        if not any(info.candidates >= a.count for a, info in zip(alts, infos, strict=True)):
            explanation.errors.append(f"request {alts[0].base}: not enough devices match")
            explanation.failure = {"request": alts[0].base}
            return


# =========================================================================== result


def _success(ctx: Ctx, search: Search, node: Node, explanation: Explanation) -> Resolution:
    uid = as_str(as_mapping(ctx.claim.get("metadata")).get("uid")) or explanation.claim
    results = []
    for n, res in enumerate(search.results):
        entry: dict[str, Any] = {"request": res.alt.name, "driver": res.dev.key[0], "pool": res.dev.key[1],
                                 "device": res.dev.key[2]}  # fmt: skip
        if res.alt.admin:
            entry["adminAccess"] = True
        if res.alt.tolerations:
            entry["tolerations"] = [dict(t) for t in res.alt.tolerations]
        note = ResultNote(res.alt.name, key_str(res.dev.key))
        if res.dev.allow_multi:
            entry["shareID"] = str(uuid.uuid5(SHARE_NS, f"{uid}/{res.alt.name}/{key_str(res.dev.key)}/{n}"))
            note.share = True
            if res.consumed:
                qualified = ctx.rules.qualified_names
                published = capacities(res.dev, qualified)
                asked = _asked(res.alt.capacity, res.dev.key[0], qualified)
                entry["consumedCapacity"] = {status_name(res.dev, k, qualified): str(v) for k, v in res.consumed.items()}
                note.consumption = [rounding_note(status_name(res.dev, k, qualified), asked.get(k), v.value,
                                                  published[k][1]) for k, v in res.consumed.items()]  # fmt: skip
        results.append(entry)
        explanation.results.append(note)
    allocation: dict[str, Any] = {"devices": {"results": results, "config": _configs(ctx, search)}}
    if not allocation["devices"]["config"]:
        del allocation["devices"]["config"]
    selector = _node_selector(search, node)
    if selector is not None:
        allocation["nodeSelector"] = selector
    explanation.allocated = True
    explanation.node = node.name
    explanation.devices = [key_str(r.dev.key) for r in search.results]
    for ri, ai in search.chosen.items():
        name = ctx.requests[ri][ai].name
        for info in explanation.requests:
            info.chosen = info.chosen or info.request == name
    return Resolution(allocation, explanation, node.name)


def _asked(requests: Mapping[str, Quantity], driver: str, qualified: bool) -> dict[str, Quantity]:
    """A request's capacity amounts keyed like :func:`capacities` of a device of ``driver``."""
    if not qualified:
        return dict(requests)
    return {name if "/" in name else f"{driver}/{name}": q for name, q in requests.items()}


def _configs(ctx: Ctx, search: Search) -> list[dict[str, Any]]:
    chosen = [ctx.requests[ri][search.chosen[ri]] for ri in range(len(ctx.requests))]
    out: list[dict[str, Any]] = []
    class_rows: dict[str, list[dict[str, Any]]] = {}
    for alt in chosen:
        if alt.class_name in class_rows:
            for row in class_rows[alt.class_name]:
                row["requests"].append(alt.name)
            continue
        rows = []
        for cfg in as_list(as_mapping(as_mapping(alt.class_obj).get("spec")).get("config")):
            row = {"source": "FromClass", "requests": [alt.name], **{k: v for k, v in as_mapping(cfg).items() if k != "requests"}}
            rows.append(row)
        class_rows[alt.class_name] = rows
        out.extend(rows)
    for cfg in as_list(as_mapping(as_mapping(ctx.claim.get("spec")).get("devices")).get("config")):
        cfg = as_mapping(cfg)
        wanted = [r for r in as_list(cfg.get("requests")) if isinstance(r, str)]
        body = {k: v for k, v in cfg.items() if k != "requests"}
        if not wanted:
            out.append({"source": "FromClaim", **body})
            continue
        # The scheduler appends one copy per claim request the config names; mirrored.
        for alt in chosen:
            if alt.base in wanted or (alt.sub and alt.name in wanted):
                out.append({"source": "FromClaim", "requests": list(wanted), **body})
    for row in out:
        if "requests" in row and len(row["requests"]) == len(ctx.requests):
            del row["requests"]  # empty means "all requests"
    return out


def _node_selector(search: Search, node: Node) -> dict[str, Any] | None:
    fields: list[dict[str, Any]] = []
    exprs: list[dict[str, Any]] = []
    for res in search.results:
        dev = res.dev
        if dev.node_name or dev.binds_to_node:
            return {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node.name]}]}]}  # fmt: skip
        terms = as_list(as_mapping(dev.node_selector).get("nodeSelectorTerms")) if dev.node_selector else []
        if len(terms) == 1:
            for req in as_list(as_mapping(terms[0]).get("matchFields")):
                if req not in fields:
                    fields.append(req)
            for req in as_list(as_mapping(terms[0]).get("matchExpressions")):
                if req not in exprs:
                    exprs.append(req)
    term: dict[str, Any] = {}
    if exprs:
        term["matchExpressions"] = exprs
    if fields:
        term["matchFields"] = fields
    return {"nodeSelectorTerms": [term]} if term else None
