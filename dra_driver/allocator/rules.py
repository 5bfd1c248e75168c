"""Which kube-scheduler allocator the engine mirrors, and where scheduler versions decide differently.

The scheduler's structured allocator (``k8s.io/dynamic-resource-allocation``,
``structured/internal/``) exists in three variants; ``structured.NewAllocator`` takes the first,
most stable one whose supported features cover the features the scheduler's DRA gates enable
(``dynamicresources.go``, ``structured.Features{...}``).  What each variant supports depends on
the version (``SupportedFeatures`` of each variant):

- ``stable``: AdminAccess, PrioritizedList, PartitionableDevices, DeviceTaints; in 1.38 also
  DeviceBindingAndStatus, ConsumableCapacity and FractionalCapacityRange;
- ``incubating``: the 1.38 stable set (1.36 without FractionalCapacityRange); in 1.38 also the
  alpha features, like ``experimental``;
- ``experimental``: everything, including the alpha ListTypeAttributes (1.36) and in 1.37
  OptionalNodeOperations, DerivedAttributes and CompatibilityGroups.

So the version and the gates choose the variant together: with the default gates (and the local
bed's, ``e2e/testbed/cluster.py`` FEATURE_GATES) a 1.36 or 1.37 scheduler runs **incubating**
(v0.36.3, v0.37.2), a 1.38 scheduler **stable** (v0.38).  :func:`mirrored_variant` names the one
the engine mirrors for a minor; :class:`SchedulerRules` holds where those decide differently.
Under gates that select the older ``stable`` (consumable capacity or binding conditions off, 1.36
and 1.37) the claims the engine handles differently cannot be written (the API server drops
capacity requests and ``allowMultipleAllocations`` with the gate off); under ``experimental``
(an alpha gate on) the engine does not know list-typed attributes, derived attributes or
compatibility groups.  Binding conditions are not modelled: the engine never writes
``bindingConditions`` into a result.

What 1.38's ``stable`` decides differently from 1.37's ``incubating`` (read in the v0.38.0-beta.0
source; :class:`SchedulerRules` ``qualified_names`` and the properties after it):

- attributes and capacities are keyed by (domain, identifier), an unqualified name in the
  device's driver's domain; a device publishing both ``x`` and ``<driver>/x`` is read as
  ``<driver>/x`` (``api/conversion.go``), in CEL as in constraints.  1.37's CEL saw either, by Go
  map order (the engine takes the later one as published); its constraints already preferred the
  qualified name (``lookupAttribute``), and so does the engine under every version;
- capacity requests resolve against the device's driver (``memory`` is ``<driver>/memory``); one
  capacity requested both ways is an error that ends the attempt (``resolveCapacityRequests``); a
  request for a capacity the device lacks skips the device, as before;
- ``consumedCapacity`` is written under the name as the device published it
  (``capacityNameForStatus``), and other claims' consumption is added up per (domain, identifier),
  a driver-qualified entry of one result winning over its unqualified twin
  (``NewDeviceConsumedCapacity``);
- matchAttribute/distinctAttribute compare versions with semver ``Equals`` (build metadata
  ignored), and an attribute present with a value they cannot compare (a list, a version semver
  cannot parse, one whose numbers do not fit its uint64s: ``100000000000000000000.0.0``, which
  the 1.37 API server accepts) is an error that ends the attempt instead of a skipped device;
- CEL reads each attribute from the converted device as a selector asks for it
  (``cel/compile.go`` ``nameToAttributes``): a version that did not convert fails only a selector
  that reads it (``attribute x: value is invalid or its type is not supported by this version``).
  1.36 and 1.37 convert every attribute before evaluating, so the same device fails every selector,
  the class's ``device.driver == ...`` included (``attribute x: parse semantic version: ...``);
- ``allocationMode: All`` beside an incomplete or invalid pool fails that node only
  (``ErrFailedAllocationOnNode``);
- a device that no longer allows multiple allocations is in use while shares of it are allocated
  (``deviceCapacityInUse``), except to admin access;
- the plugin (``allocateddevices.go``): while any allocated claim has a negative
  ``consumedCapacity``, gathering the allocated state fails, so with DRAConsumableCapacity on
  every pod with a claim to allocate fails PreFilter, whatever the claim asks.

Unchanged (compared in the source): the combination walk of ``allocateOne``, the claim's result
limit and its overflow checks, first fit, device order, counters charged once per shared device.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

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
_BASIC = frozenset({"AdminAccess", "PrioritizedList", "PartitionableDevices", "DeviceTaints"})
_SHARING = _BASIC | {"DeviceBindingAndStatus", "ConsumableCapacity", "FractionalCapacityRange"}
_EVERYTHING = frozenset(_FEATURE_GATES)
# What each variant supports, per minor (SupportedFeatures of structured/internal/<variant>).
_VARIANTS: dict[int, tuple[tuple[str, frozenset[str]], ...]] = {
    36: (("stable", _BASIC), ("incubating", _SHARING), ("experimental", _EVERYTHING)),
    37: (("stable", _BASIC), ("incubating", _SHARING), ("experimental", _EVERYTHING)),
    38: (("stable", _SHARING), ("incubating", _EVERYTHING), ("experimental", _EVERYTHING)),
}
_DEFAULT_37 = frozenset({"DRAAdminAccess", "DRAPrioritizedList", "DRAPartitionableDevices", "DRADeviceTaints",
                         "DRADeviceBindingConditions", "DRAResourceClaimDeviceStatus", "DRAConsumableCapacity",
                         "DRAFractionalCapacityRange"})  # fmt: skip
# Gates on by default (kubernetes pkg/features/kube_features.go of v1.36.3, v1.37.2 and
# v1.38.0-beta.0); the features a minor version does not know are absent.
_DEFAULT_ON: dict[int, frozenset[str]] = {
    36: _DEFAULT_37 - {"DRAFractionalCapacityRange"},
    37: _DEFAULT_37,
    38: _DEFAULT_37,
}
# Gates locked to their default (LockToDefault): setting them otherwise stops the component.
_LOCKED: dict[int, frozenset[str]] = {
    36: frozenset({"DRAAdminAccess"}),
    37: frozenset({"DRAAdminAccess", "DRAPrioritizedList", "DRAResourceClaimDeviceStatus"}),
    38: frozenset({"DRAAdminAccess", "DRAPrioritizedList", "DRAResourceClaimDeviceStatus", "DRAPartitionableDevices",
                   "DRADeviceBindingConditions", "DRADeviceTaints", "DRADeviceTaintRules"}),
}  # fmt: skip
_KNOWN: dict[int, frozenset[str]] = {
    36: _EVERYTHING - {"FractionalCapacityRange", "OptionalNodeOperations", "DerivedAttributes", "CompatibilityGroups"},
    37: _EVERYTHING,
    38: _EVERYTHING,
}
OLDEST_MINOR = min(_DEFAULT_ON)
NEWEST_MINOR = max(_DEFAULT_ON)
KNOWN_MINORS = tuple(sorted(_DEFAULT_ON))


def known_minor(minor: int) -> int:
    """``minor`` within the minors the engine knows: an older one is the oldest, a newer the newest."""
    return min(max(minor, OLDEST_MINOR), NEWEST_MINOR)


def parse_minor(version: str) -> int | None:
    """The minor version of a ``v1.36.3``-style gitVersion, None when it is not Kubernetes 1.x."""
    m = re.match(r"v?1\.(\d+)(?:\.|$)", version.strip())
    return int(m.group(1)) if m else None


def locked_gates(minor: int = NEWEST_MINOR) -> frozenset[str]:
    """The DRA gates a scheduler of ``1.<minor>`` holds at their default whatever the flags say."""
    return _LOCKED[known_minor(minor)]


def scheduler_features(gates: Mapping[str, bool], minor: int = NEWEST_MINOR) -> frozenset[str]:
    """The structured.Features a scheduler of ``1.<minor>`` enables under ``gates`` (the rest at
    their defaults; a locked gate at its default, as a component that starts at all has it)."""
    defaults = _DEFAULT_ON[known_minor(minor)]
    known = _KNOWN[known_minor(minor)]
    locked = _LOCKED[known_minor(minor)]

    def on(gate: str) -> bool:
        return gate in defaults if gate in locked else gates.get(gate, gate in defaults)

    return frozenset(f for f, needs in _FEATURE_GATES.items() if f in known and all(on(g) for g in needs))


def scheduler_variant(features: frozenset[str], minor: int = NEWEST_MINOR) -> str:
    """The allocator variant structured.NewAllocator of ``1.<minor>`` picks for ``features``."""
    for variant, supported in _VARIANTS[known_minor(minor)]:
        if features <= supported:
            return variant
    return "experimental"


def mirrored_variant(minor: int = NEWEST_MINOR) -> str:
    """The variant the engine mirrors for ``1.<minor>``: what that scheduler runs with its default gates."""
    return scheduler_variant(scheduler_features({}, minor), minor)


MIRRORED_VARIANT = mirrored_variant()
"""The variant mirrored for the newest minor the engine knows (see :func:`mirrored_variant`)."""


@dataclass(frozen=True)
class SchedulerRules:
    """Where the allocators of scheduler versions decide differently; the engine follows the
    version it is given (the newest it knows by default, see the module's text for 1.38).

    - ``distinct_latest_only`` (1.36): distinctAttribute keeps one value per request name, that
      of the request's latest device, and a removal forgets the request's value, so a device is
      only compared with the latest device of each request and values 0, 1, 0 pass.  1.37 compares
      with every device of the constraint, as the API says.
    - ``claim_limit_per_request`` (1.37 on): the claim's minimal result count is checked against
      the limit of 32 request by request, naming the request that crosses it, before later
      requests are validated; 1.36 checks the sum after validating every request.
    - ``all_sized_by_static_capacity`` (1.37 on): an ``All`` request is sized against each
      device's total capacity, so a device other claims' shares have filled stays in it and the
      request fails; 1.36 leaves such a device out.
    - 1.38 on: ``qualified_names``, ``versions_ignore_build``, ``constraint_type_errors``,
      ``cel_converts_on_read``, ``all_fails_node_only``, ``shares_block_exclusive``,
      ``negative_capacity_fails``.
    """

    minor: int = NEWEST_MINOR

    @classmethod
    def for_version(cls, version: str | None) -> SchedulerRules:
        """The rules of a gitVersion: an older minor than the engine knows gets the oldest rules,
        a newer or unreadable one the newest."""
        minor = parse_minor(version) if version else None
        return cls(known_minor(minor)) if minor is not None else cls()

    @property
    def label(self) -> str:
        """``kube-scheduler 1.38 (stable allocator)``."""
        return f"kube-scheduler 1.{self.minor} ({mirrored_variant(self.minor)} allocator)"

    @property
    def distinct_latest_only(self) -> bool:
        return self.minor <= 36

    @property
    def claim_limit_per_request(self) -> bool:
        return self.minor >= 37

    @property
    def all_sized_by_static_capacity(self) -> bool:
        return self.minor >= 37

    @property
    def qualified_names(self) -> bool:
        """Attributes and capacities by (domain, identifier), the qualified spelling winning;
        capacity requests resolved against the device's driver, ``consumedCapacity`` written as
        published."""
        return self.minor >= 38

    @property
    def versions_ignore_build(self) -> bool:
        """matchAttribute/distinctAttribute compare versions without their build metadata."""
        return self.minor >= 38

    @property
    def constraint_type_errors(self) -> bool:
        """An attribute a constraint cannot compare ends the attempt (else the device is skipped)."""
        return self.minor >= 38

    @property
    def cel_converts_on_read(self) -> bool:
        """A device's attribute that does not convert (a version semver cannot hold) fails only the
        CEL selectors that read it; up to 1.37 it fails every selector on the device."""
        return self.minor >= 38

    @property
    def all_fails_node_only(self) -> bool:
        """``All`` beside an incomplete or invalid pool fails that node, not the attempt."""
        return self.minor >= 38

    @property
    def shares_block_exclusive(self) -> bool:
        """A device that does not allow multiple allocations is in use while shares of it are."""
        return self.minor >= 38

    @property
    def negative_capacity_fails(self) -> bool:
        """A negative ``consumedCapacity`` on any allocated claim fails every allocation."""
        return self.minor >= 38


AUTO = "auto"
RULE_CHOICES = (AUTO, *(f"1.{m}" for m in KNOWN_MINORS))
"""What ``--scheduler-rules`` accepts: ``auto`` (the API server's version) or a minor the engine knows."""


def choose_rules(choice: str, version: str | None) -> tuple[SchedulerRules, str | None]:
    """The rules for ``--scheduler-rules`` ``choice`` on a cluster whose API server says
    ``version`` (its gitVersion; None when it could not be read), and a warning where ``auto``
    had to guess: an unreadable version or a minor the engine does not know gets the newest
    rules, a minor older than the oldest the oldest rules."""
    if choice != AUTO:
        if choice not in RULE_CHOICES:
            raise ValueError(f"scheduler rules must be one of {', '.join(RULE_CHOICES)}, got {choice!r}")
        return SchedulerRules(int(choice.split(".")[1])), None
    minor = parse_minor(version) if version else None
    if minor is None:
        rules = SchedulerRules()
        return rules, (f"cannot tell the API server's Kubernetes version ({version or 'not read'}): deciding as "
                       f"{rules.label}")
    rules = SchedulerRules(known_minor(minor))
    if minor > NEWEST_MINOR:
        return rules, f"Kubernetes {version} is newer than the engine knows: deciding as {rules.label}"
    if minor < OLDEST_MINOR:
        return rules, f"Kubernetes {version} is older than the engine supports: deciding as {rules.label}"
    return rules, None
