"""``dra-driver explain`` shows the device status the drivers wrote on an allocated claim."""

from __future__ import annotations

import io
import json
from typing import Any

from ctrlfix import add_claim, allocated_status, claim, cluster

from dra_driver.tools.explain import command as explain


def run(kube: Any, output: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    assert explain.main("default/c1", output=output, api=kube, out=out, err=err) == 0, err.getvalue()
    return out.getvalue()


def test_allocated_claim_shows_each_drivers_device_status() -> None:
    kube = cluster(gpus=2)
    obj = claim()
    obj["status"] = allocated_status(["gpu-0"])
    obj["status"]["devices"] = [
        {"driver": "gpu.dra-driver.io", "pool": "node-a", "device": "gpu-0",
         "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared", "message": "m",
                         "lastTransitionTime": "2026-11-23T10:00:00Z"}],
         "data": {"uuid": "GPU-aaaa", "productName": "NVIDIA H100", "memory": "80Gi"}},
        {"driver": "nic.example.com", "pool": "node-a", "device": "nic-0", "shareID": "s-1"},
    ]
    add_claim(kube, obj)
    text = run(kube, "text")
    assert "device status (written by the drivers):" in text
    assert ("  gpu.dra-driver.io/node-a/gpu-0: Ready=True (Prepared); uuid=GPU-aaaa, productName=NVIDIA H100, "
            "memory=80Gi") in text
    assert "  nic.example.com/node-a/nic-0 share s-1: no conditions" in text
    report = json.loads(run(kube, "json"))
    assert report["deviceStatus"][0] == {"device": "gpu.dra-driver.io/node-a/gpu-0", "conditions": ["Ready=True (Prepared)"],
                                         "data": {"uuid": "GPU-aaaa", "productName": "NVIDIA H100", "memory": "80Gi"}}


def test_no_device_status_no_section() -> None:
    kube = cluster(gpus=2)
    obj = claim()
    obj["status"] = allocated_status(["gpu-0"])
    add_claim(kube, obj)
    assert "device status" not in run(kube, "text")
    assert "deviceStatus" not in json.loads(run(kube, "json"))
