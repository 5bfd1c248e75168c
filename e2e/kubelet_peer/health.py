"""Latest device health reported by plugins, kept in ``<state-dir>/health.json``."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from .state import atomic_write

HEALTH_NAMES = {0: "Unknown", 1: "Healthy", 2: "Unhealthy"}


def health_entries(devices: Any) -> dict[str, dict[str, Any]]:
    """NodeWatchResourcesResponse.devices -> {"pool/device": {...}} (pure; takes proto messages)."""
    out: dict[str, dict[str, Any]] = {}
    for d in devices:
        key = f"{d.device.pool_name}/{d.device.device_name}"
        out[key] = {
            "health": HEALTH_NAMES.get(int(d.health), "Unknown"),
            "message": d.message,
            "last_updated": int(d.last_updated_time),
        }
    return out


class HealthStore:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._data: dict[str, dict[str, dict[str, Any]]] = {}

    def set_driver(self, driver: str, entries: dict[str, dict[str, Any]]) -> None:
        with self._lock:
            # Each message is meant to be the driver's complete device list.
            self._data[driver] = entries
            self._flush()

    def clear_driver(self, driver: str) -> None:
        with self._lock:
            if self._data.pop(driver, None) is not None:
                self._flush()

    def snapshot(self) -> dict[str, dict[str, dict[str, Any]]]:
        with self._lock:
            return {d: {k: dict(v) for k, v in e.items()} for d, e in self._data.items()}

    def _flush(self) -> None:
        atomic_write(self._path, json.dumps(self._data, indent=2, sort_keys=True))
