"""The plugin under NVIDIA's profile refuses to start beside another running plugin of gpu.nvidia.com:
a live registration socket that is not one of its own instances', or a slice of the node it did not write."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubefake import FakeKube

from dra_driver import logs
from dra_driver.k8s.client import SLICES
from dra_driver.node.kubelet.grpc import PluginServers
from dra_driver.node.kubelet.rivals import (
    INSTANCES_DIR,
    RivalPluginError,
    candidate_sockets,
    get_info,
    mark_instance,
    refuse_beside_rivals,
    slice_rivals,
    socket_rivals,
)

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
REPO = Path(__file__).resolve().parents[3]
LOG = logs.get("test")


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # Unix socket paths are limited to 107 bytes: pytest's tmp_path can be too long.
    with tempfile.TemporaryDirectory(prefix="dra-", dir="/tmp") as d:
        yield Path(d)


class _Nothing:
    """The prepare handler of a plugin that is only asked who it is."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"{name} called")


def serving(root: Path, socket_name: str) -> PluginServers:
    """Another process's plugin of gpu.nvidia.com (as NVIDIA's answers GetInfo) registered in ``root/registry``."""
    (root / "registry").mkdir(exist_ok=True)
    (root / "theirs").mkdir(exist_ok=True)
    servers = PluginServers(driver_name=DRIVER, node_name=NODE, dra_socket=root / "theirs" / f"{socket_name}.dra",
                            registration_socket=root / "registry" / socket_name, handler=_Nothing())  # type: ignore[arg-type]
    servers.start()
    return servers


