"""Which Kubernetes binaries the bed builds: the control plane's minor, and another minor's kube-scheduler
only when one is asked for."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import pytest

from e2e.tooling import binaries, gotools

BED_COMMANDS = {"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet"}


@pytest.fixture()
def builds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, ...]]:
    """The tool sets ``gotools.ensure`` is asked to build, in order (nothing is built); a subset of their
    binaries follows its tools, after a ``"only:"``."""
    asked: list[tuple[str, ...]] = []

    def ensure(names: tuple[str, ...] | list[str], log: bool = True, only: Collection[str] | None = None) -> Path:
        asked.append(tuple(names) if only is None else (*names, "only:", *sorted(only)))
        return tmp_path / "-".join(names)

    monkeypatch.setattr(gotools, "ensure", ensure)
    monkeypatch.delenv(binaries.MINOR_ENV, raising=False)
    monkeypatch.delenv(binaries.SCHEDULER_ENV, raising=False)
    return asked


def test_the_default_bed_builds_its_control_plane_and_etcd_only(builds: list[tuple[str, ...]]) -> None:
    assert binaries.ensure(log=False).name == "kubernetes-etcd"
    assert builds == [("kubernetes", "etcd")]
    assert binaries.scheduler_minor() is None


def test_a_bed_of_kubelet_peers_asks_for_the_control_plane_without_the_kubelet(builds: list[tuple[str, ...]]) -> None:
    """What ``make demo`` builds: the same tools (so the same folder), every binary but the kubelet."""
    assert binaries.ensure(log=False, kubelet=False).name == "kubernetes-etcd"
    assert builds == [("kubernetes", "etcd", "only:", *sorted(BED_COMMANDS - {"kubelet"} | {"etcd"}))]


def test_the_next_scheduler_is_built_beside_the_default_control_plane(
        builds: list[tuple[str, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(binaries.SCHEDULER_ENV, "1.38")
    assert binaries.scheduler_minor() == "1.38"
    assert binaries.ensure(log=False).name == "kubernetes-etcd"
    assert builds == [("kubernetes", "etcd"), ("kubernetes-1.38",)]
    assert binaries.ensure_scheduler("1.38", log=False).name == "kube-scheduler"
    assert binaries.scheduler_version("1.38") == gotools.TOOLS["kubernetes-1.38"].version()


def test_asking_for_the_control_planes_own_scheduler_changes_nothing(
        builds: list[tuple[str, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(binaries.MINOR_ENV, "1.36")
    monkeypatch.setenv(binaries.SCHEDULER_ENV, "1.36")
    assert binaries.scheduler_minor() is None
    binaries.ensure(log=False)
    assert builds == [("kubernetes-1.36", "etcd")]


def test_an_unpinned_scheduler_minor_is_refused_naming_the_pinned_ones(
        builds: list[tuple[str, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(binaries.SCHEDULER_ENV, "1.39")
    with pytest.raises(gotools.ToolError, match=r"kube-scheduler '1.39' is not a pinned minor; use one of 1.37, 1.36, 1.38"):
        binaries.scheduler_minor()
    assert builds == []


def test_a_bed_minor_builds_every_command_the_bed_runs_and_a_scheduler_minor_the_scheduler_alone() -> None:
    """Moving a minor into MINORS (making it the bed's) needs its pin to build the whole control plane."""
    for minor, tool in binaries.MINORS.items():
        assert set(gotools.TOOLS[tool].commands.values()) == BED_COMMANDS, minor
        assert gotools.TOOLS[tool].version().startswith(f"v{minor}."), minor
    for minor, tool in binaries.SCHEDULER_ONLY_MINORS.items():
        assert set(gotools.TOOLS[tool].commands.values()) == {binaries.SCHEDULER}, minor
        assert gotools.TOOLS[tool].version().startswith(f"v{minor}."), minor
        assert minor not in binaries.MINORS
