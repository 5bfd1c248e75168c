"""The devices a node publishes under ``--api-profile nvidia``: NVIDIA's DRA driver's names, attributes,
capacities and counters (from its kubelet plugin's code), every device one the API server accepts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from dra_driver.apiprofile import NVIDIA_PROFILE
from dra_driver.node.describe.devices import describe, enumerate_devices
from dra_driver.node.describe.shares import parse_consumable_shares
from dra_driver.node.discovery.model import Gpu, MigEngines
from dra_driver.node.discovery.simulated import SimulatedBackend
from dra_driver.node.publish.checker import check_device

DRIVER = "gpu.nvidia.com"
COMMON = {"type", "uuid", "productName", "brand", "architecture", "cudaComputeCapability", "driverVersion",
          "cudaDriverVersion", "resource.kubernetes.io/pciBusID", "resource.kubernetes.io/pcieRoot",
          "resource.kubernetes.io/numaNode"}
VERSIONS = ("cudaComputeCapability", "driverVersion", "cudaDriverVersion")
STRINGS = ("type", "uuid", "productName", "brand", "architecture")
ENGINES = ("copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines")


def gpus(profile: str) -> list[Gpu]:
    return SimulatedBackend(profile, "node-a").discover()


def published(profile: str, dynamic_mig: bool = False, shares: str = "disabled",
              renumber: bool = False) -> tuple[dict[str, dict[str, Any]], list[Any]]:
    found = gpus(profile)
    if renumber:  # minors that are not the NVML indexes, as on a machine whose /dev/nvidiaN skip numbers
        found = [replace(g, minor=g.index + 4) for g in found]
    devices = enumerate_devices(found, dynamic_mig, NVIDIA_PROFILE)
    devices_json, counters = describe(devices, DRIVER, dynamic_mig, parse_consumable_shares(shares), NVIDIA_PROFILE)
    for device in devices_json:
        assert check_device(device, DRIVER) == [], device["name"]
    return {str(d["name"]): dict(d) for d in devices_json}, counters


def test_static_mig_devices_are_named_by_profile_profile_id_and_placement() -> None:
    devices, counters = published("a100-mig")
    assert list(devices) == [
        "gpu-0-mig-1g5gb-19-0", "gpu-0-mig-1g5gb-19-1", "gpu-0-mig-2g10gb-14-2", "gpu-0-mig-3g20gb-9-4",
        "gpu-1-mig-7g40gb-0-0",
        "gpu-2-mig-4g20gb-5-0", "gpu-2-mig-1g10gb-15-4", "gpu-2-mig-1g10gb-15-6",
        "gpu-3",
    ]
    assert counters == []


def test_full_gpus_are_named_by_minor() -> None:
    devices, _ = published("h100-8x", renumber=True)
    assert list(devices) == [f"gpu-{i + 4}" for i in range(8)]
    devices, _ = published("a100-mig", renumber=True)
    assert "gpu-4-mig-1g5gb-19-0" in devices and "gpu-7" in devices


def test_attributes_are_nvidias_with_their_value_types() -> None:
    devices, _ = published("a100-mig")
    gpu, mig = devices["gpu-3"], devices["gpu-0-mig-2g10gb-14-2"]
    assert set(gpu["attributes"]) == COMMON
    assert set(mig["attributes"]) == COMMON | {"parentUUID", "profile"}
    for device in (gpu, mig):
        attributes = device["attributes"]
        assert all(set(attributes[name]) == {"version"} for name in VERSIONS)
        assert all(set(attributes[name]) == {"string"} for name in STRINGS)
    assert gpu["attributes"]["type"] == {"string": "gpu"} and mig["attributes"]["type"] == {"string": "mig"}
    assert mig["attributes"]["profile"] == {"string": "2g.10gb"}
    assert mig["attributes"]["parentUUID"] == {"string": gpus("a100-mig")[0].uuid}
    assert mig["attributes"]["uuid"]["string"].startswith("MIG-")
    assert gpu["attributes"]["cudaComputeCapability"] == {"version": "8.0.0"}


def test_mig_capacities_hold_the_engines_and_memory_slices() -> None:
    devices, _ = published("a100-mig")
    assert set(devices["gpu-3"]["capacity"]) == {"memory", "multiprocessors"}
    capacity = devices["gpu-0-mig-3g20gb-9-4"]["capacity"]
    assert set(capacity) == {"memory", "multiprocessors", *ENGINES, *(f"memorySlice{i}" for i in range(4, 8))}
    assert capacity["copyEngines"] == {"value": "3"} and capacity["memorySlice5"] == {"value": "1"}
    assert capacity["memory"] == {"value": "20096Mi"}


def test_dynamic_mig_counter_sets_are_named_and_counted_as_nvidias() -> None:
    devices, counters = published("h100-8x", dynamic_mig=True, renumber=True)
    assert [c["name"] for c in counters] == [f"gpu-{i + 4}-counter-set" for i in range(8)]
    names = set(counters[0]["counters"])
    assert {"memory", "multiprocessors", "copy-engines", "decoders", "encoders", "jpeg-engines",
            "ofa-engines"} <= names
    assert {n for n in names if n.startswith("memory-slice-")} == {f"memory-slice-{i}" for i in range(8)}
    mig = next(d for n, d in devices.items() if n.startswith("gpu-4-mig-1g10gb-19-"))
    consumed = mig["consumesCounters"][0]
    assert consumed["counterSet"] == "gpu-4-counter-set" and set(consumed["counters"]) <= names
    assert set(mig["capacity"]) == {"memory", "multiprocessors", *ENGINES}
    full = devices["gpu-4"]
    assert full["consumesCounters"][0]["counters"] == counters[0]["counters"]
    assert set(full["capacity"]) == {"memory", "multiprocessors", *ENGINES}


def test_engine_totals_never_refuse_a_layout_the_hardware_takes() -> None:
    gpu = gpus("h100-8x")[0]
    small = gpu.mig_profiles[0]
    gpu = replace(gpu, mig_profiles=(replace(small, engines=MigEngines(copy_engines=1, decoders=1)),
                                     *gpu.mig_profiles[1:]))
    devices = enumerate_devices([gpu], True, NVIDIA_PROFILE)
    _, counters = describe(devices, DRIVER, True, profile=NVIDIA_PROFILE)
    slots = max(p.start + p.size for p in small.placements) // small.memory_slices
    assert int(counters[0]["counters"]["decoders"]["value"]) >= slots


@pytest.mark.parametrize(("mode", "default", "minimum"), [("memory", "20096Mi", "1Mi"), ("unlimited", "0", "0"),
                                                          ("4", "0", "0")])
def test_consumable_shares_are_nvidias_modes_in_1mi_steps(mode: str, default: str, minimum: str) -> None:
    devices, _ = published("a100-mig", shares=mode)
    shared = devices["gpu-0-mig-3g20gb-9-4"]
    assert shared["allowMultipleAllocations"] is True
    memory = shared["capacity"]["memory"]
    assert memory["requestPolicy"] == {"default": default, "validRange": {"min": minimum, "step": "1Mi",
                                                                          "max": "20096Mi"}}
    if mode == "4":
        assert shared["capacity"]["shares"] == {"value": "4", "requestPolicy": {
            "default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}}}
    else:
        assert "shares" not in shared["capacity"]


def test_two_compute_instances_of_one_gpu_instance_are_told_apart() -> None:
    gpu = gpus("a100-mig")[1]  # 7g.40gb
    whole = gpu.mig_devices[0]
    halves = (replace(whole, uuid="MIG-a", profile="3c.7g.40gb", compute_instance_id=0),
              replace(whole, uuid="MIG-b", profile="3c.7g.40gb", compute_instance_id=1))
    devices = enumerate_devices([replace(gpu, mig_devices=halves)], False, NVIDIA_PROFILE)
    assert list(devices) == ["gpu-1-mig-3c7g40gb-0-0", "gpu-1-mig-3c7g40gb-0-0-ci1"]
