import json
import os
import stat
from pathlib import Path

import pytest

from dra_driver.node.discovery.dump import gpus_from_json, gpus_to_json
from dra_driver.node.discovery.model import MigPlacement
from dra_driver.node.discovery.profiles import builtin_profiles, load_profile
from dra_driver.node.discovery.select import BackendChoice
from dra_driver.node.discovery.simulated import (
    MigError,
    SimulatedBackend,
    create_fake_device_files,
    gpu_uuid,
    mig_device_paths,
    mig_uuid,
)
from dra_driver.node.settings import PluginSettings


def test_builtin_profiles_present() -> None:
    assert {"h100-8x", "a100-mig", "mixed-l4-t4", "nvidia-examples"} <= set(builtin_profiles())


@pytest.mark.parametrize("name", ["h100-8x", "a100-mig", "mixed-l4-t4", "nvidia-examples"])
def test_builtin_profiles_load_and_roundtrip(name: str) -> None:
    gpus = SimulatedBackend(name, "node-a").discover()
    assert [g.index for g in gpus] == list(range(len(gpus)))
    assert gpus_from_json(json.loads(json.dumps(gpus_to_json(gpus, "simulated")))) == gpus
    for g in gpus:
        assert g.driver_version.startswith("580.")
        assert g.cuda_driver_version == "13.0"
        assert g.uuid.startswith("GPU-")


