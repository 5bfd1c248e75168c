"""The scenarios on a real node: the real kubelet, containerd with CDI, runc, real containers.

``real-node-1`` (``e2e/testbed/realnode.py``) runs beside the simulated nodes: the kubelet registers
our plugin from its own ``plugins_registry``, calls NodePrepareResources, containerd applies the
CDI spec we wrote, and the container prints what it got (``env`` and ``ls -l /dev/nvidia*``), read
back with ``kubectl logs``. The example manifests are used as they are, plus a nodeSelector and a
toleration for the real node's taint.

Where the machine forbids a piece (no root, no static busybox, no Go to build containerd), the
tests are expected failures naming exactly what is missing; they are never skipped as passes.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from e2e.testbed.clusterview import Bed, allocated, attr, claim_of, example, names_of, wait_for, wait_running

# Registration with the real kubelet, prepare/unprepare, health: all of it is the smoke subset.
pytestmark = [pytest.mark.testbed_only, pytest.mark.smoke]


def on_real_node(docs: list[dict[str, Any]], node: Any) -> list[dict[str, Any]]:
    from e2e.testbed.realnode import pod_overrides

    out = copy.deepcopy(docs)
    for d in out:
        if d.get("kind") == "Pod":
            d["spec"].update(pod_overrides(node.node_name))
    return out


def run_on_real_node(bed: Bed, ns: str, node: Any, name: str) -> list[dict[str, Any]]:
    docs = on_real_node(example(name), node)
    bed.apply(docs, ns=ns)
    return docs


def container_logs(bed: Bed, node: Any, ns: str, pod: str, container: str) -> str:
    """The container's own stdout: ``kubectl logs`` (apiserver -> kubelet), or the CRI log file.

    The bed's apiserver prefers a node's Hostname address, and ``real-node-1`` resolves nowhere;
    until it runs with ``--kubelet-preferred-address-types=InternalIP,...`` ``kubectl logs`` fails
    with "dial tcp: lookup real-node-1 ...: no such host". The same bytes are then read from the
    log file containerd writes for the container (CRI format: ``<time> <stream> <tag> <line>``).
    """
    proc = bed.kubectl("logs", pod, "-n", ns, "-c", container, check=False)
    if proc.returncode == 0:
        return proc.stdout
    if "no such host" not in proc.stderr:
        raise AssertionError(f"kubectl logs {ns}/{pod} -c {container} failed: {proc.stderr.strip()}")
    bed.extra.setdefault("kubectl_logs_error", proc.stderr.strip())
    path = node.container_log_file(ns, pod, container)
    if path is None:
        return ""
    return "".join(line.split(" ", 3)[3] + "\n" for line in path.read_text().splitlines() if line.count(" ") >= 3)


def container_view(bed: Bed, node: Any, ns: str, pod: str, container: str) -> dict[str, Any]:
    """What the container printed about itself: its env lines and the /dev entries `ls -l` listed."""
    def probe() -> str | None:
        out = container_logs(bed, node, ns, pod, container)
        return out if "NVIDIA_VISIBLE_DEVICES=" in out and "/dev/" in out else None

    logs: str = wait_for(f"output of {ns}/{pod}/{container}", probe, 60)
    env = dict(line.split("=", 1) for line in logs.splitlines() if "=" in line and "/dev/" not in line)
    devices = {}
    for line in logs.splitlines():
        fields = line.split()
        if fields and fields[-1].startswith("/dev/"):
            devices[fields[-1]] = line
    return {"env": env, "devices": devices, "raw": logs}


def check_real_pod(bed: Bed, ns: str, node: Any, docs: list[dict[str, Any]], pod: str) -> list[dict[str, Any]]:
    """The pod runs on the real node, and each claim-using container sees exactly its devices as char devices."""
    obj = wait_running(bed, ns, pod, timeout=120)
    assert obj["spec"]["nodeName"] == node.node_name
    spec = next(d for d in docs if d.get("kind") == "Pod" and d["metadata"]["name"] == pod)["spec"]
    devices: list[dict[str, Any]] = []
    for entry in spec.get("resourceClaims", []):
        claim = claim_of(bed, ns, pod, entry["name"])
        devices += allocated(bed, claim)
        # The kubelet called NodePrepareResources: our CDI spec for the claim is in containerd's CDI dir.
        spec_file = node.cdi_dir / f"k8s.{node_driver()}-claim_{claim['metadata']['uid']}.json"
        assert spec_file.exists(), f"no CDI spec {spec_file}: {sorted(os.listdir(node.cdi_dir))}"
    assert devices, f"pod {pod} has no devices of our driver allocated"
    uuids = {attr(d, "uuid") for d in devices}
    for c in spec["containers"]:
        if not c.get("resources", {}).get("claims"):
            continue
        view = container_view(bed, node, ns, pod, c["name"])
        got = {u for u in view["env"].get("NVIDIA_VISIBLE_DEVICES", "").split(",") if u}
        assert got and got <= uuids, f"{c['name']} sees {got}, allocated {uuids}:\n{view['raw']}"
        assert "/dev/nvidiactl" in view["devices"], view["raw"]
        for d in devices:
            path = f"/dev/nvidia{attr(d, 'minor')}"
            assert path in view["devices"], f"{c['name']} lacks {path}:\n{view['raw']}"
            assert view["devices"][path].startswith("c"), f"{path} is not a character device: {view['devices'][path]}"
        other = {p for p in view["devices"] if p.removeprefix("/dev/nvidia").isdigit()} \
            - {f"/dev/nvidia{attr(d, 'minor')}" for d in devices}
        assert not other, f"{c['name']} sees GPUs it was not given: {other}"
    return devices


def node_driver() -> str:
    from e2e.testbed.nodes import DRIVER_NAME

    return DRIVER_NAME


def test_real_one_gpu(bed: Bed, ns: str, real_node: Any) -> None:
    docs = run_on_real_node(bed, ns, real_node, "single-gpu")
    (pod,) = names_of(docs, "Pod")
    devices = check_real_pod(bed, ns, real_node, docs, pod)
    assert len(devices) == 1 and attr(devices[0], "type") == "gpu"
    view = container_view(bed, real_node, ns, pod, "ctr0")
    assert view["env"].get("DRA_GPU_0_UUID") == attr(devices[0], "uuid"), view["raw"]


def test_real_two_pods_get_distinct_gpus(bed: Bed, ns: str, real_node: Any) -> None:
    docs = run_on_real_node(bed, ns, real_node, "two-pods-distinct-gpus")
    pods = names_of(docs, "Pod")
    assert len(pods) == 2
    got = [check_real_pod(bed, ns, real_node, docs, p) for p in pods]
    first, second = ({attr(d, "uuid") for d in g} for g in got)
    assert first.isdisjoint(second), f"both pods got {first & second}"


def test_real_shared_claim(bed: Bed, ns: str, real_node: Any) -> None:
    docs = run_on_real_node(bed, ns, real_node, "shared-claim")
    pods = names_of(docs, "Pod")
    assert len(pods) >= 2
    seen: list[str] = []
    for pod in pods:
        check_real_pod(bed, ns, real_node, docs, pod)
        spec = next(d for d in docs if d.get("kind") == "Pod" and d["metadata"]["name"] == pod)["spec"]
        for c in spec["containers"]:
            seen.append(container_view(bed, real_node, ns, pod, c["name"])["env"]["NVIDIA_VISIBLE_DEVICES"])
    assert len(seen) >= 3 and len(set(seen)) == 1, f"containers saw {seen}"


def test_real_unprepare_on_delete(bed: Bed, ns: str, real_node: Any) -> None:
    docs = run_on_real_node(bed, ns, real_node, "single-gpu")
    (pod,) = names_of(docs, "Pod")
    check_real_pod(bed, ns, real_node, docs, pod)
    claim = claim_of(bed, ns, pod, "gpu")
    uid = claim["metadata"]["uid"]
    spec_file: Path = real_node.cdi_dir / f"k8s.{node_driver()}-claim_{uid}.json"
    assert json.loads(spec_file.read_text())["devices"]
    bed.delete("pod", pod, ns)
    # The real kubelet calls NodeUnprepareResources once the containers are gone; we drop the spec.
    wait_for(f"CDI spec {spec_file.name} removed", lambda: not spec_file.exists(), 60)
    # kube-controller-manager drops the reservation (or the claim) asynchronously after the pod is gone.
    def released() -> bool:
        got = bed.kubectl("get", "resourceclaim", claim["metadata"]["name"], "-n", ns, "-o", "json", check=False)
        return got.returncode != 0 or not json.loads(got.stdout).get("status", {}).get("reservedFor")

    wait_for(f"claim {claim['metadata']['name']} released", released, 30)


def health_stream_versions(node: Any) -> list[str]:
    """The health API versions the kubelet opened streams of, from our plugin's log."""
    lines = (node.logs / "plugin.log").read_text(errors="replace").splitlines()
    return [json.loads(line).get("version", "") for line in lines if "kubelet opened the device health stream" in line]


