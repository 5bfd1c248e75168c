"""A fake NVIDIA driver install for the NVIDIA Container Toolkit to find, laid out like a real R570
datacenter install (570.172.08) of a DGX: the ``mock-nvml`` libnvidia-ml.so.1 (which reports that
version, so every other file carries it), the other user-space libraries with the links the
installer makes, the GSP firmware, the binaries, and nvidia-persistenced's socket. ``nvidia-smi`` is a
shell script printing the GPUs it was given; the other files are stand-ins nothing loads or runs.

The file list is what ``nvidia-ctk cdi generate`` (pinned v1.20.1, pkg/nvcdi/driver-nvml.go) looks
up on a compute-only 570 install: ``*.so.<version>`` in the folders holding ``libcuda.so.<version>``,
``nvidia/<version>/gsp*.bin`` under /lib/firmware, the driver's binaries, and the IPC sockets under
/run. The graphics files (EGL, Vulkan, X) of a desktop install are left out: a datacenter node has none.

The toolkit only finds device nodes that are character devices, so ``make_device_nodes`` makes them
with mknod (root); their numbers are /dev/null's, which any container may open.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from e2e.testbed import mocknvml
from e2e.tooling import gotools
from e2e.tooling.toolsets import FAKE_DRIVER_TOOL as TOOL

VERSION = mocknvml.DRIVER_VERSION
LIBRARY_DIR = mocknvml.LIBRARY_DIR
LIBRARIES: dict[str, tuple[str, ...]] = {
    "libcuda": ("libcuda.so.1",),
    "libcudadebugger": ("libcudadebugger.so.1",),
    "libnvidia-ptxjitcompiler": ("libnvidia-ptxjitcompiler.so.1",),
    "libnvidia-nvvm": ("libnvidia-nvvm.so.4",),
    "libnvidia-gpucomp": (),  # its soname is the versioned name
    "libnvidia-allocator": ("libnvidia-allocator.so.1",),
    "libnvidia-cfg": ("libnvidia-cfg.so.1",),
    "libnvidia-opencl": ("libnvidia-opencl.so.1",),
    "libnvidia-nscq": ("libnvidia-nscq.so.2.0", "libnvidia-nscq.so.2"),  # NVSwitch query, from fabric manager
    "libnvidia-pkcs11": (),
    "libnvidia-pkcs11-openssl3": (),
}
"""User-space libraries of a 570 install besides libnvidia-ml, each ``<name>.so.<version>`` (empty
files: nothing loads them), with the chain of links the installer makes to it (each to the one before)."""
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
            "nvidia-cuda-mps-server")
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
PERSISTENCED_SOCKET = "run/nvidia-persistenced/socket"
"""Where nvidia-persistenced listens; the toolkit mounts it into every container."""
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

STUB = """#!/bin/sh
# A stand-in of the fake driver root (e2e/testbed/fakedriver.py): named like the driver's binary, does nothing.
echo "$(basename "$0"): not a real NVIDIA driver" >&2
exit 1
"""


def toolkit_bin(log: bool = True) -> Path:
    """The folder holding ``nvidia-ctk`` and ``nvidia-cdi-hook``, built from their pins on first use."""
    return gotools.ensure([TOOL], log=log)


def make_driver_root(root: Path, *, libcuda: bool = True, log: bool = True) -> Path:
    """A driver install under ``root`` (``libcuda=False``: one without libcuda, which the toolkit
    refuses); returns the root. Making it again over an existing one completes it."""
    mocknvml.make_driver_root(root, log=log)
    lib_dir = root / LIBRARY_DIR
    for name, links in LIBRARIES.items():
        if name == "libcuda" and not libcuda:
            continue
        versioned = lib_dir / f"{name}.so.{VERSION}"
        versioned.write_bytes(b"")
        _link_chain(lib_dir, versioned.name, links)
    bin_dir = root / "usr/bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in BINARIES:
        binary = bin_dir / name
        binary.write_text(NVIDIA_SMI if name == "nvidia-smi" else STUB)
        binary.chmod(0o755)
    firmware = root / "lib/firmware/nvidia" / VERSION
    firmware.mkdir(parents=True, exist_ok=True)
    for name in FIRMWARE:
        (firmware / name).write_bytes(b"")
    _make_socket(root / PERSISTENCED_SOCKET)
    return root


def _link_chain(folder: Path, target: str, links: tuple[str, ...]) -> None:
    """``links[0]`` → ``target``, ``links[1]`` → ``links[0]``, …: relative links, as ldconfig and the
    installer make them."""
    for link_name in links:
        link = folder / link_name
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        target = link_name


def _make_socket(path: Path) -> None:
    """A socket inode with no listener (mknod needs no privilege for one): the toolkit finds it and a
    container gets it mounted, as a real nvidia-persistenced's; nobody connects to it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_socket():
        path.unlink(missing_ok=True)
        os.mknod(path, 0o666 | stat.S_IFSOCK)


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
