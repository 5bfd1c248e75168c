"""The scale bench's cluster and our controller in it (``e2e/bench/scale/curve.py`` measures with these).

The bed's control plane with API Priority and Fairness on and kwok keeping the Nodes Ready, the
fleet's ResourceSlices, the workload's claims and pods, watches that note when objects reach a
state, and ``dra-driver controller`` processes started as production starts them.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dra_driver.controller.keys import OUR_ANNOTATIONS
from dra_driver.k8s import client as kube
from dra_driver.k8s.client import (
    CLAIM_TEMPLATES,
    CLAIMS,
    DEVICE_CLASSES,
    EVENTS,
    NODES,
    PODS,
    SLICES,
    ApiError,
    Obj,
    Resource,
)
from e2e.bench.common import REPO
from e2e.bench.scale.rows import HistogramReading, histogram
from e2e.bench.sharedbed import parallel
from e2e.generators import fleet
from e2e.testbed import kwok as kwok_mod
from e2e.testbed.cluster import Cluster, die_with_parent, free_port, stop_process
from e2e.tooling import bytecode

DRIVER = fleet.DRIVER
CONTROLLER_USER = "scale-bench-controller"
NO_SCHEDULER = "scale-bench-none"
"""Pods naming this scheduler are never scheduled: their claims stay pending for our controller alone."""
WARM_UP_ENDS = ("warm-up over", "cannot build the device inventory yet")
"""The controller's log events that end its warm-up (``EngineInputs.warm_up`` in dra_driver.controller.engine_inputs)."""
EXPLANATION = f"{DRIVER}/explanation"
RESOLVE_HISTOGRAM = "dra_driver_controller_resolve_duration_seconds"
QUEUE_DEPTH = "dra_driver_controller_workqueue_depth"
DEVICECLASSES = REPO / "deploy" / "deviceclasses"
FLOWSCHEMAS = Resource("flowcontrol.apiserver.k8s.io", "v1", "flowschemas", "FlowSchema", namespaced=False)
PRIORITY_LEVELS = Resource("flowcontrol.apiserver.k8s.io", "v1", "prioritylevelconfigurations",
                           "PriorityLevelConfiguration", namespaced=False)
CLUSTER_ROLE_BINDINGS = Resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding",
                                 namespaced=False)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
APF_NAME = "scale-bench-controller"

# The bed's control plane with client limits a 5,000-node cluster is run with (the defaults, 20
# and 50 QPS, would measure the client throttle, not the scheduler), and APF on.
APISERVER_ARGS = ("--enable-priority-and-fairness=true",)
CONTROL_PLANE_QPS = ("--kube-api-qps=1000", "--kube-api-burst=2000")


# =========================================================================== workload shapes

def _request(cls: str, selector: str | None = None, count: int = 1) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


GPU_CLASS = f"gpu.{DRIVER}"
MIG_CLASS = f"mig.{DRIVER}"
FIT_SHAPES = {
    "any-gpu": _request(GPU_CLASS),
    "h100": _request(GPU_CLASS, f'device.attributes["{DRIVER}"].productName.startsWith("NVIDIA H100")'),
    "mem-40gi": _request(GPU_CLASS, f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0'),
    "mig-1g": _request(MIG_CLASS, f'device.attributes["{DRIVER}"].profile.startsWith("1g.")'),
}
UNSAT_SHAPES = {
    "memory-1ti": _request(GPU_CLASS, f'device.capacity["{DRIVER}"].memory.compareTo(quantity("1Ti")) >= 0'),
    "no-such-model": _request(GPU_CLASS, f'device.attributes["{DRIVER}"].productName == "NVIDIA B300"'),
    "nine-gpus": _request(GPU_CLASS, count=9),
}


def cold_shape(token: int) -> dict[str, Any]:
    """An unsatisfiable request whose selector is a text no claim has had (``token`` makes the
    literal new: a memory just above 1 TiB, to the MiB): what a person's first ``explain`` of a new
    template asks, and what the controller meets when that template's first claim arrives."""
    quantity = f"{2**20 + token}Mi"
    return _request(GPU_CLASS, f'device.capacity["{DRIVER}"].memory.compareTo(quantity("{quantity}")) >= 0')


def claim_body(name: str, spec: dict[str, Any]) -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec}


