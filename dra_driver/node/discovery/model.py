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
class MigEngines:
    """The engines a GPU-instance profile has besides its multiprocessors (NVML's profile info)."""

    copy_engines: int = 0
    decoders: int = 0
    encoders: int = 0
    jpeg_engines: int = 0
    ofa_engines: int = 0


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
    profile_id: int | None = None
    """NVML's GPU-instance profile ID (``nvidia-smi mig -lgip``); None: the usual one for its shape
    (:func:`gi_profile_id`)."""
    engines: MigEngines = MigEngines()


STANDARD_PROFILE_IDS = {(1, 1, False): 19, (1, 1, True): 20, (1, 2, False): 15, (2, 2, False): 14,
                        (3, 4, False): 9, (4, 4, False): 5, (7, 8, False): 0}
"""NVML's GPU-instance profile IDs by (compute slices, memory slices, media extensions), the same on
A100, A30-less H100/H200 and B200 alike: 1g → 19, 1g+me → 20, 1g with two memory slices → 15, 2g → 14,
3g → 9, 4g → 5, 7g → 0."""


def gi_profile_id(profile: MigProfile) -> int:
    """The profile's NVML ID: its own, else the standard one for its shape, else 100 + its slices
    (a shape NVML has no standard ID for; only a simulated profile can have one)."""
    if profile.profile_id is not None:
        return profile.profile_id
    key = (profile.compute_slices, profile.memory_slices, profile.name.endswith("+me"))
    return STANDARD_PROFILE_IDS.get(key, 100 + 10 * profile.compute_slices + profile.memory_slices)


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
    profile_id: int | None = field(default=None, compare=False)
    """Its GPU instance's NVML profile ID; None where discovery did not say (a checkpoint entry keeps
    only what identifies the instance, so neither this nor ``engines`` is compared)."""
    engines: MigEngines = field(default=MigEngines(), compare=False)


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
