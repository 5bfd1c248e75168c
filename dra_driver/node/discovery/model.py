"""What discovery reports about a node's GPUs, independent of the backend that found them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PciInfo:
    bus_id: str
    """Extended BDF, lower case: ``0000:3b:00.0``."""
    pcie_root: str | None
    """``pci<domain>:<bus>`` of the root complex, e.g. ``pci0000:3a``; None when unknown."""
    numa_node: int | None
    """None when sysfs says -1 (unknown): such a node is not published."""


@dataclass(frozen=True)
class MigPlacement:
    start: int
    size: int

    def overlaps(self, other: MigPlacement) -> bool:
        return self.start < other.start + other.size and other.start < self.start + self.size


@dataclass(frozen=True)
class MigProfile:
    """A GPU-instance profile the GPU supports, with every placement it allows (dynamic MIG)."""

    name: str
    """``1g.10gb`` style."""
    memory_bytes: int
    multiprocessors: int
    memory_slices: int
    compute_slices: int
    placements: tuple[MigPlacement, ...]


@dataclass(frozen=True)
class MigDevice:
    """A MIG instance that exists (static MIG)."""

    uuid: str
    profile: str
    parent_uuid: str
    memory_bytes: int
    multiprocessors: int
    gpu_instance_id: int
    compute_instance_id: int
    placement: MigPlacement


@dataclass(frozen=True)
class Gpu:
    index: int
    minor: int
    """The N of /dev/nvidiaN."""
    uuid: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str
    """``9.0`` style; published as a semver version."""
    driver_version: str
    cuda_driver_version: str
    memory_bytes: int
    multiprocessors: int
    pci: PciInfo
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    mig_profiles: tuple[MigProfile, ...] = ()
    extra: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
