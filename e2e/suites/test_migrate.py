"""``dra-driver migrate`` (issue 55) on the bed's real control plane: the device plugin's config
formats in, DeviceClasses applied, and pods that ask for the device plugin's names, unchanged,
running where migrate's report said they fit.

The fleet is three simulated nodes this module adds, of a driver of their own (``DRIVER``), so
that no other test's GPUs or classes count: ``dp-mixed`` (the built-in ``a100-mig``: MIG A100s
with 1g.5gb, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb and 7g.40gb devices and a full GPU), ``dp-single``
(one A100 split into two 3g.20gb devices, as a ``single`` node is) and ``dp-ts`` (one A100
published with ``--consumable-shares=4``, what ``replicas: 4`` becomes). Kubernetes lets one class
serve an ``extendedResourceName``, and the bed's chart class ``nvidia-gpu.gpu.dra-driver.io``
serves ``nvidia.com/gpu``: the first test shows migrate refusing to claim it a second time through
the real API server, then the module takes it away (as the message tells a user to) and puts it
back at the end. Each test removes the classes migrate made. A selector cannot name a node, so
where a name means a device more than one node has, DeviceTaintRules on the other nodes' pools
make the report's one answer the scheduler's only one.

Bad input through the API server: a ConfigMap that is missing, or that the caller may not read,
and a MIG profile no node of the fleet publishes: exit status 1, one line, no traceback. These
need no node of the module, so they also run on kind.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.testbed.clusterview import DEVICECLASSES, Bed, attr, load_manifests, observed, wait_for, wait_running
from e2e.testbed.nodes import SimNode

DRIVER = "migrate-e2e.dra-driver.io"
CHART_CLASS = "nvidia-gpu.gpu.dra-driver.io"
MIXED, SINGLE, TS = "dp-mixed", "dp-single", "dp-ts"
NODES = (MIXED, SINGLE, TS)
PUBLISHED = {MIXED: 9, SINGLE: 2, TS: 1}
MANAGED = "app.kubernetes.io/managed-by=dra-driver-migrate"
A100 = {"productName": "NVIDIA A100-SXM4-40GB", "brand": "Nvidia", "architecture": "Ampere",
        "cudaComputeCapability": "8.0", "memoryMiB": 40960, "multiprocessors": 108,
        "migProfiles": [{"name": "3g.20gb", "memoryMiB": 20096, "multiprocessors": 42, "computeSlices": 3,
                         "memorySlices": 4, "placements": [0, 4]},
                        {"name": "7g.40gb", "memoryMiB": 40320, "multiprocessors": 98, "computeSlices": 7,
                         "memorySlices": 8, "placements": [0]}]}


def one_gpu(mig: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    gpu: dict[str, Any] = {"index": 0, "model": "a100", "pciBusId": "0000:07:00.0", "numaNode": 0}
    if mig:
        gpu["mig"] = {"enabled": True, "instances": mig}
    return {"description": "1x NVIDIA A100-SXM4-40GB", "driverVersion": "580.95.05", "cudaDriverVersion": "13.0",
            "models": {"a100": A100}, "gpus": [gpu]}


PROFILES = {SINGLE: one_gpu([{"profile": "3g.20gb", "placement": 0}, {"profile": "3g.20gb", "placement": 4}]),
            TS: one_gpu()}
FLAGS: dict[str, tuple[str, ...]] = {MIXED: (), SINGLE: (), TS: ("--consumable-shares=4",)}


def config(mig: str = "none", *, replicas: int = 0, rename: bool = False) -> dict[str, Any]:
    """A device plugin config (its ``v1`` format)."""
    doc: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": mig}}
    if replicas:
        doc["sharing"] = {"timeSlicing": {"renameByDefault": rename,
                                          "resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}}
    return doc


def migrate(bed: Bed, *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dra_driver", "migrate", *args, "--driver-name", DRIVER,
                           "--kubeconfig", str(kubeconfig or bed.kubeconfig)],
                          capture_output=True, text=True, timeout=120, check=False)


def one_line_failure(proc: subprocess.CompletedProcess[str], says: str) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "" and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("dra-driver migrate: ") and says in proc.stderr, proc.stderr
    return proc.stderr


def published(bed: Bed, node: str) -> int:
    items = bed.get("resourceslices", selector=f"spec.nodeName={node},spec.driver={DRIVER}")["items"]
    return sum(len(s["spec"].get("devices") or []) for s in items)


@pytest.fixture(scope="module")
def fleet_of_three(bed: Bed) -> Iterator[None]:
    if bed.fleet is None:
        pytest.skip("adds simulated nodes: needs the local bed's processes")
    fleet = bed.fleet
    nodes = []
    for name in NODES:
        root = fleet.workdir / "nodes" / name
        root.mkdir(parents=True, exist_ok=True)
        profile = "a100-mig"
        if name in PROFILES:
            (root / "profile.yaml").write_text(yaml.safe_dump(PROFILES[name]))
            profile = str(root / "profile.yaml")
        nodes.append(SimNode(name, profile, root, flags=FLAGS[name], driver_name=DRIVER))
    try:
        fleet.add_nodes(nodes)
        wait_for("the migrate fleet's devices published",
                 lambda: {n: published(bed, n) for n in NODES} == PUBLISHED, 90)
        yield
    finally:
        wait_for("the module's pods gone from its nodes", lambda: not any(
            bed.get("pods", selector=f"spec.nodeName={n}")["items"] for n in NODES), 90, 1)
        for node in nodes:
            fleet.remove_node(node.name)
        bed.kubectl("delete", "resourceslices", f"--field-selector=spec.driver={DRIVER}", "--wait=false", check=False)
        bed.kubectl("delete", "node", *NODES, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture(scope="module")
def without_chart_class(bed: Bed, fleet_of_three: None) -> Iterator[None]:
    """The bed without the chart's nvidia.com/gpu class (chart ``deviceClasses.extendedResourceName: ""``)."""
    bed.kubectl("delete", "deviceclass", CHART_CLASS, "--ignore-not-found")
    try:
        yield
    finally:
        bed.kubectl("delete", "deviceclass", "-l", MANAGED, "--ignore-not-found", check=False)
        bed.apply(load_manifests(DEVICECLASSES / "nvidia-gpu.yaml"))


