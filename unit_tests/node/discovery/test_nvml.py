"""The NVML backend against a fake ``pynvml`` module (no GPU, no libnvidia-ml needed)."""

from __future__ import annotations

import ctypes
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_driver.node.discovery import nvml as nvml_mod
from dra_driver.node.discovery import sysfs
from dra_driver.node.discovery.model import MigPlacement
from dra_driver.node.discovery.nvml import NvmlBackend, NvmlError, format_cuda_version, nvml_available

MIB = 1024 * 1024

# (profile index, id, name, slices, memory MiB, SMs, placements (start, size))
H100_PROFILES = [
    (0, 19, "MIG 1g.10gb", 1, 9984, 16, [(i, 1) for i in range(7)]),
    (1, 14, "MIG 2g.20gb", 2, 20096, 32, [(0, 2), (2, 2), (4, 2)]),
    (2, 9, "MIG 3g.40gb", 3, 40448, 60, [(0, 4), (4, 4)]),
    (3, 5, "MIG 4g.40gb", 4, 40448, 64, [(0, 4)]),
    (4, 0, "MIG 7g.80gb", 7, 81152, 132, [(0, 8)]),
    (9, 15, "MIG 1g.20gb", 1, 20096, 26, [(0, 2), (2, 2), (4, 2), (6, 2)]),
]


def err(code: int) -> Exception:
    error: Exception = pynvml.NVMLError(code)
    return error


@dataclass
class FakeGi:
    gpu: FakeGpu
    id: int
    profile_id: int
    start: int
    size: int
    cis: dict[int, int] = field(default_factory=dict)  # ci id → slices


@dataclass
class FakeMig:
    gi: FakeGi
    ci: int

    @property
    def uuid(self) -> str:
        return f"MIG-{self.gi.gpu.index:08d}-0000-0000-0000-{self.gi.id:06d}{self.ci:06d}"


@dataclass
class FakeGpu:
    index: int
    name: str
    uuid: str
    bus: str
    minor: int
    memory: int
    cc: tuple[int, int]
    brand: int
    arch: int
    sms: int
    mig: int | None  # None = not supported
    profiles: list[Any] = field(default_factory=list)
    gis: dict[int, FakeGi] = field(default_factory=dict)