def pod_body(name: str, *, claim: str | None = None, template: str | None = None, node: str | None = None,
             scheduler: str | None = None) -> Obj:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        # kwok's nodes carry no taints, but a node whose Lease lapses under load would: stay put.
        "tolerations": [{"operator": "Exists"}],
        "terminationGracePeriodSeconds": 0,
    }
    if claim or template:
        ref = {"name": "gpu", **({"resourceClaimName": claim} if claim else {"resourceClaimTemplateName": template})}
        spec["resourceClaims"] = [ref]
        spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    if node:
        spec["nodeName"] = node
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


# =========================================================================== API plumbing

RETRY_STATUS = frozenset({0, 429, 500, 502, 503, 504})


def _retrying(call: Callable[[], Any], attempts: int = 8) -> Any:
    for attempt in range(attempts):
        try:
            return call()
        except ApiError as exc:
            if exc.status not in RETRY_STATUS or attempt == attempts - 1:
                raise
            time.sleep(min(0.1 * 2 ** attempt, 5.0))
    raise AssertionError("unreachable")  # pragma: no cover


def create(api: kube.RestKubeApi, res: Resource, body: Obj, namespace: str | None = None) -> Obj:
    """Create, retrying what a busy API server answers; an object already there is fetched instead."""
    try:
        obj: Obj = _retrying(lambda: api.create(res, body, namespace=namespace))
        return obj
    except ApiError as exc:
        if exc.status != 409:
            raise
        got: Obj = _retrying(lambda: api.get(res, body["metadata"]["name"], namespace=namespace))
        return got


def delete(api: kube.RestKubeApi, res: Resource, name: str, namespace: str | None = None) -> None:
    try:
        _retrying(lambda: api.delete(res, name, namespace=namespace))
    except ApiError as exc:
        if not exc.not_found:
            raise


class Tracker:
    """Follows a resource (in one namespace, or all) and notes when each object first satisfies ``pred``."""

    def __init__(self, api: kube.RestKubeApi, res: Resource, namespace: str | None,
                 pred: Callable[[Obj], bool]) -> None:
        self.api, self.res, self.pred = api, res, pred
        self.selector = f"metadata.namespace={namespace}" if namespace else None
        self.hits: dict[str, float] = {}
        self.seen: set[str] = set()
        self.error: BaseException | None = None
        self._cond = threading.Condition()
        self._stop = threading.Event()
        rv = self._list()
        self._thread = threading.Thread(target=self._run, args=(rv,), daemon=True, name=f"track-{res.plural}")
        self._thread.start()

    def _list(self) -> str:
        result = _retrying(lambda: self.api.list(self.res, field_selector=self.selector))
        for obj in result.items:
            self._note(obj)
        return str(result.resource_version)

    def _note(self, obj: Obj) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if not name:
            return
        with self._cond:
            self.seen.add(name)
            if name not in self.hits and self.pred(obj):
                self.hits[name] = time.monotonic()
                self._cond.notify_all()

    def _run(self, rv: str) -> None:
        while not self._stop.is_set():
            try:
                for event in self.api.watch(self.res, resource_version=rv, timeout_seconds=60,
                                            field_selector=self.selector):
                    obj = event.get("object") or {}
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._note(obj)
                    if self._stop.is_set():
                        return
            except ApiError as exc:
                if self._stop.is_set():
                    return
                if not exc.gone:
                    time.sleep(0.5)
                try:
                    rv = self._list()
                except BaseException as err:
                    self.error = err
                    with self._cond:
                        self._cond.notify_all()
                    return

    def count(self) -> int:
        with self._cond:
            return len(self.hits)

    def wait(self, n: int, deadline: float) -> bool:
        """Until ``n`` objects satisfied the predicate, or the monotonic ``deadline``."""
        with self._cond:
            while len(self.hits) < n:
                if self.error is not None:
                    raise RuntimeError(f"watching {self.res.plural} failed: {self.error}")
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 1.0))
            return True

    def stop(self) -> None:
        self._stop.set()


def has_explanation(obj: Obj) -> bool:
    return EXPLANATION in ((obj.get("metadata") or {}).get("annotations") or {})


def events_by_reporter(events: Iterable[Obj]) -> dict[str, dict[str, int]]:
    """Events counted by ``reportingInstance``, then by the kind of object they are about."""
    out: dict[str, dict[str, int]] = {}
    for e in events:
        kinds = out.setdefault(str(e.get("reportingInstance") or ""), {})
        kind = str((e.get("regarding") or {}).get("kind") or "")
        kinds[kind] = kinds.get(kind, 0) + 1
    return out


