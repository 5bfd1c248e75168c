"""Every device of the driver as a person asks about it: where, what, its health, and its state
with who holds it. Pure: computed from :class:`~dra_driver.tools.fleet.reads.FleetObjects` and the
engine's inventory of the same slices; the views (``get gpus``, ``get nodes``, ``top``) read these rows.

A published device's state is decided by :mod:`dra_driver.allocator.devicestates` (the same code
the controller's device metric counts with); a device the node plugin withheld from its slices,
named by a ``DeviceWithheld`` Event, is ``withheld``. For a shared device the row adds what the
claims consume of each capacity (``3 claims, 24Gi/80Gi``). Admin-access results hold nothing;
they are listed among the holders all the same.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any

from dra_driver import apiprofile
from dra_driver.allocator.capacity import show
from dra_driver.allocator.devicestates import (
    ALLOCATED,
    FREE,
    SHARED,
    WITHHELD,
    DeviceState,
    Holding,
    Whole,
    claim_holdings,
    holds,
    is_share,
    model_label,
    pool_states,
    still_withheld,
)
from dra_driver.allocator.inventory import Device, Inventory, allocated_state, quantity_or_none
from dra_driver.allocator.slicechecks import attribute_value
from dra_driver.k8s.objects import as_mapping
from dra_driver.tools.fleet.reads import FleetObjects, pods_by_claim

HEALTHY, UNHEALTHY = "healthy", "unhealthy"


def unhealthy_taint_keys(driver: str) -> tuple[str, ...]:
    """The keys of the taints with which ``driver``'s plugin marks a device unhealthy: this driver's
    ``gpu.dra-driver.io/unhealthy``, or NVIDIA's keys for ``gpu.nvidia.com`` (its profile's)."""
    return apiprofile.for_driver(driver).taints.unhealthy_keys


@dataclass
class Holder:
    claim: str
    """``namespace/name``."""
    pods: list[str] | None
    """``namespace/pod`` of the pods that name the claim; None: not read (hidden, or another namespace)."""
    consumed: dict[str, str] = field(default_factory=dict)
    share: bool = False
    admin: bool = False


@dataclass
class DeviceRow:
    node: str
    driver: str
    pool: str
    device: str
    kind: str
    """``gpu``, ``mig`` or what the device's ``type`` attribute says ("" when it says nothing)."""
    model: str
    memory: str | None
    profile: str | None
    parent: str | None
    health: str
    taints: list[str]
    state: str
    detail: str
    holders: list[Holder] = field(default_factory=list)
    used: dict[str, dict[str, str]] = field(default_factory=dict)
    """For a shared device, per capacity consumed: ``used`` and ``total``."""
    can_make: dict[str, int] | None = None
    """Dynamic MIG, on a GPU: per profile, how many of its placements its counters still allow
    (each alone); None where the GPU is not partitioned per claim."""
    source: DeviceState | None = None
    """The engine's device and its state (for ``--selector``); None for a withheld one."""

    @property
    def model_label(self) -> str:
        """What ``top`` groups by: the product, and the MIG profile of a MIG device."""
        return model_label(self.model, self.profile)


def _memory(dev: Device) -> str | None:
    entry = dev.capacity.get("memory") or dev.capacity.get(f"{dev.key[0]}/memory")
    return show(entry[0].value) if entry is not None else None


class _Memories:
    """:func:`_memory` once per capacity map: the decoded slices share equal maps (a fleet of
    40,000 GPUs publishes a handful), and each device would otherwise parse its own."""

    def __init__(self) -> None:
        self._known: dict[tuple[int, str], tuple[Any, str | None]] = {}

    def of(self, dev: Device) -> str | None:
        capacity = dev.raw.get("capacity")
        key = (id(capacity), dev.key[0])
        found = self._known.get(key)
        if found is None or found[0] is not capacity:
            found = self._known[key] = (capacity, _memory(dev))  # the map kept: its id stays its own
        return found[1]


