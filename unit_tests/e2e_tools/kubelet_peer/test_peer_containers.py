"""Pure claim -> container mapping: request-name filtering, claim names, extended resources."""

from __future__ import annotations

from typing import Any

import pytest

from e2e.kubelet_peer.containers import (
    ClaimNamePending,
    claims_to_prepare,
    container_cdi_ids,
    device_matches,
    pod_claim_names,
)
from e2e.kubelet_peer.model import PreparedDevice


def dev(name: str, *requests: str) -> PreparedDevice:
    return PreparedDevice(pool_name="p", device_name=name, request_names=requests, cdi_device_ids=(f"v.com/c={name}",))


@pytest.mark.parametrize(
    ("request_names", "req", "expected"),
    [
        ((), "", True),
        ((), "gpu", True),
        (("gpu",), "", True),
        (("gpu",), "gpu", True),
        (("gpu", "nic"), "nic", True),
        (("gpu",), "nic", False),
        (("gpu",), "gp", False),  # exact match only
        (("gpu/sub",), "gpu", False),  # drivers must send base names; the peer does not strip
    ],
)
def test_device_matches(request_names: tuple[str, ...], req: str, expected: bool) -> None:
    assert device_matches(request_names, req) is expected


def pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "p", "uid": "pod-uid"},
        "spec": {
            "resourceClaims": [
                {"name": "direct", "resourceClaimName": "shared-claim"},
                {"name": "tmpl", "resourceClaimTemplateName": "t"},
            ],
            "initContainers": [{"name": "init", "resources": {"claims": [{"name": "direct"}]}}],
            "containers": [
                {"name": "a", "resources": {"claims": [{"name": "tmpl", "request": "gpu"}]}},
                {"name": "b", "resources": {"claims": [{"name": "tmpl", "request": "nic"}, {"name": "direct"}]}},
                {"name": "c"},
                {"name": "ext"},
            ],
        },
        "status": status,
    }


def test_claim_names_from_status_and_spec() -> None:
    p = pod(resourceClaimStatuses=[{"name": "tmpl", "resourceClaimName": "p-tmpl-abc"}])
    assert pod_claim_names(p) == {"direct": "shared-claim", "tmpl": "p-tmpl-abc"}
    assert claims_to_prepare(p) == ["shared-claim", "p-tmpl-abc"]


def test_template_claim_not_created_yet() -> None:
    with pytest.raises(ClaimNamePending):
        pod_claim_names(pod())


def test_template_claim_not_needed() -> None:
    p = pod(resourceClaimStatuses=[{"name": "tmpl"}])
    assert pod_claim_names(p) == {"direct": "shared-claim", "tmpl": None}
    assert claims_to_prepare(p) == ["shared-claim"]


def test_container_ids_filtered_by_request() -> None:
    p = pod(
        resourceClaimStatuses=[{"name": "tmpl", "resourceClaimName": "p-tmpl-abc"}],
        extendedResourceClaimStatus={
            "resourceClaimName": "p-extended-xyz",
            "requestMappings": [
                {"containerName": "ext", "resourceName": "example.com/gpu", "requestName": "container-3-request-0"}
            ],
        },
    )
    devices = {
        "shared-claim": [dev("s0")],
        "p-tmpl-abc": [dev("g0", "gpu"), dev("n0", "nic"), dev("any")],
        "p-extended-xyz": [dev("e0", "container-3-request-0"), dev("e1", "other")],
    }
    assert claims_to_prepare(p) == ["shared-claim", "p-tmpl-abc", "p-extended-xyz"]
    ids = container_cdi_ids(p, devices)
    assert ids == {
        "init": ["v.com/c=s0"],
        "a": ["v.com/c=g0", "v.com/c=any"],
        "b": ["v.com/c=n0", "v.com/c=any", "v.com/c=s0"],
        "c": [],
        "ext": ["v.com/c=e0"],
    }


def test_duplicate_ids_are_injected_once() -> None:
    p = pod(resourceClaimStatuses=[{"name": "tmpl", "resourceClaimName": "x"}])
    p["spec"]["containers"][0]["resources"]["claims"].append({"name": "tmpl"})
    ids = container_cdi_ids(p, {"x": [dev("g0", "gpu")]})
    assert ids["a"] == ["v.com/c=g0"]