def is_bound(obj: Obj) -> bool:
    return bool((obj.get("spec") or {}).get("nodeName"))


def is_running(obj: Obj) -> bool:
    return (obj.get("status") or {}).get("phase") == "Running"


# =========================================================================== our controller

@dataclass
class ControllerProcess:
    """``dra-driver controller`` as production runs it, on a free metrics port, logging JSON to a file."""

    kubeconfig: Path
    logs: Path
    label: str
    args: tuple[str, ...] = ()
    """More flags (``--no-pod-events``)."""
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    spawned: float = 0.0

    @property
    def log_path(self) -> Path:
        return self.logs / f"controller-{self.label}.log"

    @property
    def identity(self) -> str:
        """Its identity in the Lease, which is also the ``reportingInstance`` of its Events."""
        return f"scale-bench-{self.label}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        cmd = [*bytecode.shipped_python(), "-m", "dra_driver", "controller", f"--kubeconfig={self.kubeconfig}",
               f"--driver-name={DRIVER}", "--log-format=json", f"--metrics-port={self.port}",
               "--leader-election-namespace=kube-system", f"--leader-election-id=scale-bench-{self.label}",
               f"--identity={self.identity}", *self.args]
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.spawned = time.monotonic()
            self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                         preexec_fn=die_with_parent)

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"controller {self.label} exited with {self.proc.returncode}:\n{tail}")

    def _get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, ""
        except (urllib.error.URLError, OSError):
            return 0, ""

    def wait_synced(self, timeout: float) -> float:
        """Seconds from spawn until ``/healthz`` says every informer synced."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if self._get("/healthz")[0] == 200:
                return time.monotonic() - self.spawned
            time.sleep(0.05)
        raise TimeoutError(f"controller {self.label}: informers not synced {timeout:.0f}s after start")

    def wait_warm(self, timeout: float) -> float:
        """Seconds from spawn until the controller's warm-up ended (the inventory and every
        DeviceClass's grouping built; it logs the end)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if any(f'"event": "{e}"' in line for line in self.log_lines() for e in WARM_UP_ENDS):
                return time.monotonic() - self.spawned
            time.sleep(0.2)
        raise TimeoutError(f"controller {self.label}: warm-up not over {timeout:.0f}s after start")

    def metrics(self) -> str:
        status, text = self._get("/metrics")
        if status != 200:
            self.check_alive()
            raise RuntimeError(f"controller {self.label}: /metrics answered {status}")
        return text

    def resolves(self) -> HistogramReading:
        return histogram(self.metrics(), RESOLVE_HISTOGRAM)

    def memory_mib(self) -> dict[str, float]:
        out = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
        return out

    def reset_peak(self) -> None:
        """Start VmHWM afresh from the current RSS (proc(5): clear_refs, value 5)."""
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")

    def log_lines(self) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []

    def stop(self) -> None:
        stop_process(self.proc, timeout=20)
        self.proc = None


# =========================================================================== the bench cluster

NS_FILL, NS_HELD, NS_PLAIN = "scale-fill", "scale-held", "scale-plain"
NS_PROBE, NS_BACKLOG, NS_APF = "scale-probe", "scale-backlog", "scale-apf"


