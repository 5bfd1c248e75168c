"""The kubelet's calls: what it asks to prepare and what it is answered, the values that the DRA gRPC
service and the prepare state exchange (NodePrepareResources / NodeUnprepareResources, without protobuf),
and the failure whose message is a claim's answer; and the rules for the names those carry, which
every file a claim gets is named after (CDI specs, device metadata, checkpoint entries).

A claim's failures, one hierarchy; ``str(exc)`` is what the kubelet gets for the claim::

    ClaimFailure                  the claim cannot be prepared or unprepared as it is
    ├── CdiError(ValueError)      a name or value that cannot make a CDI spec (never an OSError)
    │   └── MetadataError         a name that cannot make a device-metadata path
    ├── ShareError(ValueError)    a share that cannot be prepared as allocated
    └── GpuPolicyError            a GPU's compute mode, time-slice or MPS daemon that cannot be
                                  read or set (:mod:`~dra_driver.node.prepare.gpupolicy`, ``mps``)

The state (:mod:`dra_driver.node.prepare.state`) answers a claim with the message of any of these.
Failures from below are turned into a claim's answer where prepare meets them: an ``OSError`` with
:func:`dra_driver.node.fileio.describe_os_error`, the toolkit's ``DriverEditsError`` as a
``ClaimFailure`` (:mod:`~dra_driver.node.prepare.materialize`). ``NvmlError`` stays the discovery
layer's own (start-up reads GPUs with it too); the state catches it beside ``ClaimFailure`` where
MIG instances are made, because its message already names the NVML call and why it failed.

Anything else is a bug. The node's ``except Exception`` clauses that are deliberate last resorts
say so where they stand (``# last resort: ...``): they keep one claim's bug from failing other
claims or the kubelet's call, or keep a background loop alive; every other one catches what a
library raises without a common base (grpc callbacks, a GPU backend) and is commented with it.
pynvml's failures have one, ``NVMLError``, and are caught by it
(:func:`dra_driver.node.discovery.nvml.nvml_error_type`).
"""

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
    """A per-claim failure whose message goes to the kubelet as is; the base of a claim's failures."""


# --- names ------------------------------------------------------------------------------------


class CdiError(ClaimFailure, ValueError):
    """Invalid input for a CDI spec (never a file-system error: those are OSError)."""


class MetadataError(CdiError):
    """A claim whose names cannot make a metadata path (reported for the claim, like any CDI input)."""


class ShareError(ClaimFailure, ValueError):
    """A share that cannot be prepared as allocated; the message says why."""


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