@pytest.fixture()
def clean(bed: Bed, tmp_path: Path) -> Iterator[str]:
    """A namespace, and at the end no class migrate made, no DeviceTaintRule of this module."""
    ns = f"e2e-migrate-{secrets.token_hex(3)}"
    bed.kubectl("create", "namespace", ns)
    wait_for(f"default ServiceAccount in {ns}",
             lambda: bed.kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0)
    try:
        yield ns
    finally:
        # The pods' claims (shares of dp-ts's one GPU) must be gone before the next test fits its own.
        bed.kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--wait=true", "--timeout=60s",
                    check=False, timeout=90)
        wait_for(f"the claims of {ns} deleted", lambda: not bed.get("resourceclaims", ns=ns)["items"], 60)
        bed.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        bed.kubectl("delete", "deviceclass", "-l", MANAGED, "--ignore-not-found", check=False)
        bed.kubectl("delete", "devicetaintrule", "-l", "e2e.dra-driver.io/migrate-fence", "--ignore-not-found",
                    check=False)


def fence(bed: Bed, *nodes: str) -> None:
    """Keep new claims off ``nodes``' devices (and ``fit`` reads the same rules)."""
    bed.apply([{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
                "metadata": {"name": f"e2e-migrate-fence-{n}", "labels": {"e2e.dra-driver.io/migrate-fence": "true"}},
                "spec": {"deviceSelector": {"driver": DRIVER, "pool": n},
                         "taint": {"key": "e2e.dra-driver.io/not-this-test", "effect": "NoSchedule"}}}
               for n in nodes])
    time.sleep(1.0)  # the scheduler's informer sees the rules


