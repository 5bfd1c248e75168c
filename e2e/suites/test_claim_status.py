"""Claim device status on the bed: while a pod runs, its claim's ``status.devices`` (read from the API
server) says which GPU or MIG instance it got, with the UUID the container sees; after the pod is
gone the plugin clears it."""

from __future__ import annotations

from typing import Any

import pytest

from e2e.testbed.clusterview import DRIVER, Bed, allocated, attr, observed, wait_for, wait_running

# On kind, what the container saw is read back from its log (e2e.testbed.clusterview.observed).
PRINT_AND_SLEEP = ["sh", "-c", "env; ls -l /dev/nvidia*; exec sleep 86400"]


def claim_and_pod(ns: str, name: str, device_class: str) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
         "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
         "spec": {"terminationGracePeriodSeconds": 1, "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                  "containers": [{"name": "ctr0", "image": "busybox:1.36", "command": PRINT_AND_SLEEP,
                                  "resources": {"claims": [{"name": "gpu"}]}}]}},
    ]


def our_status(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return [d for d in claim.get("status", {}).get("devices") or [] if d.get("driver") == DRIVER]


@pytest.mark.smoke
@pytest.mark.parametrize("kind", ["gpu", "mig"])
def test_prepared_claim_has_device_status_and_unprepare_clears_it(bed: Bed, ns: str, kind: str) -> None:
    name = f"status-{kind}"
    bed.apply(claim_and_pod(ns, name, f"{kind}.gpu.dra-driver.io"), ns=ns)
    wait_running(bed, ns, name, timeout=120)
    claim = wait_for("status.devices of the prepared claim",
                     lambda: (lambda c: c if our_status(c) else None)(bed.get("resourceclaim", name, ns)), timeout=60)

    (device,) = allocated(bed, claim)
    result = device["_result"]
    (status,) = our_status(claim)
    assert (status["driver"], status["pool"], status["device"]) == (DRIVER, result["pool"], result["device"])
    data = status["data"]
    seen = observed(bed, ns, name)["ctr0"]["env"]["NVIDIA_VISIBLE_DEVICES"]
    assert data["uuid"] == seen == attr(device, "uuid"), "the UUID the container sees"
    assert data["productName"] == attr(device, "productName")
    assert data["memory"] == device["capacity"]["memory"]["value"]
    if kind == "mig":
        assert data["migProfile"] == attr(device, "profile") and data["parentUUID"] == attr(device, "parentUUID")
        assert isinstance(data["gpuInstanceID"], int) and isinstance(data["computeInstanceID"], int)
    else:
        assert "migProfile" not in data
    (ready,) = status["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Prepared")
    assert result["pool"] in ready["message"] and ready["lastTransitionTime"]

    uid = claim["metadata"]["uid"]
    bed.delete("pod", name, ns)
    node = result["pool"]
    wait_for("the plugin clearing the claim's device status",
             lambda: any(uid in line and "device status cleared" in line
                         for line in bed.plugin_log(node).splitlines()), timeout=60)
    wait_for("status.devices to be empty", lambda: not our_status(bed.get("resourceclaim", name, ns)), timeout=30)
