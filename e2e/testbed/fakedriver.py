"""A fake NVIDIA driver install for the NVIDIA Container Toolkit to find: files named like a real
driver's, the ``mock-nvml`` libnvidia-ml.so.1 (which says which driver version is installed, so the
other libraries carry its version: go-nvml's DGX mocks report 550.54.15), firmware, and an
``nvidia-smi`` that is a shell script printing the GPUs it was given.

The toolkit only finds device nodes that are character devices, so ``make_device_nodes`` makes them
with mknod (root); their numbers are /dev/null's, which any container may open.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from e2e.testbed import gotools, mocknvml

TOOL = "nvidia-container-toolkit"
VERSION = mocknvml.DRIVER_VERSION
LIBRARY_DIR = mocknvml.LIBRARY_DIR
LIBRARIES = ("libcuda", "libnvidia-ptxjitcompiler", "libnvidia-nvvm", "libcudadebugger", "libnvidia-gpucomp",
             "libnvidia-allocator", "libnvidia-cfg")
"""User-space libraries of a driver install besides libnvidia-ml (empty files: nothing loads them)."""
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")

NVIDIA_SMI = """#!/bin/sh
# Fake nvidia-smi: lists the GPUs this container was given, as `nvidia-smi -L` does.
visible="${NVIDIA_VISIBLE_DEVICES:-}"
if [ -z "$visible" ] || [ "$visible" = "void" ] || [ "$visible" = "none" ]; then
    visible=""
    for node in /dev/nvidia[0-9]*; do
        [ -e "$node" ] && visible="$visible${visible:+,}${node#/dev/nvidia}"
    done
fi
if [ -z "$visible" ]; then
    echo "No devices were found"
    exit 6
fi
i=0
for gpu in $(echo "$visible" | tr ',' ' '); do
    echo "GPU $i: NVIDIA fake GPU (UUID: $gpu)"
    i=$((i + 1))
done
"""


def toolkit_bin(log: bool = True) -> Path:
    """The folder holding ``nvidia-ctk`` and ``nvidia-cdi-hook``, built from their pins on first use."""
    return gotools.ensure([TOOL], log=log)


def make_driver_root(root: Path, *, libcuda: bool = True, log: bool = True) -> Path:
    """A driver install under ``root`` (``libcuda=False``: one without libcuda, which the toolkit
    refuses); returns the root."""
    mocknvml.make_driver_root(root, log=log)
    lib_dir = root / LIBRARY_DIR
    for name in LIBRARIES:
        if name == "libcuda" and not libcuda:
            continue
        versioned = lib_dir / f"{name}.so.{VERSION}"
        versioned.write_bytes(b"")
        link = lib_dir / f"{name}.so.1"
        link.unlink(missing_ok=True)
        link.symlink_to(versioned.name)
    smi = root / "usr/bin/nvidia-smi"
    smi.parent.mkdir(parents=True, exist_ok=True)
    smi.write_text(NVIDIA_SMI)
    smi.chmod(0o755)
    firmware = root / "lib/firmware/nvidia" / VERSION
    firmware.mkdir(parents=True, exist_ok=True)
    for name in FIRMWARE:
        (firmware / name).write_bytes(b"")
    return root


def make_device_nodes(dev_root: Path, gpus: int) -> list[Path]:
    """``<dev_root>/dev/{nvidiactl,nvidia-uvm,nvidia-uvm-tools,nvidia0..}`` as character devices."""
    dev = dev_root / "dev"
    dev.mkdir(parents=True, exist_ok=True)
    made = []
    for name in (*CONTROL_NODES, *(f"nvidia{i}" for i in range(gpus))):
        path = dev / name
        if not path.exists():
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            os.chmod(path, 0o666)  # mknod's mode passes through the umask
        made.append(path)
    return made
