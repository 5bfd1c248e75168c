"""Our controller on the bed, next to the real kube-scheduler (issue 4).

- ``dra-driver explain`` gives a correct reason (and the right exit status) for the claims users
  get wrong: unsatisfiable selectors, selectors that fail at run time, unknown classes, bad
  GpuConfig in a claim or in its class; the Warning Events show in ``kubectl describe``.
- Opt-in allocation: standalone claims annotated ``gpu.dra-driver.io/allocate: controller`` and
  pods whose template claims the scheduler allocates compete for the same eight H100s; no device
  may ever be in two claims at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.controller.views import pod_view, slice_reading, slice_view
from dra_driver.k8s.client import CLAIMS, PODS, SLICES, RestKubeApi
from dra_driver.k8s.objects import key_of
from dra_driver.k8s.wire import POD_CLAIM_REFS, Reduced, allocation_view
from e2e.suites.reliability import record
from e2e.testbed.apiproxy import send_raw
from e2e.testbed.clusterview import DRIVER, EXPLANATION_ANNOTATION, REPO, Bed, claim_of, example, wait_for

ALLOCATE_ANNOTATION = f"{DRIVER}/allocate"
FINALIZER = "resource.kubernetes.io/delete-protection"
GPU_CLASS = "gpu.gpu.dra-driver.io"
H100 = f'device.attributes["{DRIVER}"].productName.startsWith("NVIDIA H100")'
H100_NODE = "gpu-node-1"

pytestmark = pytest.mark.testbed_only


def explain(bed: Bed, ref: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "dra_driver", "explain", ref, "--kubeconfig", str(bed.kubeconfig), *extra],
                          capture_output=True, text=True, timeout=60, env=env, check=False)  # fmt: skip


def claim_doc(name: str, *, cls: str = GPU_CLASS, selectors: tuple[str, ...] = (), count: int = 1,
              config: list[dict[str, Any]] | None = None, opt_in: bool = False) -> dict[str, Any]:  # fmt: skip
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if config:
        devices["config"] = config
    doc: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
                           "spec": {"devices": devices}}  # fmt: skip
    if opt_in:
        doc["metadata"]["annotations"] = {ALLOCATE_ANNOTATION: "controller"}
    return doc


def bad_gpu_config(requests: list[str] | None = None) -> list[dict[str, Any]]:
    entry: dict[str, Any] = {"opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "gpu.dra-driver.io/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "Sometimes"}}}}  # fmt: skip
    if requests:
        entry["requests"] = requests
    return [entry]


def describe(bed: Bed, kind: str, name: str, ns: str | None = None) -> str:
    args = ["describe", kind, name] + (["-n", ns] if ns else [])
    return bed.kubectl(*args).stdout


def events_in_describe(bed: Bed, ns: str, claim: str, reason: str, timeout: float = 60) -> str:
    return str(wait_for(f"{reason} event in kubectl describe resourceclaim {ns}/{claim}",
                        lambda: (lambda out: out if reason in out.split("Events:", 1)[-1] else None)(
                            describe(bed, "resourceclaim", claim, ns)), timeout, interval=1.0))  # fmt: skip


# --------------------------------------------------------------------------- explain


def test_explain_unsatisfiable_example(bed: Bed, ns: str) -> None:
    bed.apply(example("unsatisfiable"), ns=ns)
    claim = claim_of(bed, ns, "unsatisfiable", "gpu")
    name = claim["metadata"]["name"]
    wait_for("the controller's explanation", lambda: EXPLANATION_ANNOTATION in (
        bed.get("resourceclaim", name, ns)["metadata"].get("annotations") or {}), 60)  # fmt: skip
    out = explain(bed, f"{ns}/{name}")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "unsatisfiable" in text and "NOT allocated" in text, text
    # The reason names the request and the selector that removed every device.
    assert "request gpu" in text and 'quantity("1Ti")' in text, text
    assert "0 candidates, need 1" in text, text
    js = explain(bed, f"{ns}/{name}", "-o", "json")
    assert js.returncode == 0, js.stderr
    report = json.loads(js.stdout)
    assert report["state"] == "unsatisfiable" and report["claim"] == f"{ns}/{name}"
    described = events_in_describe(bed, ns, name, "Unsatisfiable")
    assert "1Ti" in described.split("Events:", 1)[-1] or "0 candidates" in described.split("Events:", 1)[-1], described


def test_explain_selector_error(bed: Bed, ns: str) -> None:
    # The API server rejects CEL that does not compile; what gets through is CEL that fails at
    # run time, here an attribute our devices do not have.
    broken = claim_doc("broken-cel", selectors=("device.attributes[",))
    rejected = bed.kubectl("apply", "-n", ns, "-f", "-", input_text=yaml.safe_dump(broken), check=False)
    assert rejected.returncode != 0 and "compil" in rejected.stderr.lower(), rejected.stderr
    runtime = claim_doc("runtime-cel", selectors=(f'device.attributes["{DRIVER}"].noSuchAttribute == 1',))
    bed.apply([runtime], ns=ns)
    out = explain(bed, f"{ns}/runtime-cel")
    assert out.returncode == 0, out.stderr
    assert "unsatisfiable" in out.stdout and "CEL runtime error" in out.stdout, out.stdout
    assert "noSuchAttribute" in out.stdout, out.stdout


def test_explain_unknown_class_and_exit_codes(bed: Bed, ns: str) -> None:
    bed.apply([claim_doc("no-class", cls="no-such-class.example.com")], ns=ns)
    out = explain(bed, f"{ns}/no-class")
    assert out.returncode == 0, out.stderr
    assert "device class no-such-class.example.com not found" in out.stdout, out.stdout
    missing = explain(bed, f"{ns}/does-not-exist")
    assert missing.returncode == 1 and not missing.stdout
    assert missing.stderr.strip().startswith(f"dra-driver explain: ResourceClaim {ns}/does-not-exist not found (read "
                                             f"'{ns}/does-not-exist' as NAMESPACE/CLAIM;"), missing.stderr
    bad_ref = explain(bed, "no-slash")
    assert bad_ref.returncode == 1 and "NAMESPACE/CLAIM" in bad_ref.stderr and "Traceback" not in bad_ref.stderr
    bad_output = explain(bed, f"{ns}/no-class", "-o", "xml")
    assert bad_output.returncode != 0 and "Traceback" not in bad_output.stderr


def test_explain_bad_gpu_config_in_claim(bed: Bed, ns: str) -> None:
    bed.apply([claim_doc("bad-config", config=bad_gpu_config(["gpu"]), opt_in=True)], ns=ns)
    out = explain(bed, f"{ns}/bad-config")
    assert out.returncode == 0, out.stderr
    assert "invalid configuration" in out.stdout, out.stdout
    assert "spec.devices.config[0].opaque.parameters.sharing.strategy" in out.stdout, out.stdout
    described = events_in_describe(bed, ns, "bad-config", "InvalidConfig")
    assert "sharing.strategy" in described.split("Events:", 1)[-1], described
    obj = bed.get("resourceclaim", "bad-config", ns)
    assert not obj.get("status", {}).get("allocation"), "a claim with invalid config was allocated"


@pytest.fixture()
def bad_class(bed: Bed, ns: str) -> Iterator[str]:
    name = f"bad-config.{ns}.example.com"
    cls = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
           "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
                    "config": bad_gpu_config()}}  # fmt: skip
    bed.apply([cls])
    yield name
    bed.kubectl("delete", "deviceclass", name, "--wait=false", check=False)


def test_explain_bad_gpu_config_in_class(bed: Bed, ns: str, bad_class: str) -> None:
    bed.apply([claim_doc("class-config", cls=bad_class, opt_in=True)], ns=ns)
    out = explain(bed, f"{ns}/class-config")
    assert out.returncode == 0, out.stderr
    assert "invalid configuration" in out.stdout and f"deviceclass {bad_class}: spec.config[0]" in out.stdout, out.stdout
    described = events_in_describe(bed, ns, "class-config", "InvalidConfig")
    assert bad_class in described.split("Events:", 1)[-1], described
    cls_events = describe(bed, "deviceclass", bad_class)
    assert "InvalidConfig" in cls_events, cls_events
    assert not bed.get("resourceclaim", "class-config", ns).get("status", {}).get("allocation")


def test_protobuf_claim_list_reads_what_the_api_server_holds(bed: Bed, ns: str) -> None:
    """``explain`` reads every claim's allocation in protobuf with a schema of our own: it must
    give, for every claim in the cluster, exactly what the JSON form says, including admin access,
    shareID and consumed capacity (written here as an allocator would)."""
    bed.kubectl("label", "namespace", ns, "resource.kubernetes.io/admin-access=true")
    cls = {"deviceClassName": GPU_CLASS}
    bed.apply([{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "wire"},
                "spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {**cls, "count": 2}},
                    {"name": "admin", "exactly": {**cls, "adminAccess": True}},
                    {"name": "mem", "exactly": {**cls, "capacity": {"requests": {"memory": "10Gi"}}}}]}}}], ns=ns)  # fmt: skip
    claim = bed.get("resourceclaim", "wire", ns=ns)
    results = [
        {"request": "gpu", "driver": "wire.example.com", "pool": "p1", "device": "d0"},
        {"request": "gpu", "driver": "wire.example.com", "pool": "p1", "device": "d1"},
        {"request": "admin", "driver": "wire.example.com", "pool": "p1", "device": "d0", "adminAccess": True},
        {"request": "mem", "driver": "wire.example.com", "pool": "p2", "device": "d2",
         "shareID": "6f1c1d3e-0000-4000-8000-000000000001", "consumedCapacity": {"memory": "10Gi", "cores": "500m"}},
    ]
    claim["status"] = {"allocation": {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [H100_NODE]}]}]}}}  # fmt: skip
    bed.kubectl("replace", "--subresource=status", "-f", "-", input_text=json.dumps(claim))
    api = RestKubeApi.from_kubeconfig(str(bed.kubeconfig))
    # The two lists are taken one after the other while earlier tests' namespaces may still be
    # going away; they must agree once the cluster holds still between them.
    deadline = time.monotonic() + 60
    try:
        while True:
            by_uid = {c["metadata"]["uid"]: c for c in api.list_claim_allocations().items}
            as_json = {c["metadata"]["uid"]: allocation_view(c) for c in all_claims(bed)}
            if by_uid == as_json or time.monotonic() > deadline:
                break
            time.sleep(1)
    finally:
        api.close()
    assert by_uid == as_json
    assert by_uid[claim["metadata"]["uid"]]["status"]["allocation"]["devices"]["results"] == results


def test_protobuf_pods_read_what_the_controller_needs(bed: Bed, ns: str) -> None:
    """The controller lists and watches pods in protobuf through a schema of our own
    (``api/proto/kubewire/pods.proto``): what it makes of each pod (``pod_view``: the claims it
    waits for, its node) must equal what it makes of the JSON form, for every pod in the cluster and
    for the events of a watch, with claims named in the spec, from a template (in the status, as the
    resourceclaim controller writes it), none, and a pod being deleted."""
    def pod(name: str, claims: list[dict[str, str]], **meta: Any) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **meta},
                "spec": {"schedulerName": "no-such-scheduler", "resourceClaims": claims,
                         "containers": [{"name": "c", "image": "registry.invalid/none"}]}}  # fmt: skip

    bed.apply([
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "refs"},
         "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": GPU_CLASS}}]}}}},
        pod("refs-standalone", [{"name": "gpu", "resourceClaimName": "refs-claim"}]),
        pod("refs-template", [{"name": "gpu", "resourceClaimTemplateName": "refs"}]),
        pod("refs-none", []),
        pod("refs-deleting", [{"name": "gpu", "resourceClaimName": "refs-claim"}], finalizers=["example.com/hold"]),
    ], ns=ns)  # fmt: skip
    wait_for("the resourceclaim controller names refs-template's claim",
             lambda: bed.get("pod", "refs-template", ns=ns).get("status", {}).get("resourceClaimStatuses"), 60)
    bed.delete("pod", "refs-deleting", ns, wait=False)
    api = RestKubeApi.from_kubeconfig(str(bed.kubeconfig))
    try:
        reduced = api.list(PODS, transform=pod_view, reduced=POD_CLAIM_REFS)
        whole = api.list(PODS, transform=pod_view)
        assert {key_of(p): p for p in reduced.items} == {key_of(p): p for p in whole.items}
        mine = {key_of(p): p for p in reduced.items if p["metadata"]["namespace"] == ns}
        assert set(mine) == {f"{ns}/refs-standalone", f"{ns}/refs-template"}, "no claim, or deleted unscheduled: no view"

        def events(**kw: Any) -> list[tuple[str, Any]]:
            got = []
            for e in api.watch(PODS, resource_version=reduced.resource_version, timeout_seconds=3, **kw):
                if e["type"] != "BOOKMARK" and e["object"]["metadata"]["namespace"] == ns:
                    got.append((e["type"], pod_view(e["object"])))
            return got

        bed.kubectl("label", "pod", "refs-standalone", "-n", ns, "touched=yes")
        bed.apply([pod("refs-later", [{"name": "gpu", "resourceClaimName": "refs-later"}])], ns=ns)
        bed.kubectl("patch", "pod", "refs-deleting", "-n", ns, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
        as_json = events()
        assert len(as_json) >= 3 and events(reduced=POD_CLAIM_REFS) == as_json
    finally:
        api.close()


WIRE_DRIVER = "wire.example.com"


def _wire_slices(tag: str) -> list[dict[str, Any]]:
    """Slices that set every field the protobuf schema declares, in each node selection mode."""
    def sl(name: str, pool: str, count: int, **spec: Any) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{tag}-{name}"},
                "spec": {"driver": WIRE_DRIVER, "pool": {"name": f"{tag}-{pool}", "generation": 1,
                                                         "resourceSliceCount": count}, **spec}}  # fmt: skip

    attributes = {"model": {"string": "H100"}, "index": {"int": 0}, "zero": {"int": 0}, "healthy": {"bool": True},
                  "off": {"bool": False}, "driverVersion": {"version": "580.95.5"},
                  "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"}}
    rich = {"name": "d0", "attributes": attributes, "allowMultipleAllocations": True,
            "capacity": {"memory": {"value": "80Gi", "requestPolicy": {
                             "default": "10Gi", "validRange": {"min": "1Gi", "max": "80Gi", "step": "1Gi"}}},
                         "cores": {"value": "8", "requestPolicy": {"default": "1", "validValues": ["1", "2", "4", "8"]}},
                         "plain": {"value": "1"}},
            "taints": [{"key": "example.com/broken", "value": "xid-79", "effect": "NoSchedule",
                        "timeAdded": "2026-11-27T10:00:00Z"},
                       {"key": "example.com/draining", "effect": "NoExecute"}]}  # fmt: skip
    selector = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]},
                                                             {"key": "gpu", "operator": "Exists"}],
                                       "matchFields": [{"key": "metadata.name", "operator": "In",
                                                        "values": [H100_NODE]}]}]}  # fmt: skip
    return [
        sl("named", "named", 1, nodeName=H100_NODE, devices=[
            rich, {"name": "d1", "attributes": {"model": {"string": "H100"}}, "capacity": {"memory": {"value": "80Gi"}}}]),
        sl("counters", "parts", 2, nodeName=H100_NODE, sharedCounters=[
            {"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}, "slices": {"value": "7"}}}]),
        sl("parts", "parts", 2, nodeName=H100_NODE, devices=[
            {"name": f"mig-{i}", "attributes": {"profile": {"string": "1g.10gb"}},
             "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "10Gi"}, "slices": {"value": "1"}}}]}
            for i in range(3)]),
        sl("selected", "selected", 1, nodeSelector=selector, devices=[{"name": "d0", "attributes": attributes}]),
        sl("everywhere", "everywhere", 1, allNodes=True, devices=[{"name": "d0"}]),
        sl("per-device", "per-device", 1, perDeviceNodeSelection=True, devices=[
            {"name": "on-node", "nodeName": H100_NODE}, {"name": "selected", "nodeSelector": selector},
            {"name": "anywhere", "allNodes": True}]),
    ]


def test_protobuf_slices_read_what_the_api_server_holds(bed: Bed) -> None:
    """The controller lists and watches ResourceSlices in protobuf through a schema of our own
    (``api/proto/kubewire/slices.proto``) and builds their JSON form itself: for every slice in the
    cluster, and for a watch's events, the spec it builds must equal the JSON the API server
    writes (as ``slice_view`` keeps it), with every field the schema declares set, in every node
    selection mode, and the metadata the readers use must agree."""
    tag = f"wire-{os.getpid()}"
    docs = _wire_slices(tag)
    bed.apply(docs)
    api = RestKubeApi.from_kubeconfig(str(bed.kubeconfig))

    def same(proto: list[dict[str, Any]], whole: list[dict[str, Any]]) -> None:
        by_name = {s["metadata"]["name"]: s for s in whole}
        assert {s["metadata"]["name"] for s in proto} == set(by_name)
        for s in proto:
            j = by_name[s["metadata"]["name"]]
            assert s["spec"] == j["spec"], s["metadata"]["name"]
            assert s["metadata"] == {k: j["metadata"][k] for k in s["metadata"]}
            assert {"name", "uid", "resourceVersion"} <= set(s["metadata"])
            assert "creationTimestamp" not in s["metadata"], "read in protobuf, through our schema"

    try:
        wire = api.list(SLICES, reduced=slice_reading())
        whole = api.list(SLICES, transform=slice_view())
        same(wire.items, whole.items)
        mine = {s["metadata"]["name"]: s for s in wire.items if s["metadata"]["name"].startswith(tag)}
        assert len(mine) == len(docs)
        rich = mine[f"{tag}-named"]["spec"]["devices"][0]
        assert rich["taints"][0]["timeAdded"] == "2026-11-27T10:00:00Z" and rich["allowMultipleAllocations"] is True
        assert rich["capacity"]["memory"]["requestPolicy"]["validRange"] == {"min": "1Gi", "max": "80Gi", "step": "1Gi"}
        assert rich["attributes"]["off"] == {"bool": False} and rich["attributes"]["zero"] == {"int": 0}

        def events(**kw: Any) -> list[tuple[str, Any]]:
            got = []
            for e in api.watch(SLICES, resource_version=wire.resource_version, timeout_seconds=3, **kw):
                if e["type"] != "BOOKMARK" and e["object"]["metadata"]["name"].startswith(tag):
                    got.append((e["type"], e["object"]["spec"], e["object"]["metadata"]["resourceVersion"]))
            return got

        bed.kubectl("label", "resourceslice", f"{tag}-named", "touched=yes")
        bed.kubectl("delete", "resourceslice", f"{tag}-everywhere")
        as_json = events(reduced=Reduced(lambda body: ([], "", ""), from_json=slice_view()))
        as_proto = events(reduced=slice_reading())
        assert [t for t, _, _ in as_json] == ["MODIFIED", "DELETED"] and as_proto == as_json
    finally:
        api.close()
        for d in docs:
            bed.kubectl("delete", "resourceslice", d["metadata"]["name"], "--ignore-not-found", check=False)


# --------------------------------------------------------------------------- opt-in allocation


def _exclusive_holders(claims: list[dict[str, Any]]) -> dict[tuple[str, str, str], list[str]]:
    holders: dict[tuple[str, str, str], list[str]] = {}
    for c in claims:
        for r in (c.get("status", {}).get("allocation") or {}).get("devices", {}).get("results", []):
            if r.get("adminAccess") or r.get("shareID"):
                continue
            key = (r["driver"], r["pool"], r["device"])
            holders.setdefault(key, []).append(f"{c['metadata']['namespace']}/{c['metadata']['name']}")
    return holders


def all_claims(bed: Bed) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(bed.kubectl("get", "resourceclaims", "-A", "-o", "json").stdout)["items"]
    return items


def _conflicts(claims: list[dict[str, Any]]) -> dict[tuple[str, str, str], list[str]]:
    return {k: v for k, v in _exclusive_holders(claims).items() if len(v) > 1}


def _pods_and_claims(ns: str, round_no: int, opted: int, pods: int) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for i in range(opted):
        docs.append(claim_doc(f"ctl-{round_no}-{i}", selectors=(H100,), count=1 + i % 2, opt_in=True))
    docs.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": f"h100-{round_no}"},
                 "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                     "deviceClassName": GPU_CLASS, "count": 1, "selectors": [{"cel": {"expression": H100}}]}}]}}}})  # fmt: skip
    for i in range(pods):
        docs.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"sched-{round_no}-{i}"}, "spec": {
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": f"h100-{round_no}"}],
            "containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "3600"],
                            "resources": {"claims": [{"name": "gpu"}]}}]}})  # fmt: skip
    return docs


def _settled(bed: Bed, ns: str, opted: list[str], pods: list[str]) -> list[dict[str, Any]] | None:
    """All claims of the round when every competitor has its answer, else None."""
    claims: list[dict[str, Any]] = bed.get("resourceclaims", ns=ns)["items"]
    by_name = {c["metadata"]["name"]: c for c in claims}
    for name in opted:
        c = by_name.get(name)
        if c is None:
            return None
        answered = c.get("status", {}).get("allocation") or EXPLANATION_ANNOTATION in (c["metadata"].get("annotations") or {})
        if not answered:
            return None
    pod_objs = {p["metadata"]["name"]: p for p in bed.get("pods", ns=ns)["items"]}
    for name in pods:
        p = pod_objs.get(name)
        if p is None:
            return None
        scheduled = p.get("spec", {}).get("nodeName")
        refused = any(cond.get("type") == "PodScheduled" and cond.get("status") == "False"
                      for cond in p.get("status", {}).get("conditions", []))  # fmt: skip
        if not (scheduled or refused):
            return None
    return claims


def _valid_node_selector(allocation: dict[str, Any]) -> bool:
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    return any(f.get("key") == "metadata.name" and f.get("operator") == "In" and f.get("values") == [H100_NODE]
               for t in terms for f in t.get("matchFields", []))  # fmt: skip


def _free_round(bed: Bed, ns: str) -> None:
    bed.kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force", "--wait=false", check=False)
    bed.kubectl("delete", "resourceclaims", "--all", "-n", ns, "--wait=false", check=False)
    wait_for(f"claims of {ns} gone (the controller releases its finalizer)",
             lambda: not bed.get("resourceclaims", ns=ns)["items"], 90, interval=1.0)


def test_allocation_fence_on_the_api_server(bed: Bed, ns: str) -> None:
    """The fence is what makes opt-in allocation safe: kube-apiserver itself refuses another
    claim's allocation of a device the controller holds. (Deleting and re-creating the binding
    here is avoided: kube-apiserver 1.36.3 then keeps enforcing a stale copy of the ConfigMap.)"""
    bed.apply([claim_doc("fenced", selectors=(H100,), opt_in=True), claim_doc("intruder", selectors=(H100,))], ns=ns)
    held = wait_for("the controller's allocation", lambda: bed.get("resourceclaim", "fenced", ns=ns).get("status", {})
                    .get("allocation"), 60)  # fmt: skip
    device = held["devices"]["results"][0]
    intruder = bed.get("resourceclaim", "intruder", ns=ns)
    intruder["status"] = {"allocation": {"devices": {"results": [device]}, "nodeSelector": held["nodeSelector"]}}
    denied = bed.kubectl("replace", "--subresource=status", "-f", "-", input_text=json.dumps(intruder), check=False)
    assert denied.returncode != 0 and "allocation fence" in denied.stderr, denied.stderr
    assert not bed.get("resourceclaim", "intruder", ns=ns).get("status", {}).get("allocation")


@pytest.mark.parametrize("rounds", [3])
def test_opt_in_allocation_beside_the_scheduler(bed: Bed, ns: str, rounds: int) -> None:
    opted_count, pod_count = 5, 5  # 7 GPUs for the controller's claims + 5 for pods > 8 H100s
    sampled = 0
    served = {"controller": 0, "scheduler": 0}
    for round_no in range(rounds):
        docs = _pods_and_claims(ns, round_no, opted_count, pod_count)
        opted = [d["metadata"]["name"] for d in docs if d["kind"] == "ResourceClaim"]
        pods = [d["metadata"]["name"] for d in docs if d["kind"] == "Pod"]
        # Interleave so neither side gets a head start.
        order = [d for d in docs if d["kind"] == "ResourceClaimTemplate"]
        order += [d for pair in zip([d for d in docs if d["kind"] == "ResourceClaim"], [d for d in docs if d["kind"] == "Pod"],
                                    strict=True) for d in pair]  # fmt: skip
        bed.apply(order, ns=ns)
        deadline = time.monotonic() + 120
        settled: list[dict[str, Any]] | None = None
        while time.monotonic() < deadline:
            # Every claim of the cluster counts: other tests' claims hold devices too.
            everything = all_claims(bed)
            sampled += 1
            assert not _conflicts(everything), f"round {round_no}: devices in two claims: {_conflicts(everything)}"
            settled = _settled(bed, ns, opted, pods)
            if settled is not None:
                break
            time.sleep(0.5)
        assert settled is not None, f"round {round_no}: competitors not settled in 120s"
        # A few more samples after the dust settled: late post-write checks must not break anything.
        for _ in range(6):
            everything = all_claims(bed)
            assert not _conflicts(everything), f"round {round_no}: devices in two claims: {_conflicts(everything)}"
            time.sleep(1.0)
        claims = bed.get("resourceclaims", ns=ns)["items"]
        h100s = {k for k in _exclusive_holders(claims) if k[1].startswith(H100_NODE)}
        assert len(h100s) <= 8
        got = 0
        for c in claims:
            alloc = c.get("status", {}).get("allocation")
            if c["metadata"]["name"] in opted and alloc:
                got += 1
                assert FINALIZER in (c["metadata"].get("finalizers") or []), f"{c['metadata']['name']} lacks the finalizer"
                assert _valid_node_selector(alloc), f"{c['metadata']['name']}: nodeSelector {alloc.get('nodeSelector')}"
                results = alloc["devices"]["results"]
                want = 1 + int(c["metadata"]["name"].rsplit("-", 1)[1]) % 2
                assert len(results) == want and all(r["driver"] == DRIVER for r in results), results
        # Demand exceeds supply, so someone must have been turned away, and both sides got some GPUs
        # unless the other side got there first every time; at least check the controller served.
        total = sum(len((c.get("status", {}).get("allocation") or {}).get("devices", {}).get("results", [])) for c in claims)
        held = sorted((c["metadata"]["name"], r["pool"], r["device"]) for c in claims
                      for r in (c.get("status", {}).get("allocation") or {}).get("devices", {}).get("results", []))  # fmt: skip
        assert total <= 8, f"round {round_no}: {total} H100s handed out, only 8 exist: {held}"
        # Every opted-in claim left without devices says why.
        for c in claims:
            if c["metadata"]["name"] in opted and not c.get("status", {}).get("allocation"):
                assert EXPLANATION_ANNOTATION in (c["metadata"].get("annotations") or {}), c["metadata"]
        served["controller"] += got
        served["scheduler"] += sum(1 for c in claims
                                   if c["metadata"]["name"] not in opted and c.get("status", {}).get("allocation"))  # fmt: skip
        _free_round(bed, ns)
    assert sampled >= rounds
    # Both allocators really competed: each got GPUs in this run.
    assert served["controller"] and served["scheduler"], served


# --------------------------------------------------------------------------- a claim that cannot be decoded

UNDECODABLE_PARAMETERS = {
    "surrogate": b'"\\ud800"',
    "raw-ff": b'"\xff"',
    "deep": b'{"a":' * 1100 + b"1" + b"}" * 1100,
}
"""What a tenant can put in a claim's opaque parameters that orjson refuses: the API server stores
each as sent (a raw field) and serves it back in every list and watch that holds the claim."""


def _create_raw(bed: Bed, ns: str, name: str, parameters: bytes) -> tuple[int, bytes]:
    doc = claim_doc(name, config=[{"opaque": {"driver": "other.example.com", "parameters": {"x": "@PARAMS@"}}}])
    body = json.dumps(doc).encode().replace(b'"@PARAMS@"', parameters)
    return send_raw(bed.kubeconfig, "POST", CLAIMS.path(ns), body)


def test_a_claim_that_cannot_be_decoded_blinds_nothing(bed: Bed, ns: str, tmp_path: Path) -> None:
    created: list[str] = []
    refused: dict[str, str] = {}
    try:
        for kind, parameters in UNDECODABLE_PARAMETERS.items():
            status, data = _create_raw(bed, ns, f"bad-{kind}", parameters)
            if status == 201:
                created.append(f"bad-{kind}")
            else:
                refused[kind] = f"{status}: {data[:160].decode(errors='replace')}"
        # What the review measured on the bed's API server: it stores both kinds of bad text.
        assert {"bad-surrogate", "bad-raw-ff"} <= set(created), refused
        listed = RestKubeApi.from_kubeconfig(str(bed.kubeconfig)).list(CLAIMS, namespace=ns)
        assert sorted(u.name for u in listed.undecodable) == sorted(created) and not listed.items

        # The controller says so: one Warning Event on each, naming it.
        def undecodable_events() -> dict[str, list[dict[str, Any]]]:
            out: dict[str, list[dict[str, Any]]] = {}
            for e in bed.get("events.events.k8s.io", ns=ns)["items"]:
                if e.get("reason") == "Undecodable":
                    out.setdefault(e["regarding"]["name"], []).append(e)
            return out

        wait_for("an Undecodable Event on each bad claim", lambda: sorted(undecodable_events()) == sorted(created), 60)
        # It keeps explaining the others (a claim annotated for its allocation that nothing fits: the
        # consistent list of every claim an allocation reads holds the bad ones)...
        bed.apply([claim_doc("after-bad", selectors=(f'device.attributes["{DRIVER}"].productName == "none"',),
                             opt_in=True)], ns=ns)
        wait_for("the controller's explanation of another claim", lambda: EXPLANATION_ANNOTATION in (
            bed.get("resourceclaim", "after-bad", ns)["metadata"].get("annotations") or {}), 60)  # fmt: skip
        out = explain(bed, f"{ns}/after-bad")
        assert out.returncode == 0 and "unsatisfiable" in out.stdout, out.stdout + out.stderr
        # ... and allocating, with a consistent list of every claim.
        bed.apply([claim_doc("allocated-beside-bad", opt_in=True)], ns=ns)
        wait_for("the controller's allocation", lambda: bed.get("resourceclaim", "allocated-beside-bad", ns).get(
            "status", {}).get("allocation"), 60)  # fmt: skip
        # debug-bundle lists every claim and names the bad ones.
        bundle = tmp_path / "bundle.tar.gz"
        proc = subprocess.run([sys.executable, "-m", "dra_driver", "debug-bundle", f"--kubeconfig={bed.kubeconfig}",
                               "-o", str(bundle)], cwd=REPO, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr
        with tarfile.open(bundle) as tar:
            files = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
        not_collected = json.loads(files["manifest.json"])["notCollected"]
        for name in created:
            assert any(f"{ns}/{name}" in line and "cannot be decoded" in line for line in not_collected), not_collected
        in_bundle = {c["metadata"]["name"] for c in json.loads(files["cluster/resourceclaims.json"])}
        assert {"after-bad", "allocated-beside-bad"} <= in_bundle and not in_bundle & set(created)
        events = undecodable_events()
        assert all(len(events[name]) == 1 for name in created), events
        result = {"what": "claims whose opaque parameters hold a lone surrogate, a raw 0xff, 1,100 nested "
                          "objects, sent as raw bytes; then another claim explained, one allocated, a debug-bundle",
                  "created": created, "refused_by_the_api_server": refused,
                  "undecodable_events": {n: len(events[n]) for n in created},
                  "event_notes": {n: events[n][0]["note"][:200] for n in created}, "lost": []}
        record("decode", "undecodable_claims", result)
        print(json.dumps(result, indent=1))
    finally:
        for name in created:  # before other tests list claims: they must not meet these
            send_raw(bed.kubeconfig, "DELETE", CLAIMS.path(ns, name))
        bed.kubectl("delete", "resourceclaim", "allocated-beside-bad", "-n", ns, "--wait=false", check=False)


# --------------------------------------------------------------------------- the scheduler's policy (issue 50)

SUMMARY_ANNOTATION = f"{DRIVER}/explanation-summary"


def _summary(bed: Bed, ns: str, claim: str) -> str | None:
    return (bed.get("resourceclaim", claim, ns=ns)["metadata"].get("annotations") or {}).get(SUMMARY_ANNOTATION)


def _free(bed: Bed, pool: str, device: str) -> bool:
    return all((r["pool"], r["device"]) != (pool, device) for c in all_claims(bed)
               for r in (c.get("status", {}).get("allocation") or {}).get("devices", {}).get("results", [])
               if r["driver"] == DRIVER)  # fmt: skip


def test_a_device_taint_rule_binds_the_controller_as_it_binds_the_scheduler(bed: Bed, ns: str) -> None:
    """A GPU an admin took out of service with a DeviceTaintRule (the slice untouched): a tenant's
    claim annotated for controller allocation is refused with an explanation naming the rule, the
    real kube-scheduler refuses the same GPU to a pod, and once the rule is gone the controller
    allocates it: the refusal was the rule's."""
    if '"devicetaintrules"' not in bed.kubectl("get", "--raw", "/apis/resource.k8s.io/v1", check=False).stdout:
        pytest.skip("resource.k8s.io/v1 DeviceTaintRule needs Kubernetes 1.37; this bed does not serve it")
    device, rule = "gpu-5", f"{ns}-gpu-5-maintenance"
    only_it = (H100, f'device.attributes["{DRIVER}"].index == 5')
    wait_for(f"{H100_NODE}/{device} free of earlier tests' claims", lambda: _free(bed, H100_NODE, device), 180)
    bed.apply([{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": rule},
                "spec": {"deviceSelector": {"driver": DRIVER, "pool": H100_NODE, "device": device},
                         "taint": {"key": "e2e.dra-driver.io/maintenance", "value": "planned", "effect": "NoSchedule"}}}])
    try:
        bed.apply([claim_doc("tenant", selectors=only_it, opt_in=True),
                   {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "same-gpu"},
                    "spec": {"spec": claim_doc("x", selectors=only_it)["spec"]}},
                   {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "same-gpu"},
                    "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "same-gpu"}],
                             "containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "3600"],
                                             "resources": {"claims": [{"name": "gpu"}]}}]}}], ns=ns)  # fmt: skip
        summary = wait_for("the controller's refusal", lambda: _summary(bed, ns, "tenant"), 60)
        assert f"from DeviceTaintRule {rule} not tolerated" in summary, summary
        assert "e2e.dra-driver.io/maintenance=planned:NoSchedule" in summary
        doc = json.loads(bed.get("resourceclaim", "tenant", ns=ns)["metadata"]["annotations"][EXPLANATION_ANNOTATION])
        assert f"DeviceTaintRule {rule}" in json.dumps(doc)
        assert "Unsatisfiable" in events_in_describe(bed, ns, "tenant", "Unsatisfiable")

        def unschedulable() -> str | None:
            conditions = bed.get("pod", "same-gpu", ns=ns).get("status", {}).get("conditions") or []
            return next((c.get("message", "") for c in conditions if c.get("type") == "PodScheduled"
                         and c.get("status") == "False" and c.get("reason") == "Unschedulable"), None)

        said = wait_for("the scheduler's refusal of the pod", unschedulable, 90)
        print(f"\nscheduler: {said}\ncontroller: {summary}")
        time.sleep(5)  # both have had their chances; neither took the GPU
        assert not bed.get("resourceclaim", "tenant", ns=ns).get("status", {}).get("allocation")
        assert _free(bed, H100_NODE, device)

        bed.kubectl("delete", "pod", "same-gpu", "-n", ns, "--grace-period=0", "--force", "--wait=true", check=False)
        bed.kubectl("delete", "devicetaintrule", rule, "--wait=true", "--timeout=60s")
        got = wait_for("the controller's allocation once the rule is gone",
                       lambda: bed.get("resourceclaim", "tenant", ns=ns).get("status", {}).get("allocation"), 90)
        assert [(r["pool"], r["device"]) for r in got["devices"]["results"]] == [(H100_NODE, device)]
    finally:
        bed.kubectl("delete", "devicetaintrule", rule, "--ignore-not-found", check=False)
        _free_round(bed, ns)


