"""An in-memory stand-in for the API server behind dra_driver.k8s.client.KubeApi.

Semantics kept from the real thing: resourceVersion bumps on every write, ``update`` with a stale
resourceVersion fails with 409, ``update`` of the main resource ignores status and the status
subresource ignores everything else, deletion with finalizers only sets deletionTimestamp and the
object goes away when the last finalizer is removed, watch events replay the write log.
"""

from __future__ import annotations

import copy
import itertools
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from google.protobuf import json_format

from dra_driver._proto.kubewire import claimnotes_pb2, meta_pb2, pods_pb2, slices_pb2
from dra_driver.k8s.client import CLAIMS, NAMESPACES, ApiError, ListResult, Resource
from dra_driver.k8s.informer import INITIAL_EVENTS_END
from dra_driver.k8s.objects import Obj, key_of
from dra_driver.k8s.wire import Reduced, allocation_view


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Obj]] = {}
        self.log: list[tuple[int, str, str, Obj]] = []  # (rv, plural, type, obj)
        self._rv = itertools.count(100)
        self.rv = 100
        self.calls: list[tuple[str, str, str]] = []
        self.hooks: dict[str, Callable[[FakeKube, Resource, Obj], None]] = {}
        self.fail: dict[str, ApiError] = {}
        self.unreachable = False
        self.streaming_lists = True  # False: refuses sendInitialEvents, as a server with WatchList off
        # Admission: called with (verb, resource, new object, old object) before a write is
        # stored (dry runs included); raising ApiError denies it, as an admission policy would.
        self.admission: list[Callable[[str, Resource, Obj, Obj | None], None]] = []
        # Server-side apply of status.devices: which entries each field manager owns, per object.
        self.status_owners: dict[tuple[str, str], dict[str, set[tuple[str, ...]]]] = {}

    # -- helpers for tests

    def _next_rv(self) -> str:
        self.rv = next(self._rv)
        return str(self.rv)

    def _bucket(self, res: Resource) -> dict[str, Obj]:
        return self.objects.setdefault(res.plural, {})

    def _record(self, res: Resource, etype: str, obj: Obj) -> None:
        self.log.append((self.rv, res.plural, etype, copy.deepcopy(obj)))

    def add(self, res: Resource, obj: Obj) -> Obj:
        """Create directly (no call recorded)."""
        obj = copy.deepcopy(obj)
        obj.setdefault("apiVersion", res.api_version)
        obj.setdefault("kind", res.kind)
        m = obj.setdefault("metadata", {})
        m.setdefault("uid", str(uuid.uuid4()))
        m.setdefault("generation", 1)
        m["resourceVersion"] = self._next_rv()
        self._bucket(res)[key_of(obj)] = obj
        self._record(res, "ADDED", obj)
        if res.namespaced and m.get("namespace") and str(m["namespace"]) not in self._bucket(NAMESPACES):
            # As on a cluster, an object's namespace exists (with the label the API server sets).
            ns = str(m["namespace"])
            self.add(NAMESPACES, {"metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}}})
        return copy.deepcopy(obj)

    def set(self, res: Resource, obj: Obj) -> Obj:
        """Overwrite as some other client would (no precondition, no call recorded)."""
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._bucket(res)[key_of(obj)] = obj
        self._record(res, "MODIFIED", obj)
        return copy.deepcopy(obj)

    def delete(self, res: Resource, key: str, *, namespace: str | None = None, uid: str | None = None,
               resource_version: str | None = None) -> None:
        """Called with a key only, the test helper: no call recorded, a missing object is ignored.
        Called the KubeApi way (any keyword), a recorded API call: 404 when missing, 409 when a
        precondition fails."""
        api = namespace is not None or uid is not None or resource_version is not None
        if namespace is not None:
            key = f"{namespace}/{key}"
        if api:
            self._check("delete", res, key)
        obj = self._bucket(res).get(key)
        if obj is None:
            if api:
                raise ApiError(404, "NotFound", key)
            return
        if (uid and obj["metadata"].get("uid") != uid) or (
                resource_version and obj["metadata"].get("resourceVersion") != resource_version):
            raise ApiError(409, "Conflict", f"{key}: precondition failed")
        if obj["metadata"].get("finalizers"):
            obj["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._record(res, "MODIFIED", obj)
            return
        del self._bucket(res)[key]
        self._next_rv()
        self._record(res, "DELETED", obj)

    def obj(self, res: Resource, key: str) -> Obj | None:
        o = self._bucket(res).get(key)
        return copy.deepcopy(o) if o is not None else None

    def writes(self, verb: str | None = None) -> list[tuple[str, str, str]]:
        reads = ("list", "get", "watch")
        return [c for c in self.calls if c[0] not in reads and (verb is None or c[0] == verb)]

    def _check(self, verb: str, res: Resource, key: str) -> None:
        self.calls.append((verb, res.plural, key))
        if self.unreachable:
            raise ApiError(0, "MaxRetryError", "connection refused")
        err = self.fail.get(f"{verb}:{res.plural}")
        if err is not None:
            raise err
        hook = self.hooks.pop(f"{verb}:{res.plural}", None)
        if hook is not None:
            hook(self, res, {"key": key})

    # -- KubeApi

    def list(self, res: Resource, *, namespace: str | None = None, field_selector: str | None = None,
             cached: bool = False, transform: Callable[[Obj], Obj | None] | None = None,
             reduced: Reduced | None = None) -> ListResult:
        self._check("list", res, "")
        items = [as_reduced(o, reduced, res) for o in self._bucket(res).values()
                 if (namespace is None or o["metadata"].get("namespace") == namespace) and _selected(o, field_selector)]
        if transform is not None:
            items = [k for o in items if (k := transform(o)) is not None]
        return ListResult(items, str(self.rv))

    def list_claim_allocations(self) -> ListResult:
        listed = self.list(CLAIMS, cached=True)
        return ListResult([allocation_view(c) for c in listed.items], listed.resource_version)

    def watch(self, res: Resource, *, resource_version: str, timeout_seconds: int,
              field_selector: str | None = None, reduced: Reduced | None = None,
              send_initial_events: bool = False) -> Iterator[Obj]:
        self._check("watch", res, "")
        if send_initial_events:
            if not self.streaming_lists:
                raise ApiError(422, "Invalid", "sendInitialEvents: Forbidden: sendInitialEvents is forbidden")
            now = self.rv
            for o in list(self._bucket(res).values()):
                if _selected(o, field_selector):
                    yield {"type": "ADDED", "object": as_reduced(o, reduced, res)}
            yield initial_events_end(str(now), reduced, res)
            resource_version = str(now)
        since = int(resource_version or 0)
        if self.log and since < self.log[0][0] - 1 and since != 0:
            raise ApiError(410, "Expired", "too old resource version")
        # As the API server's watch cache: with a field selector, an object that comes to match it
        # is ADDED, one that stops matching DELETED.
        matched: dict[str, bool] = {}
        for rv, plural, etype, obj in list(self.log):
            if plural != res.plural:
                continue
            if not field_selector:
                if rv > since:
                    yield {"type": etype, "object": as_reduced(obj, reduced, res)}
                continue
            key = key_of(obj)
            was, now = matched.get(key, False), etype != "DELETED" and _selected(obj, field_selector)
            matched[key] = now
            if rv <= since or not (was or now):
                continue
            if etype != "DELETED":
                etype = "DELETED" if not now else "ADDED" if not was else etype
            yield {"type": etype, "object": as_reduced(obj, reduced, res)}

    def get(self, res: Resource, name: str, *, namespace: str | None = None,
            meanwhile: Callable[[], object] | None = None) -> Obj:
        if meanwhile is not None:
            meanwhile()
        key = f"{namespace}/{name}" if namespace else name
        self._check("get", res, key)
        obj = self._bucket(res).get(key)
        if obj is None:
            raise ApiError(404, "NotFound", f"{res.plural} {name!r} not found")
        return copy.deepcopy(obj)

    def create(self, res: Resource, body: Obj, *, namespace: str | None = None, dry_run: bool = False) -> Obj:
        m = body.get("metadata") or {}
        if not m.get("name") and m.get("generateName"):
            body = dict(body, metadata=dict(m, name=m["generateName"] + uuid.uuid4().hex[:5]))
        key = key_of(body)
        self._check("create", res, key)
        if key in self._bucket(res):
            raise ApiError(409, "AlreadyExists", f"{key} exists")
        return copy.deepcopy(body) if dry_run else self.add(res, body)

    def _update(self, verb: str, res: Resource, body: Obj, apply: Callable[[Obj, Obj], Obj],
                dry_run: bool = False) -> Obj:
        key = key_of(body)
        self._check(verb, res, key)
        cur = self._bucket(res).get(key)
        if cur is None:
            raise ApiError(404, "NotFound", key)
        want = str(body.get("metadata", {}).get("resourceVersion", ""))
        if want and want != cur["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified; please apply your changes to the latest version")
        new = apply(copy.deepcopy(cur), copy.deepcopy(body))
        for admit in self.admission:
            admit(verb, res, new, cur)
        if dry_run:
            return copy.deepcopy(new)
        new["metadata"]["resourceVersion"] = self._next_rv()
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            del self._bucket(res)[key]
            self._record(res, "DELETED", new)
            return copy.deepcopy(new)
        self._bucket(res)[key] = new
        self._record(res, "MODIFIED", new)
        return copy.deepcopy(new)

    def replace(self, res: Resource, body: Obj) -> Obj:
        def apply(cur: Obj, new: Obj) -> Obj:
            status = cur.get("status")
            m = new["metadata"]
            for k in ("uid", "creationTimestamp", "deletionTimestamp"):
                if k in cur["metadata"]:
                    m[k] = cur["metadata"][k]
                else:
                    m.pop(k, None)
            if status is not None:
                new["status"] = status
            else:
                new.pop("status", None)
            return new

        return self._update("replace", res, body, apply)

    def replace_status(self, res: Resource, body: Obj, *, dry_run: bool = False) -> Obj:
        def apply(cur: Obj, new: Obj) -> Obj:
            cur["status"] = new.get("status") or {}
            return cur

        # Dry runs are their own verb: hooks and write counts meant for real writes ignore them.
        return self._update("dry_run_status" if dry_run else "replace_status", res, body, apply, dry_run=dry_run)

    def merge_patch(self, res: Resource, name: str, patch: Obj, *, namespace: str | None = None) -> Obj:
        key = f"{namespace}/{name}" if namespace else name
        body = {"metadata": {"name": name, "namespace": namespace}} if namespace else {"metadata": {"name": name}}

        def apply(cur: Obj, _: Obj) -> Obj:
            return _merge(cur, patch)

        self.calls.append(("merge_patch", res.plural, key))
        self.calls.pop()  # _update records it
        return self._update("merge_patch", res, body, apply)

    def apply_status(self, res: Resource, name: str, body: Obj, *, namespace: str | None = None,
                     field_manager: str) -> Obj:
        """Server-side apply of ``status.devices``, the one list this project applies: entries are keyed
        by (driver, pool, device, shareID) and owned by the manager that applied them last (forced);
        an entry must be an allocated device, and ``metadata.uid`` must match, as on the real server."""
        key = f"{namespace}/{name}" if namespace else name
        want_uid = (body.get("metadata") or {}).get("uid")
        applied = list((body.get("status") or {}).get("devices") or [])

        def apply(cur: Obj, _: Obj) -> Obj:
            if want_uid and want_uid != cur["metadata"].get("uid"):
                raise ApiError(422, "Invalid", f"metadata.uid: Invalid value: {want_uid!r}: field is immutable")
            results = (((cur.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
            allocated = {_device_key(r) for r in results}
            for i, entry in enumerate(applied):
                if _device_key(entry) not in allocated:
                    raise ApiError(422, "Invalid", f"status.devices[{i}]: must be an allocated device in the claim")
            owners = self.status_owners.setdefault((res.plural, key), {})
            keys = {_device_key(e) for e in applied}
            dropped = owners.get(field_manager, set()) - keys
            for other, owned in owners.items():
                if other != field_manager:
                    owned -= keys
                    dropped -= owned
            owners[field_manager] = keys
            status = cur.setdefault("status", {})
            kept = [d for d in status.get("devices") or [] if _device_key(d) not in keys | dropped]
            if kept or applied:
                status["devices"] = kept + copy.deepcopy(applied)
            else:
                status.pop("devices", None)
            return cur

        return self._update("apply_status", res, {"metadata": {"name": name, "namespace": namespace}}, apply)


def _device_key(entry: Any) -> tuple[str, ...]:
    return tuple(str(entry.get(k) or "") for k in ("driver", "pool", "device", "shareID"))


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge(out.get(k), v)
    return out


def as_reduced(obj: Obj, reduced: Reduced | None, res: Resource) -> Obj:
    """A copy of ``obj`` as a reader with ``reduced`` gets it from the real API server: encoded by
    the real schema, read through ours (so a field the controller reads but the schema does not
    declare is missing here too). An object the real schema cannot hold (a test's invalid slice,
    which the real API server would have refused) arrives as a JSON answer would."""
    if reduced is None:
        return copy.deepcopy(obj)
    kind, encode = ENCODERS[res.plural]
    try:
        raw = encode(obj).SerializeToString()
    except (KeyError, AttributeError, TypeError, ValueError, json_format.ParseError):
        return reduced.from_json(copy.deepcopy(obj))
    if reduced.decode_event is None:  # read by lists only: a list of this one object
        return reduced.decode_list(_list_of_one(kind, raw))[0][0]
    return reduced.decode_event(_event("ADDED", kind, raw))["object"]


def _list_of_one(kind: str, raw: bytes) -> bytes:
    """A protobuf list response holding the one encoded object ``raw`` (items are field 2)."""
    item = _FIELD_2 + _varint(len(raw)) + raw
    envelope = meta_pb2.Unknown(typeMeta=meta_pb2.TypeMeta(apiVersion="v1", kind=f"{kind}List"), raw=item)
    return b"k8s\x00" + envelope.SerializeToString()


_FIELD_2 = bytes([2 << 3 | 2])


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _event(etype: str, kind: str, raw: bytes) -> bytes:
    envelope = meta_pb2.Unknown(typeMeta=meta_pb2.TypeMeta(apiVersion="v1", kind=kind), raw=raw)
    event = meta_pb2.WatchEvent(type=etype, object=meta_pb2.RawExtension(raw=b"k8s\x00" + envelope.SerializeToString()))
    return bytes(event.SerializeToString())


def initial_events_end(version: str, reduced: Reduced | None, res: Resource) -> Obj:
    """The bookmark that ends a streamed list, as a reader with ``reduced`` gets it: encoded and
    framed as the real API server sends it, read through our schema."""
    meta = {"resourceVersion": version, "annotations": {INITIAL_EVENTS_END: "true"}}
    if reduced is None:
        return {"type": "BOOKMARK", "object": {"metadata": meta}}
    assert reduced.decode_event is not None
    mark = json_format.ParseDict({"metadata": meta}, meta_pb2.Bookmark()).SerializeToString()
    return reduced.decode_event(_event("BOOKMARK", ENCODERS[res.plural][0], mark))


def _with_seconds(obj: Obj) -> Obj:
    """A copy of ``obj`` whose deletionTimestamp is the message the wire holds, not JSON's string."""
    doc = copy.deepcopy(obj)
    md = doc.get("metadata") or {}
    if md.get("deletionTimestamp"):
        md["deletionTimestamp"] = {"seconds": int(datetime.fromisoformat(md["deletionTimestamp"]).timestamp())}
    return doc


def claim_message(claim: Obj) -> claimnotes_pb2.NotedClaim:
    """A JSON claim as its protobuf encoding reads through ``claimnotes.proto``."""
    return json_format.ParseDict(_with_seconds(claim), claimnotes_pb2.NotedClaim(), ignore_unknown_fields=True)


def pod_message(pod: Obj) -> pods_pb2.Pod:
    """A JSON pod as its protobuf encoding reads through ``pods.proto``."""
    return json_format.ParseDict(_with_seconds(pod), pods_pb2.Pod(), ignore_unknown_fields=True)


def _entry(message: Any, key: str, fill: Any) -> bytes:
    entry = message(key=key)
    fill(entry.value)
    return bytes(entry.SerializeToString())


def _quantity(q: Any, text: str) -> None:
    q.string = text


def _attribute(value: dict[str, Any]) -> Any:
    def fill(a: Any) -> None:
        for kind, v in value.items():
            if isinstance(v, list):
                getattr(a, kind).extend(v)
            else:
                setattr(a, kind, v)
    return fill


def _capacity(value: dict[str, Any]) -> Any:
    def fill(c: Any) -> None:
        c.value.string = value["value"]
        policy = value.get("requestPolicy")
        if policy is not None:
            c.requestPolicy.SetInParent()
            if policy.get("default") is not None:
                c.requestPolicy.default.string = policy["default"]
            for v in policy.get("validValues", []):
                c.requestPolicy.validValues.add(string=v)
            for k, v in policy.get("validRange", {}).items():
                getattr(c.requestPolicy.validRange, k).string = v
    return fill


def _counters(field: Any, counters: dict[str, Any]) -> None:
    field.extend(_entry(slices_pb2.CounterEntry, k, lambda c, v=v: _quantity(c.value, v["value"]))
                 for k, v in counters.items())


def _selector(message: Any, selector: dict[str, Any]) -> None:
    message.SetInParent()
    for term in selector["nodeSelectorTerms"]:
        t = message.nodeSelectorTerms.add()
        for kind in ("matchExpressions", "matchFields"):
            for r in term.get(kind, []):
                getattr(t, kind).add(key=r["key"], operator=r["operator"], values=r.get("values", []))


def _time(message: Any, text: str) -> None:
    message.seconds = int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


def slice_message(sl: dict[str, Any]) -> Any:
    """A JSON slice as the API server encodes it in protobuf (map entries are key/value messages)."""
    m = slices_pb2.ResourceSlice()
    md, sp = sl["metadata"], sl["spec"]
    m.metadata.name, m.metadata.uid = md.get("name", ""), md.get("uid", "")
    m.metadata.resourceVersion = str(md.get("resourceVersion", ""))
    if "generation" in md:
        m.metadata.generation = md["generation"]
    if "deletionTimestamp" in md:
        _time(m.metadata.deletionTimestamp, md["deletionTimestamp"])
    o = m.spec
    o.driver = sp["driver"]
    o.pool.name, o.pool.generation, o.pool.resourceSliceCount = (sp["pool"][k] for k in ("name", "generation",
                                                                                         "resourceSliceCount"))
    for k in ("nodeName", "allNodes", "perDeviceNodeSelection", "partitionTypeAttribute"):
        if k in sp:
            setattr(o, k, sp[k])
    if "nodeSelector" in sp:
        _selector(o.nodeSelector, sp["nodeSelector"])
    o.skipNodeOperations.extend(sp.get("skipNodeOperations", []))
    for cs in sp.get("sharedCounters", []):
        _counters(o.sharedCounters.add(name=cs["name"]).counters, cs.get("counters", {}))
    for d in sp.get("devices", []):
        dev = o.devices.add(name=d["name"])
        dev.attributes.extend(_entry(slices_pb2.AttributeEntry, k, _attribute(v)) for k, v in d.get("attributes", {}).items())
        dev.capacity.extend(_entry(slices_pb2.CapacityEntry, k, _capacity(v)) for k, v in d.get("capacity", {}).items())
        for c in d.get("consumesCounters", []):
            consumed = slices_pb2.DeviceCounterConsumption(counterSet=c["counterSet"],
                                                           compatibilityGroups=c.get("compatibilityGroups", []))
            _counters(consumed.counters, c.get("counters", {}))
            dev.consumesCounters.append(consumed.SerializeToString())
        for k in ("nodeName", "allNodes", "bindsToNode", "allowMultipleAllocations"):
            if k in d:
                setattr(dev, k, d[k])
        if "nodeSelector" in d:
            _selector(dev.nodeSelector, d["nodeSelector"])
        for t in d.get("taints", []):
            taint = dev.taints.add(key=t["key"], value=t.get("value", ""), effect=t["effect"])
            if "timeAdded" in t:
                _time(taint.timeAdded, t["timeAdded"])
        dev.bindingConditions.extend(d.get("bindingConditions", []))
        dev.bindingFailureConditions.extend(d.get("bindingFailureConditions", []))
    return m


ENCODERS: dict[str, tuple[str, Callable[[Obj], Any]]] = {"pods": ("Pod", pod_message),
                                                          "resourceclaims": ("ResourceClaim", claim_message),
                                                          "resourceslices": ("ResourceSlice", slice_message)}
"""The resources read in protobuf: their kind and how the real API server's schema encodes one."""


def _selected(obj: Obj, field_selector: str | None) -> bool:
    """Field selector terms ``a.b=v``, ``a.b==v`` and ``a.b!=v``, all of which must hold."""
    for term in filter(None, (field_selector or "").split(",")):
        negate = "!=" in term
        path, _, want = term.partition("!=" if negate else "=")
        want = want.removeprefix("=")
        have: Any = obj
        for part in path.split("."):
            have = have.get(part) if isinstance(have, dict) else None
        if (str(have if have is not None else "") == want) == negate:
            return False
    return True
