"""Which claims a pod waits for (:func:`dra_driver.k8s.claims.pod_claim_keys`)."""

from __future__ import annotations

import pytest
from ctrlfix import pod

from dra_driver.k8s.claims import pod_claim_keys


class TestPodClaimKeys:
    def test_direct_and_template_references(self) -> None:
        assert pod_claim_keys(pod("p", "c1")) == {"default/c1"}
        assert pod_claim_keys(pod("p", "p-gpu-abc", via_template=True)) == {"default/p-gpu-abc"}

    def test_template_claim_not_created_yet(self) -> None:
        p = pod("p", "x", via_template=True)
        p["status"].pop("resourceClaimStatuses")
        assert pod_claim_keys(p) == set()

    @pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
    def test_done_pods_wait_for_nothing(self, phase: str) -> None:
        assert pod_claim_keys(pod("p", "c1", phase=phase)) == set()

    def test_deleted_unscheduled_pod_is_done_but_scheduled_one_is_not(self) -> None:
        p = pod("p", "c1")
        p["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
        assert pod_claim_keys(p) == set()
        p["spec"]["nodeName"] = "node-a"
        assert pod_claim_keys(p) == {"default/c1"}

    def test_garbage_pod(self) -> None:
        assert pod_claim_keys({"metadata": {"name": "x"}, "spec": {"resourceClaims": [None, 3]}}) == set()
