"""Describe: turn discovered GPUs into the node's allocatable devices.

Every device the plugin publishes in a ResourceSlice has one ``AllocatableDevice`` here, under the
same name; prepare looks devices up by that name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from dra_driver.apiprofile import OWN, ApiProfile
from dra_driver.apiprofile import profile_label as profile_label
from dra_driver.k8s.bodies import CounterSet, RawDevice
from dra_driver.k8s.names import is_dns_label
from dra_driver.k8s.quantity import format_canonical
from dra_driver.node.describe.shares import DISABLED, ConsumableShares, shared_capacity
from dra_driver.node.discovery.model import Gpu, MigDevice, MigEngines, MigPlacement, MigProfile, gi_profile_id


@dataclass(frozen=True)
class AllocatableDevice:
    name: str
    """DNS label, unique within the node's pool."""
    gpu: Gpu
    """The full GPU, or the parent of a MIG device."""
    mig: MigDevice | None = None
    """A static MIG instance that exists."""
    mig_profile: MigProfile | None = None
    """Dynamic MIG: the profile whose instance is created at prepare time."""
    placement: MigPlacement | None = None
    """Dynamic MIG: where on the parent the instance goes."""

    @property
    def kind(self) -> str:
        return "gpu" if self.mig is None and self.mig_profile is None else "mig"


# --- enumerate: discovered GPUs → named allocatable devices -------------------------------------

def gpu_device_name(gpu: Gpu, profile: ApiProfile = OWN) -> str:
    return profile.gpu_device_name(gpu.index, gpu.minor)


def static_mig_device_name(gpu: Gpu, mig: MigDevice, profile: ApiProfile = OWN) -> str:
    gi_profile = gpu_mig_profile(gpu, mig.profile)
    profile_id = mig.profile_id if mig.profile_id is not None else gi_profile_id(gi_profile) if gi_profile else 0
    return profile.static_mig_device_name(gpu.index, gpu.minor, gpu_instance_id=mig.gpu_instance_id,
                                          compute_instance_id=mig.compute_instance_id, profile=mig.profile,
                                          profile_id=profile_id, placement_start=mig.placement.start)


def gpu_mig_profile(gpu: Gpu, name: str) -> MigProfile | None:
    return next((p for p in gpu.mig_profiles if p.name == name), None)


def dynamic_mig_device_name(gpu: Gpu, mig_profile: MigProfile, placement: MigPlacement,
                            profile: ApiProfile = OWN) -> str:
    return profile.dynamic_mig_device_name(gpu.index, gpu.minor, profile=mig_profile.name,
                                           profile_id=gi_profile_id(mig_profile), placement_start=placement.start)


def counter_set_name(gpu: Gpu, profile: ApiProfile = OWN) -> str:
    return profile.counter_set_name(gpu.index, gpu.minor)


def enumerate_devices(gpus: Sequence[Gpu], dynamic_mig: bool, profile: ApiProfile = OWN) -> dict[str, AllocatableDevice]:
    """Every device this node publishes, by name (``profile``'s), in publishing (= allocation
    preference) order. In this driver's own names:

    * MIG disabled: the full GPU ``gpu-<index>``.
    * MIG enabled, static MIG: one device per existing MIG instance ``gpu-<index>-mig-<gi>-<ci>``;
      the full GPU is not published (it is partitioned).
    * dynamic MIG on a MIG-capable GPU with a known profile catalogue: the full GPU plus every
      profile x placement ``gpu-<index>-mig-<profile>-<start>``; existing instances are not
      published separately (the prepare path owns their life cycle).

    In NVIDIA's (:mod:`dra_driver.apiprofile`), the number is the minor and every MIG device is
    ``gpu-<minor>-mig-<profile>-<GI profile ID>-<start>``.
    """
    devices: dict[str, AllocatableDevice] = {}

    def add(device: AllocatableDevice) -> None:
        if not is_dns_label(device.name):
            raise ValueError(f"device name {device.name!r} is not a DNS label")
        if device.name in devices:
            raise ValueError(f"duplicate device name {device.name!r}")
        devices[device.name] = device

    for gpu in sorted(gpus, key=lambda g: g.index):
        if dynamic_mig and gpu.mig_capable and gpu.mig_profiles:
            add(AllocatableDevice(name=gpu_device_name(gpu, profile), gpu=gpu))
            for mig_profile in gpu.mig_profiles:
                for placement in mig_profile.placements:
                    add(AllocatableDevice(name=dynamic_mig_device_name(gpu, mig_profile, placement, profile), gpu=gpu,
                                          mig_profile=mig_profile, placement=placement))
        elif gpu.mig_enabled:
            for mig in gpu.mig_devices:
                name = static_mig_device_name(gpu, mig, profile)
                if name in devices and profile.mig_names_by_profile_id:
                    # NVIDIA's name says the GPU instance, not the compute instance: a second compute
                    # instance of one GPU instance is told apart by its ID (NVIDIA's plugin has no name for it).
                    name = f"{name}-ci{mig.compute_instance_id}"
                add(AllocatableDevice(name=name, gpu=gpu, mig=mig, placement=mig.placement))
        else:
            add(AllocatableDevice(name=gpu_device_name(gpu, profile), gpu=gpu))
    return devices


