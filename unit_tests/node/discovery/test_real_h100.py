"""What a real H100 reported, checked against what NVIDIA's own tool said on the same machine.

``unit_tests/node/fixtures/h100-real/`` was recorded on 2026-11-27 on a lent machine (one NVIDIA H100
80GB HBM3, driver 580.159.04, MIG disabled, a Firecracker VM) with ``e2e/gpuprobe`` (docs/nvml.md,
"On a real GPU"): ``gpus.json`` is ``python -m dra_driver.node.discovery.dump --backend nvml`` through
the real pynvml and libnvidia-ml; ``nvidia-smi.txt`` is nvidia-smi's own reading of the machine;
``claim-spec-N.json`` are the CDI specs the driver wrote for a claim of that GPU, with the NVIDIA
Container Toolkit's edits of that driver (driver root ``/`` and ``/usr/local/nvidia``), under each of
which a runc container ran CUDA and nvidia-smi (``probe.json``: every step's result).

The mocks behind ``test_nvml_real.py`` are NVIDIA's reading of a DGX; this is the hardware's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from dra_driver.node.describe.devices import (
    ATTR_NUMA_NODE,
    describe,
    enumerate_devices,
    gpu_device_name,
    is_semver,
)
from dra_driver.node.discovery.dump import load_gpus
from dra_driver.node.discovery.model import Gpu
from dra_driver.node.prepare.cdi import CdiSpecs
from dra_driver.node.prepare.edits import ClaimDevice
from dra_driver.node.publish.checker import check_device

FIXTURE = Path(__file__).parents[1] / "fixtures" / "h100-real"
MIB = 2**20
GIB = 2**30


@pytest.fixture(scope="module")
def gpu() -> Gpu:
    gpus = load_gpus(FIXTURE / "gpus.json")
    assert len(gpus) == 1
    return gpus[0]


@pytest.fixture(scope="module")
def smi() -> str:
    return (FIXTURE / "nvidia-smi.txt").read_text()


def smi_gpu_query(smi: str) -> dict[str, str]:
    block = smi.split("--format=csv\n", 1)[1].split("\n\n", 1)[0].splitlines()
    header, row = block[1], block[2]
    return dict(zip((h.strip() for h in header.split(",")), (v.strip() for v in row.split(",")), strict=True))


def smi_profiles(smi: str) -> dict[str, dict[str, Any]]:
    """``nvidia-smi mig -lgip`` and ``-lgipp``: name -> id, instances, memory GiB, SMs, placements."""
    profiles: dict[str, dict[str, Any]] = {}
    for m in re.finditer(r"\|\s+\d+\s+MIG (\S+)\s+(\d+)\s+\d+/(\d+)\s+([\d.]+)\s+\w+\s+(\d+)", smi):
        profiles[m[1]] = {"id": int(m[2]), "instances": int(m[3]), "memory_gib": float(m[4]), "sms": int(m[5])}
    by_id = {p["id"]: p for p in profiles.values()}
    for m in re.finditer(r"Profile ID\s+(\d+) Placements?\s*: \{([\d,]+)\}:(\d+)", smi):
        by_id[int(m[1])]["placements"] = {(int(start), int(m[3])) for start in m[2].split(",")}
    return profiles


def test_the_fixture_is_the_machine_nvidia_smi_describes(gpu: Gpu, smi: str) -> None:
    query = smi_gpu_query(smi)
    assert gpu.product_name == query["name"] == "NVIDIA H100 80GB HBM3"
    # nvidia-smi writes the PCI domain with 8 digits, NVML's busIdLegacy-free form with 4.
    assert query["pci.bus_id"].lower().endswith(gpu.pci.bus_id.lower()[len("0000"):])
    assert gpu.memory_bytes == int(query["memory.total [MiB]"].split()[0]) * MIB
    assert gpu.cuda_compute_capability == query["compute_cap"]
    assert gpu.driver_version == query["driver_version"] == "580.159.04"
    assert (gpu.mig_capable, gpu.mig_enabled) == (True, query["mig.mode.current"] == "Enabled")
    assert gpu.uuid in smi


def test_every_mig_profile_nvidia_smi_lists_is_discovered_with_its_placements(gpu: Gpu, smi: str) -> None:
    expected = smi_profiles(smi)
    assert len(expected) == 7  # 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb
    assert {p.name for p in gpu.mig_profiles} == set(expected)
    for profile in gpu.mig_profiles:
        smi_profile = expected[profile.name]
        assert profile.multiprocessors == smi_profile["sms"], profile.name
        assert round(profile.memory_bytes / GIB, 2) == smi_profile["memory_gib"], profile.name
        assert {(p.start, p.size) for p in profile.placements} == smi_profile["placements"], profile.name
        # nvidia-smi's instance count is how many fit at once; placements may overlap (1g.10gb+me has 7
        # placements, 1 instance).
        assert len(profile.placements) >= smi_profile["instances"], profile.name


def test_the_real_h100_publishes_valid_devices(gpu: Gpu, smi: str) -> None:
    static, no_counters = describe(enumerate_devices([gpu], False), "gpu.dra-driver.io", False)
    assert no_counters == []
    [whole] = static
    assert check_device(whole, "gpu.dra-driver.io") == []
    attrs = whole["attributes"]
    assert whole["name"] == gpu_device_name(gpu) == "gpu-0"
    assert attrs["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert attrs["uuid"] == {"string": gpu.uuid}
    # The API server accepts only semantic versions; NVIDIA's "580.159.04" is not one.
    assert attrs["driverVersion"] == {"version": "580.159.4"}
    assert all(is_semver(v["version"]) for v in attrs.values() if "version" in v)
    assert whole["capacity"]["memory"] == {"value": "81559Mi"}
    # NVML does not report a whole GPU's SM count (NOT_SUPPORTED on the H100): no capacity is
    # published rather than a zero a selector could read as "no multiprocessors".
    assert "multiprocessors" not in whole["capacity"]
    assert gpu.pci.numa_node is None and ATTR_NUMA_NODE not in attrs  # the VM reports no NUMA node (-1)

    dynamic, counter_sets = describe(enumerate_devices([gpu], True), "gpu.dra-driver.io", True)
    placements = sum(len(p["placements"]) for p in smi_profiles(smi).values())
    assert len(dynamic) == 1 + placements == 26
    for device in dynamic:
        assert check_device(device, "gpu.dra-driver.io") == []
    [counter_set] = counter_sets
    assert counter_set["counters"]["multiprocessors"] == {"value": "132"}
    assert counter_set["counters"]["memory"] == {"value": "81559Mi"}


@pytest.mark.parametrize("index", [0, 1])
def test_the_spec_that_ran_cuda_on_the_h100_is_what_the_driver_writes(gpu: Gpu, tmp_path: Path, index: int) -> None:
    """A change here changes what a CUDA container receives: re-run ``e2e/gpuprobe`` on a GPU."""
    recorded = json.loads((FIXTURE / f"claim-spec-{index}.json").read_text())
    ran = json.loads((FIXTURE / "probe.json").read_text())[f"container-{index}"]["result"]
    assert ran["rc"] == 0 and "CUDA OK" in ran["stdout"] and f"(UUID: {gpu.uuid})" in ran["stdout"]
    claim_uid = recorded["devices"][0]["name"].removesuffix("-gpu-0")
    common = recorded["containerEdits"]
    # The toolkit's part of the spec, as toolkit.common_edits handed it to the CDI writer.
    driver_edits = {"env": [e for e in common["env"] if e.startswith("NVIDIA_CTK_")], "hooks": common["hooks"],
                    "mounts": common["mounts"]}
    specs = CdiSpecs(tmp_path, "gpu.dra-driver.io", node_name="gpu-probe", driver_edits=lambda: driver_edits)
    device = ClaimDevice(device_name=gpu_device_name(gpu), request="gpu", uuid=gpu.uuid, gpu_minor=gpu.minor)
    assert specs.build_spec(claim_uid, "default", "cuda-probe", [device]) == recorded
