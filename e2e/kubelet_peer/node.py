"""Node liveness (status heartbeat + node Lease) and the kubelet's ResourceSlice wipes."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

from .kube import Kube, micro_time, rfc3339
from .logutil import kv

log = logging.getLogger("kubelet_peer.node")

HEARTBEAT_S = 10.0
LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_S = 40
RESOURCES = {"cpu": "16", "memory": "64Gi", "pods": "110"}
STARTUP_WIPE_MAX_S = 300.0


def node_status_patch(now: datetime, ready_since: datetime) -> dict[str, Any]:
    hb, since = rfc3339(now), rfc3339(ready_since)

    def cond(type_: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": hb,
            "lastTransitionTime": since,
        }

    return {
        "status": {
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                cond("Ready", "True", "KubeletReady", "kubelet is posting ready status (e2e kubelet peer)"),
            ],
            "capacity": dict(RESOURCES),
            "allocatable": dict(RESOURCES),
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "nodeInfo": {
                "kubeletVersion": "v0.0.0-e2e-peer",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "containerRuntimeVersion": "e2e-peer://0",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": "",
                "osImage": "",
            },
        }
    }


def lease_spec(node: str, now: datetime) -> dict[str, Any]:
    return {"holderIdentity": node, "leaseDurationSeconds": LEASE_DURATION_S, "renewTime": micro_time(now)}


def slice_selector(node: str, driver: str | None = None) -> str:
    sel = f"spec.nodeName={node}"
    return f"{sel},spec.driver={driver}" if driver else sel


class NodeHeartbeat:
    def __init__(self, kube: Kube, node: str, interval: float = HEARTBEAT_S) -> None:
        self._kube = kube
        self._node = node
        self._interval = interval
        self._ready_since = datetime.now(UTC)

    def ensure_node(self) -> None:
        if self._kube.get_node(self._node) is None:
            log.info(kv("node object missing, creating it"))
            self._kube.create_node(
                self._node, {"kubernetes.io/hostname": self._node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
            )

    def beat(self) -> None:
        now = datetime.now(UTC)
        try:
            self._kube.patch_node_status(self._node, node_status_patch(now, self._ready_since))
        except Exception as e:
            if getattr(e, "status", None) != 404:
                raise
            self.ensure_node()
            self._kube.patch_node_status(self._node, node_status_patch(now, self._ready_since))
        self._kube.renew_lease(LEASE_NAMESPACE, self._node, lease_spec(self._node, now))

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.beat()
                log.debug(kv("heartbeat sent"))
            except Exception as e:
                log.warning(kv("heartbeat failed", error=e))
            stop.wait(self._interval)


def wipe_slices(kube: Kube, node: str, driver: str | None = None) -> None:
    kube.delete_slices(slice_selector(node, driver))
    log.info(kv("deleted ResourceSlices", selector=slice_selector(node, driver)))


def startup_wipe(kube: Kube, node: str, stop: threading.Event, max_s: float = STARTUP_WIPE_MAX_S) -> bool:
    """Delete every slice of the node, retrying with backoff (1 s doubling) for up to ``max_s``."""
    deadline = time.monotonic() + max_s
    delay = 1.0
    while not stop.is_set():
        try:
            wipe_slices(kube, node)
            return True
        except Exception as e:
            if time.monotonic() + delay > deadline:
                log.error(kv("start-up ResourceSlice wipe gave up", error=e))
                return False
            log.warning(kv("start-up ResourceSlice wipe failed, retrying", error=e, retry_in_s=delay))
            stop.wait(delay)
            delay = min(delay * 2, 30.0)
    return False
