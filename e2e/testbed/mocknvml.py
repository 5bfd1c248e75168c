"""A fake NVIDIA driver root whose libnvidia-ml.so.1 is the ``mock-nvml`` Go tool.

The library is our cgo shim over the mock DGX servers of github.com/NVIDIA/go-nvml (see
``e2e/tooling/gotools/mock-nvml/main.go``). Placed where a driver installs it, it lets the node plugin
run unchanged with ``--gpu-backend nvml --nvidia-driver-root <root>``. The environment chooses the
machine and keeps its MIG state in a JSON file, which tests read to see what the mock holds::

    DRA_MOCK_NVML_MACHINE=dgxh100|dgxa100|dgxh200|dgxb200
    DRA_MOCK_NVML_STATE=<file>       # MIG mode, GPU/compute instances, UUIDs; survives restarts
    DRA_MOCK_NVML_FAIL=nvmlX=CODE    # nvmlX returns CODE (error injection)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from dra_driver.node.discovery import sysfs
from e2e.tooling import gotools
from e2e.tooling.toolsets import MOCK_NVML_TOOL as TOOL

SONAME = "libnvidia-ml.so.1"
LIBRARY_DIR = "usr/lib/x86_64-linux-gnu"
DRIVER_VERSION = "570.172.08"
"""The driver every mock machine reports (a real R570 datacenter release; go-nvml's own mocks say
550.54.15, see ``installedDriverVersion`` in the shim's machine.go)."""
CUDA_DRIVER_VERSION = "12.8"
"""The CUDA version of that driver (NVML's 12080)."""
GPUS = 8
"""GPUs of every mock DGX."""


def library(log: bool = True) -> Path:
    """The built libnvidia-ml.so.1 (built from the pins on first use, then cached)."""
    return gotools.ensure([TOOL], log=log) / SONAME


def make_driver_root(root: Path, log: bool = True) -> Path:
    """``<root>/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1`` → ``libnvidia-ml.so.<version>``, as a driver
    installs it; returns the root."""
    lib_dir = root / LIBRARY_DIR
    lib_dir.mkdir(parents=True, exist_ok=True)
    versioned = lib_dir / f"libnvidia-ml.so.{DRIVER_VERSION}"
    shutil.copyfile(library(log), versioned)
    link = lib_dir / SONAME
    link.unlink(missing_ok=True)
    link.symlink_to(versioned.name)
    return root


def bus_id(index: int) -> str:
    """The PCI bus ID go-nvml's mock gives GPU ``index``."""
    return f"0000:{index:02x}:00.0"


def numa_node(index: int) -> int:
    """Where a DGX puts its GPUs: four per CPU socket."""
    return index // 4


def pcie_root(index: int) -> str:
    """Two GPUs per PCIe switch and root complex, as on a DGX."""
    return f"pci0000:{0x10 * (index // 2):02x}"


def make_sysfs(root: Path) -> Path:
    """A sysfs tree with the mock's GPUs on their NUMA nodes and PCIe roots; returns the root."""
    for i in range(GPUS):
        sysfs.make_fake_pci_device(root, bus_id(i), pcie_root(i), numa_node(i))
    return root


def environment(machine: str, state_file: Path | None = None, fail: str = "") -> dict[str, str]:
    env = {"DRA_MOCK_NVML_MACHINE": machine}
    if state_file is not None:
        env["DRA_MOCK_NVML_STATE"] = str(state_file)
    if fail:
        env["DRA_MOCK_NVML_FAIL"] = fail
    return env


def read_state(state_file: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(state_file.read_text())
    return data


def gpu_instances(state: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """(GPU index, GPU instance) for every GPU instance the mock holds."""
    return [(g["index"], gi) for g in state["gpus"] for gi in g["gpuInstances"]]


def static_mig_state(machine: str, layout: dict[int, list[tuple[int, int]]]) -> dict[str, Any]:
    """A state file seeding static MIG: GPU index → [(GPU-instance profile id, placement start)].

    Each GPU instance gets one compute instance spanning it. On go-nvml's mocks profile IDs equal the
    NVML_*_INSTANCE_PROFILE_<n>_SLICE indexes, and the compute-instance profile spanning a GPU
    instance of profile P is P (1, 2, 3, 4 and 7 slices).
    """
    sizes = PLACEMENT_SIZES[machine]
    gpus = []
    for index, instances in sorted(layout.items()):
        gis = []
        for n, (profile_id, start) in enumerate(instances):
            if profile_id not in sizes:
                raise ValueError(f"{machine}: GPU-instance profile {profile_id} is not one of {sorted(sizes)}")
            gis.append({"id": n + 1, "profileId": profile_id, "placement": {"start": start, "size": sizes[profile_id]},
                        "computeInstances": [{"id": 0, "profileId": profile_id}]})
        gpus.append({"index": index, "migMode": 1, "gpuInstances": gis})
    return {"machine": machine, "gpus": gpus}


PLACEMENT_SIZES = {
    "dgxa100": {0: 1, 1: 2, 2: 4, 3: 4, 4: 8},
    "dgxh100": {0: 1, 1: 2, 2: 3, 3: 4, 4: 7},
}
"""NVML_GPU_INSTANCE_PROFILE_{1,2,3,4,7}_SLICE → the placement size go-nvml's mock gives it (memory
slices: the A100's, like the real one's, count 8); the shim refuses any other size."""
