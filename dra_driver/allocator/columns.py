"""What grouping reads of a pool's devices, worked out once per pool, so that grouping a fleet by a
selector nothing has read before costs a few steps per pool instead of a Python call per device.

:mod:`dra_driver.allocator.groups` groups devices by the key of what a projection reads. Worked out
device by device, that key cost a Python call and a few lookups in each device's maps, paid by the
first claim whose selector reads a field nothing had read before: a person's ``explain`` of a new
selector, or the controller meeting a new template.

Here a device's *signature* stands for its key: a *base* number for its driver, its flags and the
names its attribute and capacity maps publish in order (which spelling of a name comes last,
whether a domain is published at all), then the identity of each entry the projection reads, and
of each whole map it reads. Two devices with one signature have equal keys: the key is a function
of the driver, the flags, the names in order and the contents of what is read, and one object has
one content (slices are never edited in place once handed over). Devices with different signatures
may still have equal keys: the key is read once per signature, from its first device, and equal
keys make one group.

A node's GPUs differ in a few attributes (UUID, index, PCI address) and agree on every other entry.
:class:`PoolColumns` records, once per pool, which names hold different entries on its devices
(compared as values: equal entries give equal keys): a projection that reads none of them gives
the pool's devices one signature, the first device's. Decoded slices share equal entries
(:mod:`dra_driver.k8s.compact`), so the pools of one model share a :class:`Profile`, and a
projection finds that signature once per profile. A pool where a name read differs gets a
signature per device.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Mapping
from itertools import repeat
from operator import eq, is_, methodcaller
from typing import Any

from dra_driver.allocator.cel.reads import Reads
from dra_driver.allocator.inventory import Device, Pool
from dra_driver.k8s.objects import as_mapping

KINDS = ("attributes", "capacity")
MAX_BASES = 4096  # base numbers remembered; a fleet has a handful of device layouts
MAX_PROFILES = 4096  # profiles remembered, each shared by the pools that publish alike

Name = tuple[str, str]
"""(``attributes`` or ``capacity``, a name as published)."""

# A base number is never given to two different bases: past MAX_BASES the table starts afresh and
# numbering goes on, so a base met again gets a new number (one more signature, the same key).
_BASES: dict[tuple[Any, ...], int] = {}
_NUMBERS = itertools.count()
_PROFILES: dict[tuple[Any, ...], Profile] = {}
_LOCK = threading.Lock()


class PoolColumns:
    """What every projection reads of a pool's grouped devices (those whose CEL input is clean),
    as :class:`Alike` sets. Nothing here depends on where the pool's devices sit in an inventory:
    an inventory rebuilt after a slice changed takes it over with the pool."""

    __slots__ = ("alike", "positions", "whole")

    def __init__(self, pool: Pool) -> None:
        devices = pool.devices
        self.positions = [j for j, d in enumerate(devices) if d.cel_clean]
        """The grouped devices' positions in the pool."""
        self.alike = _alike(devices, self.positions)
        self.whole = len(self.alike) == 1 and len(self.positions) == len(devices)
        """Whether one :class:`Alike` holds every device of the pool."""


class Alike:
    """Devices of one pool that publish the same names in the same order, with the same flags: a
    node's GPUs of one model, or a dynamic-MIG node's placements of one profile."""

    __slots__ = ("_maps", "positions", "profile")

    def __init__(self, positions: list[int], profile: Profile) -> None:
        self.positions = positions
        """Their positions in the pool, in order."""
        self.profile = profile
        self._maps: dict[str, list[Mapping[str, Any]]] | None = None

    def signatures(self, pool: Pool, names: list[Name], whole: list[str]) -> list[tuple[Any, ...]]:
        """A signature per device, in order, for a projection that reads the entries ``names`` and
        the maps ``whole``. ``pool``: the pool these were read of, or a copy of it that numbers its
        devices anew."""
        if self._maps is None:
            devices = [pool.devices[j] for j in self.positions]
            self._maps = {kind: _maps(devices, kind) for kind in KINDS}
        maps = self._maps
        parts: list[Iterable[Any]] = [repeat(self.profile.base, len(self.positions))]
        parts.extend(map(id, map(methodcaller("get", name), maps[kind])) for kind, name in names)
        parts.extend(map(id, maps[kind]) for kind in whole)
        return list(zip(*parts, strict=True))


class Profile:
    """What an :class:`Alike` set publishes alike: its base, the names whose entries differ between
    its devices, the kinds whose map is one object for all of them, and the first device's maps.
    Sets whose first devices publish the same objects (and differ in the same names) share one: a
    fleet of one model, one. A projection finds its signature once per profile, not once per pool."""

    __slots__ = ("base", "maps", "same_map", "varying")

    def __init__(self, base: int, maps: dict[str, Mapping[str, Any]], varying: frozenset[Name],
                 same_map: frozenset[str]) -> None:
        self.base = base
        self.maps = maps
        self.varying = varying
        self.same_map = same_map

    def signature(self, names: list[Name], whole: list[str]) -> tuple[Any, ...] | None:
        """The signature the devices share (the first device's) for a projection that reads the
        entries ``names`` and the maps ``whole``; None where their keys may differ."""
        if not self.varying.isdisjoint(names) or not self.same_map.issuperset(whole):
            return None
        return (self.base, *(id(self.maps[kind].get(name)) for kind, name in names),
                *(id(self.maps[kind]) for kind in whole))


