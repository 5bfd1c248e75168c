"""The API the driver speaks, as a profile: the names it publishes and reads, in one place.

``--api-profile`` chooses one:

* ``dra-driver`` (the default): this driver's own names, driver ``gpu.dra-driver.io`` (or
  ``--driver-name``), devices numbered by NVML index, classes ``gpu.<driver>`` and ``mig.<driver>``;
* ``nvidia``: NVIDIA's DRA driver's (``gpu.nvidia.com``), as its kubelet plugin publishes them, so
  that claims, templates, classes and selectors written for that driver resolve here unchanged.
  Devices are numbered by the minor of ``/dev/nvidiaN``; MIG devices are named by profile, GPU-instance
  profile ID and placement; MIG devices carry the engine counts as capacities; the health taints
  are ``gpu.nvidia.com/xid``, ``gpu.nvidia.com/gpu-lost`` and ``gpu.nvidia.com/unmonitored``.

Both: one pool per node, named after the node; the CDI kind is ``k8s.<driver>/claim``. The name
table, ours beside NVIDIA's, is docs/nvidia-profile.md. What differs between the two is decided
here (the driver name, device and counter-set names, which attributes, capacities and counters are
published, the classes, the taint keys, the state directory); the names both share (``productName``,
``memory``, ...) are written where the devices are described, dra_driver.node.describe.devices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dra_driver import DEFAULT_DRIVER_NAME

DRA_DRIVER = "dra-driver"
NVIDIA = "nvidia"
NAMES = (DRA_DRIVER, NVIDIA)
"""The values of ``--api-profile`` (``$API_PROFILE``, chart ``apiProfile``)."""

NVIDIA_DRIVER_NAME = "gpu.nvidia.com"
NUMBERED_BY_INDEX = "index"
NUMBERED_BY_MINOR = "minor"


@dataclass(frozen=True)
class ClassSpec:
    """A DeviceClass the profile installs: its name, the ``type`` attribute it selects, and the
    extended resource it serves (None: none)."""

    name: str
    device_type: str
    extended_resource_name: str | None = None


@dataclass(frozen=True)
class TaintKeys:
    """The keys of the health taints. The own profile has one key for every reason (the value says
    which); NVIDIA's has one per kind of event."""

    unhealthy: str
    """A critical XID, an ECC error or an injected failure without an XID."""
    xid: str
    """A critical XID (value: the XID); the same as ``unhealthy`` in the own profile."""
    gpu_lost: str
    unmonitored: str
    """Health unknown: no monitoring for the device (NVIDIA's effect None)."""

    @property
    def all(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((self.unhealthy, self.xid, self.gpu_lost, self.unmonitored)))

    @property
    def unhealthy_keys(self) -> tuple[str, ...]:
        """The keys that say a device is unhealthy (``unmonitored`` only says its health is unknown)."""
        return tuple(dict.fromkeys((self.unhealthy, self.xid, self.gpu_lost)))

    @property
    def by_event(self) -> bool:
        """One key per kind of event (NVIDIA's), rather than one for all."""
        return len(self.all) > 1


