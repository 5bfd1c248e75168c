"""The node's resource pool as ResourceSlices, the way the upstream controller lays them out.

(``k8s.io/dynamic-resource-allocation/resourceslice``; see the reference, interfaces.md §6.)

* one pool per node, named after the node; every slice has ``nodeName`` and a controller
  ownerReference to the Node (garbage-collected with it);
* ``metadata.generateName`` = ``<index as hex, ≥5 digits>-<driver>-<node>-``: the index prefix
  orders slices (the scheduler tries them in name order) and matches existing slices to desired
  ones;
* ``pool.resourceSliceCount`` = number of desired slices; ``pool.generation`` is kept when the
  change is at most one in-place update and bumped (every slice rewritten) otherwise;
* obsolete slices (older generation, unparsable or out-of-range index, duplicates, other pools)
  are deleted first, with UID + resourceVersion preconditions;
* counter sets go in their own slices (1.35+ rejects ``sharedCounters`` next to ``devices``);
  devices are split at 128 per slice, 64 when a slice has taints, ``consumesCounters`` or
  list-valued attributes.

Everything here is pure (and heavily unit-tested): :func:`split_into_slices` lays the devices out,
:func:`plan` says which writes bring the existing slices there, :func:`dropped_features` reads
what the API server did not store. :class:`~dra_driver.node.publish.publisher.SlicePublisher`
does the I/O; the devices the API server would refuse are left out first
(:mod:`~dra_driver.node.publish.withholding`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.k8s.objects import Obj, meta
from dra_driver.k8s.quantity import QuantityError, parse_quantity

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_ADVANCED = 64
MAX_COUNTER_SETS_PER_SLICE = 8
INDEX_MIN_LENGTH = 5


# --- desired state -------------------------------------------------------------------------------


@dataclass
class SliceContent:
    """What one ResourceSlice carries: devices, or shared counter sets (never both, 1.35+)."""

    devices: list[Obj] = field(default_factory=list)
    shared_counters: list[Obj] = field(default_factory=list)


@dataclass(frozen=True)
class PoolOwner:
    driver: str
    node_name: str
    node_uid: str

    @property
    def pool_name(self) -> str:
        return self.node_name


_LIST_VALUES = ("bools", "ints", "strings", "versions")


def _advanced(device: Mapping[str, Any]) -> bool:
    """Whether the device lowers its slice's limit to 64 (the API server's ``maxDevicesFor``)."""
    return bool(device.get("taints")) or bool(device.get("consumesCounters")) or any(
        isinstance(value, Mapping) and any(value.get(k) is not None for k in _LIST_VALUES)
        for value in (device.get("attributes") or {}).values())


def split_into_slices(devices: Sequence[Obj], shared_counters: Sequence[Obj]) -> list[SliceContent]:
    """Desired slices of the pool: counter-set slices first (≤8 sets each), then device slices.

    Devices keep their order; a slice takes up to 128 devices, or 64 once one of them has taints
    or consumesCounters. An empty pool is one empty slice (shows that the driver is alive).
    """
    result: list[SliceContent] = []
    for i in range(0, len(shared_counters), MAX_COUNTER_SETS_PER_SLICE):
        result.append(SliceContent(shared_counters=list(shared_counters[i : i + MAX_COUNTER_SETS_PER_SLICE])))
    current: list[Obj] = []
    advanced = False
    for device in devices:
        adv = advanced or _advanced(device)
        limit = MAX_DEVICES_PER_SLICE_ADVANCED if adv else MAX_DEVICES_PER_SLICE
        if len(current) + 1 > limit:
            result.append(SliceContent(devices=current))
            current, adv = [], _advanced(device)
        current.append(device)
        advanced = adv
    if current:
        result.append(SliceContent(devices=current))
    if not result:
        result.append(SliceContent())
    return result


def validate_pool(slices: Sequence[SliceContent]) -> None:
    """The client-side checks of the upstream controller; ValueError on the first problem."""
    names: set[str] = set()
    counter_sets: dict[str, set[str]] = {}
    for i, content in enumerate(slices):
        if content.devices and content.shared_counters:
            raise ValueError(f"slice {i}: devices and sharedCounters must be in separate slices")
        if len(content.shared_counters) > MAX_COUNTER_SETS_PER_SLICE:
            raise ValueError(f"slice {i}: more than {MAX_COUNTER_SETS_PER_SLICE} counter sets")
        limit = (MAX_DEVICES_PER_SLICE_ADVANCED if any(_advanced(d) for d in content.devices)
                 else MAX_DEVICES_PER_SLICE)
        if len(content.devices) > limit:
            raise ValueError(f"slice {i}: {len(content.devices)} devices, limit {limit}")
        for cs in content.shared_counters:
            name = cs.get("name", "")
            if name in counter_sets:
                raise ValueError(f"duplicate counter set {name!r}")
            counter_sets[name] = set((cs.get("counters") or {}).keys())
        for device in content.devices:
            name = device.get("name", "")
            if name in names:
                raise ValueError(f"duplicate device name {name!r} in the pool")
            names.add(name)
    for content in slices:
        for device in content.devices:
            for entry in device.get("consumesCounters") or []:
                set_name = entry.get("counterSet", "")
                if set_name not in counter_sets:
                    raise ValueError(f"device {device.get('name')!r} consumes from unknown counter set {set_name!r}")
                unknown = set((entry.get("counters") or {}).keys()) - counter_sets[set_name]
                if unknown:
                    raise ValueError(f"device {device.get('name')!r} consumes unknown counters {sorted(unknown)} "
                                     f"of {set_name!r}")


# --- semantic comparison -------------------------------------------------------------------------

def _normalize(value: Any, key: str = "", in_taints: bool = False) -> Any:
    """Drop empty/None members, compare quantities by value, ignore server-set taint timeAdded."""
    if isinstance(value, Mapping):
        result = {}
        for k, v in value.items():
            if in_taints and k == "timeAdded":
                continue
            n = _normalize(v, k, in_taints or k == "taints")
            if n is None or n == {} or n == []:
                continue
            result[k] = n
        return result
    if isinstance(value, list):
        return [_normalize(v, key, in_taints) for v in value]
    if isinstance(value, str) and key == "value" and not in_taints:
        try:
            return ("quantity", parse_quantity(value).value)
        except QuantityError:
            return value
    return value


def semantically_equal(a: Any, b: Any) -> bool:
    return bool(_normalize(a) == _normalize(b))


# --- planning ------------------------------------------------------------------------------------


@dataclass
class Op:
    kind: str
    """``delete``, ``update`` or ``create``."""
    index: int | None
    """Desired slice index (None for deletes)."""
    name: str = ""
    body: Obj | None = None
    uid: str = ""
    resource_version: str = ""


@dataclass
class Plan:
    ops: list[Op]
    generation: int
    slice_count: int

    @property
    def writes(self) -> int:
        return len(self.ops)

    def count(self, kind: str) -> int:
        return sum(1 for op in self.ops if op.kind == kind)


def index_length(slice_count: int) -> int:
    return max(INDEX_MIN_LENGTH, len(format(max(slice_count - 1, 0), "x")))


def generate_name(index: int, slice_count: int, owner: PoolOwner) -> str:
    return f"{index:0{index_length(slice_count)}x}-{owner.driver}-{owner.node_name}-"


def decode_index(name: str, expected_length: int) -> int | None:
    """The index encoded in a slice name's prefix; None when the prefix does not have that form."""
    sep = name.find("-")
    if sep != expected_length:
        return None
    prefix = name[:sep]
    if not re.fullmatch(r"[0-9a-f]+", prefix):
        return None
    return int(prefix, 16)