def resource_health(bed: Bed, ns: str, pod: str) -> dict[str, tuple[str, str]]:
    """The kubelet's view in the pod's own status: resource ID -> (health, message)."""
    status = bed.get("pod", pod, ns).get("status", {})
    out = {}
    for c in status.get("containerStatuses", []):
        for rs in c.get("allocatedResourcesStatus") or []:
            for r in rs.get("resources") or []:
                out[r["resourceID"]] = (r.get("health", ""), r.get("message", ""))
    return out


def test_real_unhealthy_gpu_in_pod_status(bed: Bed, ns: str, real_node: Any) -> None:
    """The real kubelet reads our health stream (v1 on 1.37) and puts a GPU's health into the
    status of the pod using it; recovery puts it back to Healthy."""
    from e2e.tooling.binaries import kubernetes_version

    minor = int(kubernetes_version().split(".")[1])
    versions = health_stream_versions(real_node)
    assert versions, "the kubelet never opened a device health stream"
    assert versions[-1] == ("v1" if minor >= 37 else "v1alpha1"), f"kubelet {kubernetes_version()} opened {versions}"

    docs = run_on_real_node(bed, ns, real_node, "single-gpu")
    (pod,) = names_of(docs, "Pod")
    (device,) = check_real_pod(bed, ns, real_node, docs, pod)
    uid = claim_of(bed, ns, pod, "gpu")["metadata"]["uid"]
    cdi_id = f"k8s.{node_driver()}/claim={uid}-{device['name']}"  # the kubelet names a device by its first CDI ID
    wait_for("the pod's device reported Healthy",
             lambda: resource_health(bed, ns, pod).get(cdi_id, ("",))[0] == "Healthy", 60)
    real_node.health_file.write_text(json.dumps({device["name"]: {"health": "Unhealthy", "reason": "XID 79", "xid": 79}}))
    try:
        got = wait_for("the pod's device reported Unhealthy",
                       lambda: (h := resource_health(bed, ns, pod).get(cdi_id)) and h[0] == "Unhealthy" and h, 60)
        assert "XID 79" in got[1], got
    finally:
        real_node.health_file.write_text("{}")
    wait_for("the pod's device Healthy again",
             lambda: resource_health(bed, ns, pod).get(cdi_id, ("",))[0] == "Healthy", 60)


