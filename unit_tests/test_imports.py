"""The runtime never imports the official ``kubernetes`` client (dra_driver.k8s.client is the boundary).

Importing it costs the node plugin ~15 MiB of resident memory up front and more once its
ApiClient and config loader are used; the plugin's RSS target (≤ 80 MiB, ``make bench``) depends
on its absence. Each module is imported in a fresh interpreter so nothing loaded by the test
process (the e2e peer, other tests) can hide or fake an import.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

MODULES = ["dra_driver.node.plugin", "dra_driver.k8s.client", "dra_driver.k8s.credentials", "dra_driver.node.prepare",
           "dra_driver.node.slices", "dra_driver.controller.reconciler", "dra_driver.controller.explain", "dra_driver.cli"]


@pytest.mark.parametrize("module", MODULES)
def test_kubernetes_package_is_not_imported(module: str) -> None:
    code = (f"import sys, {module}\n"
            "bad = sorted(m for m in sys.modules if m == 'kubernetes' or m.startswith('kubernetes.'))\n"
            "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"


def test_no_deferred_import_in_the_sources() -> None:
    """Imports inside functions (the plugin's ``run`` had one) escape the import check above."""
    root = Path(__file__).resolve().parent.parent / "dra_driver"
    offenders = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{path.relative_to(root)}:{node.lineno}" for n in names if n.split(".")[0] == "kubernetes"]
    assert not offenders


@pytest.mark.skipif(importlib.util.find_spec("kubernetes") is None, reason="kubernetes (dev dependency) not installed")
def test_check_detects_an_import() -> None:
    """The subprocess check itself sees an import (so the test above can fail)."""
    code = "import sys, kubernetes.config\nprint('kubernetes' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "True"
