"""NVIDIA's DRA driver's opaque configuration API, ``resource.nvidia.com/v1beta1``, decoded into this
driver's sharing model (:class:`~dra_driver.gpuconfig.SharingConfig`).

Claims written for NVIDIA's driver carry, in ``config[].opaque.parameters``::

    {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
     "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}}

Two kinds have a counterpart here: ``GpuConfig`` (full GPUs: ``sharing.strategy`` ``TimeSlicing``
with ``timeSlicingConfig.interval``, or ``MPS`` with ``mpsConfig``) and ``MigDeviceConfig`` (MIG
devices: ``sharing.strategy`` and ``mpsConfig``, no interval: a time-slice is the whole GPU's).
Decoding is as strict as NVIDIA's: an unknown field, a wrong type or a value out of range is a
:class:`~dra_driver.gpuconfig.ConfigError` naming the field, and the combinations their driver
refuses are refused (``mpsConfig`` with TimeSlicing, ``timeSlicingConfig`` with MPS, a sharing
without a strategy). Where this driver refuses more than theirs, the message says why and
``docs/nvidia-config.md`` lists each case.

The other kinds of their API are features this driver does not have (VFIO passthrough,
ComputeDomains/IMEX): a config of one of them is refused by its kind, so a claim never gets
something else than it asked for.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dra_driver.gpuconfig import (
    EXCLUSIVE,
    ConfigError,
    MpsSettings,
    SharingConfig,
    Strategy,
    TimeSliceInterval,
    decode_memory_limit,
    decode_percentage,
    enum_value,
    join_path,
    strict_object,
    type_name,
)

API_VERSION = "resource.nvidia.com/v1beta1"


class Kind(StrEnum):
    """The kinds of NVIDIA's API this driver decodes, and the devices each applies to."""

    GPU_CONFIG = "GpuConfig"
    MIG_DEVICE_CONFIG = "MigDeviceConfig"

    @property
    def for_mig(self) -> bool:
        return self is Kind.MIG_DEVICE_CONFIG


UNSUPPORTED_KINDS: Mapping[str, str] = {
    "VfioDeviceConfig": "VFIO passthrough (class vfio.gpu.nvidia.com)",
    "ComputeDomainChannelConfig": "ComputeDomains (IMEX channels)",
    "ComputeDomainDaemonConfig": "ComputeDomains (IMEX daemons)",
    "ComputeDomain": "ComputeDomains (IMEX)",
    "ComputeDomainClique": "ComputeDomains (IMEX)",
}
"""The other kinds NVIDIA's API group registers, and the feature of their driver each belongs to."""


class NvidiaStrategy(StrEnum):
    """NVIDIA's sharing strategies: there is no Exclusive one, a config without ``sharing`` is."""

    TIME_SLICING = "TimeSlicing"
    MPS = "MPS"


_SHARING_FIELDS: Mapping[Kind, tuple[str, ...]] = {
    Kind.GPU_CONFIG: ("strategy", "timeSlicingConfig", "mpsConfig"),
    Kind.MIG_DEVICE_CONFIG: ("strategy", "mpsConfig"),
}
_MPS_FIELDS = ("defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit",
               "defaultPerDevicePinnedMemoryLimit", "multiUser")
_DEVICE_KEY = re.compile(r"[0-9]{1,9}|(?:GPU|MIG)-[0-9A-Za-z-]{1,64}")
"""A key of ``defaultPerDevicePinnedMemoryLimit``: the device's index among the config's devices,
or its UUID (NVIDIA reads a key as a UUID first, then as an index)."""


@dataclass(frozen=True)
class MemoryLimit:
    text: str
    """The quantity as the user wrote it."""
    bytes: int


@dataclass(frozen=True)
class NvidiaConfig:
    """A decoded ``GpuConfig`` or ``MigDeviceConfig`` of NVIDIA's API."""

    kind: Kind
    sharing: SharingConfig
    """With MPS, the limits every device gets unless ``per_device_pinned_memory`` names it."""
    per_device_pinned_memory: tuple[tuple[str, MemoryLimit], ...] = ()
    """``defaultPerDevicePinnedMemoryLimit``, sorted by key; resolved against the devices the config
    applies to by :mod:`dra_driver.opaqueconfig`."""


def is_nvidia(parameters: Any) -> bool:
    """Whether opaque parameters say they are in NVIDIA's API."""
    return isinstance(parameters, Mapping) and parameters.get("apiVersion") == API_VERSION


def _kind(value: Any) -> Kind:
    if value is None:
        raise ConfigError("kind", f"must be set: {Kind.GPU_CONFIG.value} or {Kind.MIG_DEVICE_CONFIG.value}")
    if isinstance(value, str) and value in UNSUPPORTED_KINDS:
        raise ConfigError("kind", f"{value} is NVIDIA's {UNSUPPORTED_KINDS[value]}, which this driver does not "
                                  f"support; it prepares {Kind.GPU_CONFIG.value} and {Kind.MIG_DEVICE_CONFIG.value} only")
    kind: Kind = enum_value(value, "kind", Kind)
    return kind


