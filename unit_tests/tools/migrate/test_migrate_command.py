"""``dra-driver migrate`` end to end against a fake API server (fakes at the API boundary only)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import yaml
from kubefake import FakeKube
from migfix import DRIVER, node, pod, slice_of

from dra_driver import cli
from dra_driver.apiprofile import NVIDIA_DRIVER_NAME, NVIDIA_PROFILE
from dra_driver.flags import resolve_environment
from dra_driver.k8s.client import CONFIGMAPS, DEVICE_CLASSES, NODES, PODS, SLICES, ApiError
from dra_driver.node.discovery.profiles import load_profile
from dra_driver.tools.migrate import command
from dra_driver.tools.migrate.classes import profile_classes
from dra_driver.tools.migrate.command import DEPLOYMENTS
from e2e.generators.fleet import published_slices

OPERATOR = {
    "metadata": {"name": "device-plugin-config", "namespace": "gpu-operator"},
    "data": {
        "default": "version: v1\nflags: {migStrategy: none}\n",
        "a100": "version: v1\nflags: {migStrategy: mixed}\n",
        "shared": ("version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n"
                   "    resources: [{name: nvidia.com/gpu, replicas: 4}]\n"),
    },
}


def fleet() -> FakeKube:
    """node-0001: MIG (mixed) on the device plugin, this driver publishing nothing there (its gate);
    node-0002: time-sliced 4 ways under the name nvidia.com/gpu.shared, where this driver publishes its
    shares already (an older plugin, or --ignore-device-plugin); node-0003: moved. The fleet's MIG profiles are the Nodes'
    (node-0001 advertises 1g.5gb) and the slices' (node-0004, moved, publishes an a100's)."""
    kube = FakeKube()
    kube.add(NODES, node(1, "a100", device_plugin={"nvidia.com/mig-1g.5gb": "2", "nvidia.com/gpu": "1"}))
    kube.add(NODES, node(2, "shared", device_plugin={"nvidia.com/gpu.shared": "32"}))
    kube.add(NODES, node(3))
    kube.add(NODES, node(4, "a100"))
    kube.add(NODES, {"metadata": {"name": "cpu-only", "labels": {}}, "status": {"capacity": {"cpu": "4"}}})
    for sl in (slice_of(2, shares=4), slice_of(3), slice_of(4, "a100-mig")):
        kube.add(SLICES, sl)
    kube.add(CONFIGMAPS, OPERATOR)
    kube.add(PODS, pod("trainer", {"nvidia.com/mig-1g.5gb": "1"}, node_name="node-0001"))
    kube.add(PODS, pod("notebook", {"nvidia.com/gpu.shared": "1"}, node_name="node-0002"))
    kube.add(PODS, pod("hami", {"nvidia.com/gpumem": "4096"}, namespace="team"))
    deployment = pod("serve", {"nvidia.com/gpu": "1"}, kind="Deployment")
    del deployment["kind"]
    kube.add(DEPLOYMENTS, deployment)
    return kube


def run(kube: FakeKube, *args: Any, **kw: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = command.main(*args, api=kube, out=out, err=err, **kw)
    return rc, out.getvalue(), err.getvalue()


def test_operator_configmap_report() -> None:
    rc, out, err = run(fleet(), configmap="gpu-operator/device-plugin-config", default_config="default")
    assert (rc, err) == (0, "")
    assert f"nvidia.com/mig-1g.5gb -> nvidia-mig-1g.5gb.{DRIVER} (to apply)" in out
    assert f"nvidia.com/gpu.shared -> nvidia-gpu.shared.{DRIVER} (to apply)" in out
    assert "one of 4 shares of a full GPU: node-0002" in out
    assert f"the same devices as class gpu.{DRIVER}, which does not serve nvidia.com/gpu" in out
    assert f"Pod ml/trainer nvidia.com/mig-1g.5gb: 1 -> served by nvidia-mig-1g.5gb.{DRIVER}" in out
    assert f"Deployment ml/serve nvidia.com/gpu: 1 -> served by nvidia-gpu.{DRIVER} as a full GPU" in out
    assert "Pod team/hami nvidia.com/gpumem: 4096 -> not served" in out and "memory: 4096Mi" in out
    # Node by node: the two device plugin nodes get the moves, the third is done, the CPU node is not listed.
    assert "node-0001:\n    1. kubectl cordon node-0001\n    2. move off the pods that use the device plugin (ml/trainer)" in out
    assert "a MIG device of profile 1g.5gb: node-0001, node-0004" in out
    assert "a MIG device of profile 7g.40gb: node-0004" in out
    assert "node-0002:\n    1. WARNING: gpu.dra-driver.io already publishes the GPUs of node-0002" in out
    assert "--consumable-shares=4" in out and "node-0003:\n    1. already moved" in out
    assert "cpu-only" not in out


def test_the_report_says_whether_each_workload_fits_now_and_where() -> None:
    """The command line's migrate is wired to the fleet view's fit, over the classes it would create."""
    rc, out, err = run(fleet(), configmap="gpu-operator/device-plugin-config", default_config="default",
                       fitter=cli.migrate_fitter(DRIVER))
    assert (rc, err) == (0, "")
    lines = {line.split(" -> ")[0].strip(): line for line in out.splitlines() if " -> served by" in line or "not served" in line}
    # node-0004's A100 has a 1g.5gb MIG device free; full GPUs are free on node-0002 (shareable) and node-0003
    assert lines["Pod ml/trainer nvidia.com/mig-1g.5gb: 1"].endswith("; fits now: yes, on node-0004 (1)")
    assert lines["Deployment ml/serve nvidia.com/gpu: 1"].endswith("; fits now: yes, on node-0002 (1)")
    # the chart's shared-gpu class is not in this cluster: said in the engine's words
    assert "; fits now: no: cannot allocate" in lines["Pod team/hami nvidia.com/gpumem: 4096"]


def test_yaml_prints_the_classes_for_kubectl_apply() -> None:
    rc, out, _ = run(fleet(), configmap="gpu-operator/device-plugin-config", default_config="default", output="yaml")
    docs = list(yaml.safe_load_all(out))
    assert rc == 0 and all(d["kind"] == "DeviceClass" for d in docs)
    names = {d["spec"]["extendedResourceName"] for d in docs}
    assert {"nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.5gb"} <= names
    rc, out, _ = run(fleet(), configmap="gpu-operator/device-plugin-config", default_config="default", output="json")
    assert json.loads(out)["kind"] == "List" and len(json.loads(out)["items"]) == len(docs)


def test_apply_creates_then_updates_only_its_own() -> None:
    kube = fleet()
    rc, out, _ = run(kube, configmap="gpu-operator/device-plugin-config", default_config="default", apply=True)
    assert rc == 0 and f"deviceclass.resource.k8s.io/nvidia-gpu.shared.{DRIVER} created" in out
    created = {key for verb, plural, key in kube.calls if verb == "create" and plural == "deviceclasses"}
    assert f"nvidia-mig-1g.5gb.{DRIVER}" in created
    # Run again: everything is up to date, nothing written.
    kube.calls.clear()
    rc, out, _ = run(kube, configmap="gpu-operator/device-plugin-config", default_config="default", apply=True)
    assert rc == 0 and "(up to date)" in out and not [c for c in kube.calls if c[0] in ("create", "replace")]


def test_apply_replaces_a_class_of_its_name_that_changed() -> None:
    kube = fleet()
    stale = {"metadata": {"name": f"nvidia-gpu.shared.{DRIVER}"},
             "spec": {"extendedResourceName": "nvidia.com/gpu.shared", "selectors": []}}
    kube.add(DEVICE_CLASSES, stale)
    rc, out, _ = run(kube, configmap="gpu-operator/device-plugin-config", default_config="default", apply=True)
    assert rc == 0 and f"deviceclass.resource.k8s.io/nvidia-gpu.shared.{DRIVER} configured" in out
    assert kube.obj(DEVICE_CLASSES, f"nvidia-gpu.shared.{DRIVER}")["spec"]["selectors"] != []  # type: ignore[index]


def test_a_file_serves_every_node(tmp_path: Any) -> None:
    path = tmp_path / "dp.yaml"
    path.write_text("version: v1\nflags:\n  migStrategy: single\n")
    rc, out, _ = run(fleet(), str(path), output="yaml")
    (cls,) = list(yaml.safe_load_all(out))
    assert rc == 0 and cls["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert "'mig'" in cls["spec"]["selectors"][0]["cel"]["expression"]


def expect_error(kube: FakeKube, line: str, *args: Any, **kw: Any) -> None:
    rc, out, err = run(kube, *args, **kw)
    assert (rc, out) == (1, "")
    assert err == f"dra-driver migrate: {line}\n"
    assert "Traceback" not in err


def test_bad_input_is_one_line_and_status_1(tmp_path: Any) -> None:
    path = tmp_path / "dp.yaml"
    path.write_text("version: v2\n")
    expect_error(fleet(), f"{path}: config (file): unknown version 'v2' (the device plugin's config is v1)", str(path))
    path.write_text("flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n"
                    "    resources: [{name: mig-3g.40gb, replicas: 2}]\n")
    expect_error(fleet(), f"config (file): MIG profile 3g.40gb (nvidia.com/mig-3g.40gb) is published by no node of "
                          f"driver {DRIVER}", str(path))
    kube = fleet()
    kube.add(DEVICE_CLASSES, {"metadata": {"name": "my-gpus"},
                              "spec": {"extendedResourceName": "nvidia.com/gpu.shared", "selectors": []}})
    expect_error(kube, f"nvidia.com/gpu.shared would be claimed by two DeviceClasses: my-gpus (existing) and "
                       f"nvidia-gpu.shared.{DRIVER}; Kubernetes allows one class per extendedResourceName (remove it, "
                       "or set the chart's deviceClasses.extendedResourceName to \"\")",
                 configmap="gpu-operator/device-plugin-config", default_config="default")
    expect_error(fleet(), f"cannot read {tmp_path}/missing.yaml: No such file or directory", str(tmp_path / "missing.yaml"))


def test_unreadable_configmaps() -> None:
    expect_error(fleet(), "cannot read ConfigMap gpu-operator/nope: not found", configmap="gpu-operator/nope")
    kube = fleet()
    kube.fail["get:configmaps"] = ApiError(403, "Forbidden", "configmaps is forbidden")
    expect_error(kube, "cannot read ConfigMap gpu-operator/device-plugin-config: not allowed",
                 configmap="gpu-operator/device-plugin-config")
    kube = fleet()
    kube.add(CONFIGMAPS, {"metadata": {"name": "broken", "namespace": "gpu-operator"}, "data": {"x": "a: [\n"}})
    rc, _, err = run(kube, configmap="gpu-operator/broken")
    assert rc == 1 and err.startswith("dra-driver migrate: ConfigMap gpu-operator/broken: config x: not YAML")
    expect_error(fleet(), "--configmap must be NAMESPACE/NAME, got 'device-plugin-config'",
                 configmap="device-plugin-config")


def test_the_cluster_unreachable_and_usage() -> None:
    kube = fleet()
    kube.unreachable = True
    expect_error(kube, "cannot reach the cluster: connection refused", configmap="gpu-operator/device-plugin-config")
    expect_error(fleet(), "name the device plugin's config: -f FILE or --configmap NAMESPACE/NAME (one of them)")
    expect_error(fleet(), "output must be one of text, yaml, json, got 'wide'", "x", output="wide")


def test_a_bug_is_not_the_users_mistake(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any, **__: Any) -> Any:
        raise TypeError("unhashable")

    monkeypatch.setattr(command.classes, "plan_classes", broken)
    expect_error(fleet(), "unexpected error: TypeError: unhashable", configmap="gpu-operator/device-plugin-config")


def test_malformed_objects_read_as_without_the_field() -> None:
    kube = fleet()
    kube.add(PODS, {"metadata": {"name": "odd", "namespace": "ml"}, "spec": {"containers": "main", "nodeName": 7}})
    kube.add(SLICES, {"metadata": {"name": "odd"}, "spec": {"driver": DRIVER, "nodeName": "node-0009", "devices": "x"}})
    kube.add(NODES, {"metadata": {"name": "node-0009", "labels": "x"}, "status": {"capacity": ["nvidia.com/gpu"]}})
    rc, out, err = run(kube, configmap="gpu-operator/device-plugin-config", default_config="default")
    assert (rc, err) == (0, "") and "odd" not in out


def nvidia_fleet(*, chart: bool) -> FakeKube:
    """Under --api-profile nvidia: node-0001 moved (this driver publishes its A100's in NVIDIA's names),
    node-0002 still on the device plugin; ``chart``: the chart's gpu.nvidia.com is installed."""
    kube = FakeKube()
    kube.add(NODES, node(1))
    kube.add(NODES, node(2, device_plugin={"nvidia.com/gpu": "8"}))
    for body in published_slices(load_profile("a100-mig"), "node-0001", driver=NVIDIA_DRIVER_NAME,
                                 api_profile=NVIDIA_PROFILE):
        kube.add(SLICES, body)
    if chart:
        for body in profile_classes(NVIDIA_DRIVER_NAME):
            kube.add(DEVICE_CLASSES, body)
    deployment = pod("serve", {"nvidia.com/gpu": "1"}, kind="Deployment")
    del deployment["kind"]
    kube.add(DEPLOYMENTS, deployment)
    return kube


