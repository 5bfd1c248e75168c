"""The NVML backend through the real pynvml (nvidia-ml-py) and a real libnvidia-ml.so.1: our cgo shim
over NVIDIA's mock DGX servers (``e2e/tooling/gotools/mock-nvml``), loaded from a fake driver root the
way the plugin loads it (``--nvidia-driver-root``).

Where ``test_nvml.py`` checks the backend's logic against a fake ``pynvml``, this checks what a fake
cannot: function names, argument passing, struct versions and layouts, and NVML's return codes.
The library is built from its pins on first use (about 25 s) and cached.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest.mock import Mock

import pynvml
import pytest

from dra_driver.node.describe.devices import enumerate_devices
from dra_driver.node.discovery import select
from dra_driver.node.discovery.model import Gpu
from dra_driver.node.discovery.nvml import NvmlBackend, NvmlError
from dra_driver.node.metrics import METRICS
from dra_driver.node.publish.health import HealthMonitor, NvmlEventSource
from e2e.testbed import mocknvml
from e2e.tooling import gotools

GIB = 1024**3
H100_PROFILES = {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}
A100_PROFILES = {"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}
MIG_ENV = ("DRA_MOCK_NVML_MACHINE", "DRA_MOCK_NVML_STATE", "DRA_MOCK_NVML_FAIL")


@pytest.fixture(scope="session")
def driver_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = mocknvml.make_driver_root(tmp_path_factory.mktemp("driver-root"), log=False)
    assert select.preload_nvml(root) == root / mocknvml.LIBRARY_DIR / "libnvidia-ml.so.1"
    return root


@pytest.fixture(scope="session")
def sys_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mocknvml.make_sysfs(tmp_path_factory.mktemp("sys"))


@pytest.fixture()
def open_nvml(driver_root: Path, sys_root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., NvmlBackend]]:
    """Opens the backend on a mock machine (a new NVML session reads the environment); closes it after."""
    opened: list[NvmlBackend] = []

    def open_(machine: str, state: Path | None = None, fail: str = "") -> NvmlBackend:
        for name in MIG_ENV:
            monkeypatch.delenv(name, raising=False)
        for name, value in mocknvml.environment(machine, state, fail).items():
            monkeypatch.setenv(name, value)
        backend = NvmlBackend(sysfs_root=sys_root)
        opened.append(backend)
        return backend

    yield open_
    for backend in opened:
        backend.close()


def profile(gpu: Gpu, name: str) -> Any:
    return next(p for p in gpu.mig_profiles if p.name == name)


# --- discovery ----------------------------------------------------------------------------------

def test_dgx_h100_every_gpu_as_nvml_reports_it(open_nvml: Callable[..., NvmlBackend]) -> None:
    gpus = open_nvml("dgxh100").discover()
    assert len(gpus) == 8
    for i, gpu in enumerate(gpus):
        assert (gpu.index, gpu.minor) == (i, i)
        assert gpu.product_name == "NVIDIA H100 80GB HBM3"
        assert (gpu.brand, gpu.architecture, gpu.cuda_compute_capability) == ("Nvidia", "Hopper", "9.0")
        assert (gpu.driver_version, gpu.cuda_driver_version) == ("570.172.08", "12.8")
        assert gpu.memory_bytes == 80 * GIB
        assert gpu.uuid.startswith("GPU-") and len(gpu.uuid) == 40
        assert gpu.pci.bus_id == mocknvml.bus_id(i)  # NVML's 00000000:0I:00.0, normalised
        assert gpu.pci.numa_node == mocknvml.numa_node(i)
        assert gpu.pci.pcie_root == mocknvml.pcie_root(i)
        assert (gpu.mig_capable, gpu.mig_enabled, gpu.mig_devices) == (True, False, ())
        assert {p.name for p in gpu.mig_profiles} == H100_PROFILES
        # The mock knows no SM count of a whole GPU: NVML's NOT_SUPPORTED, so none is published.
        assert gpu.multiprocessors == 0
    assert len({g.uuid for g in gpus}) == 8
    three = profile(gpus[0], "3g.40gb")
    assert (three.memory_bytes, three.multiprocessors, three.compute_slices) == (40 * GIB, 48, 3)
    assert [(p.start, p.size) for p in three.placements] == [(0, 3), (4, 3)]
    assert [(p.start, p.size) for p in profile(gpus[0], "1g.10gb").placements] == [(s, 1) for s in range(7)]
    assert [(p.start, p.size) for p in profile(gpus[0], "7g.80gb").placements] == [(0, 7)]


def test_uuids_are_stable_across_sessions_and_machines_differ(open_nvml: Callable[..., NvmlBackend]) -> None:
    first = open_nvml("dgxh100")
    uuids = [g.uuid for g in first.discover()]
    first.close()
    second = open_nvml("dgxh100")
    assert [g.uuid for g in second.discover()] == uuids
    second.close()  # a nested nvmlInit would join the open session, machine and all
    assert not set(uuids) & {g.uuid for g in open_nvml("dgxa100").discover()}


def test_dgx_a100_every_gpu_as_nvml_reports_it(open_nvml: Callable[..., NvmlBackend]) -> None:
    gpus = open_nvml("dgxa100").discover()
    assert len(gpus) == 8
    gpu = gpus[5]
    assert gpu.product_name == "Mock NVIDIA A100-SXM4-40GB"  # go-nvml's own name for it
    assert (gpu.architecture, gpu.cuda_compute_capability, gpu.memory_bytes) == ("Ampere", "8.0", 40 * GIB)
    assert (gpu.pci.bus_id, gpu.pci.numa_node) == ("0000:05:00.0", 1)
    assert {p.name for p in gpu.mig_profiles} == A100_PROFILES
    one = profile(gpu, "1g.5gb")
    assert (one.memory_bytes, one.multiprocessors, len(one.placements)) == (4864 * 2**20, 14, 7)


def test_static_mig_seeded_in_the_mock_is_discovered_and_published(open_nvml: Callable[..., NvmlBackend],
                                                                   tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    # GPU 0: 3g.20gb at 0 and two 1g.5gb at 4 and 5; GPU 1: the whole GPU as one 7g.40gb.
    state.write_text(json.dumps(mocknvml.static_mig_state("dgxa100", {0: [(2, 0), (0, 4), (0, 5)], 1: [(4, 0)]})))
    gpus = open_nvml("dgxa100", state).discover()
    assert gpus[0].mig_enabled and gpus[1].mig_enabled and not gpus[2].mig_enabled
    migs = gpus[0].mig_devices
    assert [(m.profile, m.placement.start, m.placement.size, m.gpu_instance_id, m.compute_instance_id)
            for m in migs] == [("3g.20gb", 0, 4, 1, 0), ("1g.5gb", 4, 1, 2, 0), ("1g.5gb", 5, 1, 3, 0)]
    assert [(m.memory_bytes, m.multiprocessors) for m in migs] == [(19968 * 2**20, 42), (4864 * 2**20, 14),
                                                                  (4864 * 2**20, 14)]
    assert all(m.uuid.startswith("MIG-") and m.parent_uuid == gpus[0].uuid for m in migs)
    seen = {gi["id"]: gi["computeInstances"][0]["uuid"] for _, gi in mocknvml.gpu_instances(mocknvml.read_state(state))
            if _ == 0}
    assert [m.uuid for m in migs] == [seen[1], seen[2], seen[3]]
    assert [m.profile for m in gpus[1].mig_devices] == ["7g.40gb"]
    names = set(enumerate_devices(gpus, dynamic_mig=False))
    assert {"gpu-0-mig-1-0", "gpu-0-mig-2-0", "gpu-0-mig-3-0", "gpu-1-mig-1-0", "gpu-2"} <= names
    assert "gpu-0" not in names  # a MIG-enabled GPU is published as its instances


# --- dynamic MIG ----------------------------------------------------------------------------------

def test_dynamic_mig_instance_lives_in_the_mock_until_destroyed(open_nvml: Callable[..., NvmlBackend],
                                                                tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    backend = open_nvml("dgxh100", state)
    gpu = backend.discover()[3]
    three = profile(gpu, "3g.40gb")
    mig = backend.create_mig_instance(gpu, three, three.placements[1])
    assert (mig.profile, mig.placement.start, mig.parent_uuid) == ("3g.40gb", 4, gpu.uuid)
    assert (mig.memory_bytes, mig.multiprocessors) == (40 * GIB, 48)
    held = mocknvml.read_state(state)
    assert held["gpus"][3]["migMode"] == 1  # enabled on the way, as the backend does
    assert mocknvml.gpu_instances(held) == [(3, {
        "id": mig.gpu_instance_id, "profileId": 2, "profile": "3g.40gb", "placement": {"start": 4, "size": 3},
        "computeInstances": [{"id": mig.compute_instance_id, "profileId": 2, "uuid": mig.uuid}]})]
    assert backend.create_mig_instance(gpu, three, three.placements[1]) == mig  # idempotent
    assert len(mocknvml.gpu_instances(mocknvml.read_state(state))) == 1
    assert backend.discover()[3].mig_devices == (mig,)

    backend.destroy_mig_instance(mig)
    assert mocknvml.gpu_instances(mocknvml.read_state(state)) == []
    assert backend.discover()[3].mig_devices == ()
    backend.destroy_mig_instance(mig)  # already gone: not an error


def test_compute_mode_changes_are_recorded_by_the_mock(open_nvml: Callable[..., NvmlBackend], tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    backend = open_nvml("dgxh100", state)
    uuid = backend.discover()[2].uuid
    assert backend.compute_mode(uuid) == "Default"
    backend.set_compute_mode(uuid, "EXCLUSIVE_PROCESS")
    backend.set_compute_mode(uuid, "DEFAULT")
    backend.set_compute_mode(uuid, "PROHIBITED")
    held = mocknvml.read_state(state)["gpus"][2]
    assert (held["computeMode"], held["computeModeChanges"]) == (2, [3, 0, 2])
    backend.close()
    assert open_nvml("dgxh100", state).compute_mode(uuid) == "Prohibited", "the mode outlives the process"


def test_mig_instances_outlive_the_process_like_on_a_gpu(open_nvml: Callable[..., NvmlBackend], tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    first = open_nvml("dgxh100", state)
    gpu = first.discover()[0]
    one = profile(gpu, "1g.10gb")
    created = [first.create_mig_instance(gpu, one, one.placements[s]) for s in (2, 6)]
    first.close()  # the plugin restarts
    second = open_nvml("dgxh100", state)
    assert second.discover()[0].mig_devices == tuple(created)
    second.destroy_mig_instance(created[0])
    assert [gi["placement"]["start"] for _, gi in mocknvml.gpu_instances(mocknvml.read_state(state))] == [6]


def test_overlapping_placement_is_refused_with_nvml_insufficient_resources(open_nvml: Callable[..., NvmlBackend],
                                                                          tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    backend = open_nvml("dgxh100", state)
    gpu = backend.discover()[0]
    four, two = profile(gpu, "4g.40gb"), profile(gpu, "2g.20gb")
    backend.create_mig_instance(gpu, four, four.placements[0])
    with pytest.raises(NvmlError, match=r"creating MIG 2g.20gb@2: creating the GPU instance: insufficient free MIG "
                                        r"resources .*\(NVML error 23\)") as caught:
        backend.create_mig_instance(gpu, two, two.placements[1])
    assert caught.value.code == 23
    assert [gi["profile"] for _, gi in mocknvml.gpu_instances(mocknvml.read_state(state))] == ["4g.40gb"]


def test_a_failed_compute_instance_rolls_the_gpu_instance_back(open_nvml: Callable[..., NvmlBackend],
                                                               tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    backend = open_nvml("dgxh100", state, fail="nvmlGpuInstanceCreateComputeInstance=19")
    gpu = backend.discover()[1]
    one = profile(gpu, "1g.10gb")
    with pytest.raises(NvmlError, match=r"GPU 1 \(GPU-.*\): creating MIG 1g.10gb@0: creating the compute instance: "
                                        r"the GPU is in use .*\(NVML error 19\)"):
        backend.create_mig_instance(gpu, one, one.placements[0])
    assert mocknvml.gpu_instances(mocknvml.read_state(state)) == []


# --- errors ---------------------------------------------------------------------------------------

def test_nvml_init_failure_is_a_clear_error(open_nvml: Callable[..., NvmlBackend]) -> None:
    with pytest.raises(NvmlError, match=r"^NVML initialisation failed: the NVIDIA kernel driver is not loaded "
                                        r"\(NVML error 9\)$"):
        open_nvml("dgxh100", fail="nvmlInitWithFlags=9")


def test_a_lost_gpu_names_the_gpu_and_the_call_and_is_counted(open_nvml: Callable[..., NvmlBackend]) -> None:
    before = METRICS.value("nvml_errors_total", {"function": "nvmlDeviceGetMemoryInfo"})
    backend = open_nvml("dgxh100", fail="nvmlDeviceGetMemoryInfo=15")
    with pytest.raises(NvmlError, match=r"^GPU 0: reading memory info: the GPU is lost .*\(NVML error 15\)$"):
        backend.discover()
    assert METRICS.value("nvml_errors_total", {"function": "nvmlDeviceGetMemoryInfo"}) == before + 1


def test_an_unknown_machine_fails_init_and_says_which_exist(open_nvml: Callable[..., NvmlBackend],
                                                            capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(NvmlError, match=r"NVML initialisation failed: .*\(NVML error 999\)"):
        open_nvml("dgx-z9")
    assert 'DRA_MOCK_NVML_MACHINE="dgx-z9" is not a mock machine; use one of dgxa100, dgxb200, dgxh100, dgxh200' \
        in capfd.readouterr().err


def test_a_state_file_of_another_machine_is_refused(open_nvml: Callable[..., NvmlBackend], tmp_path: Path,
                                                   capfd: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state.json"
    state.write_text(json.dumps(mocknvml.static_mig_state("dgxa100", {0: [(4, 0)]})))
    with pytest.raises(NvmlError, match="NVML initialisation failed"):
        open_nvml("dgxh100", state)
    assert 'holds machine "dgxa100", but DRA_MOCK_NVML_MACHINE asks for "dgxh100"' in capfd.readouterr().err


def test_calls_after_shutdown_say_nvml_is_not_initialised(open_nvml: Callable[..., NvmlBackend]) -> None:
    backend = open_nvml("dgxh100")
    backend.close()
    with pytest.raises(NvmlError, match=r"reading the driver version: NVML is not initialised \(NVML error 1\)"):
        backend.discover()


def test_health_events_register_and_a_wait_times_out(open_nvml: Callable[..., NvmlBackend]) -> None:
    backend = open_nvml("dgxh100")
    uuids = [g.uuid for g in backend.discover()]
    source = NvmlEventSource(backend.nv, uuids, Mock(spec=HealthMonitor), wait_ms=50)
    source.setup()
    assert set(source.handles) == set(uuids) and not source.lost
    source.wait_once()  # NVML_ERROR_TIMEOUT is a quiet return: nothing reported
    source.monitor.report.assert_not_called()  # type: ignore[attr-defined]
    backend.nv.nvmlEventSetFree(source.event_set)


@pytest.mark.parametrize("machine", ["dgxa100", "dgxh100", "dgxh200", "dgxb200"])
def test_every_machine_reports_the_fake_driver_roots_version(open_nvml: Callable[..., NvmlBackend],
                                                             machine: str) -> None:
    """One R570 install on every mock (go-nvml's own say 550.54.15, the B200 560.28.03): the version
    the fake driver root's files are named after, which the toolkit looks them up by."""
    open_nvml(machine).discover()
    assert pynvml.nvmlSystemGetDriverVersion() == mocknvml.DRIVER_VERSION == "570.172.08"
    assert pynvml.nvmlSystemGetNVMLVersion() == "12.570.172.08"
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 12080


# --- the C ABI, below pynvml's helpers ----------------------------------------------------------------

def test_abi_buffers_versions_handles_and_symbols(open_nvml: Callable[..., NvmlBackend]) -> None:
    backend = open_nvml("dgxh100")
    lib = pynvml.nvmlLib
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    small = ctypes.create_string_buffer(8)
    assert lib.nvmlDeviceGetUUID(handle, small, ctypes.c_uint(8)) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    exact = ctypes.create_string_buffer(41)  # GPU- + 36 + NUL
    assert lib.nvmlDeviceGetUUID(handle, exact, ctypes.c_uint(41)) == pynvml.NVML_SUCCESS
    assert exact.value.decode() == backend.discover()[0].uuid

    info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
    info.version = 0x01000098  # a version this struct is not
    assert lib.nvmlDeviceGetGpuInstanceProfileInfoV(handle, 0, ctypes.byref(info)) == 25  # ARGUMENT_VERSION_MISMATCH
    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    assert (info.id, info.sliceCount, info.instanceCount, info.memorySizeMB, info.name) == (2, 3, 2, 40960, "MIG 3g.40gb")

    count = ctypes.c_uint(0)
    assert lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(handle, 2, None, ctypes.byref(count)) == 0
    assert count.value == 2  # a NULL array asks how many
    one = (pynvml.c_nvmlGpuInstancePlacement_t * 1)()
    count = ctypes.c_uint(1)
    assert lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(handle, 2, one, ctypes.byref(count)) == 7  # too small
    assert count.value == 2

    pynvml.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_ENABLE)
    placement = pynvml.c_nvmlGpuInstancePlacement_t(0, 7)
    gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 4, ctypes.byref(placement))
    gi_info = pynvml.nvmlGpuInstanceGetInfo(gi)
    assert (gi_info.id, gi_info.profileId, gi_info.placement.start, gi_info.placement.size) == (1, 4, 0, 7)
    assert ctypes.cast(gi_info.device, ctypes.c_void_p).value == ctypes.cast(handle, ctypes.c_void_p).value
    with pytest.raises(pynvml.NVMLError_InUse):
        pynvml.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_DISABLE)
    pynvml.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # a destroyed instance's handle is never reused
        pynvml.nvmlGpuInstanceGetInfo(gi)

    # A function the library does not implement is absent, as from an older driver.
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetPowerUsage(handle)


# --- the build ------------------------------------------------------------------------------------

def test_the_library_exports_exactly_its_source_exports(driver_root: Path) -> None:
    tool = gotools.TOOLS[mocknvml.TOOL]
    lib = driver_root / mocknvml.LIBRARY_DIR / "libnvidia-ml.so.1"
    exports = gotools.exported_functions(tool.folder)
    assert {"nvmlInitWithFlags", "nvmlDeviceGetPciInfo_v3", "nvmlDeviceCreateGpuInstanceWithPlacement",
            "nvmlGpuInstanceGetComputeInstanceProfileInfoV", "nvmlEventSetWait_v2"} <= set(exports)
    loaded = ctypes.CDLL(str(lib))  # RTLD_NOW: every symbol it needs resolves
    for name in exports:
        assert hasattr(loaded, name), name
    assert not hasattr(loaded, "draMockNvmlNotImplemented")
    assert not hasattr(loaded, "nvmlDeviceGetPowerUsage")
