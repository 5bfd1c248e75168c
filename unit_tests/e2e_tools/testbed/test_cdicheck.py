"""The reference CDI library's check of spec files (``cdi-validate``, e2e/testbed/cdicheck.py) and the
session check built on it (unit_tests/cdispecs.py): both must refuse what containerd would refuse."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import cdispecs
import pytest

from dra_driver.node.prepare.cdi import CdiSpecs
from dra_driver.node.prepare.edits import ClaimDevice
from e2e.testbed import cdicheck

ROOT = Path(__file__).resolve().parents[3]
DRIVER = "gpu.dra-driver.io"
UID = "ab1c2d3e-0000-4000-8000-000000000000"
DEVICES = [ClaimDevice("gpu-0", "gpu", "GPU-a", 0), ClaimDevice("mig-1-0", "gpu", "MIG-b", 1, mig_caps=(12, 13))]


def our_spec(dev_root: Path = Path("/")) -> dict[str, Any]:
    return CdiSpecs(Path("/unused"), DRIVER, dev_root).build_spec(UID, "ns", "claim", DEVICES)


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def test_a_bad_device_name_is_refused_naming_it(tmp_path: Path) -> None:
    doc = our_spec()
    doc["devices"][0]["name"] = "-gpu-0"
    [verdict] = cdicheck.check([write(tmp_path / "bad.json", doc)])
    assert not verdict.ok and verdict.spec == str(tmp_path / "bad.json")
    assert 'failed add device "-gpu-0"' in verdict.error and "should start with a letter or digit" in verdict.error
    assert cdicheck.problems([verdict]) == [f"{tmp_path / 'bad.json'}: {verdict.error}"]


def test_a_cdi_version_too_low_for_the_features_used_is_refused(tmp_path: Path) -> None:
    doc = our_spec(tmp_path / "devroot")  # hostPath needs 0.5.0
    assert doc["cdiVersion"] == "0.5.0"
    doc["cdiVersion"] = "0.4.0"
    [verdict] = cdicheck.check([write(tmp_path / "low.json", doc)])
    assert not verdict.ok and "the spec version must be at least v0.5.0" in verdict.error


def test_a_file_a_runtime_never_loads_is_refused(tmp_path: Path) -> None:
    [verdict] = cdicheck.check([write(tmp_path / "spec.yml", our_spec())])
    assert not verdict.ok and "ends in .json or .yaml" in verdict.error


def test_our_spec_loads_and_each_device_resolves_and_injects(tmp_path: Path) -> None:
    dev_root, cdi_dir = tmp_path / "devroot", tmp_path / "cdi"
    ids = CdiSpecs(cdi_dir, DRIVER, dev_root).write_claim_spec(UID, "ns", "claim", DEVICES)
    [spec, *devices] = cdicheck.check([cdi_dir])
    assert spec.ok and spec.kind == f"k8s.{DRIVER}/claim" and spec.cdi_version == spec.minimum_version == "0.5.0"
    assert [d.device for d in devices] == ids
    # Injection looks the device nodes up on this machine: none is there yet.
    assert all(d.ok and d.injected == cdicheck.NEEDS_HOST_DEVICES for d in devices)
    assert str(dev_root / "dev" / "nvidia-caps" / "nvidia-cap12") in devices[1].absent_host_devices
    assert len(cdispecs.stand_in_device_nodes(cdi_dir, dev_root)) == 3 + 2 + 2
    assert all(d.ok and d.injected == cdicheck.INJECTED for d in cdicheck.check([cdi_dir])[1:])


def test_an_injection_gives_the_oci_spec_containerd_would(tmp_path: Path) -> None:
    dev_root, cdi_dir = tmp_path / "devroot", tmp_path / "cdi"
    ids = CdiSpecs(cdi_dir, DRIVER, dev_root).write_claim_spec(UID, "ns", "claim", DEVICES)
    cdispecs.stand_in_device_nodes(cdi_dir, dev_root)
    _, injection = cdicheck.inject(cdi_dir, ids[1:])
    assert injection.ok, injection.error
    assert "NVIDIA_VISIBLE_DEVICES=GPU-a,MIG-b" in injection.oci["process"]["env"]
    assert [d["path"] for d in injection.oci["linux"]["devices"]] == [
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia1",
        "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"]
    _, unknown = cdicheck.inject(cdi_dir, [f"k8s.{DRIVER}/claim=nope"])
    assert not unknown.ok and "unresolvable CDI devices" in unknown.error


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The session keeps the specs it refuses in a temporary folder: here, one under tmp_path."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def test_the_session_reports_a_refused_spec_with_its_file_and_test(tmp_path: Path, scratch: None) -> None:
    session = cdispecs.Session()
    good = json.dumps(our_spec()).encode()
    bad = json.loads(good)
    bad["devices"][1]["containerEdits"]["env"].append("NO_VALUE")
    session.offer(tmp_path / "good.json", good)
    session.offer(tmp_path / "good.json", good)
    session.offer(tmp_path / "bad.json", json.dumps(bad).encode())
    session.offer(tmp_path / "state.json", b'{"claims": {}}')  # not a CDI spec: not kept
    outcome = session.check()
    assert outcome is not None and (outcome.written, outcome.distinct) == (3, 2)
    [problem] = outcome.problems
    assert problem.startswith(f"{tmp_path / 'bad.json'} written by unit_tests/e2e_tools/testbed/test_cdicheck.py::"
                              "test_the_session_reports_a_refused_spec_with_its_file_and_test: ")
    assert 'invalid environment variable "NO_VALUE"' in problem
    assert outcome.kept is not None and [p.name for p in outcome.kept.glob("*/*")] == ["bad.json"]


def test_a_cdi_version_above_the_lowest_needed_is_a_problem(tmp_path: Path, scratch: None) -> None:
    session = cdispecs.Session()
    doc = our_spec()
    doc["cdiVersion"] = "0.6.0"
    session.offer(tmp_path / "high.json", json.dumps(doc).encode())
    outcome = session.check()
    assert outcome is not None
    assert [p.split(": ", 1)[1] for p in outcome.problems] == [
        f"cdiVersion 0.6.0 is not the lowest its content needs: the library says 0.3.0 [copy: {outcome.kept}/00000/high.json]"]


def test_a_session_that_wrote_no_spec_checks_nothing() -> None:
    assert cdispecs.Session().check() is None


def test_the_run_fails_when_the_driver_writes_a_spec_the_library_refuses(tmp_path: Path) -> None:
    """The whole path: conftest's recorder around the driver's writer, and the session's verdict."""
    refused = json.dumps({"cdiVersion": "0.3.0", "kind": "k8s.x/claim",
                          "devices": [{"name": "ba!d", "containerEdits": {"env": ["A=1"]}}]}).encode()
    (tmp_path / "test_writes.py").write_text(textwrap.dedent(f"""
        from pathlib import Path

        from dra_driver.node.fileio import atomic_write
        from dra_driver.node.prepare.cdi import CdiSpecs
        from dra_driver.node.prepare.edits import ClaimDevice

        def test_writes_a_spec_with_a_bad_device_name(tmp_path: Path) -> None:
            atomic_write(tmp_path / "refused.json", {refused!r}, 0o644)

        def test_writes_a_good_spec(tmp_path: Path) -> None:
            CdiSpecs(tmp_path, "{DRIVER}").write_claim_spec("{UID}", "ns", "c", [ClaimDevice("gpu-0", "gpu", "GPU-a", 0)])
    """))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "unit_tests.conftest", "-p", "no:cacheprovider",
                           str(tmp_path / "test_writes.py")], cwd=ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT / "unit_tests")})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout
    assert "CDI specs the driver wrote, by the reference CDI library" in proc.stdout
    [problem] = [line for line in proc.stdout.splitlines() if "refused.json written by" in line]
    assert "test_writes.py::test_writes_a_spec_with_a_bad_device_name" in problem
    assert "invalid character '!' in device name" in problem
    assert "1 problem(s) in 2 distinct CDI spec(s)" in proc.stdout