def test_nvidia_examples_have_what_nvidias_examples_need() -> None:
    """Five full A100s, gpu-test4's four MIG devices on one A100, and 1g.12gb devices (extended-resource MIG)."""
    gpus = SimulatedBackend("nvidia-examples", "node-a").discover()
    full = [g for g in gpus if not g.mig_enabled]
    assert len(full) == 5 and all("A100" in g.product_name for g in full)
    profiles = {g.index: sorted(m.profile for m in g.mig_devices) for g in gpus if g.mig_enabled}
    assert profiles == {5: ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"], 6: ["1g.12gb", "1g.12gb", "3g.47gb"]}


def test_h100_topology() -> None:
    gpus = SimulatedBackend("h100-8x", "node-a").discover()
    assert len(gpus) == 8
    assert {g.product_name for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert all(g.architecture == "Hopper" and g.cuda_compute_capability == "9.0" for g in gpus)
    assert [g.pci.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    roots = [g.pci.pcie_root for g in gpus]
    assert len(set(roots)) == 4
    assert all(roots[i] == roots[i + 1] for i in range(0, 8, 2))
    assert all(g.mig_capable and not g.mig_enabled and not g.mig_devices for g in gpus)
    names = [p.name for p in gpus[0].mig_profiles]
    assert names == ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    one_g = gpus[0].mig_profiles[0]
    assert [p.start for p in one_g.placements] == list(range(7))
    assert len({g.pci.bus_id for g in gpus}) == 8


def test_a100_mig_layout() -> None:
    gpus = SimulatedBackend("a100-mig", "node-a").discover()
    g0 = gpus[0]
    assert g0.mig_enabled and g0.multiprocessors == 108
    assert [(m.profile, m.placement.start, m.multiprocessors) for m in g0.mig_devices] == [
        ("1g.5gb", 0, 14), ("1g.5gb", 1, 14), ("2g.10gb", 2, 28), ("3g.20gb", 4, 42)]
    assert all(m.parent_uuid == g0.uuid and m.uuid.startswith("MIG-") for m in g0.mig_devices)
    assert len({m.gpu_instance_id for m in g0.mig_devices}) == 4
    assert [m.profile for m in gpus[1].mig_devices] == ["7g.40gb"]
    assert gpus[1].mig_devices[0].multiprocessors == 98
    assert not gpus[3].mig_enabled and not gpus[3].mig_devices


def test_mixed_not_mig_capable_and_unknown_numa() -> None:
    gpus = SimulatedBackend("mixed-l4-t4", "node-a").discover()
    assert [g.product_name for g in gpus] == ["NVIDIA L4", "NVIDIA L4", "Tesla T4", "Tesla T4"]
    assert [g.cuda_compute_capability for g in gpus] == ["8.9", "8.9", "7.5", "7.5"]
    assert all(not g.mig_capable and not g.mig_profiles for g in gpus)
    assert [g.pci.numa_node for g in gpus] == [0, 0, None, None]


def test_uuids_deterministic_per_node() -> None:
    a1 = SimulatedBackend("h100-8x", "node-a").discover()
    a2 = SimulatedBackend("h100-8x", "node-a").discover()
    b = SimulatedBackend("h100-8x", "node-b").discover()
    assert [g.uuid for g in a1] == [g.uuid for g in a2]
    assert not {g.uuid for g in a1} & {g.uuid for g in b}
    assert a1[3].uuid == gpu_uuid("node-a", 3)
    assert len({g.uuid for g in a1}) == 8


def test_create_and_destroy_mig() -> None:
    backend = SimulatedBackend("h100-8x", "node-a")
    gpu = backend.discover()[0]
    prof = gpu.mig_profiles[3]  # 3g.40gb
    mig = backend.create_mig_instance(gpu, prof, MigPlacement(4, 4))
    assert mig.uuid == mig_uuid(gpu.uuid, "3g.40gb", MigPlacement(4, 4))
    assert mig.memory_bytes == prof.memory_bytes and mig.multiprocessors == 60
    again = backend.create_mig_instance(gpu, prof, MigPlacement(4, 4))
    assert again == mig  # idempotent
    now = backend.discover()[0]
    assert now.mig_enabled and now.mig_devices == (mig,)
    with pytest.raises(MigError, match="overlaps"):
        backend.create_mig_instance(gpu, gpu.mig_profiles[0], MigPlacement(5, 1))
    with pytest.raises(MigError, match="cannot be placed"):
        backend.create_mig_instance(gpu, prof, MigPlacement(2, 4))
    small = backend.create_mig_instance(gpu, gpu.mig_profiles[0], MigPlacement(0, 1))
    assert small.gpu_instance_id != mig.gpu_instance_id
    backend.destroy_mig_instance(mig)
    backend.destroy_mig_instance(mig)  # missing is fine
    assert backend.discover()[0].mig_devices == (small,)
    # other GPUs untouched
    assert not backend.discover()[1].mig_devices


def test_create_rejects_non_mig_gpu() -> None:
    backend = SimulatedBackend("a100-mig", "node-a")
    h100 = SimulatedBackend("h100-8x", "node-a").discover()[0]
    a100 = backend.discover()[0]
    with pytest.raises(MigError):
        backend.create_mig_instance(a100, h100.mig_profiles[0], MigPlacement(6, 1))
    # GPU0 is full: 3g.20gb covers memory slices 4-7
    with pytest.raises(MigError, match="overlaps"):
        backend.create_mig_instance(a100, a100.mig_profiles[0], MigPlacement(6, 1))


def test_state_file_persists_instances(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    b1 = SimulatedBackend("h100-8x", "node-a", state_file=state)
    gpu = b1.discover()[2]
    mig = b1.create_mig_instance(gpu, gpu.mig_profiles[5], MigPlacement(0, 8))
    b2 = SimulatedBackend("h100-8x", "node-a", state_file=state)
    assert b2.discover()[2].mig_devices == (mig,)
    b3 = SimulatedBackend("h100-8x", "node-b", state_file=state)  # another node's state is ignored
    assert not b3.discover()[2].mig_devices
    state.write_text("{not json")
    assert not SimulatedBackend("h100-8x", "node-a", state_file=state).discover()[2].mig_devices


def is_device_node(path: Path) -> bool:
    """A character device, or the /dev/null link used where mknod is not allowed."""
    return stat.S_ISCHR(path.stat().st_mode)


def test_fake_device_files(tmp_path: Path) -> None:
    backend = SimulatedBackend("a100-mig", "node-a", dev_root=tmp_path)
    gpus = backend.discover()
    dev = tmp_path / "dev"
    for name in ("nvidia0", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        assert is_device_node(dev / name)
    if not (dev / "nvidia0").is_symlink():
        # Never the NVIDIA driver's majors (195; dynamic 234-254 and 384-511): on a host with real
        # GPUs a simulated one would be a real one in the container.
        majors = {os.major(p.stat().st_rdev) for p in dev.rglob("nvidia*") if p.is_char_device()}
        assert majors == {120, 121, 122}, majors
        assert os.minor((dev / "nvidiactl").stat().st_rdev) == 255 and os.minor((dev / "nvidia3").stat().st_rdev) == 3
    for path in mig_device_paths(tmp_path, gpus[0], gpus[0].mig_devices[0]):
        assert is_device_node(path)
    paths = create_fake_device_files(tmp_path, gpus)  # idempotent
    assert all(p.exists() for p in paths)
    # dynamic creation adds capability nodes
    mig = backend.create_mig_instance(gpus[3], gpus[3].mig_profiles[0], MigPlacement(3, 1))
    for path in mig_device_paths(tmp_path, gpus[3], mig):
        assert is_device_node(path)


def test_a_fake_device_node_with_the_real_nvidia_major_is_replaced(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    try:
        os.mknod(dev / "nvidia0", stat.S_IFCHR | 0o666, os.makedev(195, 0))
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")  # the unit stage runs as root in CI, where it runs
    SimulatedBackend("a100-mig", "node-a", dev_root=tmp_path).discover()
    assert os.major((dev / "nvidia0").stat().st_rdev) == 120


def test_fake_device_files_without_mknod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise PermissionError("mknod not permitted")

    monkeypatch.setattr(os, "mknod", refuse)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").write_text("")  # a plain file left by an older version is replaced
    gpus = SimulatedBackend("h100-8x", "node-a").discover()
    for path in create_fake_device_files(tmp_path, gpus):
        assert path.is_symlink() and os.readlink(path) == "/dev/null"
        assert is_device_node(path)


def test_custom_profile_file(tmp_path: Path) -> None:
    f = tmp_path / "mine.yaml"
    f.write_text(
        "driverVersion: '580.65.06'\ncudaDriverVersion: '13.0'\n"
        "models: {x: {productName: X, brand: Nvidia, architecture: Hopper, cudaComputeCapability: '9.0',"
        " memoryMiB: 1024, multiprocessors: 10}}\n"
        "gpus: [{index: 0, model: x, pciBusId: '0000:01:00.0'}]\n")
    profile = load_profile(str(f))
    assert profile.name == "mine"
    gpu = SimulatedBackend(profile, "n").discover()[0]
    assert gpu.pci.numa_node is None and gpu.pci.pcie_root is None and gpu.minor == 0
    with pytest.raises(ValueError, match="unknown simulated profile"):
        load_profile("no-such-profile")
    with pytest.raises(ValueError, match="cannot read"):
        load_profile(str(tmp_path / "missing.yaml"))


def _choice(tmp_path: Path, backend: str) -> BackendChoice:
    return BackendChoice(backend, "node-a", "a100-mig", tmp_path / "state", sysfs_root=tmp_path / "sys",
                         dev_root=tmp_path / "root")


def test_settings_choose_the_backend_with_their_own_values(tmp_path: Path) -> None:
    settings = PluginSettings(
        node_name="node-a", driver_name="gpu.example.com", backend="simulated", simulated_profile="a100-mig",
        registry_dir=tmp_path / "reg", plugins_dir=tmp_path / "plugins", cdi_root=tmp_path / "cdi",
        state_dir=tmp_path / "state", dev_root=tmp_path / "root", sysfs_root=tmp_path / "sys", kubeconfig=None,
        log_format="json", log_level="info", dynamic_mig=False, socket_group=None, cleanup_interval=60.0,
        health_file=None, ignored_xids=(), health_port=0, nvidia_driver_root=tmp_path / "driver",
    )
    assert settings.backend_choice == BackendChoice(
        "simulated", "node-a", "a100-mig", tmp_path / "state", nvidia_driver_root=tmp_path / "driver",
        sysfs_root=tmp_path / "sys", dev_root=tmp_path / "root")


def test_open_backend_opens_what_is_named_and_never_falls_back(tmp_path: Path) -> None:
    from dra_driver.node.discovery import select

    backend = select.open_backend(_choice(tmp_path, "simulated"))
    assert backend.name == "simulated" and len(backend.discover()) == 4
    assert stat.S_ISCHR((tmp_path / "root" / "dev" / "nvidia0").stat().st_mode)
    # `auto` (which fell back to simulated GPUs without NVML) is gone: simulated only by name.
    for name in ("auto", "magic"):
        with pytest.raises(ValueError, match=f"unknown GPU backend '{name}' \\(expected nvml or simulated\\)"):
            select.open_backend(_choice(tmp_path, name))


def test_nvml_without_a_driver_is_an_nvml_error_not_simulated_gpus(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from dra_driver.node.discovery import nvml, select

    def missing() -> None:
        raise ImportError("libnvidia-ml.so.1 was not found")

    monkeypatch.setattr(nvml, "load_pynvml", missing)
    with pytest.raises(nvml.NvmlError, match="cannot import pynvml"):
        select.open_backend(_choice(tmp_path, "nvml"))


def test_dump_cli(capsys: pytest.CaptureFixture[str]) -> None:
    from dra_driver.node.discovery import dump

    assert dump.main(["--backend", "simulated", "--profile", "mixed-l4-t4", "--node-name", "n1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["backend"] == "simulated" and data["formatVersion"] == 1
    loaded = dump.gpus_from_json(data)
    assert loaded == SimulatedBackend("mixed-l4-t4", "n1").discover()
    assert dump.FixtureBackend(loaded).discover() == loaded
    bad = json.loads(json.dumps(data))
    bad["gpus"][0]["surprise"] = 1
    with pytest.raises(ValueError, match="unknown keys"):
        dump.gpus_from_json(bad)
    bad = json.loads(json.dumps(data))
    del bad["gpus"][1]["uuid"]
    with pytest.raises(ValueError, match=r"gpus\[1\]\.uuid: missing"):
        dump.gpus_from_json(bad)
    bad = json.loads(json.dumps(data))
    bad["gpus"][0]["pci"]["numa_node"] = "0"
    with pytest.raises(ValueError, match="expected an integer"):
        dump.gpus_from_json(bad)
