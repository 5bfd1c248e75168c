"""Memory per object in the controller's informer stores, before and after its projections.

``python -m e2e.bench.storemem [N]`` lists N realistic objects of each kind through the real client
(``RestKubeApi`` against a loopback server serving the JSON list in pages of 500) into an informer's
store, once as the store kept them before (whole) and once with the controller's transforms
(:mod:`dra_driver.controller.views`), and prints the bytes each object leaves allocated
(``tracemalloc``: what stays after the list, transient decoding excluded). The 5,000-node and
150,000-pod figures are these slopes times the counts.

The objects are what a GPU cluster holds: pods of a training Job as the API server returns them
(managedFields of three managers, a projected token volume, status with conditions), claims
generated from a template and allocated by the scheduler, and ResourceSlices made by the node
plugin's own code from the ``h100-8x`` profile (8 GPUs, 12 attributes each; with dynamic MIG, 152
devices in four slices).
"""

from __future__ import annotations

import functools
import gc
import sys
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from dra_driver.controller.annotations import desired_annotations
from dra_driver.controller.verdicts import Outcome, Verdict
from dra_driver.controller.views import claim_view, pod_view, slice_view
from dra_driver.k8s.client import CLAIMS, PODS, SLICES, Resource, RestKubeApi
from dra_driver.k8s.credentials import Connection, Credentials
from dra_driver.k8s.informer import Informer, Transform
from dra_driver.k8s.objects import Obj
from dra_driver.node.describe.devices import describe, enumerate_devices
from dra_driver.node.discovery.simulated import NodeProfile, SimulatedBackend, load_profile
from dra_driver.node.publish.slices import split_into_slices

DRIVER = "gpu.dra-driver.io"
TS = "2026-11-25T10:00:00Z"
PAGE = 500


def _managed(manager: str, sub: str | None = None) -> Obj:
    entry: Obj = {"manager": manager, "operation": "Update", "apiVersion": "v1", "time": TS, "fieldsType": "FieldsV1",
                  "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                               "f:spec": {"f:containers": {'k:{"name":"main"}': {".": {}, "f:image": {}, "f:name": {}}}}}}
    if sub:
        entry["subresource"] = sub
    return entry


def job_pod(i: int, claim: str | None = None) -> Obj:
    """Pod ``i`` of a training Job, running; with ``claim`` it holds that (template-generated) claim."""
    name, job = f"job-{i:06d}-abcde", f"job-{i:06d}"
    uid = f"0a1b2c3d-{i:08d}-4e5f-8a9b-0c1d2e3f4a5b"
    pod: Obj = {
        "metadata": {
            "name": name, "generateName": f"{job}-", "namespace": f"team-{i % 50}", "uid": uid,
            "resourceVersion": str(100000 + i), "creationTimestamp": TS,
            "labels": {"app": "trainer", "batch.kubernetes.io/job-name": job, "controller-uid": f"1111-{i:08d}",
                       "job-name": job},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": f"2222-{i:08d}",
                                 "controller": True, "blockOwnerDeletion": True}],
            "managedFields": [_managed("kube-controller-manager"), _managed("kube-scheduler", "status"),
                              _managed("kubelet", "status")],
        },
        "spec": {
            "volumes": [{"name": "kube-api-access-abcde", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace",
                                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}],
            "containers": [{
                "name": "main", "image": "registry.example.com/ml/trainer:v1.2.3", "command": ["python", "-m", "train"],
                "args": ["--epochs", "10"], "env": [{"name": "RANK", "value": "0"}, {"name": "WORLD_SIZE", "value": "8"}],
                "resources": {"limits": {"cpu": "8", "memory": "64Gi"}, "requests": {"cpu": "8", "memory": "64Gi"}},
                "volumeMounts": [{"name": "kube-api-access-abcde", "readOnly": True,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent"}],
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "serviceAccount": "default", "nodeName": f"node-{i % 5000:04d}",
            "securityContext": {}, "schedulerName": "default-scheduler", "priority": 0, "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
            "tolerations": [{"key": f"node.kubernetes.io/{t}", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300} for t in ("not-ready", "unreachable")],
        },
        "status": {
            "phase": "Running", "hostIP": "10.0.1.2", "hostIPs": [{"ip": "10.0.1.2"}], "podIP": "10.244.1.2",
            "podIPs": [{"ip": "10.244.1.2"}], "startTime": TS, "qosClass": "Guaranteed",
            "conditions": [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": TS}
                           for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")],
            "containerStatuses": [{
                "name": "main", "state": {"running": {"startedAt": TS}}, "lastState": {}, "ready": True, "restartCount": 0,
                "image": "registry.example.com/ml/trainer:v1.2.3", "started": True,
                "imageID": "registry.example.com/ml/trainer@sha256:" + "ab" * 32, "containerID": "containerd://" + "cd" * 32}],
        },
    }  # fmt: skip
    if claim is not None:
        pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
        pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim}]
    return pod


def job_claim(i: int, *, allocated: bool = True) -> Obj:
    """The claim generated for :func:`job_pod` ``i``; allocated by the scheduler and reserved, or pending."""
    pod, node = f"job-{i:06d}-abcde", f"node-{i % 5000:04d}"
    pod_uid = f"0a1b2c3d-{i:08d}-4e5f-8a9b-0c1d2e3f4a5b"
    claim: Obj = {
        "metadata": {
            "name": f"{pod}-gpu-xyz12", "generateName": f"{pod}-gpu-", "namespace": f"team-{i % 50}",
            "uid": f"3333-{i:08d}-4e5f-8a9b-0c1d2e3f4a5b", "resourceVersion": str(200000 + i), "creationTimestamp": TS,
            "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": pod_uid, "controller": True,
                                 "blockOwnerDeletion": True}],
            "managedFields": [_managed("kube-controller-manager"), _managed("kube-scheduler", "status")],
        },
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 1}}]}},
        "status": {},
    }  # fmt: skip
    if allocated:
        claim["status"] = {
            "allocation": {
                "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": node,
                                         "device": f"gpu-{i // 5000 % 8}"}]},  # one claim per GPU up to 40,000
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
                "allocationTimestamp": TS,
            },
            "reservedFor": [{"resource": "pods", "name": pod, "uid": pod_uid}],
        }  # fmt: skip
    return claim


