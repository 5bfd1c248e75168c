"""The devices the engine allocates from: ResourceSlices grouped into pools and digested.

:func:`build_inventory` keeps each pool's newest generation (a pool whose slices are not all there
is incomplete, one that names a device twice invalid: neither is allocated from), orders
pools by (driver, name) and devices in (pool, slice, device) order, and digests every device into
a :class:`Device`, checked as the API server would have (:mod:`~dra_driver.allocator.slicechecks`)
and its maps read on first use. An inventory lends the pools whose slices did not change to the
next one, and :class:`Prebuilt` digests pools while the slices are still arriving.
:class:`AllocatedState` is what other claims hold of these devices; :func:`on_node` which devices
a node reaches.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import partial
from typing import Any

from dra_driver.allocator.cel.compile import DeviceActivation, device_activation
from dra_driver.allocator.slicechecks import (
    Checked,
    attribute_value,
    check_attributes,
    check_capacity,
    check_counters,
    checked_once,
)
from dra_driver.k8s.bodies import RawSlice
from dra_driver.k8s.objects import Node, as_int, as_list, as_mapping, as_str, selector_matches
from dra_driver.k8s.quantity import Quantity, QuantityError, parse_quantity

DeviceKey = tuple[str, str, str]


def quantity_or_none(value: Any) -> Quantity | None:
    try:
        return parse_quantity(value)
    except QuantityError:
        return None


def hashable(value: Fraction) -> Fraction | int:
    """A quantity's value for a hashed key: an int where it is whole (nearly always), which hashes
    in a fraction of a Fraction's time (Python code); equal values stay equal either way."""
    return value.numerator if value.denominator == 1 else value


def key_str(key: DeviceKey) -> str:
    return "/".join(key)


# =========================================================================== inventory


@dataclass(slots=True, eq=False)
class Device:
    """One device of a (current-generation) slice, pre-digested for the search.

    Only what every claim needs is digested when the inventory is built (with the counters a device
    consumes, each map of a build once: :func:`_digest_consumes`); the attribute and capacity maps
    are read from ``raw`` on first use (which is why slices must not be edited in place once handed
    over). Most devices never need them: selectors are
    evaluated once per group of devices that agree on what they read (``allocator.groups``)."""

    key: DeviceKey
    index: int  # position in inventory order (pool, slice, device)
    slice_name: str
    raw: Mapping[str, Any]
    node_name: str | None
    all_nodes: bool
    node_selector: Mapping[str, Any] | None
    per_device_node: bool
    allow_multi: bool
    binds_to_node: bool
    taints: tuple[Mapping[str, Any], ...] = ()
    problems: tuple[str, ...] = ()
    # True when the device's CEL activation has no error, known without building it.
    cel_clean: bool = False
    has_consumes: bool = False
    _attributes: dict[str, tuple[str, Any]] | None = None
    _capacity: dict[str, tuple[Quantity, Mapping[str, Any]]] | None = None
    _qualified_capacity: dict[str, tuple[Quantity, Mapping[str, Any], str]] | None = None
    _consumes: list[tuple[str, dict[str, Fraction]]] | None = None
    # Why the device's counters do not fit its pool when nothing else consumes any ("" when they
    # do), known once asked (allocator.funnel).
    counters_alone: str | None = None

    @property
    def attributes(self) -> dict[str, tuple[str, Any]]:
        """Fully-qualified name -> (kind, value), the valid attributes only."""
        if self._attributes is None:
            self._attributes = _digest_attributes(self.key[0], as_mapping(self.raw.get("attributes")))
        return self._attributes

    @property
    def capacity(self) -> dict[str, tuple[Quantity, Mapping[str, Any]]]:
        """Published name, exactly as written in the slice -> (value, requestPolicy).

        Not qualified: kube-scheduler 1.36 and 1.37 look capacity names up as written
        (requestsContainNonExistCapacity), so ``memory`` and ``<driver>/memory`` are two different
        capacities to them (1.38: :attr:`qualified_capacity`)."""
        if self._capacity is None:
            self._capacity = _digest_capacity(as_mapping(self.raw.get("capacity")))
        return self._capacity

    @property
    def consumes(self) -> list[tuple[str, dict[str, Fraction]]]:
        if self._consumes is None:
            self._consumes = _digest_consumes(self.raw.get("consumesCounters")) if self.has_consumes else []
        return self._consumes

    def attribute(self, name: str) -> tuple[str, Any] | None:
        """``attributes.get(name)`` without digesting the other attributes."""
        if self._attributes is not None:
            return self._attributes.get(name)
        return attribute_entry(as_mapping(self.raw.get("attributes")), self.key[0], name)

    @property
    def activation(self) -> DeviceActivation:
        """The device's CEL input, built anew on each call: callers evaluate one device of a group."""
        return self.activation_for(False)

    def activation_for(self, qualified_first: bool, on_read: bool = False) -> DeviceActivation:
        """:attr:`activation` as a scheduler with or without the rules' ``qualified_names`` and
        ``cel_converts_on_read`` reads it."""
        return device_activation(self.key[0], as_mapping(self.raw.get("attributes")), as_mapping(self.raw.get("capacity")),
                                 self.allow_multi, qualified_first, on_read)

    @property
    def qualified_capacity(self) -> dict[str, tuple[Quantity, Mapping[str, Any], str]]:
        """Fully-qualified name -> (value, requestPolicy, the name as published), as kube-scheduler
        1.38 reads a device: an unqualified name is in the driver's domain, and where both
        ``memory`` and ``<driver>/memory`` are published the qualified one wins."""
        if self._qualified_capacity is None:
            out: dict[str, tuple[Quantity, Mapping[str, Any], str]] = {}
            for name, (value, policy) in self.capacity.items():
                if "/" in name:
                    out[name] = (value, policy, name)
                elif f"{self.key[0]}/{name}" not in self.capacity:
                    out[f"{self.key[0]}/{name}"] = (value, policy, name)
            self._qualified_capacity = out
        return self._qualified_capacity


