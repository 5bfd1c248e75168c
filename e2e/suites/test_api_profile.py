"""``--api-profile nvidia`` against the bed's real API server: the plugin publishes NVIDIA's names as
its own writes, and refuses to start beside another plugin of ``gpu.nvidia.com`` on the node (a live
registration socket of that name, or a slice of the node that someone else published).

The plugins here run beside the bed's own (driver ``gpu.dra-driver.io``), in directories of their
own with no kubelet: publishing needs none, and each test removes what it published.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.testbed.clusterview import Bed, wait_for

DRIVER = "gpu.nvidia.com"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def root() -> Iterator[Path]:
    # Unix socket paths are limited to 107 bytes: pytest's tmp_path can be too long.
    with tempfile.TemporaryDirectory(prefix="dra-nv-", dir="/tmp") as d:
        yield Path(d)


def nodes(bed: Bed) -> list[str]:
    if bed.cluster is None:
        pytest.skip("needs the local bed's processes")
    return list(bed.cluster.nodes)


def plugin_args(bed: Bed, node: str, root: Path) -> list[str]:
    return [sys.executable, "-m", "dra_driver", "kubelet-plugin", "--api-profile=nvidia", f"--node-name={node}",
            "--gpu-backend=simulated", "--simulated-profile=a100-mig", f"--kubelet-registry-dir={root}/registry",
            f"--kubelet-plugins-dir={root}/plugins", f"--cdi-root={root}/cdi", f"--dev-root={root}/dev",
            f"--kubeconfig={bed.kubeconfig}", "--log-format=console", "--no-health-monitoring"]


def refused(bed: Bed, node: str, root: Path) -> str:
    """The last line of a plugin that must exit 1 at start."""
    proc = subprocess.run(plugin_args(bed, node, root), cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    return proc.stderr.splitlines()[-1]


def nvidia_slices(bed: Bed, node: str) -> list[dict[str, Any]]:
    """The node's slices of gpu.nvidia.com with their managedFields (kubectl hides them by default)."""
    out = bed.kubectl("get", "resourceslices", "-o", "json", "--show-managed-fields", "--field-selector",
                      f"spec.nodeName={node},spec.driver={DRIVER}").stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def remove_slices(bed: Bed, node: str) -> None:
    bed.kubectl("delete", "resourceslices", "--field-selector", f"spec.nodeName={node},spec.driver={DRIVER}",
                "--wait=false", check=False)


def test_nvidias_names_are_published_and_a_second_plugin_is_refused(bed: Bed, root: Path) -> None:
    node = nodes(bed)[0]
    log = (root / "plugin.log").open("w")
    first = subprocess.Popen(plugin_args(bed, node, root), cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                             stdout=log, stderr=subprocess.STDOUT)
    try:
        published = wait_for(f"{DRIVER} slices of {node}", lambda: nvidia_slices(bed, node), timeout=60)
        names = {d["name"] for s in published for d in s["spec"].get("devices", [])}
        assert {"gpu-0-mig-1g5gb-19-0", "gpu-0-mig-2g10gb-14-2", "gpu-2-mig-1g10gb-15-6", "gpu-3"} <= names, names
        managers = {m["manager"] for s in published for m in s["metadata"].get("managedFields", [])}
        assert managers == {"dra-driver-plugin"}, managers
        # The same node and registry: the first one's socket answers.
        line = refused(bed, node, root)
        assert line.startswith(f"dra-driver kubelet-plugin: another kubelet plugin of driver {DRIVER} runs on node "
                               f"{node}: {root}/registry/{DRIVER}-reg.sock answers as DRA plugin {DRIVER}"), line
        assert first.poll() is None, "the first plugin stopped"
    finally:
        first.terminate()
        first.wait(timeout=30)
        log.close()
        remove_slices(bed, node)


def test_a_slice_published_by_someone_else_keeps_the_plugin_from_starting(bed: Bed, root: Path) -> None:
    node = nodes(bed)[-1]
    name = f"e2e-nvidias-{os.getpid()}"
    foreign = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
               "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                        "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}]}}
    bed.apply([foreign])
    try:
        line = refused(bed, node, root)
        assert f"ResourceSlice {name} of {DRIVER} for node {node} is published by " in line, line
        assert nvidia_slices(bed, node)[0]["metadata"]["name"] == name  # nothing of ours went out
        assert not (root / "registry" / f"{DRIVER}-reg.sock").exists()
    finally:
        bed.kubectl("delete", "resourceslice", name, "--wait=false", check=False)
