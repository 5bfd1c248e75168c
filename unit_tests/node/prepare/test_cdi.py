"""Per-claim CDI specs."""

from __future__ import annotations

import errno
import json
import os
import stat
import uuid
from pathlib import Path

import pytest

from dra_driver import CONFIG_API_VERSION
from dra_driver.gpuconfig import decode
from dra_driver.node.discovery.sysfs import read_mig_cap_minors
from dra_driver.node.prepare.calls import CdiError, validate_claim_uid, validate_driver_name
from dra_driver.node.prepare.cdi import CdiSpecs
from dra_driver.node.prepare.edits import ClaimDevice

DRIVER = "gpu.dra-driver.io"
UID = "0b6f7c7e-8d8a-4c1e-9f55-3f1d0c2a9b10"


def env_of(edits: dict) -> dict[str, str]:
    return dict(e.split("=", 1) for e in edits.get("env", []))


def sharing(s: dict):
    return decode({"apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig", "sharing": s}).sharing


@pytest.fixture
def specs(tmp_path: Path) -> CdiSpecs:
    return CdiSpecs(tmp_path / "cdi", DRIVER, Path("/"), node_name="node-a")


class TestNames:
    def test_names(self, specs: CdiSpecs) -> None:
        assert specs.kind == "k8s.gpu.dra-driver.io/claim"
        assert specs.cdi_device_id(UID, "gpu-0") == f"k8s.gpu.dra-driver.io/claim={UID}-gpu-0"
        assert specs.spec_path(UID).name == f"k8s.gpu.dra-driver.io-claim_{UID}.json"

    def test_nvidias_kind_under_its_profile(self, tmp_path: Path) -> None:
        nvidia = CdiSpecs(tmp_path, "gpu.nvidia.com")
        assert nvidia.kind == "k8s.gpu.nvidia.com/claim"
        assert nvidia.cdi_device_id(UID, "gpu-0") == f"k8s.gpu.nvidia.com/claim={UID}-gpu-0"
        # NVIDIA's plugin writes k8s.gpu.nvidia.com-claim_<uid>.yaml: never one of ours.
        (tmp_path / f"k8s.gpu.nvidia.com-claim_{UID}.yaml").write_text("{}")
        assert nvidia.list_claim_specs() == []

    @pytest.mark.parametrize("bad", ["", "../../etc", UID.upper(), UID + "x", "not-a-uuid", UID.replace("-", ""),
                                     f"{UID}/..", "0b6f7c7e-8d8a-4c1e-9f55-3f1d0c2a9b1g"])
    def test_bad_uid_never_becomes_a_path(self, specs: CdiSpecs, bad: str) -> None:
        with pytest.raises(CdiError):
            specs.spec_path(bad)
        with pytest.raises(CdiError):
            validate_claim_uid(bad)

    @pytest.mark.parametrize("bad", ["", "a/b", "..", "x" * 64, "-a.com", "a..b", "a.com\n", "\u212a8s.io"])
    def test_bad_driver(self, tmp_path: Path, bad: str) -> None:
        with pytest.raises(CdiError):
            validate_driver_name(bad)
        with pytest.raises(CdiError):
            CdiSpecs(tmp_path, bad)

    def test_driver_name_case_as_the_api_server_takes_it(self, tmp_path: Path) -> None:
        # The API server checks a driver name lower-cased, so it stores Gpu.Example.com as given.
        specs = CdiSpecs(tmp_path, "Gpu.Example.com")
        assert specs.kind == "k8s.Gpu.Example.com/claim"
        specs.write_claim_spec(UID, "ns", "c", [ClaimDevice("gpu-0", "req", "GPU-0", 0)])
        assert specs.list_claim_specs() == [UID]
        assert CdiSpecs(tmp_path, "gpu.example.com").list_claim_specs() == []

    @pytest.mark.parametrize("bad", ["", "GPU-0", "gpu_0", "../x", "a" * 64])
    def test_bad_device_name(self, specs: CdiSpecs, bad: str) -> None:
        with pytest.raises(CdiError):
            specs.cdi_device_id(UID, bad)


