"""The checkpoint's entries: a prepared claim (:class:`ClaimEntry`, in a :class:`ClaimState`) and each
of its devices (:class:`PreparedDevice`, of a :class:`DeviceKind`, with the MIG instance a dynamic-MIG
device created), with their JSON form, apart from the store that reads and writes the file
(:mod:`dra_driver.node.prepare.checkpoint`, where the format and its upgrade rule are written down).

``to_dict`` writes exactly the fields and values the file has always held: a rollback to the
previous release reads what this one writes. ``from_dict`` refuses what it cannot take (the store
quarantines such a file) and decodes a device's ``sharing`` once, here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dra_driver.gpuconfig import EXCLUSIVE, ConfigError, SharingConfig, decode_sharing
from dra_driver.node.discovery.model import MigDevice, MigPlacement


class ClaimState(StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


class DeviceKind(StrEnum):
    GPU = "gpu"
    """A whole GPU."""
    MIG = "mig"
    """A MIG slice of its ``gpu_uuid``."""


def mig_to_dict(mig: MigDevice) -> dict[str, Any]:
    """A MIG instance created for a dynamic-MIG device, as the checkpoint keeps it."""
    return {
        "uuid": mig.uuid, "profile": mig.profile, "parentUUID": mig.parent_uuid,
        "memoryBytes": mig.memory_bytes, "multiprocessors": mig.multiprocessors,
        "gpuInstanceID": mig.gpu_instance_id, "computeInstanceID": mig.compute_instance_id,
        "placementStart": mig.placement.start, "placementSize": mig.placement.size,
    }


def mig_from_dict(d: Mapping[str, Any]) -> MigDevice:
    return MigDevice(
        uuid=_str(d, "uuid"), profile=_str(d, "profile"), parent_uuid=_str(d, "parentUUID"),
        memory_bytes=_int(d, "memoryBytes"), multiprocessors=_int(d, "multiprocessors"),
        gpu_instance_id=_int(d, "gpuInstanceID"), compute_instance_id=_int(d, "computeInstanceID"),
        placement=MigPlacement(_int(d, "placementStart"), _int(d, "placementSize")),
    )


@dataclass(frozen=True)
class PreparedDevice:
    pool: str
    device: str
    requests: tuple[str, ...]
    """Full request names from the allocation result (``req`` or ``req/sub``)."""
    cdi_device_ids: tuple[str, ...]
    sharing: SharingConfig = field(default=EXCLUSIVE, compare=False)
    """The effective sharing config; Exclusive when what the file holds no longer decodes."""
    share_id: str | None = None
    admin_access: bool = False
    uuid: str = ""
    """UUID handed to the container: the GPU's, or the MIG instance's."""
    gpu_uuid: str = ""
    """The physical GPU (the parent for MIG)."""
    gpu_minor: int = 0
    mig_caps: tuple[int, ...] = ()
    """Minors of /dev/nvidia-caps/nvidia-capN for a MIG device."""
    mig_instance: MigDevice | None = None
    """Dynamic MIG: the instance this claim created."""
    kind: DeviceKind = DeviceKind.GPU
    placement: tuple[int, int] | None = None
    """MIG: (start, size) of the slice on its parent, for overlap checks."""
    consumed_capacity: dict[str, str] = field(default_factory=dict, compare=False)
    """A share's ``consumedCapacity`` from the allocation result."""
    memory_share_bytes: int | None = None
    """A share's consumed memory (told to the container, checked against the device)."""
    compute_share_percent: int | None = None
    """A share's consumed compute, 1..100 percent of the device."""
    sharing_as_read: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    """The ``sharing`` object as the file held it when it is not what :attr:`sharing` writes (it did
    not decode, or was spelled otherwise), so that saving the entry again writes it unchanged."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "pool": self.pool, "device": self.device, "requests": list(self.requests),
            "cdiDeviceIDs": list(self.cdi_device_ids), "sharing": self._sharing_dict(), "shareID": self.share_id,
            "adminAccess": self.admin_access, "uuid": self.uuid, "gpuUUID": self.gpu_uuid,
            "gpuMinor": self.gpu_minor, "migCaps": list(self.mig_caps),
            "migInstance": mig_to_dict(self.mig_instance) if self.mig_instance else None,
            "kind": self.kind.value, "placement": list(self.placement) if self.placement else None,
            "consumedCapacity": dict(self.consumed_capacity), "memoryShareBytes": self.memory_share_bytes,
            "computeSharePercent": self.compute_share_percent,
        }

    def _sharing_dict(self) -> dict[str, Any]:
        return dict(self.sharing_as_read) if self.sharing_as_read is not None else self.sharing.to_dict()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PreparedDevice:
        share_id = d.get("shareID")
        mig = d.get("migInstance")
        raw_sharing = d.get("sharing")
        if not isinstance(raw_sharing, dict):
            raise ValueError("sharing must be an object")
        try:
            sharing = decode_sharing(raw_sharing)
        except ConfigError:
            sharing = EXCLUSIVE
        placement = d.get("placement")
        consumed = d.get("consumedCapacity") or {}
        if not isinstance(consumed, dict) or not all(isinstance(v, str) for v in consumed.values()):
            raise ValueError("consumedCapacity must be an object of quantity strings")
        kind = d.get("kind", DeviceKind.GPU.value)
        if kind not in tuple(DeviceKind):
            raise ValueError(f"unknown device kind {kind!r}")
        return cls(
            pool=_str(d, "pool"), device=_str(d, "device"), requests=_strs(d, "requests"),
            cdi_device_ids=_strs(d, "cdiDeviceIDs"), sharing=sharing,
            sharing_as_read=None if raw_sharing == sharing.to_dict() else raw_sharing,
            share_id=share_id if isinstance(share_id, str) else None,
            admin_access=bool(d.get("adminAccess", False)), uuid=_str(d, "uuid"), gpu_uuid=_str(d, "gpuUUID"),
            gpu_minor=_int(d, "gpuMinor"), mig_caps=tuple(int(x) for x in d.get("migCaps") or ()),
            mig_instance=mig_from_dict(mig) if isinstance(mig, Mapping) else None,
            kind=DeviceKind(kind),
            placement=(int(placement[0]), int(placement[1])) if isinstance(placement, list) else None,
            consumed_capacity={str(k): v for k, v in consumed.items()},
            memory_share_bytes=_optional_int(d, "memoryShareBytes"),
            compute_share_percent=_optional_int(d, "computeSharePercent"),
        )


@dataclass(frozen=True)
class ClaimEntry:
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[PreparedDevice, ...] = ()
    boot_id: str = ""
    updated: str = ""
    pod_claim_name: str | None = None
    """The pod's name for a claim made from a template: where its device metadata is mounted."""
    prepared_by: str | None = None
    """The pod UID of the plugin instance that prepared the claim (for debugging rolling updates)."""

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "state": self.state.value, "namespace": self.namespace, "name": self.name,
            "bootID": self.boot_id, "updated": self.updated, "devices": [d.to_dict() for d in self.devices],
        }
        if self.pod_claim_name is not None:
            out["podClaimName"] = self.pod_claim_name
        if self.prepared_by is not None:
            out["preparedBy"] = self.prepared_by
        return out

    @classmethod
    def from_dict(cls, uid: str, d: Mapping[str, Any]) -> ClaimEntry:
        devices = d.get("devices") or []
        if not isinstance(devices, list):
            raise ValueError("devices must be a list")
        return cls(
            uid=uid, namespace=_str(d, "namespace"), name=_str(d, "name"), state=ClaimState(_str(d, "state")),
            devices=tuple(PreparedDevice.from_dict(x) for x in devices),
            boot_id=str(d.get("bootID") or ""), updated=str(d.get("updated") or ""),
            pod_claim_name=_optional_str(d, "podClaimName"), prepared_by=_optional_str(d, "preparedBy"),
        )


def _str(d: Mapping[str, Any], key: str) -> str:
    value = d.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string")
    return value


def _int(d: Mapping[str, Any], key: str) -> int:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer")
    return value


def _optional_str(d: Mapping[str, Any], key: str) -> str | None:
    """A string field that checkpoints written before it existed lack."""
    return None if d.get(key) is None else _str(d, key)


def _optional_int(d: Mapping[str, Any], key: str) -> int | None:
    """An integer field that checkpoints written before it existed lack."""
    return None if d.get(key) is None else _int(d, key)


def _strs(d: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = d.get(key)
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValueError(f"{key} must be a list of strings")
    return tuple(value)


def now_rfc3339() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"
