"""A deterministic simulated GPU backend: a node as a profile describes it
(:mod:`dra_driver.node.discovery.profiles`), with fake device nodes and MIG instances that can be
created and destroyed like real ones.

UUIDs are derived from the node name (uuid5), so two simulated nodes never share a GPU UUID and a
restarted plugin sees the same UUIDs again. MIG instances created for dynamic MIG get a UUID derived
from parent UUID + profile + placement.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dra_driver import logs
from dra_driver.node.discovery.model import Gpu, MigDevice, MigPlacement, MigProfile, PciInfo, gi_profile_id
from dra_driver.node.discovery.profiles import GpuSpec, NodeProfile, load_profile
from dra_driver.node.discovery.sysfs import mig_cap_minors
from dra_driver.node.fileio import atomic_write

_UUID_NAMESPACE = uuid.UUID("5a0c1b7e-3d2f-4c8e-9b1a-6f4e2d7c8a90")

_log = logs.get("discovery.simulated")


# --- deterministic identities --------------------------------------------------------------------


def gpu_uuid(node_name: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/gpu/{index}')}"


def mig_uuid(parent_uuid: str, profile: str, placement: MigPlacement) -> str:
    return f"MIG-{uuid.uuid5(_UUID_NAMESPACE, f'{parent_uuid}/mig/{profile}/{placement.start}/{placement.size}')}"


# --- fake /dev -----------------------------------------------------------------------------------


# Never the NVIDIA driver's numbers (nvidiaN and nvidiactl are 195 on a real host, nvidia-uvm and
# the capability nodes get dynamic majors, 234-254 or 384-511): a simulated GPU on a host with real
# ones would hand a container the real device. 120-122 are in Linux's block of char majors for local
# and experimental use, which the kernel never hands out dynamically (docs/devices.md).
NVIDIA_MAJOR, UVM_MAJOR, CAPS_MAJOR = 120, 121, 122


def create_fake_device_files(dev_root: Path, gpus: Iterable[Gpu]) -> list[Path]:
    """Create ``<dev_root>/dev/nvidia*`` (and MIG capability nodes) for simulated GPUs.

    A real container runtime refuses a CDI device node whose host path is not a device, so they are
    character devices where mknod is allowed (root with CAP_MKNOD: the chart grants it), else links
    to /dev/null, which only a runtime that follows links accepts. Idempotent; returns every path
    that should exist.
    """
    dev = Path(dev_root) / "dev"
    nodes: dict[Path, tuple[int, int]] = {
        dev / "nvidiactl": (NVIDIA_MAJOR, 255), dev / "nvidia-uvm": (UVM_MAJOR, 0), dev / "nvidia-uvm-tools": (UVM_MAJOR, 1),
    }
    caps: list[int] = []
    for gpu in gpus:
        nodes[dev / f"nvidia{gpu.minor}"] = (NVIDIA_MAJOR, gpu.minor)
        for mig in gpu.mig_devices:
            caps.extend(mig_cap_minors(gpu.minor, mig.gpu_instance_id, mig.compute_instance_id))
    if caps:
        caps = [1, 2, *caps]  # config and monitor capabilities
    for n in sorted(set(caps)):
        nodes[dev / "nvidia-caps" / f"nvidia-cap{n}"] = (CAPS_MAJOR, n)
    for path, (major, minor) in nodes.items():
        _make_device_node(path, major, minor)
    return list(nodes)


def _make_device_node(path: Path, major: int, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if (not path.is_symlink() and path.exists() and stat.S_ISCHR(path.stat().st_mode)
            and path.stat().st_rdev == os.makedev(major, minor)):
        return
    # A node of another number (one an older version made with the NVIDIA driver's) is replaced too.
    # A link or plain file left by a run without CAP_MKNOD is replaced as soon as mknod is allowed:
    # containerd's CDI injection lstat()s the host path and refuses anything but a device node.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.mknod(tmp, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    except PermissionError:
        if not path.is_symlink():
            path.unlink(missing_ok=True)
            path.symlink_to("/dev/null")
        return
    os.replace(tmp, path)


def mig_device_paths(dev_root: Path, gpu: Gpu, mig: MigDevice) -> list[Path]:
    """Device nodes a container needs for one MIG device (besides the control nodes)."""
    gi, ci = mig_cap_minors(gpu.minor, mig.gpu_instance_id, mig.compute_instance_id)
    caps = Path(dev_root) / "dev" / "nvidia-caps"
    return [Path(dev_root) / "dev" / f"nvidia{gpu.minor}", caps / f"nvidia-cap{gi}", caps / f"nvidia-cap{ci}"]


# --- the backend ---------------------------------------------------------------------------------


class MigError(RuntimeError):
    """A MIG create/destroy request the GPU cannot satisfy."""


@dataclass
class _GpuState:
    spec: GpuSpec
    uuid: str
    mig_enabled: bool
    instances: list[MigDevice]


class SimulatedBackend:
    """Backend over a :class:`NodeProfile`; MIG create/destroy change in-memory state.

    ``state_file`` (optional) keeps MIG mode and instances across restarts of the plugin, the way
    real GPUs keep them, and is re-read before each change (two plugin instances share the GPUs);
    ``dev_root`` (optional) gets fake device files for every GPU and MIG instance.
    """

    name = "simulated"

    def __init__(self, profile: NodeProfile | str | Path, node_name: str, *, dev_root: Path | None = None,
                 state_file: Path | None = None) -> None:
        self.profile = profile if isinstance(profile, NodeProfile) else load_profile(profile)
        self.node_name = node_name
        self.dev_root = dev_root
        self.state_file = state_file
        self._lock = threading.Lock()
        self._gpus: list[_GpuState] = []
        for spec in self.profile.gpus:
            parent_uuid = spec.uuid or gpu_uuid(node_name, spec.index)
            instances = [self._make_mig(spec, parent_uuid, i.profile, i.placement, i.gpu_instance_id,
                                        i.compute_instance_id) for i in spec.instances]
            self._gpus.append(_GpuState(spec, parent_uuid, spec.mig_enabled, instances))
        self._load_state()
        if dev_root is not None:
            create_fake_device_files(dev_root, self._snapshot())

    # Backend protocol ----------------------------------------------------------------------------

    def discover(self) -> list[Gpu]:
        with self._lock:
            return self._snapshot()

    def create_mig_instance(self, gpu: Gpu, profile: MigProfile, placement: MigPlacement) -> MigDevice:
        with self._lock:
            self._load_state()  # another plugin instance (a rolling update) may have changed the GPUs
            state = self._state_for(gpu.uuid)
            spec = state.spec
            prof = spec.model.profile(profile.name)
            if prof is None:
                raise MigError(f"GPU {gpu.index} ({spec.model.product_name}) has no MIG profile {profile.name!r}")
            allowed = next((p for p in prof.placements if p.start == placement.start), None)
            if allowed is None or allowed.size != placement.size:
                raise MigError(f"GPU {gpu.index}: {prof.name} cannot be placed at {placement.start}+{placement.size}")
            for existing in state.instances:
                if existing.profile == prof.name and existing.placement == allowed:
                    return existing  # idempotent
                if existing.placement.overlaps(allowed):
                    raise MigError(f"GPU {gpu.index}: {prof.name}@{allowed.start} overlaps existing "
                                   f"{existing.profile}@{existing.placement.start} ({existing.uuid})")
            compute = sum(self._profile_of(spec, m).compute_slices for m in state.instances) + prof.compute_slices
            if compute > spec.model.compute_slice_count:
                raise MigError(f"GPU {gpu.index}: not enough compute slices left for {prof.name}")
            used = {m.gpu_instance_id for m in state.instances}
            gi_id = next((i for i in range(1, 15) if i not in used), None)
            if gi_id is None:
                raise MigError(f"GPU {gpu.index}: no free GPU instance id")
            if not state.mig_enabled:
                _log.info("enabling MIG mode", gpu=gpu.index, uuid=state.uuid)
                state.mig_enabled = True
            mig = self._make_mig(spec, state.uuid, prof.name, allowed.start, gi_id, 0)
            state.instances.append(mig)
            state.instances.sort(key=lambda m: m.placement.start)
            self._save_state()
            snapshot = self._snapshot()
        if self.dev_root is not None:
            create_fake_device_files(self.dev_root, snapshot)
        _log.info("created MIG instance", gpu=gpu.index, profile=prof.name, start=allowed.start, uuid=mig.uuid)
        return mig

    def destroy_mig_instance(self, mig: MigDevice) -> None:
        with self._lock:
            self._load_state()
            for state in self._gpus:
                if state.uuid != mig.parent_uuid:
                    continue
                before = len(state.instances)
                state.instances = [m for m in state.instances if m.uuid != mig.uuid]
                if len(state.instances) != before:
                    self._save_state()
                    _log.info("destroyed MIG instance", gpu=state.spec.index, uuid=mig.uuid)
                return

    # helpers ------------------------------------------------------------------------------------

    def _state_for(self, uuid_: str) -> _GpuState:
        for state in self._gpus:
            if state.uuid == uuid_:
                return state
        raise MigError(f"no GPU with UUID {uuid_} on simulated node {self.node_name}")

    @staticmethod
    def _profile_of(spec: GpuSpec, mig: MigDevice) -> MigProfile:
        prof = spec.model.profile(mig.profile)
        assert prof is not None
        return prof

    @staticmethod
    def _make_mig(spec: GpuSpec, parent_uuid: str, profile: str, start: int, gi: int, ci: int) -> MigDevice:
        prof = spec.model.profile(profile)
        assert prof is not None
        placement = next(p for p in prof.placements if p.start == start)
        return MigDevice(
            uuid=mig_uuid(parent_uuid, profile, placement),
            profile=profile,
            parent_uuid=parent_uuid,
            memory_bytes=prof.memory_bytes,
            multiprocessors=prof.multiprocessors,
            gpu_instance_id=gi,
            compute_instance_id=ci,
            placement=placement,
            profile_id=gi_profile_id(prof),
            engines=prof.engines,
        )

    def _snapshot(self) -> list[Gpu]:
        result = []
        for state in self._gpus:
            spec, model = state.spec, state.spec.model
            result.append(Gpu(
                index=spec.index,
                minor=spec.minor,
                uuid=state.uuid,
                product_name=model.product_name,
                brand=model.brand,
                architecture=model.architecture,
                cuda_compute_capability=model.cuda_compute_capability,
                driver_version=self.profile.driver_version,
                cuda_driver_version=self.profile.cuda_driver_version,
                memory_bytes=model.memory_bytes,
                multiprocessors=model.multiprocessors,
                pci=PciInfo(bus_id=spec.pci_bus_id, pcie_root=spec.pcie_root, numa_node=spec.numa_node),
                mig_capable=model.mig_capable,
                mig_enabled=state.mig_enabled,
                mig_devices=tuple(state.instances) if state.mig_enabled else (),
                mig_profiles=model.mig_profiles,
                extra={"backend": "simulated", "profile": self.profile.name},
            ))
        return result

    def _load_state(self) -> None:
        if self.state_file is None or not self.state_file.exists():
            return
        try:
            data = json.loads(self.state_file.read_text())
            if data.get("node") != self.node_name or data.get("profile") != self.profile.name:
                _log.warning("ignoring simulated GPU state of another node/profile", file=str(self.state_file))
                return
            for state in self._gpus:
                saved = data["gpus"].get(state.uuid)
                if saved is None:
                    continue
                instances = [self._make_mig(state.spec, state.uuid, m["profile"], int(m["start"]),
                                            int(m["gpuInstanceId"]), int(m["computeInstanceId"]))
                             for m in saved["instances"]]
                state.mig_enabled = bool(saved["migEnabled"])
                state.instances = sorted(instances, key=lambda m: m.placement.start)
        except (OSError, ValueError, KeyError, TypeError, AssertionError, StopIteration) as exc:
            _log.warning("ignoring unreadable simulated GPU state", file=str(self.state_file), error=str(exc))

    def _save_state(self) -> None:
        if self.state_file is None:
            return
        data = {
            "node": self.node_name,
            "profile": self.profile.name,
            "gpus": {
                s.uuid: {
                    "migEnabled": s.mig_enabled,
                    "instances": [{"profile": m.profile, "start": m.placement.start,
                                   "gpuInstanceId": m.gpu_instance_id, "computeInstanceId": m.compute_instance_id}
                                  for m in s.instances],
                } for s in self._gpus
            },
        }
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.state_file, json.dumps(data, indent=2, sort_keys=True).encode(), 0o644)
