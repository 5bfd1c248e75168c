"""A claim's allocation and config, checked and applied: what each device allocated from this
driver becomes on this node.

For every allocation result of this driver: the pool is this node, the device is known, the opaque
config is valid (this driver's API or NVIDIA's, :mod:`dra_driver.opaqueconfig`) and its sharing strategy is
allowed here, the consumed capacity fits the device, and a share's MPS client limits come from
what it consumed. The outcome is one :class:`PreparedDevice` per result, which the checkpoint keeps
and the container edits (:mod:`dra_driver.node.prepare.edits`) are made from. Nothing here touches
the node; every refusal is a :class:`ClaimFailure` whose message the kubelet gets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver.gpuconfig import MpsSettings, SharingConfig, Strategy
from dra_driver.k8s.bodies import RawClaim
from dra_driver.k8s.objects import Node, as_mapping, meta, selector_matches
from dra_driver.k8s.quantity import QuantityError, format_canonical, parse_quantity
from dra_driver.node.describe.devices import AllocatableDevice, device_totals
from dra_driver.node.describe.shares import MEMORY, MIB, MULTIPROCESSORS, SHARES, ConsumableShares
from dra_driver.node.discovery.sysfs import read_mig_cap_minors
from dra_driver.node.prepare.calls import (
    CdiError,
    ClaimFailure,
    ClaimRef,
    ShareError,
    validate_claim_uid,
    validate_share_id,
)
from dra_driver.node.prepare.cdi import CdiSpecs
from dra_driver.node.prepare.entries import DeviceKind, PreparedDevice
from dra_driver.node.prepare.metadata import MetadataFiles, pod_claim_name
from dra_driver.opaqueconfig import RequestConfigError, Target, resolve_sharing

# --- the claim --------------------------------------------------------------------------------


def verify_claim(claim: ClaimRef, obj: RawClaim, node_name: str) -> None:
    """The ResourceClaim read is the one the kubelet asked for, allocated, and allocated to this node."""
    try:
        validate_claim_uid(claim.uid)
    except CdiError as exc:
        raise ClaimFailure(str(exc)) from None
    body = as_mapping(obj)  # read as the API server answered: a body that is no object has no UID
    actual_uid = meta(body).get("uid")
    if actual_uid != claim.uid:
        raise ClaimFailure(
            f"claim was replaced: ResourceClaim {claim.ref} has UID {actual_uid}, the kubelet asked for {claim.uid}"
        )
    allocation = as_mapping(body.get("status")).get("allocation")
    if not isinstance(allocation, Mapping):
        raise ClaimFailure(f"ResourceClaim {claim.ref} is not allocated (no status.allocation)")
    selector = allocation.get("nodeSelector")
    # The plugin knows its node's name, not its labels: label requirements are taken as met.
    if selector and not selector_matches(as_mapping(selector), Node(node_name, labels=None)):
        raise ClaimFailure(
            f"ResourceClaim {claim.ref} is allocated to another node, not {node_name} "
            f"(nodeSelector {allocation.get('nodeSelector')})"
        )


# --- a share ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShareAmounts:
    """What one allocation result consumed of its device."""

    consumed: dict[str, str]
    """``consumedCapacity`` as the scheduler wrote it (names without the driver's domain)."""
    memory_bytes: int | None = None
    """Consumed memory; None when the result consumed none."""
    compute_percent: int | None = None
    """Consumed compute (``shares`` of N, or ``multiprocessors`` of the device's) as 1..100."""


def _percent(part: int, whole: int) -> int:
    return max(1, min(100, part * 100 // whole))


def share_amounts(consumed: Any, driver: str, device_memory: int, device_multiprocessors: int,
                  shares: ConsumableShares) -> ShareAmounts:
    """Read a result's ``consumedCapacity``; ShareError for a value that is not a quantity or
    exceeds the device."""
    if consumed is None:
        return ShareAmounts({})
    if not isinstance(consumed, Mapping):
        raise ShareError(f"consumedCapacity must be an object, got {type(consumed).__name__}")
    amounts: dict[str, int] = {}
    raw: dict[str, str] = {}
    for key, value in consumed.items():
        name = str(key).removeprefix(f"{driver}/")
        try:
            quantity = parse_quantity(value)
        except QuantityError:
            raise ShareError(f"consumedCapacity[{key!r}] is not a quantity: {value!r}") from None
        if quantity.sign() < 0 or not quantity.is_integer():
            raise ShareError(f"consumedCapacity[{key!r}] must be a whole non-negative amount, got {value!r}")
        amounts[name] = quantity.as_integer()
        raw[name] = str(value)
    limits = {MEMORY: device_memory, MULTIPROCESSORS: device_multiprocessors, SHARES: shares.count}
    for name, amount in amounts.items():
        limit = limits.get(name)
        if limit is not None and amount > limit > 0:
            raise ShareError(f"consumedCapacity[{name!r}] is {raw[name]}, more than the device's "
                             f"{format_canonical(limit, binary=name == MEMORY)}")
    memory = amounts.get(MEMORY) or None
    percents = []
    if amounts.get(SHARES) and shares.count:
        percents.append(_percent(amounts[SHARES], shares.count))
    if amounts.get(MULTIPROCESSORS) and device_multiprocessors:
        percents.append(_percent(amounts[MULTIPROCESSORS], device_multiprocessors))
    return ShareAmounts(raw, memory, min(percents) if percents else None)


def mps_for_share(sharing: SharingConfig, amounts: ShareAmounts) -> SharingConfig:
    """MPS client limits that enforce a share: the pinned-memory limit from the consumed memory and
    the active-thread percentage from the consumed compute.

    A limit the claim set itself is kept when it fits inside the share, and refused when it would
    let the client use more than the share (ShareError). Other strategies are returned unchanged.
    """
    if sharing.strategy is not Strategy.MPS:
        return sharing
    mps = sharing.mps or MpsSettings()
    pct = mps.default_active_thread_percentage
    if amounts.compute_percent is not None:
        if pct is not None and pct > amounts.compute_percent:
            raise ShareError(f"MPS defaultActiveThreadPercentage {pct} is more than this share's compute "
                             f"({amounts.compute_percent}%)")
        pct = pct if pct is not None else amounts.compute_percent
    mem_text, mem_bytes = mps.default_pinned_device_memory_limit, mps.default_pinned_device_memory_limit_bytes
    if amounts.memory_bytes is not None:
        if mem_bytes is not None and mem_bytes > amounts.memory_bytes:
            raise ShareError(f"MPS defaultPinnedDeviceMemoryLimit {mem_text} is more than this share's memory "
                             f"({format_canonical(amounts.memory_bytes, binary=True)})")
        if mem_bytes is None and amounts.memory_bytes >= MIB:
            mem_text, mem_bytes = format_canonical(amounts.memory_bytes, binary=True), amounts.memory_bytes
    return SharingConfig(Strategy.MPS, None, MpsSettings(pct, mem_text, mem_bytes))


# --- the plan ---------------------------------------------------------------------------------


@dataclass
class PlannedDevice:
    result_request: str
    device: AllocatableDevice
    sharing: SharingConfig
    admin: bool
    share_id: str | None
    prepared: PreparedDevice


@dataclass
class Plan:
    claim: ClaimRef
    devices: list[PlannedDevice]
    pod_claim_name: str | None = None


def placement_of(device: AllocatableDevice) -> tuple[int, int] | None:
    if device.mig is not None:
        return (device.mig.placement.start, device.mig.placement.size)
    if device.placement is not None:
        return (device.placement.start, device.placement.size)
    return None


def _share_id(value: Any, where: str) -> str | None:
    if value is None or value == "":
        return None
    try:
        return validate_share_id(value)
    except CdiError as exc:
        raise ClaimFailure(f"{where}: {exc}") from None


def _target(result: Mapping[str, Any], device: AllocatableDevice) -> Target:
    """What the opaque configs see of one result: a dynamic MIG device has no UUID until created."""
    uuid = device.gpu.uuid if device.kind == "gpu" else (device.mig.uuid if device.mig is not None else "")
    return Target(str(result.get("request") or ""), device.name, device.kind == "mig", uuid)


@dataclass(frozen=True)
class ClaimPlanner:
    """Turns a verified ResourceClaim into a :class:`Plan` for this node's devices."""

    node_name: str
    driver_name: str
    cdi: CdiSpecs
    strategies: frozenset[str]
    shares: ConsumableShares
    proc_root: Path | None
    metadata: MetadataFiles | None = None

    def plan(self, claim: ClaimRef, obj: RawClaim, devices: Mapping[str, AllocatableDevice]) -> Plan:
        devices_of = as_mapping(as_mapping(as_mapping(as_mapping(obj).get("status")).get("allocation")).get("devices"))
        results = devices_of.get("results") or []
        configs = devices_of.get("config") or []
        if not isinstance(results, list) or not isinstance(configs, list):
            raise ClaimFailure("status.allocation.devices is malformed")
        ours = [(i, result) for i, result in enumerate(results)
                if isinstance(result, Mapping) and result.get("driver") == self.driver_name]
        found = [self._device_of(i, result, devices) for i, result in ours]
        targets = [_target(result, device) for (_, result), device in zip(ours, found, strict=True)]
        try:
            sharings = resolve_sharing(configs, targets, self.driver_name)
        except RequestConfigError as exc:
            raise ClaimFailure(f"invalid {self.driver_name} config for request {exc.request!r}: {exc}") from None
        planned = [self._planned(claim, i, result, device, sharing)
                   for (i, result), device, sharing in zip(ours, found, sharings, strict=True)]
        if self.metadata is None or not self.metadata.enabled or not planned:
            return Plan(claim, planned)
        try:
            pod_claim = pod_claim_name(obj)
            with_ids = self.metadata.with_cdi_ids(claim.uid, [d.prepared for d in planned])
        except CdiError as exc:
            raise ClaimFailure(f"device metadata for ResourceClaim {claim.ref}: {exc}") from None
        for d, prepared in zip(planned, with_ids, strict=True):
            d.prepared = prepared
        return Plan(claim, planned, pod_claim)

    def _device_of(self, i: int, result: Mapping[str, Any], devices: Mapping[str, AllocatableDevice]) -> AllocatableDevice:
        """The device of one allocation result: in this node's pool and known here."""
        pool = str(result.get("pool") or "")
        name = str(result.get("device") or "")
        where = f"status.allocation.devices.results[{i}]"
        if pool != self.node_name:
            raise ClaimFailure(f"{where}: device {name!r} is in pool {pool!r}, this node's pool is {self.node_name!r}")
        device = devices.get(name)
        if device is None:
            raise ClaimFailure(f"{where}: device {name!r} is not a device of this driver on node {self.node_name}")
        return device

    def _planned(self, claim: ClaimRef, i: int, result: Mapping[str, Any], device: AllocatableDevice,
                 sharing: SharingConfig) -> PlannedDevice:
        request = str(result.get("request") or "")
        name = device.name
        where = f"status.allocation.devices.results[{i}]"
        if sharing.strategy.value not in self.strategies:
            raise ClaimFailure(
                f"config for request {request!r} asks for sharing strategy {sharing.strategy.value}, which node "
                f"{self.node_name} does not allow (allowed: {', '.join(sorted(self.strategies))})")
        share_id = _share_id(result.get("shareID"), where)
        memory, multiprocessors = device_totals(device)
        try:
            amounts = share_amounts(result.get("consumedCapacity"), self.driver_name, memory, multiprocessors, self.shares)
        except ShareError as exc:
            raise ClaimFailure(f"{where} (device {name}): {exc}") from None
        if share_id:
            try:
                sharing = mps_for_share(sharing, amounts)
            except ShareError as exc:
                raise ClaimFailure(f"config for request {request!r} does not fit its share {share_id} of device "
                                   f"{name}: {exc}") from None
        admin = result.get("adminAccess") is True
        return PlannedDevice(result_request=request, device=device, sharing=sharing, admin=admin, share_id=share_id,
                             prepared=self._prepared(claim.uid, request, device, sharing, admin, share_id, amounts))

    def _prepared(self, uid: str, request: str, device: AllocatableDevice, sharing: SharingConfig,
                  admin: bool, share_id: str | None, amounts: ShareAmounts) -> PreparedDevice:
        caps: tuple[int, ...] = ()
        uuid = device.gpu.uuid
        if device.mig is not None:
            uuid = device.mig.uuid
            caps = read_mig_cap_minors(device.gpu.minor, device.mig.gpu_instance_id, device.mig.compute_instance_id,
                                       self.proc_root)
        return PreparedDevice(
            pool=self.node_name, device=device.name, requests=(request,),
            cdi_device_ids=(self.cdi.cdi_device_id(uid, device.name, share_id),), sharing=sharing,
            share_id=share_id, admin_access=admin,
            uuid=uuid, gpu_uuid=device.gpu.uuid, gpu_minor=device.gpu.minor, mig_caps=caps,
            kind=DeviceKind(device.kind), placement=placement_of(device),
            consumed_capacity=amounts.consumed, memory_share_bytes=amounts.memory_bytes,
            compute_share_percent=amounts.compute_percent,
        )