# --- describe: allocatable devices → resource.k8s.io/v1 Device dicts -----------------------------

MAX_ATTRIBUTE_VALUE_LENGTH = 64
"""Bytes, as the API server counts them."""
MAX_COUNTERS_PER_SET = 32
STANDARD_PREFIX = "resource.kubernetes.io/"
ATTR_PCI_BUS_ID = STANDARD_PREFIX + "pciBusID"
ATTR_PCIE_ROOT = STANDARD_PREFIX + "pcieRoot"
ATTR_NUMA_NODE = STANDARD_PREFIX + "numaNode"

_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


def to_semver(version: str) -> str:
    """``580.95.05`` → ``580.95.5``, ``9.0`` → ``9.0.0``, ``13.0`` → ``13.0.0`` (valid semver 2.0.0).

    A fourth and later number go into the build metadata: ``6.19.14.31400000`` →
    ``6.19.14+31400000``, which orders and compares by its first three numbers (Kubernetes 1.38
    ignores build metadata in matchAttribute, as semver does).
    """
    parts = version.strip().split(".")
    if not parts or not all(p.isascii() and p.isdigit() for p in parts):
        raise ValueError(f"cannot express version {version!r} as semver")
    numbers = [str(int(p)) for p in parts[:3]] + ["0"] * (3 - len(parts[:3]))
    result = ".".join(numbers) + (f"+{'.'.join(parts[3:])}" if len(parts) > 3 else "")
    if not _SEMVER.match(result) or len(result) > MAX_ATTRIBUTE_VALUE_LENGTH:
        raise ValueError(f"cannot express version {version!r} as semver")
    return result


def _version(text: str) -> dict[str, str]:
    """A version attribute. One that cannot be expressed as semver is published as it is, so that
    the publisher's checker withholds the device and says why (rather than the plugin stopping)."""
    try:
        return {"version": to_semver(text)}
    except ValueError:
        return {"version": text}


def is_semver(text: str) -> bool:
    return bool(_SEMVER.match(text))


def _string(value: str) -> dict[str, Any]:
    """A string attribute, cut to the API server's 64 bytes at a character boundary."""
    cut = value.encode("utf-8", "surrogatepass")[:MAX_ATTRIBUTE_VALUE_LENGTH]
    return {"string": cut.decode("utf-8", "ignore")}


def _common_attributes(gpu: Gpu) -> dict[str, dict[str, Any]]:
    attrs: dict[str, dict[str, Any]] = {
        "productName": _string(gpu.product_name),
        "brand": _string(gpu.brand),
        "architecture": _string(gpu.architecture),
        "cudaComputeCapability": _version(gpu.cuda_compute_capability),
        "driverVersion": _version(gpu.driver_version),
        "cudaDriverVersion": _version(gpu.cuda_driver_version),
        ATTR_PCI_BUS_ID: _string(gpu.pci.bus_id),
    }
    if gpu.pci.pcie_root is not None:
        attrs[ATTR_PCIE_ROOT] = _string(gpu.pci.pcie_root)
    if gpu.pci.numa_node is not None:
        attrs[ATTR_NUMA_NODE] = {"int": gpu.pci.numa_node}
    return attrs


def _counter(value: int, binary: bool = False) -> dict[str, str]:
    return {"value": format_canonical(value, binary=binary)}


ENGINE_CAPACITIES = ("copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines")
"""NVIDIA's capacity names of a MIG device's engines, in MigEngines' order."""
ENGINE_COUNTERS = ("copy-engines", "decoders", "encoders", "jpeg-engines", "ofa-engines")
"""The same, as NVIDIA's counter names (a counter name is a DNS label)."""


def _engine_values(engines: MigEngines) -> tuple[int, ...]:
    return (engines.copy_engines, engines.decoders, engines.encoders, engines.jpeg_engines, engines.ofa_engines)