@pytest.mark.parametrize("chart", [False, True])
def test_under_nvidias_profile_the_report_names_gpu_nvidia_com(tmp_path: Any, chart: bool) -> None:
    path = tmp_path / "dp.yaml"
    path.write_text("version: v1\nflags: {migStrategy: none}\n")
    rc, out, err = run(nvidia_fleet(chart=chart), str(path), driver=NVIDIA_DRIVER_NAME,
                       fitter=cli.migrate_fitter(NVIDIA_DRIVER_NAME))
    assert (rc, err) == (0, "")
    state = ("exists: it serves the name already" if chart else
             "the chart's class of this API profile: it serves the name once the chart is installed; none generated")
    assert f"nvidia.com/gpu -> gpu.nvidia.com ({state})" in out
    # node-0001's A100 has one full GPU (gpu-3) beside its MIG devices: fitted with the chart's class
    assert ("Deployment ml/serve nvidia.com/gpu: 1 -> served by gpu.nvidia.com as a full GPU; "
            "fits now: yes, on node-0001 (1)") in out
    assert "nvidia-gpu.gpu.nvidia.com" not in out
    rc, out, _ = run(nvidia_fleet(chart=chart), str(path), driver=NVIDIA_DRIVER_NAME, output="yaml")
    assert (rc, out) == (0, "")  # nothing to apply: no second class for nvidia.com/gpu


def test_the_api_profile_flag_gives_migrate_nvidias_driver_name() -> None:
    parser = cli.build_parser()
    args = resolve_environment(parser.parse_args(["migrate", "-f", "dp.yaml", "--api-profile", "nvidia"]), {})
    assert args.driver_name == NVIDIA_DRIVER_NAME