def _per_device(value: Any, path: str) -> tuple[tuple[str, MemoryLimit], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ConfigError(path, f"must be an object of device index or UUID to quantity, got {type_name(value)}")
    out: list[tuple[str, MemoryLimit]] = []
    for key, limit in value.items():
        if not isinstance(key, str) or not _DEVICE_KEY.fullmatch(key):
            raise ConfigError(join_path(path, key if isinstance(key, str) and key else repr(key)),
                              "must name a device by its index among the config's devices (0, 1, ...) or its "
                              "UUID (GPU-... or MIG-...)")
        text, amount = decode_memory_limit(_quantity_text(limit), join_path(path, key))
        out.append((key, MemoryLimit(text, amount)))
    return tuple(sorted(out))


def _decode_mps(value: Any, path: str) -> tuple[MpsSettings, tuple[tuple[str, MemoryLimit], ...]]:
    if value is None:
        return MpsSettings(), ()
    obj = strict_object(value, path, _MPS_FIELDS)
    multi_user = obj.get("multiUser")
    if multi_user is not None and not isinstance(multi_user, bool):
        raise ConfigError(join_path(path, "multiUser"), f"must be a boolean, got {type_name(multi_user)}")
    if multi_user:
        raise ConfigError(join_path(path, "multiUser"),
                          "multi-user MPS (nvidia-cuda-mps-control -M) is not supported by this driver; "
                          "leave it unset or false")
    pct = obj.get("defaultActiveThreadPercentage")
    # NVIDIA's API lets 0 through; a client with no threads runs nothing, so 0 is refused here.
    percentage = None if pct is None else decode_percentage(pct, join_path(path, "defaultActiveThreadPercentage"))
    mem = obj.get("defaultPinnedDeviceMemoryLimit")
    text, amount = (None, None) if mem is None else decode_memory_limit(
        _quantity_text(mem), join_path(path, "defaultPinnedDeviceMemoryLimit"))
    per_device = _per_device(obj.get("defaultPerDevicePinnedMemoryLimit"),
                             join_path(path, "defaultPerDevicePinnedMemoryLimit"))
    return MpsSettings(percentage, text, amount), per_device


def _quantity_text(value: Any) -> Any:
    """A JSON number is a quantity in NVIDIA's API (Go's resource.Quantity reads both forms)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _decode_sharing(value: Any, kind: Kind) -> tuple[SharingConfig, tuple[tuple[str, MemoryLimit], ...]]:
    if value is None:
        return EXCLUSIVE, ()
    path = "sharing"
    obj = strict_object(value, path, _SHARING_FIELDS[kind])
    raw = obj.get("strategy")
    if raw is None:
        raise ConfigError(join_path(path, "strategy"), "must be set: TimeSlicing or MPS (leave out sharing for "
                                                       "a device that is not shared)")
    strategy: NvidiaStrategy = enum_value(raw, join_path(path, "strategy"), NvidiaStrategy)
    ts_path, mps_path = join_path(path, "timeSlicingConfig"), join_path(path, "mpsConfig")
    if strategy is NvidiaStrategy.TIME_SLICING:
        if obj.get("mpsConfig") is not None:
            raise ConfigError(mps_path, "cannot be used with strategy TimeSlicing")
        interval = TimeSliceInterval.DEFAULT
        if obj.get("timeSlicingConfig") is not None:
            ts = strict_object(obj["timeSlicingConfig"], ts_path, ("interval",))
            if ts.get("interval") is not None:
                interval = enum_value(ts["interval"], join_path(ts_path, "interval"), TimeSliceInterval)
        return SharingConfig(Strategy.TIME_SLICING, interval, None), ()
    if obj.get("timeSlicingConfig") is not None:
        raise ConfigError(ts_path, "cannot be used with strategy MPS")
    mps, per_device = _decode_mps(obj.get("mpsConfig"), mps_path)
    return SharingConfig(Strategy.MPS, None, mps), per_device


def decode(parameters: Any) -> NvidiaConfig:
    """Strictly decode opaque parameters in NVIDIA's API; ConfigError names the offending field."""
    if not isinstance(parameters, Mapping):
        raise ConfigError("", f"must be an object, got {type_name(parameters)}")
    if parameters.get("apiVersion") != API_VERSION:
        raise ConfigError("apiVersion", f"must be {API_VERSION!r}, got {parameters.get('apiVersion')!r}")
    # The kind first: another kind of NVIDIA's API has other fields, and its answer is its kind.
    kind = _kind(parameters.get("kind"))
    obj = strict_object(parameters, "", ("apiVersion", "kind", "sharing"))
    sharing, per_device = _decode_sharing(obj.get("sharing"), kind)
    return NvidiaConfig(kind, sharing, per_device)