def _pool(owner: PoolOwner, generation: int, count: int) -> Obj:
    return {"name": owner.pool_name, "generation": generation, "resourceSliceCount": count}


def desiredspec_of(owner: PoolOwner, content: SliceContent, generation: int, count: int) -> Obj:
    spec: Obj = {"driver": owner.driver, "pool": _pool(owner, generation, count), "nodeName": owner.node_name}
    if content.devices:
        spec["devices"] = copy.deepcopy(content.devices)
    if content.shared_counters:
        spec["sharedCounters"] = copy.deepcopy(content.shared_counters)
    return spec


def spec_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """A slice's ``spec``, or an empty one when it has none."""
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _generation(obj: Mapping[str, Any]) -> int:
    pool = spec_of(obj).get("pool") or {}
    try:
        return int(pool.get("generation", 0))
    except (TypeError, ValueError):
        return 0


def _content_equal(existing: Mapping[str, Any], content: SliceContent) -> bool:
    spec = spec_of(existing)
    return semantically_equal(spec.get("devices") or [], content.devices) and semantically_equal(
        spec.get("sharedCounters") or [], content.shared_counters)


def _carry_taint_time(existing_devices: Sequence[Mapping[str, Any]], devices: list[Obj]) -> list[Obj]:
    """Keep the server-set ``timeAdded`` of taints that did not change (upstream does the same)."""
    by_name = {d.get("name"): d for d in existing_devices}
    for device in devices:
        old = by_name.get(device.get("name"))
        if not old or not device.get("taints"):
            continue
        for taint in device["taints"]:
            if taint.get("timeAdded"):
                continue
            for old_taint in old.get("taints") or []:
                if all(old_taint.get(k) == taint.get(k) for k in ("key", "value", "effect")) and old_taint.get(
                        "timeAdded"):
                    taint["timeAdded"] = old_taint["timeAdded"]
                    break
    return devices