def metadata_stream(logs: str, marker: str) -> list[dict[str, Any]]:
    """The JSON objects a container printed between ``---<marker>---`` and the next marker line."""
    text = logs.split(f"---{marker}---\n", 1)[1].split("\n---", 1)[0].strip()
    decoder = json.JSONDecoder()
    docs = []
    while text:
        obj, end = decoder.raw_decode(text)
        docs.append(obj)
        text = text[end:].lstrip()
    return docs


def output_until_end(bed: Bed, node: Any, ns: str, pod: str, container: str) -> str:
    """What the container printed up to its ``---end---`` line."""
    def probe() -> str | None:
        out = container_logs(bed, node, ns, pod, container)
        return out if "---end---" in out else None

    logs: str = wait_for(f"output of {ns}/{pod}/{container}", probe, 60)
    return logs


def test_real_device_metadata_in_container(bed: Bed, ns: str, real_node: Any) -> None:
    """A container reads the metadata file of each claim it uses (Kubernetes 1.37 format, KEP-5304):
    a template's claim under ``resourceclaimtemplates/<pod claim name>``, a named claim under
    ``resourceclaims/<claim>``, both listing the devices with the attributes our slice publishes.
    A container without claims has none; deleting the pod removes the files and their CDI specs."""
    driver = node_driver()
    base = "/var/run/kubernetes.io/dra-device-attributes"
    from_template = f"{base}/resourceclaimtemplates/gpu/gpu/{driver}-metadata.json"
    named = f"{base}/resourceclaims/meta-named/gpu/{driver}-metadata.json"
    request = {"name": "gpu", "exactly": {"deviceClassName": f"gpu.{driver}"}}
    script = (f"env | grep -E 'NVIDIA|DRA_' | sort; ls -l /dev/nvidia* 2>&1; "
              f"echo ---template---; cat {from_template}; echo ---named---; cat {named}; echo ---write---; "
              f"(echo tampered >> {named}) 2>&1; echo ---end---; "
              "trap 'exit 0' TERM; sleep 86400 & wait")
    docs = on_real_node([
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "meta-template"},
         "spec": {"spec": {"devices": {"requests": [request]}}}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "meta-named"},
         "spec": {"devices": {"requests": [request]}}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "meta"}, "spec": {
            "terminationGracePeriodSeconds": 5,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "meta-template"},
                               {"name": "named", "resourceClaimName": "meta-named"}],
            "containers": [
                {"name": "ctr0", "image": "busybox:1.36", "command": ["sh", "-c", script],
                 "resources": {"claims": [{"name": "gpu"}, {"name": "named"}]}},
                {"name": "plain", "image": "busybox:1.36",
                 "command": ["sh", "-c", f"ls {base} 2>&1; echo ---end---; trap 'exit 0' TERM; sleep 86400 & wait"]},
            ]}},
    ], real_node)
    bed.apply(docs, ns=ns)
    check_real_pod(bed, ns, real_node, docs, "meta")
    logs = output_until_end(bed, real_node, ns, "meta", "ctr0")
    host_files: list[Path] = []
    uids: list[str] = []
    for pod_claim, marker in (("gpu", "template"), ("named", "named")):
        claim = claim_of(bed, ns, "meta", pod_claim)
        uid = claim["metadata"]["uid"]
        (device,) = allocated(bed, claim)
        stream = metadata_stream(logs, marker)
        assert [d.get("apiVersion") for d in stream] == [
            "metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1"], logs
        doc = stream[0]
        assert doc["kind"] == "DeviceMetadata"
        assert doc["metadata"] == {"name": claim["metadata"]["name"], "namespace": ns, "uid": uid, "generation": 1}
        assert doc.get("podClaimName") == ("gpu" if marker == "template" else None), doc
        assert doc["requests"] == [{"name": "gpu", "devices": [{
            "driver": driver, "pool": real_node.node_name, "name": device["name"],
            "attributes": device["attributes"]}]}], doc
        assert stream[1] | {"apiVersion": ""} == doc | {"apiVersion": ""}
        # The file on the host and its CDI spec: a read-only bind mount.
        spec_file = real_node.cdi_dir / f"{driver}_metadata_{uid}_gpu.json"
        [mount] = json.loads(spec_file.read_text())["devices"][0]["containerEdits"]["mounts"]
        assert mount["containerPath"] == (from_template if marker == "template" else named)
        assert mount["options"] == ["ro", "bind"]
        host_files.append(Path(mount["hostPath"]))
        uids.append(uid)
    assert "Read-only file system" in logs.split("---write---", 1)[1], logs
    plain = output_until_end(bed, real_node, ns, "meta", "plain")
    assert "No such file or directory" in plain, plain

    assert all(p.is_file() for p in host_files), host_files
    bed.delete("pod", "meta", ns)

    def leftovers() -> list[str]:
        return [str(p) for p in host_files if p.exists()] + [
            p.name for p in real_node.cdi_dir.iterdir() if any(u in p.name for u in uids)]

    wait_for("metadata files and specs removed by unprepare", lambda: not leftovers(), 60)


