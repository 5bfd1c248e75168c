"""Devices grouped by what a request's selectors read, and selector outcomes cached by those values.

A fleet publishes thousands of devices that differ only in fields no selector looks at (UUID, PCI
address, index): a selector on ``productName`` sees four kinds of device in 40,000. A
:class:`Partition` groups an inventory's devices by the values a :class:`Projection` names (the
fields the selectors read, :mod:`dra_driver.allocator.cel.reads`, and what the later stages of the
funnel look at), so the funnel and the search decide once per group; the grouping reads the
devices column-wise (:mod:`dra_driver.allocator.columns`). :func:`outcome` caches a
selector's outcome by the values it reads, across claims and inventories.

Only devices of usable pools whose CEL input is clean are grouped; the others (an attribute with
two value types, a capacity that is not a quantity) are looked at one by one, as is every device
when a selector reads ``device`` as a whole.
"""

from __future__ import annotations

import json
import threading
from array import array
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain
from operator import itemgetter
from typing import Any

from dra_driver.allocator.cel.compile import CompiledSelector, DeviceActivation, device_activation
from dra_driver.allocator.cel.errors import CelRuntimeError
from dra_driver.allocator.cel.reads import Domain, Reads
from dra_driver.allocator.columns import Alike, Profile, pool_columns, reading
from dra_driver.allocator.inventory import (
    Device,
    DeviceKey,
    Inventory,
    Pool,
    hashable,
    quantity_or_none,
)
from dra_driver.allocator.slicechecks import attribute_value
from dra_driver.k8s.objects import as_mapping

MAX_PARTITIONS = 32  # per inventory; each costs about 5 bytes per device
MAX_OUTCOMES = 16384  # selector outcomes kept, all selectors together


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


ABSENT = _Marker("ABSENT")  # the field is not published, others of its domain are
NO_DOMAIN = _Marker("NO_DOMAIN")  # nothing of the field's domain is published
BOTH = _Marker("BOTH")  # a name is published both unqualified and qualified with the driver


@dataclass(frozen=True)
class Projection:
    """What a group's devices agree on: the selectors' reads, and for the funnel's later stages the
    capacities with their request policies (``capacity``) and whether a device is shareable or
    consumes counters (``flags``)."""

    reads: Reads
    capacity: bool = False
    flags: bool = False
    within: tuple[str, ...] = ()
    """The class selectors (their expressions) a device must pass for its values to be read: the
    devices they reject are grouped as the class's own projection groups them (:data:`OUTSIDE`)."""


OUTSIDE = _Marker("OUTSIDE")
"""A device the class rejects, in a partition :attr:`Projection.within` the class: the request's
selectors never see it, so what they read of it need not be read. A GPU class on a fleet with
dynamic MIG rejects two devices in three."""


@dataclass(frozen=True)
class Coarse:
    """The class's partition and which of its groups the class accepts, for :func:`partition`."""

    partition: Partition
    accepted: frozenset[int]


