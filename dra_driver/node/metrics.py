"""Prometheus metrics of the node plugin, served on ``--health-port`` next to ``/healthz``.

One registry per process (:data:`METRICS`): prepare, the checkpoint, CDI, slice publication, NVML
and health each record where they happen, so the numbers are the ones the kubelet and the API
server saw. Every name starts with ``dra_driver_plugin_``; label values come from small fixed sets
(results, device types, health values, NVML function names, XID codes), never claim UIDs or device
names, so the number of series stays bounded on any node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dra_driver.metrics import CONTENT_TYPE, Counter, Gauge, Histogram, Registry

PREFIX = "dra_driver_plugin"

# Prepare of one claim takes a few ms (checkpoint fsync, CDI write) up to seconds for a large batch
# or a dynamic MIG instance; the buckets cover both ends.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_WRITE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

MAX_XID = 1023
"""XIDs above this are counted as ``other``: NVIDIA's table ends far below it, and the health file
would otherwise let any integer become a label value."""

RESULTS = ("success", "error")


def xid_label(xid: int) -> str:
    return str(xid) if 0 <= xid <= MAX_XID else "other"


class PluginMetrics:
    """The node plugin's metrics, in their own registry (tests may create more)."""

    def __init__(self, registry: Registry | None = None) -> None:
        self.registry = registry or Registry()
        r = self.registry
        self.prepare_seconds = Histogram(
            f"{PREFIX}_prepare_duration_seconds",
            "Time from NodePrepareResources to a claim's answer, by result", ["result"],
            buckets=_LATENCY_BUCKETS, registry=r)
        self.unprepare_seconds = Histogram(
            f"{PREFIX}_unprepare_duration_seconds",
            "Time from NodeUnprepareResources to a claim's answer, by result", ["result"],
            buckets=_LATENCY_BUCKETS, registry=r)
        self.prepared_claims = Gauge(f"{PREFIX}_prepared_claims", "Claims prepared on this node (checkpointed)",
                                     registry=r)
        self.devices = Gauge(f"{PREFIX}_devices", "Devices published in the node's ResourceSlices, by type and health",
                             ["type", "health"], registry=r)
        self.checkpoint_write_seconds = Histogram(
            f"{PREFIX}_checkpoint_write_duration_seconds",
            "Time to save the checkpoint durably (a journal record and its fdatasync, or a snapshot)",
            buckets=_WRITE_BUCKETS, registry=r)
        self.cdi_spec_writes = Counter(f"{PREFIX}_cdi_spec_writes_total", "CDI spec file writes, by result", ["result"],
                                       registry=r)
        self.slice_writes = Counter(f"{PREFIX}_resourceslice_writes_total",
                                    "ResourceSlice writes to the API server, by operation", ["operation"], registry=r)
        self.slice_errors = Counter(f"{PREFIX}_resourceslice_publish_errors_total",
                                    "Failed attempts to publish the node's ResourceSlices", registry=r)
        self.devices_withheld = Gauge(
            f"{PREFIX}_devices_withheld",
            "Devices left out of the node's ResourceSlices because the API server would refuse them (or did), "
            "by the first rule each breaks", ["reason"], registry=r)
        self.not_publishing = Gauge(
            f"{PREFIX}_not_publishing",
            "1 while the plugin publishes no devices on purpose, by reason (backend_unavailable: no NVML; no_gpus; "
            "device_plugin: NVIDIA's device plugin serves this node's GPUs)", ["reason"], registry=r)
        self.nvml_errors = Counter(f"{PREFIX}_nvml_errors_total", "Failed NVML calls, by NVML function", ["function"],
                                   registry=r)
        self.xid_events = Counter(f"{PREFIX}_xid_events_total", "XID events seen, by XID code (ignored ones included)",
                                  ["xid"], registry=r)
        self.events_dropped = Counter(f"{PREFIX}_events_dropped_total",
                                      "Kubernetes Events that could not be written", registry=r)
        self.stale_claims_unprepared = Counter(
            f"{PREFIX}_stale_claims_unprepared_total",
            "Claims the stale-claim sweep unprepared (gone from the API server, past the grace period), by result",
            ["result"], registry=r)
        self.stale_claims_deferred = Counter(
            f"{PREFIX}_stale_claims_deferred_total",
            "Gone claims a sweep left to the next ones (over --max-stale-unprepares)", registry=r)
        self.undecodable_objects = Counter(
            f"{PREFIX}_undecodable_objects_total",
            "Versions of API objects that could not be decoded and were left out of the caches", ["resource"],
            registry=r)
        self.driver_edits_available = Gauge(
            f"{PREFIX}_driver_edits_available",
            "1 when the NVIDIA Container Toolkit found the driver and claims get its CDI edits; 0 when it did not "
            "(every prepare fails until the driver is there)", registry=r)
        self.driver_edits_generations = Counter(
            f"{PREFIX}_driver_edits_generations_total",
            "Runs of nvidia-ctk cdi generate (at start and when the driver changes), by result", ["result"], registry=r)
        self.build_info = Gauge(f"{PREFIX}_build_info", "Always 1; the labels say what runs",
                                ["version", "backend", "driver_version"], registry=r)
        for result in RESULTS:  # so that rate() has a series to start from before the first claim
            self.prepare_seconds.labels(result=result)
            self.unprepare_seconds.labels(result=result)
            self.cdi_spec_writes.labels(result=result)

    def observe_claims(self, histogram: Histogram, seconds: float, errors: Iterable[str | None]) -> None:
        """One observation per claim of a request: each waited ``seconds`` for its answer."""
        for error in errors:
            histogram.labels(result="success" if error is None else "error").observe(seconds)

    def set_devices(self, counts: Mapping[tuple[str, str], int], types: Iterable[str], healths: Iterable[str]) -> None:
        """Replace the device gauge: every (type, health) pair gets its count, 0 when absent."""
        for t in set(types):
            for h in set(healths):
                self.devices.labels(type=t, health=h).set(counts.get((t, h), 0))

    def page(self) -> tuple[bytes, str]:
        """``/metrics``: the body in the Prometheus text format and its content type."""
        return self.registry.exposition(), CONTENT_TYPE

    def value(self, name: str, labels: Mapping[str, str] | None = None) -> float:
        """A sample's current value, 0 when absent (tests); ``name`` without the prefix."""
        v = self.registry.get_sample_value(f"{PREFIX}_{name}", labels)
        return float(v) if v is not None else 0.0


METRICS = PluginMetrics()
"""The process's metrics: what ``/metrics`` serves."""
