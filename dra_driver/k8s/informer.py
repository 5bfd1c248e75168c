"""List+watch informers with a local cache.

An :class:`Informer` lists a resource once, then watches from the list's resourceVersion. The list
is streamed where the API server can (a watch that first sends every object, :meth:`Informer.stream`),
else read in pages. Every
object change updates its :class:`Store` (keyed ``namespace/name`` or ``name``) and calls the
handler with ``(old, new)`` (``new`` is None on deletion). When a watch ends it resumes from the
last resourceVersion seen (bookmarks included); a ``410 Gone`` or any other error leads to a
fresh list, which is diffed against the cache so deletions missed meanwhile still reach the
handler. Errors back off exponentially (1 s doubling to 30 s); a watch the API server throttles
(429) is resumed after the back-off without a new list, as client-go's reflector does.

A store may keep less than the whole object (a :data:`Transform`, as client-go's informer
``TransformFunc``): the fields its reader needs, or nothing at all for objects that do not concern
it. An object the transform drops is treated as absent: its arrival is no event, and a change that
makes a kept object irrelevant reaches the handler as a deletion. The transform runs as each list
page and each watch event is decoded, so a resource's whole JSON is never held at once.

An object that cannot be decoded (:mod:`dra_driver.k8s.quarantine`: a tenant's claim whose raw
parameters are not valid JSON text) is quarantined: the store keeps the last version of it that
decoded, or nothing, as if the undecodable change had not happened; the rest of the list and
watch goes on as usual. It is logged and handed to ``on_undecodable`` (the controller's metric
and Warning Event) once per version of it; a version that decodes, or its deletion, ends it.

The work queue their handlers feed is :mod:`dra_driver.k8s.workqueue`'s.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from dra_driver import logs, memory
from dra_driver.k8s.client import ApiError, KubeApi, Resource
from dra_driver.k8s.objects import Obj, key_of, resource_version
from dra_driver.k8s.quarantine import UNDECODABLE, Undecodable
from dra_driver.k8s.wire import Reduced

INITIAL_EVENTS_END = "k8s.io/initial-events-end"  # the bookmark that ends a streamed list
TRIM_EVERY = 1000  # watch events between two _trim calls (each costs well under a millisecond)

Handler = Callable[[Obj | None, Obj | None], None]
"""``handler(old, new)``: add (old None), update, delete (new None)."""

Transform = Callable[[Obj], Mapping[str, Any] | None]
"""What a store keeps of a decoded object: the object, a projection of it with ``metadata.name``,
``namespace`` and ``resourceVersion``, or None for an object the store does not track. It may
consume its argument (the decoded object is not used again)."""


class Store:
    """Thread-safe cache of one resource's objects, as ``transform`` keeps them."""

    def __init__(self, transform: Transform | None = None) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, Obj] = {}
        self.transform = transform

    def kept(self, obj: Obj) -> Obj | None:
        """``obj`` as this store keeps it (None: not tracked)."""
        # What a transform returns is kept as the plain dict it is (a view's declared shape is a dict).
        return obj if self.transform is None else cast(Obj | None, self.transform(obj))

    def get(self, key: str) -> Obj | None:
        with self._lock:
            return self._items.get(key)

    def values(self) -> list[Obj]:
        with self._lock:
            return list(self._items.values())

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._items)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def put(self, obj: Obj) -> Obj | None:
        """Keep ``obj`` (already as :meth:`kept` returned it); returns what it replaces."""
        with self._lock:
            k = key_of(obj)
            old = self._items.get(k)
            self._items[k] = obj
            return old

    def put_if_unchanged(self, obj: Obj, base_resource_version: str) -> bool:
        """Store the result of our own write unless the watch already delivered something newer.

        ``base_resource_version`` is the version the write was made against; when the cached
        object still has it, ours is newer; otherwise the informer has moved on and wins.
        """
        if not isinstance(obj.get("metadata"), dict):
            return False
        k = key_of(obj)
        new = self.kept(obj)
        with self._lock:
            cur = self._items.get(k)
            if cur is None or resource_version(cur) != base_resource_version:
                return False
            if new is None:
                del self._items[k]
            else:
                self._items[k] = new
            return True

    def delete(self, obj: Obj) -> Obj | None:
        with self._lock:
            return self._items.pop(key_of(obj), None)

    def replace(self, objs: Iterable[Obj]) -> tuple[list[tuple[Obj | None, Obj]], list[Obj]]:
        """Swap in a full list; returns ``(changed as (old, new), deleted)``."""
        new = {key_of(o): o for o in objs}
        with self._lock:
            old = self._items
            self._items = new
        changed: list[tuple[Obj | None, Obj]] = []
        for k, obj in new.items():
            before = old.get(k)
            if before is None or resource_version(before) != resource_version(obj):
                changed.append((before, obj))
        deleted = [o for k, o in old.items() if k not in new]
        return changed, deleted