def published_attribute(raw: Mapping[str, Any], driver: str, name: str) -> Any:
    """The entry a fully-qualified attribute ``name`` finds in ``raw``: ``name`` as published, else
    its short form where the domain is the driver's; None when neither is there. The qualified
    spelling wins where both are published, as in the scheduler's constraint lookup of every
    version (1.37 ``lookupAttribute``, 1.38 ``DeviceAttributes.Lookup``)."""
    entry = raw.get(name)
    if entry is not None:
        return entry
    if name.startswith(driver) and name[len(driver):len(driver) + 1] == "/":
        short = name[len(driver) + 1:]
        if "/" not in short:
            return raw.get(short)
    return None


def attribute_entry(raw: Mapping[str, Any], driver: str, name: str) -> tuple[str, Any] | None:
    """What ``_digest_attributes(driver, raw).get(name)`` holds, reading only the entries that can
    hold it (see :func:`published_attribute`)."""
    entry = published_attribute(raw, driver, name)
    return attribute_value(entry) if entry is not None else None


def _digest_attributes(driver: str, raw: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
    out: dict[str, tuple[str, Any]] = {}
    for aname, aval in raw.items():
        value = attribute_value(aval)
        if "/" not in aname and f"{driver}/{aname}" in raw:
            continue  # the qualified spelling wins
        if value is not None:
            out[aname if "/" in aname else f"{driver}/{aname}"] = value
    return out


def _digest_capacity(raw: Mapping[str, Any]) -> dict[str, tuple[Quantity, Mapping[str, Any]]]:
    out: dict[str, tuple[Quantity, Mapping[str, Any]]] = {}
    for cname, cval in raw.items():
        q = quantity_or_none(as_mapping(cval).get("value"))
        if q is not None:
            out[cname] = (q, as_mapping(as_mapping(cval).get("requestPolicy")))
    return out


def _digest_counters(raw: Any) -> dict[str, Fraction]:
    """One entry's counters (those whose value is not a quantity were reported as problems)."""
    counters: dict[str, Fraction] = {}
    for cname, c in as_mapping(raw).items():
        q = quantity_or_none(as_mapping(c).get("value"))
        if q is not None:
            counters[cname] = q.value
    return counters


Digests = dict[int, tuple[Any, dict[str, Fraction]]]
"""Counter maps digested in one build, by the map's id (each kept, so that its id stays its own)."""


def _digest_consumes(raw: Any, digests: Digests | None = None) -> list[tuple[str, dict[str, Fraction]]]:
    """The counters a device consumes. ``digests``: the maps digested earlier in the same build,
    shared (read only) by the devices that consume equal ones: the decoded slices share equal maps
    (a dynamic-MIG fleet's 76,000 placements consume a few dozen), and parsing each device's own
    was most of a MIG pool's digest."""
    consumes: list[tuple[str, dict[str, Fraction]]] = []
    for entry in as_list(raw):
        counters_map = as_mapping(entry).get("counters")
        if digests is None:
            counters = _digest_counters(counters_map)
        else:
            found = digests.get(id(counters_map))
            if found is None or found[0] is not counters_map:
                found = digests[id(counters_map)] = (counters_map, _digest_counters(counters_map))
            counters = found[1]
        consumes.append((as_str(as_mapping(entry).get("counterSet")) or "", counters))
    return consumes


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
    problems: list[str] = field(default_factory=list)
    # The slices it was built from (every generation, in input order): a later build whose slices
    # for this pool are the same takes the pool over instead of digesting them again.
    sources: tuple[Mapping[str, Any], ...] = ()
    _consumer_keys: frozenset[DeviceKey] | None = None
    # What grouping reads of its devices whatever the selectors (allocator.columns.pool_columns):
    # the same for every inventory that takes this pool over.
    columns: Any = None
    _counters_key: tuple[tuple[str, tuple[tuple[str, Fraction | int], ...]], ...] | None = None
    # What a device alone asks of these counters, answered (allocator.funnel): shared by the pools
    # that hold the same counters, found once per pool rather than by hashing its counters per claim.
    alone_answers: dict[Any, str] | None = None

    @property
    def usable(self) -> bool:
        return self.complete and self.invalid is None

    def consumer_keys(self) -> frozenset[DeviceKey]:
        """The keys of the devices that consume counters, for set operations with allocations."""
        if self._consumer_keys is None:
            self._consumer_keys = frozenset(d.key for d in self.devices if d.has_consumes)
        return self._consumer_keys

    def counters_key(self) -> tuple[tuple[str, tuple[tuple[str, Fraction | int], ...]], ...]:
        """The counter sets, hashable: equal for pools that hold the same counters (a dynamic-MIG
        GPU has dozens of counters, each value :func:`hashable`)."""
        if self._counters_key is None:
            self._counters_key = tuple((cs, tuple((name, hashable(v)) for name, v in counters.items()))
                                       for cs, counters in self.counter_sets.items())
        return self._counters_key

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
    # Allocatable devices (usable pools) bound to one node, by node; and those that are not
    # (allNodes, node selectors, per-device selection): every node has to look at the latter.
    local: dict[str, list[Device]] = field(default_factory=dict)
    shared: list[Device] = field(default_factory=list)
    # Devices the funnel looks at one by one (few, usually none): with taints, shareable, consuming
    # counters, and those of usable pools whose CEL input is broken.
    tainted: list[Device] = field(default_factory=list)
    multi: list[Device] = field(default_factory=list)
    consumers: list[Device] = field(default_factory=list)
    unclean: list[Device] = field(default_factory=list)
    unusable: list[Pool] = field(default_factory=list)  # incomplete or invalid pools
    # Groups of devices by what selectors read (allocator.groups), built on first use.
    partitions: Any = None
    # The node lists the node filter visits, by the groups that decide them (allocator.resolve).
    visits: dict[Any, tuple[list[Any], list[int]]] = field(default_factory=dict)
    # The nodes named by slices (or one anonymous node), for a claim that names none; their
    # positions by name, and the positions of those without allocatable devices of their own.
    nodes: list[Node] = field(default_factory=list)
    node_positions: dict[str, int] = field(default_factory=dict)
    idle_positions: list[int] = field(default_factory=list)

    def devices_on(self, node: Node) -> list[Device]:
        """Allocatable devices (usable pools) reachable from ``node``, in search order."""
        local = self.local.get(node.name, []) if node.name else []
        shared = [d for d in self.shared if on_node(d, node)]
        if not shared:
            return local
        return sorted(local + shared, key=lambda d: d.index)

    def pool_of(self, d: Device) -> Pool:
        return self.pool_map[(d.key[0], d.key[1])]


class Prebuilt:
    """Pools digested from slices as they arrive, before any inventory holds them: the controller
    starts on them while the API server is still sending the rest (at 5,000 nodes the slices take
    seconds to arrive, and digesting their 116,000 devices as long again). :func:`build_inventory`
    takes over those whose slices it is given unchanged (the same objects)."""

    def __init__(self) -> None:
        self.pools: dict[tuple[str, str], Pool] = {}
        self._members: dict[tuple[str, str], list[tuple[Mapping[str, Any], int]]] = {}
        self._added = 0
        self._checked: dict[int, Checked] = {}
        self._digests: Digests = {}

    def add(self, slices: Sequence[Mapping[str, Any]]) -> None:
        """Digest the pools of ``slices``, those that arrived after the ones added before, once
        their newest generation is all there: a dynamic-MIG pool's four slices come in different
        batches, and digesting it at each of them cost start-up twice the digest of the fleet. A
        pool left incomplete is digested by :func:`build_inventory`; one that grows again (a new
        generation) is digested again."""
        groups, _ = _grouped(slices, start=self._added)
        self._added += len(slices)
        for key, members in groups.items():
            everything = self._members.setdefault(key, [])
            everything.extend(members)
            if _all_there(everything):
                self.pools[key] = _build_pool(*key, everything, self._checked, self._digests)


def _pool_field(sl: Mapping[str, Any], name: str) -> int:
    return as_int(as_mapping(as_mapping(as_mapping(sl).get("spec")).get("pool")).get(name)) or 0


def _newest(slices: Iterable[Mapping[str, Any]]) -> tuple[int, list[Mapping[str, Any]], int]:
    """A pool's newest generation, its slices among ``slices``, and how many it says it has."""
    members = list(slices)
    top = max(_pool_field(sl, "generation") for sl in members)
    current = [sl for sl in members if _pool_field(sl, "generation") == top]
    return top, current, _pool_field(current[0], "resourceSliceCount")


def _all_there(members: Sequence[tuple[Mapping[str, Any], int]]) -> bool:
    """Whether the newest generation among a pool's slices has as many as it says it has."""
    _, current, expected = _newest(sl for sl, _ in members)
    return len(current) == expected


def _grouped(slices: Iterable[Mapping[str, Any]],
             start: int = 0) -> tuple[dict[tuple[str, str], list[tuple[Mapping[str, Any], int]]], list[str]]:
    """Slices (with their positions in the input, from ``start``) by (driver, pool), and the
    problems of those without."""
    problems: list[str] = []
    groups: dict[tuple[str, str], list[tuple[Mapping[str, Any], int]]] = {}
    for i, sl in enumerate(slices, start):
        spec = as_mapping(as_mapping(sl).get("spec"))
        driver, pool = as_str(spec.get("driver")), as_str(as_mapping(spec.get("pool")).get("name"))
        if not driver or not pool:
            problems.append(f"slice #{i} ({_slice_name(sl, i)}): missing driver or pool name, ignored")
            continue
        groups.setdefault((driver, pool), []).append((sl, i))
    return groups, problems


def build_inventory(slices: Iterable[RawSlice], previous: Inventory | None = None,
                    prebuilt: Prebuilt | None = None) -> Inventory:
    """Group slices into pools (highest generation only) and digest their devices.

    ``previous``, an inventory built earlier (the controller's last one), lends its pools whose
    slices are unchanged (the same objects, or equal ones), so a slice update costs the digest of
    its own pool only. ``prebuilt`` lends the pools it digested from the same slice objects; they
    become this inventory's own, so ``prebuilt`` is spent.
    """
    groups, problems = _grouped(slices)
    earlier = previous.pool_map if previous is not None else {}
    fresh = prebuilt.pools if prebuilt is not None else {}
    checked: dict[int, Checked] = {}
    digests: Digests = {}
    devices: list[Device] = []
    pools: list[Pool] = []
    for (driver, name), members in sorted(groups.items()):
        sources = [sl for sl, _ in members]
        built = _reused(earlier.get((driver, name)), sources, len(devices))
        if built is None:
            built = fresh.pop((driver, name), None)
            if built is None or not _same_sources(built, sources):
                built = _build_pool(driver, name, members, checked, digests)
            # Numbered in place: no inventory holds a fresh pool yet.
            for i, dev in enumerate(built.devices):
                dev.index = len(devices) + i
        pools.append(built)
        devices.extend(built.devices)
        problems.extend(built.problems)
    inventory = Inventory(pools, devices, {}, [], problems, {(p.driver, p.name): p for p in pools})
    for built in pools:
        usable = built.usable
        if not usable:
            inventory.unusable.append(built)
        for dev in built.devices:
            inventory.by_key.setdefault(dev.key, dev)
            if dev.taints:
                inventory.tainted.append(dev)
            if dev.allow_multi:
                inventory.multi.append(dev)
            if dev.has_consumes:
                inventory.consumers.append(dev)
            if not usable:
                continue
            if not dev.cel_clean:
                inventory.unclean.append(dev)
            if dev.node_name:
                inventory.local.setdefault(dev.node_name, []).append(dev)
            else:
                inventory.shared.append(dev)
    inventory.node_names = sorted({d.node_name for d in devices if d.node_name})
    inventory.nodes = [Node(n) for n in inventory.node_names] if inventory.node_names else [Node(None)]
    inventory.node_positions = {n: i for i, n in enumerate(inventory.node_names)}
    inventory.idle_positions = [i for i, n in enumerate(inventory.node_names) if n not in inventory.local]
    return inventory


def _same_sources(pool: Pool, members: list[Mapping[str, Any]], *, equal: bool = False) -> bool:
    """Whether ``pool`` was digested from these slices (the very objects, or with ``equal`` equal
    ones), all named: an unnamed slice is named in messages by its position, which may differ."""
    return len(pool.sources) == len(members) and all(
        (old is new or (equal and old == new)) and as_str(as_mapping(as_mapping(new).get("metadata")).get("name"))
        for old, new in zip(pool.sources, members, strict=True))


def _reused(pool: Pool | None, members: list[Mapping[str, Any]], start: int) -> Pool | None:
    """``pool`` for these slices, its devices numbered from ``start``; None when the slices differ."""
    if pool is None or not _same_sources(pool, members, equal=True):
        return None
    if not pool.devices or pool.devices[0].index == start:
        return pool
    moved = [replace(d, index=start + i) for i, d in enumerate(pool.devices)]
    return replace(pool, devices=moved)


def _slice_name(sl: Any, index: int) -> str:
    return as_str(as_mapping(as_mapping(sl).get("metadata")).get("name")) or f"slice-{index}"


def _build_pool(driver: str, name: str, sources: list[tuple[Mapping[str, Any], int]],
                checked: dict[int, Checked], digests: Digests) -> Pool:
    """``sources``: the pool's slices with their positions in the input (which name a slice without a
    name); ``checked``: see :func:`~dra_driver.allocator.slicechecks.checked_once`; ``digests``: see
    :func:`_digest_consumes`."""
    members = [{**sl, "_index": i} for sl, i in sources]

    top, newest, expected = _newest(members)
    current = sorted(newest, key=lambda s: _slice_name(s, s["_index"]))
    pool = Pool(driver, name, top, expected, [_slice_name(s, s["_index"]) for s in current],
                complete=len(current) == expected, invalid=None, counter_sets={},
                sources=tuple(sl for sl, _ in sources))  # fmt: skip
    if not pool.complete:
        pool.problems.append(f"pool {pool.label}: incomplete ({len(current)} of {expected} slices of generation {top})")
    seen: set[str] = set()
    for sl in current:
        _add_slice(pool, sl, seen, pool.problems, checked, digests)
    return pool


def _add_slice(pool: Pool, sl: Mapping[str, Any], seen: set[str], problems: list[str],
               checked: dict[int, Checked], digests: Digests) -> None:
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
        dev = _build_device(pool, sname, as_mapping(raw), problems, checked, digests)
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


def _build_device(pool: Pool, sname: str, raw: Mapping[str, Any], problems: list[str],
                  checked: dict[int, Checked], digests: Digests) -> Device | None:
    name = as_str(raw.get("name"))
    if not name:
        problems.append(f"slice {sname}: device without a name ignored")
        return None
    _, attributes_clean, local = checked_once(checked, raw.get("attributes"), partial(check_attributes, checked=checked))
    _, capacity_clean, capacity_problems = checked_once(checked, raw.get("capacity"), check_capacity)
    local += capacity_problems
    # Checked and digested now, each map once per build (_digest_consumes).
    entries = as_list(raw.get("consumesCounters"))
    for entry in entries:
        local += checked_once(checked, as_mapping(entry).get("counters"), check_counters)[2]
    if local:
        problems.extend(f"device {pool.label}/{name}: {p}" for p in local)
    selector = raw.get("nodeSelector")
    taints = raw.get("taints")
    return Device(
        key=(pool.driver, pool.name, name), index=0, slice_name=sname, raw=raw,
        node_name=as_str(raw.get("nodeName")), all_nodes=raw.get("allNodes") is True,
        node_selector=selector if selector is not None and isinstance(selector, Mapping) else None,
        per_device_node=False, allow_multi=raw.get("allowMultipleAllocations") is True,
        binds_to_node=raw.get("bindsToNode") is True,
        taints=tuple(as_mapping(t) for t in as_list(taints)) if taints else (),
        problems=local, cel_clean=attributes_clean and capacity_clean, has_consumes=bool(entries),
        _consumes=_digest_consumes(entries, digests) if entries else [],
    )  # fmt: skip


# =========================================================================== allocated state


@dataclass
class AllocatedState:
    """What other claims hold: exclusive devices and consumed shared capacity."""

    devices: set[DeviceKey] = field(default_factory=set)
    # Consumed capacity of shared devices, keyed as the results wrote it (1.36, 1.37) ...
    shared: dict[DeviceKey, dict[str, Fraction]] = field(default_factory=dict)
    # ... and by fully-qualified name (1.38: NewDeviceConsumedCapacity, where a result's entry
    # qualified with the device's driver wins over its unqualified twin).
    shared_qualified: dict[DeviceKey, dict[str, Fraction]] = field(default_factory=dict)
    consumers: dict[DeviceKey, list[str]] = field(default_factory=dict)  # namespace/name of the claims sharing a device
    # Claims with a negative consumedCapacity: namespace/name -> what kube-scheduler 1.38 says of
    # it (allocateddevices.go consumedCapacityError).
    invalid: dict[str, str] = field(default_factory=dict)

    def shared_by(self, qualified: bool) -> dict[DeviceKey, dict[str, Fraction]]:
        """:attr:`shared` or, with the rules' ``qualified_names``, :attr:`shared_qualified`."""
        return self.shared_qualified if qualified else self.shared


def allocated_state(claims: Iterable[Mapping[str, Any]], exclude_uid: str | None = None) -> AllocatedState:
    state = AllocatedState()
    for claim in claims:
        meta = as_mapping(as_mapping(claim).get("metadata"))
        if exclude_uid is not None and meta.get("uid") == exclude_uid:
            continue
        owner = f"{as_str(meta.get('namespace')) or 'default'}/{as_str(meta.get('name')) or '?'}"
        allocation = as_mapping(as_mapping(as_mapping(claim).get("status")).get("allocation"))
        results = as_list(as_mapping(allocation.get("devices")).get("results"))
        negative = _negative_capacity(owner, results)
        if negative is not None:
            state.invalid[owner] = negative
        for res in results:
            res = as_mapping(res)
            if res.get("adminAccess") is True:
                continue  # admin access never blocks other users
            key = (as_str(res.get("driver")) or "", as_str(res.get("pool")) or "", as_str(res.get("device")) or "")
            if res.get("shareID") is None and not res.get("consumedCapacity"):
                state.devices.add(key)
                continue
            used = state.shared.setdefault(key, {})
            qualified = state.shared_qualified.setdefault(key, {})
            owners = state.consumers.setdefault(key, [])
            if owner not in owners:
                owners.append(owner)
            mine: dict[str, Fraction] = {}
            for cname, val in as_mapping(res.get("consumedCapacity")).items():
                q = quantity_or_none(val)
                if q is None:
                    continue
                used[cname] = used.get(cname, Fraction(0)) + q.value  # keyed as written (see Device.capacity)
                if "/" in cname or f"{key[0]}/{cname}" not in mine:
                    mine[cname if "/" in cname else f"{key[0]}/{cname}"] = q.value
            for cname, value in mine.items():
                qualified[cname] = qualified.get(cname, Fraction(0)) + value
    return state


def _negative_capacity(owner: str, results: list[Any]) -> str | None:
    """kube-scheduler 1.38's complaint about a claim with a negative consumedCapacity (every
    result, names in order), None when it has none."""
    for res in results:
        res = as_mapping(res)
        consumed = as_mapping(res.get("consumedCapacity"))
        for cname in sorted(consumed):
            q = quantity_or_none(consumed[cname])
            if q is not None and q.value < 0:
                device = "/".join(as_str(res.get(k)) or "" for k in ("driver", "pool", "device"))
                return (f"claim {owner}, device {device}: consumed capacity \"{cname}\" must not be negative, "
                        f"got {consumed[cname]}")
    return None


def on_node(dev: Device, node: Node) -> bool:
    if dev.node_name:
        return dev.node_name == node.name
    if dev.all_nodes:
        return True
    if dev.node_selector is not None:
        return selector_matches(dev.node_selector, node)
    return False