CUDA_CHECK = r"""
echo ---smi---; /usr/bin/nvidia-smi; echo "smi-rc=$?"
echo ---libs---; ls -l /usr/lib/x86_64-linux-gnu/
echo ---files---
[ -S /run/nvidia-persistenced/socket ] && echo "socket /run/nvidia-persistenced/socket"
for f in /usr/bin/nvidia-* /lib/firmware/nvidia/*/*; do [ -f "$f" ] && echo "file $f"; done
echo ---ldcache---
if [ -f /etc/ld.so.cache ]; then strings /etc/ld.so.cache | grep '^/' | sort -u; else echo none; fi
echo ---end---
trap 'exit 0' TERM; sleep 86400 & wait
"""


def wait_driver_slices(bed: Bed, node: Any, version: str, what: str) -> None:
    """Until every device the node publishes reports this driver version (the other backend's gone)."""
    seen: list[str] = []

    def probe() -> bool:
        devices = [d for s in bed.get("resourceslices", selector=f"spec.nodeName={node.node_name}")["items"]
                   for d in s["spec"].get("devices", [])]
        seen[:] = sorted({str(attr(d, "driverVersion")) for d in devices})
        return seen == [version]

    try:
        wait_for(what, probe, 90)
    except AssertionError as exc:
        log = (node.logs / "plugin.log").read_text(errors="replace").splitlines()[-30:]
        raise AssertionError(f"{what}: driver versions published {seen}; plugin log:\n" + "\n".join(log)) from exc


