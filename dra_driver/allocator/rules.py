"""Which kube-scheduler allocator the engine mirrors, and where scheduler versions decide differently.

The scheduler's structured allocator (``k8s.io/dynamic-resource-allocation``,
``structured/internal/``) exists in three variants; ``structured.NewAllocator`` takes the first,
most stable one whose supported features cover the features the scheduler's DRA gates enable
(``dynamicresources.go``, ``structured.Features{...}``):

- ``stable``: AdminAccess, PrioritizedList, PartitionableDevices, DeviceTaints;
- ``incubating``: those plus DeviceBindingAndStatus (DRADeviceBindingConditions *and*
  DRAResourceClaimDeviceStatus), ConsumableCapacity, and in 1.37 FractionalCapacityRange;
- ``experimental``: everything, including the alpha ListTypeAttributes (1.36) and in 1.37
  OptionalNodeOperations, DerivedAttributes and CompatibilityGroups.

The engine mirrors **incubating** (v0.36.3 and v0.37.2) with all of its features on: consumable
capacity, partitionable devices, device taints, prioritized lists and admin access.  That is the
variant a 1.36 or 1.37 scheduler runs with the default gates (DRAConsumableCapacity and
DRADeviceBindingConditions are beta and on) and with the local bed's gates
(``e2e/testbed/cluster.py`` FEATURE_GATES).  Under gates that select ``stable`` (consumable
capacity or binding conditions off) the claims the engine handles differently cannot be written
(the API server drops capacity requests and ``allowMultipleAllocations`` with the gate off);
under ``experimental`` (an alpha gate on) the engine does not know list-typed attributes,
derived attributes or compatibility groups.  Binding conditions are not modelled: the engine
never writes ``bindingConditions`` into a result.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

MIRRORED_VARIANT = "incubating"

# Scheduler feature (structured.Features) <- the gates that enable it.
_FEATURE_GATES: dict[str, tuple[str, ...]] = {
    "AdminAccess": ("DRAAdminAccess",),
    "PrioritizedList": ("DRAPrioritizedList",),
    "PartitionableDevices": ("DRAPartitionableDevices",),
    "DeviceTaints": ("DRADeviceTaints",),
    "DeviceBindingAndStatus": ("DRADeviceBindingConditions", "DRAResourceClaimDeviceStatus"),
    "ConsumableCapacity": ("DRAConsumableCapacity",),
    "FractionalCapacityRange": ("DRAFractionalCapacityRange",),
    "ListTypeAttributes": ("DRAListTypeAttributes",),
    "OptionalNodeOperations": ("DRAOptionalNodeOperations",),
    "DerivedAttributes": ("DRADerivedAttributes",),
    "CompatibilityGroups": ("DRADeviceCompatibilityGroups",),
}
_STABLE = frozenset({"AdminAccess", "PrioritizedList", "PartitionableDevices", "DeviceTaints"})
_INCUBATING = _STABLE | {"DeviceBindingAndStatus", "ConsumableCapacity", "FractionalCapacityRange"}
# Gates on by default (kubernetes pkg/features/kube_features.go of v1.36.3 and v1.37.2); the
# features a minor version does not know are absent.
_DEFAULT_ON: dict[int, frozenset[str]] = {
    36: frozenset({"DRAAdminAccess", "DRAPrioritizedList", "DRAPartitionableDevices", "DRADeviceTaints",
                   "DRADeviceBindingConditions", "DRAResourceClaimDeviceStatus", "DRAConsumableCapacity"}),
    37: frozenset({"DRAAdminAccess", "DRAPrioritizedList", "DRAPartitionableDevices", "DRADeviceTaints",
                   "DRADeviceBindingConditions", "DRAResourceClaimDeviceStatus", "DRAConsumableCapacity",
                   "DRAFractionalCapacityRange"}),
}  # fmt: skip
_KNOWN: dict[int, frozenset[str]] = {
    36: frozenset(_FEATURE_GATES) - {"FractionalCapacityRange", "OptionalNodeOperations", "DerivedAttributes",
                                     "CompatibilityGroups"},
    37: frozenset(_FEATURE_GATES),
}  # fmt: skip
NEWEST_MINOR = max(_DEFAULT_ON)


def parse_minor(version: str) -> int | None:
    """The minor version of a ``v1.36.3``-style gitVersion, None when it is not Kubernetes 1.x."""
    m = re.match(r"v?1\.(\d+)(?:\.|$)", version.strip())
    return int(m.group(1)) if m else None


def scheduler_features(gates: Mapping[str, bool], minor: int = NEWEST_MINOR) -> frozenset[str]:
    """The structured.Features a scheduler of ``1.<minor>`` enables under ``gates`` (the rest at their defaults)."""
    defaults = _DEFAULT_ON[min(max(minor, min(_DEFAULT_ON)), NEWEST_MINOR)]
    known = _KNOWN[min(max(minor, min(_KNOWN)), NEWEST_MINOR)]

    def on(gate: str) -> bool:
        return gates.get(gate, gate in defaults)

    return frozenset(f for f, needs in _FEATURE_GATES.items() if f in known and all(on(g) for g in needs))


def scheduler_variant(features: frozenset[str]) -> str:
    """The allocator variant structured.NewAllocator picks for ``features``."""
    if features <= _STABLE:
        return "stable"
    if features <= _INCUBATING:
        return "incubating"
    return "experimental"


@dataclass(frozen=True)
class SchedulerRules:
    """Where the incubating allocator of two scheduler versions decides differently; the engine
    follows the version it is given (the newest by default).

    - ``distinct_latest_only`` (1.36): distinctAttribute keeps one value per request name, that
      of the request's latest device, and a removal forgets the request's value, so a device is
      only compared with the latest device of each request and values 0, 1, 0 pass.  1.37 compares
      with every device of the constraint, as the API says.
    - ``claim_limit_per_request`` (1.37): the claim's minimal result count is checked against the
      limit of 32 request by request, naming the request that crosses it, before later requests
      are validated; 1.36 checks the sum after validating every request.
    - ``all_sized_by_static_capacity`` (1.37): an ``All`` request is sized against each device's
      total capacity, so a device other claims' shares have filled stays in it and the request
      fails; 1.36 leaves such a device out.
    """

    minor: int = NEWEST_MINOR

    @classmethod
    def for_version(cls, version: str | None) -> SchedulerRules:
        minor = parse_minor(version) if version else None
        return cls(minor) if minor is not None else cls()

    @property
    def distinct_latest_only(self) -> bool:
        return self.minor <= 36

    @property
    def claim_limit_per_request(self) -> bool:
        return self.minor >= 37

    @property
    def all_sized_by_static_capacity(self) -> bool:
        return self.minor >= 37
