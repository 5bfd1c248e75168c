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
compute share as a percentage) and, with MPS, the client limits that enforce it
(:mod:`dra_driver.node.prepare.plan`); which shares may meet on one GPU is decided by
:mod:`dra_driver.node.prepare.exclusive`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dra_driver.k8s.quantity import format_canonical

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


def shared_capacity(memory_bytes: int, multiprocessors: int, shares: ConsumableShares,
                    fixed_step: int | None = None) -> dict[str, dict[str, Any]]:
    """The ``capacity`` map of a multi-allocatable device, request policies included.

    ``fixed_step`` (NVIDIA's profile: 1Mi): memory in that step whatever the device's size, its value
    cut to whole steps and each range's ``max`` that value, as NVIDIA's plugin publishes it; the
    modes' defaults and minimums are the same."""
    step = fixed_step or memory_step(memory_bytes)
    if fixed_step:
        memory_bytes = memory_bytes // step * step
    if shares.mode is SharesMode.MEMORY:
        # The default is whole steps (the API wants default - min to be a multiple of step), so a
        # claim that asks for nothing leaves less than one step: no other share fits beside it.
        memory_policy: dict[str, Any] = {"default": _q(memory_bytes // step * step, True),
                                         "validRange": {"min": _q(step, True), "step": _q(step, True)}}
    else:
        memory_policy = {"default": "0", "validRange": {"min": "0", "step": _q(step, True)}}
    if fixed_step:
        memory_policy["validRange"]["max"] = _q(memory_bytes, True)
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