class _Strings:
    """:func:`~dra_driver.allocator.devicestates.string_attribute` of each of ``names`` (short
    names, in the device's driver's domain), a device's attribute map read once and each published
    entry converted once: the decoded slices share equal entries (a fleet's 40,000 GPUs hold four
    product names)."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = tuple(names)
        self._qualified: dict[str, tuple[tuple[str, str], ...]] = {}
        self._known: dict[int, tuple[Any, str | None]] = {}
        self._maps: dict[tuple[int, str], tuple[Any, list[str | None]]] = {}

    def of(self, dev: Device) -> list[str | None]:
        """Read only: a device that consumes counters (a dynamic MIG placement) shares the list
        with those of the same attribute map (the placements of a profile on a GPU); a GPU's map
        is its own (its UUID), and kept it would only cost memory."""
        raw = as_mapping(dev.raw.get("attributes"))
        driver = dev.key[0]
        if not dev.has_consumes:
            return self._read(raw, driver)
        key = (id(raw), driver)
        found = self._maps.get(key)
        if found is None or found[0] is not raw:
            found = self._maps[key] = (raw, self._read(raw, driver))  # the map kept: its id stays its own
        return found[1]

    def _read(self, raw: Mapping[str, Any], driver: str) -> list[str | None]:
        names = self._qualified.get(driver)
        if names is None:
            names = self._qualified[driver] = tuple((f"{driver}/{n}", n) for n in self._names)
        out: list[str | None] = []
        for qualified, short in names:
            # The qualified spelling wins where both are published (inventory.published_attribute).
            entry = raw.get(qualified)
            if entry is None:
                entry = raw.get(short)
            if entry is None:
                out.append(None)
                continue
            known = self._known.get(id(entry))
            if known is None or known[0] is not entry:
                found = attribute_value(entry)
                known = self._known[id(entry)] = (entry, str(found[1]) if found is not None and found[1] is not None
                                                  else None)  # the entry kept: its id stays its own
            out.append(known[1])
        return out


def _taint_text(taint: Mapping[str, Any]) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key', '')}{value}:{taint.get('effect', '')}"


def _node_of(dev: Device) -> str:
    if dev.node_name:
        return dev.node_name
    return "<all nodes>" if dev.all_nodes else "<node selector>"


def _in_scope(claim: str, fleet: FleetObjects) -> bool:
    return fleet.pods_hidden is None and (fleet.namespace is None or claim.partition("/")[0] == fleet.namespace)


def _holders(held: tuple[Holding, ...], fleet: FleetObjects, pods: Mapping[str, list[str]]) -> list[Holder]:
    out = []
    for owner, result in held:
        consumed = {str(k): show(q.value) if (q := quantity_or_none(v)) is not None else str(v)
                    for k, v in as_mapping(result.get("consumedCapacity")).items()}
        out.append(Holder(owner, pods.get(owner, []) if _in_scope(owner, fleet) else None, consumed, is_share(result),
                          not holds(result)))
    return out


def _used(dev: Device, holders: list[Holder]) -> dict[str, dict[str, str]]:
    sums: dict[str, Fraction] = {}
    for h in holders:
        for name, value in h.consumed.items():
            q = quantity_or_none(value)
            if q is not None:
                short = name.removeprefix(f"{dev.key[0]}/")
                sums[short] = sums.get(short, Fraction(0)) + q.value
    out = {}
    for name, total in sorted(sums.items()):
        published = dev.capacity.get(name) or dev.capacity.get(f"{dev.key[0]}/{name}")
        out[name] = {"used": show(total), "total": show(published[0].value) if published is not None else "?"}
    return out


def share_text(count: int, used: Mapping[str, Mapping[str, str]]) -> str:
    """``3 claims, 24Gi/80Gi``: the claims on a shared device and its memory used (or its first
    capacity's, named, where no memory is consumed)."""
    claims = f"{count} claim{'s' if count != 1 else ''}"
    if "memory" in used:
        return f"{claims}, {used['memory']['used']}/{used['memory']['total']}"
    for name, amounts in used.items():
        return f"{claims}, {name} {amounts['used']}/{amounts['total']}"
    return claims


@lru_cache(maxsize=4096)
def natural(name: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key that puts ``gpu-2`` before ``gpu-10``."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name))


def device_rows(fleet: FleetObjects, inventory: Inventory, *, driver: str, placements: bool = True) -> list[DeviceRow]:
    """One row per device of ``driver`` in ``inventory`` (built from ``fleet.slices``) and one per
    withheld device, in (node, device) order (numbers in names by value). ``placements=False``
    leaves out the rows of the dynamic MIG partitions not made yet
    (:func:`~dra_driver.allocator.devicestates.is_placement`), which
    are then only counted in their GPUs' ``can_make``: most of a dynamic-MIG fleet's devices, and
    no view but ``--partitions`` prints them."""
    holdings = claim_holdings(fleet.claims, driver)
    allocated = allocated_state(fleet.claims)
    pods = pods_by_claim(fleet.pods)
    memories = _Memories()
    strings = _Strings(_FACTS)
    whole: Whole = {}
    rows: list[DeviceRow] = []
    for pool in inventory.pools:
        if pool.driver != driver:
            continue
        facts = [strings.of(d) for d in pool.devices]
        # A MIG device names its GPU by UUID: the pool's GPUs by UUID, where a device has a parent.
        names_by_uuid = ({u: d.key[2] for d, (kind, _, _, _, u) in zip(pool.devices, facts, strict=True)
                          if u and kind == "gpu"} if any(f[3] for f in facts) else {})
        pool_rows: list[DeviceRow] = []
        made: dict[str, Counter[str]] = {}
        for state, fact in zip(pool_states(pool, allocated, holdings, whole), facts, strict=True):
            if placements or not _placement(state, fact[0]):
                pool_rows.append(_row(state, fact, memories.of(state.device), fleet, pods, names_by_uuid))
                continue
            # What _partitions reads of the row it does not build: kind mig, consuming counters.
            parent_uuid = fact[3]
            if parent_uuid:
                counts = made.setdefault(names_by_uuid.get(parent_uuid, parent_uuid), Counter())
                if state.state == FREE and fact[2]:
                    counts[fact[2]] += 1
        _partitions(pool_rows, made)
        rows += pool_rows
    for w in still_withheld(fleet.withheld, inventory, driver):
        model = "" if w.model == "unknown" else w.model
        rows.append(DeviceRow(w.node, driver, "", w.device, "", model, None, None, None, "", [], WITHHELD, w.rule))
    return sorted(rows, key=lambda r: (r.node, natural(r.device), r.pool))


def _placement(state: DeviceState, kind: str | None) -> bool:
    """:func:`~dra_driver.allocator.devicestates.is_placement`, the device's ``type`` read
    already (``kind``, as :meth:`_Strings.of` reads it: the same lookup)."""
    return state.device.has_consumes and state.state not in (ALLOCATED, SHARED) and kind == "mig"


_FACTS = ("type", "productName", "profile", "parentUUID", "uuid")
"""The attributes a row reads, in :meth:`_Strings.of`'s order."""


def _row(state: DeviceState, facts: Sequence[str | None], memory: str | None, fleet: FleetObjects,
         pods: Mapping[str, list[str]], names_by_uuid: Mapping[str, str]) -> DeviceRow:
    """``facts``: the device's :data:`_FACTS`; ``memory``: its :func:`_memory`."""
    dev = state.device
    kind, model, profile, parent_uuid, _ = facts
    taints = [as_mapping(t) for t in dev.taints]
    holders = _holders(state.held, fleet, pods) if state.held else []
    row = DeviceRow(
        node=_node_of(dev), driver=dev.key[0], pool=dev.key[1], device=dev.key[2], kind=kind or "",
        model=model or "", memory=memory, profile=profile,
        parent=names_by_uuid.get(parent_uuid, parent_uuid) if parent_uuid else None,
        health=UNHEALTHY if any(t.get("key") in unhealthy_taint_keys(dev.key[0]) for t in taints) else HEALTHY,
        taints=[_taint_text(t) for t in taints], state=state.state, detail=state.detail, holders=holders, source=state)
    if state.state == SHARED:
        shares = [h for h in holders if h.share and not h.admin]
        row.used = _used(dev, shares)
        row.detail = share_text(len(shares), row.used)
    return row


def _partitions(rows: list[DeviceRow], by_parent: dict[str, Counter[str]]) -> None:
    """Each GPU of a pool whose MIG devices are made per claim (they consume the GPU's counters):
    the profiles whose placements are free now, counted. ``by_parent``: those counted already, of
    the placements without a row (by parent GPU, then profile)."""
    for r in rows:
        if r.kind == "mig" and r.parent and r.source is not None and r.source.device.has_consumes:
            counts = by_parent.setdefault(r.parent, Counter())
            if r.state == FREE and r.profile:
                counts[r.profile] += 1
    for r in rows:
        if r.kind == "gpu" and r.device in by_parent:
            r.can_make = dict(sorted(by_parent[r.device].items()))


def row_document(row: DeviceRow) -> dict[str, Any]:
    """A row as the JSON schema of ``get gpus`` writes it (docs/fleet.md)."""
    doc: dict[str, Any] = {
        "node": row.node, "driver": row.driver, "pool": row.pool, "device": row.device, "type": row.kind,
        "model": row.model, "memory": row.memory, "migProfile": row.profile, "parent": row.parent,
        "health": row.health, "taints": row.taints, "state": row.state, "detail": row.detail,
        "holders": [{"claim": h.claim, "pods": h.pods, "consumedCapacity": h.consumed, "share": h.share,
                     "adminAccess": h.admin} for h in row.holders],
    }
    if row.used:
        doc["capacityUsed"] = row.used
    if row.can_make is not None:
        doc["canMake"] = row.can_make
    return doc
