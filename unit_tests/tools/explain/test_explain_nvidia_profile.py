"""`explain` over slices in NVIDIA's names (``--api-profile nvidia``): claims written for NVIDIA's
driver (its classes, its attributes in CEL, ``matchAttribute`` on ``parentUUID``) resolve as the
scheduler would, and what keeps one out is said in those names."""

from __future__ import annotations

import io
import json
from typing import Any

from ctrlfix import add_claim
from kubefake import FakeKube

from dra_driver.apiprofile import NVIDIA_DRIVER_NAME, NVIDIA_PROFILE, class_selector
from dra_driver.k8s.client import DEVICE_CLASSES, SLICES
from dra_driver.node.discovery.profiles import load_profile
from dra_driver.tools.explain import command as explain
from e2e.generators.fleet import published_slices


def nvidia_cluster() -> FakeKube:
    kube = FakeKube()
    for body in published_slices(load_profile("a100-mig"), "node-a", driver=NVIDIA_DRIVER_NAME,
                                 api_profile=NVIDIA_PROFILE):
        kube.add(SLICES, body)
    for spec in NVIDIA_PROFILE.device_classes(NVIDIA_DRIVER_NAME):
        kube.add(DEVICE_CLASSES, {"metadata": {"name": spec.name},
                                  "spec": {"selectors": [{"cel": {"expression": class_selector(NVIDIA_DRIVER_NAME,
                                                                                              spec.device_type)}}]}})
    return kube


def nvidia_claim(name: str, requests: list[dict[str, Any]], constraints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"}, "spec": {"devices": devices}}


def explained(kube: FakeKube, ref: str) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    rc = explain.main(ref, output="json", api=kube, out=out, err=err, driver=NVIDIA_DRIVER_NAME)
    assert rc == 0, err.getvalue()
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


def test_nvidias_mig_claim_with_a_shared_parent_resolves() -> None:
    kube = nvidia_cluster()
    mig = [{"name": f"m{i}", "exactly": {"deviceClassName": "mig.nvidia.com", "selectors": [
        {"cel": {"expression": f"device.attributes['gpu.nvidia.com'].profile == '{p}'"}}]}}
        for i, p in enumerate(("1g.5gb", "2g.10gb"))]
    add_claim(kube, nvidia_claim("mig-pair", mig, [{"matchAttribute": "gpu.nvidia.com/parentUUID"}]))
    doc = explained(kube, "default/mig-pair")
    assert doc["state"] == "satisfiable", doc
    devices = json.dumps(doc)
    assert "gpu-0-mig-1g5gb-19-" in devices and "gpu-0-mig-2g10gb-14-2" in devices


def test_a_product_that_no_gpu_has_is_named_in_nvidias_terms() -> None:
    kube = nvidia_cluster()
    add_claim(kube, nvidia_claim("h100", [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [
        {"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName.matches('H100')"}}]}}]))
    doc = explained(kube, "default/h100")
    assert doc["state"] == "unsatisfiable", doc
    assert "productName" in json.dumps(doc)
    add_claim(kube, nvidia_claim("full", [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]))
    assert explained(kube, "default/full")["state"] == "satisfiable"
