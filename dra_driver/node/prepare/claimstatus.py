"""``status.devices`` of prepared claims: what the node plugin tells the API about each device it prepared.

For every device of a prepared claim the plugin writes an ``AllocatedDeviceStatus`` (driver, pool,
device, shareID) with ``data`` (UUID, product name, memory; MIG profile, parent UUID and instance IDs
for a MIG device, whose UUID is the one created for the claim under dynamic MIG) and a ``Ready``
condition; at unprepare it removes them.

How it is written: a server-side apply of the ``status`` subresource with this driver's field
manager, so only entries this driver wrote are set or removed, and other drivers' entries on the
same claim are never touched. The apply names the claim's UID, so a claim replaced under the same
name is refused rather than written. Writing needs ``resourceclaims/status`` and, since 1.36, the
synthetic ``resourceclaims/driver`` permission for this driver (the Helm chart grants both).

When it is written (a decision): after the prepare is answered, from a background queue, once
the kubelet has made no prepare or unprepare for ``SETTLE`` seconds (or ``MAX_SETTLE`` seconds
after the first write became due, so that a steady stream of calls does not hold writes back for
good). The kubelet needs the prepare, the status is for people and monitoring, so a slow or failing
API server never delays or fails a prepare; the wait keeps the writes' CPU (JSON, TLS; they need
the GIL) from competing with the kubelet's calls, so a burst of prepares is answered before its
status writes start. A failed write is logged and retried with back-off (1 s
doubling to 5 min) until it succeeds or the claim is gone; only the latest wanted state of a claim
is written, so an unprepare that overtakes a pending write clears instead. At start-up every
prepared claim of the checkpoint is written again, which covers a write lost to a crash.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver import logs
from dra_driver.k8s.client import CLAIMS, ApiError, KubeApi
from dra_driver.k8s.quantity import format_canonical
from dra_driver.k8s.workqueue import WorkQueue
from dra_driver.node.describe.devices import AllocatableDevice, device_totals
from dra_driver.node.prepare.calls import ClaimRef, PrepareOutcome
from dra_driver.node.prepare.entries import ClaimEntry, ClaimState, DeviceKind, PreparedDevice
from dra_driver.node.prepare.state import DeviceState

_log = logs.get("claimstatus")

READY = "Ready"
APPLY = "application/apply-patch+yaml"
RETRY_BASE = 1.0
RETRY_MAX = 300.0
SETTLE = 0.5
MAX_SETTLE = 5.0


# --- what is written (pure) ------------------------------------------------------------------------


def device_data(prepared: PreparedDevice, device: AllocatableDevice | None) -> dict[str, Any]:
    """The ``data`` of one device: what a person or a monitoring agent needs to find it on the node."""
    data: dict[str, Any] = {"uuid": prepared.uuid or prepared.gpu_uuid}
    if device is not None:
        data["productName"] = device.gpu.product_name
        data["memory"] = format_canonical(device_totals(device)[0])
    if prepared.kind is DeviceKind.MIG:
        data["parentUUID"] = prepared.gpu_uuid
        inst = prepared.mig_instance
        if inst is not None:  # dynamic MIG: the instance created for this claim
            data.update(migProfile=inst.profile, migUUID=inst.uuid, gpuInstanceID=inst.gpu_instance_id,
                        computeInstanceID=inst.compute_instance_id, memory=format_canonical(inst.memory_bytes))
        elif device is not None and device.mig is not None:
            data.update(migProfile=device.mig.profile, gpuInstanceID=device.mig.gpu_instance_id,
                        computeInstanceID=device.mig.compute_instance_id)
    return data


def _seconds(rfc3339: str) -> str:
    """metav1.Time has whole seconds; the checkpoint keeps microseconds."""
    return rfc3339[:19] + "Z" if len(rfc3339) >= 19 else rfc3339


def device_statuses(driver: str, node: str, entry: ClaimEntry,
                    devices: Mapping[str, AllocatableDevice]) -> list[dict[str, Any]]:
    """One ``AllocatedDeviceStatus`` per prepared device of ``entry``."""
    out = []
    for dev in entry.devices:
        status: dict[str, Any] = {
            "driver": driver, "pool": dev.pool, "device": dev.device,
            "data": device_data(dev, devices.get(dev.device)),
            "conditions": [{
                "type": READY, "status": "True", "reason": "Prepared",
                "message": f"prepared on node {node}: {', '.join(dev.cdi_device_ids)}",
                "lastTransitionTime": _seconds(entry.updated),
            }],
        }
        if dev.share_id:
            status["shareID"] = dev.share_id
        out.append(status)
    return out


def apply_body(uid: str, namespace: str, name: str, statuses: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The apply configuration: this field manager's whole say on the claim's status. Empty
    ``statuses`` removes every entry it wrote before."""
    return {
        "apiVersion": CLAIMS.api_version, "kind": CLAIMS.kind,
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "status": {"devices": list(statuses)} if statuses else {},
    }


def gives_up(exc: ApiError) -> bool:
    """Whether a failed write is final: the claim is gone, replaced or deallocated. Anything else
    (no permission yet, API server away) is retried."""
    return exc.not_found or exc.gone or exc.invalid


# --- the writer (side effects) -------------------------------------------------------------------


@dataclass(frozen=True)
class _Wanted:
    namespace: str
    name: str
    statuses: tuple[dict[str, Any], ...]
    """Empty: clear."""


