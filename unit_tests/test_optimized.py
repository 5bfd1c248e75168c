"""The image runs every command with ``PYTHONOPTIMIZE=2`` (``-OO``: no docstrings, no asserts), which
the bed's plugins and controller do too (``e2e/tooling/bytecode.py``). Code that reads a
docstring at run time (an argparse description from ``__doc__``) breaks only there, so each
command's help is run under ``-OO`` here, in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COMMANDS = [
    ["-m", "dra_driver", "--help"],
    *(["-m", "dra_driver", command, "--help"]
      for command in ("kubelet-plugin", "controller", "explain", "debug-bundle", "probe")),
    ["-m", "dra_driver.node.discovery.dump", "--help"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[1:-1]))
def test_every_command_runs_without_docstrings(args: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-OO", *args], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage:")


def test_the_image_runs_optimized() -> None:
    dockerfile = (REPO / "deploy" / "image" / "Dockerfile").read_text()
    runtime = dockerfile.split("AS runtime", 1)[1]
    assert "PYTHONOPTIMIZE=2" in runtime
    # without opt-2 bytecode for the venv and the standard library, each start compiles from source
    assert dockerfile.count("compileall -q -j 0 -o 2") == 2
