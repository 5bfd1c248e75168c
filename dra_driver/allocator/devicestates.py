"""A device's state as a person asks about it (``free``, ``allocated``, ``shared``, ``tainted``,
``blocked``), decided here once for both readers: the fleet views (``kubectl dra get gpus``, ``get
nodes``, ``top``: :mod:`dra_driver.tools.fleet.devices`) and the controller's device metric
(:func:`device_census`). Pure: from the engine's inventory and the claims' allocation results.

A device's state, the first that holds:

* ``allocated``: a claim holds it whole;
* ``shared``: claims hold shares of it (a device that allows multiple allocations: a ``shareID``
  or consumed capacity in the result);
* ``tainted``: a taint with effect ``NoSchedule`` or ``NoExecute`` keeps new claims off it (the
  health monitor's ``gpu.dra-driver.io/unhealthy`` or, under ``--api-profile nvidia``, NVIDIA's keys; a
  DeviceTaintRule's);
* ``blocked``: its pool cannot be allocated from (incomplete or invalid), or the counters it would
  consume are taken by devices of the same GPU (a dynamic MIG partition, the GPU under it);
* ``free``.

``withheld`` (a device the node plugin left out of its slices) is not in the inventory: only the
Node's ``DeviceWithheld`` Event names it, in words written and read here (:func:`withheld_note`,
:func:`withheld_from`), by the node plugin, the fleet views and the controller's metric, which
count it while its node publishes and the device is not published there (:func:`still_withheld`).

Admin-access results hold nothing (the scheduler lets others allocate the device).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dra_driver.allocator.inventory import AllocatedState, Device, DeviceKey, Inventory, Pool, attribute_entry, hashable
from dra_driver.k8s.objects import as_mapping, as_mappings, meta

FREE, ALLOCATED, SHARED, TAINTED, BLOCKED, WITHHELD = "free", "allocated", "shared", "tainted", "blocked", "withheld"
STATES = (FREE, ALLOCATED, SHARED, TAINTED, BLOCKED, WITHHELD)
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")

Holding = tuple[str, Mapping[str, Any]]
"""A claim's hold on a device: ``namespace/name`` and its allocation result."""


@dataclass(frozen=True)
class DeviceState:
    device: Device
    state: str
    detail: str
    """``tainted``: the blocking effects; ``blocked``: why; else ""."""
    held: tuple[Holding, ...]
    """Every claim result on the device, admin-access ones included."""


def string_attribute(dev: Device, name: str) -> str | None:
    """The device's attribute ``name`` of its own driver's domain, as a string (None: absent)."""
    found = dev.attribute(f"{dev.key[0]}/{name}")
    return str(found[1]) if found is not None and found[1] is not None else None


def model_label(model: str, profile: str | None) -> str:
    """What devices are counted by: the product, and the MIG profile of a MIG device (a bounded
    set: the GPU products a cluster has times their MIG profiles)."""
    return f"{model} {profile}" if profile else model or "unknown"


def device_model(dev: Device) -> str:
    return model_label(string_attribute(dev, "productName") or "", string_attribute(dev, "profile"))


def raw_device_model(device: Mapping[str, Any], driver: str) -> str:
    """:func:`device_model` of a device as the node plugin describes it (before any slice holds it)."""
    attributes = as_mapping(device.get("attributes"))

    def string(name: str) -> str | None:
        found = attribute_entry(attributes, driver, f"{driver}/{name}")
        return str(found[1]) if found is not None and found[1] is not None else None

    return model_label(string("productName") or "", string("profile"))


WITHHELD_REASON = "DeviceWithheld"
"""The reason of the Node Event a node plugin writes about each device it does not publish."""
MAX_NOTE_MODEL = 64
"""A model in the note is cut to what an attribute string may hold (the model may be what is wrong)."""
_WITHHELD_NOTE = re.compile(r"^device (?P<device>\S+)(?: of driver (?P<driver>\S+))?(?: \((?P<model>[^()]*)\))?"
                            r" is not published.*?refuse it: (?P<rule>.*)$", re.DOTALL)


@dataclass(frozen=True)
class Withheld:
    """A device a node plugin does not publish, and the API server's rule it would break."""

    node: str
    device: str
    rule: str
    model: str = "unknown"
    """:func:`model_label`'s words (``unknown`` in Events of plugins before they carried it)."""
    driver: str | None = None
    """The plugin's driver (None in Events of plugins before they carried it)."""

    def of(self, driver: str) -> bool:
        """Whether it is a device of ``driver`` (one of unknown driver counts for any)."""
        return self.driver in (None, driver)


