"""Prometheus metrics of the controller and a small HTTP server for ``/metrics`` and ``/healthz``.

Every name starts with ``dra_driver_controller_`` (the node plugin's with ``dra_driver_plugin_``),
so one prefix finds all of the driver's series.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from dra_driver import __version__, httpserve
from dra_driver.allocator.devicestates import Census
from dra_driver.metrics import CONTENT_TYPE, Counter, Gauge, Histogram, Registry

PREFIX = "dra_driver_controller"


class ControllerMetrics:
    """The controller's metrics, in their own registry (tests create as many as they like)."""

    def __init__(self, registry: Registry | None = None) -> None:
        self.registry = registry or Registry()
        r = self.registry
        self.claims_explained = Counter(
            f"{PREFIX}_claims_explained_total", "Explanations written for pending ResourceClaims (verdict changes)", registry=r
        )
        self.claims_allocated = Counter(
            f"{PREFIX}_claims_allocated_total", "ResourceClaims allocated by the controller", registry=r
        )
        self.errors = Counter(f"{PREFIX}_errors_total", "Errors by kind", ["kind"], registry=r)
        self.undecodable_objects = Counter(
            f"{PREFIX}_undecodable_objects_total",
            "Versions of API objects that could not be decoded and were left out of the caches", ["resource"], registry=r
        )
        self.resolve_seconds = Histogram(
            f"{PREFIX}_resolve_duration_seconds",
            "Time to resolve one ResourceClaim against the inventory",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=r,
        )
        self.write_wait_seconds = Counter(
            f"{PREFIX}_write_wait_seconds_total",
            "Seconds writes waited for the write budget (--max-writes-per-second)", registry=r
        )
        self.is_leader = Gauge(f"{PREFIX}_leader", "1 while this replica holds the leader lease", registry=r)
        self.queue_depth = Gauge(f"{PREFIX}_workqueue_depth", "Claim keys waiting to be processed", registry=r)
        self.devices = Gauge(
            f"{PREFIX}_devices",
            "Devices of the driver by model and state (free, allocated, shared, tainted, blocked, and withheld: "
            "left out of the slices by their node plugin), as kubectl dra top counts them", ["model", "state"], registry=r)
        self.device_shares = Gauge(
            f"{PREFIX}_device_shares",
            "Shares of devices held by claims (results with a shareID or consumed capacity), by model",
            ["model"], registry=r)
        self.build_info = Gauge(f"{PREFIX}_build_info", "Always 1; the label says what runs", ["version"], registry=r)
        self.build_info.labels(version=__version__).set(1)

    def count_devices(self, census: Census) -> None:
        """The devices and shares as counted now; a model no longer there stops being exported."""
        self.devices.replace(({"model": model, "state": state}, n) for (model, state), n in census.devices.items())
        self.device_shares.replace(({"model": model}, n) for model, n in census.shares.items())

    def error(self, kind: str) -> None:
        self.errors.labels(kind=kind).inc()

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A sample's current value (tests and health checks); ``name`` without the prefix."""
        v = self.registry.get_sample_value(f"{PREFIX}_{name}", labels or {})
        return float(v) if v is not None else 0.0


class MetricsServer:
    """``/metrics`` (Prometheus text format) and ``/healthz`` (200 while ``healthy()``, else 503)."""

    def __init__(self, metrics: ControllerMetrics, port: int, healthy: Callable[[], bool], host: str = "") -> None:
        registry = metrics.registry

        def health() -> tuple[int, bytes, str]:
            ok = _safe(healthy)
            return (200 if ok else 503, b"ok\n" if ok else b"unhealthy\n", "text/plain")

        pages: dict[str, httpserve.Page] = {path: health for path in httpserve.HEALTH_PATHS}
        pages["/metrics"] = lambda: (200, registry.exposition(), CONTENT_TYPE)
        self._server = httpserve.bind(host, port, pages)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread = httpserve.serve_in_background(self._server, "metrics-http")

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _safe(fn: Callable[[], bool]) -> bool:
    try:
        return bool(fn())
    except Exception:  # last resort: a check that fails reads as not healthy, the page still answers
        return False
