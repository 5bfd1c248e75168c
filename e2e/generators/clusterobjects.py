"""Objects of a GPU cluster as the API server returns them, for the benchmarks and the unit tests.

Pods of a training Job (managedFields of three managers, a projected token volume, status with
conditions), the claims generated for them from a template and allocated by the scheduler (or
pending, or explained by the controller), GPU Nodes as their kubelet reports them, and the
ResourceSlices the node plugin publishes for them, made by the plugin's own path
(:func:`e2e.generators.fleet.published_slices`) from the ``h100-8x`` profile (8 GPUs, 12 attributes
each; with dynamic MIG, 152 devices in four slices). Node ``n`` is ``node-NNNN``; the objects of one
index agree with each other (the claim of pod ``i`` is allocated on its node).
"""

from __future__ import annotations

import functools

from dra_driver.controller.annotations import desired_annotations
from dra_driver.controller.verdicts import Outcome, Verdict
from dra_driver.k8s.objects import Obj
from dra_driver.node.discovery.simulated import NodeProfile, load_profile
from e2e.generators.fleet import published_slices

DRIVER = "gpu.dra-driver.io"
TS = "2026-11-25T10:00:00Z"


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
    claim["metadata"]["annotations"].update(desired_annotations(outcome, DRIVER) or {})
    return claim


def plugin_slice(n: int, profile: str = "h100-8x") -> Obj:
    """The ResourceSlice the node plugin publishes for node ``n`` with ``profile`` (one slice, all GPUs),
    as the API server returns it."""
    node = f"node-{n:04d}"
    (published,) = published_slices(_profile(profile), node, driver=DRIVER)
    name = published["metadata"]["generateName"]
    return {
        "metadata": {"name": f"{name}x7k2p", "generateName": name, "uid": f"4444-{n:08d}",
                     "resourceVersion": str(300000 + n), "generation": 1, "creationTimestamp": TS,
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": f"5555-{n:08d}",
                                          "controller": True}],
                     "managedFields": [_managed(DRIVER)]},
        "spec": published["spec"],
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
    published = published_slices(_profile(profile), node, driver=DRIVER, dynamic_mig=True)[1]
    name = published["metadata"]["generateName"]
    return {
        "metadata": {"name": f"{name}x7k2p", "generateName": name, "uid": f"6666-{n:08d}",
                     "resourceVersion": str(400000 + n), "generation": 1, "creationTimestamp": TS,
                     "managedFields": [_managed(DRIVER)]},
        "spec": published["spec"],
    }  # fmt: skip


@functools.cache
def _profile(name: str) -> NodeProfile:
    return load_profile(name)
