"""Kubernetes Events (``events.k8s.io/v1``) written in the background, repeats folded into one series:
the one way both programs, the node plugin and the controller, write Events (and :func:`node_events`
the one way Node Events are read back).

An Event's name is derived from everything that makes it the same occurrence (what it is about,
type, reason, action, note, reporter), so a repeat — in this process or in the next one after a
crash — lands on the same object: the first occurrence creates it, later ones raise
``series.count`` and ``series.lastObservedTime``. A crash loop therefore costs one Event, not one
per restart, and within a process repeats are written at most every ``min_interval`` seconds.

The recorder needs only ``create`` and ``patch`` on events: when a new process finds the Event
already there, an empty merge patch returns it (a read without the ``get`` verb), and the count is
written with its resourceVersion as precondition.

Events are best effort: a failure is retried a few times, then counted through ``on_drop`` and
forgotten; nothing here ever blocks or fails the caller. A write the caller's own client refused
because its write budget is spent (``ApiError.throttled``) is not retried: it is counted through
``on_throttled`` and forgotten quietly, since retrying would only spend budget the claims need.

An Event recorded with ``wanted`` is the one place a person will read something (a pod's, where
``kubectl describe pod`` shows why it waits): it is never shed under load, and one the write budget
has no token for waits for the budget instead of being dropped; it goes out once the writes ahead
of it are done, as long as ``wanted()`` still holds then (a pod that stopped waiting, or a verdict
since replaced, is not written at all).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from dra_driver import logs
from dra_driver.k8s.bodies import RawBody
from dra_driver.k8s.client import EVENTS, ApiError, KubeApi, ListResult, Resource
from dra_driver.k8s.fields import micro_time, one_line
from dra_driver.k8s.objects import Obj, as_str, meta

_log = logs.get("events")

MAX_NOTE_BYTES = 1024
"""The API server refuses longer notes."""
MAX_FIELD = 128
"""reportingInstance, action and reason: at most 128 characters each."""
ATTEMPTS = 4
MAX_SERIES = 1024
"""Series remembered for folding; the oldest quiet one is forgotten beyond this."""
BUDGET_RETRY_SECONDS = 1.0
"""How long Events that must go out wait after the write budget had no token for one."""
SHED_LOG_SECONDS = 60.0
"""Events shed under load (more pending than :data:`MAX_SERIES`) are counted, and said in one
warning at most this often: a burst of 10,000 pending claims must not log 9,000 lines."""


@dataclass(frozen=True)
class ObjectRef:
    """What an Event is about (``regarding``)."""

    api_version: str
    kind: str
    name: str
    uid: str = ""
    namespace: str = ""
    resource_version: str = ""
    """The version the reporter saw; not part of what makes two occurrences the same."""

    def as_dict(self) -> dict[str, str]:
        out = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.uid:
            out["uid"] = self.uid
        if self.namespace:
            out["namespace"] = self.namespace
        if self.resource_version:
            out["resourceVersion"] = self.resource_version
        return out


def object_ref(obj: Mapping[str, Any], resource: Resource | None = None) -> ObjectRef:
    """An API object as ``regarding``; ``resource`` supplies kind and apiVersion where the object
    has none (list items and informer caches may lack them)."""
    m = meta(obj)
    return ObjectRef(
        api_version=as_str(obj.get("apiVersion")) or (resource.api_version if resource else ""),
        kind=as_str(obj.get("kind")) or (resource.kind if resource else ""),
        name=str(m.get("name", "object")),
        uid=as_str(m.get("uid")) or "",
        namespace=as_str(m.get("namespace")) or "",
        resource_version=as_str(m.get("resourceVersion")) or "",
    )


def node_ref(name: str) -> ObjectRef:
    """A Node, with the node name as UID as the kubelet does: ``kubectl describe node`` finds Events
    under either the Node's UID or its name, and this needs no read of the Node."""
    return ObjectRef("v1", "Node", name, uid=name)


@dataclass(frozen=True)
class Occurrence:
    type: str
    """``Normal`` or ``Warning``."""
    reason: str
    """UpperCamelCase, what happened (``CheckpointQuarantined``)."""
    action: str
    """What the reporter was doing (``Recover``, ``Prepare``)."""
    note: str


