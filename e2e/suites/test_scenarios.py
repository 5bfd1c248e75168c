"""Each scenario as a user runs it: apply the example from deploy/examples, watch what the pods get.

The kube-scheduler allocates from our ResourceSlices, the kubelet (peer on the local bed) prepares
through our sockets, and the container's view comes from the CDI specs we wrote.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from e2e.testbed.clusterview import (
    EXPLANATION_ANNOTATION,
    Bed,
    allocated,
    attr,
    claim_of,
    example,
    names_of,
    observed,
    wait_for,
    wait_running,
)


def run_example(bed: Bed, ns: str, name: str) -> list[dict[str, Any]]:
    docs = example(name)
    bed.apply(docs, ns=ns)
    return docs


def pod_claims(docs: list[dict[str, Any]], pod: str) -> list[str]:
    spec = next(d for d in docs if d.get("kind") == "Pod" and d["metadata"]["name"] == pod)["spec"]
    return [c["name"] for c in spec.get("resourceClaims", [])]


def visible_uuids(view: dict[str, Any]) -> set[str]:
    value = view["env"].get("NVIDIA_VISIBLE_DEVICES", "")
    return {u for u in value.split(",") if u}


def check_pod_got_its_devices(bed: Bed, ns: str, docs: list[dict[str, Any]], pod: str) -> list[dict[str, Any]]:
    """The pod runs, and every container that uses a claim sees exactly the allocated devices."""
    wait_running(bed, ns, pod)
    devices: list[dict[str, Any]] = []
    for claim_name in pod_claims(docs, pod):
        devices += allocated(bed, claim_of(bed, ns, pod, claim_name))
    assert devices, f"pod {pod} has no devices of our driver allocated"
    uuids = {attr(d, "uuid") for d in devices}
    views = observed(bed, ns, pod)
    spec = next(d for d in docs if d.get("kind") == "Pod" and d["metadata"]["name"] == pod)["spec"]
    users = [c["name"] for c in spec["containers"] if c.get("resources", {}).get("claims")]
    assert users, "example pod has no container using a claim"
    for container in users:
        got = visible_uuids(views[container])
        assert got and got <= uuids, f"{container} sees {got}, allocated {uuids}"
        paths = {d["path"] for d in views[container]["devices"]}
        assert "/dev/nvidiactl" in paths, f"{container} lacks /dev/nvidiactl: {paths}"
    return devices


@pytest.mark.smoke
def test_one_gpu(bed: Bed, ns: str) -> None:
    docs = run_example(bed, ns, "single-gpu")
    (pod,) = names_of(docs, "Pod")
    devices = check_pod_got_its_devices(bed, ns, docs, pod)
    assert len(devices) == 1 and attr(devices[0], "type") == "gpu"
    view = next(iter(observed(bed, ns, pod).values()))
    assert f"/dev/nvidia{attr(devices[0], 'minor')}" in {d["path"] for d in view["devices"]}


def test_two_pods_get_distinct_gpus(bed: Bed, ns: str) -> None:
    docs = run_example(bed, ns, "two-pods-distinct-gpus")
    pods = names_of(docs, "Pod")
    assert len(pods) == 2
    got = [check_pod_got_its_devices(bed, ns, docs, p) for p in pods]
    first, second = ({(d["_result"]["pool"], d["name"]) for d in g} for g in got)
    assert first.isdisjoint(second), f"both pods got {first & second}"


def test_two_gpus_on_one_numa_node(bed: Bed, ns: str) -> None:
    docs = run_example(bed, ns, "same-numa-pair")
    (pod,) = names_of(docs, "Pod")
    devices = check_pod_got_its_devices(bed, ns, docs, pod)
    assert len(devices) == 2
    numa = {attr(d, "resource.kubernetes.io/numaNode") for d in devices}
    assert len(numa) == 1 and None not in numa, f"devices span NUMA nodes {numa}"


def test_model_chosen_by_cel(bed: Bed, ns: str) -> None:
    docs = run_example(bed, ns, "h100-by-product")
    (pod,) = names_of(docs, "Pod")
    devices = check_pod_got_its_devices(bed, ns, docs, pod)
    assert all("H100" in attr(d, "productName") for d in devices)


def test_at_least_40gi_of_memory(bed: Bed, ns: str) -> None:
    docs = run_example(bed, ns, "memory-40gi")
    (pod,) = names_of(docs, "Pod")
    devices = check_pod_got_its_devices(bed, ns, docs, pod)
    from dra_driver.k8s.quantity import parse_quantity

    assert all(parse_quantity(d["capacity"]["memory"]["value"]) >= parse_quantity("40Gi") for d in devices)


@pytest.mark.smoke
def test_mig_profile(bed: Bed, ns: str) -> None:
    docs = run_example(bed, ns, "mig-1g")
    (pod,) = names_of(docs, "Pod")
    devices = check_pod_got_its_devices(bed, ns, docs, pod)
    assert all(attr(d, "type") == "mig" and str(attr(d, "profile")).startswith("1g.") for d in devices)
    view = next(iter(observed(bed, ns, pod).values()))
    assert any(p["path"].startswith("/dev/nvidia-caps/") for p in view["devices"]), view["devices"]


def test_shared_claim_across_containers_and_pods(bed: Bed, ns: str) -> None:
    docs = run_example(bed, ns, "shared-claim")
    pods = names_of(docs, "Pod")
    assert len(pods) >= 2
    seen: list[set[str]] = []
    for pod in pods:
        check_pod_got_its_devices(bed, ns, docs, pod)
        seen += [visible_uuids(v) for v in observed(bed, ns, pod).values() if visible_uuids(v)]
    assert len(seen) >= 3 and all(s == seen[0] for s in seen), f"containers saw different devices: {seen}"
    (claim,) = names_of(docs, "ResourceClaim")
    reserved = bed.get("resourceclaim", claim, ns)["status"].get("reservedFor", [])
    assert len(reserved) == len(pods)


def test_first_available_fallback(bed: Bed, ns: str) -> None:
    docs = run_example(bed, ns, "first-available")
    (pod,) = names_of(docs, "Pod")
    devices = check_pod_got_its_devices(bed, ns, docs, pod)
    (result,) = [d["_result"] for d in devices]
    # The bed has H100s, so the first alternative must win while any is free.
    assert "/" in result["request"], f"allocation should name the subrequest: {result}"
    assert "H100" in attr(devices[0], "productName")


def test_admin_access(bed: Bed, ns: str) -> None:
    bed.kubectl("label", "namespace", ns, "resource.kubernetes.io/admin-access=true")
    docs = run_example(bed, ns, "admin-access")
    (pod,) = names_of(docs, "Pod")
    devices = check_pod_got_its_devices(bed, ns, docs, pod)
    assert all(d["_result"].get("adminAccess") for d in devices)


def test_extended_resource_through_device_class(bed: Bed, ns: str) -> None:
    docs = run_example(bed, ns, "extended-resource")
    (pod,) = names_of(docs, "Pod")
    wait_running(bed, ns, pod)
    status = bed.get("pod", pod, ns)["status"]
    claim_name = status["extendedResourceClaimStatus"]["resourceClaimName"]
    devices = allocated(bed, bed.get("resourceclaim", claim_name, ns))
    assert len(devices) == 1
    view = next(iter(observed(bed, ns, pod).values()))
    assert visible_uuids(view) == {attr(devices[0], "uuid")}


def test_unsatisfiable_claim_is_explained(bed: Bed, ns: str) -> None:
    docs = run_example(bed, ns, "unsatisfiable")
    (pod,) = names_of(docs, "Pod")
    claim = claim_of(bed, ns, pod, pod_claims(docs, pod)[0])
    name = claim["metadata"]["name"]

    def explanation() -> str | None:
        obj = bed.get("resourceclaim", name, ns)
        return obj["metadata"].get("annotations", {}).get(EXPLANATION_ANNOTATION)

    text = wait_for("the controller's explanation", explanation, 60)
    assert "memory" in json.dumps(json.loads(text)), text
    assert bed.get("pod", pod, ns)["status"].get("phase") == "Pending"
    described = bed.kubectl("describe", "resourceclaim", name, "-n", ns).stdout
    assert "Unsatisfiable" in described, described


@pytest.mark.testbed_only
@pytest.mark.smoke
def test_deleted_pod_is_unprepared_and_its_gpu_reusable(bed: Bed, ns: str) -> None:
    docs = run_example(bed, ns, "single-gpu")
    (pod,) = names_of(docs, "Pod")
    (device,) = check_pod_got_its_devices(bed, ns, docs, pod)
    claim = claim_of(bed, ns, pod, pod_claims(docs, pod)[0])
    uid, node = claim["metadata"]["uid"], device["_result"]["pool"]
    cdi_dir = bed.fleet.nodes[node].cdi_dir
    assert any(uid in p.name for p in cdi_dir.iterdir()), "no CDI spec written for the claim"

    bed.delete("pod", pod, ns)
    wait_for("the CDI spec to be removed", lambda: not any(uid in p.name for p in cdi_dir.iterdir()), 60)
    wait_for("the generated claim to go away",
             lambda: bed.kubectl("get", "resourceclaim", claim["metadata"]["name"], "-n", ns, check=False).returncode != 0,
             60)

    # The same GPU, asked for by UUID, goes to the next pod.
    again = json.loads(json.dumps(docs))
    for d in again:
        d["metadata"]["name"] += "-again"
        if d["kind"] == "Pod":
            for c in d["spec"]["resourceClaims"]:
                c["resourceClaimTemplateName"] += "-again"
        if d["kind"] == "ResourceClaimTemplate":
            req = d["spec"]["spec"]["devices"]["requests"][0]["exactly"]
            req["selectors"] = [*req.get("selectors", []), {"cel": {
                "expression": f'device.attributes["gpu.dra-driver.io"].uuid == "{attr(device, "uuid")}"'}}]
    bed.apply(again, ns=ns)
    (pod2,) = names_of(again, "Pod")
    (device2,) = check_pod_got_its_devices(bed, ns, again, pod2)
    assert attr(device2, "uuid") == attr(device, "uuid")
