"""The bed turns gRPC's fork handlers off before gRPC loads (e2e/testbed/__init__.py)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_the_bed_turns_grpc_fork_support_off_before_grpc_loads() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    code = ("import sys, os; import e2e.testbed.clusterview, e2e.testbed.nodes; "
            "print(os.environ.get('GRPC_ENABLE_FORK_SUPPORT'), 'grpc' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    # If gRPC were already loaded by then it would have read the variable too late.
    loaded_first = subprocess.run([sys.executable, "-c", "import sys, e2e.testbed; print('grpc' in sys.modules)"],
                                  capture_output=True, text=True, env=env, check=True).stdout
    assert out.split()[0] == "false", out
    assert loaded_first.strip() == "False"