def plan(desired: Sequence[SliceContent], existing: Sequence[Mapping[str, Any]], owner: PoolOwner,
         *, min_generation: int = 0) -> Plan:
    """The API writes that turn ``existing`` slices into ``desired``, in execution order.

    ``existing`` are the slices listed for this driver and node (other drivers' or nodes' slices
    are ignored). Deletes come first, then updates, then creates.
    """
    ours = [s for s in existing
            if spec_of(s).get("driver") == owner.driver and spec_of(s).get("nodeName") == owner.node_name]
    count = len(desired)
    obsolete: list[Mapping[str, Any]] = [s for s in ours if (spec_of(s).get("pool") or {}).get("name") != owner.pool_name]
    pool_slices = [s for s in ours if (spec_of(s).get("pool") or {}).get("name") == owner.pool_name]
    generation = max((_generation(s) for s in pool_slices), default=0)

    matched: dict[int, Mapping[str, Any]] = {}
    expected_length = index_length(count)
    for s in sorted(pool_slices, key=lambda s: str(meta(s).get("name", ""))):
        index = decode_index(str(meta(s).get("name", "")), expected_length)
        if _generation(s) < generation or index is None or not 0 <= index < count or index in matched:
            obsolete.append(s)
            continue
        matched[index] = s

    desired_pool_now = _pool(owner, generation, count)
    changed = {
        i for i, s in matched.items()
        if spec_of(s).get("pool") != desired_pool_now
        or spec_of(s).get("nodeSelector") is not None
        or spec_of(s).get("allNodes")
        or spec_of(s).get("perDeviceNodeSelection")
        or not _content_equal(s, desired[i])
    }
    new = count - len(matched)
    bumped = False
    if min_generation > generation:
        generation, bumped = min_generation, True
    elif new == 0 and len(changed) <= 1:
        pass
    else:
        generation, bumped = generation + 1, True

    ops: list[Op] = []
    for s in obsolete:
        m = meta(s)
        ops.append(Op("delete", None, name=str(m.get("name", "")), uid=str(m.get("uid", "")),
                      resource_version=str(m.get("resourceVersion", ""))))
    for i in sorted(matched):
        if i not in changed and not bumped:
            continue
        current = matched[i]
        body: Obj = copy.deepcopy(dict(current))
        spec = desiredspec_of(owner, desired[i], generation, count)
        if "devices" in spec:
            spec["devices"] = _carry_taint_time(spec_of(current).get("devices") or [], spec["devices"])
        body["spec"] = spec
        body.pop("status", None)
        m = meta(current)
        ops.append(Op("update", i, name=str(m.get("name", "")), body=body, uid=str(m.get("uid", "")),
                      resource_version=str(m.get("resourceVersion", ""))))
    for i in range(count):
        if i in matched:
            continue
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "generateName": generate_name(i, count, owner),
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": owner.node_name,
                                     "uid": owner.node_uid, "controller": True}],
            },
            "spec": desiredspec_of(owner, desired[i], generation, count),
        }
        ops.append(Op("create", i, body=body))
    return Plan(ops=ops, generation=generation, slice_count=count)


# --- dropped fields ------------------------------------------------------------------------------


def dropped_features(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> list[str]:
    """Feature gates that are probably off, judging by what the apiserver did not store.

    Empty when nothing was dropped; ``["unknown"]`` when something differs for another reason.
    """
    sent_spec, stored_spec = spec_of(sent), spec_of(stored)
    sent_devices = list(sent_spec.get("devices") or [])
    stored_devices = list(stored_spec.get("devices") or [])
    if semantically_equal(sent_devices, stored_devices) and semantically_equal(
            sent_spec.get("sharedCounters") or [], stored_spec.get("sharedCounters") or []):
        return []
    gates: list[str] = []
    pairs = list(zip(sent_devices, stored_devices, strict=False))
    if any(len(a.get("taints") or []) > len(b.get("taints") or []) for a, b in pairs):
        gates.append("DRADeviceTaints")
    if len(sent_spec.get("sharedCounters") or []) > len(stored_spec.get("sharedCounters") or []) or any(
            len(a.get("consumesCounters") or []) != len(b.get("consumesCounters") or []) for a, b in pairs):
        gates.append("DRAPartitionableDevices")
    if any(len(a.get("bindingConditions") or []) != len(b.get("bindingConditions") or [])
           or len(a.get("bindingFailureConditions") or []) != len(b.get("bindingFailureConditions") or [])
           for a, b in pairs):
        gates.append("DRADeviceBindingConditions")
    if any(a.get("allowMultipleAllocations") is not None and b.get("allowMultipleAllocations") is None
           for a, b in pairs):
        gates.append("DRAConsumableCapacity")
    return gates or ["unknown"]
