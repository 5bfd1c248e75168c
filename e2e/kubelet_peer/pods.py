"""The pod loop: prepare claims, inject CDI edits, mark pods Running, unprepare on termination.

Decisions live in the module-level pure functions; ``PodController`` wires them to the API
server (through a ``Kube``-like object) and to the plugins (through a ``Drivers`` object).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from . import cdi
from .containers import ClaimNamePending, all_containers, claims_to_prepare, container_cdi_ids, spec_env
from .kube import rfc3339
from .logutil import kv
from .model import ClaimRef, ClaimResult, DriverCallError, PreparedDevice
from .state import ClaimRecord, DriverState, PeerState
from .workqueue import KeyedLocks, WorkQueue

log = logging.getLogger("kubelet_peer.pods")

PREPARED_CONDITION = "e2e.dra-driver.io/Prepared"
CONTAINERS_ANNOTATION = "e2e.dra-driver.io/containers"
REASON_PREPARE_FAILED = "FailedPrepareDynamicResources"
REASON_UNPREPARE_FAILED = "FailedUnprepareDynamicResources"
REASON_CDI_FAILED = "CDIResolutionFailed"
BACKOFF_INITIAL_S = 1.0
BACKOFF_MAX_S = 10.0
RECONCILE_PERIOD_S = 5.0
WATCH_TIMEOUT_S = 30
TERMINAL_PHASES = ("Succeeded", "Failed")

Pod = Mapping[str, Any]


class Drivers(Protocol):
    def prepare(self, driver: str, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]: ...
    def unprepare(self, driver: str, claims: Sequence[ClaimRef]) -> dict[str, str]: ...


class KubeLike(Protocol):
    def list_pods(self, node: str) -> tuple[list[dict[str, Any]], str]: ...
    def watch_pods(self, node: str, resource_version: str, timeout_s: int) -> Any: ...
    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def patch_pod(self, namespace: str, name: str, body: dict[str, Any]) -> None: ...
    def patch_pod_status(self, namespace: str, name: str, body: dict[str, Any]) -> None: ...
    def delete_pod_now(self, namespace: str, name: str, uid: str) -> None: ...
    def create_pod_event(self, pod: dict[str, Any], reason: str, message: str, node: str, type_: str) -> None: ...


class Retry(Exception):
    """Sync did not finish; try again with backoff. ``reason`` set => show it on the pod."""

    def __init__(self, message: str, reason: str | None = None, condition: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.condition = condition


# --- pure helpers -----------------------------------------------------------------------------


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def pod_key(pod: Pod) -> str:
    return f"{meta(pod).get('namespace', '')}/{meta(pod).get('name', '')}"


def is_terminal(pod: Pod) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def is_started(pod: Pod) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and CONTAINERS_ANNOTATION in (meta(pod).get("annotations") or {})


def backoff_delay(failures: int) -> float:
    return float(min(BACKOFF_INITIAL_S * 2 ** max(failures - 1, 0), BACKOFF_MAX_S))


def claim_not_ready(claim: Mapping[str, Any], pod_uid: str) -> str | None:
    """Why the kubelet would refuse to prepare ``claim`` for the pod yet, or None."""
    name = f"{meta(claim).get('namespace', '')}/{meta(claim).get('name', '')}"
    status = claim.get("status") or {}
    if not status.get("allocation"):
        return f"ResourceClaim {name} is not allocated"
    if not any(r.get("uid") == pod_uid for r in status.get("reservedFor") or []):
        return f"ResourceClaim {name} is not reserved for pod (uid {pod_uid})"
    return None


def claim_drivers(claim: Mapping[str, Any]) -> list[str]:
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return list(dict.fromkeys(r["driver"] for r in results if r.get("driver")))


def check_prepare_response(
    driver: str, requested: Sequence[ClaimRef], response: Mapping[str, ClaimResult]
) -> tuple[dict[str, list[PreparedDevice]], list[str]]:
    """Split a NodePrepareResources response into prepared claims and error messages."""
    ok: dict[str, list[PreparedDevice]] = {}
    errors: list[str] = []
    for ref in requested:
        r = response.get(ref.uid)
        if r is None:
            errors.append(f"driver {driver} returned no result for ResourceClaim {ref.namespace}/{ref.name}")
        elif r.error:
            errors.append(f"driver {driver} failed to prepare ResourceClaim {ref.namespace}/{ref.name}: {r.error}")
        else:
            ok[ref.uid] = list(r.devices)
    unknown = sorted(set(response) - {r.uid for r in requested})
    if unknown:
        errors.append(f"driver {driver} returned results for unknown claim UIDs {unknown}")
    return ok, errors


def check_unprepare_response(
    driver: str, requested: Sequence[ClaimRef], response: Mapping[str, str]
) -> tuple[list[str], list[str]]:
    ok: list[str] = []
    errors: list[str] = []
    for ref in requested:
        if ref.uid not in response:
            errors.append(f"driver {driver} returned no result for ResourceClaim {ref.namespace}/{ref.name}")
        elif response[ref.uid]:
            errors.append(f"driver {driver} failed to unprepare ResourceClaim {ref.namespace}/{ref.name}: {response[ref.uid]}")
        else:
            ok.append(ref.uid)
    return ok, errors


def condition(type_: str, status: bool, now: datetime, reason: str = "", message: str = "") -> dict[str, Any]:
    c: dict[str, Any] = {"type": type_, "status": "True" if status else "False", "lastTransitionTime": rfc3339(now)}
    if reason:
        c["reason"] = reason
    if message:
        c["message"] = message
    return c


def prepare_failed_status_patch(message: str, now: datetime) -> dict[str, Any]:
    return {"status": {"conditions": [condition(PREPARED_CONDITION, False, now, REASON_PREPARE_FAILED, message)]}}


def cdi_failed_status_patch(message: str, now: datetime) -> dict[str, Any]:
    return {
        "status": {
            "phase": "Failed",
            "reason": REASON_CDI_FAILED,
            "message": message,
            "conditions": [
                condition(PREPARED_CONDITION, True, now, "Prepared"),
                condition("Ready", False, now, "PodFailed"),
                condition("ContainersReady", False, now, "PodFailed"),
            ],
        }
    }


def running_status_patch(pod: Pod, now: datetime) -> dict[str, Any]:
    ts = rfc3339(now)
    uid = meta(pod).get("uid", "")
    spec = pod.get("spec") or {}

    def base(c: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "name": c.get("name", ""),
            "image": c.get("image", ""),
            "imageID": c.get("image", ""),
            "containerID": f"e2e-peer://{uid}/{c.get('name', '')}",
            "restartCount": 0,
        }

    init_statuses = []
    for c in spec.get("initContainers") or []:
        s = base(c)
        if c.get("restartPolicy") == "Always":  # sidecar: keeps running
            s.update(ready=True, started=True, state={"running": {"startedAt": ts}})
        else:
            s.update(
                ready=True,
                started=False,
                state={"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": ts, "finishedAt": ts}},
            )
        init_statuses.append(s)
    statuses = []
    for c in spec.get("containers") or []:
        s = base(c)
        s.update(ready=True, started=True, state={"running": {"startedAt": ts}})
        statuses.append(s)
    status: dict[str, Any] = {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": "127.0.0.1",
        "podIPs": [{"ip": "127.0.0.1"}],
        "startTime": ts,
        "conditions": [
            condition(PREPARED_CONDITION, True, now, "Prepared"),
            condition("PodReadyToStartContainers", True, now),
            condition("PodScheduled", True, now),
            condition("Initialized", True, now),
            condition("ContainersReady", True, now),
            condition("Ready", True, now),
        ],
        "containerStatuses": statuses,
    }
    if init_statuses:
        status["initContainerStatuses"] = init_statuses
    return {"status": status}


def containers_annotation(results: Mapping[str, cdi.ContainerEditsResult]) -> str:
    return json.dumps({name: r.to_json() for name, r in results.items()}, sort_keys=True)


def resolve_containers(
    pod: Pod, devices_by_claim: Mapping[str, Sequence[PreparedDevice]], registry: cdi.Registry
) -> dict[str, cdi.ContainerEditsResult]:
    """Per-container CDI result; raises CDIError naming the container on failure."""
    ids_by_container = container_cdi_ids(pod, devices_by_claim)
    out: dict[str, cdi.ContainerEditsResult] = {}
    for c in all_containers(pod):
        name = c.get("name", "")
        base = cdi.ContainerEditsResult(env=spec_env(c))
        ids = ids_by_container.get(name, [])
        if ids:
            try:
                base = registry.resolve(ids, into=base)
            except cdi.CDIError as e:
                raise cdi.CDIError(f"container {name}: {e}") from e
        out[name] = base
    return out


# --- the controller ---------------------------------------------------------------------------


class PodController:
    def __init__(
        self,
        kube: KubeLike,
        drivers: Drivers,
        state: PeerState,
        node: str,
        cdi_dir: str | Path,
        *,
        workers: int = 8,
        reconcile_period: float = RECONCILE_PERIOD_S,
    ) -> None:
        self._kube = kube
        self._drivers = drivers
        self._state = state
        self._node = node
        self._cdi_dir = Path(cdi_dir)
        self._workers = workers
        self._reconcile_period = reconcile_period
        self._pods: dict[str, dict[str, Any]] = {}
        self._pods_lock = threading.Lock()
        self.synced = threading.Event()
        self._queue = WorkQueue()
        self._claim_locks = KeyedLocks()
        self._failures: dict[str, int] = {}
        self._last_report: dict[str, str] = {}
        self._poke = threading.Event()

    # --- cache ------------------------------------------------------------------------------

    def pod(self, uid: str) -> dict[str, Any] | None:
        with self._pods_lock:
            return self._pods.get(uid)

    def live_pod_uids(self, exclude: str = "") -> set[str]:
        """Pods on the node that may still use claims: present and not in a terminal phase."""
        with self._pods_lock:
            return {u for u, p in self._pods.items() if u != exclude and not is_terminal(p)}

    def replace_pods(self, pods: list[dict[str, Any]]) -> None:
        new = {meta(p).get("uid", ""): p for p in pods}
        with self._pods_lock:
            gone = set(self._pods) - set(new)
            self._pods = new
        for uid in new:
            self._queue.add(uid)
        if gone:
            self._poke.set()

    def apply_event(self, kind: str, pod: dict[str, Any]) -> None:
        uid = meta(pod).get("uid", "")
        with self._pods_lock:
            if kind == "DELETED":
                self._pods.pop(uid, None)
            else:
                self._pods[uid] = pod
        if kind == "DELETED":
            self._poke.set()
        else:
            self._queue.add(uid)

    # --- threads ----------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        threads = [threading.Thread(target=self._informer, args=(stop,), name="pod-informer", daemon=True)]
        threads += [
            threading.Thread(target=self._worker, args=(stop,), name=f"pod-worker-{i}", daemon=True) for i in range(self._workers)
        ]
        threads.append(threading.Thread(target=self._reconciler, args=(stop,), name="claim-reconciler", daemon=True))
        for t in threads:
            t.start()
        stop.wait()
        self._queue.shutdown()
        self._poke.set()
        for t in threads[1:]:
            t.join(timeout=5)

    def _informer(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                items, rv = self._kube.list_pods(self._node)
                self.replace_pods(items)
                self.synced.set()
                while not stop.is_set():
                    for ev in self._kube.watch_pods(self._node, rv, WATCH_TIMEOUT_S):
                        obj = ev.get("object") or {}
                        rv = str(meta(obj).get("resourceVersion") or rv)
                        if ev.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                            self.apply_event(ev["type"], obj)
                        if stop.is_set():
                            break
            except Exception as e:
                if getattr(e, "status", None) == 410:
                    log.info(kv("pod watch expired, re-listing"))
                    continue
                log.warning(kv("pod list/watch failed, re-listing", error=e))
                stop.wait(1.0)

    def _worker(self, stop: threading.Event) -> None:
        while not stop.is_set():
            uid = self._queue.get(timeout=1.0)
            if uid is None:
                continue
            try:
                self.process(uid)
            finally:
                self._queue.done(uid)

    def _reconciler(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._poke.wait(self._reconcile_period)
            self._poke.clear()
            if stop.is_set() or not self.synced.is_set():
                continue
            try:
                self.reconcile()
            except Exception:
                log.exception(kv("claim reconcile failed"))

    # --- per-pod processing -----------------------------------------------------------------

    def process(self, uid: str) -> None:
        """One sync of one pod, with retry scheduling and error reporting."""
        pod = self.pod(uid)
        if pod is None:
            return
        try:
            self.sync(pod)
        except Retry as r:
            self._retry(uid, pod, str(r), r)
        except DriverCallError as e:
            self._retry(uid, pod, str(e), Retry(str(e)))
        except Exception as e:
            log.exception(kv("pod sync error", pod=pod_key(pod)))
            self._retry(uid, pod, str(e), Retry(str(e)))
        else:
            self._failures.pop(uid, None)
            self._last_report.pop(uid, None)

    def _retry(self, uid: str, pod: dict[str, Any], message: str, r: Retry) -> None:
        n = self._failures[uid] = self._failures.get(uid, 0) + 1
        delay = backoff_delay(n)
        log.warning(kv("pod sync failed, will retry", pod=pod_key(pod), error=message, retry_in_s=delay, attempt=n))
        if r.reason and self._last_report.get(uid) != message:
            self._last_report[uid] = message
            ns, name = meta(pod).get("namespace", ""), meta(pod).get("name", "")
            try:
                if r.condition:
                    self._kube.patch_pod_status(ns, name, prepare_failed_status_patch(message, datetime.now(UTC)))
                self._kube.create_pod_event(pod, r.reason, message, self._node, "Warning")
            except Exception as e:
                log.warning(kv("cannot report failure on pod", pod=pod_key(pod), error=e))
        self._queue.add_after(uid, delay)

    def sync(self, pod: dict[str, Any]) -> None:
        if meta(pod).get("deletionTimestamp"):
            self.release(pod)
            m = meta(pod)
            self._kube.delete_pod_now(m.get("namespace", ""), m.get("name", ""), m.get("uid", ""))
            log.info(kv("pod terminated and deleted", pod=pod_key(pod)))
            return
        if is_terminal(pod):
            self.release(pod)
            return
        if is_started(pod):
            return
        self.start(pod)

    def start(self, pod: dict[str, Any]) -> None:
        m = meta(pod)
        ns, pod_uid = m.get("namespace", ""), m.get("uid", "")
        try:
            names = claims_to_prepare(pod)
        except ClaimNamePending as e:
            raise Retry(str(e), REASON_PREPARE_FAILED, condition=True) from e
        claims: dict[str, dict[str, Any]] = {}
        for name in names:
            claim = self._kube.get_claim(ns, name)
            if claim is None:
                raise Retry(f"ResourceClaim {ns}/{name} not found", REASON_PREPARE_FAILED, condition=True)
            why = claim_not_ready(claim, pod_uid)
            if why:
                raise Retry(why, REASON_PREPARE_FAILED, condition=True)
            claims[name] = claim

        devices_by_claim = self.prepare_claims(pod, claims)

        try:
            results = resolve_containers(pod, devices_by_claim, cdi.Registry.load(self._cdi_dir))
        except cdi.CDIError as e:
            msg = f"CDI resolution failed: {e}"
            log.error(kv("CDI resolution failed, pod fails", pod=pod_key(pod), error=e))
            self._kube.patch_pod_status(ns, m.get("name", ""), cdi_failed_status_patch(msg, datetime.now(UTC)))
            try:
                self._kube.create_pod_event(pod, REASON_CDI_FAILED, msg, self._node, "Warning")
            except Exception as ev_err:
                log.warning(kv("cannot record event", pod=pod_key(pod), error=ev_err))
            return

        self._kube.patch_pod(
            ns, m.get("name", ""), {"metadata": {"annotations": {CONTAINERS_ANNOTATION: containers_annotation(results)}}}
        )
        self._kube.patch_pod_status(ns, m.get("name", ""), running_status_patch(pod, datetime.now(UTC)))
        log.info(
            kv(
                "pod running",
                pod=pod_key(pod),
                claims=",".join(names) or None,
                cdi_devices=";".join(f"{c}={','.join(r.cdi_devices)}" for c, r in results.items() if r.cdi_devices) or None,
            )
        )

    def prepare_claims(self, pod: Pod, claims: Mapping[str, Mapping[str, Any]]) -> dict[str, list[PreparedDevice]]:
        """Record + prepare the pod's claims (once per node); returns devices by claim name."""
        pod_uid = meta(pod).get("uid", "")
        uids = {name: meta(c).get("uid", "") for name, c in claims.items()}
        with self._claim_locks.hold(list(uids.values())):
            todo: dict[str, list[ClaimRef]] = {}
            with self._state.lock:
                for name, claim in claims.items():
                    cm = meta(claim)
                    rec = self._state.claims.get(uids[name])
                    if rec is None:
                        rec = ClaimRecord(namespace=cm.get("namespace", ""), name=name, uid=uids[name])
                        self._state.claims[rec.uid] = rec
                    for d in claim_drivers(claim):
                        rec.drivers.setdefault(d, DriverState())
                    rec.pods.add(pod_uid)
                    for d, ds in rec.drivers.items():
                        if not ds.prepared:
                            todo.setdefault(d, []).append(rec.ref)
                # Checkpoint before calling the driver: a crash now cannot leak a prepared claim.
                self._state.save()
            errors: list[str] = []
            for driver, refs in todo.items():
                names = ",".join(f"{r.namespace}/{r.name}" for r in refs)
                log.info(kv("NodePrepareResources", pod=pod_key(pod), driver=driver, claim=names))
                try:
                    resp = self._drivers.prepare(driver, refs)
                except DriverCallError as e:
                    errors.append(f"driver {driver}: {e}")
                    continue
                ok, errs = check_prepare_response(driver, refs, resp)
                with self._state.lock:
                    for cuid, devices in ok.items():
                        ds = self._state.claims[cuid].drivers[driver]
                        ds.prepared, ds.devices = True, devices
                    self._state.save()
                for ref in refs:
                    if ref.uid in ok:
                        ids = [i for d in ok[ref.uid] for i in d.cdi_device_ids]
                        log.info(
                            kv(
                                "claim prepared",
                                pod=pod_key(pod),
                                claim=f"{ref.namespace}/{ref.name}",
                                driver=driver,
                                cdi_devices=",".join(ids),
                            )
                        )
                errors += errs
            if errors:
                raise Retry("; ".join(errors), REASON_PREPARE_FAILED, condition=True)
            with self._state.lock:
                return {name: self._state.claims[uid].devices() for name, uid in uids.items()}

    # --- unprepare --------------------------------------------------------------------------

    def release(self, pod: Pod) -> None:
        """Drop the pod's claim references; unprepare claims no live pod uses any more."""
        pod_uid = meta(pod).get("uid", "")
        recs = self._state.claims_of_pod(pod_uid)
        if not recs:
            return
        with self._claim_locks.hold([r.uid for r in recs]):
            live = self.live_pod_uids(exclude=pod_uid)
            idle: list[ClaimRecord] = []
            with self._state.lock:
                for r in recs:
                    rec = self._state.claims.get(r.uid)
                    if rec is None:
                        continue
                    if (rec.pods - {pod_uid}) & live:
                        rec.pods.discard(pod_uid)
                    else:
                        # Keep this pod's reference until unprepare succeeds, so that a retry
                        # after a failure still finds the claim.
                        rec.pods = {pod_uid}
                        idle.append(rec)
                self._state.save()
            if idle:
                try:
                    self.unprepare(idle, context=pod_key(pod))
                except Retry as r:
                    raise Retry(str(r), REASON_UNPREPARE_FAILED) from r

    def unprepare(self, recs: list[ClaimRecord], context: str | None = None) -> None:
        """Unprepare ``recs`` (no live users) with every driver involved; caller holds their claim locks.

        A record is forgotten once all its drivers succeeded; failed drivers stay for the retry.
        """
        by_driver: dict[str, list[ClaimRecord]] = {}
        for rec in recs:
            for d in rec.drivers:
                by_driver.setdefault(d, []).append(rec)
        errors: list[str] = []
        for driver, drecs in by_driver.items():
            refs = [r.ref for r in drecs]
            names = ",".join(f"{r.namespace}/{r.name}" for r in refs)
            log.info(kv("NodeUnprepareResources", pod=context, driver=driver, claim=names))
            try:
                resp = self._drivers.unprepare(driver, refs)
            except DriverCallError as e:
                errors.append(f"driver {driver}: {e}")
                continue
            ok, errs = check_unprepare_response(driver, refs, resp)
            errors += errs
            with self._state.lock:
                for rec in drecs:
                    if rec.uid in ok:
                        rec.drivers.pop(driver, None)
        with self._state.lock:
            for rec in recs:
                if not rec.drivers and self._state.claims.get(rec.uid) is rec:
                    del self._state.claims[rec.uid]
                    log.info(kv("claim unprepared", pod=context, claim=f"{rec.namespace}/{rec.name}", uid=rec.uid))
            self._state.save()
        if errors:
            raise Retry("; ".join(errors))

    def reconcile(self) -> None:
        """Unprepare claims whose pods vanished without a deletion we saw (force deletion etc.)."""
        with self._state.lock:
            uids = list(self._state.claims)
        for uid in uids:
            with self._claim_locks.hold([uid]):
                live = self.live_pod_uids()
                with self._state.lock:
                    rec = self._state.claims.get(uid)
                    if rec is None:
                        continue
                    if rec.pods - live:
                        rec.pods &= live
                        self._state.save()
                    if rec.pods:
                        continue
                try:
                    self.unprepare([rec], context=None)
                except Retry as r:
                    log.warning(
                        kv("unprepare of orphaned claim failed, will retry", claim=f"{rec.namespace}/{rec.name}", error=r)
                    )
