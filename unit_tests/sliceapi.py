"""A small in-memory API server for ResourceSlices (and the one Node the publisher reads), with the
parts of :class:`dra_driver.k8s.client.KubeApi` that :class:`dra_driver.node.publish.publisher.SlicePublisher`
uses; unlike :class:`kubefake.FakeKube` it can drop fields like a disabled feature gate and wipe
the node's slices behind the publisher's back like a kubelet."""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from dra_driver.k8s.client import SLICES, ApiError, ListResult, Resource
from dra_driver.k8s.informer import INITIAL_EVENTS_END

Obj = dict[str, Any]


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


class InMemorySliceApi:
    """``drop_fields`` lists device/spec fields to strip on write, imitating a disabled feature gate
    (e.g. ``{"consumesCounters", "sharedCounters", "taints"}``)."""

    def __init__(self, node_uid: str = "node-uid", drop_fields: Sequence[str] = ()) -> None:
        self.objects: dict[str, Obj] = {}
        self.node_uid = node_uid
        self.drop_fields = set(drop_fields)
        self._rv = 0
        self._lock = threading.Lock()
        self.events: list[tuple[str, Obj]] = []
        self._cond = threading.Condition(self._lock)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _store(self, body: Obj) -> Obj:
        obj = copy.deepcopy(body)
        spec = obj.setdefault("spec", {})
        for key in ("sharedCounters", "perDeviceNodeSelection"):
            if key in self.drop_fields:
                spec.pop(key, None)
        for device in spec.get("devices") or []:
            for key in ("consumesCounters", "taints", "allowMultipleAllocations", "bindingConditions",
                        "bindingFailureConditions", "bindsToNode"):
                if key in self.drop_fields:
                    device.pop(key, None)
            for taint in device.get("taints") or []:
                taint.setdefault("timeAdded", "2026-01-01T00:00:00Z")
        return obj

    @staticmethod
    def _matches(obj: Mapping[str, Any], field_selector: str | None) -> bool:
        for term in filter(None, (field_selector or "").split(",")):
            key, _, want = term.partition("=")
            have = _spec(obj).get(key.removeprefix("spec.")) if key.startswith("spec.") else None
            if (have or "") != want:
                return False
        return True

    def list(self, res: Resource, *, namespace: str | None = None, field_selector: str | None = None,
             cached: bool = False, transform: Callable[[Obj], Obj | None] | None = None,
             reduced: object = None) -> ListResult:
        assert res is SLICES and transform is None and reduced is None
        with self._lock:
            items = [copy.deepcopy(o) for o in self.objects.values() if self._matches(o, field_selector)]
            return ListResult(items, str(self._rv))

    def get(self, res: Resource, name: str, *, namespace: str | None = None,
            meanwhile: Callable[[], object] | None = None) -> Obj:
        assert res.kind == "Node"
        return {"metadata": {"name": name, "uid": self.node_uid}}

    def create(self, res: Resource, body: Obj, *, namespace: str | None = None, dry_run: bool = False) -> Obj:
        assert res is SLICES
        if dry_run:
            return self._store(body)
        with self._lock:
            obj = self._store(body)
            meta = obj.setdefault("metadata", {})
            if not meta.get("name"):
                meta["name"] = meta.get("generateName", "") + uuid.uuid4().hex[:5]
            if meta["name"] in self.objects:
                raise ApiError(409, "AlreadyExists", f"{meta['name']} already exists")
            meta["uid"] = str(uuid.uuid4())
            meta["resourceVersion"] = self._next_rv()
            self.objects[meta["name"]] = obj
            self.events.append(("ADDED", copy.deepcopy(obj)))
            self._cond.notify_all()
            return copy.deepcopy(obj)

    def replace(self, res: Resource, body: Obj) -> Obj:
        assert res is SLICES
        name = str(_meta(body).get("name", ""))
        with self._lock:
            current = self.objects.get(name)
            if current is None:
                raise ApiError(404, "NotFound", f"{name} not found")
            if _meta(body).get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f"{name}: resourceVersion conflict")
            obj = self._store(body)
            obj["metadata"] = dict(current["metadata"], resourceVersion=self._next_rv())
            self.objects[name] = obj
            self.events.append(("MODIFIED", copy.deepcopy(obj)))
            self._cond.notify_all()
            return copy.deepcopy(obj)

    def delete(self, res: Resource, name: str, *, namespace: str | None = None, uid: str | None = None,
               resource_version: str | None = None) -> None:
        assert res is SLICES
        with self._lock:
            current = self.objects.get(name)
            if current is None:
                raise ApiError(404, "NotFound", f"{name} not found")
            meta = current["metadata"]
            if (uid and meta["uid"] != uid) or (resource_version and meta["resourceVersion"] != resource_version):
                raise ApiError(409, "Conflict", f"{name}: precondition failed")
            del self.objects[name]
            self._next_rv()
            self.events.append(("DELETED", copy.deepcopy(current)))
            self._cond.notify_all()

    def wipe(self) -> None:
        """Delete every slice behind the publisher's back (what a kubelet does at start-up)."""
        with self._lock:
            for name in list(self.objects):
                self.events.append(("DELETED", self.objects.pop(name)))
            self._next_rv()
            self._cond.notify_all()

    def watch(self, res: Resource, *, resource_version: str, timeout_seconds: int,
              field_selector: str | None = None, reduced: object = None,
              send_initial_events: bool = False) -> Iterator[Obj]:
        """Events from now on (``resource_version`` is not replayed); with ``send_initial_events``,
        first an ADDED event per slice and the bookmark that ends them."""
        assert res is SLICES and reduced is None
        deadline = time.monotonic() + timeout_seconds
        with self._lock:
            seen = len(self.events)
            initial = [copy.deepcopy(o) for o in self.objects.values() if self._matches(o, field_selector)]
            now = str(self._rv)
        if send_initial_events:
            for obj in initial:
                yield {"type": "ADDED", "object": obj}
            yield {"type": "BOOKMARK", "object": {"metadata": {
                "resourceVersion": now, "annotations": {INITIAL_EVENTS_END: "true"}}}}
        while time.monotonic() < deadline:
            with self._cond:
                if len(self.events) == seen:
                    self._cond.wait(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
                fresh = self.events[seen:]
                seen = len(self.events)
            for kind, obj in fresh:
                if self._matches(obj, field_selector):
                    yield {"type": kind, "object": copy.deepcopy(obj)}
