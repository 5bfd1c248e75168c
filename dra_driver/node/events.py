"""What the node plugin tells operators through Events, and where they look for it.

On the **Node** (``kubectl describe node``): a quarantined checkpoint, a node whose devices are
not published (no NVML, no GPUs, NVIDIA's device plugin serving them) and publishing resumed, a
device turning unhealthy or recovering, a device withheld from the ResourceSlices because the API
server would refuse it, a stale claim cleaned up, rolling updates on a kubelet too old for them. On
the **ResourceClaim** (``kubectl describe resourceclaim``): a failed prepare, with the error the
kubelet received. Reporting controller ``gpu.dra-driver.io/kubelet-plugin``, instance = the node
name; :class:`dra_driver.k8s.events.EventRecorder` folds repeats into one series.
"""

from __future__ import annotations

from pathlib import Path

from dra_driver import CONFIG_API_GROUP
from dra_driver.allocator.devicestates import withheld_note
from dra_driver.k8s.client import CLAIMS
from dra_driver.k8s.events import EventRecorder, ObjectRef, Occurrence, node_ref
from dra_driver.node.prepare.calls import ClaimRef
from dra_driver.node.publish.checker import Violation
from dra_driver.node.publish.gate import BACKEND_UNAVAILABLE, NO_GPUS, Closed
from dra_driver.node.publish.health import HealthChange

REPORTING_CONTROLLER = f"{CONFIG_API_GROUP}/kubelet-plugin"


def checkpoint_quarantined(path: Path, reason: str, copy: Path | None) -> Occurrence:
    where = f"moved to {copy}" if copy is not None else "could not be moved aside"
    return Occurrence("Warning", "CheckpointQuarantined", "Recover",
                      f"checkpoint {path} is unusable ({reason}); {where}; started with no prepared claims")


def not_publishing(closed: Closed) -> Occurrence:
    if closed.reason == BACKEND_UNAVAILABLE:
        return Occurrence("Warning", "GpuBackendUnavailable", "PublishResourceSlices", closed.message)
    if closed.reason == NO_GPUS:
        return Occurrence("Warning", "NoGpusFound", "PublishResourceSlices", closed.message)
    return Occurrence("Warning", "DevicePluginPresent", "PublishResourceSlices", closed.message)


def publishing_resumed(was: Closed) -> Occurrence:
    return Occurrence("Normal", "PublishingResumed", "PublishResourceSlices",
                      f"publishing this node's devices again: {not_publishing(was).reason} no longer holds")


def health_changed(change: HealthChange) -> Occurrence:
    if change.recovered:
        return Occurrence("Normal", "DeviceRecovered", "MonitorHealth", change.describe())
    return Occurrence("Warning", "DeviceUnhealthy", "MonitorHealth", change.describe())


def device_withheld(device: str, driver: str, model: str, problems: list[Violation]) -> Occurrence:
    why = "; ".join(f"{v.field}: {v.message} (rule {v.rule})" if v.field else f"{v.message} (rule {v.rule})"
                    for v in problems)
    return Occurrence("Warning", "DeviceWithheld", "PublishResourceSlices", withheld_note(device, driver, model, why))


def stale_claim_unprepared(claim: ClaimRef, error: str | None) -> Occurrence:
    if error is None:
        return Occurrence("Normal", "StaleClaimUnprepared", "CleanUp",
                          f"unprepared claim {claim.ref} ({claim.uid}): it is gone from the API server")
    return Occurrence("Warning", "StaleClaimCleanupFailed", "CleanUp",
                      f"claim {claim.ref} ({claim.uid}) is gone from the API server but unpreparing it failed: {error}")


def stale_claims_deferred(waiting: int, bound: int) -> Occurrence:
    return Occurrence("Warning", "StaleClaimsDeferred", "CleanUp",
                      f"{waiting} more prepared claims are gone from the API server than one sweep unprepares "
                      f"({bound}, --max-stale-unprepares); they are unprepared in the next sweeps")


ROLLING_UPDATE_KUBELET = (1, 33)
"""The first kubelet that keeps a driver registered while two of its instances come and go."""


def kubelet_too_old_for_rolling_update(kubelet_version: str) -> bool:
    """Whether a Node's ``status.nodeInfo.kubeletVersion`` (``v1.32.3``) is older than 1.33; an
    unreadable version is not (nothing to say about it)."""
    parts = kubelet_version.lstrip("v").split(".")
    try:
        return (int(parts[0]), int(parts[1])) < ROLLING_UPDATE_KUBELET
    except (ValueError, IndexError):
        return False


def rolling_update_unsupported(kubelet_version: str) -> Occurrence:
    return Occurrence("Warning", "RollingUpdateUnsupported", "Register",
                      f"the plugin runs with rolling updates (a new plugin pod serves beside the old one), but this "
                      f"node's kubelet {kubelet_version} is older than 1.33 and drops the driver when the old pod "
                      "stops: set the chart's kubeletPlugin.rollingUpdate=false, or upgrade the kubelet")


def prepare_failed(error: str) -> Occurrence:
    return Occurrence("Warning", "PrepareFailed", "Prepare", error)


def claim_ref(claim: ClaimRef) -> ObjectRef:
    return ObjectRef(CLAIMS.api_version, CLAIMS.kind, claim.name, uid=claim.uid, namespace=claim.namespace)


class NodeEvents:
    """The plugin's recorder, bound to its node."""

    def __init__(self, recorder: EventRecorder, node_name: str) -> None:
        self.recorder = recorder
        self.node = node_ref(node_name)

    def on_node(self, what: Occurrence) -> None:
        self.recorder.record(self.node, what)

    def on_claim(self, claim: ClaimRef, what: Occurrence) -> None:
        self.recorder.record(claim_ref(claim), what)
