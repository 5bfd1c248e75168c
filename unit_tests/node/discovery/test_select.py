"""Choosing the backend and finding the host's libnvidia-ml."""

from __future__ import annotations

from pathlib import Path

from dra_driver.node.discovery.select import nvml_library_candidates, preload_nvml


def test_driver_root_candidates_cover_common_layouts(tmp_path: Path) -> None:
    names = {str(p.relative_to(tmp_path)) for p in nvml_library_candidates(tmp_path)}
    assert "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1" in names
    assert "usr/lib64/libnvidia-ml.so.1" in names


def test_preload_is_a_no_op_for_the_host_root() -> None:
    assert preload_nvml(Path("/")) is None


def test_preload_reports_a_missing_library(tmp_path: Path) -> None:
    assert preload_nvml(tmp_path) is None


def test_preload_skips_an_unloadable_file(tmp_path: Path) -> None:
    lib = tmp_path / "usr/lib64/libnvidia-ml.so.1"
    lib.parent.mkdir(parents=True)
    lib.write_text("not an ELF file")
    assert preload_nvml(tmp_path) is None
