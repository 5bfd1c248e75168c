"""Objects read in the API server's protobuf encoding, through schemas that declare only what we read.

Every ResourceClaim's allocated devices
=======================================

``dra-driver explain`` needs to know which devices all other claims hold. As a JSON list, most of
what the API server encodes and we decode is fields nobody reads (managedFields, specs,
reservedFor). The protobuf list of the same claims is smaller and quicker to encode, and parsing
it with a schema that declares only the allocation (``api/proto/kubewire/claims.proto``) and
reducing it takes a fraction of decoding the JSON (the figures: docs/benchmarks.md#the-codes-figures).

Both encodings end in the same reduced JSON-shaped dict per claim (:func:`allocation_view`), the
form :func:`dra_driver.allocator.inventory.allocated_state` reads, so a server or proxy that answers in
JSON instead gives the same result.

The controller's pods
=====================
The controller reads three things of a pod: the claims it references, its node and whether it is
done (:func:`dra_driver.k8s.claims.pod_claim_keys`, ``pod_node``, ``pod_is_done``). A pod, as JSON
and decoded, is nearly all containers, volumes and conditions; listed in protobuf through
``api/proto/kubewire/pods.proto`` the pods cost the controller's CPU a fraction of what the JSON
list does, and the server sends fewer bytes (docs/scale.md, the first round of start-up work).
:data:`POD_CLAIM_REFS` asks for that (lists and watches, JSON still accepted) and yields each pod as
a JSON-shaped dict of just those fields (:func:`pod_refs`), which the readers above treat as the pod
itself.

The controller's ResourceSlices
===============================
The API server streams a large cluster's slices in protobuf far sooner than as JSON, and the
controller's start waits for that stream (docs/scale.md, the third round). :func:`slice_reading`
reads them in protobuf through ``api/proto/kubewire/slices.proto`` and yields each slice as the dict
its JSON form decodes to (spec whole; of the metadata name, uid, resourceVersion, generation,
deletionTimestamp), with the equal attribute, capacity and counter values of all devices, and equal
lists of counter consumptions, shared as they are built, as :class:`dra_driver.k8s.compact.Interner`
shares them after JSON is decoded.

The claims ``explain -n`` and ``-A`` list
=========================================
Every claim of a namespace or of the cluster, to group the pending ones by what the controller
wrote on them. Listed as JSON, the claims' managedFields, specs and statuses are most of what the
server encodes and the client decodes, and on a large cluster decoding them cost the command more
CPU than all its other work (docs/scale.md). :func:`noted_claims` reads them in protobuf through
``api/proto/kubewire/claimnotes.proto``: name, namespace, deletion, the named annotations, the
requests' DeviceClasses and the allocated devices.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any, Generic, TypeVar, cast

from google.protobuf.message import DecodeError

from dra_driver._proto.kubewire import claimnotes_pb2, claims_pb2, meta_pb2, pods_pb2, slices_pb2
from dra_driver.k8s.bodies import AllocationResult, AllocationView, DeviceRequest, NotedClaim, RawMeta, RawPod
from dra_driver.k8s.objects import Obj, as_mapping, as_mappings

PROTOBUF = "application/vnd.kubernetes.protobuf"
ACCEPT = f"{PROTOBUF}, application/json"
"""What a reader of protobuf asks for: JSON stays acceptable, since a proxy or an aggregated
server may not speak protobuf."""
MAX_FRAME = 64 << 20
"""A watch frame longer than this is not a frame: the stream is out of step (etcd's object limit
is 1.5 MiB)."""
_MAGIC = b"k8s\x00"


class WireError(ValueError):
    """A response body or watch frame that is not the protobuf object it claims to be."""


def _unwrap(body: bytes, kind: str) -> bytes:
    """The object inside a whole protobuf body (magic, ``runtime.Unknown``), checked to be ``kind``."""
    if not body.startswith(_MAGIC):
        raise WireError("protobuf response without the k8s magic prefix")
    envelope = meta_pb2.Unknown()
    try:
        envelope.ParseFromString(body[len(_MAGIC):])
    except DecodeError as exc:
        raise WireError(f"malformed protobuf: {exc}") from None
    if envelope.contentEncoding:
        raise WireError(f"unsupported content encoding {envelope.contentEncoding!r}")
    got = envelope.typeMeta.kind
    if got != kind:
        raise WireError(f"expected a {kind}, got {got or 'an object without kind'}")
    return envelope.raw


def _parse(message: Any, raw: bytes) -> None:
    try:
        message.ParseFromString(raw)
    except DecodeError as exc:
        raise WireError(f"malformed protobuf: {exc}") from None


def decode_claim_list(body: bytes) -> tuple[list[AllocationView], str]:
    """The reduced claims of a protobuf ``ResourceClaimList`` response, and its resourceVersion."""
    claims = claims_pb2.ResourceClaimList()
    _parse(claims, _unwrap(body, "ResourceClaimList"))
    return [_from_message(c) for c in claims.items], claims.metadata.resourceVersion


def _from_message(claim: claims_pb2.ResourceClaim) -> AllocationView:
    md = claim.metadata
    out: AllocationView = {"metadata": {"name": md.name, "namespace": md.namespace, "uid": md.uid}, "status": {}}
    if claim.status.HasField("allocation"):
        results: list[AllocationResult] = []
        for r in claim.status.allocation.devices.results:
            res: AllocationResult = {"request": r.request, "driver": r.driver, "pool": r.pool, "device": r.device}
            if r.adminAccess:
                res["adminAccess"] = True
            if r.HasField("shareID"):
                res["shareID"] = r.shareID
            if r.consumedCapacity:
                res["consumedCapacity"] = {name: q.string for name, q in r.consumedCapacity.items()}
            results.append(res)
        out["status"]["allocation"] = {"devices": {"results": results}}
    return out


def allocation_view(claim: Mapping[str, Any]) -> AllocationView:
    """A claim in its JSON form reduced to what :func:`decode_claim_list` yields for it."""
    md = as_mapping(claim.get("metadata"))
    out: AllocationView = {"metadata": {"name": str(md.get("name") or ""),
                                        "namespace": str(md.get("namespace") or ""),
                                        "uid": str(md.get("uid") or "")}, "status": {}}
    allocation = as_mapping(claim.get("status")).get("allocation")
    if not isinstance(allocation, Mapping):
        return out
    results: list[AllocationResult] = []
    for r in as_mapping(allocation.get("devices")).get("results") or []:
        if not isinstance(r, Mapping):
            continue
        res: AllocationResult = {"request": str(r.get("request") or ""), "driver": str(r.get("driver") or ""),
                                 "pool": str(r.get("pool") or ""), "device": str(r.get("device") or "")}
        if r.get("adminAccess") is True:
            res["adminAccess"] = True
        if r.get("shareID") is not None:
            res["shareID"] = str(r["shareID"])
        consumed = r.get("consumedCapacity")
        if isinstance(consumed, Mapping) and consumed:
            res["consumedCapacity"] = {str(k): str(v) for k, v in consumed.items()}
        results.append(res)
    out["status"]["allocation"] = {"devices": {"results": results}}
    return out


# --------------------------------------------------------------------------- pods


_B = TypeVar("_B")


@dataclass(frozen=True)
class Reduced(Generic[_B]):
    """A resource read in protobuf through a reduced schema: how to decode a list response
    (items, resourceVersion, continue token), what an item of a JSON answer becomes, and, for a
    resource that is watched this way, one watch frame (an event as the JSON watch gives it,
    ``{"type": ..., "object": ...}``). ``_B`` is the shape both give each item (:mod:`dra_driver.k8s.bodies`)."""

    decode_list: Callable[[bytes], tuple[list[_B], str, str]]
    from_json: Callable[[Obj], _B]
    decode_event: Callable[[bytes], Obj] | None = None


def decode_pod_list(body: bytes) -> tuple[list[RawPod], str, str]:
    pods = pods_pb2.PodList()
    _parse(pods, _unwrap(body, "PodList"))
    md = pods.metadata
    return [pod_refs(p) for p in pods.items], md.resourceVersion, getattr(md, "continue")


def decode_pod_event(frame: bytes) -> Obj:
    return _decode_event(frame, "Pod", lambda raw: pod_refs(_parsed(pods_pb2.Pod(), raw)))


def _decode_event(frame: bytes, kind: str, decode: Callable[[bytes], Mapping[str, Any]]) -> Obj:
    """One watch frame: ``{"type": ..., "object": ...}`` as the JSON watch gives it, the object
    decoded by ``decode`` (an error's Status and a bookmark by their own schemas)."""
    event = meta_pb2.WatchEvent()
    _parse(event, frame)
    raw = event.object.raw
    if event.type == "ERROR":
        status = meta_pb2.Status()
        _parse(status, _unwrap(raw, "Status"))
        return {"type": "ERROR", "object": {"kind": "Status", "code": status.code, "reason": status.reason,
                                            "message": status.message}}
    if event.type == "BOOKMARK":
        return {"type": "BOOKMARK", "object": _bookmark(_unwrap(raw, kind))}
    return {"type": event.type, "object": decode(_unwrap(raw, kind))}


_M = Any  # a parsed message: protobuf's generated classes give mypy nothing to check field access against


def _parsed(message: _M, raw: bytes) -> _M:
    _parse(message, raw)
    return message


def _bookmark(raw: bytes) -> Obj:
    mark = meta_pb2.Bookmark()
    _parse(mark, raw)
    meta: Obj = {"resourceVersion": mark.metadata.resourceVersion}
    if mark.metadata.annotations:
        meta["annotations"] = dict(mark.metadata.annotations)
    return {"metadata": meta}


def _time(t: meta_pb2.Time) -> str:
    """meta/v1 Time as its JSON form writes it (RFC 3339, seconds)."""
    return datetime.fromtimestamp(t.seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_refs(pod: pods_pb2.Pod) -> RawPod:
    """A pod as the controller reads it, in the shape of its JSON form."""
    md = pod.metadata
    meta: Obj = {"name": md.name, "namespace": md.namespace, "uid": md.uid, "resourceVersion": md.resourceVersion}
    if md.HasField("deletionTimestamp"):
        meta["deletionTimestamp"] = _time(md.deletionTimestamp)
    spec: Obj = {}
    if pod.spec.nodeName:
        spec["nodeName"] = pod.spec.nodeName
    if pod.spec.resourceClaims:
        spec["resourceClaims"] = [_named(rc.name, rc, "resourceClaimName") for rc in pod.spec.resourceClaims]
    if pod.spec.nodeSelector:
        spec["nodeSelector"] = dict(pod.spec.nodeSelector)
    if pod.spec.affinity.nodeAffinity.HasField("requiredDuringSchedulingIgnoredDuringExecution"):
        required = _node_selector(pod.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution)
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    if pod.spec.tolerations:
        spec["tolerations"] = [{f: getattr(t, f) for f in ("key", "operator", "value", "effect") if t.HasField(f)}
                               for t in pod.spec.tolerations]
    status: Obj = {}
    if pod.status.phase:
        status["phase"] = pod.status.phase
    if pod.status.resourceClaimStatuses:
        status["resourceClaimStatuses"] = [_named(st.name, st, "resourceClaimName")
                                           for st in pod.status.resourceClaimStatuses]
    if pod.status.HasField("extendedResourceClaimStatus"):
        status["extendedResourceClaimStatus"] = _named(None, pod.status.extendedResourceClaimStatus, "resourceClaimName")
    return cast(RawPod, {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status})


def _named(name: str | None, message: Any, field: str) -> Obj:
    out: Obj = {} if name is None else {"name": name}
    if message.HasField(field):
        out[field] = getattr(message, field)
    return out


POD_CLAIM_REFS: Reduced[RawPod] = Reduced(decode_pod_list, from_json=lambda pod: cast(RawPod, pod),
                                          decode_event=decode_pod_event)
"""Pods as the controller reads them; a JSON pod is read whole (its readers read only these fields)."""
CLAIM_ALLOCATIONS: Reduced[AllocationView] = Reduced(lambda body: (*decode_claim_list(body), ""), from_json=allocation_view)
"""Every claim's allocated devices (``list_claim_allocations``: from the watch cache, one page)."""


# --------------------------------------------------------------------------- claims and their notes


def noted_claims(annotations: Collection[str]) -> Reduced[NotedClaim]:
    """ResourceClaims as ``explain -n``/``-A`` reads them, in protobuf through
    ``api/proto/kubewire/claimnotes.proto``: name, namespace, deletion, of the annotations only
    ``annotations``; of a claim not allocated the DeviceClasses of its requests, of an allocated
    one its devices (driver, pool, device), which say whose claim it is. A JSON answer's claims are
    reduced to the same dicts."""
    keep = tuple(annotations)

    def decode_list(body: bytes) -> tuple[list[NotedClaim], str, str]:
        claims = claimnotes_pb2.NotedClaimList()
        _parse(claims, _unwrap(body, "ResourceClaimList"))
        md = claims.metadata
        return [_noted(c, keep) for c in claims.items], md.resourceVersion, getattr(md, "continue")

    return Reduced(decode_list, from_json=lambda claim: _noted_json(claim, keep))


def _noted(claim: _M, keep: tuple[str, ...]) -> NotedClaim:
    # Each field read off a parsed message costs a Python object: at 30,000 claims a list reads
    # only what the report needs, once.
    md = claim.metadata
    meta: RawMeta = {"name": md.name, "namespace": md.namespace}
    if md.HasField("deletionTimestamp"):
        meta["deletionTimestamp"] = _time(md.deletionTimestamp)
    found = md.annotations
    if found:
        notes = {k: v for k in keep if (v := found.get(k)) is not None}
        if notes:
            meta["annotations"] = notes
    status = claim.status
    if status.HasField("allocation"):
        results: list[AllocationResult] = [{"driver": r.driver, "pool": r.pool, "device": r.device}
                                           for r in status.allocation.devices.results]
        return {"metadata": meta, "status": {"allocation": {"devices": {"results": results}}}}
    requests: list[DeviceRequest] = []
    for r in claim.spec.devices.requests:
        request: DeviceRequest = {"name": r.name}
        if r.HasField("exactly"):
            request["exactly"] = {"deviceClassName": r.exactly.deviceClassName}
        subs = r.firstAvailable
        if subs:
            request["firstAvailable"] = [{"name": s.name, "deviceClassName": s.deviceClassName} for s in subs]
        requests.append(request)
    return {"metadata": meta, "spec": {"devices": {"requests": requests}}, "status": {}}


def _noted_json(claim: Mapping[str, Any], keep: tuple[str, ...]) -> NotedClaim:
    """:func:`_noted` of a claim's JSON form."""
    md = as_mapping(claim.get("metadata"))
    meta: RawMeta = {"name": str(md.get("name") or ""), "namespace": str(md.get("namespace") or "")}
    if md.get("deletionTimestamp"):
        meta["deletionTimestamp"] = str(md["deletionTimestamp"])
    found = as_mapping(md.get("annotations"))
    notes = {k: str(found[k]) for k in keep if k in found}
    if notes:
        meta["annotations"] = notes
    allocation = as_mapping(claim.get("status")).get("allocation")
    if isinstance(allocation, Mapping):
        results = as_mappings(as_mapping(allocation.get("devices")).get("results"))
        return {"metadata": meta, "status": {"allocation": {"devices": {"results": [
            {"driver": str(r.get("driver") or ""), "pool": str(r.get("pool") or ""), "device": str(r.get("device") or "")}
            for r in results]}}}}
    requests: list[DeviceRequest] = []
    for r in as_mappings(as_mapping(as_mapping(claim.get("spec")).get("devices")).get("requests")):
        request: DeviceRequest = {"name": str(r.get("name") or "")}
        if isinstance(r.get("exactly"), Mapping):
            request["exactly"] = {"deviceClassName": str(r["exactly"].get("deviceClassName") or "")}
        subs = as_mappings(r.get("firstAvailable"))
        if subs:
            request["firstAvailable"] = [{"name": str(s.get("name") or ""),
                                          "deviceClassName": str(s.get("deviceClassName") or "")} for s in subs]
        requests.append(request)
    return {"metadata": meta, "spec": {"devices": {"requests": requests}}, "status": {}}


# --------------------------------------------------------------------------- slices

SLICE_API_VERSION = "resource.k8s.io/v1"


SHARED_LIMIT = 50_000
"""Entries in each of the decoder's tables before it starts afresh (what was shared stays shared)."""
WHOLE_LIMIT = 4096
"""The same for its tables of whole maps, whose keys are larger (all of a map's entries)."""


class _SliceDecoder:
    """Builds the JSON form of protobuf slices, equal flat values (``{"string": ...}``,
    ``{"value": "80Gi"}``) and equal maps of them one object each, as
    :class:`dra_driver.k8s.compact.Interner` makes them of decoded JSON. A map entry is read by
    its bytes (slices.proto): one seen before is a lookup, parsed only the first time.

    Which keys appear follows the API's JSON tags: a pointer or ``omitempty`` field only when set
    (``HasField`` for pointers, so an explicit ``false`` stays), the others always (a capacity's
    request policy writes ``"default": null`` when it has none)."""

    def __init__(self) -> None:
        # Map entries by their bytes, one table per kind of entry (their bytes may coincide).
        self._attributes: dict[bytes, tuple[str, Any]] = {}
        self._capacity: dict[bytes, tuple[str, Any]] = {}
        self._counters: dict[bytes, tuple[str, Any]] = {}
        # Flat values by field, then value: a field holds values of one type ("int" ints, "bool"
        # bools), so 1 and True never meet.
        self._flat: dict[str, dict[Any, Obj]] = {}
        # Maps by key names and the identities of their (shared, so kept alive) values.
        self._maps: dict[tuple[tuple[str, ...], tuple[int, ...]], Obj] = {}
        # Capacity and counter maps by their entries' bytes: a few dozen distinct ones, each
        # read thousands of times (attribute maps are mostly distinct: UUIDs, parents' UUIDs).
        self._whole_capacity: dict[tuple[bytes, ...], Obj] = {}
        self._whole_counters: dict[tuple[bytes, ...], Obj] = {}
        # Devices' lists of counter consumptions by their entries' bytes: a dynamic-MIG placement
        # asks the same of its GPU's counter set on every node with that GPU.
        self._consumes: dict[tuple[bytes, ...], list[Obj]] = {}
        # Attribute maps by their bytes within one slice: a dynamic-MIG slice repeats each of its
        # GPUs' placements of a profile (57 distinct maps for 152 devices); across slices they differ.
        self._slice_attributes: dict[tuple[bytes, ...], Obj] = {}

    def slice(self, sl: _M) -> Obj:
        md = sl.metadata
        meta: Obj = {"name": md.name, "uid": md.uid, "resourceVersion": md.resourceVersion}
        if md.generation:
            meta["generation"] = md.generation
        if md.HasField("deletionTimestamp"):
            meta["deletionTimestamp"] = _time(md.deletionTimestamp)
        sp = sl.spec
        pool = sp.pool
        spec: Obj = {"driver": sp.driver, "pool": {"name": pool.name, "generation": pool.generation,
                                                   "resourceSliceCount": pool.resourceSliceCount}}
        _copy_set(spec, sp, _SLICE_SCALARS, ("skipNodeOperations",))
        if sp.HasField("nodeSelector"):
            spec["nodeSelector"] = _node_selector(sp.nodeSelector)
        if sp.devices:
            self._slice_attributes = {}
            device = self.device
            spec["devices"] = [device(d) for d in sp.devices]
        if sp.sharedCounters:
            spec["sharedCounters"] = [self._with_counters({"name": cs.name}, cs.counters) for cs in sp.sharedCounters]
        return {"apiVersion": SLICE_API_VERSION, "kind": "ResourceSlice", "metadata": meta, "spec": spec}

    def device(self, d: _M) -> Obj:
        out: Obj = {"name": d.name}
        # The fields set, in one call: asking for each field a device may set was a third of the
        # decoding, and most devices set only their name, attributes and capacity.
        present = {f.name: value for f, value in d.ListFields()}
        attributes = present.get("attributes")
        if attributes:
            out["attributes"] = self._whole(attributes, self._slice_attributes, self._attributes, self._attribute)
        capacity = present.get("capacity")
        if capacity:
            out["capacity"] = self._whole(capacity, self._whole_capacity, self._capacity, self._capacity_entry)
        counters = present.get("consumesCounters")
        if counters:
            raw = tuple(counters)
            consumes = self._consumes.get(raw)
            if consumes is None:
                consumes = _kept(self._consumes, raw, list(map(self._consumption, raw)), WHOLE_LIMIT)
            out["consumesCounters"] = consumes
        if len(present) > ("name" in present) + bool(attributes) + bool(capacity) + bool(counters):
            _copy_present(out, present, _DEVICE_SCALARS, ("bindingConditions", "bindingFailureConditions"))
            if "nodeSelector" in present:
                out["nodeSelector"] = _node_selector(present["nodeSelector"])
            if "taints" in present:
                out["taints"] = [_taint(t) for t in present["taints"]]
        return out

    def _whole(self, entries: _M, maps: dict[tuple[bytes, ...], Obj], known: dict[bytes, tuple[str, Any]],
               parse: Callable[[bytes], tuple[str, Any]]) -> Obj:
        """:meth:`_map` for maps that repeat whole, found by all their bytes at once."""
        raw = tuple(entries)
        shared = maps.get(raw)
        if shared is not None:
            return shared
        return _kept(maps, raw, self._map(raw, known, parse), WHOLE_LIMIT)

    def _map(self, entries: _M, known: dict[bytes, tuple[str, Any]], parse: Callable[[bytes], tuple[str, Any]]) -> Obj:
        # Every attribute of every device comes through here. The lookups and the dict are built
        # by C loops; only an entry not seen before (a UUID, a bus ID) takes a Python step.
        hits: list[tuple[str, Any] | None] = list(map(known.get, entries))
        fresh = None in hits
        if fresh:
            for i, hit in enumerate(hits):
                if hit is None:
                    raw = entries[i]
                    hits[i] = _kept(known, raw, parse(raw))
        out: Obj = dict(hits)  # type: ignore[arg-type]  # no None is left
        if fresh:
            # With an entry not seen before, no map seen before is equal to this one: nothing to
            # look up, nor worth remembering (a GPU's attributes, with its UUID, are its own).
            return out
        key = (tuple(out), tuple(map(id, out.values())))
        shared = self._maps.get(key)
        return shared if shared is not None else _kept(self._maps, key, out)

    def _attribute(self, raw: bytes) -> tuple[str, Any]:
        entry = _parsed(slices_pb2.AttributeEntry(), raw)
        value = entry.value
        kind = value.WhichOneof("value")
        return entry.key, _listed_attribute(value) if kind is None else self._flat_value(kind, getattr(value, kind))

    def _capacity_entry(self, raw: bytes) -> tuple[str, Any]:
        entry = _parsed(slices_pb2.CapacityEntry(), raw)
        value = entry.value
        if value.HasField("requestPolicy"):
            return entry.key, {"value": value.value.string, "requestPolicy": _policy(value.requestPolicy)}
        return entry.key, self._flat_value("value", value.value.string)

    def _counter(self, raw: bytes) -> tuple[str, Any]:
        entry = _parsed(slices_pb2.CounterEntry(), raw)
        return entry.key, self._flat_value("value", entry.value.value.string)

    def _flat_value(self, field: str, scalar: Any) -> Obj:
        table = self._flat.setdefault(field, {})
        shared = table.get(scalar)
        return shared if shared is not None else _kept(table, scalar, {field: scalar})

    def _consumption(self, raw: bytes) -> Obj:
        c = _parsed(slices_pb2.DeviceCounterConsumption(), raw)
        consumed = self._with_counters({"counterSet": c.counterSet}, c.counters)
        if c.compatibilityGroups:
            consumed["compatibilityGroups"] = list(c.compatibilityGroups)
        return consumed

    def _with_counters(self, out: Obj, counters: _M) -> Obj:
        if counters:
            out["counters"] = self._whole(counters, self._whole_counters, self._counters, self._counter)
        return out


_V = TypeVar("_V")


def _kept(table: dict[Any, _V], key: Any, value: _V, limit: int = SHARED_LIMIT) -> _V:
    """``value``, remembered under ``key`` in a table that starts afresh at ``limit`` entries."""
    if len(table) >= limit:
        table.clear()
    table[key] = value
    return value


_SLICE_SCALARS = ("nodeName", "allNodes", "perDeviceNodeSelection", "partitionTypeAttribute")
_DEVICE_SCALARS = ("nodeName", "allNodes", "bindsToNode", "allowMultipleAllocations")


def _copy_set(out: Obj, message: _M, scalars: tuple[str, ...], lists: tuple[str, ...]) -> None:
    """The pointer fields that are set (an explicit ``false`` too) and the lists that are not empty."""
    for name in scalars:
        if message.HasField(name):
            out[name] = getattr(message, name)
    for name in lists:
        items = getattr(message, name)
        if items:
            out[name] = list(items)


def _copy_present(out: Obj, present: Mapping[str, Any], scalars: tuple[str, ...], lists: tuple[str, ...]) -> None:
    """:func:`_copy_set` of a message whose set fields are ``present`` (``ListFields``, by name)."""
    for name in scalars:
        if name in present:
            out[name] = present[name]
    for name in lists:
        if name in present:
            out[name] = list(present[name])


def _listed_attribute(value: _M) -> Obj:
    out: Obj = {}
    _copy_set(out, value, (), ("ints", "bools", "strings", "versions"))
    return out


def _policy(p: _M) -> Obj:
    out: Obj = {"default": p.default.string if p.HasField("default") else None}
    if p.validValues:
        out["validValues"] = [q.string for q in p.validValues]
    if p.HasField("validRange"):
        r = p.validRange
        out["validRange"] = {k: getattr(r, k).string for k in ("min", "max", "step") if r.HasField(k)}
    return out


def _taint(t: _M) -> Obj:
    out: Obj = {"key": t.key}
    if t.value:
        out["value"] = t.value
    out["effect"] = t.effect
    if t.HasField("timeAdded"):
        out["timeAdded"] = _time(t.timeAdded)
    return out


def _node_selector(ns: _M) -> Obj:
    terms = []
    for term in ns.nodeSelectorTerms:
        out: Obj = {}
        for kind in ("matchExpressions", "matchFields"):
            reqs = getattr(term, kind)
            if reqs:
                out[kind] = [_requirement(r) for r in reqs]
        terms.append(out)
    return {"nodeSelectorTerms": terms}


def _requirement(r: _M) -> Obj:
    out: Obj = {"key": r.key, "operator": r.operator}
    if r.values:
        out["values"] = list(r.values)
    return out


def slice_reading(from_json: Callable[[Obj], Obj]) -> Reduced[Obj]:
    """ResourceSlices in protobuf, equal values shared; a JSON answer's slices go through
    ``from_json``."""
    decoder = _SliceDecoder()

    def decode_list(body: bytes) -> tuple[list[Obj], str, str]:
        slices = slices_pb2.ResourceSliceList()
        _parse(slices, _unwrap(body, "ResourceSliceList"))
        md = slices.metadata
        return [decoder.slice(s) for s in slices.items], md.resourceVersion, getattr(md, "continue")

    def decode_event(frame: bytes) -> Obj:
        return _decode_event(frame, "ResourceSlice", lambda raw: decoder.slice(_parsed(slices_pb2.ResourceSlice(), raw)))

    return Reduced(decode_list, from_json=from_json, decode_event=decode_event)


def read_frames(stream: IO[bytes]) -> Iterator[bytes]:
    """The frames of a protobuf watch stream: each a 4-byte big-endian length, then that many bytes.
    Ends at a clean end of stream; a stream cut inside a frame raises WireError."""
    while True:
        head = stream.read(4)
        if not head:
            return
        if len(head) < 4:
            raise WireError("watch stream ended inside a frame header")
        (length,) = struct.unpack(">I", head)
        if length > MAX_FRAME:
            raise WireError(f"watch frame of {length} bytes: the stream is out of step")
        frame = stream.read(length)
        if len(frame) < length:
            raise WireError("watch stream ended inside a frame")
        yield frame
