"""The official ``kubernetes`` client is used for its credential loaders only, never for its models.

Its loaders (``kubernetes.config``) and ``kubernetes.client.Configuration`` cost the node plugin
~15 MiB; its generated model and API classes would cost ~40 MiB more and break the plugin's RSS
target (≤ 80 MiB, ``make bench``). ``kubernetes`` ≥ 37 loads models lazily, so the check is that no
``kubernetes.client.models.*`` or ``kubernetes.client.api.*`` module is ever loaded. Each entry is
imported in a fresh interpreter, and the credentials are loaded for real there (a kubeconfig),
so nothing loaded by the test process can hide or fake an import.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ENTRY_MODULES = ["dra_driver.cli", "dra_driver.node.plugin", "dra_driver.node.prepare.state", "dra_driver.node.publish.publisher",
                 "dra_driver.controller.reconciler", "dra_driver.tools.explain.command"]
FORBIDDEN = ("kubernetes.client.models.", "kubernetes.client.api.")

CHECK = textwrap.dedent("""
    import sys
    {imports}
    {use}
    bad = sorted(m for m in sys.modules if m.startswith({forbidden!r}))
    print(",".join(bad))
""")


def _loaded_models(tmp_path: Path, imports: str, use: str = "") -> str:
    code = CHECK.format(imports=imports, use=use, forbidden=FORBIDDEN)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    return out.stdout.strip()


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return path


@pytest.mark.parametrize("module", ENTRY_MODULES)
def test_no_model_module_is_loaded(module: str, tmp_path: Path, kubeconfig: Path) -> None:
    # The node plugin's own start-up path: its API client, credentials loaded by the official loader.
    use = (f"from dra_driver.node.plugin import api_client\napi_client({str(kubeconfig)!r}).host"
           if module == "dra_driver.node.plugin" else "")
    assert _loaded_models(tmp_path, f"import {module}", use) == ""


def test_the_check_sees_a_model_import(tmp_path: Path) -> None:
    """The subprocess check itself sees a model module (so the test above can fail)."""
    assert "kubernetes.client.models.v1_pod" in _loaded_models(tmp_path, "import dra_driver.node.plugin",
                                                               "from kubernetes.client import V1Pod")


def test_the_official_client_is_imported_in_one_module() -> None:
    """Only dra_driver/k8s/credentials.py may import ``kubernetes``; everything else goes through our
    REST client, where a model class could not slip in unnoticed."""
    root = Path(__file__).resolve().parent.parent / "dra_driver"
    importers = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n.split(".")[0] == "kubernetes" for n in names):
                importers.add(str(path.relative_to(root)))
    assert importers == {"k8s/credentials.py"}


def test_structlog_loads_without_rich() -> None:
    """``rich`` (~6 MiB) is installed (common-expression-language needs it) but is not loaded by the
    node plugin through structlog (dra_driver/logs.py), and stays importable afterwards."""
    code = ("import sys\nimport dra_driver.node.plugin\nloaded = 'rich' in sys.modules\n"
            "import rich\nprint(loaded, rich.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.split() == ["False", "rich"]
