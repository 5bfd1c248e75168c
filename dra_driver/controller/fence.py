"""The allocation fence: how the controller's allocations can never collide with the scheduler's.

Two allocators writing different ResourceClaims share no object the API server could serialise
on, and the kube-scheduler decides from its own cache. So the controller makes the API server
refuse the collision instead: before it writes an allocation it records the devices in a ledger
ConfigMap (key :func:`ledger_key`, value the claim's UID), and the allocation-fence
ValidatingAdmissionPolicy (``deploy/helm/dra-driver/files``; the chart names it per release), which reads that
ConfigMap as its parameter, denies every new allocation of a ledger device to any other claim,
the scheduler's included. The scheduler then un-reserves the pod and tries another device.

Admission reads the ConfigMap through a cache, so a ledger write is not in force at once. Each
write therefore also carries a fresh sentinel device, and the controller proves the fence is up
with a dry-run allocation of its claim that includes the sentinel: the policy's denial naming
the sentinel shows that this API server enforces this ledger version. Only after that does the
controller check the claims a last time (any collision written before the fence is visible
then) and write its allocation. Entries stay while the claim holds the devices, so a scheduler
whose cache lags behind the allocation is still refused.

The ledger is one ConfigMap, and the API server refuses a ConfigMap whose data exceeds 1 MiB, so it
holds at most :data:`MAX_LEDGER_BYTES` (keys and values as the API server counts them; about 11,000
devices, docs/architecture.md). A reservation that would pass the bound is not written
(:func:`ledger_bytes`): the controller does not allocate that claim, says so, and leaves it to the
kube-scheduler until entries are released.

This module holds the pure parts: keys, ledger edits, the bound and the recognition of the denial.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from typing import Any

POLICY_FILE = "deploy/helm/dra-driver/files/allocation-fence-policy.yaml"
DEFAULT_LEDGER = "dra-driver-allocations"
FENCE_MESSAGE = "allocation fence:"
_SENTINEL_DEVICE = "probe"
MAX_LEDGER_BYTES = 1024 * 1024
"""The API server's limit on a ConfigMap's data (the sum of its keys' and values' lengths)."""

DeviceKey = tuple[str, str, str]


def ledger_key(driver: str, pool: str, device: str) -> str:
    """The ConfigMap key of a device (the policy computes the same).

    Drivers, pools and devices are DNS names without ``_``, and pools may hold ``/``, which a
    ConfigMap key may not: ``_`` separates the parts and stands for ``/``, so keys stay unique.
    """
    return f"{driver}_{pool.replace('/', '_')}_{device}"


def sentinel_driver(driver: str) -> str:
    return f"fence.{driver}"


def new_token() -> str:
    """A fresh sentinel pool name (a DNS label)."""
    return "gen-" + secrets.token_hex(8)


def sentinel_key(token: str, driver: str) -> str:
    """The ledger key of the sentinel device a write with ``token`` carries."""
    return ledger_key(sentinel_driver(driver), token, _SENTINEL_DEVICE)


def is_sentinel(key: str, driver: str) -> bool:
    return key.startswith(sentinel_driver(driver) + "_")


def with_reservation(data: Mapping[str, str], devices: Iterable[DeviceKey], uid: str, token: str,
                     driver: str) -> dict[str, str]:
    """Ledger data with ``devices`` held for ``uid`` and the sentinel replaced by ``token``'s."""
    out = {k: v for k, v in data.items() if not is_sentinel(k, driver)}
    for d in devices:
        out[ledger_key(*d)] = uid
    out[sentinel_key(token, driver)] = "fence"
    return out


def ledger_bytes(data: Mapping[str, str]) -> int:
    """The size of ledger data as the API server measures a ConfigMap's against its limit."""
    return sum(len(k.encode()) + len(v.encode()) for k, v in data.items())


def conflicting_entries(data: Mapping[str, str], devices: Iterable[DeviceKey], uid: str) -> list[str]:
    """Ledger keys among ``devices`` already held for another claim."""
    return [k for k in (ledger_key(*d) for d in devices) if k in data and data[k] != uid]


def without_keys(data: Mapping[str, str], keys: Iterable[str]) -> dict[str, str]:
    drop = set(keys)
    return {k: v for k, v in data.items() if k not in drop}


def keys_of(data: Mapping[str, str], uid: str) -> list[str]:
    return [k for k, v in data.items() if v == uid]


def stale_keys(data: Mapping[str, str], held: Mapping[str, set[str]], busy: set[str], driver: str) -> list[str]:
    """Entries no claim needs any more.

    ``held``: claim UID -> ledger keys of the devices its allocation holds, for every claim that
    exists; ``busy``: UIDs being allocated right now (their entries precede the allocation).
    """
    return [k for k, uid in data.items()
            if not is_sentinel(k, driver) and uid not in busy and k not in held.get(uid, set())]  # fmt: skip


def probe_allocation(allocation: Mapping[str, Any], token: str, driver: str) -> dict[str, Any]:
    """``allocation`` plus the sentinel device, for the dry-run that proves the fence is up.

    The sentinel comes first: the policy's message names the first refused device, so an
    up-to-date ledger names the sentinel even where a stale one would also refuse a real device.
    """
    devices = dict(allocation.get("devices") or {})
    results = list(devices.get("results") or [])
    request = str(results[0].get("request", "")) if results else ""
    sentinel = {"request": request, "driver": sentinel_driver(driver), "pool": token, "device": _SENTINEL_DEVICE}
    devices["results"] = [sentinel, *results]
    return {**allocation, "devices": devices}


def is_denial(message: str) -> bool:
    """Whether an API error message is the fence policy's denial (of any device)."""
    return FENCE_MESSAGE in message


def denial_names(message: str, key: str) -> bool:
    """Whether an API error message is the policy's denial for ledger key ``key``."""
    return is_denial(message) and key in message