class ClaimStatusWriter:
    """Writes ``status.devices`` from a queue (see the module docstring for when and how). Thread-safe."""

    def __init__(self, api: KubeApi, driver_name: str, node_name: str, *, retry_base: float = RETRY_BASE,
                 retry_max: float = RETRY_MAX, settle: float = SETTLE, max_settle: float = MAX_SETTLE,
                 on_idle: Callable[[], object] | None = None) -> None:
        self._api = api
        self._on_idle = on_idle
        """Called when the writes of a burst are done (the kubelet has been quiet ``settle`` seconds)."""
        self.driver_name = driver_name
        self.node_name = node_name
        self.field_manager = driver_name
        self._queue: WorkQueue[str] = WorkQueue(base_delay=retry_base, max_delay=retry_max)
        self._settle = settle
        self._max_settle = max_settle
        self._last_call = time.monotonic()
        self._wanted: dict[str, _Wanted] = {}
        self._lock = threading.Lock()
        self._log = _log.bind(node=node_name)

    # -- what the prepare path calls (never blocks on the API)

    def prepared(self, entry: ClaimEntry, devices: Mapping[str, AllocatableDevice]) -> None:
        statuses = device_statuses(self.driver_name, self.node_name, entry, devices)
        self._want(entry.uid, _Wanted(entry.namespace, entry.name, tuple(statuses)))

    def unprepared(self, uid: str, namespace: str, name: str) -> None:
        self._want(uid, _Wanted(namespace, name, ()))

    def _want(self, uid: str, wanted: _Wanted) -> None:
        with self._lock:
            self._wanted[uid] = wanted
            self._last_call = time.monotonic()
        self._queue.add(uid)

    # -- the worker

    def start(self, stop: threading.Event) -> None:
        threading.Thread(target=self._run, args=(stop,), name="claim-status", daemon=True).start()
        threading.Thread(target=self._stop_on, args=(stop,), name="claim-status-stop", daemon=True).start()

    def _stop_on(self, stop: threading.Event) -> None:
        stop.wait()
        self._queue.shutdown()

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            uid = self._queue.get()
            if uid is None:
                return
            self._wait_for_quiet(stop)
            try:
                self.write(uid)
            finally:
                self._queue.done(uid)
            if self._on_idle is not None and not len(self._queue):
                self._on_idle()

    def _wait_for_quiet(self, stop: threading.Event) -> None:
        """Until no call was reported for ``settle`` seconds, ``max_settle`` seconds at most."""
        give_up = time.monotonic() + self._max_settle
        while True:
            with self._lock:
                quiet_at = self._last_call + self._settle
            left = min(quiet_at, give_up) - time.monotonic()
            if left <= 0 or stop.wait(left):
                return

    def pending(self) -> list[str]:
        """Claim UIDs with a write still to do (queued or waiting for a retry)."""
        with self._lock:
            return sorted(self._wanted)

    def write(self, uid: str) -> bool:
        """Write the wanted state of one claim now; True when nothing is left to do for it."""
        with self._lock:
            wanted = self._wanted.get(uid)
        if wanted is None:
            return True
        log = self._log.bind(claim_uid=uid, claim=f"{wanted.namespace}/{wanted.name}")
        what = "set" if wanted.statuses else "cleared"
        try:
            self._api.apply_status(CLAIMS, wanted.name, apply_body(uid, wanted.namespace, wanted.name, wanted.statuses),
                                   namespace=wanted.namespace, field_manager=self.field_manager)
        except ApiError as exc:
            if not gives_up(exc):
                delay = self._queue.add_rate_limited(uid)
                log.warning(f"could not write the claim's device status; retrying in {delay:.0f}s", error=str(exc),
                            action=what)
                return False
            log.info("claim's device status not written: the claim is gone or no longer allocated here",
                     error=str(exc), action=what)
        else:
            log.info(f"claim's device status {what}", devices=[s["device"] for s in wanted.statuses])
        self._queue.forget(uid)
        with self._lock:
            if self._wanted.get(uid) is wanted:  # a newer state was not asked for meanwhile
                del self._wanted[uid]
        return True


class ReportingHandler:
    """The kubelet's prepare/unprepare (:class:`dra_driver.node.kubelet.grpc.PrepareHandler`) of a
    :class:`DeviceState`, handing each success to the writer after the state has answered."""

    def __init__(self, state: DeviceState, writer: ClaimStatusWriter, devices: Mapping[str, AllocatableDevice]) -> None:
        self._state = state
        self._writer = writer
        self._devices = devices

    def report_recovered(self) -> None:
        """Every prepared claim of the checkpoint, again: a write may have been lost to a crash."""
        for entry in self._state.prepared_claims().values():
            if entry.state is ClaimState.PREPARE_COMPLETED and entry.devices:
                self._writer.prepared(entry, self._devices)

    def prepare(self, claims: Iterable[ClaimRef]) -> dict[str, PrepareOutcome]:
        outcomes = self._state.prepare(claims)
        entries = self._state.prepared_claims()
        for uid, outcome in outcomes.items():
            entry = entries.get(uid)
            if outcome.ok and entry is not None and entry.devices:
                self._writer.prepared(entry, self._devices)
        return outcomes

    def unprepare(self, claims: Iterable[ClaimRef]) -> dict[str, str | None]:
        refs = list(claims)
        errors = self._state.unprepare(refs)
        for ref in refs:
            if ref.uid in errors and errors[ref.uid] is None:
                self._writer.unprepared(ref.uid, ref.namespace, ref.name)
        return errors
