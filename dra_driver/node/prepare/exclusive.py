"""Which claims may use one GPU at once.

Every prepared claim holds hardware: a GPU, a MIG slice of one, or a share of either. A claim is
refused when what it asks for overlaps a holder it cannot coexist with (its sharing config, its
share, admin access decide), or when the shares prepared on a device would add up to more memory
than the device has (the scheduler's accounting, checked again where the memory is).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from dra_driver.gpuconfig import SharingConfig, Strategy, TimeSliceInterval
from dra_driver.k8s.quantity import format_canonical
from dra_driver.node.describe.devices import AllocatableDevice, device_totals
from dra_driver.node.prepare.calls import ClaimFailure
from dra_driver.node.prepare.entries import ClaimEntry, DeviceKind, PreparedDevice
from dra_driver.node.prepare.plan import PlannedDevice, placement_of


def _time_slice(sharing: SharingConfig) -> TimeSliceInterval | None:
    """The GPU-wide time-slice a share needs; a share without a TimeSlicing config runs with the
    GPU's default interval."""
    if sharing.strategy is Strategy.MPS:
        return None
    return sharing.interval or TimeSliceInterval.DEFAULT


def coexistence_problem(mine: SharingConfig, mine_share: bool, theirs: SharingConfig, theirs_share: bool) -> str | None:
    """Why two claims cannot use one GPU at once, or None when they can (admin access aside).

    * A share never meets a claim that holds the device (or its GPU) without one: the scheduler
      would not hand out both, so one of them is stale (e.g. prepared before the node published
      shares).
    * Shares of one GPU are all MPS clients or none: an MPS control daemon puts the GPU in
      exclusive-process mode, where a process outside MPS cannot run.
    * Shares that are not MPS must agree on the time-slice, a GPU-wide setting; no config means
      the GPU's default interval.
    * Claims without shares follow their GpuConfig (:meth:`SharingConfig.compatible_with`).
    """
    if mine_share != theirs_share:
        return ("a share of a GPU cannot be prepared beside a claim that holds it without one; "
                "the other claim must be unprepared first")
    if not mine_share:
        if mine.compatible_with(theirs):
            return None
        return "a GPU is shared only when both claims use the same TimeSlicing interval or both use MPS"
    if (mine.strategy is Strategy.MPS) != (theirs.strategy is Strategy.MPS):
        return "shares of one GPU must all use MPS or none of them"
    if _time_slice(mine) != _time_slice(theirs):
        return "shares of one GPU must use the same TimeSlicing interval (no config means Default)"
    return None


@dataclass(frozen=True)
class Hold:
    """A claim's use of a piece of hardware."""

    uid: str
    ref: str
    device: str
    gpu_uuid: str
    kind: DeviceKind
    placement: tuple[int, int] | None
    sharing: SharingConfig
    admin: bool
    share_id: str | None
    memory_bytes: int | None = None
    """A share's consumed memory."""

    def overlaps(self, other: Hold) -> bool:
        if self.gpu_uuid != other.gpu_uuid:
            return False
        if self.device == other.device or self.kind is DeviceKind.GPU or other.kind is DeviceKind.GPU:
            return True
        if self.placement is None or other.placement is None:
            return False
        a0, an = self.placement
        b0, bn = other.placement
        return a0 < b0 + bn and b0 < a0 + an

    def conflict(self, other: Hold) -> str | None:
        """Why the two cannot hold overlapping hardware at once; None when they can."""
        if self.admin or other.admin:
            return None  # admin access never takes exclusive ownership
        if self.share_id and other.share_id and self.device != other.device:
            # Shares are handed out per device; one GPU's device and a device inside it (a MIG
            # slice) are never both shared, so this pair is a stale allocation.
            return "shares of different devices on one GPU cannot be used at once"
        return coexistence_problem(self.sharing, bool(self.share_id), other.sharing, bool(other.share_id))

    def describe(self) -> str:
        if not self.share_id:
            return f"with sharing {self.sharing.describe()}"
        config = "" if self.sharing.strategy is Strategy.EXCLUSIVE else f" with sharing {self.sharing.describe()}"
        return f"as share {self.share_id}{config}"


def hold_of_prepared(entry: ClaimEntry, dev: PreparedDevice) -> Hold:
    return Hold(entry.uid, entry.ref, dev.device, dev.gpu_uuid, dev.kind, dev.placement, dev.sharing,
                dev.admin_access, dev.share_id, dev.memory_share_bytes)


def hold_of_planned(uid: str, ref: str, d: PlannedDevice) -> Hold:
    return Hold(uid, ref, d.device.name, d.device.gpu.uuid, d.prepared.kind, placement_of(d.device), d.sharing,
                d.admin, d.share_id, d.prepared.memory_share_bytes)


def check_exclusive(holds: Sequence[Hold], batch_holds: Sequence[Hold], prepared: Iterable[ClaimEntry],
                    devices: Mapping[str, AllocatableDevice]) -> None:
    """ClaimFailure when one claim's ``holds`` cannot be had beside the ``prepared`` claims and the
    others of its batch (``batch_holds``)."""
    if not holds:
        return
    uid = holds[0].uid
    others: list[Hold] = [h for h in batch_holds if h.uid != uid]
    for entry in prepared:
        if entry.uid != uid:
            others.extend(hold_of_prepared(entry, d) for d in entry.devices)
    for mine in holds:
        for theirs in others:
            problem = mine.conflict(theirs) if mine.overlaps(theirs) else None
            if problem:
                what = (f"device {mine.device}" if mine.device == theirs.device
                        else f"device {mine.device} (GPU {mine.gpu_uuid}, also used by {theirs.device})")
                raise ClaimFailure(
                    f"{what} is already prepared for claim {theirs.ref} ({theirs.uid}) {theirs.describe()}, "
                    f"this claim asks for it {mine.describe()}; {problem}"
                )
    _check_share_memory(holds, others, devices)


def _check_share_memory(holds: Sequence[Hold], others: Sequence[Hold], devices: Mapping[str, AllocatableDevice]) -> None:
    for name in sorted({h.device for h in holds if h.share_id and h.memory_bytes}):
        device = devices.get(name)
        if device is None:
            continue
        total = device_totals(device)[0]
        mine = sum(h.memory_bytes or 0 for h in holds if h.device == name and h.share_id)
        theirs = [h for h in others if h.device == name and h.share_id and h.memory_bytes]
        used = sum(h.memory_bytes or 0 for h in theirs)
        if mine + used > total:
            holders = ", ".join(f"{h.ref} ({format_canonical(h.memory_bytes or 0)})" for h in theirs)
            raise ClaimFailure(
                f"device {name} has {format_canonical(total)} of memory; shares already prepared for {holders} "
                f"and this claim's {format_canonical(mine)} would exceed it")