def pod(name: str, resource: str) -> dict[str, Any]:
    """A pod as the device plugin's users write one: the name in its limits, nothing else."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "terminationGracePeriodSeconds": 0, "restartPolicy": "Never",
        "containers": [{"name": "cuda", "image": "busybox:1.36", "command": ["sh", "-c", "sleep 86400"],
                        "resources": {"limits": {resource: 1}}}]}}


def fits(report: str, ns: str, name: str, resource: str) -> tuple[str, str]:
    """(the class, the fit) the report gives pod ``ns/name``."""
    line = re.search(rf"^  Pod {re.escape(ns)}/{re.escape(name)} {re.escape(resource)}: 1 -> served by (\S+) as "
                     rf".*; fits now: (.*)$", report, re.MULTILINE)
    assert line, f"no line for pod {ns}/{name} in the report:\n{report}"
    return line.group(1), line.group(2)


def switch(bed: Bed, ns: str, pods: dict[str, str], *source: str) -> dict[str, tuple[str, str]]:
    """Create ``pods`` (name -> resource: they wait, nothing serves the name yet), run ``migrate
    --apply``, and return what its report said of each (class, fit)."""
    bed.apply([pod(name, resource) for name, resource in pods.items()], ns=ns)
    started = time.monotonic()
    proc = migrate(bed, *source, "--apply")
    assert proc.returncode == 0, proc.stderr
    print(f"\nmigrate {' '.join(source)} --apply ({time.monotonic() - started:.1f} s):\n{proc.stdout}")
    said = {name: fits(proc.stdout, ns, name, resource) for name, resource in pods.items()}
    for cls, _ in said.values():
        assert f"deviceclass.resource.k8s.io/{cls} created" in proc.stdout, proc.stdout
    return said


def ran_on(bed: Bed, ns: str, name: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Where the pod runs, its claim's one result, and the device as published."""
    obj = wait_running(bed, ns, name, timeout=90)
    claim = bed.get("resourceclaim", obj["status"]["extendedResourceClaimStatus"]["resourceClaimName"], ns)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == DRIVER and result["pool"] == obj["spec"]["nodeName"], result
    items = bed.get("resourceslices", selector=f"spec.nodeName={result['pool']},spec.driver={DRIVER}")["items"]
    [device] = [d for s in items for d in s["spec"].get("devices") or [] if d["name"] == result["device"]]
    uuids = {v for k, v in observed(bed, ns, name)["cuda"]["env"].items() if re.fullmatch(r"DRA_GPU_\d+_UUID", k)}
    assert uuids == {attr(device, "uuid")}, uuids
    return str(obj["spec"]["nodeName"]), result, device


def made_by_migrate(bed: Bed) -> set[str]:
    listed = json.loads(bed.kubectl("get", "deviceclasses", "-l", MANAGED, "-o", "json").stdout)
    return {c["metadata"]["name"] for c in listed["items"]}