class FakeNvml(types.ModuleType):
    def __init__(self, gpus: list[FakeGpu]) -> None:
        super().__init__("pynvml")
        self.NVMLError = pynvml.NVMLError
        self.gpus = gpus
        self.calls: list[str] = []
        self.init_error: int | None = None
        self.set_mig_error: int | None = None
        self.modes: dict[int, int] = {}
        self.c_nvmlGpuInstancePlacement_t = pynvml.c_nvmlGpuInstancePlacement_t
        self.NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
        self.NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 9
        self.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0

    # system
    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise err(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.95.05"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 13000

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        for g in self.gpus:
            if g.uuid == uuid:
                return g
        raise err(6)

    # device
    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return str(h.uuid)

    def nvmlDeviceGetName(self, h: FakeGpu) -> bytes:
        return h.name.encode()

    def nvmlDeviceGetMinorNumber(self, h: FakeGpu) -> int:
        return h.minor

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        if isinstance(h, FakeMig):
            prof = next(p for p in h.gi.gpu.profiles if p[1] == h.gi.profile_id)
            return types.SimpleNamespace(total=prof[4] * MIB)
        return types.SimpleNamespace(total=h.memory)

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> Any:
        return types.SimpleNamespace(busId=h.bus.encode())

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeGpu) -> tuple[int, int]:
        return h.cc

    def nvmlDeviceGetBrand(self, h: FakeGpu) -> int:
        return h.brand

    def nvmlDeviceGetArchitecture(self, h: FakeGpu) -> int:
        if h.arch < 0:
            raise err(3)
        return h.arch

    def nvmlDeviceGetAttributes(self, h: Any) -> Any:
        if isinstance(h, FakeMig):
            prof = next(p for p in h.gi.gpu.profiles if p[1] == h.gi.profile_id)
            return types.SimpleNamespace(multiprocessorCount=prof[5], gpuInstanceSliceCount=prof[3],
                                         computeInstanceSliceCount=h.gi.cis[h.ci], memorySizeMB=prof[4])
        return types.SimpleNamespace(multiprocessorCount=h.sms)

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> list[int]:
        if h.mig is None:
            raise err(3)
        return [h.mig, h.mig]

    def nvmlDeviceSetMigMode(self, h: FakeGpu, mode: int) -> int:
        self.calls.append(f"setmig {h.index} {mode}")
        if self.set_mig_error is not None:
            raise err(self.set_mig_error)
        h.mig = mode
        return 0

    def nvmlDeviceGetComputeMode(self, h: FakeGpu) -> int:
        return self.modes.get(h.index, 0)

    def nvmlDeviceSetComputeMode(self, h: FakeGpu, mode: int) -> None:
        self.calls.append(f"setmode {h.index} {mode}")
        if self.set_mig_error is not None:
            raise err(self.set_mig_error)
        self.modes[h.index] = mode

    # MIG catalogue
    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: FakeGpu, idx: int) -> Any:
        for p in h.profiles:
            if p[0] == idx:
                return types.SimpleNamespace(id=p[1], name=p[2].encode(), sliceCount=p[3], memorySizeMB=p[4],
                                             multiprocessorCount=p[5], instanceCount=len(p[6]))
        raise err(3)

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, h: FakeGpu, pid: int, array: Any, count: Any) -> int:
        prof = next(p for p in h.profiles if p[1] == pid)
        for i, (start, size) in enumerate(prof[6]):
            array[i].start, array[i].size = start, size
        count.contents.value = len(prof[6])
        return 0

    # MIG devices
    def _migs(self, h: FakeGpu) -> list[FakeMig]:
        return [FakeMig(gi, ci) for gi in sorted(h.gis.values(), key=lambda g: g.id) for ci in sorted(gi.cis)]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeGpu) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeGpu, i: int) -> FakeMig:
        migs = self._migs(h)
        if i >= len(migs):
            raise err(6)
        return migs[i]

    def nvmlDeviceGetGpuInstanceId(self, m: FakeMig) -> int:
        return m.gi.id

    def nvmlDeviceGetComputeInstanceId(self, m: FakeMig) -> int:
        return m.ci

    def nvmlDeviceGetGpuInstanceById(self, h: FakeGpu, gi_id: int) -> FakeGi:
        if gi_id not in h.gis:
            raise err(6)
        return h.gis[gi_id]

    def nvmlGpuInstanceGetInfo(self, gi: FakeGi) -> Any:
        return types.SimpleNamespace(id=gi.id, profileId=gi.profile_id,
                                     placement=types.SimpleNamespace(start=gi.start, size=gi.size))

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, h: FakeGpu, pid: int, placement_ref: Any) -> FakeGi:
        # The C function takes a pointer: a bare Structure would go by value.
        assert type(placement_ref).__name__ == "CArgObject", "the placement must be passed by reference"
        placement = placement_ref._obj
        self.calls.append(f"create-gi {h.index} {pid} {placement.start}")
        for gi in h.gis.values():
            if gi.start < placement.start + placement.size and placement.start < gi.start + gi.size:
                raise err(23)
        gi_id = next(i for i in range(1, 15) if i not in h.gis)
        gi = FakeGi(h, gi_id, pid, placement.start, placement.size)
        h.gis[gi_id] = gi
        return gi

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: FakeGi, idx: int, engine: int) -> Any:
        slices = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}
        if idx not in slices:
            raise err(3)
        return types.SimpleNamespace(id=idx, sliceCount=slices[idx])

    def nvmlGpuInstanceCreateComputeInstance(self, gi: FakeGi, ci_profile: int) -> tuple[FakeGi, int]:
        self.calls.append(f"create-ci {gi.id} {ci_profile}")
        ci = len(gi.cis)
        gi.cis[ci] = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}[ci_profile]
        return (gi, ci)

    def nvmlComputeInstanceGetInfo(self, ci: tuple[FakeGi, int]) -> Any:
        return types.SimpleNamespace(id=ci[1])

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: FakeGi, ci: int) -> tuple[FakeGi, int]:
        if ci not in gi.cis:
            raise err(6)
        return (gi, ci)

    def nvmlComputeInstanceDestroy(self, ci: tuple[FakeGi, int]) -> None:
        self.calls.append(f"destroy-ci {ci[0].id} {ci[1]}")
        del ci[0].cis[ci[1]]

    def nvmlGpuInstanceDestroy(self, gi: FakeGi) -> None:
        self.calls.append(f"destroy-gi {gi.id}")
        if gi.cis:
            raise err(19)
        del gi.gpu.gis[gi.id]


