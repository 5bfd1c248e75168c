"""Simulated node profiles: whole nodes described as data (``dra_driver/profiles``).

A profile is a YAML document describing one node: driver versions, GPU *models* (product data and
the MIG profile catalogue with placements) and the GPUs (index, PCI address, NUMA node, PCIe root,
MIG mode and existing MIG instances). Parsing is strict: every problem raises ``ValueError`` whose
message starts with the field path, e.g. ``gpus[2].mig.instances[1].profile: …``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from dra_driver.node.discovery.model import MigEngines, MigPlacement, MigProfile
from dra_driver.node.discovery.sysfs import normalize_bus_id

MIB = 1024 * 1024
_VERSION_RE = re.compile(r"^[0-9]+\.[0-9]+(\.[0-9]+)?$")
_MAJOR_MINOR_RE = re.compile(r"^[0-9]+\.[0-9]+$")
_PROFILE_RE = re.compile(r"^[0-9]+g\.[0-9]+gb(\+[a-z]+)?$")
_ROOT_RE = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")


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


ENGINE_FIELDS = ("copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines")
"""A simulated MIG profile's engines, in MigEngines' order; default: a copy engine per compute slice
and no others (NVML's figures differ by model and profile: give them where they matter)."""


def _parse_model(key: str, raw: Any, path: str) -> GpuModel:
    f = _Fields(raw, path,
                required=("productName", "brand", "architecture", "cudaComputeCapability", "memoryMiB",
                          "multiprocessors"),
                optional=("migProfiles",))
    profiles: list[MigProfile] = []
    for j, praw in enumerate(f.get_list("migProfiles")):
        ppath = f"{path}.migProfiles[{j}]"
        pf = _Fields(praw, ppath, required=("name", "memoryMiB", "multiprocessors", "computeSlices",
                                            "memorySlices", "placements"),
                     optional=("profileId", *ENGINE_FIELDS))
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
            profile_id=pf.req_int("profileId", minimum=0) if pf.has("profileId") else None,
            engines=MigEngines(*(pf.req_int(name, minimum=0, default=pf.req_int("computeSlices", minimum=1)
                                            if name == "copyEngines" else 0) for name in ENGINE_FIELDS)),
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
            if placement.overlaps(other_pl):
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