def fit_note(text: str) -> str:
    """One line, within the API server's 1024-byte limit (cut at a character boundary with …)."""
    return one_line(text, MAX_NOTE_BYTES, "…")


def event_name(regarding: ObjectRef, what: Occurrence, controller: str, instance: str) -> str:
    """Stable for one kind of occurrence: the folding key. ``<object name>.<16 hex>``, a valid name."""
    key = "\x00".join((regarding.api_version, regarding.kind, regarding.namespace, regarding.name, regarding.uid,
                       what.type, what.reason, what.action, fit_note(what.note), controller, instance))
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"{regarding.name[:200].rstrip('.-')}.{digest}"


def event_namespace(regarding: ObjectRef) -> str:
    """Events about cluster-scoped objects live in ``default``, as the kubelet's Node events do."""
    return regarding.namespace or "default"


class EventLister(Protocol):
    def list(self, res: Resource, *, namespace: str | None = None, field_selector: str | None = None,
             cached: bool = False) -> ListResult: ...


def node_events(api: EventLister, reason: str) -> list[RawBody]:
    """The Events of ``reason`` in ``default`` (where Node Events live), from the watch cache; a
    server that refuses the field selector (400) is asked for all of them, and they are picked
    here. ApiError as the list raised it otherwise."""
    try:
        return api.list(EVENTS, namespace="default", field_selector=f"reason={reason}", cached=True).items
    except ApiError as exc:
        if not exc.bad_request:
            raise
    return [e for e in api.list(EVENTS, namespace="default", cached=True).items if e.get("reason") == reason]


def event_body(regarding: ObjectRef, what: Occurrence, *, controller: str, instance: str, now: datetime,
               count: int = 1) -> Obj:
    body: Obj = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": event_name(regarding, what, controller, instance), "namespace": event_namespace(regarding)},
        "eventTime": micro_time(now),
        "reportingController": controller,
        "reportingInstance": instance[:MAX_FIELD],
        "action": what.action[:MAX_FIELD],
        "reason": what.reason[:MAX_FIELD],
        "type": what.type,
        "note": fit_note(what.note),
        "regarding": regarding.as_dict(),
    }
    if count > 1:
        body["series"] = {"count": count, "lastObservedTime": micro_time(now)}
    return body


def series_count(event: Obj) -> int:
    """How many occurrences a stored Event stands for."""
    series = event.get("series")
    count = series.get("count") if isinstance(series, dict) else None
    return count if isinstance(count, int) and count > 1 else 1


class _Expired(Exception):
    """The Event of a series is gone from the API server."""


@dataclass
class _Series:
    regarding: ObjectRef
    what: Occurrence
    occurrences: int
    """Everything known to have happened, other processes' occurrences included once adopted."""
    written: int = 0
    """What the stored Event says; 0 while it has not been created by this process."""
    last_write: float = 0.0
    failures: int = 0
    wanted: Callable[[], bool] | None = None
    """Set for an Event that must go out while this holds (:meth:`EventRecorder.record`)."""


