"""The chart puts nvidia-cdi-hook on the host: the hooks in the driver's CDI edits run there.

With the NVML backend and driver edits on, an init container copies the image's hook into a host
directory and the plugin names that path in every spec; ``nvml.cdiHook.source=host`` keeps a
host-installed hook instead. The init container's script is run here too, on a temporary
directory, to show that the copy replaces a hook that is running at that moment.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_deploy_static import DEPLOY, _helm_or_skip, _load_module

from e2e.testbed import fakedriver

# Renders the chart with helm, which make test's background worker builds on a cold machine: run last.
pytestmark = pytest.mark.helm

PLUGIN = ("DaemonSet", "dra-driver-kubelet-plugin")
DEFAULT_DIR = "/var/lib/dra-driver/gpu.dra-driver.io/bin"


def plugin_pod(*values: str) -> dict[str, Any]:
    _helm_or_skip()
    render = _load_module(DEPLOY / "checks" / "render.py")
    args = [a for v in values for a in ("--set", v)]
    (ds,) = [d for d in render.chart_documents("dra-driver", args) if (d["kind"], d["metadata"]["name"]) == PLUGIN]
    pod: dict[str, Any] = ds["spec"]["template"]["spec"]
    return pod


def hook_env(pod: dict[str, Any]) -> str | None:
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    return env.get("NVIDIA_CDI_HOOK_PATH")


def volume_path(pod: dict[str, Any], name: str) -> str | None:
    return next((v["hostPath"]["path"] for v in pod["volumes"] if v["name"] == name), None)


@pytest.mark.timeout(600)
def test_nvml_installs_the_images_hook_and_names_it() -> None:
    pod = plugin_pod("gpuBackend=nvml")
    (init,) = pod["initContainers"]
    assert init["name"] == "install-cdi-hook" and init["image"] == pod["containers"][0]["image"]
    assert init["volumeMounts"] == [{"name": "cdi-hook", "mountPath": "/host-cdi-hook"}]
    assert volume_path(pod, "cdi-hook") == DEFAULT_DIR
    assert hook_env(pod) == f"{DEFAULT_DIR}/nvidia-cdi-hook"
    # The plugin container does not need the directory: it only writes the path into specs.
    assert "cdi-hook" not in {m["name"] for m in pod["containers"][0]["volumeMounts"]}

    custom = plugin_pod("gpuBackend=nvml", "nvml.cdiHook.installDir=/home/kubernetes/bin/nvidia/")
    assert volume_path(custom, "cdi-hook") == "/home/kubernetes/bin/nvidia"
    assert hook_env(custom) == "/home/kubernetes/bin/nvidia/nvidia-cdi-hook"
    named = plugin_pod("gpuBackend=nvml", "driverName=gpu.example.org")
    assert hook_env(named) == "/var/lib/dra-driver/gpu.example.org/bin/nvidia-cdi-hook"


@pytest.mark.timeout(600)
def test_no_install_for_a_host_hook_without_edits_or_on_simulated_gpus() -> None:
    host = plugin_pod("gpuBackend=nvml", "nvml.cdiHook.source=host")
    assert "initContainers" not in host and volume_path(host, "cdi-hook") is None
    assert hook_env(host) == "/usr/bin/nvidia-cdi-hook"
    for values in (("gpuBackend=nvml", "nvml.driverEdits=false"), ("gpuBackend=simulated",)):
        pod = plugin_pod(*values)
        assert "initContainers" not in pod and volume_path(pod, "cdi-hook") is None, values
        assert hook_env(pod) is None, values


@pytest.mark.timeout(600)
def test_the_install_script_replaces_a_running_hook(tmp_path: Path) -> None:
    (init,) = plugin_pod("gpuBackend=nvml")["initContainers"]
    assert init["command"][0] == "/bin/sh"
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    hook = fakedriver.toolkit_bin(log=False) / "nvidia-cdi-hook"
    script = init["args"][0].replace("/host-cdi-hook", str(host_dir)).replace("/usr/bin/nvidia-cdi-hook", str(hook))
    installed = host_dir / "nvidia-cdi-hook"
    # The old hook is running (a runtime creating a container): writing into that file would fail
    # with ETXTBSY; the install renames a new file over it instead.
    installed.write_bytes(Path("/bin/sleep").read_bytes())
    installed.chmod(0o755)
    running = subprocess.Popen([str(installed), "30"])
    try:
        # Another pod's copy may be running right now (rolling update: two plugin pods): its
        # temporary file is left alone; one left by a copy killed long ago is removed.
        killed = host_dir / ".nvidia-cdi-hook.tmp-0f0f0f0f-0000-4000-8000-000000000001"
        killed.write_bytes(b"left by a killed copy")
        os.utime(killed, (1, 1))
        running_copy = host_dir / ".nvidia-cdi-hook.tmp-0f0f0f0f-0000-4000-8000-000000000002"
        running_copy.write_bytes(b"being written by the other pod")
        (init_env,) = init["env"]
        assert init_env == {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}
        proc = subprocess.run([*init["command"], script], capture_output=True, text=True, check=False,
                              env={**os.environ, "POD_UID": "0f0f0f0f-0000-4000-8000-000000000003"})
        assert proc.returncode == 0, proc.stderr
        assert f"installed nvidia-cdi-hook at {DEFAULT_DIR}/nvidia-cdi-hook" in proc.stdout
    finally:
        running.kill()
        running.wait()
    assert installed.read_bytes() == hook.read_bytes()
    assert os.stat(installed).st_mode & 0o777 == 0o755
    assert sorted(p.name for p in host_dir.iterdir()) == [running_copy.name, "nvidia-cdi-hook"], \
        "no temporary file of this pod or of a long-dead one is left"
    version = subprocess.run([str(installed), "--version"], capture_output=True, text=True, check=False)
    assert version.returncode == 0 and "1.20.1" in version.stdout + version.stderr