def write(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


# --------------------------------------------------------------------------- the formats


@pytest.mark.testbed_only
def test_a_name_the_charts_class_serves_is_not_claimed_twice(bed: Bed, fleet_of_three: None, tmp_path: Path) -> None:
    assert bed.get("deviceclass", CHART_CLASS)["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    said = one_line_failure(migrate(bed, "-f", write(tmp_path, config("mixed")), "--apply"),
                            f"nvidia.com/gpu would be claimed by two DeviceClasses: {CHART_CLASS} (existing)")
    assert "one class per extendedResourceName" in said
    assert not made_by_migrate(bed), "a refused migrate created classes"


@pytest.mark.testbed_only
def test_mixed_fleet_serves_each_mig_profile(bed: Bed, without_chart_class: None, clean: str, tmp_path: Path) -> None:
    said = switch(bed, clean, {"mig-pod": "nvidia.com/mig-1g.10gb"}, "-f", write(tmp_path, config("mixed")))
    assert said["mig-pod"] == (f"nvidia-mig-1g.10gb.{DRIVER}", f"yes, on {MIXED} (1)"), said
    made = made_by_migrate(bed)
    profiles = ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
    assert made == {f"nvidia-mig-{p}.{DRIVER}" for p in profiles} | {f"nvidia-gpu.{DRIVER}"}, made
    node, _, device = ran_on(bed, clean, "mig-pod")
    assert node == MIXED and attr(device, "profile") == "1g.10gb", device


@pytest.mark.testbed_only
def test_single_fleet_serves_nvidia_gpu_as_a_mig_device(bed: Bed, without_chart_class: None, clean: str,
                                                         tmp_path: Path) -> None:
    fence(bed, MIXED, TS)
    said = switch(bed, clean, {"gpu-pod": "nvidia.com/gpu"}, "-f", write(tmp_path, config("single")))
    assert said["gpu-pod"] == (f"nvidia-gpu.{DRIVER}", f"yes, on {SINGLE} (1)"), said
    node, _, device = ran_on(bed, clean, "gpu-pod")
    assert node == SINGLE and attr(device, "type") == "mig" and attr(device, "profile") == "3g.20gb", device


@pytest.mark.testbed_only
@pytest.mark.parametrize(("rename", "resource"), [(False, "nvidia.com/gpu"), (True, "nvidia.com/gpu.shared")])
def test_time_slicing_replicas_are_shares(bed: Bed, without_chart_class: None, clean: str, tmp_path: Path,
                                          rename: bool, resource: str) -> None:
    said = switch(bed, clean, {"ts-0": resource, "ts-1": resource},
                  "-f", write(tmp_path, config(replicas=4, rename=rename)))
    for name in ("ts-0", "ts-1"):
        assert said[name] == (f"{'nvidia-gpu.shared' if rename else 'nvidia-gpu'}.{DRIVER}", f"yes, on {TS} (1)"), said
    results = []
    for name in ("ts-0", "ts-1"):
        node, result, device = ran_on(bed, clean, name)
        assert node == TS and device["name"] == "gpu-0" and result["consumedCapacity"]["shares"] == "1", result
        results.append(result)
    assert results[0]["shareID"] != results[1]["shareID"], "two shares of the one GPU"


@pytest.mark.testbed_only
def test_gpu_operator_configmap_a_config_per_node(bed: Bed, without_chart_class: None, clean: str) -> None:
    """The GPU Operator's ConfigMap, one key per config, each node naming its own by label."""
    keys = {"default": config(), "mig-mixed": config("mixed"), "mig-single": config("single"),
            "ts-shared": config(replicas=4, rename=True)}
    bed.apply([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "device-plugin-config"},
                "data": {k: yaml.safe_dump(v) for k, v in keys.items()}}], ns=clean)
    for node, key in ((MIXED, "mig-mixed"), (SINGLE, "mig-single"), (TS, "ts-shared")):
        bed.kubectl("label", "node", node, f"nvidia.com/device-plugin.config={key}", "--overwrite")
    said = switch(bed, clean, {"mig-pod": "nvidia.com/mig-1g.10gb", "shared-pod": "nvidia.com/gpu.shared"},
                  "--configmap", f"{clean}/device-plugin-config", "--default-config", "default")
    assert said["mig-pod"][1] == f"yes, on {MIXED} (1)" and said["shared-pod"][1] == f"yes, on {TS} (1)", said
    node, _, device = ran_on(bed, clean, "mig-pod")
    assert node == MIXED and attr(device, "profile") == "1g.10gb"
    node, result, _ = ran_on(bed, clean, "shared-pod")
    assert node == TS and result["consumedCapacity"]["shares"] == "1"


# --------------------------------------------------------------------------- bad input


def test_a_missing_configmap_is_one_line(bed: Bed, clean: str) -> None:
    one_line_failure(migrate(bed, "--configmap", f"{clean}/absent"), f"cannot read ConfigMap {clean}/absent: not found")


def test_a_configmap_the_caller_may_not_read_is_one_line(bed: Bed, clean: str, tmp_path: Path) -> None:
    bed.apply([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "device-plugin-config"},
                "data": {"default": yaml.safe_dump(config())}}], ns=clean)
    bed.kubectl("create", "serviceaccount", "nobody", "-n", clean)
    token = bed.kubectl("create", "token", "nobody", "-n", clean).stdout.strip()
    doc = yaml.safe_load(bed.kubeconfig.read_text())
    doc["users"] = [{"name": "nobody", "user": {"token": token}}]
    for ctx in doc["contexts"]:
        ctx["context"]["user"] = "nobody"
    (tmp_path / "nobody").write_text(yaml.safe_dump(doc))
    one_line_failure(migrate(bed, "--configmap", f"{clean}/device-plugin-config", kubeconfig=tmp_path / "nobody"),
                     f"cannot read ConfigMap {clean}/device-plugin-config: not allowed")


@pytest.mark.testbed_only
def test_a_mig_profile_no_node_publishes_is_one_line(bed: Bed, fleet_of_three: None, tmp_path: Path) -> None:
    """The fleet's MIG profiles are read from its ResourceSlices: 9g.99gb is on no node."""
    doc = config("mixed")
    doc["sharing"] = {"timeSlicing": {"resources": [{"name": "nvidia.com/mig-9g.99gb", "replicas": 2}]}}
    one_line_failure(migrate(bed, "-f", write(tmp_path, doc)),
                     f"MIG profile 9g.99gb (nvidia.com/mig-9g.99gb) is published by no node of driver {DRIVER}")
