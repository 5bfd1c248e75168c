"""The fleet commands' fixtures: a cluster in a fake API server (the module boundary: the client),
with slices written out here, and the commands run as kubectl runs them."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import yaml
from ctrlfix import DRIVER, add_claim, add_pod, allocated_status, claim, device_class, pod
from kubefake import FakeKube

from dra_driver import cli
from dra_driver.allocator.resolve import Engine
from dra_driver.flags import resolve_environment
from dra_driver.k8s.client import DEVICE_CLASSES, EVENTS, SLICES
from dra_driver.node.publish.health import TAINT_KEY
from dra_driver.tools.fleet import command
from e2e.generators.fleet import plugin_slices

SHIPPED_CLASSES = Path(__file__).resolve().parents[1] / "deploy" / "deviceclasses"
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-40GB"


def gpu(name: str, model: str = H100, memory: str = "80Gi", **extra: Any) -> dict[str, Any]:
    return {"name": name, "attributes": {"type": {"string": "gpu"}, "productName": {"string": model},
                                         "uuid": {"string": f"GPU-{name}"}},
            "capacity": {"memory": {"value": memory}}, **extra}


def node_slice(node: str, devices: list[dict[str, Any]], driver: str = DRIVER) -> dict[str, Any]:
    return {"metadata": {"name": f"{node}-{driver}"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}}


def share_result(device: str, share: str, memory: str, node: str = "node-a") -> dict[str, Any]:
    return {"request": "gpu", "driver": DRIVER, "pool": node, "device": device, "shareID": share,
            "consumedCapacity": {"memory": memory}}


def fleet() -> FakeKube:
    """node-a: gpu-0 allocated to default/c1 (pod default/p1), gpu-1 shared by two claims, gpu-2
    tainted unhealthy, gpu-3 free; node-b: two free A100s and a withheld device."""
    kube = FakeKube()
    kube.add(SLICES, node_slice("node-a", [
        gpu("gpu-0"), gpu("gpu-1", allowMultipleAllocations=True),
        gpu("gpu-2", taints=[{"key": TAINT_KEY, "value": "xid-79", "effect": "NoSchedule"}]), gpu("gpu-3")]))
    kube.add(SLICES, node_slice("node-b", [gpu("gpu-0", A100, "40Gi"), gpu("gpu-1", A100, "40Gi")]))
    kube.add(SLICES, node_slice("node-c", [gpu("gpu-0", "Other")], driver="other.example.com"))
    kube.add(DEVICE_CLASSES, device_class())
    held = claim("c1")
    held["status"] = allocated_status(["gpu-0"])
    add_claim(kube, held)
    add_pod(kube, pod("p1", "c1", phase="Running"))
    for name, share, memory in (("s1", "a1", "16Gi"), ("s2", "a2", "8Gi")):
        shared = claim(name, ns="ml")
        shared["status"] = {"allocation": {"devices": {"results": [share_result("gpu-1", share, memory)]}}}
        add_claim(kube, shared)
    kube.add(EVENTS, {"metadata": {"name": "w1", "namespace": "default"}, "reason": "DeviceWithheld",
                      "regarding": {"kind": "Node", "name": "node-b"},
                      "note": "device gpu-7 is not published, the node's other devices are: the API server would "
                              "refuse it: attributes: too many (rule maxAttributes)"})
    return kube


def shipped_classes() -> list[dict[str, Any]]:
    """The chart's DeviceClasses (``deploy/deviceclasses``)."""
    return [d for p in sorted(SHIPPED_CLASSES.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def run(kube: FakeKube, *argv: str, stdin: str | None = None, engine: Engine | None = None) -> tuple[int, str, str]:
    parser = cli.build_parser(cli.KUBECTL_PLUGIN, kubectl_plugin=True)
    args = parser.parse_args(cli.kubectl_booleans(list(argv), parser.error))
    resolve_environment(args)
    out, err = io.StringIO(), io.StringIO()
    rc = command.main(args, prog=f"kubectl dra {args.command}", api=kube, engine=engine, out=out, err=err,
                      stdin=io.StringIO(stdin or ""), server_version=lambda: "v1.37.2")
    assert kube.writes() == [], "a fleet command wrote"
    return rc, out.getvalue(), err.getvalue()


def one_line(result: tuple[int, str, str]) -> str:
    rc, out, err = result
    assert rc == 1 and out == "" and err.count("\n") == 1 and "Traceback" not in err, (rc, out, err)
    return err.rstrip("\n")


def devices(kube: FakeKube, *argv: str) -> dict[tuple[str, str], dict[str, Any]]:
    rc, out, err = run(kube, "get", "gpus", "-o", "json", *argv)
    assert rc == 0, err
    return {(d["node"], d["device"]): d for d in json.loads(out)["devices"]}


def template(name: str = "one-gpu", ns: str = "default", cls: str = "gpu.dra-driver.io") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name, "namespace": ns},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls}}]}}}}


def dynamic_mig() -> FakeKube:
    """One dynamic-MIG node as the plugin publishes it, with one 3g.40gb partition allocated."""
    kube = FakeKube()
    for s in plugin_slices(1, mig_nodes=1):
        kube.add(SLICES, s)
    kube.add(DEVICE_CLASSES, device_class())
    part = claim("mig")
    part["status"] = allocated_status(["gpu-0-mig-3g40gb-0"], node="gpu-node-1")
    add_claim(kube, part)
    return kube
