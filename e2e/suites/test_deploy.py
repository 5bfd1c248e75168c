"""The chart, DeviceClasses and examples against the real API server, and the chart's RBAC for real.

deploy/checks/server_check.py does the work so the same checks run by hand against kind.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from e2e.testbed.clusterview import REPO, Bed


@pytest.mark.smoke
def test_server_side_dry_run_and_rbac(bed: Bed) -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "checks" / "server_check.py"),
         "--kubeconfig", str(bed.kubeconfig), "--kubectl", bed.kubectl_bin],
        capture_output=True, text=True, check=False, timeout=600,
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "FAIL" not in proc.stdout
    # The checks that matter most must have run, not just passed vacuously.
    needles = ("server-side dry run", "own node's slice", "another node's slice", "another node's pool",
               "controller can-i create resourceslices == no",
               "may write its driver's status.devices", "node-b may not write status.devices")
    for needle in needles:
        assert needle in proc.stdout, f"server_check output lacks {needle!r}"
