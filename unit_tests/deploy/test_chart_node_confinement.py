"""The chart keeps a node plugin on its node: its ResourceSlices name its node and its pool, and
the chart installs only where its claim-status permission can be limited to its node (1.36+).
The API server's own answer to these rules is e2e/suites/test_deploy.py (deploy/checks/server_check.py)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "dra-driver"
TEMPLATES = CHART / "templates"


def _policy_validations() -> list[str]:
    text = (TEMPLATES / "admission-policy.yaml").read_text()
    # The template's one Go-template line at the top and bottom aside, the policy is plain YAML.
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("{{-"))
    policy = next(d for d in yaml.safe_load_all(re.sub(r"\{\{[^}]*\}\}", "X", body))
                  if d and d.get("kind") == "ValidatingAdmissionPolicy")
    variables = {v["name"]: " ".join(v["expression"].split()) for v in policy["spec"]["variables"]}
    assert variables["slicePool"] == 'variables.slice.spec.?pool.?name.orValue("")'
    return [" ".join(v["expression"].split()) for v in policy["spec"]["validations"]]


def test_a_slice_must_name_the_requesting_nodes_pool() -> None:
    validations = _policy_validations()
    assert 'request.operation == "DELETE" || variables.slicePool == variables.requesterNode' in validations
    assert "variables.sliceNode == variables.requesterNode" in validations


def test_the_pool_is_the_node_name_the_plugin_writes() -> None:
    from dra_driver.node.publish.slices import PoolOwner

    assert PoolOwner("gpu.dra-driver.io", "node-a", "uid").pool_name == "node-a"


def test_the_chart_refuses_kubernetes_before_1_36() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.36.0-0"
    guard = (TEMPLATES / "validate.yaml").read_text()
    assert 'semverCompare "<1.36.0-0" .Capabilities.KubeVersion.Version' in guard
    assert "1.34" not in guard and "1.35.0" not in guard
