"""Resolve a ResourceClaim against ResourceSlices with the kube-scheduler's semantics.

A pure library: inputs are API-shaped dicts (``resource.k8s.io/v1`` JSON), the
output is a ``status.allocation`` dict plus an :class:`Explanation`.

The search mirrors the scheduler's structured allocator: requests in order,
firstAvailable subrequests in order, devices in (pool, slice, device) order,
first fit with backtracking, devices of one request chosen as combinations
(never permutations).  Devices from incomplete or invalid pools are not
allocated; an ``All`` request fails when a pool is incomplete or invalid.
Differences (documented): pools are ordered by (driver, name) where the
scheduler uses map order; shareIDs are deterministic UUIDs; when a node list
is not given, nodes are the ones named by slices (or one anonymous node that
only matches ``allNodes`` / node-selector slices).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dra_driver.cel_env import (
    CelCompileError,
    CelError,
    CelRuntimeError,
    CompiledSelector,
    DeviceActivation,
    SemverError,
    compile_selector,
    device_activation,
    parse_semver,
)
from dra_driver.explanation import CandidateNote, CelIssue, Explanation, RequestExplanation, StageCount
from dra_driver.quantity import Quantity, QuantityError, parse_quantity

__all__ = [
    "MAX_RESULTS",
    "MAX_SEARCH_STEPS",
    "SCHEDULER_ABORTS",
    "AllocatedState",
    "Device",
    "Inventory",
    "Pool",
    "Resolution",
    "allocated_state",
    "benchmark_resolve",
    "build_inventory",
    "resolve",
    "synthetic_slices",
]

MAX_RESULTS = 32  # AllocationResultsMaxSize
MAX_SEARCH_STEPS = 50_000  # allocateOne calls per claim before giving up as "too complex"
MAX_CLOSEST = 5
# Marks explanation errors that the scheduler reports as SchedulerError (not Unschedulable).
SCHEDULER_ABORTS = "the kube-scheduler stops the whole scheduling attempt"
DeviceKey = tuple[str, str, str]
_SHARE_NS = uuid.UUID("6f1d1c2e-5b7a-4c0e-9d51-2f0a4c7b9e11")


# =========================================================================== helpers


_EMPTY: Mapping[str, Any] = {}


def _dict(value: Any) -> Mapping[str, Any]:
    # Decoded JSON is made of plain dicts; checking for them first skips the slow ABC isinstance
    # (a third of the inventory's digest time).
    if type(value) is dict:
        return value
    return value if isinstance(value, Mapping) else _EMPTY


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else []


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _qty(value: Any) -> Quantity | None:
    try:
        return parse_quantity(value)
    except QuantityError:
        return None


def _key_str(key: DeviceKey) -> str:
    return "/".join(key)


def _fq(name: str, driver: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


# =========================================================================== inventory


@dataclass
class Device:
    """One device of a (current-generation) slice, pre-digested for the search."""

    key: DeviceKey
    index: int  # position in inventory order (pool, slice, device)
    slice_name: str
    raw: Mapping[str, Any]
    attributes: dict[str, tuple[str, Any]]  # fully-qualified name -> (kind, value)
    capacity: dict[str, tuple[str, Quantity, Mapping[str, Any]]]  # fq -> (published name, value, requestPolicy)
    consumes: list[tuple[str, dict[str, Fraction]]]
    taints: list[Mapping[str, Any]]
    node_name: str | None
    all_nodes: bool
    node_selector: Mapping[str, Any] | None
    per_device_node: bool
    allow_multi: bool
    binds_to_node: bool
    problems: list[str] = field(default_factory=list)
    # True when the device's activation has no error, known without building it: a selector that
    # is a plain driver comparison is then decided from ``key`` alone (see _evaluate).
    cel_clean: bool = False
    # The CEL input, built on first use (from ``raw``, which is why slices must not be edited
    # in place once handed over): most devices never reach a CEL evaluation, since class
    # selectors of the form device.driver == "x" are answered without one.
    _activation: DeviceActivation | None = None

    @property
    def activation(self) -> DeviceActivation:
        act = self._activation
        if act is None:
            act = device_activation(self.key[0], _dict(self.raw.get("attributes")), _dict(self.raw.get("capacity")),
                                    self.allow_multi)
            self._activation = act
        return act


def _activation_source(dev: Device) -> str | None:
    """Everything a device's activation is built from, as text (None: do not compare).

    ``repr`` keeps apart what ``==`` would merge (``1``, ``1.0`` and ``True``), so equal texts
    mean identical activations.  Compared by content rather than by the slice's resourceVersion:
    an update that leaves a device alone keeps its activation, and no version is trusted.
    """
    try:
        return repr((dev.key[0], dev.raw.get("attributes"), dev.raw.get("capacity"), dev.allow_multi))
    except RecursionError:
        return None


@dataclass
class Pool:
    driver: str
    name: str
    generation: int
    slice_count: int
    slices: list[str]
    complete: bool
    invalid: str | None
    counter_sets: dict[str, dict[str, Fraction]]
    devices: list[Device] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return self.complete and self.invalid is None

    @property
    def label(self) -> str:
        return f"{self.driver}/{self.name}"


@dataclass
class Inventory:
    pools: list[Pool]
    devices: list[Device]
    by_key: dict[DeviceKey, Device]
    node_names: list[str]
    problems: list[str]
    pool_map: dict[tuple[str, str], Pool] = field(default_factory=dict)
    _local: dict[str, list[Device]] | None = None

    def devices_on(self, node: _Node) -> list[Device]:
        """Allocatable devices (usable pools) reachable from ``node``, in search order."""
        if self._local is None:
            self._local = {}
            for d in self.devices:
                if d.node_name and self._usable(d):
                    self._local.setdefault(d.node_name, []).append(d)
        local = self._local.get(node.name or "", []) if node.name else []
        shared = [d for d in self.devices if not d.node_name and self._usable(d) and _on_node(d, node)]
        if not shared:
            return local
        return sorted(local + shared, key=lambda d: d.index)

    def _usable(self, d: Device) -> bool:
        return self.pool_of(d).usable

    def pool_of(self, d: Device) -> Pool:
        return self.pool_map[(d.key[0], d.key[1])]


def build_inventory(slices: Iterable[Mapping[str, Any]], previous: Inventory | None = None) -> Inventory:
    """Group slices into pools (highest generation only) and digest their devices.

    ``previous``, an inventory built earlier (the controller's last one), lends its devices' CEL
    activations to devices whose attributes, capacity, driver and allowMultipleAllocations are
    unchanged, so a slice update costs CEL conversions only for what changed.
    """
    problems: list[str] = []
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for i, sl in enumerate(slices):
        spec = _dict(_dict(sl).get("spec"))
        driver, pool = _str(spec.get("driver")), _str(_dict(spec.get("pool")).get("name"))
        if not driver or not pool:
            problems.append(f"slice #{i} ({_slice_name(sl, i)}): missing driver or pool name, ignored")
            continue
        groups.setdefault((driver, pool), []).append({**sl, "_index": i})
    pools = [_build_pool(driver, name, members, problems) for (driver, name), members in sorted(groups.items())]
    devices: list[Device] = []
    for built in pools:
        for dev in built.devices:
            dev.index = len(devices)
            devices.append(dev)
    nodes = sorted({d.node_name for d in devices if d.node_name})
    by_key: dict[DeviceKey, Device] = {}
    for dev in devices:
        by_key.setdefault(dev.key, dev)
    if previous is not None:
        _reuse_activations(devices, previous)
    return Inventory(pools, devices, by_key, nodes, problems, {(p.driver, p.name): p for p in pools})


def _reuse_activations(devices: list[Device], previous: Inventory) -> None:
    # Only activations whose CEL context exists are worth taking over (the context is the
    # expensive part); the comparison costs ~3 us per such device.
    for dev in devices:
        old = previous.by_key.get(dev.key)
        if old is None or old._activation is None or not old._activation.has_context:
            continue
        if old.raw is dev.raw and old.allow_multi == dev.allow_multi:
            dev._activation = old._activation  # the same, unchanged object
            continue
        source = _activation_source(dev)
        if source is not None and source == _activation_source(old):
            dev._activation = old._activation


def _slice_name(sl: Any, index: int) -> str:
    return _str(_dict(_dict(sl).get("metadata")).get("name")) or f"slice-{index}"


def _build_pool(driver: str, name: str, members: list[Mapping[str, Any]], problems: list[str]) -> Pool:
    def generation(sl: Mapping[str, Any]) -> int:
        return _int(_dict(_dict(sl["spec"]).get("pool")).get("generation")) or 0

    top = max(generation(sl) for sl in members)
    current = sorted((sl for sl in members if generation(sl) == top), key=lambda s: _slice_name(s, s["_index"]))
    expected = _int(_dict(_dict(current[0]["spec"]).get("pool")).get("resourceSliceCount")) or 0
    pool = Pool(driver, name, top, expected, [_slice_name(s, s["_index"]) for s in current],
                complete=len(current) == expected, invalid=None, counter_sets={})  # fmt: skip
    if not pool.complete:
        problems.append(f"pool {pool.label}: incomplete ({len(current)} of {expected} slices of generation {top})")
    seen: set[str] = set()
    for sl in current:
        _add_slice(pool, sl, seen, problems)
    return pool


def _add_slice(pool: Pool, sl: Mapping[str, Any], seen: set[str], problems: list[str]) -> None:
    spec = _dict(sl["spec"])
    sname = _slice_name(sl, sl["_index"])
    for cs in _list(spec.get("sharedCounters")):
        cs_name = _str(_dict(cs).get("name"))
        if not cs_name:
            problems.append(f"slice {sname}: counter set without name ignored")
            continue
        counters = pool.counter_sets.setdefault(cs_name, {})
        for cname, c in _dict(_dict(cs).get("counters")).items():
            q = _qty(_dict(c).get("value"))
            if q is None:
                problems.append(f"slice {sname}: counter {cs_name}/{cname} has an invalid value")
                continue
            counters[cname] = q.value
    per_device = spec.get("perDeviceNodeSelection") is True
    slice_node = _str(spec.get("nodeName"))
    slice_all = spec.get("allNodes") is True
    slice_sel = spec.get("nodeSelector") if isinstance(spec.get("nodeSelector"), Mapping) else None
    if not (per_device or slice_node or slice_all or slice_sel):
        problems.append(f"slice {sname}: no node selection set, ignored")
        return
    for raw in _list(spec.get("devices")):
        dev = _build_device(pool, sname, _dict(raw), problems)
        if dev is None:
            continue
        if dev.key[2] in seen:
            pool.invalid = f"duplicate device name {dev.key[2]}"
            problems.append(f"pool {pool.label}: invalid, {pool.invalid}")
            continue
        seen.add(dev.key[2])
        if per_device:
            dev.per_device_node = True
        else:
            dev.node_name, dev.all_nodes, dev.node_selector = slice_node, slice_all, slice_sel
        pool.devices.append(dev)


_ATTRIBUTE_TYPES: dict[str, type] = {"int": int, "bool": bool, "string": str, "version": str}


def _cel_attribute_ok(kind: str, value: Any) -> bool:
    """Whether :func:`device_activation` converts an attribute whose one value is ``kind``:
    ``value`` without an error (the same checks; ``test_fuzz_slices`` holds the two to agreeing)."""
    if not isinstance(value, _ATTRIBUTE_TYPES[kind]) or (kind == "int" and isinstance(value, bool)):
        return False
    if kind == "version":
        try:
            parse_semver(value)
        except SemverError:
            return False
    return True


def _build_device(pool: Pool, sname: str, raw: Mapping[str, Any], problems: list[str]) -> Device | None:
    name = _str(raw.get("name"))
    if not name:
        problems.append(f"slice {sname}: device without a name ignored")
        return None
    driver = pool.driver
    local: list[str] = []
    attributes: dict[str, tuple[str, Any]] = {}
    cel_clean = True
    for aname, aval in _dict(raw.get("attributes")).items():
        # Runs for every attribute of every device on each inventory build: one pass, no lists.
        av = _dict(aval)
        kind = ""
        for k in _ATTRIBUTE_TYPES:
            if av.get(k) is not None:
                kind = "?" if kind else k
        if kind and kind != "?":
            value = av[kind]
            attributes[aname if "/" in aname else f"{driver}/{aname}"] = (kind, value)
            if cel_clean and not _cel_attribute_ok(kind, value):
                cel_clean = False
        else:
            cel_clean = False
            local.append(f"attribute {aname}: exactly one value type must be set")
    capacity: dict[str, tuple[str, Quantity, Mapping[str, Any]]] = {}
    for cname, cval in _dict(raw.get("capacity")).items():
        q = _qty(_dict(cval).get("value"))
        if q is None:
            cel_clean = False
            local.append(f"capacity {cname}: invalid quantity")
            continue
        fq = _fq(cname, driver)
        if fq in capacity and "/" not in cname:
            continue  # an explicitly qualified spelling wins over the implicit one
        capacity[fq] = (cname, q, _dict(_dict(cval).get("requestPolicy")))
    consumes: list[tuple[str, dict[str, Fraction]]] = []
    for entry in _list(raw.get("consumesCounters")):
        counters: dict[str, Fraction] = {}
        for cname, c in _dict(_dict(entry).get("counters")).items():
            q = _qty(_dict(c).get("value"))
            if q is None:
                local.append(f"consumesCounters {cname}: invalid quantity")
                continue
            counters[cname] = q.value
        consumes.append((_str(_dict(entry).get("counterSet")) or "", counters))
    allow_multi = raw.get("allowMultipleAllocations") is True
    if local:
        problems.extend(f"device {pool.label}/{name}: {p}" for p in local)
    selector = raw.get("nodeSelector")
    return Device(
        key=(driver, pool.name, name), index=0, slice_name=sname, raw=raw, attributes=attributes, capacity=capacity,
        consumes=consumes, taints=[_dict(t) for t in _list(raw.get("taints"))],
        node_name=_str(raw.get("nodeName")), all_nodes=raw.get("allNodes") is True,
        node_selector=selector if selector is not None and isinstance(selector, Mapping) else None,
        per_device_node=False, allow_multi=allow_multi, binds_to_node=raw.get("bindsToNode") is True,
        problems=local, cel_clean=cel_clean,
    )  # fmt: skip


# =========================================================================== allocated state


@dataclass
class AllocatedState:
    """What other claims hold: exclusive devices and consumed shared capacity."""

    devices: set[DeviceKey] = field(default_factory=set)
    shared: dict[DeviceKey, dict[str, Fraction]] = field(default_factory=dict)

    def consuming(self) -> set[DeviceKey]:
        """Devices whose counters are consumed (exclusive or shared in use)."""
        return self.devices | set(self.shared)


def allocated_state(claims: Iterable[Mapping[str, Any]], exclude_uid: str | None = None) -> AllocatedState:
    state = AllocatedState()
    for claim in claims:
        if exclude_uid is not None and _dict(_dict(claim).get("metadata")).get("uid") == exclude_uid:
            continue
        results = _dict(_dict(_dict(_dict(claim).get("status")).get("allocation")).get("devices")).get("results")
        for res in _list(results):
            res = _dict(res)
            if res.get("adminAccess") is True:
                continue  # admin access never blocks other users
            key = (_str(res.get("driver")) or "", _str(res.get("pool")) or "", _str(res.get("device")) or "")
            if res.get("shareID") is None and not res.get("consumedCapacity"):
                state.devices.add(key)
                continue
            used = state.shared.setdefault(key, {})
            for cname, val in _dict(res.get("consumedCapacity")).items():
                q = _qty(val)
                if q is not None:
                    fq = _fq(cname, key[0])
                    used[fq] = used.get(fq, Fraction(0)) + q.value
    return state


# =========================================================================== claim parsing


@dataclass
class _Alt:
    """One allocatable alternative: a plain request or one firstAvailable subrequest."""

    name: str  # "req" or "req/sub"
    base: str
    sub: str
    class_name: str
    selectors: list[str]
    mode: str
    count: int
    admin: bool
    tolerations: list[Mapping[str, Any]]
    capacity: dict[str, Quantity]
    error: str | None = None
    compiled: list[tuple[str, CompiledSelector]] = field(default_factory=list)
    class_obj: Mapping[str, Any] | None = None


@dataclass
class _Constraint:
    kind: str  # match | distinct
    attribute: str
    requests: set[str]
    value: tuple[str, Any] | None = None
    members: int = 0
    seen: Counter[tuple[str, Any]] = field(default_factory=Counter)

    def applies(self, alt: _Alt) -> bool:
        return not self.requests or alt.base in self.requests or (bool(alt.sub) and alt.name in self.requests)


def _parse_alt(base: str, sub: str, body: Mapping[str, Any], admin_allowed: bool) -> _Alt:
    mode = _str(body.get("allocationMode")) or "ExactCount"
    count_raw = body.get("count")
    count = 1 if count_raw is None and mode == "ExactCount" else _int(count_raw)
    alt = _Alt(
        name=f"{base}/{sub}" if sub else base, base=base, sub=sub,
        class_name=_str(body.get("deviceClassName")) or "",
        selectors=[], mode=mode, count=count or 0,
        admin=admin_allowed and body.get("adminAccess") is True,
        tolerations=[_dict(t) for t in _list(body.get("tolerations"))], capacity={},
    )  # fmt: skip
    for i, sel in enumerate(_list(body.get("selectors"))):
        expr = _str(_dict(_dict(sel).get("cel")).get("expression"))
        if expr is None:
            alt.error = f"selector #{i}: CEL expression empty (unsupported selector type?)"
        else:
            alt.selectors.append(expr)
    for cname, val in _dict(_dict(body.get("capacity")).get("requests")).items():
        q = _qty(val)
        if q is None or q.value < 0:
            alt.error = f"capacity request {cname}: invalid quantity {val!r}"
        else:
            alt.capacity[cname] = q
    if mode not in ("ExactCount", "All"):
        alt.error = f"unsupported allocation mode {mode!r}"
    elif mode == "ExactCount" and (count is None or count <= 0):
        alt.error = f"count must be a positive integer, got {count_raw!r}"
    elif mode == "All" and count_raw is not None:
        alt.error = "count must not be set with allocationMode All"
    if not alt.class_name:
        alt.error = alt.error or "missing device class name"
    return alt


def _parse_requests(claim: Mapping[str, Any], errors: list[str]) -> list[list[_Alt]]:
    out: list[list[_Alt]] = []
    names: set[str] = set()
    for i, req in enumerate(_list(_dict(_dict(claim.get("spec")).get("devices")).get("requests"))):
        req = _dict(req)
        name = _str(req.get("name")) or f"request-{i}"
        if name in names:
            errors.append(f"duplicate request name {name}")
        names.add(name)
        if isinstance(req.get("exactly"), Mapping):
            out.append([_parse_alt(name, "", req["exactly"], admin_allowed=True)])
        elif _list(req.get("firstAvailable")):
            subs = [_dict(s) for s in _list(req.get("firstAvailable"))]
            out.append([_parse_alt(name, _str(s.get("name")) or f"sub-{j}", s, False) for j, s in enumerate(subs)])
        else:
            errors.append(f"request {name}: neither exactly nor firstAvailable is set")
    if not out and not errors:
        errors.append("claim has no requests")
    return out


def _parse_constraints(claim: Mapping[str, Any], errors: list[str]) -> list[_Constraint]:
    out: list[_Constraint] = []
    for i, c in enumerate(_list(_dict(_dict(claim.get("spec")).get("devices")).get("constraints"))):
        c = _dict(c)
        reqs = {r for r in _list(c.get("requests")) if isinstance(r, str)}
        match, distinct = _str(c.get("matchAttribute")), _str(c.get("distinctAttribute"))
        if match and "/" in match:
            out.append(_Constraint("match", match, reqs))
        elif distinct and "/" in distinct:
            out.append(_Constraint("distinct", distinct, reqs))
        else:
            errors.append(f"constraint #{i}: needs a fully-qualified matchAttribute or distinctAttribute")
    return out


def _classes_by_name(classes: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    if isinstance(classes, Mapping):
        return {str(k): _dict(v) for k, v in classes.items()}
    out: dict[str, Mapping[str, Any]] = {}
    for cls in classes:
        name = _str(_dict(_dict(cls).get("metadata")).get("name"))
        if name:
            out[name] = _dict(cls)
    return out


def _prepare_alt(alt: _Alt, classes: Mapping[str, Mapping[str, Any]]) -> None:
    """Look up the class and compile all selectors (class first, like the scheduler)."""
    if alt.error:
        return
    cls = classes.get(alt.class_name)
    if cls is None:
        alt.error = f"device class {alt.class_name} not found"
        return
    alt.class_obj = cls
    sources = [(f"class {alt.class_name} selector #{i}", _dict(s)) for i, s in enumerate(_class_selectors(cls))]
    sources += [(f"request {alt.name} selector #{i}", {"cel": {"expression": e}}) for i, e in enumerate(alt.selectors)]
    for label, sel in sources:
        expr = _str(_dict(sel.get("cel")).get("expression"))
        if expr is None:
            alt.error = f"{label}: CEL expression empty (unsupported selector type?)"
            return
        try:
            alt.compiled.append((label, compile_selector(expr)))
        except CelCompileError as exc:
            alt.error = f"{label}: CEL compile error: {exc.message}"
            return


def _class_selectors(cls: Mapping[str, Any]) -> list[Any]:
    return _list(_dict(cls.get("spec")).get("selectors"))


# =========================================================================== per-device checks


def _tolerates(tol: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect = _str(tol.get("effect")) or ""
    if effect and effect != taint.get("effect"):
        return False
    key = _str(tol.get("key")) or ""
    operator = _str(tol.get("operator")) or "Equal"
    if not key:
        return operator == "Exists"
    if key != taint.get("key"):
        return False
    return operator == "Exists" or (tol.get("value") or "") == (taint.get("value") or "")


def _taint_blocking(dev: Device, alt: _Alt) -> Mapping[str, Any] | None:
    for taint in dev.taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(_tolerates(t, taint) for t in alt.tolerations):
            return taint
    return None


def _round_policy(requested: Quantity, policy: Mapping[str, Any]) -> Quantity | None:
    """Round a request up as the device's requestPolicy says; None when it violates it."""
    vr = _dict(policy.get("validRange"))
    lo = _qty(vr.get("min")) if vr else None
    if lo is not None:
        hi, step = _qty(vr.get("max")), _qty(vr.get("step"))
        value = requested if requested.value >= lo.value else lo
        if step is not None and step.value > 0:
            steps = -((lo.value - value.value) // step.value)  # ceil((value - min) / step)
            rounded = lo.value + steps * step.value
            value = value if rounded == value.value else Quantity(rounded)
        return None if hi is not None and value.value > hi.value else value
    valid = sorted((q for q in (_qty(v) for v in _list(policy.get("validValues"))) if q is not None), key=lambda q: q.value)
    if valid:
        fitting = [v for v in valid if v.value >= requested.value]
        return fitting[0] if fitting else None
    return requested


def _consumption(dev: Device, alt: _Alt) -> dict[str, Quantity] | None:
    """Capacity this request would consume on ``dev`` (per fq name), None if impossible."""
    requested: dict[str, Quantity] = {}
    for rname, q in alt.capacity.items():
        fq = _fq(rname, dev.key[0])
        if fq not in dev.capacity:
            return None
        requested[fq] = q
    out: dict[str, Quantity] = {}
    for fq, (_, total, policy) in dev.capacity.items():
        value: Quantity | None
        if fq in requested:
            value = _round_policy(requested[fq], policy) if policy else requested[fq]
        else:
            default = _qty(policy.get("default")) if policy else None
            value = default if default is not None else total
        if value is None or value.value > total.value:
            return None
        out[fq] = value
    return out


def _lookup_attribute(dev: Device, name: str) -> tuple[str, Any] | None:
    # Keys are stored fully qualified (unqualified ones under the driver's domain),
    # which is the scheduler's lookup rule.  Versions compare as strings there too:
    # semver 2.0 demands the minimal spelling.
    return dev.attributes.get(name)


# =========================================================================== nodes


@dataclass(frozen=True)
class _Node:
    name: str | None
    labels: tuple[tuple[str, str], ...] = ()


def _as_nodes(nodes: Sequence[Any] | None, inventory: Inventory) -> list[_Node]:
    if nodes is None:
        names = inventory.node_names
        return [_Node(n) for n in names] if names else [_Node(None)]
    out: list[_Node] = []
    for n in nodes:
        if isinstance(n, str):
            out.append(_Node(n))
        else:
            meta = _dict(_dict(n).get("metadata"))
            labels = {str(k): str(v) for k, v in _dict(meta.get("labels")).items()}
            out.append(_Node(_str(meta.get("name")), tuple(sorted(labels.items()))))
    return out


def _requirement_ok(req: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    key, op = _str(req.get("key")) or "", _str(req.get("operator")) or ""
    want = [str(v) for v in _list(req.get("values"))]
    have = values.get(key)
    if op == "In":
        return have is not None and have in want
    if op == "NotIn":
        return have is None or have not in want
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and len(want) == 1:
        try:
            a, b = int(have), int(want[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def _selector_matches(selector: Mapping[str, Any], node: _Node) -> bool:
    if node.name is None:
        return True  # anonymous node: optimistic, the result carries the selector
    labels = dict(node.labels)
    fields = {"metadata.name": node.name}
    for term in _list(selector.get("nodeSelectorTerms")):
        term = _dict(term)
        exprs, flds = _list(term.get("matchExpressions")), _list(term.get("matchFields"))
        if (
            (exprs or flds)
            and all(_requirement_ok(_dict(r), labels) for r in exprs)
            and all(_requirement_ok(_dict(r), fields) for r in flds)
        ):
            return True
    return False


def _on_node(dev: Device, node: _Node) -> bool:
    if dev.node_name:
        return dev.node_name == node.name
    if dev.all_nodes:
        return True
    if dev.node_selector is not None:
        return _selector_matches(dev.node_selector, node)
    return False


# =========================================================================== resolution


@dataclass
class Resolution:
    allocation: dict[str, Any] | None
    explanation: Explanation
    node: str | None = None

    @property
    def allocated(self) -> bool:
        return self.allocation is not None


class _Abort(Exception):
    """Stops the search on one node.

    ``fatal`` mirrors the allocator's error kinds: a fatal error (CEL runtime error, a
    constraint that rejects a device an ``All`` request must take, an ``All`` request over an
    incomplete pool, a broken request) makes the scheduler's Filter return an error, which ends
    the whole scheduling attempt, whatever other nodes would have offered.  Only running out of
    search budget (the scheduler's filter timeout) fails just the one node.
    """

    def __init__(self, message: str, fatal: bool = True) -> None:
        super().__init__(message)
        self.fatal = fatal


@dataclass
class _Result:
    alt: _Alt
    dev: Device
    consumed: dict[str, Quantity] | None


class _Search:
    """Backtracking first-fit search for one claim on one node."""

    def __init__(self, ctx: _Ctx, node: _Node, devices: list[Device]) -> None:
        self.ctx = ctx
        self.node = node
        self.devices = devices
        self.allocating: Counter[DeviceKey] = Counter()
        self.capacity: dict[DeviceKey, dict[str, Fraction]] = {}
        self.counters: dict[tuple[str, str], dict[str, dict[str, Fraction]]] = {}
        self.results: list[_Result] = []
        self.chosen: dict[int, int] = {}
        self.steps = 0
        self.all_devices: dict[int, list[Device]] = {}
        for c in ctx.constraints:
            c.value, c.members, c.seen = None, 0, Counter()

    def run(self) -> bool:
        self.validate()
        return self.request(0)

    def validate(self) -> None:
        """What the scheduler checks per node before searching, for every request and subrequest.

        ``All`` requests are sized up front: an incomplete pool or a CEL runtime error among
        the node's devices is an error even when an earlier request would have failed anyway.
        """
        for alts in self.ctx.requests:
            for alt in alts:
                if alt.error:
                    raise _Abort(f"request {alt.name}: {alt.error}")
                if alt.mode != "All":
                    continue
                for pool in self.ctx.inventory.pools:
                    if not pool.usable and any(_on_node(d, self.node) for d in pool.devices):
                        state = "being updated (incomplete)" if not pool.complete else f"invalid ({pool.invalid})"
                        raise _Abort(f"request {alt.name}: asks for all devices, but resource pool {pool.label} is {state}")
                self.all_devices[id(alt)] = [
                    d for d in self.devices if self.ctx.selectable(alt, d) and _consumption(d, alt) is not None]

    def request(self, ri: int) -> bool:
        if ri >= len(self.ctx.requests):
            return True
        alts = self.ctx.requests[ri]
        for ai, alt in enumerate(alts):
            if self.alt(ri, alt):
                self.chosen[ri] = ai
                return True
        return False

    def alt(self, ri: int, alt: _Alt) -> bool:
        if alt.mode == "All":
            return self.alt_all(ri, alt)
        if len(self.results) + alt.count > MAX_RESULTS:
            return False
        return self.pick(ri, alt, alt.count, 0)

    def tick(self) -> None:
        self.steps += 1
        if self.steps > MAX_SEARCH_STEPS:
            raise _Abort(f"search too complex (more than {MAX_SEARCH_STEPS} steps)", fatal=False)

    def pick(self, ri: int, alt: _Alt, remaining: int, start: int) -> bool:
        self.tick()
        if remaining == 0:
            return self.request(ri + 1)
        for pos in range(start, len(self.devices)):
            if len(self.devices) - pos < remaining:
                return False  # not enough devices left for the rest of this request
            dev = self.devices[pos]
            if not self.eligible(alt, dev):
                continue
            undo = self.allocate(alt, dev, must=False)
            if undo is None:
                continue
            if self.pick(ri, alt, remaining - 1, pos + 1):
                return True
            undo()
        return False

    def alt_all(self, ri: int, alt: _Alt) -> bool:
        wanted = self.all_devices[id(alt)]
        if not wanted:
            return False
        if len(self.results) + len(wanted) > MAX_RESULTS:
            return False
        undos = []
        for dev in wanted:
            self.tick()
            undo = self.allocate(alt, dev, must=True)
            if undo is None:
                break
            undos.append(undo)
        else:
            if self.request(ri + 1):
                return True
        for undo in reversed(undos):
            undo()
        return False

    def in_use(self, alt: _Alt, dev: Device) -> bool:
        if dev.allow_multi:
            return False
        if alt.admin:
            return self.allocating[dev.key] > 0
        return dev.key in self.ctx.allocated.devices or self.allocating[dev.key] > 0

    def eligible(self, alt: _Alt, dev: Device) -> bool:
        # Same order as the scheduler: "in use" is cheap and checked before selectors,
        # so a CEL error on a device that is in use never surfaces.
        if self.in_use(alt, dev):
            return False
        return self.ctx.selectable(alt, dev)

    def allocate(self, alt: _Alt, dev: Device, must: bool) -> Any:
        """Tentatively allocate; returns an undo callable or None."""
        if self.in_use(alt, dev):
            return None
        shared_in_use = dev.key in self.ctx.allocated.shared or dev.key in self.capacity
        use_counters = bool(dev.consumes) and not (dev.allow_multi and shared_in_use)
        if use_counters and not self.take_counters(dev):
            return None
        if _taint_blocking(dev, alt) is not None:
            if use_counters:
                self.release_counters(dev)
            return None
        consumed = self.capacity_fits(dev, alt)
        if consumed is None:
            if use_counters:
                self.release_counters(dev)
            return None
        added: list[_Constraint] = []
        for c in self.ctx.constraints:
            if not c.applies(alt):
                continue
            if not _constraint_add(c, dev):
                for a in added:
                    _constraint_remove(a, dev)
                if use_counters:
                    self.release_counters(dev)
                if must:
                    raise _Abort(f"request {alt.name}: cannot add device {_key_str(dev.key)} "
                                 "because a claim constraint would not be satisfied")  # fmt: skip
                return None
            added.append(c)
        if not dev.allow_multi:
            self.allocating[dev.key] += 1
        if dev.allow_multi:
            cur = self.capacity.setdefault(dev.key, {})
            for k, v in consumed.items():
                cur[k] = cur.get(k, Fraction(0)) + v.value
        self.results.append(_Result(alt, dev, consumed if dev.allow_multi else None))

        def undo() -> None:
            self.results.pop()
            for a in added:
                _constraint_remove(a, dev)
            if dev.allow_multi:
                cur = self.capacity[dev.key]
                for k, v in consumed.items():
                    cur[k] -= v.value
                if all(v == 0 for v in cur.values()):
                    del self.capacity[dev.key]
            else:
                self.allocating[dev.key] -= 1
            if use_counters:
                self.release_counters(dev)

        return undo

    def capacity_fits(self, dev: Device, alt: _Alt) -> dict[str, Quantity] | None:
        consumed = _consumption(dev, alt)
        if consumed is None:
            return None
        if not dev.allow_multi:
            return consumed
        before = self.ctx.allocated.shared.get(dev.key, {})
        now = self.capacity.get(dev.key, {})
        for fq, value in consumed.items():
            if before.get(fq, 0) + now.get(fq, 0) + value.value > dev.capacity[fq][1].value:
                return None
        return consumed

    def take_counters(self, dev: Device) -> bool:
        pool_id = (dev.key[0], dev.key[1])
        used = self.counters.setdefault(pool_id, {})
        for cs, counters in dev.consumes:
            target = used.setdefault(cs, {})
            for name, value in counters.items():
                target[name] = target.get(name, Fraction(0)) + value
        available = self.ctx.available_counters(pool_id)
        for cs, counters in available.items():
            for name, value in counters.items():
                if used.get(cs, {}).get(name, 0) > value:
                    self.release_counters(dev)
                    return False
        return True

    def release_counters(self, dev: Device) -> None:
        used = self.counters[(dev.key[0], dev.key[1])]
        for cs, counters in dev.consumes:
            for name, value in counters.items():
                used[cs][name] -= value


def _constraint_add(c: _Constraint, dev: Device) -> bool:
    attr = _lookup_attribute(dev, c.attribute)
    if attr is None:
        return False
    if c.kind == "match":
        if c.members > 0 and attr != c.value:
            return False
        if c.members == 0:
            c.value = attr
        c.members += 1
        return True
    if c.seen[attr] > 0:
        return False
    c.seen[attr] += 1
    return True


def _constraint_remove(c: _Constraint, dev: Device) -> None:
    attr = _lookup_attribute(dev, c.attribute)
    if c.kind == "match":
        c.members -= 1
    elif attr is not None:
        c.seen[attr] -= 1


@dataclass
class _Ctx:
    """Everything fixed for one resolve() call (shared by the per-node searches)."""

    claim: Mapping[str, Any]
    inventory: Inventory
    allocated: AllocatedState
    requests: list[list[_Alt]]
    constraints: list[_Constraint]
    verdicts: dict[tuple[int, int], _Verdict] = field(default_factory=dict)
    alt_ids: dict[int, int] = field(default_factory=dict)
    available: dict[tuple[str, str], dict[str, dict[str, Fraction]]] = field(default_factory=dict)

    def verdict(self, alt: _Alt, dev: Device) -> _Verdict:
        """Selector outcome, cached: evaluation is pure, so each pair is evaluated once."""
        aid = self.alt_ids.setdefault(id(alt), len(self.alt_ids))
        key = (aid, dev.index)
        if key not in self.verdicts:
            self.verdicts[key] = _evaluate(alt, dev)
        return self.verdicts[key]

    def selectable(self, alt: _Alt, dev: Device) -> bool:
        v = self.verdict(alt, dev)
        if v is None:
            return True
        if isinstance(v[1], CelError):
            label, err = alt.compiled[v[0]][0], v[1]
            raise _Abort(f"{label} on device {_key_str(dev.key)}: CEL runtime error: {err.message}")
        return False

    def available_counters(self, pool_id: tuple[str, str]) -> dict[str, dict[str, Fraction]]:
        if pool_id not in self.available:
            pool = self.inventory.pool_map[pool_id]
            avail = {cs: dict(c) for cs, c in pool.counter_sets.items()}
            consuming = self.allocated.consuming()
            for dev in pool.devices:
                if dev.key in consuming:
                    for cs, counters in dev.consumes:
                        for name, value in counters.items():
                            if name in avail.get(cs, {}):
                                avail[cs][name] -= value
            self.available[pool_id] = avail
        return self.available[pool_id]


# None: all selectors true; else (index of the first selector that failed, False or the error).
_Verdict = tuple[int, "bool | CelError"] | None


def _evaluate(alt: _Alt, dev: Device) -> _Verdict:
    for i, (_, sel) in enumerate(alt.compiled):
        if sel.driver_equals is not None and dev.cel_clean and sel.poisoned is None:
            # What sel.evaluate would answer (the activation's driver is key[0] and it has no
            # error), without building the activation (~4 us) for each of the cluster's devices.
            if dev.key[0] != sel.driver_equals:
                return (i, False)
            continue
        try:
            if not sel.evaluate(dev.activation):
                return (i, False)
        except CelRuntimeError as exc:
            return (i, exc)
    return None


def resolve(
    claim: Mapping[str, Any],
    inventory: Inventory,
    classes: Mapping[str, Any] | Iterable[Mapping[str, Any]],
    allocated: AllocatedState | None = None,
    nodes: Sequence[Any] | None = None,
) -> Resolution:
    """Allocate ``claim`` like the kube-scheduler would; never raises on bad input."""
    claim = _dict(claim)
    meta = _dict(claim.get("metadata"))
    label = f"{_str(meta.get('namespace')) or 'default'}/{_str(meta.get('name')) or '<unnamed>'}"
    explanation = Explanation(claim=label, pools=list(inventory.problems))
    try:
        return _resolve(claim, inventory, _classes_by_name(classes), allocated or AllocatedState(), nodes, explanation)
    except Exception as exc:  # last line of defence: bad input must not crash callers
        explanation.errors.append(f"internal error: {type(exc).__name__}: {exc}")
        return Resolution(None, explanation)


def _resolve(
    claim: Mapping[str, Any],
    inventory: Inventory,
    classes: Mapping[str, Mapping[str, Any]],
    allocated: AllocatedState,
    nodes: Sequence[Any] | None,
    explanation: Explanation,
) -> Resolution:
    errors = explanation.errors
    requests = _parse_requests(claim, errors)
    constraints = _parse_constraints(claim, errors)
    for alts in requests:
        for alt in alts:
            _prepare_alt(alt, classes)
    ctx = _Ctx(claim, inventory, allocated, requests, constraints)
    explanation.requests = [_funnel(ctx, alt) for alts in requests for alt in alts]
    if errors:
        return Resolution(None, explanation)
    _precheck(ctx, explanation)
    if explanation.errors:
        return Resolution(None, explanation)
    node_list = _as_nodes(nodes, inventory)
    reasons: Counter[str] = Counter()
    best: tuple[int, str | None] = (-1, None)
    tried_lists: set[tuple[int, ...]] = set()
    # The scheduler filters every candidate node and one fatal error anywhere fails the pod, so
    # a success only counts once no other node can produce such an error.  Only All requests
    # and CEL runtime errors can; other claims keep the first-fit shortcut.
    fatal_possible = any(a.mode == "All" for alts in requests for a in alts) or any(
        v is not None and isinstance(v[1], CelError) for v in ctx.verdicts.values())
    found: tuple[_Search, _Node, int] | None = None
    for number, node in enumerate(node_list, start=1):
        devices = inventory.devices_on(node)
        if node.name is not None and not any(d.node_name for d in devices) and tuple(d.index for d in devices) in tried_lists:
            reasons["same devices as an earlier node"] += 1
            continue
        tried_lists.add(tuple(d.index for d in devices))
        search = _Search(ctx, node, devices)
        try:
            ok = search.run()
        except _Abort as exc:
            if exc.fatal:
                where = f"node {node.name}" if node.name else "a node"
                explanation.errors.append(f"{exc} (on {where}; {SCHEDULER_ABORTS} on this error, "
                                          "so no other node is used either)")  # fmt: skip
                explanation.nodes = {"tried": number, "reasons": dict(reasons)}
                return Resolution(None, explanation)
            reasons[str(exc)] += 1
            continue
        if ok:
            found = found or (search, node, number)
            if not fatal_possible:
                break
            continue
        reasons["not enough suitable devices" if devices else "no devices on node"] += 1
        usable = sum(1 for d in devices if any(ctx.verdict(a, d) is None for alts in requests for a in alts if not a.error))
        best = max(best, (usable, node.name), key=lambda b: b[0])
    if found is not None:
        search, node, number = found
        explanation.nodes = {"tried": number, "reasons": dict(reasons)}
        return _success(ctx, search, node, explanation)
    explanation.nodes = {"tried": len(node_list), "reasons": dict(reasons)}
    if best[0] >= 0:
        explanation.nodes["best"] = {"node": best[1], "selector_matches": best[0]}
    _explain_constraints(ctx, explanation)
    return Resolution(None, explanation)


def _precheck(ctx: _Ctx, explanation: Explanation) -> None:
    """Cheap impossibility checks so absurd claims fail fast with a clear message."""
    minimum = 0
    for alts in ctx.requests:
        counts = [a.count for a in alts if a.mode == "ExactCount" and not a.error]
        minimum += min(counts) if counts else (1 if any(a.mode == "All" for a in alts) else 0)
    if minimum > MAX_RESULTS:
        explanation.errors.append(f"number of requested devices {minimum} exceeds the claim limit of {MAX_RESULTS}")
        return
    by_name = {r.request: r for r in explanation.requests}
    for alts in ctx.requests:
        feasible = False
        for alt in alts:
            info = by_name[alt.name]
            if alt.error or info.cel_errors:
                feasible = True  # let the search surface the error in scheduler order
            elif alt.mode == "All" or info.candidates >= alt.count:
                feasible = True
        if not feasible:
            explanation.errors.append(f"request {alts[0].base}: not enough devices match")
            return


# =========================================================================== explanation


def _funnel(ctx: _Ctx, alt: _Alt) -> RequestExplanation:
    info = RequestExplanation(alt.name, alt.class_name, alt.mode, alt.count if alt.mode == "ExactCount" else None)
    if alt.error:
        info.error = alt.error
        return info
    alive = list(ctx.inventory.devices)
    info.stages.append(StageCount("devices published", len(alive)))
    failures: dict[int, tuple[int, str]] = {}  # device index -> (stage number, reason)

    def stage(name: str, keep: Any) -> None:
        nonlocal alive
        survivors = []
        for d in alive:
            reason = keep(d)
            if reason is None:
                survivors.append(d)
            else:
                failures[d.index] = (len(info.stages), reason)
        alive = survivors
        info.stages.append(StageCount(name, len(alive)))

    def pool_ok(d: Device) -> str | None:
        p = ctx.inventory.pool_of(d)
        return None if p.usable else ("pool incomplete" if not p.complete else f"pool invalid: {p.invalid}")

    stage("in complete, valid pools", pool_ok)
    for i, (label, sel) in enumerate(alt.compiled):
        stage(label, lambda d, i=i, label=label, sel=sel: _sel_reason(info, ctx.verdict(alt, d), d, i, label, sel))
    stage("taints tolerated", lambda d: _taint_reason(d, alt))
    if alt.capacity or any(d.allow_multi for d in alive):
        stage("capacity fits", lambda d: None if _consumption(d, alt) is not None else "capacity request does not fit")
    if not alt.admin:
        stage("not allocated to other claims", lambda d: "allocated to another claim" if d.key in ctx.allocated.devices else None)
    if any(d.consumes for d in alive):
        stage("shared counters available", lambda d: _counter_reason(ctx, d))
    ranked = sorted(failures.items(), key=lambda kv: (-kv[1][0], kv[0]))[:MAX_CLOSEST]
    info.closest = [CandidateNote(_key_str(ctx.inventory.devices[i].key), why) for i, (_, why) in ranked]
    return info


def _sel_reason(info: RequestExplanation, verdict: _Verdict, d: Device, i: int, label: str, sel: CompiledSelector) -> str | None:
    if verdict is None or verdict[0] != i:
        return None  # passed this selector (earlier failures were filtered out already)
    err = verdict[1]
    if isinstance(err, CelError):
        if len(info.cel_errors) < MAX_CLOSEST:
            info.cel_errors.append(CelIssue(label, err.expression, err.message, _key_str(d.key)))
        return f"{label}: CEL runtime error: {err.message}"
    return f"{label} is false: {sel.expression}"


def _taint_reason(d: Device, alt: _Alt) -> str | None:
    taint = _taint_blocking(d, alt)
    return None if taint is None else f"taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')} not tolerated"


def _counter_reason(ctx: _Ctx, d: Device) -> str | None:
    avail = ctx.available_counters((d.key[0], d.key[1]))
    for cs, counters in d.consumes:
        for name, value in counters.items():
            if name in avail.get(cs, {}) and avail[cs][name] < value:
                return f"counter {cs}/{name} exhausted (needs {value}, {avail[cs][name]} left)"
    return None


def _explain_constraints(ctx: _Ctx, explanation: Explanation) -> None:
    for c in ctx.constraints:
        values: Counter[str] = Counter()
        for alts in ctx.requests:
            alt = alts[0]
            if alt.error or not c.applies(alt):
                continue
            for d in ctx.inventory.devices:
                if ctx.inventory.pool_of(d).usable and ctx.verdict(alt, d) is None:
                    attr = _lookup_attribute(d, c.attribute)
                    values[str(attr[1]) if attr else "<unset>"] += 1
        groups = ", ".join(f"{v}: {n}" for v, n in values.most_common(6))
        word = "matchAttribute" if c.kind == "match" else "distinctAttribute"
        explanation.constraints.append(f"{word} {c.attribute} (candidates per value: {groups or 'none'})")


# =========================================================================== result


def _success(ctx: _Ctx, search: _Search, node: _Node, explanation: Explanation) -> Resolution:
    uid = _str(_dict(ctx.claim.get("metadata")).get("uid")) or explanation.claim
    results = []
    for n, res in enumerate(search.results):
        entry: dict[str, Any] = {"request": res.alt.name, "driver": res.dev.key[0], "pool": res.dev.key[1],
                                 "device": res.dev.key[2]}  # fmt: skip
        if res.alt.admin:
            entry["adminAccess"] = True
        if res.alt.tolerations:
            entry["tolerations"] = [dict(t) for t in res.alt.tolerations]
        if res.dev.allow_multi:
            entry["shareID"] = str(uuid.uuid5(_SHARE_NS, f"{uid}/{res.alt.name}/{_key_str(res.dev.key)}/{n}"))
            if res.consumed:
                entry["consumedCapacity"] = {res.dev.capacity[k][0]: str(v) for k, v in res.consumed.items()}
        results.append(entry)
    allocation: dict[str, Any] = {"devices": {"results": results, "config": _configs(ctx, search)}}
    if not allocation["devices"]["config"]:
        del allocation["devices"]["config"]
    selector = _node_selector(search, node)
    if selector is not None:
        allocation["nodeSelector"] = selector
    explanation.allocated = True
    explanation.node = node.name
    explanation.devices = [_key_str(r.dev.key) for r in search.results]
    for ri, ai in search.chosen.items():
        name = ctx.requests[ri][ai].name
        for info in explanation.requests:
            info.chosen = info.chosen or info.request == name
    return Resolution(allocation, explanation, node.name)


def _configs(ctx: _Ctx, search: _Search) -> list[dict[str, Any]]:
    chosen = [ctx.requests[ri][search.chosen[ri]] for ri in range(len(ctx.requests))]
    out: list[dict[str, Any]] = []
    class_rows: dict[str, list[dict[str, Any]]] = {}
    for alt in chosen:
        if alt.class_name in class_rows:
            for row in class_rows[alt.class_name]:
                row["requests"].append(alt.name)
            continue
        rows = []
        for cfg in _list(_dict(_dict(alt.class_obj).get("spec")).get("config")):
            row = {"source": "FromClass", "requests": [alt.name], **{k: v for k, v in _dict(cfg).items() if k != "requests"}}
            rows.append(row)
        class_rows[alt.class_name] = rows
        out.extend(rows)
    for cfg in _list(_dict(_dict(ctx.claim.get("spec")).get("devices")).get("config")):
        cfg = _dict(cfg)
        wanted = [r for r in _list(cfg.get("requests")) if isinstance(r, str)]
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


def _node_selector(search: _Search, node: _Node) -> dict[str, Any] | None:
    fields: list[dict[str, Any]] = []
    exprs: list[dict[str, Any]] = []
    for res in search.results:
        dev = res.dev
        if dev.node_name or dev.binds_to_node:
            return {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node.name]}]}]}  # fmt: skip
        terms = _list(_dict(dev.node_selector).get("nodeSelectorTerms")) if dev.node_selector else []
        if len(terms) == 1:
            for req in _list(_dict(terms[0]).get("matchFields")):
                if req not in fields:
                    fields.append(req)
            for req in _list(_dict(terms[0]).get("matchExpressions")):
                if req not in exprs:
                    exprs.append(req)
    term: dict[str, Any] = {}
    if exprs:
        term["matchExpressions"] = exprs
    if fields:
        term["matchFields"] = fields
    return {"nodeSelectorTerms": [term]} if term else None


