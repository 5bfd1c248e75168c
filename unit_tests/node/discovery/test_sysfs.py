from pathlib import Path

import pytest

from dra_driver.node.discovery import sysfs


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("0000:3b:00.0", "0000:3b:00.0"),
        ("3b:00.0", "0000:3b:00.0"),
        ("00000001:C8:1F.7", "0001:c8:1f.7"),
        ("  0000:07:00.0\n", "0000:07:00.0"),
    ],
)
def test_normalize_bus_id(raw: str, expected: str) -> None:
    assert sysfs.normalize_bus_id(raw) == expected


@pytest.mark.parametrize("raw", ["", "zz:00.0", "0000:3b:00", "0000:3b:00.8", "0000:3b:100.0"])
def test_normalize_bus_id_rejects(raw: str) -> None:
    with pytest.raises(ValueError):
        sysfs.normalize_bus_id(raw)


def test_numa_and_root_from_fake_tree(tmp_path: Path) -> None:
    sysfs.make_fake_pci_device(tmp_path, "0000:18:00.0", "pci0000:10", 1)
    sysfs.make_fake_pci_device(tmp_path, "0000:81:00.0", "pci0000:80", None)
    assert sysfs.numa_node(tmp_path, "00000000:18:00.0") == 1
    assert sysfs.pcie_root(tmp_path, "0000:18:00.0") == "pci0000:10"
    assert sysfs.numa_node(tmp_path, "0000:81:00.0") is None  # -1 → unknown
    assert sysfs.pcie_root(tmp_path, "0000:81:00.0") == "pci0000:80"
    info = sysfs.pci_info(tmp_path, "00000000:18:00.0")
    assert (info.bus_id, info.pcie_root, info.numa_node) == ("0000:18:00.0", "pci0000:10", 1)


def test_missing_device_is_unknown(tmp_path: Path) -> None:
    assert sysfs.numa_node(tmp_path, "0000:99:00.0") is None
    assert sysfs.pcie_root(tmp_path, "0000:99:00.0") is None


def test_garbage_numa_file(tmp_path: Path) -> None:
    d = sysfs.make_fake_pci_device(tmp_path, "0000:18:00.0", "pci0000:10", 0)
    (d / "numa_node").write_text("garbage\n")
    assert sysfs.numa_node(tmp_path, "0000:18:00.0") is None


def test_root_without_pci_component(tmp_path: Path) -> None:
    target = tmp_path / "devices" / "platform" / "0000:18:00.0"
    target.mkdir(parents=True)
    link_dir = tmp_path / "bus" / "pci" / "devices"
    link_dir.mkdir(parents=True)
    (link_dir / "0000:18:00.0").symlink_to(target)
    assert sysfs.pcie_root(tmp_path, "0000:18:00.0") is None


def test_mig_cap_minors_layout() -> None:
    assert sysfs.mig_cap_minors(0, 0, 0) == (3, 4)
    assert sysfs.mig_cap_minors(0, 1, 0) == (12, 13)
    assert sysfs.mig_cap_minors(1, 0, 0) == (3 + 135, 4 + 135)
    assert sysfs.mig_cap_minors(0, 2, 7) == (21, 29)
    with pytest.raises(ValueError):
        sysfs.mig_cap_minors(0, 15, 0)


def test_read_mig_minors(tmp_path: Path) -> None:
    f = tmp_path / "driver" / "nvidia-caps" / "mig-minors"
    f.parent.mkdir(parents=True)
    f.write_text("config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\nbad line here\n")
    minors = sysfs.read_mig_minors(tmp_path)
    assert minors["gpu0/gi1/access"] == 12 and minors["gpu0/gi1/ci0/access"] == 13 and len(minors) == 4
    assert sysfs.read_mig_minors(tmp_path / "nope") == {}