def _maps(devices: list[Device], kind: str) -> list[Mapping[str, Any]]:
    return _read(kind, [d.raw for d in devices])


def _read(kind: str, raws: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [m if type(m) is dict else as_mapping(m) for m in map(methodcaller("get", kind), raws)]


def _flags(devices: list[Device]) -> list[tuple[str, bool, bool]]:
    return [(d.key[0], d.allow_multi, d.has_consumes) for d in devices]


def _alike(devices: list[Device], positions: list[int]) -> list[Alike]:
    """The grouped devices (at ``positions``) as :class:`Alike` sets, in the order of their first
    device. The usual pool is one set, found without hashing any device's names."""
    if not positions:
        return []
    grouped = devices if len(positions) == len(devices) else [devices[j] for j in positions]
    flags = _flags(grouped)
    raws = [d.raw for d in grouped]
    maps = {kind: _read(kind, raws) for kind in KINDS}
    if flags.count(flags[0]) == len(flags) and all(map(_same_names, maps.values())):
        return [Alike(positions, _profile(flags[0], maps))]
    by_base: dict[tuple[Any, ...], list[int]] = {}
    bases = zip(flags, map(tuple, maps["attributes"]), map(tuple, maps["capacity"]), strict=True)
    for i, base in enumerate(bases):
        by_base.setdefault(base, []).append(i)
    return [Alike([positions[i] for i in members],
                  _profile(flags[members[0]], {kind: [maps[kind][i] for i in members] for kind in KINDS}))
            for members in by_base.values()]


def _same_names(maps: list[Mapping[str, Any]]) -> bool:
    """Whether the maps publish the same names in the same order."""
    first = maps[0]
    if all(map(is_, maps, repeat(first))):
        return True
    names = tuple(first)
    return all(map(eq, map(tuple, maps), repeat(names)))


def _number(base: tuple[Any, ...]) -> int:
    with _LOCK:
        found = _BASES.get(base)
        if found is None:
            if len(_BASES) >= MAX_BASES:
                _BASES.clear()
            found = _BASES[base] = next(_NUMBERS)
    return found


def _profile(flags: tuple[str, bool, bool], maps: dict[str, list[Mapping[str, Any]]]) -> Profile:
    """The :class:`Profile` (the one already made for sets that publish the same) of devices with
    ``flags`` whose maps ``maps`` publish the same names in the same order."""
    firsts = {kind: ms[0] for kind, ms in maps.items()}
    same_map = frozenset(kind for kind, ms in maps.items() if all(map(is_, ms, repeat(ms[0]))))
    varying: set[Name] = set()
    for kind in KINDS:
        if kind in same_map:
            continue
        # The same names in the same order: each name's entries, one per device, side by side.
        # Equal entries give equal keys (a key holds what its entries say, compared as values), so
        # entries that are equal, one object or not, do not tell the devices apart.
        entries = zip(*map(list, map(methodcaller("values"), maps[kind])), strict=True)
        varying.update((kind, name) for name, alike in zip(firsts[kind], entries, strict=True)
                       if alike.count(alike[0]) != len(alike))
    base = _number((flags, tuple(firsts["attributes"]), tuple(firsts["capacity"])))
    differ = frozenset(varying)
    # The key names objects by id: the profile it finds holds them, so no other object has their id.
    key = (base, differ, same_map,
           *(tuple(id(entry) for name, entry in firsts[kind].items() if (kind, name) not in differ) for kind in KINDS),
           *(id(firsts[kind]) for kind in sorted(same_map)))
    with _LOCK:
        found = _PROFILES.get(key)
        if found is None:
            if len(_PROFILES) >= MAX_PROFILES:
                _PROFILES.clear()
            found = _PROFILES[key] = Profile(base, firsts, differ, same_map)
    return found


def pool_columns(pool: Pool) -> PoolColumns:
    """The pool's :class:`PoolColumns`, read on first use and kept on the pool."""
    found = pool.columns
    if not isinstance(found, PoolColumns):
        found = pool.columns = PoolColumns(pool)
    return found


def reading(reads: Reads, capacity: bool) -> tuple[list[Name], list[str]]:
    """What a signature reads for a projection that reads ``reads`` (never
    :attr:`~Reads.whole`), with ``capacity`` its capacity checks: the entries a field read can
    reach (the qualified name and, for a name without a ``/``, its short spelling, which counts
    where the domain is the device's driver: read for every device, it only tells apart devices
    the key may not; a domain with a ``/`` is never published, so nothing is read for it), and the
    maps read whole (a domain's, the capacity checks')."""
    names: dict[Name, None] = {}
    for kind, domain, name in reads.fields:
        if "/" in domain:
            continue
        names[(kind, f"{domain}/{name}")] = None
        if "/" not in name:
            names[(kind, name)] = None
    whole = {kind for kind, _ in reads.domains} | ({"capacity"} if capacity else set())
    return list(names), sorted(whole)