class Group:
    """Devices that agree on a projection; ``members`` are device indices in inventory order."""

    __slots__ = ("_alone_unfit", "_by_node", "_by_pool", "_keys", "_nodes_with", "_nodes_with_others", "_positions_with",
                 "key", "members", "rep")

    def __init__(self, key: tuple[Any, ...], rep: Device) -> None:
        self.key = key
        self.rep = rep
        self.members = array("i")
        self._keys: frozenset[DeviceKey] | None = None
        self._by_node: dict[str, list[Device]] | None = None
        self._nodes_with: dict[int, frozenset[str]] = {}
        self._positions_with: dict[int, list[int]] = {}
        # Other groups are named by id: they belong to the same partition, which outlives this cache.
        self._nodes_with_others: dict[tuple[tuple[int, ...], int], frozenset[str]] = {}
        self._by_pool: dict[tuple[str, str], list[Device]] | None = None
        self._alone_unfit: dict[tuple[str, str], list[Device]] = {}

    def by_pool(self, devices: list[Device]) -> dict[tuple[str, str], list[Device]]:
        """The members by (driver, pool)."""
        if self._by_pool is None:
            out: dict[tuple[str, str], list[Device]] = {}
            for i in self.members:
                d = devices[i]
                out.setdefault((d.key[0], d.key[1]), []).append(d)
            self._by_pool = out
        return self._by_pool

    def alone_unfit(self, pool: tuple[str, str], reason: Callable[[Device], str | None]) -> list[Device]:
        """The members of ``pool`` for which ``reason`` (what they ask of the pool's counters when
        nothing else consumes any: fixed for an inventory) is not None."""
        found = self._alone_unfit.get(pool)
        if found is None:
            assert self._by_pool is not None
            found = self._alone_unfit[pool] = [d for d in self._by_pool[pool] if reason(d) is not None]
        return found

    def nodes_with(self, count: int, devices: list[Device]) -> frozenset[str]:
        """The nodes with at least ``count`` members."""
        found = self._nodes_with.get(count)
        if found is None:
            found = self._nodes_with[count] = frozenset(n for n, ds in self.by_node(devices).items() if len(ds) >= count)
        return found

    def nodes_with_others(self, others: list[Group], count: int, devices: list[Device]) -> frozenset[str]:
        """The nodes with at least ``count`` members of this group and ``others`` together (kept
        here: the same selectors accept the same groups claim after claim)."""
        key = (tuple(id(g) for g in others), count)
        found = self._nodes_with_others.get(key)
        if found is None:
            total: Counter[str] = Counter()
            for group in (self, *others):
                for n, ds in group.by_node(devices).items():
                    total[n] += len(ds)
            found = self._nodes_with_others[key] = frozenset(n for n, c in total.items() if c >= count)
        return found

    def positions_with(self, count: int, devices: list[Device], positions: dict[str, int]) -> list[int]:
        """:meth:`nodes_with` as positions in the inventory's node list, in order."""
        found = self._positions_with.get(count)
        if found is None:
            found = self._positions_with[count] = sorted(positions[n] for n in self.nodes_with(count, devices))
        return found

    def keys(self, devices: list[Device]) -> frozenset[DeviceKey]:
        """The members' keys, for set operations with other claims' allocations."""
        if self._keys is None:
            self._keys = frozenset(devices[i].key for i in self.members)
        return self._keys

    def by_node(self, devices: list[Device]) -> dict[str, list[Device]]:
        """The members by the node they are bound to (all are, where the search uses this)."""
        if self._by_node is None:
            out: dict[str, list[Device]] = {}
            for i in self.members:
                d = devices[i]
                out.setdefault(d.node_name or "", []).append(d)
            self._by_node = out
        return self._by_node


@dataclass
class Partition:
    projection: Projection
    groups: list[Group]
    group_of: array[int]  # device index -> group number, -1 for a device looked at alone

    def group(self, dev: Device) -> Group | None:
        g = self.group_of[dev.index]
        return self.groups[g] if g >= 0 else None


class _Partitions:
    """An inventory's partitions, the most recently used kept."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.built: OrderedDict[Projection, Partition] = OrderedDict()


def partition(inventory: Inventory, projection: Projection,
              coarse: Callable[[], Coarse] | None = None) -> Partition:
    """The inventory's devices grouped by ``projection`` (built once per inventory and projection).
    ``coarse``, required when the projection is :attr:`~Projection.within` a class, gives the
    class's partition and verdicts, when the partition must be built."""
    cache = inventory.partitions
    if cache is None:
        cache = inventory.partitions = _Partitions()
    assert isinstance(cache, _Partitions)
    with cache.lock:
        found = cache.built.get(projection)
        if found is not None:
            cache.built.move_to_end(projection)
            return found
    if projection.within and coarse is None:
        raise ValueError("a partition within a class needs the class's partition")
    built = _build(inventory, projection, coarse() if projection.within and coarse is not None else None)
    with cache.lock:
        cache.built[projection] = built
        while len(cache.built) > MAX_PARTITIONS:
            cache.built.popitem(last=False)
    return built


def _build(inventory: Inventory, projection: Projection, coarse: Coarse | None) -> Partition:
    grouping = _Grouping(inventory, projection, coarse)
    start = 0
    for pool in inventory.pools:
        size = len(pool.devices)
        start, first = start + size, start  # a pool's devices are consecutive in the inventory
        if pool.usable and size:
            grouping.add(pool, first)
    return Partition(projection, grouping.groups, grouping.group_of)