class EventRecorder:
    """Writes Events from a background thread; :meth:`record` never blocks and never raises."""

    def __init__(self, api: KubeApi, controller: str, instance: str, *, min_interval: float = 10.0,
                 on_drop: Callable[[], None] | None = None, on_throttled: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.controller = controller
        self.instance = instance
        self.min_interval = min_interval
        self._on_drop = on_drop
        self._on_throttled = on_throttled
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._series: dict[tuple[str, str], _Series] = {}
        self._dirty: set[tuple[str, str]] = set()
        self._quiet: dict[tuple[str, str], None] = {}
        """The series written and not due again, in the order they went quiet: the first is the one
        to forget. A scan of the series for it instead was a visible share of the controller's time
        in a backlog, where nearly all :data:`MAX_SERIES` series wait to be written (docs/scale.md,
        the third round)."""
        self._sheddable: dict[tuple[str, str], None] = {}
        """The pending series recorded without ``wanted``, oldest first: the ones shed under load.
        Those with ``wanted`` are neither shed nor counted against :data:`MAX_SERIES`; they are
        bounded by what the caller wants told (a pod each, while it waits)."""
        self._budget_back = 0.0
        """Before this (the clock's time) the write budget had no token: Events that must go out wait."""
        self._shed_since = 0
        self._shed_said: float | None = None

    def record(self, regarding: ObjectRef, what: Occurrence, *, wanted: Callable[[], bool] | None = None) -> None:
        """One occurrence. With ``wanted``, an Event that must go out while ``wanted()`` holds (the
        module's docstring); it is called from the writer's thread, outside the recorder's lock."""
        key = (event_namespace(regarding), event_name(regarding, what, self.controller, self.instance))
        with self._lock:
            # Moved to the end: the series stay in the order of their last occurrence, so the
            # quietest is found from the front, not by a scan of all of them for every new Event
            # (a backlog spent a visible share of the controller's time there).
            series = self._series.pop(key, None)
            if series is None:
                self._forget_quiet_locked()
                series = _Series(regarding, what, occurrences=0)
            self._series[key] = series
            series.wanted = wanted
            series.occurrences += 1
            self._pending_locked(key)
        self._wake.set()

    def _forget_quiet_locked(self) -> None:
        while len(self._quiet) + len(self._sheddable) >= MAX_SERIES:
            oldest = next(iter(self._quiet), None)
            if oldest is None:
                # Everything else is waiting to be written: shed the oldest that may be.
                oldest = next(iter(self._sheddable))
                self._dirty.discard(oldest)
                self._sheddable.pop(oldest)
                self._shed(self._series[oldest])
            self._quiet.pop(oldest, None)
            del self._series[oldest]

    def _pending_locked(self, key: tuple[str, str]) -> None:
        series = self._series.get(key)
        if series is not None:
            self._dirty.add(key)
            self._quiet.pop(key, None)
            self._sheddable.pop(key, None)
            if series.wanted is None:
                self._sheddable[key] = None

    def _quiet_locked(self, key: tuple[str, str]) -> None:
        if key in self._series and key not in self._dirty:
            self._sheddable.pop(key, None)
            self._quiet[key] = None

    # -- the writer

    def flush(self, timeout: float) -> bool:
        """Write everything pending now (ignoring ``min_interval``); whether it finished in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.write_due(force=True) is None:
                return True
            time.sleep(0.05)
        return False

    def write_due(self, force: bool = False) -> float | None:
        """Write the series that are due; seconds until the next one is due, None when none is pending."""
        now = self._clock()
        with self._lock:
            # In the order they occurred, so they go quiet (and are forgotten) in that order too.
            due = [(k, s.wanted is not None) for k, s in self._series.items()
                   if k in self._dirty and (force or self._due_at(s) <= now)]
        budget_spent = False
        for key, waits in due:
            # Once the budget is spent the Events that wait for it wait; the others are tried (and
            # dropped without a token) as before.
            if not (budget_spent and waits) and not self._write(key):
                budget_spent = True
        with self._lock:
            if not self._dirty:
                return None
            return max(0.0, min(self._due_at(self._series[k]) for k in self._dirty) - self._clock())

    def _due_at(self, series: _Series) -> float:
        waited = self._budget_back if series.wanted is not None else 0.0
        if series.written == 0 and series.failures == 0:
            return waited  # a new Event goes out at once, or once the budget is back
        backoff = min(30.0, 0.5 * 2 ** series.failures) if series.failures else 0.0
        return max(waited, series.last_write + max(self.min_interval if series.written else 0.0, backoff))

    def _write(self, key: tuple[str, str]) -> bool:
        """Write one due series; False when it waits for the write budget (so do those after it)."""
        with self._lock:
            series = self._series.get(key)
            if series is None or key not in self._dirty:
                return True
            self._dirty.discard(key)
            self._sheddable.pop(key, None)
            want = series.occurrences
        if series.wanted is not None and not series.wanted():
            with self._lock:
                # Not told, and not to be: only what the stored Event already says stays counted.
                series.occurrences -= want - series.written
                self._quiet_locked(key)
            return True
        namespace, name = key
        log = _log.bind(event=name, namespace=namespace, reason=series.what.reason,
                        regarding=f"{series.regarding.kind}/{series.regarding.name}")
        try:
            written = self._store(namespace, name, series, want)
        except _Expired:
            # The API server keeps Events for an hour: a new one counts what the old one did not show.
            with self._lock:
                series.occurrences -= series.written
                series.written = 0
                self._pending_locked(key)
            return True
        except Exception as exc:  # last resort: a refused or failed write (or a bug) is a failure of this series
            series.failures += 1
            series.last_write = self._clock()
            if isinstance(exc, ApiError) and exc.throttled and series.wanted is not None:
                log.debug("Event waits for the write budget", error=str(exc))
                series.failures = 0
                with self._lock:
                    self._budget_back = self._clock() + BUDGET_RETRY_SECONDS
                    self._pending_locked(key)
                return False
            if isinstance(exc, ApiError) and exc.throttled and self._on_throttled is not None:
                log.debug("Event dropped: write budget spent", error=str(exc))
                self._on_throttled()
                series.failures = 0
                with self._lock:
                    self._quiet_locked(key)
                return True
            if series.failures >= ATTEMPTS:
                self._dropped(series, str(exc))
                series.failures = 0
                series.written = max(series.written, 1)  # do not re-create on the next occurrence
                with self._lock:
                    self._quiet_locked(key)
                return True
            log.warning("cannot write Event; will retry", error=str(exc), attempt=series.failures)
            with self._lock:
                self._pending_locked(key)
            return True
        with self._lock:
            series.occurrences += written - want  # adopting another process's count raises it
            series.written = written
            series.failures = 0
            series.last_write = self._clock()
            if series.occurrences > series.written:
                self._pending_locked(key)
            else:
                self._quiet_locked(key)
        return True

    def _store(self, namespace: str, name: str, series: _Series, want: int) -> int:
        """Make the stored Event say ``want`` occurrences (more when another process counted some
        already); returns what it says now."""
        now = datetime.now(UTC)
        if series.written == 0:
            body = event_body(series.regarding, series.what, controller=self.controller, instance=self.instance,
                              now=now, count=want)
            try:
                self.api.create(EVENTS, body, namespace=namespace)
                return want
            except ApiError as exc:
                if not exc.conflict:
                    raise
            return self._adopt(namespace, name, want, now)
        try:
            self.api.merge_patch(EVENTS, name, {"series": {"count": want, "lastObservedTime": micro_time(now)}},
                                 namespace=namespace)
            return want
        except ApiError as exc:
            if not exc.not_found:
                raise
        raise _Expired()

    def _adopt(self, namespace: str, name: str, new: int, now: datetime) -> int:
        """The Event exists (written by an earlier process): add ``new`` occurrences to its count."""
        last: ApiError | None = None
        for _ in range(3):
            current = self.api.merge_patch(EVENTS, name, {}, namespace=namespace)
            total = series_count(current) + new
            rv = str((current.get("metadata") or {}).get("resourceVersion") or "")
            patch: Obj = {"metadata": {"resourceVersion": rv},
                          "series": {"count": total, "lastObservedTime": micro_time(now)}}
            try:
                self.api.merge_patch(EVENTS, name, patch, namespace=namespace)
                return total
            except ApiError as exc:
                if not exc.conflict:
                    raise
                last = exc
        raise last or ApiError(409, "Conflict", f"event {namespace}/{name} kept changing")

    def _shed(self, series: _Series) -> None:
        """An occurrence given up to load, not to a fault: like an Event the write budget has no
        token for (counted the same way), and said in one warning a minute with the count."""
        _log.debug("Event dropped: too many pending", reason=series.what.reason,
                   regarding=f"{series.regarding.kind}/{series.regarding.name}")
        if self._on_throttled is not None:
            self._on_throttled()
        self._shed_since += 1
        now = self._clock()
        if self._shed_said is None or now - self._shed_said >= SHED_LOG_SECONDS:
            _log.warning("Events shed under load", dropped=self._shed_since, pending_limit=MAX_SERIES,
                         example=f"{series.what.reason} {series.regarding.kind}/{series.regarding.name}")
            self._shed_since, self._shed_said = 0, now

    def _dropped(self, series: _Series, why: str) -> None:
        _log.error("Event dropped", reason=series.what.reason, regarding=f"{series.regarding.kind}/{series.regarding.name}",
                   note=series.what.note[:200], error=why)
        if self._on_drop is not None:
            self._on_drop()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._wake.clear()
            try:
                wait = self.write_due()
            except Exception:  # last resort: a bug must not end Event writing for the process's lifetime
                _log.exception("writing Events failed")
                wait = 1.0
            self._wake.wait(timeout=1.0 if wait is None else min(max(wait, 0.05), 1.0))

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="events", daemon=True)
        thread.start()
        return thread
