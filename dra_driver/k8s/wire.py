"""Objects read in the API server's protobuf encoding, through schemas that declare only what we read.

Every ResourceClaim's allocated devices
=======================================

``dra-driver explain`` needs to know which devices all other claims hold. On a cluster with ~800
claims the JSON list is 1.6 MB: ~16 ms for the API server to encode and ~14 ms for us to decode,
most of it for fields nobody reads (managedFields, specs, reservedFor). The protobuf list of the
same claims is encoded in ~5 ms, and parsing it with a schema that declares only the allocation
(``api/proto/kubewire/claims.proto``) and reducing it takes ~3 ms.

Both encodings end in the same reduced JSON-shaped dict per claim (:func:`allocation_view`), the
form :func:`dra_driver.allocator.inventory.allocated_state` reads, so a server or proxy that answers in
JSON instead gives the same result.

The controller's pods
=====================
The controller reads three things of a pod: the claims it references, its node and whether it is
done (:func:`dra_driver.k8s.claims.pod_claim_keys`, ``pod_node``, ``pod_is_done``). A pod is
~3 KiB of JSON and ~20 KiB decoded, nearly all containers, volumes and conditions; at 12,000 pods
listing them as JSON took 1.5 s of the controller's CPU, in protobuf through
``api/proto/kubewire/pods.proto`` 0.3 s, and the server sends 40% fewer bytes. :data:`POD_CLAIM_REFS`
asks for that (lists and watches, JSON still accepted) and yields each pod as a JSON-shaped dict of
just those fields (:func:`pod_refs`), which the readers above treat as the pod itself.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

from google.protobuf.message import DecodeError

from dra_driver._proto.kubewire import claims_pb2, meta_pb2, pods_pb2

PROTOBUF = "application/vnd.kubernetes.protobuf"
ACCEPT = f"{PROTOBUF}, application/json"
"""What a reader of protobuf asks for: JSON stays acceptable, since a proxy or an aggregated
server may not speak protobuf."""
MAX_FRAME = 64 << 20
"""A watch frame longer than this is not a frame: the stream is out of step (etcd's object limit
is 1.5 MiB)."""
_MAGIC = b"k8s\x00"

Obj = dict[str, Any]


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


def decode_claim_list(body: bytes) -> tuple[list[Obj], str]:
    """The reduced claims of a protobuf ``ResourceClaimList`` response, and its resourceVersion."""
    claims = claims_pb2.ResourceClaimList()
    _parse(claims, _unwrap(body, "ResourceClaimList"))
    return [_from_message(c) for c in claims.items], claims.metadata.resourceVersion


def _from_message(claim: claims_pb2.ResourceClaim) -> Obj:
    md = claim.metadata
    out: Obj = {"metadata": {"name": md.name, "namespace": md.namespace, "uid": md.uid}, "status": {}}
    if claim.status.HasField("allocation"):
        results = []
        for r in claim.status.allocation.devices.results:
            res: Obj = {"request": r.request, "driver": r.driver, "pool": r.pool, "device": r.device}
            if r.adminAccess:
                res["adminAccess"] = True
            if r.HasField("shareID"):
                res["shareID"] = r.shareID
            if r.consumedCapacity:
                res["consumedCapacity"] = {name: q.string for name, q in r.consumedCapacity.items()}
            results.append(res)
        out["status"]["allocation"] = {"devices": {"results": results}}
    return out


def allocation_view(claim: Mapping[str, Any]) -> Obj:
    """A claim in its JSON form reduced to what :func:`decode_claim_list` yields for it."""
    md = claim.get("metadata")
    md = md if isinstance(md, Mapping) else {}
    out: Obj = {"metadata": {k: str(md.get(k) or "") for k in ("name", "namespace", "uid")}, "status": {}}
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    if not isinstance(allocation, Mapping):
        return out
    devices = allocation.get("devices")
    results = []
    for r in (devices.get("results") if isinstance(devices, Mapping) else None) or []:
        if not isinstance(r, Mapping):
            continue
        res: Obj = {k: str(r.get(k) or "") for k in ("request", "driver", "pool", "device")}
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


@dataclass(frozen=True)
class Reduced:
    """A resource read in protobuf through a reduced schema: how to decode a list response
    (items, resourceVersion, continue token), what an item of a JSON answer becomes, and, for a
    resource that is watched this way, one watch frame (an event as the JSON watch gives it,
    ``{"type": ..., "object": ...}``)."""

    decode_list: Callable[[bytes], tuple[list[Obj], str, str]]
    from_json: Callable[[Obj], Obj]
    decode_event: Callable[[bytes], Obj] | None = None


def decode_pod_list(body: bytes) -> tuple[list[Obj], str, str]:
    pods = pods_pb2.PodList()
    _parse(pods, _unwrap(body, "PodList"))
    md = pods.metadata
    return [pod_refs(p) for p in pods.items], md.resourceVersion, getattr(md, "continue")


def decode_pod_event(frame: bytes) -> Obj:
    event = meta_pb2.WatchEvent()
    _parse(event, frame)
    raw = event.object.raw
    if event.type == "ERROR":
        status = meta_pb2.Status()
        _parse(status, _unwrap(raw, "Status"))
        return {"type": "ERROR", "object": {"kind": "Status", "code": status.code, "reason": status.reason,
                                            "message": status.message}}
    if event.type == "BOOKMARK":
        return {"type": "BOOKMARK", "object": _bookmark(_unwrap(raw, "Pod"))}
    pod = pods_pb2.Pod()
    _parse(pod, _unwrap(raw, "Pod"))
    return {"type": event.type, "object": pod_refs(pod)}


def _bookmark(raw: bytes) -> Obj:
    mark = meta_pb2.Bookmark()
    _parse(mark, raw)
    meta: Obj = {"resourceVersion": mark.metadata.resourceVersion}
    if mark.metadata.annotations:
        meta["annotations"] = dict(mark.metadata.annotations)
    return {"metadata": meta}


def pod_refs(pod: pods_pb2.Pod) -> Obj:
    """A pod as the controller reads it, in the shape of its JSON form."""
    md = pod.metadata
    meta: Obj = {"name": md.name, "namespace": md.namespace, "uid": md.uid, "resourceVersion": md.resourceVersion}
    if md.HasField("deletionTimestamp"):
        at = datetime.fromtimestamp(md.deletionTimestamp.seconds, tz=UTC)
        meta["deletionTimestamp"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    spec: Obj = {}
    if pod.spec.nodeName:
        spec["nodeName"] = pod.spec.nodeName
    if pod.spec.resourceClaims:
        spec["resourceClaims"] = [_named(rc.name, rc, "resourceClaimName") for rc in pod.spec.resourceClaims]
    status: Obj = {}
    if pod.status.phase:
        status["phase"] = pod.status.phase
    if pod.status.resourceClaimStatuses:
        status["resourceClaimStatuses"] = [_named(st.name, st, "resourceClaimName")
                                           for st in pod.status.resourceClaimStatuses]
    if pod.status.HasField("extendedResourceClaimStatus"):
        status["extendedResourceClaimStatus"] = _named(None, pod.status.extendedResourceClaimStatus, "resourceClaimName")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def _named(name: str | None, message: Any, field: str) -> Obj:
    out: Obj = {} if name is None else {"name": name}
    if message.HasField(field):
        out[field] = getattr(message, field)
    return out


POD_CLAIM_REFS = Reduced(decode_pod_list, from_json=lambda pod: pod, decode_event=decode_pod_event)
"""Pods as the controller reads them; a JSON pod is read whole (its readers read only these fields)."""
CLAIM_ALLOCATIONS = Reduced(lambda body: (*decode_claim_list(body), ""), from_json=allocation_view)
"""Every claim's allocated devices (``list_claim_allocations``: from the watch cache, one page)."""


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
