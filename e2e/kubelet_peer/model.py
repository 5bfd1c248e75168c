"""Plain data shared by the peer's modules (no gRPC or Kubernetes types)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PreparedDevice:
    pool_name: str
    device_name: str
    request_names: tuple[str, ...] = ()
    cdi_device_ids: tuple[str, ...] = ()
    share_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "poolName": self.pool_name,
            "deviceName": self.device_name,
            "requestNames": list(self.request_names),
            "cdiDeviceIDs": list(self.cdi_device_ids),
        }
        if self.share_id is not None:
            out["shareID"] = self.share_id
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PreparedDevice:
        return cls(
            pool_name=str(d.get("poolName", "")),
            device_name=str(d.get("deviceName", "")),
            request_names=tuple(d.get("requestNames") or ()),
            cdi_device_ids=tuple(d.get("cdiDeviceIDs") or ()),
            share_id=d.get("shareID"),
        )


@dataclass
class ClaimResult:
    """One claim's entry in a NodePrepareResources response."""

    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


class DriverCallError(RuntimeError):
    """The driver could not be called at all (not registered, gRPC error, timeout)."""