@dataclass
class ScaleCluster:
    workdir: Path
    mig_per: int
    """One dynamic-MIG node per this many GPU nodes (0: none)."""
    log: Callable[[str], None] = print
    cluster: Cluster = field(init=False)
    kwok: kwok_mod.Kwok = field(init=False)
    api: kube.RestKubeApi = field(init=False)
    gpu_nodes: int = 0
    mig_nodes: int = 0
    node_names: list[str] = field(default_factory=list)
    plain_node_names: list[str] = field(default_factory=list)
    slices: int = 0
    devices: int = 0
    fill_pods: int = 0
    held_claims: int = 0
    writable: list[tuple[str, str, str]] = field(default_factory=list)
    """(node, pool, device) of GPUs the bench may allocate by writing, in order: half of every plain node's."""
    spare: list[tuple[str, str, str]] = field(default_factory=list)
    """The next quarter of every plain node's GPUs: the fleet views' 10,000 more claims at 5,000 nodes."""
    more_claims: int = 0
    plain_pods: int = 0
    controllers: int = 0
    started: list[ControllerProcess] = field(default_factory=list)
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    # -- lifecycle

    def start(self) -> None:
        self.cluster = Cluster(
            workdir=self.workdir / "bed", nodes=(), apiserver_args=APISERVER_ARGS,
            controller_manager_args=(*CONTROL_PLANE_QPS, *kwok_mod.LEASE_GRACE_ARGS),
            scheduler_args=CONTROL_PLANE_QPS, users=(CONTROLLER_USER,))
        t0 = time.monotonic()
        self.cluster.start(progress=self.log)
        self._stack.callback(self.cluster.stop)
        self.api = kube.RestKubeApi(kube.load_credentials(str(self.cluster.kubeconfig)), request_timeout=120.0,
                                    user_agent="dra-driver-scale-bench", pool_size=32)
        self._stack.callback(self.api.close)
        self.kwok = kwok_mod.Kwok(self.cluster.kubeconfig, self.cluster.logs)
        self.kwok.start()
        self._stack.callback(self.kwok.stop)
        create(self.api, CLUSTER_ROLE_BINDINGS, {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": CONTROLLER_USER},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": CONTROLLER_USER}]})
        for path in sorted(DEVICECLASSES.glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    create(self.api, DEVICE_CLASSES, doc)
        for ns in (NS_FILL, NS_HELD, NS_PLAIN, NS_PROBE, NS_BACKLOG, NS_APF):
            self.namespace(ns)
        for name, spec in FIT_SHAPES.items():
            create(self.api, CLAIM_TEMPLATES, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                                               "metadata": {"name": name}, "spec": {"spec": spec}}, NS_FILL)
        self.log(f"scale: bed, kwok and workload objects up in {time.monotonic() - t0:.1f}s")

    def close(self) -> None:
        self._stack.close()

    def namespace(self, name: str) -> None:
        create(self.api, NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        sa = Resource("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.api.get(sa, "default", namespace=name)
                return
            except ApiError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no default ServiceAccount in {name}") from None
                time.sleep(0.2)

    def controller(self, label: str, *args: str) -> ControllerProcess:
        self.controllers += 1
        ctl = ControllerProcess(self.cluster.user_kubeconfig(CONTROLLER_USER), self.cluster.logs,
                                f"{self.controllers:02d}-{label}", args)
        ctl.start()
        self._stack.callback(ctl.stop)
        self.started.append(ctl)
        return ctl

    def stop_controllers(self) -> list[str]:
        """Stops every controller still running (after a size failed, one it had started may be);
        their logs' lines, for the problems."""
        lines: list[str] = []
        for ctl in self.started:
            if ctl.proc is not None:
                ctl.stop()
                lines += ctl.log_lines()
        return lines

    def check_alive(self) -> None:
        self.cluster._check_alive()
        self.kwok.check_alive()

    # -- growing the cluster

    def grow(self, gpu_nodes: int) -> dict[str, Any]:
        """Nodes and slices up to ``gpu_nodes`` GPU nodes (and their dynamic-MIG share), all Ready."""
        mig = gpu_nodes // self.mig_per if self.mig_per else 0
        new_gpu, new_mig = gpu_nodes - self.gpu_nodes, mig - self.mig_nodes
        first = self.gpu_nodes + self.mig_nodes
        t0 = time.monotonic()
        bodies = fleet.plugin_slices(new_gpu + new_mig, mig_nodes=new_mig, first=first)
        names = [fleet.node_name(i) for i in range(first, first + new_gpu + new_mig)]
        mig_names = set(names[:new_mig])
        tracker = Tracker(self.api, NODES, None, kwok_mod.is_ready)
        try:
            uids = dict(zip(names, (str(n["metadata"]["uid"]) for n in parallel(
                lambda name: create(self.api, NODES, kwok_mod.fake_node(name)), names)), strict=True))
            nodes_s = time.monotonic() - t0
            parallel(lambda body: create(self.api, SLICES, fleet.owned_by(body, uids[body["spec"]["nodeName"]])),
                     bodies)
            slices_s = time.monotonic() - t0 - nodes_s
            if not tracker.wait(len(self.node_names) + len(names), time.monotonic() + 120 + len(names) / 20):
                raise TimeoutError(f"kwok made {tracker.count()} of {len(self.node_names) + len(names)} nodes Ready")
        finally:
            tracker.stop()
        self.node_names += names
        self.plain_node_names += [n for n in names if n not in mig_names]
        for body in bodies:
            node = body["spec"]["nodeName"]
            if node not in mig_names:
                pool = body["spec"]["pool"]["name"]
                half = body["spec"]["devices"][: fleet.GPUS_PER_NODE // 2]
                self.writable += [(node, pool, d["name"]) for d in half]
                quarter = body["spec"]["devices"][fleet.GPUS_PER_NODE // 2: fleet.GPUS_PER_NODE * 3 // 4]
                self.spare += [(node, pool, d["name"]) for d in quarter]
        self.gpu_nodes, self.mig_nodes = gpu_nodes, mig
        self.slices += len(bodies)
        self.devices += sum(len(b["spec"].get("devices") or []) for b in bodies)
        took = time.monotonic() - t0
        self.log(f"scale: {len(names)} nodes ({new_mig} dynamic-MIG) and {len(bodies)} slices in {took:.0f}s "
                 f"(nodes {nodes_s:.0f}s, slices {slices_s:.0f}s); now {self.gpu_nodes} GPU + {self.mig_nodes} "
                 f"MIG nodes, {self.devices} devices")
        return {"nodes_added": len(names), "slices_added": len(bodies), "seconds": round(took, 1),
                "node_creates_per_s": round(len(names) / nodes_s, 1) if nodes_s else None,
                "slice_creates_per_s": round(len(bodies) / slices_s, 1) if slices_s else None}

    def fill(self, claims: int, timeout_s: float) -> dict[str, Any]:
        """Pods with a claim from a template each, through the kube-scheduler, up to ``claims`` such
        pods; a RuntimeError when they are not all bound ``timeout_s`` after the first create."""
        names = [f"fill-{i}" for i in range(self.fill_pods, claims)]
        shapes = list(FIT_SHAPES)
        tracker = Tracker(self.api, PODS, NS_FILL, is_bound)
        try:
            before = tracker.count()
            t0 = time.monotonic()
            parallel(lambda i: create(self.api, PODS, pod_body(f"fill-{i}", template=shapes[i % len(shapes)]), NS_FILL),
                     range(self.fill_pods, claims))
            created = time.monotonic() - t0
            done = tracker.wait(claims, t0 + timeout_s)
            bound = tracker.count() - before
            wanted = set(names)
            new_times = sorted(t - t0 for n, t in tracker.hits.items() if n in wanted)
        finally:
            tracker.stop()
        if not done:
            raise RuntimeError(f"the kube-scheduler bound {bound} of {len(names)} pods in {timeout_s:.0f}s; see "
                               f"{self.cluster.logs / 'kube-scheduler.log'}")
        self.fill_pods = claims
        seconds = new_times[-1] if new_times else 0.0
        rate = len(names) / seconds if seconds > 0 else 0.0
        self.log(f"scale: kube-scheduler bound {len(names)} pods in {seconds:.1f}s ({rate:.1f} pods/s; "
                 f"creating them took {created:.1f}s)")
        return {"pods": len(names), "bound_s": round(seconds, 2), "create_s": round(created, 2),
                "pods_per_s": round(rate, 2), "half_bound_s": round(new_times[len(new_times) // 2], 2) if new_times else None}

    def add_plain_pods(self, pods: int) -> dict[str, Any]:
        """Pods that need no claim, bound by name to the GPU nodes in turn; kwok runs them."""
        tracker = Tracker(self.api, PODS, NS_PLAIN, is_running)
        try:
            t0 = time.monotonic()
            nodes = self.plain_node_names
            parallel(lambda i: create(self.api, PODS, pod_body(f"plain-{i}", node=nodes[i % len(nodes)]), NS_PLAIN),
                     range(self.plain_pods, pods))
            running = tracker.wait(pods, time.monotonic() + 60 + pods / 50)
        finally:
            tracker.stop()
        added = pods - self.plain_pods
        self.plain_pods = pods
        took = time.monotonic() - t0
        self.log(f"scale: {added} plain pods in {took:.0f}s ({'all' if running else 'not all'} Running)")
        return {"pods": added, "seconds": round(took, 1), "all_running": running}

    def hold(self, claims: int) -> dict[str, Any]:
        """Claims allocated as the scheduler allocates them, written directly, up to ``claims`` such:
        per claim its pod bound to the device's node, the claim, and its status (allocation and
        reservedFor)."""
        todo = list(range(self.held_claims, claims))
        if len(todo) > len(self.writable) - self.held_claims:
            raise RuntimeError(f"scale: {claims} written claims need more than the {len(self.writable)} writable GPUs")
        t0 = time.monotonic()
        parallel(lambda i: self._write_held(f"held-{i}", *self.writable[i]), todo)
        self.held_claims = claims
        took = time.monotonic() - t0
        self.log(f"scale: {len(todo)} claims allocated by writing in {took:.0f}s")
        return {"claims": len(todo), "seconds": round(took, 1)}

    def hold_more(self, claims: int) -> dict[str, Any]:
        """``claims`` more claims allocated by writing, as :meth:`hold` writes them, on the
        :attr:`spare` GPUs no claim holds yet (the scheduler's fill may have taken some)."""
        taken = {(str(r.get("pool")), str(r.get("device"))) for c in self.api.list_claim_allocations().items
                 for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []}
        free = [gpu for gpu in self.spare if gpu[1:] not in taken]
        if claims > len(free):
            raise RuntimeError(f"scale: {claims} more written claims need more than the {len(free)} spare GPUs free")
        first = self.more_claims
        t0 = time.monotonic()
        parallel(lambda i: self._write_held(f"held-more-{first + i}", *free[i]), range(claims))
        self.more_claims += claims
        took = time.monotonic() - t0
        self.log(f"scale: {claims} more claims allocated by writing in {took:.0f}s")
        return {"claims": claims, "seconds": round(took, 1)}

    def _write_held(self, name: str, node: str, pool: str, device: str) -> None:
        """A pod bound to ``node``, its claim, and the claim's status as the scheduler writes it
        (the allocation of ``device`` and ``reservedFor`` the pod)."""
        pod = create(self.api, PODS, pod_body(name, claim=name, node=node), NS_HELD)
        claim = create(self.api, CLAIMS, claim_body(name, FIT_SHAPES["any-gpu"]), NS_HELD)
        claim["status"] = {
            "allocation": {
                "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
            "reservedFor": [{"resource": "pods", "name": name, "uid": pod["metadata"]["uid"]}],
        }
        _retrying(lambda: self.api.replace_status(CLAIMS, claim))

    @property
    def claims(self) -> int:
        return self.fill_pods + self.held_claims + self.more_claims

    @property
    def pods(self) -> int:
        return self.fill_pods + self.held_claims + self.more_claims + self.plain_pods

    # -- pending claims for our controller alone

    def pending(self, namespace: str, names: list[str], shapes: dict[str, dict[str, Any]],
                on_claims_start: Callable[[], None] | None = None) -> float:
        """Pods (no scheduler) first, then their claims all at once; returns when the claims began."""
        keys = list(shapes)
        parallel(lambda name: create(self.api, PODS, pod_body(name, claim=name, scheduler=NO_SCHEDULER), namespace),
                 names)
        if on_claims_start is not None:
            on_claims_start()
        t0 = time.monotonic()
        parallel(lambda i: create(self.api, CLAIMS, claim_body(names[i], shapes[keys[i % len(keys)]]), namespace),
                 range(len(names)))
        return t0

    def remove(self, namespace: str, names: Iterable[str]) -> None:
        """Claims, then their pods: a claim whose pod went first would be re-examined (and its
        explanation cleared) by a running controller."""
        names = list(names)
        parallel(lambda n: delete(self.api, CLAIMS, n, namespace), names)
        parallel(lambda n: delete(self.api, PODS, n, namespace), names)

    def clear_explanations(self, namespace: str, names: Iterable[str]) -> None:
        """Our annotations off the claims ``names``, as if no controller had explained them yet."""
        patch = {"metadata": {"annotations": dict.fromkeys(OUR_ANNOTATIONS)}}
        parallel(lambda n: _retrying(lambda: self.api.merge_patch(CLAIMS, n, patch, namespace=namespace)), names)

    def events_by_reporter(self, namespace: str) -> dict[str, dict[str, int]]:
        """The Events of ``namespace``, counted by reporting instance (a controller's identity) and
        by the kind of object they are about."""
        listed = _retrying(lambda: self.api.list(EVENTS, namespace=namespace, cached=True))
        return events_by_reporter(listed.items)

    def has_explanation(self, namespace: str, name: str) -> bool:
        try:
            return has_explanation(self.api.get(CLAIMS, name, namespace=namespace))
        except ApiError:
            return False

    def apiserver_metrics(self) -> str:
        return self.cluster.kubectl("get", "--raw", "/metrics").stdout
