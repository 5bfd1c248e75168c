"""Consumable shares (KEP-5075): one GPU allocated to several claims, each consuming part of it.

``--consumable-shares`` decides what the node publishes:

* ``disabled`` (default): every device goes to one claim at a time.
* ``memory``: full GPUs and static MIG devices get ``allowMultipleAllocations: true``. ``memory``
  is consumed in whole GiB (``validRange`` min 1Gi, step 1Gi); a claim that asks for no memory
  gets the default, all of the device's memory in whole GiB, so it has the device to itself.
* ``unlimited``: as ``memory``, but the default is 0 and the minimum 0: claims that ask for no
  memory take none, so any number of them fit; claims that ask still reserve what they ask for.
* ``<N>`` (a positive integer): as ``unlimited``, plus a ``shares`` capacity of N (default 1,
  1..N in steps of 1): at most N claims per device, more for those that ask for more shares.

In every mode ``multiprocessors`` (where published) is an optional compute share: default 0, any
whole number up to the device's count. A GPU whose MIG layout is chosen at allocation time
(``--dynamic-mig``) is never shared: its partitions are created per claim.

At prepare, each share's ``consumedCapacity`` becomes what its container is told (memory share,
compute share as a percentage) and, with MPS, the client limits that enforce it. Which shares may
meet on one GPU is decided here too (:func:`coexistence_problem`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dra_driver.gpuconfig import MpsSettings, SharingConfig, Strategy, TimeSliceInterval
from dra_driver.k8s.quantity import QuantityError, format_canonical, parse_quantity

MEMORY = "memory"
MULTIPROCESSORS = "multiprocessors"
SHARES = "shares"
GIB = 2**30
MIB = 2**20


class SharesMode(StrEnum):
    DISABLED = "disabled"
    MEMORY = "memory"
    UNLIMITED = "unlimited"
    COUNT = "count"


@dataclass(frozen=True)
class ConsumableShares:
    mode: SharesMode = SharesMode.DISABLED
    count: int = 0
    """N of ``--consumable-shares=<N>``; 0 in the other modes."""

    @property
    def enabled(self) -> bool:
        return self.mode is not SharesMode.DISABLED

    def __str__(self) -> str:
        return str(self.count) if self.mode is SharesMode.COUNT else self.mode.value


DISABLED = ConsumableShares()
MAX_SHARES = 1_000_000


def parse_consumable_shares(text: str) -> ConsumableShares:
    """``disabled`` | ``memory`` | ``unlimited`` | a positive integer; ValueError naming the flag otherwise."""
    value = (text or "").strip().lower()
    if value in ("", SharesMode.DISABLED.value):
        return DISABLED
    if value in (SharesMode.MEMORY.value, SharesMode.UNLIMITED.value):
        return ConsumableShares(SharesMode(value))
    if value.isdigit() and 1 <= int(value) <= MAX_SHARES:
        return ConsumableShares(SharesMode.COUNT, int(value))
    raise ValueError(f"--consumable-shares must be disabled, memory, unlimited or an integer 1..{MAX_SHARES}; "
                     f"got {text!r}")


# --- publishing ----------------------------------------------------------------------------------


def memory_step(memory_bytes: int) -> int:
    """1Gi, or 1Mi for a device too small for two GiB steps (the API wants min + step <= value)."""
    return GIB if memory_bytes >= 2 * GIB else MIB


def _q(value: int, binary: bool) -> str:
    return format_canonical(value, binary=binary)


def shared_capacity(memory_bytes: int, multiprocessors: int, shares: ConsumableShares) -> dict[str, dict[str, Any]]:
    """The ``capacity`` map of a multi-allocatable device, request policies included."""
    step = memory_step(memory_bytes)
    if shares.mode is SharesMode.MEMORY:
        # The default is whole steps (the API wants default - min to be a multiple of step), so a
        # claim that asks for nothing leaves less than one step: no other share fits beside it.
        memory_policy = {"default": _q(memory_bytes // step * step, True),
                         "validRange": {"min": _q(step, True), "step": _q(step, True)}}
    else:
        memory_policy = {"default": "0", "validRange": {"min": "0", "step": _q(step, True)}}
    capacity: dict[str, dict[str, Any]] = {
        MEMORY: {"value": _q(memory_bytes, True), "requestPolicy": memory_policy},
    }
    if multiprocessors > 0:
        capacity[MULTIPROCESSORS] = {"value": _q(multiprocessors, False),
                                     "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1"}}}
    if shares.mode is SharesMode.COUNT:
        share_range: dict[str, str] = {"min": "1", "max": _q(shares.count, False)}
        if shares.count > 1:
            share_range["step"] = "1"
        capacity[SHARES] = {"value": _q(shares.count, False), "requestPolicy": {"default": "1", "validRange": share_range}}
    return capacity


# --- preparing a share ---------------------------------------------------------------------------


class ShareError(ValueError):
    """A share that cannot be prepared as allocated; the message says why."""


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
            raise ShareError(f"consumedCapacity[{name!r}] is {raw[name]}, more than the device's {_q(limit, name == MEMORY)}")
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
                             f"({_q(amounts.memory_bytes, True)})")
        if mem_bytes is None and amounts.memory_bytes >= MIB:
            mem_text, mem_bytes = _q(amounts.memory_bytes, True), amounts.memory_bytes
    return SharingConfig(Strategy.MPS, None, MpsSettings(pct, mem_text, mem_bytes))


# --- which holders may meet on one GPU -----------------------------------------------------------


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
