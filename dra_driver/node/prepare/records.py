"""What the kubelet asks to prepare and what it is answered: the records that the DRA gRPC service
and the prepare state exchange (NodePrepareResources / NodeUnprepareResources, without protobuf),
and the failure whose message is a claim's answer; and the rules for the names those carry, which
every file a claim gets is named after (CDI specs, device metadata, checkpoint entries)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dra_driver.k8s.names import is_dns_label, is_dns_subdomain, is_driver_name

UUID_PATTERN = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
"""A lower-case RFC 4122 UUID, as the API server writes claim UIDs and share IDs."""
_UUID = re.compile(UUID_PATTERN)


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


# --- names ------------------------------------------------------------------------------------


class CdiError(ValueError):
    """Invalid input for a CDI spec (never a file-system error: those are OSError)."""


class MetadataError(CdiError):
    """A claim whose names cannot make a metadata path (reported for the claim, like any CDI input)."""


def is_uuid(value: object) -> bool:
    return isinstance(value, str) and _UUID.fullmatch(value) is not None


def validate_claim_uid(uid: str) -> str:
    if not is_uuid(uid):
        raise CdiError(f"claim UID {uid!r} is not a lower-case RFC 4122 UUID")
    return uid


def validate_share_id(share_id: Any) -> str:
    if not is_uuid(share_id):
        raise CdiError(f"shareID {share_id!r} is not a lower-case RFC 4122 UUID")
    return str(share_id)


def validate_driver_name(driver: str) -> str:
    # ASCII as well: the API server lower-cases a driver name before checking it, which lets two
    # non-ASCII letters through, and a CDI vendor name is ASCII.
    if not is_driver_name(driver) or not driver.isascii():
        raise CdiError(f"driver name {driver!r} is not a DNS subdomain of at most 63 characters")
    return driver


def validate_device_name(name: str) -> str:
    if not is_dns_label(name):
        raise CdiError(f"device name {name!r} is not a DNS label")
    return name


def validate_request_name(name: str) -> str:
    if not is_dns_label(name):
        raise MetadataError(f"request name {name!r} is not a DNS label")
    return name


def validate_claim_name(name: str) -> str:
    if not is_dns_subdomain(name):
        raise MetadataError(f"claim name {name!r} is not a DNS subdomain")
    return name