# =========================================================================== benchmark


def synthetic_slices(nodes: int = 100, gpus: int = 8, driver: str = "gpu.dra-driver.io") -> list[dict[str, Any]]:
    """One slice per node with ``gpus`` GPUs (two NUMA nodes) for benchmarks."""
    out = []
    for n in range(nodes):
        node = f"node-{n:03d}"
        devices = [
            {
                "name": f"gpu-{g}",
                "attributes": {
                    "model": {"string": "H100" if g % 2 == 0 else "A100"},
                    "index": {"int": g},
                    "numa.dra-driver.io/node": {"int": g // (gpus // 2 or 1)},
                    "driverVersion": {"version": "550.54.15"},
                },
                "capacity": {"memory": {"value": "80Gi"}},
            }
            for g in range(gpus)
        ]
        out.append({
            "metadata": {"name": f"{node}-gpu"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices},
        })  # fmt: skip
    return out


def benchmark_resolve(claims: int = 100, nodes: int = 100, gpus: int = 8) -> dict[str, float]:
    """Time ``resolve`` for ``claims`` claims over a synthetic ``nodes`` x ``gpus`` inventory."""
    import time

    t0 = time.perf_counter()
    inventory = build_inventory(synthetic_slices(nodes, gpus))
    t1 = time.perf_counter()
    classes = [{"metadata": {"name": "gpu"}, "spec": {"selectors": [
        {"cel": {"expression": 'device.driver == "gpu.dra-driver.io"'}}]}}]  # fmt: skip
    claim = {
        "metadata": {"name": "bench", "namespace": "default", "uid": "bench"},
        "spec": {"devices": {
            "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu", "count": 2, "selectors": [
                {"cel": {"expression": 'device.attributes["gpu.dra-driver.io"].model == "H100" && '
                                       'device.capacity["gpu.dra-driver.io"].memory.compareTo(quantity("40Gi")) >= 0'}}]}}],
            "constraints": [{"matchAttribute": "numa.dra-driver.io/node"}],
        }},
    }  # fmt: skip
    timings = []
    allocated = AllocatedState()
    for _ in range(claims):
        start = time.perf_counter()
        res = resolve(claim, inventory, classes, allocated)
        timings.append(time.perf_counter() - start)
        if res.allocation is None:
            break
        for r in res.allocation["devices"]["results"]:
            allocated.devices.add((r["driver"], r["pool"], r["device"]))
    timings_sorted = sorted(timings)
    return {
        "inventory_s": t1 - t0,
        "claims": float(len(timings)),
        "first_ms": timings[0] * 1000,
        "median_ms": timings_sorted[len(timings) // 2] * 1000,
        "max_ms": timings_sorted[-1] * 1000,
        "total_s": sum(timings),
    }