def _initial_events_end(obj: Obj) -> bool:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return isinstance(annotations, dict) and annotations.get(INITIAL_EVENTS_END) == "true"


def _trim() -> None:
    """Hand the memory decoding freed back to the system, after each list and every
    :data:`TRIM_EVERY` watch events. Decoded objects are garbage once reduced, but glibc keeps
    freed memory in the arena that served it, so without this the controller's RSS grew with every
    pod it had listed and dropped, and with every new pod and the status updates that follow it
    (the figures: docs/scale.md#the-codes-figures)."""
    memory.trim()


class Informer:
    """List + watch one resource into a :class:`Store`, calling ``handler`` on every change."""

    def __init__(
        self,
        api: KubeApi,
        resource: Resource,
        handler: Handler | None = None,
        *,
        field_selector: str | None = None,
        transform: Transform | None = None,
        reduced: Reduced[Any] | None = None,
        watch_timeout: int = 300,
        max_backoff: float = 30.0,
        streaming: bool = True,
        on_undecodable: Callable[[Undecodable], None] | None = None,
        optional: bool = False,
    ) -> None:
        self.api = api
        self.resource = resource
        self.store = Store(transform)
        self.handler = handler
        self.field_selector = field_selector
        self.reduced = reduced
        """Objects may arrive as this schema reads them (see KubeApi.list); the transform and the
        handler then read no other field."""
        self.watch_timeout = watch_timeout
        self.max_backoff = max_backoff
        self.resource_version = ""
        self.streaming = streaming
        """Whether lists are streamed (:meth:`stream`); cleared once the API server refuses."""
        self.optional = optional
        """A resource the API server may not serve (a kind newer than the cluster): a list that
        finds no such resource (404) counts as an empty one, asked again after the longest back-off."""
        self.streamed: list[Obj] = []
        """What a streaming list in progress has received so far (empty otherwise), for a reader
        that starts work on it before the list ends: it may copy the list, never change it. A new
        list object means a new list started, or, once :attr:`synced` is set, that the list ended."""
        self.on_undecodable = on_undecodable
        self.undecodable: dict[str, Undecodable] = {}
        """The objects quarantined now, by store key."""
        self._need_list = True
        self._applied = 0  # watch events applied, for _trim
        self.synced = threading.Event()
        self.errors = 0
        self._log = logs.get("informer", resource=resource.plural)

    # -- one step at a time (what run() loops over; tests drive these directly)

    def relist(self) -> None:
        """List (a consistent read, in pages) and replace the store with what was listed."""
        transform = None if self.store.transform is None else self._decoded
        t0 = time.monotonic()
        result = self.api.list(self.resource, field_selector=self.field_selector, transform=transform,
                               reduced=self.reduced)
        # The store keeps each object as the dict it was decoded to (transforms edit it in place).
        self._listed(cast(list[Obj], result.items), result.resource_version, t0, streamed=False,
                     undecodable=result.undecodable)

    def stream(self, stop: threading.Event | None = None) -> None:
        """List by watching, then go on watching on the same connection until the server ends it
        (Kubernetes' streaming lists, as client-go's WatchListClient): the API server sends each
        object from its watch cache as an event of its own, at least as new as the last
        resourceVersion seen, instead of walking its cache again for every page of 500; and no
        page of thousands of objects is held decoded at once. Raises ApiError (a 4xx when the
        server cannot stream lists: :meth:`run` then lists instead)."""
        t0 = time.monotonic()
        items: list[Obj] = []
        bad: list[Undecodable] = []
        self.streamed = items
        listing = True
        for event in self.api.watch(
            self.resource, resource_version=self.resource_version, timeout_seconds=self.watch_timeout,
            field_selector=self.field_selector, reduced=self.reduced, send_initial_events=True,
        ):
            if stop is not None and stop.is_set():
                return
            if not listing:
                self.apply(event)
                continue
            obj = event.get("object")
            if not isinstance(obj, dict):
                continue
            if event.get("type") == "ADDED":
                kept = self._decoded(obj)
                if kept is not None:
                    items.append(kept)
            elif event.get("type") == UNDECODABLE:
                bad.append(event["undecodable"])
            elif event.get("type") == "BOOKMARK" and _initial_events_end(obj):
                self._listed(items, resource_version(obj), t0, streamed=True, undecodable=bad)
                self.streamed = []  # after synced is set: a reader seeing a new list knows which
                items, bad, listing = [], [], False
        if listing:
            raise ApiError(0, "IncompleteList", f"{self.resource.plural}: the watch ended before every object was sent")

    def _listed(self, items: list[Obj], version: str, t0: float, *, streamed: bool,
                undecodable: list[Undecodable]) -> None:
        self._log.info("listed", kept=len(items), seconds=round(time.monotonic() - t0, 3), resource_version=version,
                       streamed=streamed, undecodable=len(undecodable))
        quarantined = {key_of(u.view): u for u in undecodable}
        for key in quarantined:
            last = self.store.get(key)
            if last is not None:
                items.append(last)  # the last version that decoded stays: no deletion of what exists
        for key in set(self.undecodable) - set(quarantined):
            del self.undecodable[key]
        for u in quarantined.values():
            self._quarantine(u)
        changed, deleted = self.store.replace(items)
        self.resource_version = version
        self._need_list = False
        # What was just listed lives as long as the informer. Frozen, the cyclic garbage collector
        # no longer walks it at every full collection: listing 150,000 pods after 5,000 slices
        # otherwise spends most of its time there. Decoded JSON has no cycles, so refcounting
        # still frees whatever of it is dropped later.
        gc.freeze()
        _trim()
        for old, new in changed:
            self._notify(old, new)
        for obj in deleted:
            self._notify(obj, None)
        # Synced once the handlers have heard every listed object, as client-go's HasSynced: work
        # started on "synced" (the controller's inventory) sees what they counted. Set before, the
        # inventory built at start was older than the 7,000 slice notifications that followed, and
        # the first claim built it again, a whole inventory build in its way
        # (docs/scale.md#the-codes-figures).
        self.synced.set()

    def watch_once(self, stop: threading.Event | None = None) -> None:
        """Follow one watch connection until the server ends it. Raises ApiError (410 included)."""
        for event in self.api.watch(
            self.resource, resource_version=self.resource_version, timeout_seconds=self.watch_timeout,
            field_selector=self.field_selector, reduced=self.reduced,
        ):
            if stop is not None and stop.is_set():
                return
            self.apply(event)

    def apply(self, event: Obj) -> None:
        etype = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            return
        rv = resource_version(obj)
        if etype == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return
        if etype == UNDECODABLE:
            bad: Undecodable = event["undecodable"]
            if bad.event_type == "DELETED":
                self.undecodable.pop(key_of(obj), None)
                gone = self.store.delete(obj)
                if gone is not None:
                    self._notify(gone, None)
            else:
                self._quarantine(bad)  # the store keeps what it had
            if rv:
                self.resource_version = rv
            return
        if etype in ("ADDED", "MODIFIED", "DELETED"):
            self.undecodable.pop(key_of(obj), None)
        if etype in ("ADDED", "MODIFIED"):
            kept = self._decoded(obj)
            if kept is None:
                gone = self.store.delete(obj)
                if gone is not None:
                    self._notify(gone, None)
            else:
                old = self.store.put(kept)
                self._notify(old, kept)
        elif etype == "DELETED":
            old = self.store.delete(obj) or self._decoded(obj)
            if old is not None:  # else one the store never kept: no event
                self._notify(old, None)
        else:
            return
        if rv:
            self.resource_version = rv
        self._applied += 1
        if self._applied % TRIM_EVERY == 0:
            _trim()

    def _quarantine(self, bad: Undecodable) -> None:
        key = key_of(bad.view)
        known = self.undecodable.get(key)
        self.undecodable[key] = bad
        if known is not None and resource_version(known.view) == resource_version(bad.view):
            return  # told already (a re-list finds it again)
        self._log.warning("an object cannot be decoded; it is left out of the cache", object=bad.ref,
                          object_uid=bad.uid, resource_version=resource_version(bad.view), reason=bad.reason,
                          last_decoded_kept=self.store.get(key) is not None)
        if self.on_undecodable is not None:
            try:
                self.on_undecodable(bad)
            except Exception:  # last resort: reporting must not stop the informer
                self._log.exception("reporting an undecodable object failed")

    def _decoded(self, obj: Obj) -> Obj | None:
        """A decoded object as the store keeps it; watch events, like list items, may carry no
        kind and apiVersion."""
        obj.setdefault("apiVersion", self.resource.api_version)
        obj.setdefault("kind", self.resource.kind)
        return self.store.kept(obj)

    def _notify(self, old: Obj | None, new: Obj | None) -> None:
        if self.handler is None:
            return
        try:
            self.handler(old, new)
        except Exception:  # last resort: a handler bug must not stop the informer
            self._log.exception("informer handler failed")

    # -- the loop

    def run(self, stop: threading.Event) -> None:
        backoff = 1.0
        self._need_list = True
        while not stop.is_set():
            try:
                if self._need_list and self.streaming:
                    self.stream(stop)  # lists (clearing _need_list), then watches
                else:
                    if self._need_list:
                        self.relist()
                    self.watch_once(stop)
                backoff = 1.0
            except ApiError as exc:
                if self._need_list and self.streaming and (exc.bad_request or exc.forbidden or exc.not_found or exc.invalid):
                    self._log.info("the API server does not stream lists; listing in pages", status=exc.status,
                                   error=str(exc))
                    self.streaming = False
                    continue
                if self.optional and self._need_list and exc.not_found:
                    if not self.synced.is_set():
                        self._log.info("the API server does not serve this resource; taken as none for now",
                                       error=str(exc), retry_in=self.max_backoff)
                    self._listed([], "", time.monotonic(), streamed=False, undecodable=[])
                    self._need_list = True
                    stop.wait(self.max_backoff)
                    continue
                self.errors += 1
                if exc.throttled:
                    # The client already waited as the server asked; what it holds is still valid.
                    self._log.info("throttled by the API server", listing=self._need_list, retry_in=backoff)
                    stop.wait(backoff)
                    backoff = min(backoff * 2, self.max_backoff)
                    continue
                self._need_list = True
                if exc.gone:
                    self._log.info("watch expired, re-listing", resource_version=self.resource_version)
                    continue
                self._log.warning("list/watch failed", error=str(exc), retry_in=backoff)
                stop.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff)
            except Exception as exc:  # last resort: anything but an ApiError (a bug, a bad stream) re-lists after back-off
                self.errors += 1
                self._need_list = True
                self._log.exception("list/watch failed unexpectedly", error=str(exc), retry_in=backoff)
                stop.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff)

    def start(self, stop: threading.Event) -> threading.Thread:
        t = threading.Thread(target=self.run, args=(stop,), name=f"informer-{self.resource.plural}", daemon=True)
        t.start()
        return t