@dataclass(frozen=True)
class ApiProfile:
    name: str
    default_driver_name: str
    fixed_driver_name: bool
    """The driver name is the profile's, not a choice (NVIDIA's classes and selectors name it)."""
    numbering: str
    """Which number names a GPU's devices and counter set: NVML's index, or the minor of /dev/nvidiaN."""
    numbering_attributes: bool
    """``index``, ``minor`` (full GPUs) and ``parentIndex`` (MIG) are published."""
    mig_names_by_profile_id: bool
    """Static MIG devices are named ``gpu-<minor>-mig-<profile>-<GI profile ID>-<placement start>``
    (NVIDIA's), rather than by GPU- and compute-instance IDs; dynamic ones take the profile ID too."""
    mig_engine_capacities: bool
    """MIG devices publish ``copyEngines``, ``decoders``, ``encoders``, ``jpegEngines`` and ``ofaEngines``,
    and static ones a ``memorySlice<i>`` of 1 for each memory slice they hold."""
    engine_counters: bool
    """The counter sets also count ``copy-engines``, ``decoders``, ``encoders``, ``jpeg-engines`` and
    ``ofa-engines``."""
    shares_memory_step: int | None
    """``--consumable-shares``: the memory step in bytes (NVIDIA's 1Mi, with a ``max``); None: this
    driver's rule (1Gi, or 1Mi on a device too small for two)."""
    state_subdir: str
    """The state directory's default is ``<plugins-dir>/<driver>/<state_subdir>`` ("": the plugin's
    own directory); NVIDIA's plugin keeps its ``checkpoint.json`` in the same directory."""
    refuses_rivals: bool
    """The plugin refuses to start where another plugin of its driver name runs on the node (NVIDIA's
    own, for ``gpu.nvidia.com``: dra_driver.node.kubelet.rivals)."""
    taints: TaintKeys
    class_prefixes: tuple[tuple[str, str], ...]
    """(class name prefix, device type) of the own profile's classes, ``<prefix>.<driver>``."""
    nvidia_classes: tuple[ClassSpec, ...] = ()

    # --- names -----------------------------------------------------------------------------------

    def gpu_number(self, index: int, minor: int) -> int:
        return minor if self.numbering == NUMBERED_BY_MINOR else index

    def gpu_device_name(self, index: int, minor: int) -> str:
        return f"gpu-{self.gpu_number(index, minor)}"

    def static_mig_device_name(self, parent_index: int, parent_minor: int, *, gpu_instance_id: int,
                               compute_instance_id: int, profile: str, profile_id: int, placement_start: int) -> str:
        parent = self.gpu_device_name(parent_index, parent_minor)
        if self.mig_names_by_profile_id:
            return f"{parent}-mig-{profile_label(profile)}-{profile_id}-{placement_start}"
        return f"{parent}-mig-{gpu_instance_id}-{compute_instance_id}"

    def dynamic_mig_device_name(self, parent_index: int, parent_minor: int, *, profile: str, profile_id: int,
                                placement_start: int) -> str:
        parent = self.gpu_device_name(parent_index, parent_minor)
        if self.mig_names_by_profile_id:
            return f"{parent}-mig-{profile_label(profile)}-{profile_id}-{placement_start}"
        return f"{parent}-mig-{profile_label(profile)}-{placement_start}"

    def counter_set_name(self, index: int, minor: int) -> str:
        return f"{self.gpu_device_name(index, minor)}-counter-set"

    # --- the plugin's names beyond devices ---------------------------------------------------------

    def driver_name(self, requested: str | None) -> str:
        """The driver name to use: ``requested`` (--driver-name) or the profile's; ValueError when the
        profile's name is fixed and ``requested`` is another, or ``requested`` is NVIDIA's and the
        profile is not (so that a driver name says which profile its slices have)."""
        if not requested:
            return self.default_driver_name
        if self.fixed_driver_name and requested != self.default_driver_name:
            raise ValueError(f"--api-profile {self.name} publishes as {self.default_driver_name} (the name its "
                             f"classes and selectors read), not --driver-name {requested}")
        if not self.fixed_driver_name and requested == NVIDIA_DRIVER_NAME:
            raise ValueError(f"--driver-name {NVIDIA_DRIVER_NAME} is NVIDIA's driver's: it goes with --api-profile "
                             f"{NVIDIA}, whose names its claims and classes read, not --api-profile {self.name}")
        return requested

    def cdi_kind(self, driver: str) -> str:
        return f"k8s.{driver}/claim"

    def device_classes(self, driver: str) -> tuple[ClassSpec, ...]:
        """The full-GPU and MIG classes, by name, with the ``type`` each selects."""
        if self.nvidia_classes:
            return self.nvidia_classes
        return tuple(ClassSpec(f"{prefix}.{driver}", kind) for prefix, kind in self.class_prefixes)


def class_selector(driver: str, device_type: str) -> str:
    """The CEL of a class that selects the driver's devices of one ``type``."""
    return f"device.driver == '{driver}' && device.attributes['{driver}'].type == '{device_type}'"


def profile_label(profile: str) -> str:
    """A MIG profile in a device name: dots dropped, the rest DNS-label safe (``1g.10gb`` → ``1g10gb``,
    ``1g.10gb+me`` → ``1g10gb-me``), as both profiles write it."""
    text = profile.lower().replace(".", "")
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


OWN = ApiProfile(
    name=DRA_DRIVER,
    default_driver_name=DEFAULT_DRIVER_NAME,
    fixed_driver_name=False,
    numbering=NUMBERED_BY_INDEX,
    numbering_attributes=True,
    mig_names_by_profile_id=False,
    mig_engine_capacities=False,
    engine_counters=False,
    shares_memory_step=None,
    state_subdir="",
    refuses_rivals=False,
    taints=TaintKeys(*(f"{DEFAULT_DRIVER_NAME}/unhealthy",) * 4),
    class_prefixes=(("gpu", "gpu"), ("mig", "mig")),
)

NVIDIA_PROFILE = ApiProfile(
    name=NVIDIA,
    default_driver_name=NVIDIA_DRIVER_NAME,
    fixed_driver_name=True,
    numbering=NUMBERED_BY_MINOR,
    numbering_attributes=False,
    mig_names_by_profile_id=True,
    mig_engine_capacities=True,
    engine_counters=True,
    shares_memory_step=2**20,
    state_subdir="dra-driver",
    refuses_rivals=True,
    taints=TaintKeys(unhealthy=f"{NVIDIA_DRIVER_NAME}/xid", xid=f"{NVIDIA_DRIVER_NAME}/xid",
                     gpu_lost=f"{NVIDIA_DRIVER_NAME}/gpu-lost", unmonitored=f"{NVIDIA_DRIVER_NAME}/unmonitored"),
    class_prefixes=(),
    nvidia_classes=(ClassSpec("gpu.nvidia.com", "gpu", "nvidia.com/gpu"), ClassSpec("mig.nvidia.com", "mig")),
)

PROFILES = {p.name: p for p in (OWN, NVIDIA_PROFILE)}


def get(name: str) -> ApiProfile:
    """The profile called ``name``; ValueError naming the choices otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"--api-profile must be one of {', '.join(NAMES)}, got {name!r}") from None


def for_driver(driver: str) -> ApiProfile:
    """The profile whose names a driver's slices carry, for the tools that read them: NVIDIA's for
    ``gpu.nvidia.com``, this driver's for any other name."""
    return NVIDIA_PROFILE if driver == NVIDIA_DRIVER_NAME else OWN
