"""GPU health: events from NVML (or an injected health file), mapped onto published devices.

The :class:`HealthMonitor` is the one place health turns into effects:

* the device health stream (``DRAResourceHealth``, v1 and v1alpha1) through :class:`HealthBoard.update`;
* a device taint ``gpu.dra-driver.io/unhealthy=<reason>:NoSchedule`` on every unhealthy device (under
  ``--api-profile nvidia`` NVIDIA's keys instead, :func:`health_taint`),
  re-published through :class:`dra_driver.node.publish.publisher.SlicePublisher`, so the scheduler stops placing
  new claims there. Recovery removes the taint; nothing restarts.

A GPU's health applies to every device carved from it (its MIG devices, its dynamic-MIG
partitions); an event about one MIG device applies to that device only.

Sources:

* **NVML** (:class:`NvmlEventSource`): ``nvmlDeviceRegisterEvents`` for critical XIDs and
  double-bit ECC errors on every GPU, read with ``nvmlEventSetWait_v2``. XIDs listed in
  ``--ignored-xids`` (application errors such as 13 or 31) are logged and do not change health.
  A critical XID or ECC error stays until the plugin restarts (recovering needs a GPU reset, which
  re-runs discovery anyway). ``NVML_ERROR_GPU_IS_LOST`` marks the lost GPU Unhealthy until it
  answers NVML again.
* **Health file** (:class:`HealthFileSource`, simulated GPUs, ``--health-file``): a JSON object
  keyed by device name (``gpu-0``, ``gpu-2-mig-1g.10gb-0``) or UUID::

      {"gpu-0": {"health": "Unhealthy", "reason": "XID 79", "xid": 79}}

  ``health`` is ``Healthy``, ``Unhealthy`` (the default) or ``Unknown``; ``reason`` (string),
  ``xid`` (integer) and ``lost`` (true: the GPU fell off the bus) are optional. An entry whose
  ``xid`` is an ignored XID stays Healthy, as on real hardware. Devices not named are Healthy, so
  ``{}`` or deleting the file is recovery. The file is re-read when its mtime/size/inode changes
  (polled every 0.5 s) and on SIGUSR1. A file that does not parse is logged and the previous state
  kept: a half-written file must not flap devices.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import signal
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, cast

from dra_driver import logs
from dra_driver.apiprofile import OWN, ApiProfile
from dra_driver.k8s.bodies import RawDevice
from dra_driver.node.describe.devices import AllocatableDevice
from dra_driver.node.discovery.nvml import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    count_error,
    error_code,
    nvml_error_type,
    nvml_text,
)
from dra_driver.node.metrics import METRICS, xid_label
from dra_driver.node.publish.healthboard import HEALTH_VALUES, HEALTHY, UNHEALTHY, UNKNOWN, HealthBoard

_log = logs.get("health")

TAINT_KEY = OWN.taints.unhealthy
TAINT_EFFECT = "NoSchedule"
POLL_INTERVAL = 0.5
MAX_HEALTH_FILE_BYTES = 1 << 20
_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class HealthReport:
    """The health of one GPU (or one MIG device) as a source sees it."""

    health: str = HEALTHY
    reason: str = ""
    xid: int | None = None
    lost: bool = False
    """The GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)."""


@dataclass(frozen=True)
class DeviceHealth:
    health: str
    message: str
    taint_value: str | None
    """Set when the device must carry a taint (its value; "" for a taint without one)."""
    xid: int | None = None
    taint_key: str = TAINT_KEY
    taint_effect: str = TAINT_EFFECT


NO_EFFECT = "None"
"""A taint that tells and keeps nothing off the device (NVIDIA's ``unmonitored``)."""


def health_taint(report: HealthReport, profile: ApiProfile = OWN) -> tuple[str, str, str] | None:
    """(key, value, effect) of the taint a device with ``report`` carries, or None.

    This driver's own profile: ``gpu.dra-driver.io/unhealthy=<reason>:NoSchedule`` on an Unhealthy
    device, nothing on an Unknown one. NVIDIA's: ``gpu.nvidia.com/gpu-lost:NoSchedule`` for a lost
    GPU, ``gpu.nvidia.com/xid=<XID>:NoSchedule`` for a critical XID (and, with the reason as its value,
    for any other failure: an ECC error, an injected one), ``gpu.nvidia.com/unmonitored`` (effect
    None) on an Unknown device."""
    keys = profile.taints
    if report.health == UNHEALTHY:
        if not profile.taints.by_event:
            return keys.unhealthy, taint_value(report.reason or "unhealthy"), TAINT_EFFECT
        if report.lost:
            return keys.gpu_lost, "", TAINT_EFFECT
        if report.xid is not None:
            return keys.xid, str(report.xid), TAINT_EFFECT
        return keys.unhealthy, taint_value(report.reason or "unhealthy"), TAINT_EFFECT
    if report.health == UNKNOWN and profile.taints.by_event:
        return keys.unmonitored, "", NO_EFFECT
    return None


@dataclass(frozen=True)
class HealthChange:
    """Devices whose health changed the same way at the same moment (a GPU and its MIG devices)."""

    devices: tuple[str, ...]
    health: str
    reason: str
    previous: str
    previous_reason: str
    xid: int | None
    taint_value: str | None
    taint_key: str = TAINT_KEY
    taint_effect: str = TAINT_EFFECT
    previous_taint_key: str = ""

    @property
    def recovered(self) -> bool:
        return self.health == HEALTHY

    def describe(self) -> str:
        """The Event note: which devices, what happened, what the scheduler now sees."""
        names = ", ".join(self.devices[:8]) + (f" and {len(self.devices) - 8} more" if len(self.devices) > 8 else "")
        which = f"{names} ({len(self.devices)} devices)" if len(self.devices) > 1 else names
        if self.recovered:
            after = f" after {self.previous_reason}" if self.previous_reason else ""
            return f"{which} healthy again{after}; taint {self.previous_taint_key or TAINT_KEY} removed"
        why = f": {self.reason}" if self.reason else ""
        taint = ""
        if self.taint_value is not None:
            shown = f"{self.taint_key}={self.taint_value}" if self.taint_value else self.taint_key
            taint = (f"; tainted {shown}:{self.taint_effect}, new claims go elsewhere" if self.taint_effect != NO_EFFECT
                     else f"; tainted {shown} (effect None: only told)")
        return f"{which} {self.health}{why}{taint}"


def health_changes(old: Mapping[str, DeviceHealth], new: Mapping[str, DeviceHealth]) -> list[HealthChange]:
    """What changed from ``old`` to ``new``, grouped; a device first seen Healthy is no change."""
    groups: dict[tuple[str, str, str, str, int | None, str | None, str, str, str], list[str]] = {}
    for name, state in sorted(new.items()):
        before = old.get(name) or DeviceHealth(HEALTHY, "", None)
        if (before.health, before.message) == (state.health, state.message):
            continue
        key = (state.health, state.message, before.health, before.message, state.xid, state.taint_value,
               state.taint_key, state.taint_effect, before.taint_key if before.taint_value is not None else "")
        groups.setdefault(key, []).append(name)
    return [HealthChange(tuple(names), *key) for key, names in groups.items()]


def device_counts(devices: Mapping[str, AllocatableDevice], health: Mapping[str, DeviceHealth]) -> dict[tuple[str, str], int]:
    """Published devices by (type, health): the ``devices`` gauge."""
    counts: dict[tuple[str, str], int] = {}
    for name, dev in devices.items():
        state = health.get(name)
        key = (dev.kind, state.health if state is not None else HEALTHY)
        counts[key] = counts.get(key, 0) + 1
    return counts


def publish_device_counts(devices: Mapping[str, AllocatableDevice], health: Mapping[str, DeviceHealth]) -> None:
    METRICS.set_devices(device_counts(devices, health), (d.kind for d in devices.values()), HEALTH_VALUES)


def taint_value(reason: str) -> str:
    """A device taint's value must be a label value (<= 63 of ``[A-Za-z0-9_.-]``, alphanumeric ends)."""
    value = _LABEL_VALUE_BAD.sub("-", reason.strip())[:63].strip("-_.")
    return value or "unhealthy"


def device_health(devices: Mapping[str, AllocatableDevice], reports: Mapping[str, HealthReport],
                  profile: ApiProfile = OWN) -> dict[str, DeviceHealth]:
    """Per published device: its own report (by name or MIG UUID) or else its GPU's, else Healthy;
    its taint in ``profile``'s keys (:func:`health_taint`)."""
    out: dict[str, DeviceHealth] = {}
    for name, dev in devices.items():
        report = reports.get(name)
        if report is None and dev.mig is not None:
            report = reports.get(dev.mig.uuid)
        if report is None:
            report = reports.get(dev.gpu.uuid) or reports.get(_gpu_device_name(devices, dev))
        if report is None:
            out[name] = DeviceHealth(HEALTHY, "", None)
            continue
        message = report.reason or ("" if report.health == HEALTHY else report.health.lower())
        taint = health_taint(report, profile)
        if taint is None:
            out[name] = DeviceHealth(report.health, message, None, report.xid)
        else:
            key, value, effect = taint
            out[name] = DeviceHealth(report.health, message, value, report.xid, key, effect)
    return out


def _gpu_device_name(devices: Mapping[str, AllocatableDevice], dev: AllocatableDevice) -> str:
    # The whole-GPU device of the same GPU, so that a health file entry for "gpu-2" covers its MIG devices.
    for name, other in devices.items():
        if other.gpu.uuid == dev.gpu.uuid and other.mig is None and other.mig_profile is None:
            return name
    return ""


def tainted_devices(devices_json: Sequence[RawDevice], health: Mapping[str, DeviceHealth],
                    profile: ApiProfile = OWN) -> list[RawDevice]:
    """Copies of the published device dicts with our taint on the unhealthy ones (others' taints kept)."""
    ours = set(profile.taints.all)
    out: list[RawDevice] = []
    for raw in devices_json:
        dev: dict[str, Any] = copy.deepcopy(dict(raw))
        taints = [t for t in dev.get("taints") or [] if t.get("key") not in ours]
        state = health.get(str(dev.get("name")))
        if state is not None and state.taint_value is not None:
            taint = {"key": state.taint_key, "effect": state.taint_effect}
            if state.taint_value:
                taint["value"] = state.taint_value
            taints.append(taint)
        if taints:
            dev["taints"] = taints
        else:
            dev.pop("taints", None)
        out.append(cast(RawDevice, dev))
    return out


class HealthMonitor:
    """Applies health reports: the health board always, the slices when the set of taints changes.

    ``publish`` receives the complete device list (with taints) to hand to ``SlicePublisher.update``;
    ``on_change`` hears every change (for Events). Sources call :meth:`set_reports` (complete
    picture, e.g. the health file) or :meth:`report` (one GPU, e.g. an NVML event); both are
    thread-safe.
    """

    def __init__(self, devices: Mapping[str, AllocatableDevice], devices_json: Sequence[RawDevice],
                 board: HealthBoard, publish: Callable[[list[RawDevice]], None],
                 on_change: Callable[[HealthChange], None] | None = None, profile: ApiProfile = OWN) -> None:
        self._profile = profile
        self._devices = dict(devices)
        self._devices_json = [cast(RawDevice, copy.deepcopy(dict(d))) for d in devices_json]
        self._board = board
        self._publish = publish
        self._on_change = on_change
        self._lock = threading.Lock()
        self._reports: dict[str, HealthReport] = {}
        self._taints: dict[str, str] = {}
        self._health: dict[str, DeviceHealth] = {}

    def knows(self, key: str) -> bool:
        """Whether ``key`` names a published device, its GPU or its MIG device."""
        devices = self._devices
        return key in devices or any(d.gpu.uuid == key or (d.mig is not None and d.mig.uuid == key)
                                     for d in devices.values())

    @property
    def reports(self) -> dict[str, HealthReport]:
        with self._lock:
            return dict(self._reports)

    def current(self) -> dict[str, DeviceHealth]:
        with self._lock:
            return dict(self._health)

    def set_reports(self, reports: Mapping[str, HealthReport]) -> None:
        with self._lock:
            self._reports = dict(reports)
            self._apply_locked()

    def report(self, key: str, report: HealthReport | None) -> None:
        """Set (or with None clear) the report for one device name or UUID."""
        with self._lock:
            if report is None:
                self._reports.pop(key, None)
            else:
                self._reports[key] = report
            self._apply_locked()

    def _apply_locked(self) -> None:
        health = device_health(self._devices, self._reports, self._profile)
        for name, state in health.items():
            old = self._health.get(name)
            if old is None or (old.health, old.message) != (state.health, state.message):
                self._board.update(name, state.health, state.message)
                if old is not None or state.health != HEALTHY:
                    _log.info("device health changed", device=name, health=state.health, reason=state.message)
        if self._on_change is not None:
            for change in health_changes(self._health, health):
                self._on_change(change)
        self._health = health
        publish_device_counts(self._devices, health)
        taints = {n: f"{s.taint_key}={s.taint_value}:{s.taint_effect}" for n, s in health.items()
                  if s.taint_value is not None}
        if taints != self._taints:
            self._taints = taints
            try:
                self._publish(tainted_devices(self._devices_json, health, self._profile))
            except Exception:  # last resort: the health board must not stop on a publish failure
                # The board already tells the kubelet; the next change retries the slices.
                self._taints = {}
                _log.exception("re-publishing devices with health taints failed")


# --- the health file (simulated GPUs) ---------------------------------------------------------


class HealthFileError(ValueError):
    """The health file does not parse; the message names the entry."""


def parse_health_file(text: str, ignored_xids: Iterable[int] = ()) -> dict[str, HealthReport]:
    """Decode the health file (format in the module docstring); raises :class:`HealthFileError`."""
    ignored = set(ignored_xids)
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise HealthFileError(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise HealthFileError(f"must be a JSON object keyed by device name or UUID, got {type(data).__name__}")
    out: dict[str, HealthReport] = {}
    for key, entry in data.items():
        if not isinstance(entry, dict):
            raise HealthFileError(f"{key}: must be an object, got {type(entry).__name__}")
        unknown = sorted(set(entry) - {"health", "reason", "xid", "lost"})
        if unknown:
            raise HealthFileError(f"{key}.{unknown[0]}: unknown field (allowed: health, reason, xid, lost)")
        lost = entry.get("lost", False)
        if not isinstance(lost, bool):
            raise HealthFileError(f"{key}.lost: must be true or false, got {type(lost).__name__}")
        health = entry.get("health", UNHEALTHY)
        if health not in HEALTH_VALUES:
            raise HealthFileError(f"{key}.health: must be one of {', '.join(HEALTH_VALUES)}, got {health!r}")
        reason = entry.get("reason", "")
        if not isinstance(reason, str):
            raise HealthFileError(f"{key}.reason: must be a string, got {type(reason).__name__}")
        xid = entry.get("xid")
        if xid is not None and (isinstance(xid, bool) or not isinstance(xid, int)):
            raise HealthFileError(f"{key}.xid: must be an integer, got {type(xid).__name__}")
        if not reason and xid is not None:
            reason = f"XID {xid}"
        if xid is not None and xid in ignored and health == UNHEALTHY:
            health, reason = HEALTHY, f"{reason} ignored (non-fatal XID)"
        out[key] = HealthReport(health, reason[:1024], xid, lost)
    return out


class HealthFileSource:
    """Re-reads ``path`` when it changes (mtime, size, inode polled) or on SIGUSR1."""

    def __init__(self, path: Path, monitor: HealthMonitor | None, ignored_xids: Iterable[int] = (),
                 poll_interval: float = POLL_INTERVAL) -> None:
        self.path = Path(path)
        self.monitor = monitor
        self.ignored_xids = tuple(ignored_xids)
        self.poll_interval = poll_interval
        self._stamp: tuple[int, int, int] | None = None
        self._kick = threading.Event()
        self._warned: set[str] = set()
        self.reads = 0
        self.errors = 0

    def install_signal(self) -> None:
        """SIGUSR1 forces a re-read (main thread only, as Python requires)."""
        def on_usr1(_signum: int, _frame: FrameType | None) -> None:
            self._kick.set()

        signal.signal(signal.SIGUSR1, on_usr1)

    def poll(self, force: bool = False) -> bool:
        """Re-read if the file changed (or ``force``); whether the reports were applied."""
        if self.monitor is None:
            return False  # not wired yet (the signal handler is installed first)
        try:
            st = os.stat(self.path)
            stamp: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = None
        except OSError as exc:
            self._warn_once(f"stat:{exc.errno}", "cannot read the health file", error=str(exc))
            return False
        if stamp == self._stamp and not force and self.reads:
            return False
        self._stamp = stamp
        if stamp is None:
            reports: dict[str, HealthReport] = {}
        else:
            try:
                with open(self.path, encoding="utf-8", errors="replace") as f:
                    text = f.read(MAX_HEALTH_FILE_BYTES + 1)
                if len(text) > MAX_HEALTH_FILE_BYTES:
                    raise HealthFileError(f"larger than {MAX_HEALTH_FILE_BYTES} bytes")
                reports = parse_health_file(text, self.ignored_xids)
            except (OSError, HealthFileError) as exc:
                self.errors += 1
                _log.error("health file ignored; keeping the previous health", path=str(self.path), error=str(exc))
                return False
        self.reads += 1
        before = self.monitor.reports
        for key, report in reports.items():
            if report.xid is not None and before.get(key) != report:
                METRICS.xid_events.labels(xid=xid_label(report.xid)).inc()
        for key in reports:
            if not self._known(key):
                self._warn_once(f"key:{key}", "health file names an unknown device", key=key)
        self.monitor.set_reports(reports)
        return True

    def _known(self, key: str) -> bool:
        return self.monitor is None or self.monitor.knows(key)

    def _warn_once(self, once: str, message: str, **kw: Any) -> None:
        if once not in self._warned:
            self._warned.add(once)
            _log.warning(message, path=str(self.path), **kw)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            forced = self._kick.is_set()
            self._kick.clear()
            try:
                self.poll(force=forced)
            except Exception:  # last resort: the watch loop outlives a bad read
                _log.exception("reading the health file failed")
            self._kick.wait(self.poll_interval)
            if stop.is_set():
                return

    def start(self, stop: threading.Event) -> threading.Thread:
        self.poll()
        thread = threading.Thread(target=self.run, args=(stop,), name="health-file", daemon=True)
        thread.start()
        return thread


# --- NVML events ------------------------------------------------------------------------------

class NvmlEventSource:
    """Waits on an NVML event set for critical XIDs and double-bit ECC errors of every GPU.

    NVML itself is thread-safe; the wait runs outside the backend's lock so MIG operations are not
    held up by it. Its clauses catch the module's own ``NVMLError`` (the module is injected:
    :func:`~dra_driver.node.discovery.nvml.nvml_error_type`) and read its code; anything else is a bug
    and propagates, caught only by :meth:`run`'s last resort (and, from :meth:`start`, by the
    plugin, which serves without health events).
    """

    def __init__(self, nv: ModuleType, gpu_uuids: Sequence[str], monitor: HealthMonitor,
                 ignored_xids: Iterable[int] = (), wait_ms: int = 5000) -> None:
        self.nv = nv
        self.failed = nvml_error_type(nv)
        self.gpu_uuids = list(gpu_uuids)
        self.monitor = monitor
        self.ignored_xids = frozenset(ignored_xids)
        self.wait_ms = wait_ms
        self.event_set: Any = None
        self.handles: dict[str, Any] = {}
        self.lost: set[str] = set()
        self.ignored_seen = 0

    @property
    def event_mask(self) -> int:
        nv = self.nv
        return int(getattr(nv, "nvmlEventTypeXidCriticalError", 0x8)) | int(getattr(nv, "nvmlEventTypeDoubleBitEccError", 0x2))

    def setup(self) -> None:
        """Create the event set and register every GPU; a GPU that is lost already is reported so."""
        nv = self.nv
        self.event_set = nv.nvmlEventSetCreate()
        for uuid in self.gpu_uuids:
            try:
                handle = nv.nvmlDeviceGetHandleByUUID(uuid)
                self.handles[uuid] = handle
                supported = int(self._supported(handle))
                mask = self.event_mask & supported
                if not mask:
                    _log.warning("GPU supports none of the health events; its health is not watched", gpu=uuid)
                    continue
                nv.nvmlDeviceRegisterEvents(handle, mask, self.event_set)
            except self.failed as exc:
                if error_code(exc) == NVML_ERROR_GPU_IS_LOST:
                    self._mark_lost(uuid)
                elif error_code(exc) == NVML_ERROR_NOT_SUPPORTED:
                    _log.warning("GPU does not support health events; its health is not watched", gpu=uuid)
                else:
                    count_error(nv.nvmlDeviceRegisterEvents)
                    _log.error("registering health events failed; GPU health not watched", gpu=uuid, error=str(exc))

    def _supported(self, handle: Any) -> int:
        fn = getattr(self.nv, "nvmlDeviceGetSupportedEventTypes", None)
        if fn is None:
            return self.event_mask
        try:
            return int(fn(handle))
        except self.failed:
            return self.event_mask

    def _uuid_of(self, handle: Any) -> str | None:
        for uuid, h in self.handles.items():
            if h == handle:
                return uuid
        try:
            return nvml_text(self.nv.nvmlDeviceGetUUID(handle))
        except self.failed:
            return None

    def _mark_lost(self, uuid: str) -> None:
        if uuid not in self.lost:
            self.lost.add(uuid)
            self.monitor.report(uuid, HealthReport(UNHEALTHY, "GPU is lost (fell off the bus)", lost=True))

    def check_lost(self) -> None:
        """Probe every GPU: lost ones turn Unhealthy, lost ones that answer again recover."""
        unidentified = True
        for uuid, handle in self.handles.items():
            try:
                self.nv.nvmlDeviceGetUUID(handle)
            except self.failed as exc:
                if error_code(exc) == NVML_ERROR_GPU_IS_LOST:
                    self._mark_lost(uuid)
                    unidentified = False
                continue
            if uuid in self.lost:
                self.lost.discard(uuid)
                if self.monitor.reports.get(uuid, HealthReport()).reason.startswith("GPU is lost"):
                    self.monitor.report(uuid, None)
                    _log.info("lost GPU answers NVML again", gpu=uuid)
        if unidentified and not self.lost:
            _log.warning("NVML reported a lost GPU but every GPU answers")

    def handle_event(self, data: Any) -> None:
        etype = int(getattr(data, "eventType", 0))
        xid = int(getattr(data, "eventData", 0))
        uuid = self._uuid_of(getattr(data, "device", None))
        if uuid is None:
            _log.warning("health event for an unknown GPU", event_type=etype, data=xid)
            return
        if etype & int(getattr(self.nv, "nvmlEventTypeXidCriticalError", 0x8)):
            METRICS.xid_events.labels(xid=xid_label(xid)).inc()
            if xid in self.ignored_xids:
                self.ignored_seen += 1
                _log.info("non-fatal XID ignored", gpu=uuid, xid=xid)
                return
            self.monitor.report(uuid, HealthReport(UNHEALTHY, f"XID {xid}", xid))
        elif etype & int(getattr(self.nv, "nvmlEventTypeDoubleBitEccError", 0x2)):
            self.monitor.report(uuid, HealthReport(UNHEALTHY, "double-bit ECC error"))

    def wait_once(self) -> None:
        """One ``nvmlEventSetWait_v2``: an event, a timeout (lost GPUs re-probed) or an error."""
        nv = self.nv
        wait = getattr(nv, "nvmlEventSetWait_v2", None) or nv.nvmlEventSetWait
        try:
            data = wait(self.event_set, self.wait_ms)
        except self.failed as exc:
            code = error_code(exc)
            if code == NVML_ERROR_TIMEOUT:
                if self.lost:
                    self.check_lost()
                return
            if code == NVML_ERROR_GPU_IS_LOST:
                self.check_lost()
                return
            count_error(wait)
            raise
        self.handle_event(data)

    def run(self, stop: threading.Event) -> None:
        errors = 0
        while not stop.is_set():
            try:
                self.wait_once()
                errors = 0
            except Exception as exc:  # last resort: the event loop outlives a failed wait, with backoff
                errors += 1
                _log.error("waiting for NVML health events failed", error=str(exc), consecutive=errors)
                stop.wait(min(30.0, 0.5 * 2**min(errors, 6)))
        with contextlib.suppress(self.failed):
            self.nv.nvmlEventSetFree(self.event_set)

    def start(self, stop: threading.Event) -> threading.Thread:
        self.setup()
        thread = threading.Thread(target=self.run, args=(stop,), name="nvml-health", daemon=True)
        thread.start()
        return thread
