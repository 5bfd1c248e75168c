"""Resolution throughput: our engine against the kube-scheduler, same workload, same run.

Cluster: ``NODES`` Node objects (no kubelet) with ``GPUS`` GPUs each published as ResourceSlices
under a fake driver (``bench.dra-driver.io``, one pool and one slice per node: the slices our plugin
publishes for a simulated node, :func:`e2e.generators.fleet.plugin_slices`, H100, A100, L4 and T4
in turn), a DeviceClass selecting that driver, and pods each with a 1-GPU claim from a
ResourceClaimTemplate.

* engine: :func:`dra_driver.allocator.resolve.resolve` for one claim after another over an inventory built
  from the same slices, every allocation counting as used for the next claim.
* scheduler: the pods are created in parallel; the clock runs from the first create until the
  last pod has ``spec.nodeName`` (seen on a watch). That includes what a real cluster does for
  each pod: the claim controller creating the claim, the scheduler allocating it and binding.

The default workload is 1,000 one-GPU claims on 800 GPUs (100 nodes x 8): both sides must fill
every GPU and turn the other 200 claims down. For the engine that is 800 allocations and 200
explanations; for the scheduler, 800 bound pods and 200 pods marked ``PodScheduled=False``
(``Unschedulable``). The clock stops when that state is first seen. The last claims are the
hardest for both sides (every full node is tried). Pods tolerate every taint, because nodes
without a kubelet soon become NotReady/unreachable.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from dra_driver.allocator.inventory import AllocatedState, build_inventory
from dra_driver.allocator.resolve import resolve
from dra_driver.k8s.client import CLAIM_TEMPLATES, DEVICE_CLASSES, PODS, SLICES, ApiError
from e2e.bench.common import Result
from e2e.bench.sharedbed import NODES, BenchBed, parallel
from e2e.generators import fleet
from e2e.tooling import binaries

FAKE_DRIVER = "bench.dra-driver.io"
CLASS = "bench-gpu"
NAMESPACE = "bench-sched"
TEMPLATE = "one-gpu"
NODE_COUNT = 100
GPUS = fleet.GPUS_PER_NODE
CLAIMS = 1000

DEVICE_CLASS = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": CLASS},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{FAKE_DRIVER}"'}}]},
}
CLAIM_SPEC = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS, "count": 1}}]}}


def _node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}}}


def _node_status(obj: dict[str, Any]) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    obj["status"] = {
        "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
        "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench node",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}],
    }
    return obj


def _create(bed: BenchBed, res: Any, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    try:
        return bed.api.create(res, body, namespace=namespace)
    except ApiError as exc:
        if exc.status != 409:
            raise
        return bed.api.get(res, body["metadata"]["name"], namespace=namespace)


def ensure_cluster(bed: BenchBed) -> list[dict[str, Any]]:
    """The Node objects, slices and DeviceClass (once per bed); returns the slices as published."""
    cached: list[dict[str, Any]] | None = getattr(bed, "_resolution_slices", None)
    if cached is not None:
        return cached
    slices = fleet.plugin_slices(NODE_COUNT, driver=FAKE_DRIVER)
    names = [s["spec"]["nodeName"] for s in slices]

    def node(name: str) -> None:
        obj = _create(bed, NODES, _node(name))
        for _ in range(20):  # the node controllers edit a new Node too (taints): retry on conflict
            try:
                bed.api.replace_status(NODES, _node_status(obj))
                return
            except ApiError as exc:
                if exc.status != 409:
                    raise
                obj = bed.api.get(NODES, name)
        raise RuntimeError(f"could not set the status of node {name}")

    parallel(node, names)
    parallel(lambda s: _create(bed, SLICES, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", **s}), slices)
    _create(bed, DEVICE_CLASSES, DEVICE_CLASS)
    bed._resolution_slices = slices  # type: ignore[attr-defined]
    return slices


def engine_run(slices: list[dict[str, Any]], claims: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    inventory = build_inventory(slices)
    t1 = time.perf_counter()
    allocated = AllocatedState()
    allocated_count = refused = 0
    per_claim = []
    for i in range(claims):
        claim = {"metadata": {"name": f"c-{i}", "namespace": NAMESPACE, "uid": f"uid-{i}"}, "spec": CLAIM_SPEC}
        s = time.perf_counter()
        res = resolve(claim, inventory, [DEVICE_CLASS], allocated)
        per_claim.append(time.perf_counter() - s)
        if res.allocation is None:
            if not res.explanation:
                raise RuntimeError(f"engine refused claim {i} without an explanation")
            refused += 1
            continue
        for r in res.allocation["devices"]["results"]:
            allocated.devices.add((r["driver"], r["pool"], r["device"]))
        allocated_count += 1
    t2 = time.perf_counter()
    if allocated_count != min(claims, NODE_COUNT * GPUS):
        raise RuntimeError(f"engine allocated {allocated_count} of {claims} claims on {NODE_COUNT * GPUS} GPUs")
    return {"inventory_s": t1 - t0, "resolve_s": t2 - t1, "total_s": t2 - t0, "claims": claims,
            "allocated": allocated_count, "refused": refused,
            "first_claim_ms": per_claim[0] * 1000, "last_claim_ms": per_claim[-1] * 1000,
            "claims_per_s": claims / (t2 - t0)}


def _unschedulable(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               for c in (pod.get("status") or {}).get("conditions") or [])  # fmt: skip


class _AnswerWatcher:
    """Follows every pod of the namespace until ``fit`` are bound and all others are unschedulable."""

    def __init__(self, bed: BenchBed, expected: int, fit: int) -> None:
        self.bed = bed
        self.expected, self.fit = expected, fit
        self.bound: dict[str, float] = {}
        self.unschedulable: set[str] = set()
        self.finished = 0.0
        self.done = threading.Event()
        self.error: BaseException | None = None
        rv = bed.api.list(PODS, namespace=NAMESPACE).resource_version
        self.thread = threading.Thread(target=self._run, args=(rv,), daemon=True, name="answer-watch")
        self.thread.start()

    def _run(self, rv: str) -> None:
        try:
            while not self.done.is_set():
                for event in self.bed.api.watch(PODS, resource_version=rv, timeout_seconds=600):
                    obj = event.get("object") or {}
                    md = obj.get("metadata") or {}
                    rv = str(md.get("resourceVersion") or rv)
                    if md.get("namespace") != NAMESPACE or event.get("type") == "BOOKMARK":
                        continue
                    name = md["name"]
                    if (obj.get("spec") or {}).get("nodeName"):
                        self.bound.setdefault(name, time.monotonic())
                        self.unschedulable.discard(name)
                    elif _unschedulable(obj):
                        self.unschedulable.add(name)
                    if len(self.bound) == self.fit and len(self.bound) + len(self.unschedulable) == self.expected:
                        self.finished = time.monotonic()
                        self.done.set()
                        return
        except BaseException as exc:
            self.error = exc
            self.done.set()


def _pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"pod-{i}", "namespace": NAMESPACE},
        "spec": {
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}],
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
        },
    }  # fmt: skip


def scheduler_run(bed: BenchBed, pods: int, timeout: float = 900) -> dict[str, Any]:
    bed.namespace(NAMESPACE)
    _create(bed, CLAIM_TEMPLATES, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                                   "metadata": {"name": TEMPLATE, "namespace": NAMESPACE}, "spec": {"spec": CLAIM_SPEC}},
            namespace=NAMESPACE)
    fit = min(pods, NODE_COUNT * GPUS)
    watcher = _AnswerWatcher(bed, pods, fit)
    t0 = time.monotonic()
    parallel(lambda i: bed.api.create(PODS, _pod(i), namespace=NAMESPACE), range(pods), workers=8)
    created = time.monotonic()
    if not watcher.done.wait(timeout):
        raise TimeoutError(f"after {timeout:.0f}s only {len(watcher.bound)} of {pods} pods bound "
                           f"and {len(watcher.unschedulable)} unschedulable (want {fit} bound)")
    if watcher.error is not None:
        raise RuntimeError(f"watching pods failed: {watcher.error}")
    times = sorted(t - t0 for t in watcher.bound.values())
    answered = watcher.finished - t0
    return {"pods": pods, "bound": len(times), "unschedulable": len(watcher.unschedulable),
            "create_s": created - t0, "all_answered_s": answered, "last_bound_s": times[-1],
            "first_bound_s": times[0], "half_bound_s": times[len(times) // 2], "pods_per_s": pods / answered}


def run(bed: BenchBed, quick: bool) -> Result:
    pods = 200 if quick else CLAIMS
    result = Result("resolution", "Resolution throughput", {
        "nodes": NODE_COUNT, "gpus_per_node": GPUS, "claims": pods, "driver": FAKE_DRIVER,
        "claim": "1 GPU via a DeviceClass selecting the driver (CEL)",
        "slices": "the plugin's for a simulated node (e2e/generators/fleet.py), H100, A100, L4 and T4 in turn",
        "scheduler": f"kube-scheduler {binaries.kubernetes_version()} on the bed",
    })
    t0 = time.monotonic()
    slices = ensure_cluster(bed)
    result.figures["setup_s"] = round(time.monotonic() - t0, 1)
    sched = scheduler_run(bed, pods)
    eng = engine_run(slices, pods)
    ratio = eng["claims_per_s"] / sched["pods_per_s"]
    result.figures.update({
        "engine": {k: round(v, 4) if isinstance(v, float) else v for k, v in eng.items()},
        "scheduler": {k: round(v, 3) if isinstance(v, float) else v for k, v in sched.items()},
        "ratio_engine_over_scheduler": round(ratio, 2),
        "headline": {"engine": f"{eng['claims_per_s']:.0f} claims/s", "scheduler": f"{sched['pods_per_s']:.1f} pods/s"},
    })
    result.target(f"engine claims/s ÷ scheduler pods/s ({pods} claims, {sched['bound']} fit)", ratio, 1, "x",
                  higher_is_better=True)
    result.notes.append(
        f"engine {eng['claims_per_s']:.0f} claims/s ({eng['allocated']} allocated, {eng['refused']} explained as "
        f"unsatisfiable, {eng['total_s']:.2f} s incl. inventory {eng['inventory_s'] * 1000:.0f} ms); "
        f"scheduler {sched['pods_per_s']:.1f} pods/s ({sched['bound']} bound, {sched['unschedulable']} unschedulable, "
        f"all answered {sched['all_answered_s']:.1f} s after the first create; creating the pods took "
        f"{sched['create_s']:.1f} s). The scheduler's time includes the API work a real cluster does per pod "
        "(claim from template, allocation write, binding); the engine's does not."
    )
    return result