def still_withheld(withheld: Iterable[Withheld], inventory: Inventory, driver: str) -> list[Withheld]:
    """The devices of ``driver`` that the Events name and that are withheld still: on a node whose
    plugin publishes its pool now (an empty pool is one empty slice), and not published there since.
    An Event outlives what it tells of for the API server's event TTL (an hour by default): the node
    deleted, or the device fixed and published."""
    live: set[str] = set()
    published: set[tuple[str, str]] = set()
    for pool in inventory.pools:
        if pool.driver != driver:
            continue
        live.update(str(n) for sl in pool.sources if (n := as_mapping(sl.get("spec")).get("nodeName")))
        published.update((d.node_name, d.key[2]) for d in pool.devices if d.node_name)
    return [w for w in withheld if w.of(driver) and w.node in live and (w.node, w.device) not in published]


def withheld_note(device: str, driver: str, model: str, why: str) -> str:
    """The ``DeviceWithheld`` Event's note, which :func:`withheld_from` reads back."""
    shown = re.sub(r"[()]", "", model)[:MAX_NOTE_MODEL].strip()
    return (f"device {device} of driver {driver}{f' ({shown})' if shown else ''} is not published, the node's other "
            f"devices are: the API server would refuse it: {why}")


def withheld_from(events: Iterable[Mapping[str, Any]]) -> list[Withheld]:
    """The devices the ``DeviceWithheld`` Events (``events.k8s.io/v1``) name, one per (node,
    device), the latest word kept."""
    found: dict[tuple[str, str], Withheld] = {}
    for event in events:
        regarding = as_mapping(event.get("regarding"))
        if regarding.get("kind") != "Node" or event.get("reason") != WITHHELD_REASON:
            continue
        matched = _WITHHELD_NOTE.match(str(event.get("note") or ""))
        if matched is None:
            continue
        node = str(regarding.get("name") or "")
        found[(node, matched["device"])] = Withheld(node, matched["device"], matched["rule"].strip(),
                                                    matched["model"] or "unknown", matched["driver"])
    return [found[k] for k in sorted(found)]


def is_share(result: Mapping[str, Any]) -> bool:
    """A result that holds a share of the device (a ``shareID``, or capacity it consumes)."""
    return result.get("shareID") is not None or bool(as_mapping(result.get("consumedCapacity")))


def holds(result: Mapping[str, Any]) -> bool:
    """Whether a result takes anything from others: not an admin-access one."""
    return result.get("adminAccess") is not True


def claim_holdings(claims: Iterable[Mapping[str, Any]], driver: str) -> dict[DeviceKey, list[Holding]]:
    """(driver, pool, device) -> every claim's results on that device of ``driver``."""
    out: dict[DeviceKey, list[Holding]] = {}
    for claim in claims:
        m = meta(claim)
        owner = f"{m.get('namespace') or 'default'}/{m.get('name') or '?'}"
        allocation = as_mapping(as_mapping(claim.get("status")).get("allocation"))
        for result in as_mappings(as_mapping(allocation.get("devices")).get("results")):
            if str(result.get("driver", "")) != driver:
                continue
            key = (driver, str(result.get("pool", "")), str(result.get("device", "")))
            out.setdefault(key, []).append((owner, result))
    return out


def remaining_counters(pool: Pool, holding: set[DeviceKey]) -> dict[str, dict[str, Fraction]]:
    """What the pool's counter sets have left after the devices in ``holding`` consume theirs."""
    left = {name: dict(counters) for name, counters in pool.counter_sets.items()}
    for dev in pool.devices:
        if dev.has_consumes and dev.key in holding:
            for counter_set, counters in dev.consumes:
                have = left.setdefault(counter_set, {})
                for name, value in counters.items():
                    have[name] = have.get(name, Fraction(0)) - value
    return left


def _counter_holders(dev: Device, pool: Pool, holding: set[DeviceKey]) -> list[str]:
    """The held devices of the pool that consume a counter ``dev`` needs."""
    needs = {(cs, name) for cs, counters in dev.consumes for name in counters}
    return [other.key[2] for other in pool.devices
            if other.key in holding and other is not dev
            and needs & {(cs, name) for cs, counters in other.consumes for name in counters}]


Whole = dict[int, tuple[dict[str, Fraction], tuple[tuple[str, Fraction | int], ...]]]
"""Counter maps of :attr:`Device.consumes` with each value :func:`hashable`, by the map's id
(each kept, so that its id stays its own): the devices of a build share equal maps."""


def _whole_counters(counters: dict[str, Fraction], whole: Whole) -> tuple[tuple[str, Fraction | int], ...]:
    found = whole.get(id(counters))
    if found is None or found[0] is not counters:
        found = whole[id(counters)] = (counters, tuple((name, hashable(v)) for name, v in counters.items()))
    return found[1]