class _Grouping:
    """A partition being built, pool by pool: devices numbered by signature
    (:mod:`dra_driver.allocator.columns`), each signature's key read from its first device, groups
    numbered in the order of their first device. A device the class rejects is signed by its class
    group alone: an int, never a tuple."""

    def __init__(self, inventory: Inventory, projection: Projection, coarse: Coarse | None) -> None:
        self.group_of = array("i", [-1]) * len(inventory.devices)
        self.groups: list[Group] = []
        self._numbers: dict[Any, int] = {}  # key -> group number
        self._number_of: dict[Any, int] = {}  # signature -> group number
        self._profiles: dict[Profile, Any] = {}  # profile -> the signature its devices share (or None)
        self._key_of = key_function(projection)
        self._names, self._whole = reading(projection.reads, projection.capacity)
        self._outside = coarse.partition.group_of if coarse is not None else None
        self._accepted = coarse.accepted if coarse is not None else frozenset()

    def add(self, pool: Pool, first: int) -> None:
        """The devices of ``pool``, the first of them at ``first`` in the inventory."""
        cols = pool_columns(pool)
        size = len(pool.devices)
        classes = self._outside[first:first + size] if self._outside is not None else None
        if cols.whole:  # the usual pool: its devices read alike, one signature
            sig = self._common(cols.alike[0].profile, classes)
            if sig is not None:
                g = self._number(sig, pool.devices[0])
                self.group_of[first:first + size] = array("i", [g]) * size
                self.groups[g].members.extend(range(first, first + size))
                return
        self._add_sets(pool, first, [(same.positions, self._signatures(pool, same, classes)) for same in cols.alike])

    def _number(self, sig: Any, dev: Device) -> int:
        g = self._number_of.get(sig)
        if g is None:
            key = (OUTSIDE, sig) if type(sig) is int else self._key_of(dev)
            g = self._numbers.get(key)
            if g is None:
                g = self._numbers[key] = len(self.groups)
                self.groups.append(Group(key, dev))
            self._number_of[sig] = g
        return g

    def _common(self, profile: Profile, classes: Sequence[int] | None) -> Any:
        """The one signature of devices alike that the class puts in ``classes``: the class group
        where the class rejects them all as one group, else what they read alike; None where
        they may differ."""
        if classes is not None:
            if classes.count(classes[0]) != len(classes):
                return None
            if classes[0] not in self._accepted:
                return classes[0]
        if profile not in self._profiles:
            self._profiles[profile] = profile.signature(self._names, self._whole)
        return self._profiles[profile]

    def _signatures(self, pool: Pool, same: Alike, classes: array[int] | None) -> Any:
        """The one signature of a set of devices alike, or (a list) each device's."""
        some = [classes[j] for j in same.positions] if classes is not None else None
        sig = self._common(same.profile, some)
        if sig is not None:
            return sig
        sigs: list[Any] = same.signatures(pool, self._names, self._whole)
        if some is not None:
            sigs = [s if c in self._accepted else c for s, c in zip(sigs, some, strict=True)]
        return sigs

    def _add_sets(self, pool: Pool, first: int, sets: list[tuple[list[int], Any]]) -> None:
        """The devices of a pool that are not all alike: ``sets`` holds, for each set of devices
        alike, their positions in the pool and their one signature or (a list) each one's. New
        signatures are numbered in device order, and each group's members stay in order."""
        seen: list[tuple[int, Any]] = []
        for positions, sig in sets:
            seen.extend(zip(positions, sig, strict=True) if type(sig) is list else [(positions[0], sig)])
        seen.sort(key=itemgetter(0))
        numbered = {sig: self._number(sig, pool.devices[j]) for j, sig in seen}
        chunks: dict[int, list[list[int]]] = {}  # group -> runs of its members, each in order
        for positions, sig in sets:
            gs = list(map(numbered.__getitem__, sig)) if type(sig) is list else [numbered[sig]] * len(positions)
            runs: dict[int, list[int]] = {}
            for j, g in zip(positions, gs, strict=True):
                self.group_of[first + j] = g
                runs.setdefault(g, []).append(first + j)
            for g, run in runs.items():
                chunks.setdefault(g, []).append(run)
        for g, found in chunks.items():
            self.groups[g].members.extend(found[0] if len(found) == 1 else sorted(chain.from_iterable(found)))


# --------------------------------------------------------------------------- the values read


