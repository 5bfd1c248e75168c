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
only matches ``allNodes`` / node-selector slices)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dra_driver.allocator.cel.compile import DeviceActivation, device_activation
from dra_driver.allocator.cel.functions import SemverError, parse_semver
from dra_driver.k8s.objects import Node, as_int, as_list, as_mapping, as_str, selector_matches
from dra_driver.k8s.quantity import Quantity, QuantityError, parse_quantity

DeviceKey = tuple[str, str, str]


def quantity_or_none(value: Any) -> Quantity | None:
    try:
        return parse_quantity(value)
    except QuantityError:
        return None


def key_str(key: DeviceKey) -> str:
    return "/".join(key)


# =========================================================================== inventory


@dataclass
class Device:
    """One device of a (current-generation) slice, pre-digested for the search."""

    key: DeviceKey
    index: int  # position in inventory order (pool, slice, device)
    slice_name: str
    raw: Mapping[str, Any]
    attributes: dict[str, tuple[str, Any]]  # fully-qualified name -> (kind, value)
    # Published name, exactly as written in the slice -> (value, requestPolicy).  Not qualified:
    # the scheduler looks capacity names up as written (requestsContainNonExistCapacity), so
    # ``memory`` and ``<driver>/memory`` are two different capacities to it.
    capacity: dict[str, tuple[Quantity, Mapping[str, Any]]]
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
            act = device_activation(self.key[0], as_mapping(self.raw.get("attributes")), as_mapping(self.raw.get("capacity")),
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

    def devices_on(self, node: Node) -> list[Device]:
        """Allocatable devices (usable pools) reachable from ``node``, in search order."""
        if self._local is None:
            self._local = {}
            for d in self.devices:
                if d.node_name and self._usable(d):
                    self._local.setdefault(d.node_name, []).append(d)
        local = self._local.get(node.name or "", []) if node.name else []
        shared = [d for d in self.devices if not d.node_name and self._usable(d) and on_node(d, node)]
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
        spec = as_mapping(as_mapping(sl).get("spec"))
        driver, pool = as_str(spec.get("driver")), as_str(as_mapping(spec.get("pool")).get("name"))
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
    return as_str(as_mapping(as_mapping(sl).get("metadata")).get("name")) or f"slice-{index}"


def _build_pool(driver: str, name: str, members: list[Mapping[str, Any]], problems: list[str]) -> Pool:
    def generation(sl: Mapping[str, Any]) -> int:
        return as_int(as_mapping(as_mapping(sl["spec"]).get("pool")).get("generation")) or 0

    top = max(generation(sl) for sl in members)
    current = sorted((sl for sl in members if generation(sl) == top), key=lambda s: _slice_name(s, s["_index"]))
    expected = as_int(as_mapping(as_mapping(current[0]["spec"]).get("pool")).get("resourceSliceCount")) or 0
    pool = Pool(driver, name, top, expected, [_slice_name(s, s["_index"]) for s in current],
                complete=len(current) == expected, invalid=None, counter_sets={})  # fmt: skip
    if not pool.complete:
        problems.append(f"pool {pool.label}: incomplete ({len(current)} of {expected} slices of generation {top})")
    seen: set[str] = set()
    for sl in current:
        _add_slice(pool, sl, seen, problems)
    return pool


def _add_slice(pool: Pool, sl: Mapping[str, Any], seen: set[str], problems: list[str]) -> None:
    spec = as_mapping(sl["spec"])
    sname = _slice_name(sl, sl["_index"])
    for cs in as_list(spec.get("sharedCounters")):
        cs_name = as_str(as_mapping(cs).get("name"))
        if not cs_name:
            problems.append(f"slice {sname}: counter set without name ignored")
            continue
        counters = pool.counter_sets.setdefault(cs_name, {})
        for cname, c in as_mapping(as_mapping(cs).get("counters")).items():
            q = quantity_or_none(as_mapping(c).get("value"))
            if q is None:
                problems.append(f"slice {sname}: counter {cs_name}/{cname} has an invalid value")
                continue
            counters[cname] = q.value
    per_device = spec.get("perDeviceNodeSelection") is True
    slice_node = as_str(spec.get("nodeName"))
    slice_all = spec.get("allNodes") is True
    slice_sel = spec.get("nodeSelector") if isinstance(spec.get("nodeSelector"), Mapping) else None
    if not (per_device or slice_node or slice_all or slice_sel):
        problems.append(f"slice {sname}: no node selection set, ignored")
        return
    for raw in as_list(spec.get("devices")):
        dev = _build_device(pool, sname, as_mapping(raw), problems)
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
    name = as_str(raw.get("name"))
    if not name:
        problems.append(f"slice {sname}: device without a name ignored")
        return None
    driver = pool.driver
    local: list[str] = []
    attributes: dict[str, tuple[str, Any]] = {}
    cel_clean = True
    for aname, aval in as_mapping(raw.get("attributes")).items():
        # Runs for every attribute of every device on each inventory build: one pass, no lists.
        av = as_mapping(aval)
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
    capacity: dict[str, tuple[Quantity, Mapping[str, Any]]] = {}
    for cname, cval in as_mapping(raw.get("capacity")).items():
        q = quantity_or_none(as_mapping(cval).get("value"))
        if q is None:
            cel_clean = False
            local.append(f"capacity {cname}: invalid quantity")
            continue
        capacity[cname] = (q, as_mapping(as_mapping(cval).get("requestPolicy")))
    consumes: list[tuple[str, dict[str, Fraction]]] = []
    for entry in as_list(raw.get("consumesCounters")):
        counters: dict[str, Fraction] = {}
        for cname, c in as_mapping(as_mapping(entry).get("counters")).items():
            q = quantity_or_none(as_mapping(c).get("value"))
            if q is None:
                local.append(f"consumesCounters {cname}: invalid quantity")
                continue
            counters[cname] = q.value
        consumes.append((as_str(as_mapping(entry).get("counterSet")) or "", counters))
    allow_multi = raw.get("allowMultipleAllocations") is True
    if local:
        problems.extend(f"device {pool.label}/{name}: {p}" for p in local)
    selector = raw.get("nodeSelector")
    return Device(
        key=(driver, pool.name, name), index=0, slice_name=sname, raw=raw, attributes=attributes, capacity=capacity,
        consumes=consumes, taints=[as_mapping(t) for t in as_list(raw.get("taints"))],
        node_name=as_str(raw.get("nodeName")), all_nodes=raw.get("allNodes") is True,
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
    consumers: dict[DeviceKey, list[str]] = field(default_factory=dict)  # namespace/name of the claims sharing a device

    def consuming(self) -> set[DeviceKey]:
        """Devices whose counters are consumed (exclusive or shared in use)."""
        return self.devices | set(self.shared)


def allocated_state(claims: Iterable[Mapping[str, Any]], exclude_uid: str | None = None) -> AllocatedState:
    state = AllocatedState()
    for claim in claims:
        meta = as_mapping(as_mapping(claim).get("metadata"))
        if exclude_uid is not None and meta.get("uid") == exclude_uid:
            continue
        allocation = as_mapping(as_mapping(as_mapping(claim).get("status")).get("allocation"))
        results = as_mapping(allocation.get("devices")).get("results")
        for res in as_list(results):
            res = as_mapping(res)
            if res.get("adminAccess") is True:
                continue  # admin access never blocks other users
            key = (as_str(res.get("driver")) or "", as_str(res.get("pool")) or "", as_str(res.get("device")) or "")
            if res.get("shareID") is None and not res.get("consumedCapacity"):
                state.devices.add(key)
                continue
            used = state.shared.setdefault(key, {})
            owners = state.consumers.setdefault(key, [])
            owner = f"{as_str(meta.get('namespace')) or 'default'}/{as_str(meta.get('name')) or '?'}"
            if owner not in owners:
                owners.append(owner)
            for cname, val in as_mapping(res.get("consumedCapacity")).items():
                q = quantity_or_none(val)
                if q is not None:  # keyed as written, like the device's capacity (see Device.capacity)
                    used[cname] = used.get(cname, Fraction(0)) + q.value
    return state


def as_nodes(nodes: Sequence[Any] | None, inventory: Inventory) -> list[Node]:
    if nodes is None:
        names = inventory.node_names
        return [Node(n) for n in names] if names else [Node(None)]
    out: list[Node] = []
    for n in nodes:
        if isinstance(n, str):
            out.append(Node(n))
        else:
            meta = as_mapping(as_mapping(n).get("metadata"))
            labels = {str(k): str(v) for k, v in as_mapping(meta.get("labels")).items()}
            out.append(Node(as_str(meta.get("name")), tuple(sorted(labels.items()))))
    return out


def on_node(dev: Device, node: Node) -> bool:
    if dev.node_name:
        return dev.node_name == node.name
    if dev.all_nodes:
        return True
    if dev.node_selector is not None:
        return selector_matches(dev.node_selector, node)
    return False
