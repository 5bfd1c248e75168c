"""Our DNS-name rules (``dra_driver/k8s/names.py``) against the API server's own: each candidate is
sent in a server-side dry run, and the API server's verdict must be ours.

Namespaces are named by DNS labels, ConfigMaps by DNS subdomains, and a ResourceSlice's
``spec.driver`` is a driver name, so the three objects exercise the three rules.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml

from dra_driver.k8s.names import is_dns_label, is_dns_subdomain, is_driver_name
from e2e.testbed.clusterview import Bed

# The cases the rules' edges are made of. Empty and control characters are left out: kubectl refuses
# them before the API server sees them.
CANDIDATES = [
    "a", "0", "abc", "a-b", "a--b", "1a", "123", "-a", "a-", "A", "aB", "a_b", "a.b", "a..b", ".a", "a.",
    "a-.b", "a.-b", "a.b-", "A.b", "a_b.c", "example.com", "gpu.dra-driver.io", "GPU.Example.COM",
    "x" * 63, "x" * 64, "x" * 100 + ".com", "a" * 253, "a" * 254, ".".join(["a" * 63] * 4)[:253].rstrip("."),
    "a." * 126 + "ab", "é", "a b", "a:b",
]


def _dry_run(bed: Bed, docs: list[dict[str, Any]]) -> set[str]:
    """The ``kind/name`` of every document the API server accepted in a server-side dry run."""
    proc = subprocess.run(
        [bed.kubectl_bin, "--kubeconfig", str(bed.kubeconfig), "create", "--dry-run=server", "-o", "name", "-f", "-"],
        input=yaml.safe_dump_all(docs), capture_output=True, text=True, check=False, timeout=300)
    # kubectl goes on past a refused document and exits non-zero; a refusal must name the object.
    assert proc.returncode == 0 or "invalid" in proc.stderr.lower(), proc.stderr[-2000:]
    return {line.strip() for line in proc.stdout.splitlines() if line.strip()}


@pytest.mark.smoke
def test_name_rules_agree_with_the_api_server(bed: Bed) -> None:
    namespaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": value}} for value in CANDIDATES]
    configmaps = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": value, "namespace": "default"}}
                  for value in CANDIDATES]
    slices = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"names-check-{i}"},
               "spec": {"driver": value, "nodeName": "names-check-node",
                        "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1}, "devices": []}}
              for i, value in enumerate(CANDIDATES)]
    accepted = _dry_run(bed, namespaces + configmaps + slices)

    disagreements = []
    for i, value in enumerate(CANDIDATES):
        for rule, ours, server in [
            ("label", is_dns_label(value), f"namespace/{value}" in accepted),
            ("subdomain", is_dns_subdomain(value), f"configmap/{value}" in accepted),
            ("driver", is_driver_name(value), f"resourceslice.resource.k8s.io/names-check-{i}" in accepted),
        ]:
            if ours != server:
                disagreements.append(f"{rule} {value!r}: ours {ours}, API server {server}")
    assert not disagreements, "\n".join(disagreements)
    # Both verdicts occur for every rule, so the comparison cannot pass by everything being refused.
    for prefix in ("namespace/", "configmap/", "resourceslice.resource.k8s.io/"):
        assert any(name.startswith(prefix) for name in accepted), f"the API server accepted no {prefix}"
