"""A deterministic simulated GPU backend: whole nodes described as data (``dra_driver/profiles``).

A profile is a YAML document describing one node: driver versions, GPU *models* (product data and
the MIG profile catalogue with placements) and the GPUs (index, PCI address, NUMA node, PCIe root,
MIG mode and existing MIG instances). Parsing is strict: every problem raises ``ValueError`` whose
message starts with the field path, e.g. ``gpus[2].mig.instances[1].profile: …``.

UUIDs are derived from the node name (uuid5), so two simulated nodes never share a GPU UUID and a
restarted plugin sees the same UUIDs again. MIG instances created for dynamic MIG get a UUID derived
from parent UUID + profile + placement.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from dra_driver import logs
from dra_driver.node.discovery.model import Gpu, MigDevice, MigPlacement, MigProfile, PciInfo
from dra_driver.node.discovery.sysfs import mig_cap_minors, normalize_bus_id

MIB = 1024 * 1024
_UUID_NAMESPACE = uuid.UUID("5a0c1b7e-3d2f-4c8e-9b1a-6f4e2d7c8a90")
_VERSION_RE = re.compile(r"^[0-9]+\.[0-9]+(\.[0-9]+)?$")
_MAJOR_MINOR_RE = re.compile(r"^[0-9]+\.[0-9]+$")
_PROFILE_RE = re.compile(r"^[0-9]+g\.[0-9]+gb(\+[a-z]+)?$")
_ROOT_RE = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")

_log = logs.get("discovery.simulated")


# --- profile data ------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuModel:
    key: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str
    memory_bytes: int
    multiprocessors: int
    mig_profiles: tuple[MigProfile, ...] = ()

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    @property
    def memory_slice_count(self) -> int:
        return max((p.start + p.size for prof in self.mig_profiles for p in prof.placements), default=0)

    @property
    def compute_slice_count(self) -> int:
        return max((prof.compute_slices for prof in self.mig_profiles), default=0)

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.name == name), None)


@dataclass(frozen=True)
class MigInstanceSpec:
    profile: str
    placement: int
    gpu_instance_id: int
    compute_instance_id: int = 0


@dataclass(frozen=True)
class GpuSpec:
    index: int
    minor: int
    model: GpuModel
    pci_bus_id: str
    numa_node: int | None
    pcie_root: str | None
    mig_enabled: bool
    instances: tuple[MigInstanceSpec, ...]
    uuid: str | None = None


@dataclass(frozen=True)
class NodeProfile:
    name: str
    description: str
    driver_version: str
    cuda_driver_version: str
    gpus: tuple[GpuSpec, ...]


def builtin_profiles() -> list[str]:
    """Names of the profiles shipped in ``dra_driver/profiles``."""
    root = resources.files("dra_driver").joinpath("profiles")
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


def load_profile(name_or_path: str | Path) -> NodeProfile:
    """A built-in profile by name (``h100-8x``) or a YAML file by path."""
    text_name = str(name_or_path)
    if "/" not in text_name and not text_name.endswith((".yaml", ".yml")):
        resource = resources.files("dra_driver").joinpath("profiles", f"{text_name}.yaml")
        if not resource.is_file():
            raise ValueError(f"unknown simulated profile {text_name!r}; built-in: {', '.join(builtin_profiles())}")
        return parse_profile(yaml.safe_load(resource.read_text()), name=text_name)
    path = Path(text_name)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read simulated profile {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"simulated profile {path} is not valid YAML: {exc}") from None
    return parse_profile(data, name=path.stem)


class _Fields:
    """Strict reader for one mapping of the profile; every error names the field path."""

    def __init__(self, value: Any, path: str, required: Iterable[str], optional: Iterable[str] = ()) -> None:
        if not isinstance(value, Mapping):
            raise ValueError(f"{path or '<root>'}: must be a mapping, got {_type(value)}")
        self.path = path
        self.data = value
        allowed = set(required) | set(optional)
        for key in value:
            if not isinstance(key, str):
                raise ValueError(f"{path or '<root>'}: keys must be strings, got {key!r}")
            if key not in allowed:
                raise ValueError(f"{self.at(key)}: unknown field (allowed: {', '.join(sorted(allowed))})")
        for key in required:
            if key not in value:
                raise ValueError(f"{self.at(key)}: required field is missing")

    def at(self, key: str) -> str:
        return _field_path(self.path, key)

    def has(self, key: str) -> bool:
        return key in self.data

    def get_str(self, key: str, default: str | None = None, pattern: re.Pattern[str] | None = None) -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str) or not value:
            raise ValueError(f"{self.at(key)}: must be a non-empty string, got {_type(value)}")
        if pattern is not None and not pattern.match(value):
            raise ValueError(f"{self.at(key)}: {value!r} does not match {pattern.pattern}")
        return value

    def get_int(self, key: str, default: int | None = None, minimum: int = 0, nullable: bool = False) -> int | None:
        value = self.data.get(key, default)
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{self.at(key)}: must be an integer, got {_type(value)}")
        if value < minimum:
            raise ValueError(f"{self.at(key)}: must be >= {minimum}, got {value}")
        return value

    def req_int(self, key: str, default: int | None = None, minimum: int = 0) -> int:
        value = self.get_int(key, default, minimum)
        assert value is not None
        return value

    def get_bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise ValueError(f"{self.at(key)}: must be true or false, got {_type(value)}")
        return value

    def get_list(self, key: str) -> list[Any]:
        value = self.data.get(key, [])
        if not isinstance(value, list):
            raise ValueError(f"{self.at(key)}: must be a list, got {_type(value)}")
        return value


_PLAIN_KEY = re.compile(r"^[\w-]+$")


def _field_path(path: str, key: Any) -> str:
    # An empty or odd key is quoted, so that an error message still names the field.
    name = key if isinstance(key, str) and _PLAIN_KEY.match(key) else repr(key)
    return f"{path}.{name}" if path else name


def _type(value: Any) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r}"


def parse_profile(data: Any, name: str = "custom") -> NodeProfile:
    """Validate a decoded profile document; raises ValueError naming the offending field path."""
    top = _Fields(data, "", required=("driverVersion", "cudaDriverVersion", "models", "gpus"),
                  optional=("description",))
    driver_version = top.get_str("driverVersion", pattern=_VERSION_RE)
    cuda_version = top.get_str("cudaDriverVersion", pattern=_MAJOR_MINOR_RE)
    description = top.get_str("description") if top.has("description") else name

    models_raw = top.data["models"]
    if not isinstance(models_raw, Mapping) or not models_raw:
        raise ValueError(f"models: must be a non-empty mapping of model key to model, got {_type(models_raw)}")
    models = {str(key): _parse_model(str(key), value, _field_path("models", key)) for key, value in models_raw.items()}

    gpus_raw = top.get_list("gpus")
    if not gpus_raw:
        raise ValueError("gpus: must list at least one GPU")
    gpus: list[GpuSpec] = []
    seen: dict[str, dict[object, int]] = {"index": {}, "minor": {}, "pciBusId": {}, "uuid": {}}
    for i, raw in enumerate(gpus_raw):
        gpu = _parse_gpu(raw, f"gpus[{i}]", models)
        for key, value in (("index", gpu.index), ("minor", gpu.minor), ("pciBusId", gpu.pci_bus_id),
                           ("uuid", gpu.uuid)):
            if value is None:
                continue
            if value in seen[key]:
                raise ValueError(f"gpus[{i}].{key}: duplicate value {value!r} (also gpus[{seen[key][value]}])")
            seen[key][value] = i
        gpus.append(gpu)
    gpus.sort(key=lambda g: g.index)
    return NodeProfile(name=name, description=description, driver_version=driver_version,
                       cuda_driver_version=cuda_version, gpus=tuple(gpus))


def _parse_model(key: str, raw: Any, path: str) -> GpuModel:
    f = _Fields(raw, path,
                required=("productName", "brand", "architecture", "cudaComputeCapability", "memoryMiB",
                          "multiprocessors"),
                optional=("migProfiles",))
    profiles: list[MigProfile] = []
    for j, praw in enumerate(f.get_list("migProfiles")):
        ppath = f"{path}.migProfiles[{j}]"
        pf = _Fields(praw, ppath, required=("name", "memoryMiB", "multiprocessors", "computeSlices",
                                            "memorySlices", "placements"))
        pname = pf.get_str("name", pattern=_PROFILE_RE)
        if any(p.name == pname for p in profiles):
            raise ValueError(f"{ppath}.name: duplicate MIG profile {pname!r}")
        size = pf.req_int("memorySlices", minimum=1)
        placements: list[MigPlacement] = []
        starts = pf.get_list("placements")
        if not starts:
            raise ValueError(f"{ppath}.placements: must list at least one placement start")
        for k, start in enumerate(starts):
            if isinstance(start, bool) or not isinstance(start, int) or start < 0:
                raise ValueError(f"{ppath}.placements[{k}]: must be a non-negative integer, got {_type(start)}")
            if start % size != 0 and size > 1:
                raise ValueError(f"{ppath}.placements[{k}]: start {start} is not aligned to the size {size}")
            if any(p.start == start for p in placements):
                raise ValueError(f"{ppath}.placements[{k}]: duplicate start {start}")
            placements.append(MigPlacement(start=start, size=size))
        profiles.append(MigProfile(
            name=pname,
            memory_bytes=pf.req_int("memoryMiB", minimum=1) * MIB,
            multiprocessors=pf.req_int("multiprocessors", minimum=1),
            memory_slices=size,
            compute_slices=pf.req_int("computeSlices", minimum=1),
            placements=tuple(placements),
        ))
    model = GpuModel(
        key=key,
        product_name=f.get_str("productName"),
        brand=f.get_str("brand"),
        architecture=f.get_str("architecture"),
        cuda_compute_capability=f.get_str("cudaComputeCapability", pattern=_MAJOR_MINOR_RE),
        memory_bytes=f.req_int("memoryMiB", minimum=1) * MIB,
        multiprocessors=f.req_int("multiprocessors", minimum=1),
        mig_profiles=tuple(profiles),
    )
    for j, prof in enumerate(model.mig_profiles):
        if prof.memory_bytes > model.memory_bytes:
            raise ValueError(f"{path}.migProfiles[{j}].memoryMiB: larger than the GPU's memory")
        if prof.multiprocessors > model.multiprocessors:
            raise ValueError(f"{path}.migProfiles[{j}].multiprocessors: more than the GPU's {model.multiprocessors}")
        if prof.memory_slices > 8:
            raise ValueError(f"{path}.migProfiles[{j}].memorySlices: at most 8 memory slices per GPU")
        for k, pl in enumerate(prof.placements):
            if pl.start + pl.size > 8:
                raise ValueError(f"{path}.migProfiles[{j}].placements[{k}]: ends past memory slice 7")
    return model


def _parse_gpu(raw: Any, path: str, models: Mapping[str, GpuModel]) -> GpuSpec:
    f = _Fields(raw, path, required=("index", "model", "pciBusId"),
                optional=("minor", "numaNode", "pcieRoot", "mig", "uuid"))
    index = f.req_int("index")
    model_key = f.get_str("model")
    model = models.get(model_key)
    if model is None:
        raise ValueError(f"{path}.model: unknown model {model_key!r} (defined: {', '.join(sorted(models))})")
    bus_text = f.get_str("pciBusId")
    try:
        bus_id = normalize_bus_id(bus_text)
    except ValueError:
        raise ValueError(f"{path}.pciBusId: {bus_text!r} is not a PCI bus ID (dddd:bb:dd.f)") from None
    root: str | None = None
    if f.has("pcieRoot") and f.data["pcieRoot"] is not None:
        root = f.get_str("pcieRoot", pattern=_ROOT_RE)
    gpu_uuid = None
    if f.has("uuid"):
        gpu_uuid = f.get_str("uuid", pattern=re.compile(r"^GPU-[0-9a-f-]{36}$"))

    mig_enabled = False
    instances: list[MigInstanceSpec] = []
    if f.has("mig"):
        mpath = f"{path}.mig"
        mf = _Fields(f.data["mig"], mpath, required=("enabled",), optional=("instances",))
        mig_enabled = mf.get_bool("enabled", False)
        raw_instances = mf.get_list("instances")
        if (mig_enabled or raw_instances) and not model.mig_capable:
            raise ValueError(f"{mpath}: model {model_key!r} is not MIG-capable (it has no migProfiles)")
        if raw_instances and not mig_enabled:
            raise ValueError(f"{mpath}.instances: MIG instances listed but mig.enabled is false")
        instances = _parse_instances(raw_instances, f"{mpath}.instances", model)

    return GpuSpec(
        index=index,
        minor=f.req_int("minor", default=index),
        model=model,
        pci_bus_id=bus_id,
        numa_node=f.get_int("numaNode", default=None, nullable=True),
        pcie_root=root,
        mig_enabled=mig_enabled,
        instances=tuple(instances),
        uuid=gpu_uuid,
    )


def _parse_instances(raw_instances: Sequence[Any], path: str, model: GpuModel) -> list[MigInstanceSpec]:
    parsed: list[tuple[MigInstanceSpec, MigProfile, MigPlacement]] = []
    used_ids: set[int] = set()
    compute_used = 0
    for j, raw in enumerate(raw_instances):
        ipath = f"{path}[{j}]"
        f = _Fields(raw, ipath, required=("profile", "placement"), optional=("gpuInstanceId", "computeInstanceId"))
        pname = f.get_str("profile")
        prof = model.profile(pname)
        if prof is None:
            raise ValueError(f"{ipath}.profile: {pname!r} is not a MIG profile of {model.product_name} "
                             f"(known: {', '.join(p.name for p in model.mig_profiles)})")
        start = f.req_int("placement")
        placement = next((p for p in prof.placements if p.start == start), None)
        if placement is None:
            raise ValueError(f"{ipath}.placement: {pname} cannot start at memory slice {start} "
                             f"(allowed: {', '.join(str(p.start) for p in prof.placements)})")
        for k, (other, _, other_pl) in enumerate(parsed):
            if _overlaps(placement, other_pl):
                raise ValueError(f"{ipath}.placement: {pname}@{start} overlaps {path}[{k}] "
                                 f"({other.profile}@{other.placement})")
        compute_used += prof.compute_slices
        if compute_used > model.compute_slice_count:
            raise ValueError(f"{ipath}.profile: {pname} does not fit: the instances need {compute_used} compute "
                             f"slices, the GPU has {model.compute_slice_count}")
        gi_id: int | None = f.get_int("gpuInstanceId", default=None, minimum=1, nullable=True)
        if gi_id is not None:
            if gi_id in used_ids:
                raise ValueError(f"{ipath}.gpuInstanceId: duplicate GPU instance id {gi_id}")
            if gi_id > 14:
                raise ValueError(f"{ipath}.gpuInstanceId: must be <= 14, got {gi_id}")
            used_ids.add(gi_id)
        ci_id = f.req_int("computeInstanceId", default=0)
        if ci_id > 7:
            raise ValueError(f"{ipath}.computeInstanceId: must be <= 7, got {ci_id}")
        parsed.append((MigInstanceSpec(pname, start, gi_id or 0, ci_id), prof, placement))
    # Give instances without an explicit id the lowest free ids, in listed order.
    result: list[MigInstanceSpec] = []
    for spec, _, _ in parsed:
        if spec.gpu_instance_id == 0:
            free = next(i for i in range(1, 15) if i not in used_ids)
            used_ids.add(free)
            spec = replace(spec, gpu_instance_id=free)
        result.append(spec)
    return result


def _overlaps(a: MigPlacement, b: MigPlacement) -> bool:
    return a.start < b.start + b.size and b.start < a.start + a.size


# --- deterministic identities --------------------------------------------------------------------


def gpu_uuid(node_name: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/gpu/{index}')}"


def mig_uuid(parent_uuid: str, profile: str, placement: MigPlacement) -> str:
    return f"MIG-{uuid.uuid5(_UUID_NAMESPACE, f'{parent_uuid}/mig/{profile}/{placement.start}/{placement.size}')}"


# --- fake /dev -----------------------------------------------------------------------------------


# Majors the NVIDIA driver uses: nvidiaN and nvidiactl (minor 255) share 195; nvidia-uvm and the
# capability nodes get dynamic majors on a real host, so any unused numbers do here.
NVIDIA_MAJOR, UVM_MAJOR, CAPS_MAJOR = 195, 235, 236


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
    if not path.is_symlink() and path.exists() and stat.S_ISCHR(path.stat().st_mode):
        return
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
    real GPUs keep them; ``dev_root`` (optional) gets fake device files for every GPU and MIG
    instance.
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
                if _overlaps(existing.placement, allowed):
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
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        with open(tmp, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.state_file)
