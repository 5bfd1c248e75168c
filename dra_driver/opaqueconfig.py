"""Which opaque config applies to each device a claim was allocated, in either API this driver reads.

A config entry is this driver's when its ``opaque.driver`` is the running driver's name (under
``--api-profile nvidia`` that is ``gpu.nvidia.com``). Its ``apiVersion`` then says which API it is
in, and both are accepted under every profile: this driver's own ``gpu.dra-driver.io/v1alpha1``
(:mod:`dra_driver.gpuconfig`) and NVIDIA's ``resource.nvidia.com/v1beta1``
(:mod:`dra_driver.nvidiaconfig`). Both become the same :class:`~dra_driver.gpuconfig.SharingConfig`,
which the node prepares and the controller validates alike.

For one device, the entries that apply to its request are taken in the order
:func:`~dra_driver.gpuconfig.matching_configs` gives (class before claim, later wins), every one of
them decoded strictly. NVIDIA's kinds apply to one type of device each, as in their driver: a
``GpuConfig`` to full GPUs, a ``MigDeviceConfig`` to MIG devices. An entry of the other type is
passed over when it names no requests and is an error when it names the device's request. This
driver's ``GpuConfig`` applies to both. With no entry, a device is not shared (Exclusive).

NVIDIA's ``defaultPerDevicePinnedMemoryLimit`` names devices by UUID or by index among the devices
the entry applies to in the claim, in UUID order (their MPS daemon's device list); each device's
own limit is resolved here, so the node sees one MPS limit per device as with this driver's API.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dra_driver import CONFIG_API_VERSION, gpuconfig, nvidiaconfig
from dra_driver.gpuconfig import EXCLUSIVE, ConfigError, GpuConfig, MatchedConfig, SharingConfig, Strategy, matching_configs
from dra_driver.nvidiaconfig import NvidiaConfig

Decoded = GpuConfig | NvidiaConfig
API_VERSIONS = (CONFIG_API_VERSION, nvidiaconfig.API_VERSION)


def decode(parameters: Any) -> Decoded:
    """Strictly decode one entry's ``opaque.parameters`` in the API its ``apiVersion`` names."""
    if nvidiaconfig.is_nvidia(parameters):
        return nvidiaconfig.decode(parameters)
    if isinstance(parameters, Mapping) and parameters.get("apiVersion") != CONFIG_API_VERSION:
        version = parameters.get("apiVersion")
        got = "nothing" if version is None else repr(version)
        raise ConfigError("apiVersion", f"must be {CONFIG_API_VERSION!r} or {nvidiaconfig.API_VERSION!r}, got {got}")
    return gpuconfig.decode(parameters)


class RequestConfigError(ConfigError):
    """A config that cannot be applied to a device of ``request``; the path is the entry's field."""

    def __init__(self, request: str, error: ConfigError) -> None:
        super().__init__(error.path, error.detail)
        self.request = request


@dataclass(frozen=True)
class Target:
    """One allocation result of this driver, as the configs see it."""

    request: str
    device: str
    mig: bool
    """A MIG device (NVIDIA's ``MigDeviceConfig`` applies), or a full GPU (their ``GpuConfig``)."""
    uuid: str
    """The device's UUID (a MIG device's own); empty while a dynamic MIG device is not created."""


def _entry_path(index: int) -> str:
    return f"devices.config[{index}].opaque.parameters"


def _applies(match: MatchedConfig, config: Decoded, target: Target) -> bool:
    if not isinstance(config, NvidiaConfig) or config.kind.for_mig == target.mig:
        return True
    if not match.requests:
        return False
    what = "a MIG device" if target.mig else "a full GPU"
    right = nvidiaconfig.Kind.MIG_DEVICE_CONFIG if target.mig else nvidiaconfig.Kind.GPU_CONFIG
    raise RequestConfigError(target.request, ConfigError(
        f"{_entry_path(match.index)}.kind",
        f"{config.kind.value} cannot be applied to device {target.device!r} of request {target.request!r}, "
        f"{what}; use {right.value}"))


def _winner(configs: Sequence[Any] | None, target: Target, driver: str,
            decoded: dict[int, Decoded]) -> tuple[int, Decoded] | None:
    """The entry that applies to ``target``, or None (Exclusive)."""
    matches = matching_configs(configs, target.request, driver)
    for match in matches:  # every matching entry decodes, even one a later entry overrides
        if match.index not in decoded:
            try:
                decoded[match.index] = decode(match.parameters)
            except ConfigError as exc:
                raise RequestConfigError(target.request, exc.under(_entry_path(match.index))) from None
    for match in reversed(matches):
        if _applies(match, decoded[match.index], target):
            return match.index, decoded[match.index]
    return None


def _device_limits(index: int, config: NvidiaConfig, group: Sequence[Target]) -> dict[str, nvidiaconfig.MemoryLimit]:
    """UUID -> pinned-memory limit, for the devices of ``group`` that ``per_device_pinned_memory`` names."""
    path = f"{_entry_path(index)}.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit"
    missing = [t for t in group if not t.uuid]
    if missing:
        raise RequestConfigError(missing[0].request, ConfigError(
            path, f"device {missing[0].device!r} has no UUID before it is created (a dynamic MIG device); "
                  "set defaultPinnedDeviceMemoryLimit instead"))
    uuids = sorted({t.uuid for t in group})
    limits: dict[str, nvidiaconfig.MemoryLimit] = {}
    named_by: dict[str, str] = {}
    for key, limit in config.per_device_pinned_memory:
        if key in uuids:
            uuid = key
        elif key.isdigit() and int(key) < len(uuids):
            uuid = uuids[int(key)]
        else:
            raise RequestConfigError(group[0].request, ConfigError(
                f"{path}.{key}", f"names no device of this config, which applies to {len(uuids)} device(s): "
                                 f"indices 0 to {len(uuids) - 1} or UUIDs {', '.join(uuids)}"))
        if uuid in named_by:
            raise RequestConfigError(group[0].request, ConfigError(
                f"{path}.{key}", f"names device {uuid}, which {named_by[uuid]!r} names too"))
        named_by[uuid] = key
        limits[uuid] = limit
    return limits


def resolve_sharing(configs: Sequence[Any] | None, targets: Sequence[Target], driver: str) -> list[SharingConfig]:
    """Each target's sharing, in order; RequestConfigError names the request and the entry's field."""
    decoded: dict[int, Decoded] = {}
    winners = [_winner(configs, t, driver, decoded) for t in targets]
    groups: dict[int, list[Target]] = {}
    for target, won in zip(targets, winners, strict=True):
        if won is not None:
            groups.setdefault(won[0], []).append(target)
    out: list[SharingConfig] = []
    limits_of: dict[int, dict[str, nvidiaconfig.MemoryLimit]] = {}
    for target, won in zip(targets, winners, strict=True):
        if won is None:
            out.append(EXCLUSIVE)
            continue
        index, config = won
        if isinstance(config, GpuConfig):
            out.append(config.sharing)
            continue
        sharing = config.sharing
        if config.per_device_pinned_memory and sharing.strategy is Strategy.MPS and sharing.mps is not None:
            if index not in limits_of:
                limits_of[index] = _device_limits(index, config, groups[index])
            own = limits_of[index].get(target.uuid)
            if own is not None:
                sharing = replace(sharing, mps=replace(sharing.mps, default_pinned_device_memory_limit=own.text,
                                                       default_pinned_device_memory_limit_bytes=own.bytes))
        out.append(sharing)
    return out
