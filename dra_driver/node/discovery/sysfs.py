"""sysfs and /dev helpers shared by the discovery backends.

Everything takes a root directory so tests (and simulated nodes) can point at a fake tree:
``<sysfs_root>/bus/pci/devices/<bdf>`` is a symlink into ``<sysfs_root>/devices/pci<dddd>:<bb>/…/<bdf>``
on a real machine, and the ``pci<dddd>:<bb>`` component of the resolved path names the PCIe root
complex (the value of the standard ``resource.kubernetes.io/pcieRoot`` attribute).
"""

from __future__ import annotations

import re
from pathlib import Path

from dra_driver.node.discovery.model import PciInfo

_BDF = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")
_PCI_ROOT = re.compile(r"^pci([0-9a-f]{4,8}):([0-9a-f]{2})$")


def normalize_bus_id(bus_id: str) -> str:
    """``00000000:3B:00.0`` (NVML) or ``3b:00.0`` → ``0000:3b:00.0`` (extended BDF, lower case).

    NVML pads the domain to 8 digits; sysfs and the standard attribute use 4 (domains above 0xffff
    keep all their digits).
    """
    match = _BDF.match(bus_id.strip())
    if match is None:
        raise ValueError(f"not a PCI bus ID: {bus_id!r}")
    domain_text, bus, dev, fn = match.groups()
    domain = int(domain_text, 16) if domain_text else 0
    return f"{domain:04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn)}"


def numa_node(sysfs_root: Path, bus_id: str) -> int | None:
    """NUMA node of a PCI device; None when sysfs says -1, the file is missing or unreadable."""
    path = Path(sysfs_root) / "bus" / "pci" / "devices" / normalize_bus_id(bus_id) / "numa_node"
    try:
        value = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def pcie_root(sysfs_root: Path, bus_id: str) -> str | None:
    """``pci<domain>:<bus>`` of the root complex above the device, or None when unknown."""
    path = Path(sysfs_root) / "bus" / "pci" / "devices" / normalize_bus_id(bus_id)
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    for part in resolved.parts:
        if _PCI_ROOT.match(part):
            return part
    return None


def pci_info(sysfs_root: Path, bus_id: str) -> PciInfo:
    bdf = normalize_bus_id(bus_id)
    return PciInfo(bus_id=bdf, pcie_root=pcie_root(sysfs_root, bdf), numa_node=numa_node(sysfs_root, bdf))


def make_fake_pci_device(sysfs_root: Path, bus_id: str, root: str, numa: int | None) -> Path:
    """Create ``<sysfs_root>/devices/<root>/<bridge>/<bdf>`` plus the ``bus/pci/devices`` symlink.

    For tests and simulated nodes; ``numa=None`` writes -1 like the kernel does.
    """
    bdf = normalize_bus_id(bus_id)
    if not _PCI_ROOT.match(root):
        raise ValueError(f"PCIe root must look like pci0000:00, got {root!r}")
    domain, bus = root[3:].split(":")
    bridge = f"{int(domain, 16):04x}:{bus}:01.0"
    device_dir = Path(sysfs_root) / "devices" / root / bridge / bdf
    device_dir.mkdir(parents=True, exist_ok=True)
    (device_dir / "numa_node").write_text(f"{-1 if numa is None else numa}\n")
    link_dir = Path(sysfs_root) / "bus" / "pci" / "devices"
    link_dir.mkdir(parents=True, exist_ok=True)
    link = link_dir / bdf
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(device_dir)
    return device_dir


# --- MIG capability device nodes -------------------------------------------------------------
#
# The driver exposes MIG access rights as character devices /dev/nvidia-caps/nvidia-cap<N>; the
# minor N of each capability is listed in /proc/driver/nvidia-caps/mig-minors as lines such as
# ``gpu0/gi1/access 12`` and ``gpu0/gi1/ci0/access 13``. The layout is regular: minors 1 and 2 are
# ``config`` and ``monitor``; then each GPU gets 15 GPU-instance blocks of 9 minors (the GI's
# ``access`` followed by 8 compute instances).

_CAPS_FIRST = 3
_CAPS_PER_GI = 9
_CAPS_GIS_PER_GPU = 15


def mig_cap_minors(gpu_minor: int, gpu_instance_id: int, compute_instance_id: int) -> tuple[int, int]:
    """(GI access minor, CI access minor) computed from the driver's fixed layout."""
    if not 0 <= gpu_instance_id < _CAPS_GIS_PER_GPU or not 0 <= compute_instance_id < _CAPS_PER_GI - 1:
        raise ValueError(f"GI/CI id out of range: gi={gpu_instance_id} ci={compute_instance_id}")
    gi = _CAPS_FIRST + gpu_minor * _CAPS_GIS_PER_GPU * _CAPS_PER_GI + gpu_instance_id * _CAPS_PER_GI
    return gi, gi + 1 + compute_instance_id


def read_mig_minors(proc_root: Path = Path("/proc")) -> dict[str, int]:
    """Parse ``<proc_root>/driver/nvidia-caps/mig-minors`` into ``{"gpu0/gi1/access": 12, …}``."""
    path = Path(proc_root) / "driver" / "nvidia-caps" / "mig-minors"
    result: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return result
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            result[parts[0]] = int(parts[1])
    return result


def read_mig_cap_minors(gpu_minor: int, gpu_instance_id: int, compute_instance_id: int,
                        proc_root: Path | None = Path("/proc")) -> tuple[int, int]:
    """(GI access minor, CI access minor) as ``<proc_root>/driver/nvidia-caps/mig-minors`` lists them;
    computed with the driver's fixed layout when it does not (or ``proc_root`` is None)."""
    if proc_root is not None:
        table = read_mig_minors(proc_root)
        gi_key = f"gpu{gpu_minor}/gi{gpu_instance_id}/access"
        ci_key = f"gpu{gpu_minor}/gi{gpu_instance_id}/ci{compute_instance_id}/access"
        if gi_key in table and ci_key in table:
            return table[gi_key], table[ci_key]
    return mig_cap_minors(gpu_minor, gpu_instance_id, compute_instance_id)