def make_fake() -> FakeNvml:
    h100 = FakeGpu(0, "NVIDIA H100 80GB HBM3", "GPU-11111111-2222-3333-4444-555555555555", "00000000:18:00.0",
                   0, 81559 * MIB, (9, 0), 14, 9, 132, 1, profiles=list(H100_PROFILES))
    gi = FakeGi(h100, 2, 9, 4, 4, {0: 3})  # 3g.40gb @ 4
    small = FakeGi(h100, 9, 19, 0, 1, {0: 1})  # 1g.10gb @ 0
    h100.gis = {2: gi, 9: small}
    l4 = FakeGpu(1, "NVIDIA L4", "GPU-aaaaaaaa-2222-3333-4444-555555555555", "00000000:81:00.0", 1,
                 23034 * MIB, (8, 9), 14, -1, 58, None)
    h100b = FakeGpu(2, "NVIDIA H100 80GB HBM3", "GPU-bbbbbbbb-2222-3333-4444-555555555555", "00000000:2A:00.0",
                    2, 81559 * MIB, (9, 0), 14, 9, 132, 0, profiles=list(H100_PROFILES))
    return FakeNvml([h100, l4, h100b])


@pytest.fixture
def fake_sysfs(tmp_path: Path) -> Path:
    sysfs.make_fake_pci_device(tmp_path, "0000:18:00.0", "pci0000:10", 0)
    sysfs.make_fake_pci_device(tmp_path, "0000:81:00.0", "pci0000:80", None)
    return tmp_path


def test_discover(fake_sysfs: Path) -> None:
    fake = make_fake()
    backend = NvmlBackend(sysfs_root=fake_sysfs, nvml_module=fake)
    gpus = backend.discover()
    assert len(gpus) == 3
    g0, l4, g2 = gpus
    assert g0.product_name == "NVIDIA H100 80GB HBM3" and g0.brand == "Nvidia" and g0.architecture == "Hopper"
    assert g0.cuda_compute_capability == "9.0" and g0.driver_version == "580.95.05"
    assert g0.cuda_driver_version == "13.0" and g0.memory_bytes == 81559 * MIB and g0.multiprocessors == 132
    assert g0.pci.bus_id == "0000:18:00.0" and g0.pci.numa_node == 0 and g0.pci.pcie_root == "pci0000:10"
    assert g0.mig_capable and g0.mig_enabled
    assert [p.name for p in g0.mig_profiles] == ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.20gb"]
    three = g0.mig_profiles[2]
    assert three.memory_slices == 4 and three.compute_slices == 3 and three.multiprocessors == 60
    assert [(p.start, p.size) for p in three.placements] == [(0, 4), (4, 4)]
    assert [(m.profile, m.gpu_instance_id, m.compute_instance_id, m.placement.start) for m in g0.mig_devices] == [
        ("1g.10gb", 9, 0, 0), ("3g.40gb", 2, 0, 4)]
    assert g0.mig_devices[1].memory_bytes == 40448 * MIB and g0.mig_devices[1].multiprocessors == 60
    assert all(m.parent_uuid == g0.uuid for m in g0.mig_devices)
    # L4: no MIG, architecture from compute capability (NVML arch not supported), unknown NUMA
    assert not l4.mig_capable and not l4.mig_profiles and l4.architecture == "Ada Lovelace"
    assert l4.pci.numa_node is None and l4.pci.pcie_root == "pci0000:80"
    # GPU 2: MIG-capable, disabled; no sysfs entry at all
    assert g2.mig_capable and not g2.mig_enabled and not g2.mig_devices and g2.mig_profiles
    assert g2.pci.bus_id == "0000:2a:00.0" and g2.pci.numa_node is None and g2.pci.pcie_root is None
    backend.close()
    backend.close()
    assert fake.calls.count("shutdown") == 1


def test_ci_smaller_than_gi_gets_c_prefix(fake_sysfs: Path) -> None:
    fake = make_fake()
    fake.gpus[0].gis[2].cis = {0: 1}
    gpus = NvmlBackend(sysfs_root=fake_sysfs, nvml_module=fake).discover()
    assert gpus[0].mig_devices[1].profile == "1c.3g.40gb"


def test_create_and_destroy_mig(fake_sysfs: Path) -> None:
    fake = make_fake()
    backend = NvmlBackend(sysfs_root=fake_sysfs, nvml_module=fake)
    g2 = backend.discover()[2]
    prof = next(p for p in g2.mig_profiles if p.name == "3g.40gb")
    mig = backend.create_mig_instance(g2, prof, MigPlacement(0, 4))
    assert "setmig 2 1" in fake.calls  # MIG mode enabled on demand
    assert mig.profile == "3g.40gb" and mig.placement == MigPlacement(0, 4) and mig.parent_uuid == g2.uuid
    assert "create-ci 1 2" in fake.calls  # full-GI compute instance (3 slices)
    calls = len(fake.calls)
    assert backend.create_mig_instance(g2, prof, MigPlacement(0, 4)) == mig  # idempotent
    assert not [c for c in fake.calls[calls:] if c.startswith("create")]
    with pytest.raises(NvmlError, match="insufficient free MIG resources"):
        backend.create_mig_instance(g2, g2.mig_profiles[0], MigPlacement(1, 1))
    assert backend.discover()[2].mig_devices == (mig,)
    backend.destroy_mig_instance(mig)
    assert not backend.discover()[2].mig_devices
    backend.destroy_mig_instance(mig)  # already gone: no error