def explained_claim(i: int) -> Obj:
    """A pending claim with the controller's explanation on it: a document of 16 KiB (the limit is 32)."""
    claim = job_claim(i, allocated=False)
    outcome = Outcome(verdict=Verdict.UNSATISFIABLE, summary="cannot allocate: request gpu: 0 candidates, need 1",
                      explanation={"closest": [f"{DRIVER}/node-{n:04d}/gpu-0: memory 80Gi < 1Ti" for n in range(320)]})
    claim["metadata"]["annotations"].update(desired_annotations(outcome) or {})
    return claim


def plugin_slice(n: int, profile: str = "h100-8x") -> Obj:
    """The ResourceSlice the node plugin publishes for node ``n`` with ``profile`` (one slice, all GPUs)."""
    node = f"node-{n:04d}"
    devices, _ = describe(enumerate_devices(SimulatedBackend(_profile(profile), node).discover(), False), DRIVER, False)
    name = f"00000-{DRIVER}-{node}-"
    return {
        "metadata": {"name": f"{name}x7k2p", "generateName": name, "uid": f"4444-{n:08d}",
                     "resourceVersion": str(300000 + n), "generation": 1, "creationTimestamp": TS,
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": f"5555-{n:08d}",
                                          "controller": True}],
                     "managedFields": [_managed(DRIVER)]},
        "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices},
    }  # fmt: skip


def gpu_node(n: int) -> Obj:
    """The Node ``n`` (of :func:`plugin_slice`) as a GPU node's kubelet reports it, less its images."""
    node = f"node-{n:04d}"
    labels = {"kubernetes.io/hostname": node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "node.kubernetes.io/instance-type": "p5.48xlarge", "topology.kubernetes.io/zone": f"zone-{n % 3}",
              "nvidia.com/gpu.present": "true"}
    conditions = [{"type": t, "status": "False" if t != "Ready" else "True", "reason": f"Kubelet{t}",
                   "message": f"kubelet reports {t}", "lastHeartbeatTime": TS, "lastTransitionTime": TS}
                  for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")]
    capacity = {"cpu": "192", "memory": "2097152Mi", "pods": "110", "ephemeral-storage": "3840Gi"}
    return {
        "metadata": {"name": node, "uid": f"5555-{n:08d}", "resourceVersion": str(200000 + n), "labels": labels,
                     "creationTimestamp": TS, "managedFields": [_managed("kubelet"), _managed("kubelet", "status")]},
        "spec": {"providerID": f"aws:///zone-{n % 3}/i-{n:017x}", "podCIDR": f"10.{n // 256 % 256}.{n % 256}.0/24"},
        "status": {"capacity": capacity, "allocatable": capacity, "conditions": conditions,
                   "addresses": [{"type": "InternalIP", "address": f"10.1.{n // 256 % 256}.{n % 256}"},
                                 {"type": "Hostname", "address": node}],
                   "nodeInfo": {"kubeletVersion": "v1.37.2", "containerRuntimeVersion": "containerd://2.1.4",
                                "kernelVersion": "6.8.0", "osImage": "Ubuntu 24.04", "architecture": "amd64"}},
    }  # fmt: skip


def mig_slice(n: int, profile: str = "h100-8x") -> Obj:
    """The busiest of the slices the node plugin publishes for node ``n`` with dynamic MIG: 64 devices
    (GPUs and MIG placements) that consume counters. Such a node has four slices: the counter sets,
    64, 64 and 24 devices."""
    node = f"node-{n:04d}"
    gpus = SimulatedBackend(_profile(profile), node).discover()
    devices, counters = describe(enumerate_devices(gpus, True), DRIVER, True)
    content = split_into_slices(devices, counters)[1]
    name = f"00001-{DRIVER}-{node}-"
    return {
        "metadata": {"name": f"{name}x7k2p", "generateName": name, "uid": f"6666-{n:08d}",
                     "resourceVersion": str(400000 + n), "generation": 1, "creationTimestamp": TS,
                     "managedFields": [_managed(DRIVER)]},
        "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 4},
                 "devices": content.devices},
    }  # fmt: skip


