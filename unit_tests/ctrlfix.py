"""Shared fixtures for the controller, explain and leader tests."""

from __future__ import annotations

import copy
from typing import Any

from kubefake import FakeKube

from dra_driver.controller.keys import ALLOCATE_ANNOTATION
from dra_driver.controller.reconciler import Controller
from dra_driver.controller.settings import ControllerSettings
from dra_driver.k8s.client import CLAIMS, CONFIGMAPS, DEVICE_CLASSES, PODS, SLICES, ApiError, Resource
from dra_driver.k8s.labels import parse_selector
from dra_driver.k8s.objects import Obj

DRIVER = "gpu.dra-driver.io"
CLASS = "gpu.dra-driver.io"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def settings(**over: Any) -> ControllerSettings:
    base: dict[str, Any] = dict(
        driver_name=DRIVER,
        kubeconfig=None,
        log_format="json",
        log_level="info",
        leader_elect=False,
        leader_election_namespace="kube-system",
        leader_election_id="dra-driver-controller",
        identity="test-replica",
        metrics_port=0,
        resync_seconds=30.0,
        allocation_ledger=("kube-system", "dra-driver-allocations"),
        allocation_namespaces=parse_selector(""),  # every namespace: the tests of the gate say otherwise
    )
    base.update(over)
    return ControllerSettings(**base)


def fence_policy(kube: FakeKube, ledger: str = "kube-system/dra-driver-allocations") -> None:
    """What the allocation-fence ValidatingAdmissionPolicy does, against ``kube``'s ConfigMap
    (the policy itself is checked against kube-apiserver in e2e/suites/test_controller.py)."""

    def admit(verb: str, res: Resource, new: Obj, old: Obj | None) -> None:
        if res.plural != "resourceclaims" or verb not in ("replace_status", "dry_run_status"):
            return
        if (old or {}).get("status", {}).get("allocation"):
            return
        cm = kube.obj(CONFIGMAPS, ledger)
        held = (cm or {}).get("data") or {}
        for r in ((new.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", []):
            if r.get("adminAccess"):
                continue
            key = f"{r['driver']}_{r['pool'].replace('/', '_')}_{r['device']}"
            if key in held and held[key] != new["metadata"]["uid"]:
                raise ApiError(403, "Forbidden", f"ValidatingAdmissionPolicy denied request: allocation fence: "
                               f"device {key} is held by the dra-driver controller for claim {held[key]}")

    kube.admission.append(admit)


def make_controller(kube: FakeKube, *, fenced: bool = True, driver: str = DRIVER, **kw: Any) -> tuple[Controller, FakeClock]:
    """A controller of ``driver`` on ``kube`` with a fake clock; ``fenced``: the cluster has the
    allocation-fence policy."""
    clock = FakeClock()
    if fenced:
        fence_policy(kube)
    kw.setdefault("sleep", lambda _s: None)
    over: dict[str, Any] = {} if driver == DRIVER else {"driver_name": driver, "leader_election_id": f"{driver}-controller",
                                                          "allocation_ledger": ("kube-system", f"{driver}-allocations")}
    c = Controller(kube, settings(**over), clock=clock, **kw)
    return c, clock


def gpu_slice(node: str = "node-a", n: int = 2, driver: str = DRIVER, name: str | None = None) -> Obj:
    return {
        "metadata": {"name": name or f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "index": {"int": i}}} for i in range(n)
            ],
        },
    }


def device_class(name: str = CLASS, driver: str = DRIVER, config: list[Obj] | None = None) -> Obj:
    spec: Obj = {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}
    if config is not None:
        spec["config"] = config
    return {"metadata": {"name": name}, "spec": spec}


def claim(
    name: str = "c1",
    count: int = 1,
    *,
    ns: str = "default",
    cls: str = CLASS,
    opt_in: bool = False,
    config: list[Obj] | None = None,
    selectors: list[Obj] | None = None,
    annotations: dict[str, str] | None = None,
) -> Obj:
    exactly: Obj = {"deviceClassName": cls, "count": count}
    if selectors is not None:
        exactly["selectors"] = selectors
    devices: Obj = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if config is not None:
        devices["config"] = config
    ann = dict(annotations or {})
    if opt_in:
        ann[ALLOCATE_ANNOTATION] = "controller"
    m: Obj = {"name": name, "namespace": ns}
    if ann:
        m["annotations"] = ann
    return {"metadata": m, "spec": {"devices": devices}}


def pod(name: str, claim_name: str, *, ns: str = "default", phase: str = "Pending", via_template: bool = False) -> Obj:
    spec_rc: Obj = {"name": "gpu"}
    status: Obj = {"phase": phase}
    if via_template:
        spec_rc["resourceClaimTemplateName"] = "tmpl"
        status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    else:
        spec_rc["resourceClaimName"] = claim_name
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"resourceClaims": [spec_rc], "containers": []},
            "status": status}


def sharing_config(strategy: str = "MPS", driver: str = DRIVER) -> Obj:
    return {"opaque": {"driver": driver, "parameters": {
        "apiVersion": "gpu.dra-driver.io/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": strategy}}}}


def allocated_status(devices: list[str], node: str = "node-a", driver: str = DRIVER, request: str = "gpu") -> Obj:
    return {"allocation": {
        "devices": {"results": [{"request": request, "driver": driver, "pool": node, "device": d} for d in devices]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
    }}


def cluster(slices: int = 1, gpus: int = 2) -> FakeKube:
    kube = FakeKube()
    for i in range(slices):
        kube.add(SLICES, gpu_slice(f"node-{chr(ord('a') + i)}", gpus))
    kube.add(DEVICE_CLASSES, device_class())
    return kube


def sync(ctrl: Controller) -> None:
    """What the informers would have delivered by now."""
    for inf in ctrl.informers:
        inf.relist()


def drain(ctrl: Controller, limit: int = 200) -> int:
    """Process the queue, then write the Events it recorded (in the controller, a background thread's job)."""
    n = 0
    while ctrl.process_next(timeout=0):
        n += 1
        assert n < limit, "queue does not drain"
    assert ctrl.events.flush(timeout=5.0), "Events not written"
    return n


def step(ctrl: Controller) -> int:
    sync(ctrl)
    return drain(ctrl)


def events(kube: FakeKube, reason: str | None = None, kind: str | None = None) -> list[Obj]:
    """The Events written, of one reason and about objects of one kind where given."""
    out = list(kube.objects.get("events", {}).values())
    return [e for e in out if (reason is None or e["reason"] == reason) and (kind is None or e["regarding"]["kind"] == kind)]


def ann(kube: FakeKube, key: str = "default/c1") -> dict[str, str]:
    obj = kube.obj(CLAIMS, key)
    assert obj is not None
    return dict(obj["metadata"].get("annotations") or {})


def add_claim(kube: FakeKube, obj: Obj) -> Obj:
    return kube.add(CLAIMS, copy.deepcopy(obj))


def add_pod(kube: FakeKube, obj: Obj) -> Obj:
    return kube.add(PODS, obj)
