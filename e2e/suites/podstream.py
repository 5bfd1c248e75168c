"""A stream of short GPU pods, as a busy node sees during an upgrade, and what the kubelet said about it.

:class:`PodStream` creates pods at a fixed rate, each with one claim from a ResourceClaimTemplate,
deletes each a few seconds after it runs (so others start while some are being deleted and the
node's GPUs are never all taken), and times every pod from its creation to the watch event that
shows it ``Running``. The same stream serves the real node (``e2e/suites/test_upgrade.py``) and kind
(``e2e/suites/kind/test_lifecycle.py``).

:func:`kubelet_failures` counts the kubelet's own log lines for a failed NodePrepareResources or
NodeUnprepareResources call (the strings of Kubernetes 1.36 and 1.37):

* ``pkg/kubelet/kuberuntime/kuberuntime_manager.go``: when PrepareDynamicResources fails the kubelet
  logs ``"Failed to prepare dynamic resources" err=...`` and records the pod Event
  ``FailedPrepareDynamicResources`` ("Failed to prepare dynamic resources: ..."); the pod stays
  pending and the next sync retries.
* ``pkg/kubelet/cm/dra/manager.go`` wraps a failed unprepare as ``unprepare dynamic resources: ...``
  and ``pkg/kubelet/pod_workers.go`` logs it as ``"Error syncing pod, skipping" err="unprepare dynamic
  resources: ..."``; no Event. The pod stays Terminating until a retry succeeds.

Both name the pod (``pod="<namespace>/<name>"``), so one namespace's failures are counted alone.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from dra_driver.k8s.client import PODS, ApiError, RestKubeApi
from e2e.bench.common import percentile

RESULTS = Path(__file__).resolve().parents[1] / "results" / "upgrade.json"
"""Where the upgrade tests (real node and kind) write their figures."""
PREPARE_FAILED = '"Failed to prepare dynamic resources" err='
UNPREPARE_FAILED = 'err="unprepare dynamic resources:'
PREPARE_FAILED_EVENT = "FailedPrepareDynamicResources"


@dataclass(frozen=True)
class StreamPlan:
    rate: float
    """Pods created per second."""
    seconds: float
    """How long pods are created."""
    linger: float = 2.0
    """Seconds a pod lives after it is seen Running; then it is deleted."""
    max_alive: int = 6
    """A pod is created only while fewer exist (terminating ones included): they never wait for a GPU,
    so a pod's start time is the node's and the scheduler's work, not a queue behind busy GPUs."""

    @property
    def pods(self) -> int:
        return round(self.rate * self.seconds)


@dataclass
class PodRecord:
    name: str
    created: float
    """``time.monotonic()`` just before the create call."""
    running: float | None = None
    """When the watch first showed it Running."""
    deleted: float | None = None
    gone: float | None = None
    """When the watch showed it deleted (the kubelet finished with it, unprepare included)."""
    node: str = ""
    phases: list[str] = field(default_factory=list)
    ended: bool = False
    """Failed, or finished before the test deleted it."""
    restarts: int = 0

    @property
    def start_seconds(self) -> float | None:
        return None if self.running is None else self.running - self.created