def counters_fit(dev: Device, left: Mapping[str, Mapping[str, Fraction | int]], whole: Whole | None = None) -> bool:
    """Whether every counter ``dev`` consumes is in ``left`` with at least as much left. Whole
    quantities are compared as ints (a Fraction's comparison is Python code, and a dynamic-MIG
    fleet's placements make hundreds of thousands): equal values, the same answer. ``whole``: see
    :data:`Whole`."""
    whole = whole if whole is not None else {}
    for counter_set, counters in dev.consumes:
        have = left.get(counter_set)
        for name, value in _whole_counters(counters, whole):
            if have is None or name not in have or not value <= have[name]:
                return False
    return True


def pool_states(pool: Pool, allocated: AllocatedState,
                holdings: Mapping[DeviceKey, Sequence[Holding]] | None = None,
                whole: Whole | None = None) -> list[DeviceState]:
    """The state of each device of ``pool``, in the pool's order, from what the claims hold
    (:func:`dra_driver.allocator.inventory.allocated_state`: admin access holds nothing, a result
    with a share ID or consumed capacity holds a share); ``holdings``
    (:func:`claim_holdings`), where given, names each device's claims in :attr:`DeviceState.held`;
    ``whole``: the counter maps made whole by earlier calls (one for all the pools of an inventory)."""
    holding = {k for d in pool.devices if (k := d.key) in allocated.devices or k in allocated.consumers}
    left = ({cs: {name: hashable(v) for name, v in counters.items()}
             for cs, counters in remaining_counters(pool, holding).items()} if pool.counter_sets else {})
    held = holdings or {}
    known = whole if whole is not None else {}
    return [_state(dev, pool, allocated, tuple(held.get(dev.key, ())), holding, left, known) for dev in pool.devices]


def _state(dev: Device, pool: Pool, allocated: AllocatedState, held: tuple[Holding, ...], holding: set[DeviceKey],
           left: Mapping[str, Mapping[str, Fraction | int]], whole: Whole) -> DeviceState:
    key = dev.key
    if key in allocated.devices:
        return DeviceState(dev, ALLOCATED, "", held)
    if key in allocated.consumers:
        return DeviceState(dev, SHARED, "", held)
    if dev.taints:
        blocking = sorted({str(t.get("effect")) for t in map(as_mapping, dev.taints)
                           if t.get("effect") in BLOCKING_EFFECTS})
        if blocking:
            return DeviceState(dev, TAINTED, ", ".join(blocking), held)
    if not pool.usable:
        return DeviceState(dev, BLOCKED, f"pool {pool.label}: {pool.invalid or 'incomplete'}", held)
    if dev.has_consumes and not counters_fit(dev, left, whole):
        by = _counter_holders(dev, pool, holding)
        return DeviceState(dev, BLOCKED, f"counters taken by {', '.join(by)}" if by else "counters exhausted", held)
    return DeviceState(dev, FREE, "", held)


def is_placement(state: DeviceState) -> bool:
    """A MIG device made per claim (it consumes its GPU's counters) that no claim holds: a partition
    the GPU could still be cut into, not a device of its own yet (the views count it under its GPU)."""
    return (state.device.has_consumes and state.state not in (ALLOCATED, SHARED)
            and string_attribute(state.device, "type") == "mig")


@dataclass
class Census:
    """The devices of a driver counted by model and state, and the claims holding shares, by model."""

    devices: Counter[tuple[str, str]]
    """(model, state) -> devices; every state of :data:`STATES` for each model seen."""
    shares: Counter[str]
    """model -> the claims holding shares of its devices (one per claim and device)."""


def device_census(inventory: Inventory, allocated: AllocatedState, driver: str,
                  models: dict[DeviceKey, str] | None = None, *, withheld: Mapping[str, int] | None = None) -> Census:
    """Every published device of ``driver`` counted as ``kubectl dra top`` counts it: by
    :func:`device_model` and state, dynamic MIG partitions not made yet left out, and ``withheld``
    (model -> devices the node plugins withhold). ``models``: the devices' models found by an
    earlier count of the same inventory, and filled in here (reading a device's attributes is most
    of a count's time)."""
    known = models if models is not None else {}
    devices: Counter[tuple[str, str]] = Counter()
    shares: Counter[str] = Counter()
    seen: set[str] = set()
    whole: Whole = {}

    def count(model: str, state: str, n: int = 1) -> None:
        if model not in seen:
            seen.add(model)
            devices.update({(model, s): 0 for s in STATES})
            shares[model] += 0
        devices[(model, state)] += n

    for pool in inventory.pools:
        if pool.driver != driver:
            continue
        for s in pool_states(pool, allocated, whole=whole):
            if is_placement(s):
                continue
            model = known.get(s.device.key)
            if model is None:
                model = known[s.device.key] = device_model(s.device)
            count(model, s.state)
            if s.state == SHARED:
                shares[model] += len(allocated.consumers[s.device.key])
    for model, n in (withheld or {}).items():
        count(model, WITHHELD, n)
    return Census(devices, shares)
