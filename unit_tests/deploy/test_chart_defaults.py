"""The chart's defaults cannot hurt a node: the plugin goes to GPU nodes only, the rolling-update
kubelet check reads only those, the allocation fence is the release's own, NOTES.txt says what to
try next (and warns of simulated devices), and `helm show readme` has something to show.

NOTES.txt and the node-matching helper are rendered through a copy of the chart with one extra
template, since `helm template` renders neither NOTES.txt nor `lookup`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_deploy_static import CHART, DEPLOY, _helm_module, _helm_or_skip, _load_module

# Renders the chart with helm, which make test's background worker builds on a cold machine: run last.
pytestmark = pytest.mark.helm

PLUGIN = ("DaemonSet", "dra-driver-kubelet-plugin")
GPU_LABELS = ["feature.node.kubernetes.io/pci-10de.present", "nvidia.com/gpu.present"]


def render(*values: str, release: str = "dra-driver", json_values: tuple[str, ...] = ()) -> dict[tuple[str, str], Any]:
    _helm_or_skip()
    args = [a for v in values for a in ("--set", v)] + [a for v in json_values for a in ("--set-json", v)]
    docs = _load_module(DEPLOY / "checks" / "render.py").chart_documents("dra-driver", args, release=release)
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def plugin_pod(*values: str, json_values: tuple[str, ...] = ()) -> dict[str, Any]:
    pod: dict[str, Any] = render(*values, json_values=json_values)[PLUGIN]["spec"]["template"]["spec"]
    return pod


def with_template(tmp_path: Path, body: str, *values: str) -> str:
    """``body`` rendered as a template of a copy of the chart (extra ``--set`` ``values``)."""
    helm = _helm_or_skip()
    chart = tmp_path / "chart"
    shutil.rmtree(chart, ignore_errors=True)
    shutil.copytree(CHART, chart)
    (chart / "templates" / "zz-under-test.yaml").write_text(body)
    args = [str(helm), "template", "dra-driver", str(chart), "-n", "dra-driver", "--kube-version",
            _helm_module().KUBE_VERSION, "--show-only", "templates/zz-under-test.yaml",
            *[a for v in values for a in ("--set", v)]]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return str(yaml.safe_load(proc.stdout)["out"])


def notes(tmp_path: Path, *values: str) -> str:
    text = (CHART / "templates" / "NOTES.txt").read_text()
    return with_template(tmp_path, '{{- define "notes-under-test" -}}\n' + text
                         + '{{- end -}}\nout: {{ include "notes-under-test" . | toJson }}\n', *values)


@pytest.mark.timeout(600)
def test_the_plugin_goes_only_to_nodes_labelled_as_gpu_nodes() -> None:
    pod = plugin_pod()
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    # One term per label: node selector terms are ORed, so either label is enough.
    assert terms == [{"matchExpressions": [{"key": k, "operator": "In", "values": ["true"]}]} for k in GPU_LABELS]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["GPU_BACKEND"] == "nvml" and env["IGNORE_DEVICE_PLUGIN"] == "false"
    assert {e["name"]: e.get("value") for e in plugin_pod("kubeletPlugin.ignoreDevicePlugin=true")["containers"][0]
            ["env"]}["IGNORE_DEVICE_PLUGIN"] == "true"
    # Every node, when asked; an affinity of the operator's own replaces the labels' and keeps the rest.
    assert "affinity" not in plugin_pod(json_values=("kubeletPlugin.gpuNodeLabels=[]",))
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "cloud.google.com/gke-accelerator", "operator": "Exists"}]}]}}}
    assert plugin_pod(json_values=(f"kubeletPlugin.affinity={json.dumps(own)}",))["affinity"] == own
    anti = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "podAffinityTerm": {"topologyKey": "zone", "labelSelector": {}}}]}}
    mixed = plugin_pod(json_values=(f"kubeletPlugin.affinity={json.dumps(anti)}",))["affinity"]
    assert mixed["podAntiAffinity"] == anti["podAntiAffinity"] and "nodeAffinity" in mixed


@pytest.mark.timeout(600)
def test_simulated_gpus_get_a_driver_root_of_tools_only_when_one_is_given() -> None:
    def parts(*values: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        pod = plugin_pod("gpuBackend=simulated", *values)
        (ctr,) = [c for c in pod["containers"] if c["name"] == "plugin"]
        return ({e["name"]: e.get("value") for e in ctr["env"]}, {m["name"]: m for m in ctr["volumeMounts"]},
                {v["name"]: v for v in pod["volumes"]})

    env, mounts, volumes = parts()
    assert "NVIDIA_DRIVER_ROOT" not in env and "driver-root" not in mounts and "driver-root" not in volumes
    env, mounts, volumes = parts("simulated.driverRoot=/opt/standins")
    assert env["NVIDIA_DRIVER_ROOT"] == "/driver-root"
    # The stand-ins record what they are asked there: read-write, unlike a real driver root.
    assert mounts["driver-root"]["mountPath"] == "/driver-root" and not mounts["driver-root"].get("readOnly")
    assert volumes["driver-root"]["hostPath"] == {"path": "/opt/standins", "type": "Directory"}


def selects(tmp_path: Path, node: dict[str, Any], *values: str) -> bool:
    body = ('out: {{ include "dra-driver.pluginSelectsNode" (dict "ctx" $ "node" (`' + json.dumps(node)
            + '` | fromJson)) | quote }}\n')
    out = with_template(tmp_path, body, *values)
    assert out in ("", "true"), out
    return out == "true"


def node(**labels: str) -> dict[str, Any]:
    return {"metadata": {"name": "n", "labels": labels}}


@pytest.mark.timeout(600)
def test_the_rolling_update_check_reads_the_nodes_the_daemonset_selects(tmp_path: Path) -> None:
    assert selects(tmp_path, node(**{"nvidia.com/gpu.present": "true"}))
    assert selects(tmp_path, node(**{"feature.node.kubernetes.io/pci-10de.present": "true", "x": "y"}))
    assert not selects(tmp_path, node(**{"nvidia.com/gpu.present": "false"}))
    assert not selects(tmp_path, {"metadata": {"name": "cpu-only"}})
    assert selects(tmp_path, {"metadata": {"name": "cpu-only"}}, "kubeletPlugin.gpuNodeLabels=null")
    # The nodeSelector narrows it further.
    gpu = {"nvidia.com/gpu.present": "true"}
    assert not selects(tmp_path, node(**gpu), "kubeletPlugin.nodeSelector.pool=a")
    assert selects(tmp_path, node(**gpu, pool="a"), "kubeletPlugin.nodeSelector.pool=a")
    # The validate template calls it: a CPU node's old kubelet is not looked at.
    validate = (CHART / "templates" / "validate.yaml").read_text()
    assert 'include "dra-driver.pluginSelectsNode" (dict "ctx" $ "node" $node)' in validate


@pytest.mark.timeout(600)
def test_the_allocation_fence_is_the_releases_own_and_switchable() -> None:
    policy = yaml.safe_load((CHART / "files" / "allocation-fence-policy.yaml").read_text())
    names = set()
    for release in ("one", "two"):
        objs = render(release=release)
        name = f"{release}-dra-driver-allocation-fence"
        vap = objs[("ValidatingAdmissionPolicy", name)]
        assert vap["spec"] == policy["spec"], "the chart ships the policy file's spec unchanged"
        assert vap["metadata"]["labels"]["app.kubernetes.io/instance"] == release
        binding = objs[("ValidatingAdmissionPolicyBinding", name)]
        assert binding["spec"]["policyName"] == name and binding["spec"]["paramRef"]["namespace"] == "dra-driver"
        names.add(name)
    assert len(names) == 2
    for values in (("allocationFence.enabled=false",), ("controller.enabled=false",)):
        kinds = {kind for kind, _ in render(*values)}
        assert "ValidatingAdmissionPolicyBinding" in kinds  # the ResourceSlice policy's stays
        assert not [n for k, n in render(*values) if "allocation-fence" in n], values


@pytest.mark.timeout(600)
def test_notes_say_what_to_try_next_and_warn_of_simulated_devices(tmp_path: Path) -> None:
    default = notes(tmp_path)
    for needle in ("kubectl dra explain", "deploy/examples/single-gpu", "gpu.gpu.dra-driver.io",
                   "mig.gpu.dra-driver.io", "nvidia-gpu.gpu.dra-driver.io", "rollout status",
                   "--reset-then-reuse-values", "nvidia.com/gpu.present=true", "DevicePluginPresent"):
        assert needle in default, needle
    assert "SIMULATED" not in default and "not --reuse-values" in default
    sim = notes(tmp_path, "gpuBackend=simulated", "simulatedProfile=a100-mig")
    assert "WARNING: the devices are SIMULATED" in sim and "a100-mig" in sim
    assert "every node" in notes(tmp_path, "kubeletPlugin.gpuNodeLabels=null")
    assert "check is OFF" in notes(tmp_path, "kubeletPlugin.ignoreDevicePlugin=true")
    assert "allocates none" in notes(tmp_path, "allocationFence.enabled=false")


@pytest.mark.timeout(600)
def test_helm_show_readme_shows_the_charts_readme() -> None:
    helm = _helm_or_skip()
    proc = subprocess.run([str(helm), "show", "readme", str(CHART)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    for needle in ("## Beside NVIDIA's device plugin", "## GKE", "/home/kubernetes/bin/nvidia", "ResourceQuota",
                   "--reset-then-reuse-values", "kubeletPlugin.ignoreDevicePlugin", "allocationFence.enabled"):
        assert needle in proc.stdout, needle
