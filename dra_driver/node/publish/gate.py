"""Whether this node's devices may be published at all, and why not.

Three reasons to publish nothing while staying up (a plugin that exits would crash-loop on every
node the DaemonSet lands on): the GPU backend does not start (no NVML), it finds no GPUs, or the
node already serves its GPUs through NVIDIA's device plugin (``nvidia.com/gpu``, a shared
``nvidia.com/gpu.*`` such as time-slicing's ``nvidia.com/gpu.shared``, or ``nvidia.com/mig-*`` in
the Node's capacity or allocatable), where publishing them again would let
the same physical GPU go to a pod through the device plugin and to a claim through DRA. The last
one is looked at again while the plugin runs (a device plugin installed later closes the gate; one
removed opens it); ``--ignore-device-plugin`` skips it for a node being moved from one to the other.

:class:`PublishGate` holds the devices to publish and hands the publisher either those or nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.k8s.bodies import CounterSet, RawDevice

DEVICE_PLUGIN_RESOURCE = "nvidia.com/gpu"
DEVICE_PLUGIN_PREFIXES = ("nvidia.com/gpu.", "nvidia.com/mig-")
"""The device plugin's renamed GPUs (``renameByDefault`` makes ``nvidia.com/gpu.shared``) and its MIG
devices (``mixed`` strategy). Not every ``nvidia.com/`` name: NVIDIA's network operator advertises
RDMA and SR-IOV devices there, which are not GPUs."""

BACKEND_UNAVAILABLE = "backend_unavailable"
NO_GPUS = "no_gpus"
DEVICE_PLUGIN = "device_plugin"
REASONS = (BACKEND_UNAVAILABLE, NO_GPUS, DEVICE_PLUGIN)
"""The ``reason`` label of ``dra_driver_plugin_not_publishing``."""


@dataclass(frozen=True)
class Closed:
    """Why nothing is published: ``reason`` (one of :data:`REASONS`) and a sentence for people."""

    reason: str
    message: str


def _nonzero(quantity: object) -> bool:
    # A device plugin that went away leaves its resource at 0 until the kubelet restarts.
    return str(quantity).strip() not in ("", "0")


def is_device_plugin_gpu(name: str) -> bool:
    """Whether a Node's resource ``name`` is one the device plugin serves GPUs (or their MIG devices) as."""
    return name == DEVICE_PLUGIN_RESOURCE or name.startswith(DEVICE_PLUGIN_PREFIXES)


def device_plugin_resources(node: Mapping[str, Any]) -> list[str]:
    """The device plugin's GPU resources a Node advertises (non-zero, in capacity or allocatable)."""
    status = node.get("status") or {}
    found: set[str] = set()
    for field in ("capacity", "allocatable"):
        for name, quantity in (status.get(field) or {}).items():
            if is_device_plugin_gpu(name) and _nonzero(quantity):
                found.add(name)
    return sorted(found)


def device_plugin_closed(node: Mapping[str, Any], node_name: str) -> Closed | None:
    """Closed when the Node shows NVIDIA's device plugin serving its GPUs."""
    resources = device_plugin_resources(node)
    if not resources:
        return None
    return Closed(DEVICE_PLUGIN,
                  f"node {node_name} advertises {', '.join(resources)} (NVIDIA's device plugin serves its GPUs): "
                  "publishing nothing, so that no GPU is handed out twice; remove the device plugin from this node, "
                  "or set --ignore-device-plugin (chart: kubeletPlugin.ignoreDevicePlugin) while moving it to DRA")


def backend_closed(error: str) -> Closed:
    return Closed(BACKEND_UNAVAILABLE,
                  f"NVML is not available: {error}; publishing nothing (the plugin stays up; is this a GPU node "
                  "with the NVIDIA driver under nvml.driverRoot?)")


def no_gpus_closed(backend: str) -> Closed:
    return Closed(NO_GPUS, f"the {backend} backend found no GPUs on this node; publishing nothing")


class PublishGate:
    """Passes the latest devices to ``publish`` while open, and none while closed.

    ``on_change(old, new)`` hears every change of state (None is open), after ``publish`` had the
    new content, so what it says is what the node publishes.
    """

    def __init__(self, publish: Callable[[Sequence[RawDevice], Sequence[CounterSet]], None],
                 on_change: Callable[[Closed | None, Closed | None], None]) -> None:
        self._publish = publish
        self._on_change = on_change
        self._lock = threading.Lock()
        self._devices: list[RawDevice] = []
        self._counters: list[CounterSet] = []
        self._closed: Closed | None = None
        self._decided = False

    @property
    def closed(self) -> Closed | None:
        with self._lock:
            return self._closed

    def update(self, devices: Sequence[RawDevice], counters: Sequence[CounterSet] = ()) -> None:
        """New content (a health taint, say); published only while the gate is open and decided."""
        with self._lock:
            self._devices, self._counters = list(devices), list(counters)
            if self._decided:
                self._send()

    def decide(self, closed: Closed | None) -> None:
        """Open (None) or close the gate; the first decision publishes, later ones only a change."""
        with self._lock:
            old, first = self._closed, not self._decided
            self._closed, self._decided = closed, True
            if not first and old == closed:
                return
            self._send()
        self._on_change(old, closed)

    def _send(self) -> None:
        if self._closed is None:
            self._publish(self._devices, self._counters)
        else:
            self._publish([], [])
