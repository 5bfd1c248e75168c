"""What the kubelet asks to prepare and what it is answered: the records that the DRA gRPC service
and the prepare state exchange (NodePrepareResources / NodeUnprepareResources, without protobuf),
and the failure whose message is a claim's answer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClaimRef:
    uid: str
    namespace: str
    name: str

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ResponseDevice:
    """One ``Device`` of a NodePrepareResourceResponse."""

    request_names: tuple[str, ...]
    """Base request names (``req/sub`` -> ``req``)."""
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class PrepareOutcome:
    devices: tuple[ResponseDevice, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class ClaimFailure(Exception):
    """A per-claim failure whose message goes to the kubelet as is."""