def test_a_namespace_outside_the_allow_list_is_not_allowed_here(bed: Bed, ns: str) -> None:
    """Controller allocation is opt-in per namespace (the bed's controller allows every namespace
    without REFUSED_NAMESPACE_LABEL): a claim annotated for it elsewhere is told so, on the claim
    and in an Event, and holds nothing; opened, the same claim is allocated."""
    from e2e.testbed.nodes import REFUSED_NAMESPACE_LABEL

    bed.kubectl("label", "namespace", ns, f"{REFUSED_NAMESPACE_LABEL}=true")
    try:
        bed.apply([claim_doc("outside", selectors=(H100,), opt_in=True)], ns=ns)
        summary = wait_for("the controller's refusal", lambda: _summary(bed, ns, "outside"), 60)
        assert summary.startswith(f"controller allocation is not allowed here: namespace {ns} is not one the "
                                  "cluster's admin opened to it"), summary
        assert "NotAllowed" in events_in_describe(bed, ns, "outside", "NotAllowed")
        time.sleep(3)
        assert not bed.get("resourceclaim", "outside", ns=ns).get("status", {}).get("allocation")
        bed.kubectl("label", "namespace", ns, f"{REFUSED_NAMESPACE_LABEL}-")
        wait_for("the allocation once the namespace is opened",
                 lambda: bed.get("resourceclaim", "outside", ns=ns).get("status", {}).get("allocation"), 60)
        assert _summary(bed, ns, "outside") is None
    finally:
        _free_round(bed, ns)