@functools.cache
def _profile(name: str) -> NodeProfile:
    return load_profile(name)


# --------------------------------------------------------------------------------------------


def _pages(items: list[Obj]) -> dict[str, bytes]:
    """The list as the API server pages it: continue token -> body."""
    out: dict[str, bytes] = {}
    for start in range(0, max(len(items), 1), PAGE):
        nxt = start + PAGE
        md: Obj = {"resourceVersion": "7"}
        if nxt < len(items):
            md["continue"] = str(nxt)
        out[str(start) if start else ""] = orjson.dumps({"metadata": md, "items": items[start:nxt]})
    return out


@contextmanager
def serving(pages: dict[str, bytes]) -> Iterator[RestKubeApi]:
    """A loopback API server answering list requests from ``pages``, and a client for it."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            body = pages[parse_qs(urlsplit(self.path).query).get("continue", [""])[0]]
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    host = f"http://127.0.0.1:{httpd.server_address[1]}"
    loaded = Connection(host=host, ca_file=None, verify_ssl=False, tls_server_name=None, proxy_url=None, cert_file=None,
                        key_file=None, authorization=lambda: None)
    api = RestKubeApi(Credentials(lambda: loaded, "loopback"))
    try:
        yield api
    finally:
        api.close()
        httpd.shutdown()
        httpd.server_close()


def retained_bytes(resource: Resource, items: list[Obj], transform: Transform | None) -> tuple[float, int]:
    """(bytes per object left allocated, objects kept) after an informer lists ``items``."""
    pages = _pages(items)
    with serving(pages) as api:
        informer = Informer(api, resource, transform=transform)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            informer.relist()
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        return (after - before) / len(items), len(informer.store)


KINDS: dict[str, tuple[Resource, Callable[[int], Obj], Callable[[], Transform]]] = {
    "pod, no claim": (PODS, job_pod, lambda: pod_view),
    "pod with a claim": (PODS, lambda i: job_pod(i, claim=f"job-{i:06d}-abcde-gpu-xyz12"), lambda: pod_view),
    "claim, allocated": (CLAIMS, job_claim, lambda: claim_view),
    "claim, pending": (CLAIMS, lambda i: job_claim(i, allocated=False), lambda: claim_view),
    "claim, explained": (CLAIMS, explained_claim, lambda: claim_view),
    "slice, 8 GPUs": (SLICES, plugin_slice, slice_view),
    "slice, 64 MIG": (SLICES, mig_slice, slice_view),
}


def measure(n: int = 1000) -> dict[str, dict[str, float]]:
    """Bytes per object of every kind, whole and as the controller keeps it."""
    out: dict[str, dict[str, float]] = {}
    for name, (resource, make, transform) in KINDS.items():
        items = [make(i) for i in range(n)]
        whole, _ = retained_bytes(resource, items, None)
        kept, count = retained_bytes(resource, items, transform())
        out[name] = {"json_bytes": len(orjson.dumps(items)) / n, "whole": whole, "kept": kept, "kept_objects": count}
    return out


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 1000
    print(f"{'object':18s} {'JSON':>8s} {'before':>9s} {'after':>9s}  (bytes per object, {n} objects)")
    for name, row in measure(n).items():
        print(f"{name:18s} {row['json_bytes']:8.0f} {row['whole']:9.0f} {row['kept']:9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
