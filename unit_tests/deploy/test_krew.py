"""The krew manifest of the kubectl plugin (deploy/krew/dra.yaml) and the archive it names."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import yaml

from dra_driver import __version__

ROOT = Path(__file__).resolve().parents[2]
KREW = ROOT / "deploy" / "krew"
_spec = importlib.util.spec_from_file_location("krew_archive", KREW / "archive.py")
assert _spec is not None and _spec.loader is not None
archive = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(archive)


def manifest() -> dict[str, Any]:
    doc = yaml.safe_load((KREW / "dra.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def test_the_manifest_names_this_version_and_this_archive() -> None:
    doc = manifest()
    assert doc["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2" and doc["kind"] == "Plugin"
    assert doc["metadata"]["name"] == "dra"  # kubectl dra: the plugin's name is the word after kubectl
    spec = doc["spec"]
    assert spec["version"] == f"v{__version__}" and f"a checkout of dra-driver {__version__}" in spec["caveats"]
    [platform] = spec["platforms"]
    assert f"v{__version__}" in platform["uri"]
    assert platform["sha256"] == hashlib.sha256(archive.archive()).hexdigest(), "run deploy/krew/archive.py"
    with tarfile.open(fileobj=io.BytesIO(archive.archive())) as tar:
        names = tar.getnames()
    assert platform["bin"] in names and {f["from"] for f in platform["files"]} <= set(names)


def test_the_archive_is_the_same_bytes_each_time() -> None:
    assert archive.archive() == archive.archive()


def test_the_launcher_runs_the_plugin(tmp_path: Path) -> None:
    env = {**os.environ, "DRA_DRIVER_PYTHON": sys.executable}
    done = subprocess.run([str(KREW / "kubectl-dra"), "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("usage: kubectl dra")


def test_without_the_package_the_launcher_says_what_to_install(tmp_path: Path) -> None:
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "DRA_DRIVER_PYTHON": str(fake)}
    done = subprocess.run([str(KREW / "kubectl-dra"), "explain"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1 and "(pip install .)" in done.stderr and "Traceback" not in done.stderr


def test_the_package_installs_the_plugin() -> None:
    assert (Path(sys.executable).parent / "kubectl-dra").exists(), "pip install -e . installs kubectl-dra beside python"
