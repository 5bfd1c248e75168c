"""What only a real install shows, on the kind cluster that ``e2e/suites/kind/run-e2e.sh`` made and installed.

These tests talk to the chart's own pods (exec into them, read their logs), to the kind nodes'
containers (``docker exec``: the files the plugin leaves on a host) and to helm. They exist only on
kind, so they are not collected at all on the local bed (not skipped: another suite).
"""

from __future__ import annotations

import os

import pytest

from e2e.suites.kind.install import Install
from e2e.testbed.clusterview import Bed

if os.environ.get("E2E_CLUSTER") != "kind":
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def install(bed: Bed) -> Install:
    helm_bin = os.environ.get("HELM") or "helm"
    return Install(bed=bed, namespace=os.environ.get("E2E_DRIVER_NAMESPACE", "dra-driver"),
                   release=os.environ.get("E2E_RELEASE", "dra-driver"), image=os.environ.get("E2E_IMAGE", "dra-driver:e2e"),
                   cluster=os.environ.get("E2E_KIND_CLUSTER", "dra-driver-e2e"), helm_bin=helm_bin,
                   kind_bin=os.environ.get("KIND") or "kind", profile=os.environ.get("SIMULATED_PROFILE", "kind-mixed"))
