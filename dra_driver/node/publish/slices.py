"""Publish the node's resource pool as ResourceSlices, the way the upstream controller does.

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
  list-valued attributes;
* a device the API server would refuse is left out, never the node: every device passes
  :mod:`~dra_driver.node.publish.checker` first, and when a write is refused anyway (422 Invalid)
  the device to blame is found (the refusal's ``causes`` name ``spec.devices[i]``; otherwise by
  bisecting the slice's devices with server-side dry runs) and left out too, until its content
  changes. Each withheld device is logged and told as an Event on the Node (``DeviceWithheld``)
  once, counted in ``dra_driver_plugin_devices_withheld{reason}``, and makes :meth:`degraded`
  say so (the plugin's ``/readyz``).

:func:`plan` is pure (and heavily unit-tested); :class:`SlicePublisher` does the I/O through
:class:`dra_driver.k8s.client.KubeApi`, follows changes with a :class:`dra_driver.k8s.informer.Informer`
and counts every API request it makes.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver import logs
from dra_driver.k8s.client import NODES, SLICES, ApiError, KubeApi
from dra_driver.k8s.informer import Informer
from dra_driver.k8s.objects import Obj, meta
from dra_driver.k8s.quantity import QuantityError, parse_quantity
from dra_driver.node.metrics import METRICS
from dra_driver.node.publish.checker import RULES, Violation, partition
from dra_driver.node.publish.ownership import PublisherLock

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


def desired_spec(owner: PoolOwner, content: SliceContent, generation: int, count: int) -> Obj:
    spec: Obj = {"driver": owner.driver, "pool": _pool(owner, generation, count), "nodeName": owner.node_name}
    if content.devices:
        spec["devices"] = copy.deepcopy(content.devices)
    if content.shared_counters:
        spec["sharedCounters"] = copy.deepcopy(content.shared_counters)
    return spec


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _generation(obj: Mapping[str, Any]) -> int:
    pool = _spec(obj).get("pool") or {}
    try:
        return int(pool.get("generation", 0))
    except (TypeError, ValueError):
        return 0


def _content_equal(existing: Mapping[str, Any], content: SliceContent) -> bool:
    spec = _spec(existing)
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
            if _spec(s).get("driver") == owner.driver and _spec(s).get("nodeName") == owner.node_name]
    count = len(desired)
    obsolete: list[Mapping[str, Any]] = [s for s in ours if (_spec(s).get("pool") or {}).get("name") != owner.pool_name]
    pool_slices = [s for s in ours if (_spec(s).get("pool") or {}).get("name") == owner.pool_name]
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
        if _spec(s).get("pool") != desired_pool_now
        or _spec(s).get("nodeSelector") is not None
        or _spec(s).get("allNodes")
        or _spec(s).get("perDeviceNodeSelection")
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
        spec = desired_spec(owner, desired[i], generation, count)
        if "devices" in spec:
            spec["devices"] = _carry_taint_time(_spec(current).get("devices") or [], spec["devices"])
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
            "spec": desired_spec(owner, desired[i], generation, count),
        }
        ops.append(Op("create", i, body=body))
    return Plan(ops=ops, generation=generation, slice_count=count)


# --- dropped fields ------------------------------------------------------------------------------


def dropped_features(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> list[str]:
    """Feature gates that are probably off, judging by what the apiserver did not store.

    Empty when nothing was dropped; ``["unknown"]`` when something differs for another reason.
    """
    sent_spec, stored_spec = _spec(sent), _spec(stored)
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


# --- writes the API server refuses ---------------------------------------------------------------

_DEVICE_FIELD = re.compile(r"^spec\.devices\[(\d+)\](?:\.(.*))?$")


def refused_devices(devices: Sequence[Mapping[str, Any]], details: Mapping[str, Any]) -> dict[str, Violation]:
    """The devices a 422's ``details.causes`` blame, by name: each cause whose ``field`` is
    ``spec.devices[i]…``. Empty when no cause names a device."""
    blamed: dict[str, Violation] = {}
    causes = details.get("causes") if isinstance(details, Mapping) else None
    for cause in causes if isinstance(causes, list) else []:
        match = _DEVICE_FIELD.match(str(cause.get("field", ""))) if isinstance(cause, Mapping) else None
        if match is None or int(match.group(1)) >= len(devices):
            continue
        name = str(devices[int(match.group(1))].get("name", ""))
        blamed.setdefault(name, Violation(name, "api-server-refused", match.group(2) or "",
                                          str(cause.get("message", "")) or "refused by the API server"))
    return blamed


def bisect_refused(devices: Sequence[Obj], accepts: Callable[[list[Obj]], bool]) -> list[Obj]:
    """The devices that the API server refuses, each alone or in any company, found by asking
    ``accepts`` (a server-side dry run of a slice with just those devices) about halves: a few
    dry runs per bad device instead of one per device."""
    if not devices or accepts(list(devices)):
        return []
    if len(devices) == 1:
        return list(devices)
    middle = len(devices) // 2
    return bisect_refused(devices[:middle], accepts) + bisect_refused(devices[middle:], accepts)


def _fingerprint(device: Mapping[str, Any]) -> str:
    return json.dumps(device, sort_keys=True, default=str)


def withheld_summary(withheld: Mapping[str, Sequence[Violation]]) -> str | None:
    """One line for ``/readyz``: which devices are withheld and why; None when none is."""
    if not withheld:
        return None
    parts = [f"{name} ({', '.join(sorted({v.rule for v in problems}))})" for name, problems in withheld.items()]
    return (f"publishing degraded: {len(parts)} device(s) withheld from the ResourceSlices because the API "
            f"server would refuse them: {'; '.join(parts)}")


# --- the publisher -------------------------------------------------------------------------------

_log = logs.get("slices")


class SlicePublisher:
    """Keeps the node's ResourceSlices equal to the latest :meth:`update`.

    ``run(stop_event)`` watches the node's slices (field selectors ``spec.nodeName`` and
    ``spec.driver``) and re-syncs ``sync_delay`` seconds after a change made by someone else (e.g.
    the kubelet wiping slices), every ``resync_interval`` seconds regardless, and with back-off
    after errors. ``requests`` counts API requests by verb. With an ``ownership`` lock it writes
    nothing until it holds the lock (:mod:`~dra_driver.node.publish.ownership`); :meth:`update`
    keeps the desired state meanwhile.

    ``on_withheld(name, violations)`` hears of each device left out, once per device and set of
    rules, from the instance that writes (so two instances do not tell it twice).
    """

    def __init__(self, api: KubeApi, driver_name: str, node_name: str, *, node_uid: str | None = None,
                 resync_interval: float = 300.0, sync_delay: float = 1.0, watch_timeout: int = 300,
                 max_backoff: float = 30.0, ownership: PublisherLock | None = None,
                 on_withheld: Callable[[str, list[Violation]], None] | None = None) -> None:
        self.api = api
        self.ownership = ownership
        self.driver_name = driver_name
        self.node_name = node_name
        self.node_uid = node_uid
        self.resync_interval = resync_interval
        self.sync_delay = sync_delay
        self.watch_timeout = watch_timeout
        self.max_backoff = max_backoff
        self.requests: Counter[str] = Counter()
        self.field_selector = f"spec.nodeName={node_name},spec.driver={driver_name}"
        self.last_plan: Plan | None = None
        self.dropped: list[str] = []
        self._lock = threading.RLock()
        self._desired: list[SliceContent] | None = None
        self._accepted: dict[int, SliceContent] = {}
        self._devices: list[Obj] = []
        self._counters: list[Obj] = []
        self.on_withheld = on_withheld
        self.withheld: dict[str, list[Violation]] = {}
        """The devices left out of the slices now, by name, with what they break."""
        self._refused: dict[str, tuple[str, list[Violation]]] = {}
        """Devices the API server refused although the checker passed them: name -> (content, why)."""
        self._told: dict[str, frozenset[str]] = {}
        self._min_generation = 0
        self._wake = threading.Event()
        self._due: float | None = None
        self._own_versions: set[str] = set()
        self._log = _log.bind(node=node_name, driver=driver_name)
        self.informer = Informer(api, SLICES, self._on_change, field_selector=self.field_selector,
                                 watch_timeout=watch_timeout, max_backoff=max_backoff)

    # -- desired state ----------------------------------------------------------------------------

    def update(self, devices_json: Sequence[Obj], shared_counters_json: Sequence[Obj] = ()) -> None:
        """Replace the desired devices and counter sets; a sync follows promptly (``run``). A
        device the API server would refuse is left out (:attr:`withheld`)."""
        devices = copy.deepcopy(list(devices_json))
        counters = copy.deepcopy(list(shared_counters_json))
        with self._lock:
            self._set_desired(devices, counters)
        self.request_sync(0.0)

    def _set_desired(self, devices: list[Obj], counters: list[Obj]) -> None:
        current = {str(d.get("name", "")): _fingerprint(d) for d in devices if isinstance(d, Mapping)}
        refused = {name: (content, why) for name, (content, why) in self._refused.items()
                   if current.get(name) == content}  # a refusal holds until the device changes
        split = partition(devices, self.driver_name, {name: why for name, (_, why) in refused.items()})
        slices = split_into_slices(split.publish, counters)
        validate_pool(slices)
        self._devices, self._counters, self._refused = devices, counters, refused
        self._desired = slices
        self._accepted = {}
        self.withheld = split.withheld
        reasons = Counter(problems[0].rule for problems in split.withheld.values())
        for rule in RULES:
            METRICS.devices_withheld.labels(reason=rule).set(reasons.get(rule, 0))

    def degraded(self) -> str | None:
        """Why publishing is degraded (devices withheld), or None."""
        with self._lock:
            return withheld_summary(self.withheld)

    @property
    def devices(self) -> list[Obj]:
        """A copy of the desired devices, withheld ones included (edit and pass back to :meth:`update`)."""
        with self._lock:
            return copy.deepcopy(self._devices)

    @property
    def shared_counters(self) -> list[Obj]:
        with self._lock:
            return copy.deepcopy(self._counters)

    def request_sync(self, delay: float) -> None:
        with self._lock:
            due = time.monotonic() + delay
            self._due = due if self._due is None else min(self._due, due)
        self._wake.set()

    # -- one reconcile ----------------------------------------------------------------------------

    def sync(self) -> Plan | None:
        """List, plan and apply once. None when no desired state has been given yet."""
        with self._lock:
            if self._desired is None:
                return None
            desired = [self._accepted.get(i, s) for i, s in enumerate(self._desired)]
        if not self.node_uid:
            self.requests["get"] += 1
            self.node_uid = str(meta(self.api.get(NODES, self.node_name)).get("uid", ""))
        owner = PoolOwner(self.driver_name, self.node_name, self.node_uid)
        self.requests["list"] += 1
        existing = self.api.list(SLICES, field_selector=self.field_selector).items
        self._tell_withheld()
        result = plan(desired, existing, owner, min_generation=self._min_generation)
        for op in result.ops:
            try:
                self._apply(op)
            except ApiError as exc:
                if exc.status == 422 and self._blame(op, exc):
                    self._tell_withheld()
                raise
        self._min_generation = max(self._min_generation, result.generation)
        self.last_plan = result
        if result.ops:
            self._log.info("published ResourceSlices", generation=result.generation, slices=result.slice_count,
                           creates=result.count("create"), updates=result.count("update"),
                           deletes=result.count("delete"))
        return result

    def _apply(self, op: Op) -> None:
        if op.kind == "delete":
            self.requests["delete"] += 1
            try:
                self.api.delete(SLICES, op.name, uid=op.uid or None, resource_version=op.resource_version or None)
            except ApiError as exc:
                if not exc.not_found:
                    raise
            METRICS.slice_writes.labels(operation="delete").inc()
            return
        assert op.body is not None and op.index is not None
        if op.kind == "update":
            self.requests["update"] += 1
            stored = self.api.replace(SLICES, dict(op.body, metadata=dict(meta(op.body), name=op.name)))
        else:
            self.requests["create"] += 1
            stored = self.api.create(SLICES, op.body)
        METRICS.slice_writes.labels(operation=op.kind).inc()
        rv = str(meta(stored).get("resourceVersion", ""))
        if rv:
            if len(self._own_versions) > 1000:
                self._own_versions.clear()
            self._own_versions.add(rv)
        self._check_dropped(op.index, op.body, stored)

    def _blame(self, op: Op, exc: ApiError) -> bool:
        """Leave out the devices a refused write is to blame on; whether any was found."""
        devices = list(_spec(op.body or {}).get("devices") or [])
        blamed = refused_devices(devices, exc.details)
        # Without a cause naming a device, bisect; but only when the slice without devices is
        # accepted: otherwise the devices are not what the API server refuses.
        if not blamed and devices and self._dry_run_refusal(op, []) is None:
            alone: dict[str, str] = {}

            def accepts(subset: list[Obj]) -> bool:
                refusal = self._dry_run_refusal(op, subset)
                if refusal is not None and len(subset) == 1:
                    alone[str(subset[0].get("name", ""))] = refusal
                return refusal is None

            for d in bisect_refused(devices, accepts):
                name = str(d.get("name", ""))
                blamed[name] = Violation(name, "api-server-refused", "", alone.get(name, exc.message))
        if not blamed:
            return False
        with self._lock:
            for name, why in blamed.items():
                device = next((d for d in self._devices if d.get("name") == name), None)
                if device is not None:
                    self._refused[name] = (_fingerprint(device), [why])
            self._set_desired(self._devices, self._counters)
        return True

    def _dry_run_refusal(self, op: Op, devices: list[Obj]) -> str | None:
        """What the API server says of ``op``'s slice holding just ``devices``, in a server-side dry
        run (nothing is stored); None when it accepts it."""
        assert op.body is not None
        spec = dict(_spec(op.body), devices=devices)
        body = {"apiVersion": API_VERSION, "kind": KIND, "spec": spec,
                "metadata": {"generateName": f"{self.driver_name}-{self.node_name}-check-"}}
        self.requests["create"] += 1
        try:
            self.api.create(SLICES, body, dry_run=True)
        except ApiError as exc:
            if exc.status == 422:
                return exc.message or "refused"
            raise
        return None

    def _tell_withheld(self) -> None:
        """Log, and tell ``on_withheld``, each device newly withheld (or withheld for new reasons)."""
        with self._lock:
            withheld = {name: list(problems) for name, problems in self.withheld.items()}
        told: dict[str, frozenset[str]] = {}
        for name, problems in withheld.items():
            told[name] = frozenset(v.describe() for v in problems)
            if self._told.get(name) == told[name]:
                continue
            self._log.warning("a device is withheld from the ResourceSlices: the API server would refuse it",
                              device=name, rules=sorted({v.rule for v in problems}),
                              problems=[f"{v.field}: {v.message}" for v in problems])
            if self.on_withheld is not None:
                self.on_withheld(name, problems)
        for name in sorted(set(self._told) - set(told)):
            self._log.info("a device withheld before is published again", device=name)
        self._told = told

    def _check_dropped(self, index: int, sent: Obj, stored: Obj) -> None:
        gates = dropped_features(sent, stored)
        if not gates:
            return
        spec = _spec(stored)
        with self._lock:
            self._accepted[index] = SliceContent(devices=list(spec.get("devices") or []),
                                                 shared_counters=list(spec.get("sharedCounters") or []))
        self.dropped = sorted(set(self.dropped) | set(gates))
        self._log.warning(
            "the apiserver dropped fields of a ResourceSlice; the feature gates are probably disabled",
            slice=meta(stored).get("name"), index=index, feature_gates=gates,
        )

    # -- background loop --------------------------------------------------------------------------

    def run(self, stop_event: threading.Event) -> None:
        """Reconcile until ``stop_event`` is set (blocking; run it in a thread)."""
        if self.ownership is not None and not self.ownership.wait(stop_event):
            return
        self.informer.start(stop_event)
        backoff = min(1.0, self.max_backoff)
        next_resync = time.monotonic()
        while not stop_event.is_set():
            now = time.monotonic()
            with self._lock:
                due = self._due
            wake_at = min(next_resync, due) if due is not None else next_resync
            if now < wake_at:
                self._wake.wait(timeout=min(wake_at - now, 1.0))
                self._wake.clear()
                continue
            with self._lock:
                self._due = None
            try:
                self.sync()
                backoff = min(1.0, self.max_backoff)
                next_resync = time.monotonic() + self.resync_interval
            except Exception as exc:  # last resort: the publisher retries whatever failed
                METRICS.slice_errors.inc()
                self._log.error("publishing ResourceSlices failed; retrying", error=str(exc), retry_in=backoff)
                self.request_sync(backoff)
                backoff = min(backoff * 2, self.max_backoff)
        self._wake.set()

    def start(self, stop_event: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop_event,), name="slice-publisher", daemon=True)
        thread.start()
        return thread

    def _on_change(self, old: Obj | None, new: Obj | None) -> None:
        # Our own writes come back as watch events; only someone else's change (the kubelet wiping
        # the node's slices) needs a sync.
        if new is not None and str(meta(new).get("resourceVersion", "")) in self._own_versions:
            return
        self._log.debug("ResourceSlice changed", slice=meta(new or old or {}).get("name"), deleted=new is None)
        self.request_sync(self.sync_delay)
