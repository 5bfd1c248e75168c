"""`fit` against a fake API server."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from ctrlfix import add_pod, claim, pod
from fleetfix import A100, H100, fleet, run, template

from dra_driver.k8s.client import CLAIM_TEMPLATES

# --- fit -----------------------------------------------------------------------------------------


def test_fit_counts_what_is_free_and_names_the_first_that_does_not_fit() -> None:
    kube = fleet()
    kube.add(CLAIM_TEMPLATES, template())
    rc, out, _ = run(kube, "fit", "--template", "one-gpu", "--count", "10", "-o", "json")
    doc = json.loads(out)
    # free: node-a gpu-3 and the shareable gpu-1 (a whole-device request cannot share it), node-b's two
    assert rc == 0 and doc["fits"] == 3 and doc["nodes"] == {"node-a": 1, "node-b": 2}
    assert doc["models"] == {H100: 1, A100: 2}
    assert doc["firstFailure"]["try"] == 4 and doc["firstFailure"]["state"] == "unsatisfiable"
    assert doc["rules"].startswith("kube-scheduler 1.37")
    rc, out, _ = run(kube, "fit", "--template", "default/one-gpu", "--count", "10")
    assert rc == 0 and out.startswith("3 of 10 more of ResourceClaimTemplate default/one-gpu fit now")
    assert "try 4 does not fit: claim default/one-gpu-fit-3" in out and "unsatisfiable: " in out


def test_fit_a_claim_file(tmp_path: Path) -> None:
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump(claim("two", count=2) | {"kind": "ResourceClaim"}))
    rc, out, _ = run(fleet(), "fit", "-f", str(path), "--count", "2", "-o", "json")
    doc = json.loads(out)
    assert rc == 0 and doc["fits"] == 1 and doc["nodes"] == {"node-b": 1}
    rc, out, _ = run(fleet(), "fit", "-f", "-", "-o", "json", stdin=json.dumps(template()))
    assert rc == 0 and json.loads(out)["fits"] == 1


def test_fit_a_pod_puts_all_its_claims_on_one_node() -> None:
    kube = fleet()
    kube.add(CLAIM_TEMPLATES, template())
    two = pod("trainer", "", via_template=True)
    two["spec"]["resourceClaims"] = [{"name": "a", "resourceClaimTemplateName": "one-gpu"},
                                     {"name": "b", "resourceClaimTemplateName": "one-gpu"}]
    add_pod(kube, two)
    rc, out, _ = run(kube, "fit", "pod/trainer", "--count", "3", "-o", "json")
    doc = json.loads(out)
    assert rc == 0 and doc["fits"] == 1 and doc["nodes"] == {"node-b": 1} and doc["models"] == {A100: 2}
    assert doc["firstFailure"]["try"] == 2