@lru_cache(maxsize=256)
def key_function(projection: Projection) -> Callable[[Device], tuple[Any, ...]]:
    """The tuple of values ``projection`` names, for a device whose CEL input is clean."""
    reads = projection.reads
    assert not reads.whole
    fields = [(kind, domain, name, f"{domain}/{name}") for kind, domain, name in reads.fields]
    domains = list(reads.domains)

    def key(dev: Device) -> tuple[Any, ...]:
        raw = dev.raw
        driver = dev.key[0]
        parts: list[Any] = []
        if reads.driver:
            parts.append(driver)
        if reads.multi:
            parts.append(dev.allow_multi)
        for kind, domain, name, qualified in fields:
            parts.append(_field_value(as_mapping(raw.get(kind)), kind, driver, domain, name, qualified))
        for domain_ in domains:
            parts.append(_domain_value(as_mapping(raw.get(domain_[0])), driver, domain_))
        if projection.capacity:
            parts.append(remembered(_SIGNATURES, raw.get("capacity"), _capacity_signature))
        if projection.flags:
            parts.append((dev.allow_multi, dev.has_consumes))
        return tuple(parts)

    return key


# What a published entry reads as, by the entry object: the informers share equal entries between
# devices (dra_driver.k8s.compact), so 40,000 GPUs carry a handful of them. Each table keeps the
# entries it was asked about alive, so an id is never reused while it is in the table.
_ATTRIBUTE_VALUES: dict[int, tuple[Any, Any]] = {}
_QUANTITIES: dict[int, tuple[Any, Any]] = {}
_SIGNATURES: dict[int, tuple[Any, Any]] = {}
MAX_REMEMBERED = 4096  # per table: a handful of shared entries, or a bounded churn of unshared ones


def remembered(table: dict[int, tuple[Any, Any]], entry: Any, read: Callable[[Any], Any]) -> Any:
    """``read(entry)``, worked out once per entry object that ``table`` holds."""
    found = table.get(id(entry))
    if found is not None and found[0] is entry:
        return found[1]
    value = read(entry)
    if len(table) >= MAX_REMEMBERED:
        table.clear()
    table[id(entry)] = (entry, value)
    return value


def read_key(dev: Device, reads: Reads) -> tuple[Any, ...]:
    return key_function(Projection(reads))(dev)


def _domain_of(name: str, driver: str) -> str:
    return name.partition("/")[0] if "/" in name else driver


def _has_domain(raw: Mapping[str, Any], driver: str, domain: str) -> bool:
    return any(_domain_of(name, driver) == domain for name in raw)


def _field_value(raw: Mapping[str, Any], kind: str, driver: str, domain: str, name: str, qualified: str) -> Any:
    """What the activation holds at ``device.<kind>[domain][name]``, as a hashable value.

    Names split at the first ``/`` (an unqualified one belongs to the driver), so a domain with a
    ``/`` is never there. A capacity keeps both spellings that reach the field (``memory`` and
    ``<driver>/memory``) and which came last, because the explanation reads them in its own order.
    An entry is read through :func:`remembered`: devices share equal entries."""
    if "/" in domain:
        return NO_DOMAIN
    long_entry = raw.get(qualified)
    short_entry = raw.get(name) if domain == driver and "/" not in name else None
    value: Any = None
    if kind == "attributes":
        if long_entry is not None and short_entry is not None:
            # Both published: both values and which came last, as for a capacity (which of them
            # the field holds depends on the scheduler version, see device_activation).
            names = list(raw)
            value = (BOTH, attribute_value(long_entry), attribute_value(short_entry),
                     names.index(qualified) > names.index(name))
        elif long_entry is not None or short_entry is not None:
            value = remembered(_ATTRIBUTE_VALUES, long_entry if long_entry is not None else short_entry,
                                attribute_value)
    else:
        long_q = remembered(_QUANTITIES, long_entry, _quantity) if long_entry is not None else None
        short_q = remembered(_QUANTITIES, short_entry, _quantity) if short_entry is not None else None
        if long_q is not None or short_q is not None:
            long_last = False
            if long_q is not None and short_q is not None:
                names = list(raw)
                long_last = names.index(qualified) > names.index(name)
            value = (long_q, short_q, long_last)
    if value is not None:
        return value
    return ABSENT if _has_domain(raw, driver, domain) else NO_DOMAIN


