"""The device health list that the kubelet streams (``DRAResourceHealth``): the three values, one
device's report, and the board that health sources update and the stream reads."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

HEALTHY, UNHEALTHY, UNKNOWN = "Healthy", "Unhealthy", "Unknown"
HEALTH_VALUES = (HEALTHY, UNHEALTHY, UNKNOWN)


@dataclass(frozen=True)
class DeviceHealthReport:
    device_name: str
    health: str = HEALTHY
    """``Healthy``, ``Unhealthy`` or ``Unknown``."""
    message: str = ""
    updated: float = 0.0
    """Unix time the health was determined; 0 = when sent."""


class HealthBoard:
    """Thread-safe device health list; the default source (every device Healthy until told otherwise).

    A health monitor calls :meth:`update`; the NodeWatchResources stream picks the change up at once.
    """

    def __init__(self, device_names: Iterable[str] = ()) -> None:
        self._cond = threading.Condition()
        self._version = 0
        now = time.time()
        self._reports: dict[str, DeviceHealthReport] = {n: DeviceHealthReport(n, HEALTHY, "", now) for n in device_names}

    def set_devices(self, device_names: Iterable[str]) -> None:
        """Track exactly these devices: new ones start Healthy, missing ones are dropped."""
        names = list(device_names)
        with self._cond:
            now = time.time()
            self._reports = {n: self._reports.get(n) or DeviceHealthReport(n, HEALTHY, "", now) for n in names}
            self._bump()

    def update(self, device_name: str, health: str, message: str = "") -> None:
        if health not in HEALTH_VALUES:
            raise ValueError(f"health must be one of {', '.join(HEALTH_VALUES)}, got {health!r}")
        with self._cond:
            old = self._reports.get(device_name)
            if old is not None and old.health == health and old.message == message:
                return
            self._reports[device_name] = DeviceHealthReport(device_name, health, message, time.time())
            self._bump()

    def _bump(self) -> None:
        self._version += 1
        self._cond.notify_all()

    def snapshot(self) -> tuple[int, list[DeviceHealthReport]]:
        with self._cond:
            return self._version, list(self._reports.values())

    def wait_for_change(self, version: int, timeout: float) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self._version != version, timeout=timeout)
            return self._version