def section(logs: str, name: str) -> list[str]:
    return logs.split(f"---{name}---", 1)[1].split("---", 1)[0].strip().splitlines()


def test_real_cuda_ready_container_from_the_toolkits_edits(bed: Bed, ns: str, real_node: Any) -> None:
    """The plugin on the NVML backend (the mock DGX H100 in a fake driver root laid out like a real
    570.172.08 install, the pinned NVIDIA Container Toolkit): through our CDI spec alone the container
    has the driver's libraries, binaries, firmware and persistenced socket at their container paths,
    the symlinks nvidia-cdi-hook created, the ld.so.cache it updated, and runs the root's nvidia-smi,
    which prints the UUID of the GPU the claim got."""
    from dra_driver.node.describe.devices import to_semver
    from e2e.testbed import fakedriver
    from e2e.testbed.realnode import NvmlDriver

    nvml = NvmlDriver.make(real_node.root / "nvml")
    real_node.procs.stop("plugin")
    try:
        real_node.start_plugin(nvml)
        wait_driver_slices(bed, real_node, to_semver(fakedriver.VERSION), "the real node's slices from the mock NVML")
        docs = on_real_node([
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "cuda"},
             "spec": {"spec": {"devices": {"requests": [
                 {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpu.dra-driver.io"}}]}}}},
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cuda"},
             "spec": {"terminationGracePeriodSeconds": 5,
                      "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "cuda"}],
                      "containers": [{"name": "ctr0", "image": "busybox:1.36", "command": ["sh", "-c", CUDA_CHECK],
                                      "resources": {"claims": [{"name": "gpu"}]}}]}},
        ], real_node)
        bed.apply(docs, ns=ns)
        wait_running(bed, ns, "cuda", timeout=180)
        claim = claim_of(bed, ns, "cuda", "gpu")
        (device,) = allocated(bed, claim)
        spec = json.loads((real_node.cdi_dir / f"k8s.{node_driver()}-claim_{claim['metadata']['uid']}.json").read_text())
        edits = spec["containerEdits"]
        lib = "/usr/lib/x86_64-linux-gnu"
        version = fakedriver.VERSION
        mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
        assert mounts[f"{lib}/libcuda.so.{version}"] == str(nvml.driver_root / f"usr/lib/x86_64-linux-gnu/libcuda.so.{version}")
        assert mounts["/usr/bin/nvidia-smi"] == str(nvml.driver_root / "usr/bin/nvidia-smi")
        assert {h["path"] for h in edits["hooks"]} == {str(nvml.toolkit_bin / "nvidia-cdi-hook")}

        logs = output_until_end(bed, real_node, ns, "cuda", "ctr0")
        assert section(logs, "smi") == [f"GPU 0: NVIDIA fake GPU (UUID: {attr(device, 'uuid')})", "smi-rc=0"], logs
        listing = {line.split()[-1] if "->" not in line else line.split()[-3]: line for line in section(logs, "libs")[1:]}
        for name in ("libnvidia-ml", *fakedriver.LIBRARIES):
            assert f"{name}.so.{version}" in listing, f"{name} not mounted:\n{logs}"
        # Links the create-symlinks hook made (the toolkit's: libcuda.so, libnvidia-ml.so.1).
        assert listing["libcuda.so"].startswith("l") and listing["libcuda.so"].endswith("-> libcuda.so.1"), logs
        assert listing["libnvidia-ml.so.1"].endswith(f"-> libnvidia-ml.so.{version}"), logs
        # update-ldcache ran the host's ldconfig on the container: the one real ELF library (the
        # mock libnvidia-ml) is in the cache; the empty stand-ins are not ELF, so ldconfig skips them.
        assert section(logs, "ldcache") == [f"{lib}/libnvidia-ml.so.1"], logs
        files = {f"file /usr/bin/{name}" for name in fakedriver.BINARIES}
        files |= {f"file /lib/firmware/nvidia/{version}/{name}" for name in fakedriver.FIRMWARE}
        assert set(section(logs, "files")) == files | {"socket /run/nvidia-persistenced/socket"}, logs
    finally:
        bed.delete("pod", "cuda", ns)
        wait_for("the cuda pod gone", lambda: bed.kubectl("get", "pod", "cuda", "-n", ns, check=False).returncode != 0, 90)
        real_node.procs.stop("plugin")
        real_node.start_plugin()
        wait_driver_slices(bed, real_node, "580.95.5", "the real node's simulated slices back")  # h100-8x, as a semver