def gpu_engine_totals(gpu: Gpu) -> tuple[int, ...]:
    """Each engine count of a GPU as its counter set holds it: at least what any valid MIG layout can
    use (the largest count per memory slice of any profile, over all slices), and at least the largest
    profile's."""
    profiles = gpu.mig_profiles
    slices = max(p.start + p.size for prof in profiles for p in prof.placements)
    totals = []
    for i in range(len(ENGINE_COUNTERS)):
        per_slice = max(-(-_engine_values(p.engines)[i] * slices // p.memory_slices) for p in profiles)
        totals.append(max(per_slice, *(_engine_values(p.engines)[i] for p in profiles)))
    return tuple(totals)


def gpu_counter_values(gpu: Gpu, profile: ApiProfile = OWN) -> dict[str, dict[str, str]]:
    """The counters of a GPU's counter set (= what its full-GPU device consumes).

    ``memory-slice-<i>`` (value 1) for each of the GPU's memory slices makes overlapping
    placements mutually exclusive; ``compute-slices``, ``multiprocessors`` and ``memory`` (and in
    NVIDIA's profile the engine counts) bound the sums. Their totals are at least what any valid MIG
    layout can use, so they never reject a layout the hardware accepts.
    """
    profiles = gpu.mig_profiles
    slices = max(p.start + p.size for prof in profiles for p in prof.placements)
    compute = max(prof.compute_slices for prof in profiles)
    memory = max([gpu.memory_bytes, *(prof.memory_bytes for prof in profiles if prof.compute_slices == compute)])
    mps = max([gpu.multiprocessors, *(prof.multiprocessors for prof in profiles)])
    counters = {
        "memory": _counter(memory, binary=True),
        "multiprocessors": _counter(mps),
        "compute-slices": _counter(compute),
    }
    if profile.engine_counters:
        counters.update({name: _counter(value) for name, value in zip(ENGINE_COUNTERS, gpu_engine_totals(gpu),
                                                                      strict=True)})
    for i in range(slices):
        counters[f"memory-slice-{i}"] = _counter(1)
    return counters


def mig_counter_values(mig_profile: MigProfile, placement: MigPlacement,
                       profile: ApiProfile = OWN) -> dict[str, dict[str, str]]:
    counters = {
        "memory": _counter(mig_profile.memory_bytes, binary=True),
        "multiprocessors": _counter(mig_profile.multiprocessors),
        "compute-slices": _counter(mig_profile.compute_slices),
    }
    if profile.engine_counters:
        counters.update({name: _counter(value) for name, value in zip(ENGINE_COUNTERS,
                                                                      _engine_values(mig_profile.engines), strict=True)})
    for i in range(placement.start, placement.start + placement.size):
        counters[f"memory-slice-{i}"] = _counter(1)
    return counters


def is_shareable(device: AllocatableDevice, dynamic_mig: bool) -> bool:
    """Whether ``--consumable-shares`` publishes the device for several claims: full GPUs and static
    MIG devices; never a GPU whose partitions are made per claim (dynamic MIG) nor those partitions."""
    if device.mig_profile is not None:
        return False
    return device.mig is not None or not (dynamic_mig and device.gpu.mig_capable and bool(device.gpu.mig_profiles))


def device_attributes(device: AllocatableDevice, profile: ApiProfile = OWN) -> dict[str, dict[str, Any]]:
    """The device's ``attributes`` as its ResourceSlice publishes them (also what a container's device
    metadata file lists). NVIDIA's profile publishes no ``index``, ``minor`` or ``parentIndex``."""
    gpu = device.gpu
    attrs = _common_attributes(gpu)
    if device.kind == "gpu":
        attrs.update({
            "type": _string("gpu"),
            "uuid": _string(gpu.uuid),
        })
        if profile.numbering_attributes:
            attrs.update({"index": {"int": gpu.index}, "minor": {"int": gpu.minor}})
        return attrs
    attrs.update({
        "type": _string("mig"),
        "parentUUID": _string(gpu.uuid),
    })
    if profile.numbering_attributes:
        attrs["parentIndex"] = {"int": gpu.index}
    if device.mig is not None:
        attrs["uuid"] = _string(device.mig.uuid)
        attrs["profile"] = _string(device.mig.profile)
    elif device.mig_profile is not None:
        attrs["profile"] = _string(device.mig_profile.name)
    return attrs


def describe_device(device: AllocatableDevice, dynamic_mig: bool = False,
                    shares: ConsumableShares = DISABLED, profile: ApiProfile = OWN) -> dict[str, Any]:
    """One resource.k8s.io/v1 ``Device`` (as a JSON-ready dict) for an allocatable device.

    NVIDIA's profile adds the MIG devices' engine counts (``copyEngines``, ``decoders``, ``encoders``,
    ``jpegEngines``, ``ofaEngines``), a static MIG device's ``memorySlice<i>`` (1 each) and, on a GPU
    whose MIG devices are made per claim, the GPU's engine totals, as NVIDIA's plugin publishes them.
    A device shared with ``--consumable-shares`` has the shares' capacities only (memory,
    multiprocessors, shares), in both profiles: a capacity without a request policy would be consumed
    whole by every claim."""
    gpu = device.gpu
    attrs = device_attributes(device, profile)
    capacity: dict[str, dict[str, str]] = {}
    result: dict[str, Any] = {"name": device.name}
    partitionable = dynamic_mig and gpu.mig_capable and bool(gpu.mig_profiles)
    engines = profile.mig_engine_capacities
    if device.kind == "gpu":
        capacity["memory"] = _counter(gpu.memory_bytes, binary=True)
        if gpu.multiprocessors > 0:
            capacity["multiprocessors"] = _counter(gpu.multiprocessors)
        if partitionable:
            if engines:
                capacity.update(_engine_capacity(gpu_engine_totals(gpu)))
            result["consumesCounters"] = [{"counterSet": counter_set_name(gpu, profile),
                                           "counters": gpu_counter_values(gpu, profile)}]
    else:
        if device.mig is not None:
            capacity["memory"] = _counter(device.mig.memory_bytes, binary=True)
            capacity["multiprocessors"] = _counter(device.mig.multiprocessors)
            if engines:
                capacity.update(_engine_capacity(_engine_values(device.mig.engines)))
                placement = device.mig.placement
                for i in range(placement.start, placement.start + placement.size):
                    capacity[f"memorySlice{i}"] = _counter(1)
        else:
            assert device.mig_profile is not None and device.placement is not None
            capacity["memory"] = _counter(device.mig_profile.memory_bytes, binary=True)
            capacity["multiprocessors"] = _counter(device.mig_profile.multiprocessors)
            if engines:
                capacity.update(_engine_capacity(_engine_values(device.mig_profile.engines)))
            result["consumesCounters"] = [{
                "counterSet": counter_set_name(gpu, profile),
                "counters": mig_counter_values(device.mig_profile, device.placement, profile),
            }]
    result["attributes"] = attrs
    if shares.enabled and is_shareable(device, dynamic_mig):
        result["allowMultipleAllocations"] = True
        memory, multiprocessors = device_totals(device)
        capacity = shared_capacity(memory, multiprocessors, shares, profile.shares_memory_step)
    result["capacity"] = capacity
    return result


def _engine_capacity(values: Sequence[int]) -> dict[str, dict[str, str]]:
    return {name: _counter(value) for name, value in zip(ENGINE_CAPACITIES, values, strict=True)}


def device_totals(device: AllocatableDevice) -> tuple[int, int]:
    """(memory bytes, multiprocessors) the device publishes as capacity."""
    if device.mig is not None:
        return device.mig.memory_bytes, device.mig.multiprocessors
    if device.mig_profile is not None:
        return device.mig_profile.memory_bytes, device.mig_profile.multiprocessors
    return device.gpu.memory_bytes, device.gpu.multiprocessors


def describe(devices: Mapping[str, AllocatableDevice], driver_name: str, dynamic_mig: bool,
             shares: ConsumableShares = DISABLED, profile: ApiProfile = OWN) -> tuple[list[RawDevice], list[CounterSet]]:
    """(devices, shared counter sets) as resource.k8s.io/v1 JSON, in publishing order.

    Attribute and capacity names are unqualified, i.e. in the driver's domain (``driver_name``),
    except the standard ``resource.kubernetes.io/`` ones.
    """
    if not driver_name:
        raise ValueError("driver name is required")
    devices_json = [describe_device(d, dynamic_mig, shares, profile) for d in devices.values()]
    counter_sets: dict[str, dict[str, Any]] = {}
    for device in devices.values():
        gpu = device.gpu
        name = counter_set_name(gpu, profile)
        if dynamic_mig and gpu.mig_capable and gpu.mig_profiles and name not in counter_sets:
            counter_sets[name] = {"name": name, "counters": gpu_counter_values(gpu, profile)}
    for counter_set in counter_sets.values():
        if len(counter_set["counters"]) > MAX_COUNTERS_PER_SET:
            raise ValueError(f"counter set {counter_set['name']} has more than {MAX_COUNTERS_PER_SET} counters")
    return cast(list[RawDevice], devices_json), cast(list[CounterSet], list(counter_sets.values()))