class TestContent:
    def test_single_gpu(self, specs: CdiSpecs) -> None:
        spec = specs.build_spec(UID, "ns", "claim", [ClaimDevice("gpu-0", "gpu", "GPU-aaa", 0)])
        assert spec["kind"] == "k8s.gpu.dra-driver.io/claim"
        assert spec["cdiVersion"] == "0.5.0"  # the device name starts with a digit (the UID)
        letter_uid = "a" + UID[1:]
        spec_a = specs.build_spec(letter_uid, "ns", "claim", [ClaimDevice("gpu-0", "gpu", "GPU-aaa", 0)])
        assert spec_a["cdiVersion"] == "0.3.0"  # nothing newer used
        [dev] = spec["devices"]
        assert dev["name"] == f"{UID}-gpu-0"
        assert dev["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia0"}]
        common = spec["containerEdits"]
        assert [n["path"] for n in common["deviceNodes"]] == ["/dev/nvidiactl", "/dev/nvidia-uvm",
                                                              "/dev/nvidia-uvm-tools"]
        env = env_of(common)
        assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaa"
        assert env["DRA_GPU_CLAIM"] == "ns/claim"
        assert env["DRA_GPU_CLAIM_UID"] == UID
        assert env["DRA_GPU_NODE"] == "node-a"
        denv = env_of(dev["containerEdits"])
        assert denv == {"DRA_GPU_0_DEVICE": "gpu-0", "DRA_GPU_0_REQUEST": "gpu", "DRA_GPU_0_UUID": "GPU-aaa",
                        "DRA_GPU_0_SHARING": "Exclusive"}

    def test_version_digit_first_name_needs_050(self, specs: CdiSpecs) -> None:
        digit_uid = "1" + UID[1:]
        spec = specs.build_spec(digit_uid, "ns", "c", [ClaimDevice("gpu-0", "gpu", "GPU-a", 0)])
        assert spec["cdiVersion"] == "0.5.0"

    def test_fake_dev_root_uses_hostpath_and_050(self, tmp_path: Path) -> None:
        specs = CdiSpecs(tmp_path / "cdi", DRIVER, tmp_path / "fake")
        spec = specs.build_spec(UID, "ns", "c", [ClaimDevice("mig-0-1", "gpu", "MIG-x", 3, mig_caps=(30, 31))])
        assert spec["cdiVersion"] == "0.5.0"
        nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
        assert nodes == [
            {"path": "/dev/nvidia3", "hostPath": str(tmp_path / "fake/dev/nvidia3")},
            {"path": "/dev/nvidia-caps/nvidia-cap30", "hostPath": str(tmp_path / "fake/dev/nvidia-caps/nvidia-cap30")},
            {"path": "/dev/nvidia-caps/nvidia-cap31", "hostPath": str(tmp_path / "fake/dev/nvidia-caps/nvidia-cap31")},
        ]
        assert spec["containerEdits"]["deviceNodes"][0] == {"path": "/dev/nvidiactl",
                                                            "hostPath": str(tmp_path / "fake/dev/nvidiactl")}

    def test_multi_device_sharing_env(self, specs: CdiSpecs) -> None:
        mps = sharing({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 40,
                                                  "defaultPinnedDeviceMemoryLimit": "1Gi"}})
        ts = sharing({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}})
        spec = specs.build_spec(UID, "ns", "c", [
            ClaimDevice("gpu-0", "a", "GPU-a", 0, sharing=ts),
            ClaimDevice("gpu-1", "b/big", "GPU-b", 1, sharing=mps, admin_access=True),
            ClaimDevice("gpu-1", "b/big", "GPU-b", 1, sharing=mps),  # duplicate device: one CDI device
        ])
        assert [d["name"] for d in spec["devices"]] == [f"{UID}-gpu-0", f"{UID}-gpu-1"]
        env = env_of(spec["containerEdits"])
        assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
        assert env["DRA_GPU_COUNT"] == "2"
        assert env["DRA_GPU_DEVICES"] == "gpu-0,gpu-1"
        d0 = env_of(spec["devices"][0]["containerEdits"])
        d1 = env_of(spec["devices"][1]["containerEdits"])
        # The MPS client limits are the MPS device's: a container of request "a" alone is no MPS client.
        assert not any(k.startswith("CUDA_MPS_") for k in {**env, **d0})
        assert d1["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
        assert d1["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "1=1024M"
        assert d0["DRA_GPU_0_SHARING"] == "TimeSlicing:Long"
        assert d0["DRA_GPU_0_TIMESLICE_INTERVAL"] == "Long"
        assert d1["DRA_GPU_1_REQUEST"] == "b/big"
        assert d1["DRA_GPU_1_SHARING"].startswith("MPS:defaultActiveThreadPercentage=40")
        assert d1["DRA_GPU_1_ADMIN_ACCESS"] == "true"
        assert "DRA_GPU_1_SHARE_ID" not in d1

    def test_needs_a_device(self, specs: CdiSpecs) -> None:
        with pytest.raises(CdiError):
            specs.build_spec(UID, "ns", "c", [])


class TestFiles:
    def test_write_read_delete_list(self, specs: CdiSpecs, tmp_path: Path) -> None:
        ids = specs.write_claim_spec(UID, "ns", "c", [ClaimDevice("gpu-0", "gpu", "GPU-a", 0)])
        assert ids == [f"k8s.gpu.dra-driver.io/claim={UID}-gpu-0"]
        path = specs.spec_path(UID)
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755
        assert json.loads(path.read_text())["devices"][0]["name"] == f"{UID}-gpu-0"
        assert specs.spec_exists(UID)
        other = str(uuid.uuid4())
        specs.write_claim_spec(other, "ns", "d", [ClaimDevice("gpu-1", "gpu", "GPU-b", 1)])
        # foreign files are not ours
        (path.parent / "k8s.other.example.com-claim_" f"{UID}.json").write_text("{}")
        (path.parent / "notes.txt").write_text("x")
        assert specs.list_claim_specs() == sorted([UID, other])
        assert specs.delete_claim_spec(UID) is True
        assert specs.delete_claim_spec(UID) is False
        assert specs.list_claim_specs() == [other]
        assert not any(p.name.startswith(".") for p in path.parent.iterdir())

    def test_overwrite_is_atomic_replacement(self, specs: CdiSpecs) -> None:
        specs.write_claim_spec(UID, "ns", "c", [ClaimDevice("gpu-0", "gpu", "GPU-a", 0)])
        specs.write_claim_spec(UID, "ns", "c", [ClaimDevice("gpu-1", "gpu", "GPU-b", 1)])
        assert json.loads(specs.spec_path(UID).read_text())["devices"][0]["name"] == f"{UID}-gpu-1"

    def test_umask_does_not_matter(self, specs: CdiSpecs) -> None:
        old = os.umask(0o077)
        try:
            specs.write_claim_spec(UID, "ns", "c", [ClaimDevice("gpu-0", "gpu", "GPU-a", 0)])
        finally:
            os.umask(old)
        assert stat.S_IMODE(specs.spec_path(UID).stat().st_mode) == 0o644
        assert stat.S_IMODE(specs.cdi_root.stat().st_mode) == 0o755

    def test_enospc_leaves_no_temp_file(self, specs: CdiSpecs, monkeypatch: pytest.MonkeyPatch) -> None:
        specs.cdi_root.mkdir()
        real_write = os.write

        def full(fd: int, data: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "write", full)
        with pytest.raises(OSError) as info:
            specs.write_claim_spec(UID, "ns", "c", [ClaimDevice("gpu-0", "gpu", "GPU-a", 0)])
        monkeypatch.setattr(os, "write", real_write)
        assert info.value.errno == errno.ENOSPC
        assert list(specs.cdi_root.iterdir()) == []

    def test_list_missing_dir(self, tmp_path: Path) -> None:
        assert CdiSpecs(tmp_path / "nope", DRIVER).list_claim_specs() == []


class TestMigCaps:
    def test_formula(self) -> None:
        assert read_mig_cap_minors(0, 0, 0, None) == (3, 4)
        assert read_mig_cap_minors(0, 1, 0, None) == (12, 13)
        assert read_mig_cap_minors(1, 0, 0, None) == (138, 139)
        assert read_mig_cap_minors(0, 2, 3, None) == (21, 25)

    def test_reads_proc_table(self, tmp_path: Path) -> None:
        table = tmp_path / "driver" / "nvidia-caps"
        table.mkdir(parents=True)
        (table / "mig-minors").write_text("config 1\nmonitor 2\ngpu0/gi7/access 900\ngpu0/gi7/ci0/access 901\n")
        assert read_mig_cap_minors(0, 7, 0, tmp_path) == (900, 901)
        assert read_mig_cap_minors(1, 0, 0, tmp_path) == (138, 139)  # not listed: formula