def _quantity(entry: Any) -> Any:
    """A quantity's value for a group key, :func:`hashable`: grouping hashes one key per device
    (116,000 at 5,000 nodes)."""
    if entry is None:
        return None
    q = quantity_or_none(as_mapping(entry).get("value"))
    return hashable(q.value) if q is not None else None


def _domain_value(raw: Mapping[str, Any], driver: str, domain: Domain) -> Any:
    kind, wanted = domain
    merged: dict[str, Any] = {}
    spelled: list[tuple[str, Any]] = []
    twice = False
    for name, entry in raw.items():
        if _domain_of(name, driver) != wanted:
            continue
        ident = name.partition("/")[2] if "/" in name else name
        value = attribute_value(entry) if kind == "attributes" else _quantity(entry)
        twice = twice or ident in merged
        merged[ident] = value
        spelled.append((name, value))
    if twice:
        # One identifier published both ways: the entries as published, in order (which of them
        # the domain's map holds depends on the scheduler version, see device_activation).
        return (BOTH, tuple(spelled))
    return tuple(sorted(merged.items())) if merged else NO_DOMAIN


def _capacity_signature(raw: Any) -> tuple[Any, ...]:
    """Everything the capacity checks read of a device: names in order, values, request policies."""
    out = []
    for name, entry in as_mapping(raw).items():
        policy = as_mapping(as_mapping(entry).get("requestPolicy"))
        out.append((name, _quantity(entry), json.dumps(policy, sort_keys=True, default=repr) if policy else None))
    return tuple(out)


# --------------------------------------------------------------------------- selector outcomes

Outcome = bool | CelRuntimeError

_OUTCOMES: OrderedDict[tuple[str, bool, tuple[Any, ...]], Outcome] = OrderedDict()
_OUTCOMES_LOCK = threading.Lock()


def outcome(sel: CompiledSelector, dev: Device, qualified_first: bool = False, on_read: bool = False) -> Outcome:
    """``sel`` on ``dev``: True, False, or the runtime error. Cached by the values the selector reads
    for a device with a clean CEL input (a poisoned selector is never looked up: it fails).
    ``qualified_first``, ``on_read``: see :func:`device_activation` (the rules' ``qualified_names``,
    ``cel_converts_on_read``; the latter changes nothing for a clean input)."""
    cacheable = dev.cel_clean and not sel.reads.whole and sel.poisoned is None
    if cacheable:
        key = (sel.expression, qualified_first, read_key(dev, sel.reads))
        with _OUTCOMES_LOCK:
            found = _OUTCOMES.get(key)
        if found is not None:
            return found
    result: Outcome
    try:
        result = sel.evaluate(_activation(dev, sel.reads, qualified_first) if cacheable
                              else dev.activation_for(qualified_first, on_read))
    except CelRuntimeError as exc:
        result = exc
    if cacheable and sel.poisoned is None:
        with _OUTCOMES_LOCK:
            _OUTCOMES[key] = result
            while len(_OUTCOMES) > MAX_OUTCOMES:
                _OUTCOMES.popitem(last=False)
    return result


def _activation(dev: Device, reads: Reads, qualified_first: bool) -> DeviceActivation:
    """The device's CEL input with only what ``reads`` names (the outcome depends on nothing else):
    a device publishing a dozen attributes costs the conversion of one or two."""
    driver = dev.key[0]
    attributes = as_mapping(dev.raw.get("attributes"))
    capacity = as_mapping(dev.raw.get("capacity"))
    return device_activation(driver, _subset(attributes, driver, reads, "attributes"),
                             _subset(capacity, driver, reads, "capacity"), dev.allow_multi, qualified_first)


def _subset(raw: Mapping[str, Any], driver: str, reads: Reads, kind: str) -> dict[str, Any]:
    # In published order: where two spellings name one field, the later one wins, as in the whole.
    fields = {(d, n) for k, d, n in reads.fields if k == kind}
    domains = {d for k, d in reads.domains if k == kind}
    out = {}
    for name, entry in raw.items():
        domain, _, ident = name.partition("/") if "/" in name else (driver, "", name)
        if domain in domains or (domain, ident) in fields:
            out[name] = entry
    return out