def nvidia_slice(manager: str | None, node: str = NODE, name: str = "node-a-gpu.nvidia.com-x7k2p") -> dict[str, Any]:
    fields = [{"manager": manager, "operation": "Update"}] if manager else []
    return {"metadata": {"name": name, "managedFields": fields},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": []}}


def test_the_socket_names_a_plugin_of_the_driver_can_have() -> None:
    names = ["gpu.nvidia.com-reg.sock", "gpu.nvidia.com-2f1c9a4e-reg.sock", "gpu.dra-driver.io-reg.sock",
             "compute-domain.nvidia.com-reg.sock", "gpu.nvidia.com.sock", "dra-AbC-reg.sock"]
    assert candidate_sockets(names, DRIVER) == ["gpu.nvidia.com-2f1c9a4e-reg.sock", "gpu.nvidia.com-reg.sock"]


def test_a_live_socket_of_another_plugin_is_a_rival(short_tmp: Path) -> None:
    theirs = serving(short_tmp, "gpu.nvidia.com-reg.sock")
    registry, own = short_tmp / "registry", short_tmp / "registry" / "gpu.nvidia.com-reg.sock"
    try:
        info = get_info(own)
        assert info is not None and (info.type, info.name) == ("DRAPlugin", DRIVER)
        found = socket_rivals(registry, DRIVER, own, [], get_info)
        assert found == [f"{own} answers as DRA plugin {DRIVER} (endpoint {short_tmp}/theirs/gpu.nvidia.com-reg.sock.dra)"]
        # The own path answering is never this instance, even where a dead instance listed it.
        assert socket_rivals(registry, DRIVER, own, [own.name], get_info) == found
        # With rolling updates this instance has another name; a sibling of its own is listed.
        mine = registry / "gpu.nvidia.com-6d0e-reg.sock"
        assert socket_rivals(registry, DRIVER, mine, [], get_info) == found
        assert socket_rivals(registry, DRIVER, mine, [own.name], get_info) == []
    finally:
        theirs.stop(0)
    # A socket file nobody answers on is what a killed plugin leaves: no rival.
    own.touch()
    assert socket_rivals(registry, DRIVER, own, [], get_info) == []
    assert socket_rivals(short_tmp / "no-registry", DRIVER, own, [], get_info) == []


def test_a_slice_of_the_node_someone_else_wrote_is_a_rival() -> None:
    assert slice_rivals([nvidia_slice("dra-driver-plugin")], DRIVER, NODE) == []
    assert slice_rivals([nvidia_slice("gpu-kubelet-plugin")], DRIVER, NODE) == [
        f"ResourceSlice node-a-gpu.nvidia.com-x7k2p of {DRIVER} for node {NODE} is published by gpu-kubelet-plugin"]
    assert slice_rivals([nvidia_slice(None)], DRIVER, NODE)[0].endswith("is published by an unknown writer")
    assert slice_rivals([nvidia_slice("gpu-kubelet-plugin", node="node-b")], DRIVER, NODE) == []


def test_the_refusal_names_what_it_found(short_tmp: Path) -> None:
    kube = FakeKube()
    kube.add(SLICES, nvidia_slice("gpu-kubelet-plugin"))
    with pytest.raises(RivalPluginError) as refused:
        refuse_beside_rivals(kube, driver=DRIVER, node=NODE, registry_dir=short_tmp / "registry",
                             own_socket=short_tmp / "registry" / "gpu.nvidia.com-reg.sock", state_dir=short_tmp / "state",
                             log=LOG)
    assert str(refused.value) == (
        f"another kubelet plugin of driver {DRIVER} runs on node {NODE}: ResourceSlice node-a-gpu.nvidia.com-x7k2p of "
        f"{DRIVER} for node {NODE} is published by gpu-kubelet-plugin; two plugins of one driver name must never both "
        "publish: remove NVIDIA's DRA driver from this node first (drain it, uninstall its kubelet plugin, then start "
        "this one; docs/upgrading.md)")
    mine = FakeKube()
    mine.add(SLICES, nvidia_slice("dra-driver-plugin"))
    refuse_beside_rivals(mine, driver=DRIVER, node=NODE, registry_dir=short_tmp / "registry",
                         own_socket=short_tmp / "registry" / "gpu.nvidia.com-reg.sock", state_dir=short_tmp / "state", log=LOG)


def test_an_instance_lists_its_socket_and_forgets_the_gone(short_tmp: Path) -> None:
    registry, state = short_tmp / "registry", short_tmp / "state"
    registry.mkdir()
    (registry / "gpu.nvidia.com-old-reg.sock").touch()
    first = mark_instance(state, registry / "gpu.nvidia.com-old-reg.sock")
    (registry / "gpu.nvidia.com-old-reg.sock").unlink()
    second = mark_instance(state, registry / "gpu.nvidia.com-new-reg.sock")
    assert sorted(p.name for p in (state / INSTANCES_DIR).iterdir()) == [second.name]
    assert not first.exists() and (state / INSTANCES_DIR).stat().st_mode & 0o777 == 0o700


def test_the_plugin_exits_1_with_one_line_beside_nvidias(short_tmp: Path) -> None:
    theirs = serving(short_tmp, "gpu.nvidia.com-reg.sock")
    kubeconfig = short_tmp / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "dra_driver", "kubelet-plugin", "--api-profile", "nvidia", "--node-name", NODE,
             "--kubeconfig", str(kubeconfig), "--gpu-backend", "simulated", "--kubelet-registry-dir",
             str(short_tmp / "registry"), "--kubelet-plugins-dir", str(short_tmp / "plugins"), "--cdi-root",
             str(short_tmp / "cdi"), "--log-format", "console"],
            cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    finally:
        theirs.stop(0)
    last = proc.stderr.splitlines()[-1]
    assert proc.returncode == 1, proc.stderr
    assert last.startswith(f"dra-driver kubelet-plugin: another kubelet plugin of driver {DRIVER} runs on node {NODE}: "
                           f"{short_tmp}/registry/gpu.nvidia.com-reg.sock answers as DRA plugin {DRIVER}"), last
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (short_tmp / "plugins" / DRIVER / "dra.sock").exists()