def test_create_rolls_back_gi_when_ci_fails(fake_sysfs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = make_fake()
    backend = NvmlBackend(sysfs_root=fake_sysfs, nvml_module=fake)
    g2 = backend.discover()[2]

    def boom(gi: Any, profile: int) -> None:
        raise err(4)

    monkeypatch.setattr(fake, "nvmlGpuInstanceCreateComputeInstance", boom)
    with pytest.raises(NvmlError, match="insufficient permissions"):
        backend.create_mig_instance(g2, g2.mig_profiles[4], MigPlacement(0, 8))
    assert not fake.gpus[2].gis and any(c.startswith("destroy-gi") for c in fake.calls)


def test_compute_mode_is_read_and_set_by_nvidia_smis_names(fake_sysfs: Path) -> None:
    fake = make_fake()
    backend = NvmlBackend(sysfs_root=fake_sysfs, nvml_module=fake)
    uuid = backend.discover()[1].uuid
    assert backend.compute_mode(uuid) == "Default"
    backend.set_compute_mode(uuid, "EXCLUSIVE_PROCESS")
    assert backend.compute_mode(uuid) == "Exclusive_Process" and fake.calls[-1] == "setmode 1 3"
    with pytest.raises(NvmlError, match="'EXCLUSIVE_THREAD' is not a compute mode to set"):
        backend.set_compute_mode(uuid, "EXCLUSIVE_THREAD")
    fake.set_mig_error = 4
    with pytest.raises(NvmlError, match=f"GPU {uuid}: setting the compute mode to DEFAULT: insufficient permissions"):
        backend.set_compute_mode(uuid, "DEFAULT")


def broken(what: str) -> Callable[..., Any]:
    """An NVML function of the fake with a bug of ours behind it: not an NVMLError."""
    def call(*_args: Any) -> Any:
        raise TypeError(f"{what} was called wrongly")

    return call


@pytest.mark.parametrize("function", [
    "nvmlDeviceGetBrand", "nvmlDeviceGetArchitecture", "nvmlDeviceGetAttributes",  # optional: 'not supported'
    "nvmlDeviceGetName",  # required: an NvmlError closes the node's publishing
    "nvmlDeviceGetMigMode", "nvmlDeviceGetGpuInstanceProfileInfo", "nvmlDeviceGetGpuInstancePossiblePlacements",
    "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlGpuInstanceGetInfo",
])
def test_a_bug_in_discovery_is_no_nvml_answer(fake_sysfs: Path, function: str) -> None:
    """Only pynvml's NVMLError is NVML saying no: a bug behind any call is raised as itself, never
    read as 'not supported', a skipped MIG device or an NvmlError (which the plugin takes for a node
    without NVML, and publishes nothing)."""
    fake = make_fake()
    setattr(fake, function, broken(function))
    backend = NvmlBackend(sysfs_root=fake_sysfs, nvml_module=fake)
    with pytest.raises(TypeError, match=f"{function} was called wrongly"):
        backend.discover()


def test_the_plugin_publishes_nothing_without_nvml_and_fails_on_a_bug(fake_sysfs: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from dra_driver.cli import build_parser
    from dra_driver.node import plugin
    from dra_driver.node.publish import gate
    from dra_driver.node.settings import plugin_settings

    fake = make_fake()
    monkeypatch.setattr(nvml_mod, "load_pynvml", lambda: fake)
    settings = plugin_settings(build_parser().parse_args([
        "kubelet-plugin", "--node-name=n", "--gpu-backend=nvml", f"--sysfs-root={fake_sysfs}",
        f"--state-dir={tmp_path / 'state'}"]), environ={})
    backend, gpus, closed = plugin.discover(settings)
    assert backend is not None and len(gpus) == 3 and closed is None
    def no_driver() -> int:
        raise err(9)

    fake.nvmlDeviceGetCount = no_driver  # type: ignore[method-assign]
    backend, gpus, closed = plugin.discover(settings)
    assert backend is None and gpus == [] and closed is not None and closed.reason == gate.BACKEND_UNAVAILABLE
    assert "counting GPUs: the NVIDIA kernel driver is not loaded (NVML error 9)" in closed.message
    fake.nvmlDeviceGetCount = broken("nvmlDeviceGetCount")  # type: ignore[method-assign]
    with pytest.raises(TypeError, match="nvmlDeviceGetCount was called wrongly"):
        plugin.discover(settings)


def test_a_bug_while_creating_a_mig_instance_rolls_it_back_and_is_raised(fake_sysfs: Path) -> None:
    fake = make_fake()
    backend = NvmlBackend(sysfs_root=fake_sysfs, nvml_module=fake)
    g2 = backend.discover()[2]
    fake.nvmlGpuInstanceGetComputeInstanceProfileInfo = broken("profile info")  # type: ignore[method-assign]
    with pytest.raises(TypeError, match="profile info was called wrongly"):
        backend.create_mig_instance(g2, g2.mig_profiles[4], MigPlacement(0, 8))
    assert not fake.gpus[2].gis and any(c.startswith("destroy-gi") for c in fake.calls)


def test_a_bug_while_destroying_a_mig_instance_is_raised(fake_sysfs: Path) -> None:
    fake = make_fake()
    backend = NvmlBackend(sysfs_root=fake_sysfs, nvml_module=fake)
    mig = backend.discover()[0].mig_devices[0]
    fake.nvmlGpuInstanceGetComputeInstanceById = broken("the CI lookup")  # type: ignore[method-assign]
    with pytest.raises(TypeError, match="the CI lookup was called wrongly"):
        backend.destroy_mig_instance(mig)


def test_enabling_mig_needs_permission(fake_sysfs: Path) -> None:
    fake = make_fake()
    fake.set_mig_error = 4
    backend = NvmlBackend(sysfs_root=fake_sysfs, nvml_module=fake)
    g2 = backend.discover()[2]
    with pytest.raises(NvmlError, match="enabling MIG mode: insufficient permissions"):
        backend.create_mig_instance(g2, g2.mig_profiles[0], MigPlacement(0, 1))


def test_unknown_profile(fake_sysfs: Path) -> None:
    fake = make_fake()
    backend = NvmlBackend(sysfs_root=fake_sysfs, nvml_module=fake)
    g0 = backend.discover()[0]
    bogus = g0.mig_profiles[0].__class__("9g.1gb", 1, 1, 1, 1, (MigPlacement(0, 1),))
    with pytest.raises(NvmlError, match="no MIG profile"):
        backend.create_mig_instance(g0, bogus, MigPlacement(6, 1))


def test_init_errors_are_explained() -> None:
    fake = make_fake()
    fake.init_error = 9
    with pytest.raises(NvmlError, match="kernel driver is not loaded") as info:
        NvmlBackend(nvml_module=fake)
    assert info.value.code == 9
    ok, reason = nvml_available(fake)
    assert not ok and "not loaded" in reason
    fake.init_error = None
    assert nvml_available(fake) == (True, "")


def test_error_mapping() -> None:
    assert "fell off the bus" in str(nvml_mod.explain(err(15), "x"))
    assert "versions differ" in str(nvml_mod.explain(err(18), "x"))
    assert str(nvml_mod.explain(RuntimeError("weird"), "doing x")) == "doing x: weird"


def test_helpers() -> None:
    assert format_cuda_version(13000) == "13.0"
    assert format_cuda_version(12080) == "12.8"
    assert nvml_mod.mig_profile_name(3, 40448) == "3g.40gb"
    assert nvml_mod.mig_profile_name(1, 4864) == "1g.5gb"
    assert nvml_mod.architecture_from_cc("7.5") == "Turing"
    assert nvml_mod.architecture_from_cc("9.0") == "Hopper"


def test_placements_buffer_is_ctypes() -> None:
    # the real pynvml expects ctypes buffers; make sure the backend passes them
    fake = make_fake()
    seen: list[Any] = []
    original = fake.nvmlDeviceGetGpuInstancePossiblePlacements

    def spy(h: Any, pid: int, array: Any, count: Any) -> int:
        seen.append((array, count))
        return original(h, pid, array, count)

    fake.nvmlDeviceGetGpuInstancePossiblePlacements = spy  # type: ignore[method-assign]
    NvmlBackend(nvml_module=fake).discover()
    array, count = seen[0]
    assert isinstance(array, ctypes.Array) and isinstance(count.contents, ctypes.c_uint)