class PodStream:
    """``start()``, do what the stream must live through, ``finish()``."""

    def __init__(self, kubeconfig: str, ns: str, plan: StreamPlan, pod: Callable[[str], dict[str, Any]],
                 prefix: str = "s") -> None:
        self.ns, self.plan, self.pod, self.prefix = ns, plan, pod, prefix
        # One client per thread: each keeps its own connections.
        self._writer = RestKubeApi.from_kubeconfig(kubeconfig)
        self._watcher = RestKubeApi.from_kubeconfig(kubeconfig)
        self.records: dict[str, PodRecord] = {}
        self.errors: list[str] = []
        """API calls of the stream itself that failed (not the node's doing, but they void the run)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watching = threading.Event()
        self._threads = [threading.Thread(target=self._watch, name="stream-watch", daemon=True),
                         threading.Thread(target=self._drive, name="stream-drive", daemon=True)]
        self.started = 0.0
        self.last_created = 0.0
        self.held_back = 0
        """Pods created late because ``max_alive`` pods existed when they were due."""

    # -- running ----------------------------------------------------------------------------------
    def start(self) -> PodStream:
        self._threads[0].start()
        if not self._watching.wait(30):
            raise AssertionError("the pod watch did not start")
        self.started = time.monotonic()
        self._threads[1].start()
        return self

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def finish(self, timeout: float = 180) -> None:
        """Wait until every pod was created, ran, was deleted and is gone (or ``timeout`` after the
        last creation); then stop the threads. What did not happen shows in :meth:`summary`."""
        while True:
            deadline = max(self.started + self.plan.seconds, self.last_created) + timeout
            if time.monotonic() >= deadline:
                break
            with self._lock:
                done = len(self.records) == self.plan.pods and all(r.gone for r in self.records.values())
            if done:
                break
            time.sleep(0.5)
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)

    def cleanup(self) -> None:
        """Delete the pods still there (a failed run), so that they free their GPUs for the next test."""
        self._stop.set()
        for name in [r.name for r in self.records.values() if r.gone is None]:
            with contextlib.suppress(ApiError):
                self._writer.delete(PODS, name, namespace=self.ns)

    def _drive(self) -> None:
        """Create pods on schedule (held back while ``max_alive`` exist, then at most one interval
        late) and delete each ``linger`` seconds after it ran."""
        interval = 1.0 / self.plan.rate
        created = 0
        next_at = self.started
        held = False
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                alive = sum(r.gone is None for r in self.records.values())
            if created < self.plan.pods and now >= next_at:
                if alive >= self.plan.max_alive:
                    held = True
                else:
                    self.held_back += held
                    held = False
                    name = f"{self.prefix}{created:04d}"
                    with self._lock:
                        self.records[name] = PodRecord(name, time.monotonic())
                    self._call(partial(self._writer.create, PODS, self.pod(name), namespace=self.ns), f"create {name}")
                    created += 1
                    self.last_created = time.monotonic()
                    next_at = max(next_at, now - interval) + interval
                    continue
            with self._lock:
                due = [r for r in self.records.values()
                       if r.running is not None and r.deleted is None and now >= r.running + self.plan.linger]
                for r in due:
                    r.deleted = now
            for r in due:
                self._call(partial(self._writer.delete, PODS, r.name, namespace=self.ns), f"delete {r.name}")
            if created >= self.plan.pods and not due and all(r.deleted for r in self.records.values()):
                return
            time.sleep(0.02)

    def _call(self, fn: Callable[[], object], what: str) -> None:
        try:
            fn()
        except ApiError as exc:
            self.errors.append(f"{what}: {exc}")

    def _watch(self) -> None:
        # A list first: watching from its resourceVersion misses nothing between two watches.
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    listed = self._watcher.list(PODS, namespace=self.ns)
                    for obj in listed.items:
                        self._seen("ADDED", obj)
                    version = listed.resource_version
                    self._watching.set()
                for event in self._watcher.watch(PODS, resource_version=version, timeout_seconds=5,
                                                 field_selector=f"metadata.namespace={self.ns}"):
                    obj = event.get("object") or {}
                    version = str(obj.get("metadata", {}).get("resourceVersion") or version)
                    if event.get("type") != "BOOKMARK":
                        self._seen(str(event.get("type")), obj)
                    if self._stop.is_set():
                        return
            except ApiError as exc:
                if exc.status != 410:  # 410: too old, list again
                    self.errors.append(f"watch: {exc}")
                    time.sleep(0.5)
                version = ""

    def _seen(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.monotonic()
        with self._lock:
            record = self.records.get(str(obj.get("metadata", {}).get("name", "")))
            if record is None:
                return
            status = obj.get("status", {})
            phase = str(status.get("phase", ""))
            if not record.phases or record.phases[-1] != phase:
                record.phases.append(phase)
            # After its deletion a pod ends Succeeded (its container exits 0 on SIGTERM); before, or
            # Failed at any time, it did not live as it should.
            if phase == "Failed" or (phase == "Succeeded" and record.deleted is None):
                record.ended = True
            record.node = str(obj.get("spec", {}).get("nodeName") or record.node)
            record.restarts = max([record.restarts, *(int(c.get("restartCount", 0))
                                                      for c in status.get("containerStatuses") or [])])
            if phase == "Running" and record.running is None:
                record.running = now
            if kind == "DELETED":
                record.gone = now

    # -- what happened ----------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        with self._lock:
            records = list(self.records.values())
        starts = [s for r in records if (s := r.start_seconds) is not None]
        return {
            "rate_per_s": self.plan.rate, "seconds": self.plan.seconds, "linger_s": self.plan.linger,
            "max_alive": self.plan.max_alive, "created_over_s": round(self.last_created - self.started, 1),
            "held_back": self.held_back,
            "pods": len(records), "planned": self.plan.pods,
            "running": len(starts),
            "start_p50_ms": round(percentile(starts, 50) * 1000, 1) if starts else None,
            "start_p99_ms": round(percentile(starts, 99) * 1000, 1) if starts else None,
            "start_max_ms": round(max(starts) * 1000, 1) if starts else None,
            "slowest": [{"pod": r.name, "created_at_s": round(r.created - self.started, 1),
                         "start_ms": round((r.start_seconds or 0) * 1000, 1)}
                        for r in sorted(records, key=lambda r: -(r.start_seconds or 0))[:3]],
            "never_running": sorted(r.name for r in records if r.running is None),
            "not_gone": sorted(r.name for r in records if r.gone is None),
            "failed_phase": sorted(r.name for r in records if r.ended),
            "restarted": sorted(r.name for r in records if r.restarts),
            "stream_errors": self.errors[:10],
        }


def pod_problems(summary: dict[str, Any]) -> list[str]:
    """What went wrong with the pods of a :meth:`PodStream.summary`: each must have run, once, and be gone."""
    problems = [f"the test's own API calls failed: {e}" for e in summary["stream_errors"]]
    if not summary["pods"] == summary["planned"] == summary["running"]:
        problems.append(f"{summary['planned']} planned, {summary['pods']} created, {summary['running']} ran; "
                        f"never running: {summary['never_running']}")
    if summary["not_gone"]:
        problems.append(f"not deleted cleanly: {summary['not_gone']}")
    if summary["failed_phase"] or summary["restarted"]:
        problems.append(f"ended: {summary['failed_phase']}, restarted: {summary['restarted']}")
    return problems


def kubelet_failures(log: str, ns: str) -> dict[str, int]:
    """Failed NodePrepareResources / NodeUnprepareResources calls for pods of ``ns``, from the kubelet's log."""
    mine = [line for line in log.splitlines() if f'pod="{ns}/' in line]
    return {"prepare": sum(PREPARE_FAILED in line for line in mine),
            "unprepare": sum(UNPREPARE_FAILED in line for line in mine)}


def failure_lines(log: str, ns: str, limit: int = 5) -> list[str]:
    """The first failing lines themselves, for the report when a count is not zero."""
    mine = [line for line in log.splitlines() if f'pod="{ns}/' in line
            and (PREPARE_FAILED in line or UNPREPARE_FAILED in line)]
    return [line[:400] for line in mine[:limit]]


def warning_events(events: list[dict[str, Any]]) -> dict[str, int]:
    """Warning Events (core/v1 list items) by reason."""
    out: dict[str, int] = {}
    for e in events:
        if e.get("type") == "Warning":
            out[str(e.get("reason"))] = out.get(str(e.get("reason")), 0) + int(e.get("count") or 1)
    return out
