"""Device metadata for containers (KEP-5304): the document, its CDI spec, and the prepare/unprepare,
crash, reboot and cleanup paths that write and remove them."""

from __future__ import annotations

import argparse
import errno
import json
import os
import stat
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cdispecs import stand_in_device_nodes
from crashes import Crash
from nodefix import Env, make_claim

from dra_driver import failpoints
from dra_driver.node.describe.devices import describe_device
from dra_driver.node.fileio import atomic_write
from dra_driver.node.prepare import metadata as md
from dra_driver.node.prepare.calls import MetadataError, validate_request_name
from dra_driver.node.prepare.cdi import CdiSpecs
from dra_driver.node.prepare.checkpoint import CheckpointStore
from dra_driver.node.prepare.entries import PreparedDevice
from dra_driver.node.prepare.metadata import MetadataClaim, MetadataFiles
from dra_driver.node.prepare.state import DeviceState
from dra_driver.node.settings import add_plugin_arguments, plugin_settings
from e2e.testbed import cdicheck

DRIVER = "gpu.dra-driver.io"
NODE = "node-a"
UID = "0b1c2d3e-0000-4000-8000-000000000000"


def _go_module_cache() -> Path:
    """Where the go command keeps modules (``go env`` honours ``GOMODCACHE``, which a cold run points
    at an empty folder), or Go's default without a go command."""
    try:
        found = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        found = ""
    return Path(found) if found else Path.home() / "go/pkg/mod"


# make test's pins-check brings the module (it lists the Kubernetes pin's packages) before the unit tests run.
UPSTREAM_TESTDATA = _go_module_cache() / "k8s.io/dynamic-resource-allocation@v0.37.2/api/metadata/testdata"


def split_stream(text: str) -> list[dict[str, Any]]:
    """The objects of a JSON stream, as a consumer (the Go ``devicemetadata`` decoder) reads them."""
    decoder = json.JSONDecoder()
    docs, i = [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return docs
        obj, i = decoder.raw_decode(text, i)
        docs.append(obj)


# --- the document -----------------------------------------------------------------------------

# What the v0.37.2 Go encoder (api/metadata/install scheme, PrettySerializer, one encoder per version,
# a newline after each) wrote for the same object on 2026-11-23; shape of upstream's
# api/metadata/testdata/HEAD/metadata.json. Go escapes <, > and & in strings.
EXPECTED_V1BETA1 = """{
  "kind": "DeviceMetadata",
  "apiVersion": "metadata.resource.k8s.io/v1beta1",
  "metadata": {
    "name": "pod-gpu-x7k2p",
    "namespace": "ns-a",
    "uid": "0b1c2d3e-0000-4000-8000-000000000000",
    "generation": 1
  },
  "podClaimName": "gpu",
  "requests": [
    {
      "name": "gpu/big",
      "devices": [
        {
          "driver": "gpu.dra-driver.io",
          "pool": "node-a",
          "name": "gpu-0",
          "attributes": {
            "driverVersion": {
              "version": "550.54.15"
            },
            "index": {
              "int": 0
            },
            "productName": {
              "string": "NVIDIA H100 \\u003c80GB\\u003e \\u0026 co"
            },
            "resource.kubernetes.io/pciBusID": {
              "string": "0000:0a:00.0"
            },
            "uuid": {
              "string": "GPU-x"
            }
          }
        },
        {
          "driver": "gpu.dra-driver.io",
          "pool": "node-a",
          "name": "gpu-1"
        }
      ]
    }
  ]
}
"""


def example_document() -> dict[str, Any]:
    attrs = {"uuid": {"string": "GPU-x"}, "index": {"int": 0}, "driverVersion": {"version": "550.54.15"},
             "resource.kubernetes.io/pciBusID": {"string": "0000:0a:00.0"},
             "productName": {"string": "NVIDIA H100 <80GB> & co"}}
    devices = [{"driver": DRIVER, "pool": NODE, "name": "gpu-0", "attributes": dict(sorted(attrs.items()))},
               {"driver": DRIVER, "pool": NODE, "name": "gpu-1"}]
    return md.build_document(MetadataClaim(UID, "ns-a", "pod-gpu-x7k2p", "gpu"), [("gpu/big", devices)])


class TestDocument:
    def test_bytes_are_what_the_go_helper_writes(self) -> None:
        stream = md.encode_stream(example_document()).decode()
        expected_alpha = EXPECTED_V1BETA1.replace("metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1")
        assert stream == EXPECTED_V1BETA1 + expected_alpha

    def test_stream_is_v1beta1_then_v1alpha1_of_one_object(self) -> None:
        docs = split_stream(md.encode_stream(example_document()).decode())
        assert [d["apiVersion"] for d in docs] == ["metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1"]
        assert docs[0] | {"apiVersion": ""} == docs[1] | {"apiVersion": ""}
        assert list(docs[0]) == ["kind", "apiVersion", "metadata", "podClaimName", "requests"]

    def test_direct_claim_has_no_pod_claim_name(self) -> None:
        doc = md.build_document(MetadataClaim(UID, "ns", "c"), [("gpu", [])])
        assert "podClaimName" not in doc
        assert doc["requests"] == [{"name": "gpu"}]  # Go omits an empty device list

    @pytest.mark.skipif(not UPSTREAM_TESTDATA.is_dir(), reason="k8s.io/dynamic-resource-allocation@v0.37.2 "
                        "is not in the Go module cache (make pins-check brings it)")
    @pytest.mark.parametrize("release", ["HEAD", "v1.36.0"])
    def test_upstream_fixtures_re_encode_byte_for_byte(self, release: str) -> None:
        raw = (UPSTREAM_TESTDATA / release / "metadata.json").read_text()
        docs = split_stream(raw)
        assert docs and all(d["kind"] == "DeviceMetadata" for d in docs)
        assert "".join(md.go_json(d) + "\n" for d in docs) == raw


class TestNames:
    def test_container_paths(self) -> None:
        direct = MetadataClaim(UID, "ns", "shared-gpu")
        templated = MetadataClaim(UID, "ns", "pod-gpu-x7k2p", "gpu")
        base = "/var/run/kubernetes.io/dra-device-attributes"
        assert md.container_path(DRIVER, direct, "gpu") == f"{base}/resourceclaims/shared-gpu/gpu/{DRIVER}-metadata.json"
        assert md.container_path(DRIVER, templated, "gpu") == \
            f"{base}/resourceclaimtemplates/gpu/gpu/{DRIVER}-metadata.json"

    def test_pod_claim_name_annotation(self) -> None:
        claim = make_claim("c", [])
        assert md.pod_claim_name(claim) is None
        claim["metadata"]["annotations"] = {md.POD_CLAIM_NAME_ANNOTATION: "gpu"}
        assert md.pod_claim_name(claim) == "gpu"
        for bad in ("../../etc", "a/b", "GPU", "x" * 64, 7, "gpu\n"):
            claim["metadata"]["annotations"] = {md.POD_CLAIM_NAME_ANNOTATION: bad}
            with pytest.raises(MetadataError, match="pod-claim-name"):
                md.pod_claim_name(claim)
        for not_annotations in (["gpu"], "gpu", 7, None):
            claim["metadata"]["annotations"] = not_annotations
            assert md.pod_claim_name(claim) is None

    @pytest.mark.parametrize("bad", ["..", "a/b", "", "Gpu", "x" * 64, "gpu\n"])
    def test_request_names_are_validated(self, bad: str) -> None:
        with pytest.raises(MetadataError, match="request name"):
            validate_request_name(bad)

    def test_cdi_spec(self, tmp_path: Path) -> None:
        spec = md.build_cdi_spec(DRIVER, UID, "gpu", tmp_path / "f.json", "/in/ctr.json")
        assert spec == {
            "cdiVersion": "0.5.0",  # the device name starts with a digit
            "kind": f"{DRIVER}/metadata",
            "devices": [{"name": f"{UID}_gpu", "containerEdits": {"mounts": [
                {"hostPath": str(tmp_path / "f.json"), "containerPath": "/in/ctr.json", "options": ["ro", "bind"]}]}}],
        }
        letter_uid = "ab1c2d3e-0000-4000-8000-000000000000"
        assert md.build_cdi_spec(DRIVER, letter_uid, "gpu", tmp_path, "/x")["cdiVersion"] == "0.3.0"


def prepared(device: str, request: str, ids: tuple[str, ...] = ()) -> PreparedDevice:
    return PreparedDevice(NODE, device, (request,), ids or (f"k8s.{DRIVER}/claim={UID}-{device}",))


class TestDecisions:
    def test_ids_go_to_the_first_device_of_each_request(self) -> None:
        devices = [prepared("gpu-0", "gpu/big"), prepared("gpu-1", "gpu/big"), prepared("gpu-2", "other")]
        out = md.with_cdi_ids(DRIVER, UID, devices)
        assert [d.cdi_device_ids[1:] for d in out] == [
            (f"{DRIVER}/metadata={UID}_gpu",), (), (f"{DRIVER}/metadata={UID}_other",)]
        assert [d.cdi_device_ids[0] for d in out] == [d.cdi_device_ids[0] for d in devices], "the claim's ID stays first"
        assert md.requests_with_metadata(DRIVER, UID, out) == {"gpu": list(out[:2]), "other": [out[2]]}
        assert md.requests_with_metadata(DRIVER, UID, devices) == {}

    def test_entries_carry_the_published_attributes(self, tmp_path: Path) -> None:
        env = Env(tmp_path)
        for name in ("gpu-0", "gpu-2-mig-0", "gpu-3-1g-0"):
            entry = md.device_entry(DRIVER, prepared(name, "gpu"), env.devices[name])
            assert entry["attributes"] == describe_device(env.devices[name])["attributes"]
            assert list(entry["attributes"]) == sorted(entry["attributes"])
        assert md.device_entry(DRIVER, prepared("gone", "gpu"), None) == {"driver": DRIVER, "pool": NODE, "name": "gone"}


# --- prepare / unprepare ----------------------------------------------------------------------


class MetaEnv(Env):
    """The prepare test bed with device metadata on (or off, for new claims)."""

    def __init__(self, tmp_path: Path, enabled: bool = True) -> None:
        self.enabled = enabled
        super().__init__(tmp_path)

    def state_options(self) -> dict[str, Any]:
        return {"metadata": MetadataFiles(self.tmp / "state", self.cdi_root, DRIVER, enabled=self.enabled)}

    @property
    def host_dir(self) -> Path:
        return self.tmp / "state" / "device-metadata"

    def meta_spec_path(self, uid: str, request: str) -> Path:
        return self.cdi_root / f"{DRIVER}_metadata_{uid}_{request}.json"

    def meta_spec(self, uid: str, request: str) -> dict[str, Any]:
        return json.loads(self.meta_spec_path(uid, request).read_text())

    def document(self, uid: str, request: str) -> list[dict[str, Any]]:
        return split_stream((self.host_dir / f"{uid}_{request}.json").read_text())

    def metadata_files(self) -> set[str]:
        names = {p.name for p in self.cdi_root.glob(f"{DRIVER}_metadata_*")} if self.cdi_root.exists() else set()
        return names | ({p.name for p in self.host_dir.iterdir()} if self.host_dir.exists() else set())


@pytest.fixture
def menv(tmp_path: Path) -> MetaEnv:
    return MetaEnv(tmp_path)


def template_claim(name: str, results: list[Any], pod_claim: str = "gpu") -> dict[str, Any]:
    claim = make_claim(name, results)
    claim["metadata"]["annotations"] = {md.POD_CLAIM_NAME_ANNOTATION: pod_claim}
    return claim


class TestPrepare:
    def test_direct_claim(self, menv: MetaEnv) -> None:
        claim = make_claim("shared", [("gpu", "gpu-0"), ("gpu", "gpu-1")])
        uid = claim["metadata"]["uid"]
        out = menv.prepare_one(claim)
        assert out.error is None
        meta_id = f"{DRIVER}/metadata={uid}_gpu"
        assert [d.cdi_device_ids for d in out.devices] == [
            (f"k8s.{DRIVER}/claim={uid}-gpu-0", meta_id), (f"k8s.{DRIVER}/claim={uid}-gpu-1",)]
        beta, alpha = menv.document(uid, "gpu")
        assert beta["apiVersion"].endswith("/v1beta1") and alpha["apiVersion"].endswith("/v1alpha1")
        assert beta["metadata"] == {"name": "shared", "namespace": "default", "uid": uid, "generation": 1}
        assert "podClaimName" not in beta
        [request] = beta["requests"]
        assert request["name"] == "gpu"
        assert [d["name"] for d in request["devices"]] == ["gpu-0", "gpu-1"]
        gpu0 = request["devices"][0]
        assert gpu0["driver"] == DRIVER and gpu0["pool"] == NODE
        assert gpu0["attributes"]["uuid"] == {"string": menv.devices["gpu-0"].gpu.uuid}
        assert gpu0["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": "0000:0a:00.0"}
        spec = menv.meta_spec(uid, "gpu")
        assert spec["kind"] == f"{DRIVER}/metadata" and [d["name"] for d in spec["devices"]] == [f"{uid}_gpu"]
        [mount] = spec["devices"][0]["containerEdits"]["mounts"]
        assert mount == {
            "hostPath": str(menv.host_dir / f"{uid}_gpu.json"),
            "containerPath": f"/var/run/kubernetes.io/dra-device-attributes/resourceclaims/shared/gpu/{DRIVER}-metadata.json",
            "options": ["ro", "bind"],
        }
        assert menv.checkpoint()[uid]["devices"][0]["cdiDeviceIDs"][1] == meta_id

    def test_a_cdi_runtime_resolves_every_id_handed_out(self, menv: MetaEnv) -> None:
        claim = make_claim("c", [("gpu", "gpu-0"), ("other", "gpu-2-mig-0")])
        out = menv.prepare_one(claim)
        assert out.error is None
        stand_in_device_nodes(menv.cdi_root, menv.tmp / "devroot")
        ids = [i for d in out.devices for i in d.cdi_device_ids]
        verdicts, injection = cdicheck.inject(menv.cdi_root, ids)  # as containerd injects them into one container
        assert cdicheck.problems(verdicts) == [] and len(verdicts) == 3 + len(ids)
        assert injection.ok, injection.error
        mounts = injection.oci["mounts"]
        assert sorted(m["destination"].split("/")[-2] for m in mounts) == ["gpu", "other"]
        assert all(m["options"] == ["ro", "bind"] and Path(m["source"]).is_file() for m in mounts)
        assert {"/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia2"} <= {d["path"] for d in injection.oci["linux"]["devices"]}

    def test_permissions(self, menv: MetaEnv) -> None:
        claim = make_claim("c", [("gpu", "gpu-0")])
        uid = claim["metadata"]["uid"]
        assert menv.prepare_one(claim).error is None
        assert stat.S_IMODE(os.stat(menv.host_dir).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(menv.host_dir / f"{uid}_gpu.json").st_mode) == 0o644
        assert stat.S_IMODE(os.stat(menv.meta_spec_path(uid, "gpu")).st_mode) == 0o644

    def test_template_claim_with_subrequest_and_two_requests(self, menv: MetaEnv) -> None:
        claim = template_claim("pod-gpus-abcde", [("gpus/big", "gpu-0"), ("extra", "gpu-2-mig-0")], pod_claim="gpus")
        uid = claim["metadata"]["uid"]
        out = menv.prepare_one(claim)
        assert out.error is None
        assert [d.cdi_device_ids[1:] for d in out.devices] == [
            (f"{DRIVER}/metadata={uid}_gpus",), (f"{DRIVER}/metadata={uid}_extra",)]
        beta = menv.document(uid, "gpus")[0]
        assert beta["podClaimName"] == "gpus"
        assert beta["requests"][0]["name"] == "gpus/big"  # the full name inside, the base name in paths
        mount = menv.meta_spec(uid, "gpus")["devices"][0]["containerEdits"]["mounts"][0]
        assert mount["containerPath"] == \
            f"/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpus/gpus/{DRIVER}-metadata.json"
        mig = menv.document(uid, "extra")[0]["requests"][0]["devices"][0]
        assert mig["attributes"]["type"] == {"string": "mig"} and mig["attributes"]["profile"] == {"string": "1g.10gb"}
        assert menv.checkpoint()[uid]["podClaimName"] == "gpus"

    def test_dynamic_mig_lists_the_created_instance(self, menv: MetaEnv) -> None:
        claim = make_claim("c", [("gpu", "gpu-3-1g-0")])
        assert menv.prepare_one(claim).error is None
        attrs = menv.document(claim["metadata"]["uid"], "gpu")[0]["requests"][0]["devices"][0]["attributes"]
        assert attrs["uuid"] == {"string": "MIG-dyn-1"}

    def test_unprepare_removes_them(self, menv: MetaEnv) -> None:
        claim = make_claim("c", [("gpu", "gpu-0"), ("other", "gpu-1")])
        ref = menv.reader.add(claim)
        assert menv.state.prepare([ref])[ref.uid].error is None
        assert len(menv.metadata_files()) == 4
        assert menv.state.unprepare([ref]) == {ref.uid: None}
        assert menv.metadata_files() == set()
        assert not menv.spec_exists(ref.uid)

    def test_bad_annotation_is_a_claim_error(self, menv: MetaEnv) -> None:
        claim = template_claim("c", [("gpu", "gpu-0")], pod_claim="../../etc")
        out = menv.prepare_one(claim)
        assert out.error is not None and "default/c" in out.error and "pod-claim-name" in out.error
        assert menv.metadata_files() == set() and not menv.spec_exists(claim["metadata"]["uid"])
        assert menv.state.prepared_claims() == {}

    def test_write_failure_is_a_claim_error_and_leaves_nothing(self, menv: MetaEnv,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
        def full(path: Path, data: bytes, mode: int, *, durable: bool = True) -> None:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))

        monkeypatch.setattr(md, "atomic_write", full)
        claim = make_claim("c", [("gpu", "gpu-0")])
        out = menv.prepare_one(claim)
        assert out.error is not None and "no space left on device while writing device metadata" in out.error
        assert menv.checkpoint() == {} and menv.metadata_files() == set()
        assert not menv.spec_exists(claim["metadata"]["uid"])


class TestSwitchedOff:
    def test_new_claims_get_none(self, tmp_path: Path) -> None:
        env = MetaEnv(tmp_path, enabled=False)
        claim = template_claim("c", [("gpu", "gpu-0")], pod_claim="../not-even-read")
        out = env.prepare_one(claim)
        assert out.error is None
        assert out.devices[0].cdi_device_ids == (f"k8s.{DRIVER}/claim={claim['metadata']['uid']}-gpu-0",)
        assert env.metadata_files() == set()

    def test_claims_prepared_with_it_are_still_served_and_cleaned_up(self, tmp_path: Path) -> None:
        env = MetaEnv(tmp_path)
        ref = env.reader.add(make_claim("c", [("gpu", "gpu-0")]))
        first = env.state.prepare([ref])[ref.uid]
        env.state.close()
        env.enabled = False
        env.meta_spec_path(ref.uid, "gpu").unlink()
        state = env.new_state()
        assert env.meta_spec_path(ref.uid, "gpu").exists(), "an ID handed out must stay resolvable"
        assert state.prepare([ref])[ref.uid] == first
        assert state.unprepare([ref]) == {ref.uid: None}
        assert env.metadata_files() == set()


# --- crashes, reboots, leftovers --------------------------------------------------------------


def crash_on_write(monkeypatch: pytest.MonkeyPatch, nth: int) -> Callable[[], int]:
    """Kill the process (in-process: raise Crash) at the nth metadata write, before it lands."""
    calls = 0

    def write(path: Path, data: bytes, mode: int, *, durable: bool = True) -> None:
        nonlocal calls
        calls += 1
        if calls == nth:
            raise Crash(str(path))
        atomic_write(path, data, mode, durable=durable)

    monkeypatch.setattr(md, "atomic_write", write)
    return lambda: calls


class TestCrashes:
    @pytest.mark.parametrize("nth", [1, 2, 3])
    def test_killed_while_writing_metadata_rolls_back(self, menv: MetaEnv, monkeypatch: pytest.MonkeyPatch,
                                                       nth: int) -> None:
        ref = menv.reader.add(make_claim("c", [("gpu", "gpu-0"), ("other", "gpu-1")]))
        crash_on_write(monkeypatch, nth)  # 1: first file, 2: its spec, 3: the second request's file
        with pytest.raises(Crash):
            menv.state.prepare([ref])
        monkeypatch.setattr(md, "atomic_write", atomic_write)
        # A SIGKILLed atomic write leaves its temporary file behind; the restart must clear it too.
        menv.host_dir.mkdir(exist_ok=True)
        (menv.host_dir / f".{ref.uid}_gpu.json.tmp-0badf00d").write_text("partial")
        (menv.cdi_root / f".{DRIVER}_metadata_{ref.uid}_gpu.json.tmp-0badf00d").write_text("partial")
        menv.state = menv.new_state()
        assert menv.state.prepared_claims() == {}
        assert menv.metadata_files() == set(), "a rolled-back claim keeps no metadata"
        out = menv.state.prepare([ref])[ref.uid]
        assert out.error is None and len(menv.metadata_files()) == 4

    @pytest.mark.parametrize("point", ["prepare.after-cdi-write", "prepare.after-completed"])
    def test_killed_after_the_specs(self, menv: MetaEnv, crashing: None, point: str) -> None:
        ref = menv.reader.add(make_claim("c", [("gpu", "gpu-0")]))
        failpoints.configure({failpoints.ENV: f"{point}=1"})
        with pytest.raises(Crash):
            menv.state.prepare([ref])
        failpoints.configure({})
        menv.state = menv.new_state()
        kept = set(menv.state.prepared_claims())
        assert kept == ({ref.uid} if point == "prepare.after-completed" else set())
        expected = {f"{ref.uid}_gpu.json", f"{DRIVER}_metadata_{ref.uid}_gpu.json"} if kept else set()
        assert menv.metadata_files() == expected

    @pytest.mark.parametrize("point", ["unprepare.after-spec-delete", "unprepare.after-checkpoint"])
    def test_killed_in_unprepare(self, menv: MetaEnv, crashing: None, point: str) -> None:
        ref = menv.reader.add(make_claim("c", [("gpu", "gpu-0")]))
        assert menv.state.prepare([ref])[ref.uid].error is None
        failpoints.configure({failpoints.ENV: f"{point}=1"})
        with pytest.raises(Crash):
            menv.state.unprepare([ref])
        failpoints.configure({})
        menv.state = menv.new_state()
        assert menv.state.unprepare([ref]) == {ref.uid: None}
        assert menv.metadata_files() == set()

    def test_reboot_rewrites_specs_and_the_new_mig_uuid(self, menv: MetaEnv) -> None:
        ref = menv.reader.add(template_claim("c", [("gpu", "gpu-3-1g-0")]))
        assert menv.state.prepare([ref])[ref.uid].error is None
        before = menv.meta_spec(ref.uid, "gpu")
        menv.state.close()
        for p in menv.cdi_root.iterdir():  # tmpfs emptied; the state dir (and the file) survive
            p.unlink()
        menv.backend.live.clear()
        menv.new_state(boot="boot-2")
        assert menv.meta_spec(ref.uid, "gpu") == before, "same mount: template path from the checkpoint"
        attrs = menv.document(ref.uid, "gpu")[0]["requests"][0]["devices"][0]["attributes"]
        assert attrs["uuid"] == {"string": "MIG-dyn-2"}

    def test_power_loss_tears_the_unsynced_files_and_the_new_boot_rewrites_them(self, menv: MetaEnv) -> None:
        # The metadata files and CDI specs are not fsynced (cdispec.DERIVED_FILES_DURABLE): a power loss
        # may leave them empty, or leave none, even in the persistent state dir. Only the checkpoint
        # is durable, and the boot after the power loss re-writes every file from it.
        ref = menv.reader.add(make_claim("c", [("gpu", "gpu-0"), ("other", "gpu-1")]))
        assert menv.state.prepare([ref])[ref.uid].error is None
        files = sorted(menv.host_dir.iterdir()) + sorted(menv.cdi_root.iterdir())
        before = {p: p.read_bytes() for p in files}
        assert len(before) == 5  # two metadata files, their two specs, the claim's spec
        menv.state.close()
        for p in files[:-1]:
            p.write_bytes(b"")
        files[-1].unlink()
        menv.state = menv.new_state(boot="boot-2")
        assert {p: p.read_bytes() for p in files} == before
        assert menv.state.prepare([ref])[ref.uid].error is None

    def test_only_the_checkpoint_is_flushed(self, menv: MetaEnv, flushes: Callable[[], list[str]]) -> None:
        first = menv.reader.add(make_claim("c", [("gpu", "gpu-0")]))
        assert menv.state.prepare([first])[first.uid].error is None  # the process's first save: a snapshot
        flushed = flushes()
        ref = menv.reader.add(make_claim("d", [("gpu", "gpu-1")]))
        assert menv.state.prepare([ref])[ref.uid].error is None
        assert flushed == ["fdatasync", "fdatasync"], "PrepareStarted and PrepareCompleted: one journal record each"
        flushed.clear()
        assert menv.state.unprepare([ref]) == {ref.uid: None}
        assert flushed == ["fdatasync"]

    def test_missing_metadata_spec_rewritten_at_start(self, menv: MetaEnv) -> None:
        ref = menv.reader.add(make_claim("c", [("gpu", "gpu-0")]))
        assert menv.state.prepare([ref])[ref.uid].error is None
        menv.meta_spec_path(ref.uid, "gpu").unlink()
        (menv.host_dir / f"{ref.uid}_gpu.json").unlink()
        menv.state.close()
        menv.new_state()
        assert menv.meta_spec_path(ref.uid, "gpu").exists() and menv.document(ref.uid, "gpu")

    def test_unprepare_of_an_unknown_claim_removes_leftovers(self, menv: MetaEnv) -> None:
        ref = menv.reader.add(make_claim("c", [("gpu", "gpu-0")]))
        assert menv.state.prepare([ref])[ref.uid].error is None
        other = MetaEnv(menv.tmp / "other")  # a state that never heard of the claim, same files
        other.state = DeviceState(
            node_name=NODE, driver_name=DRIVER, devices=other.devices, cdi=CdiSpecs(menv.cdi_root, DRIVER),
            checkpoint=CheckpointStore(other.tmp / "state", NODE, DRIVER, boot_id="b"), api=other.reader,
            metadata=MetadataFiles(menv.tmp / "state", menv.cdi_root, DRIVER))
        assert other.state.unprepare([ref]) == {ref.uid: None}
        assert menv.metadata_files() == set()

    def test_orphans_are_kept_at_start(self, menv: MetaEnv) -> None:
        ref = menv.reader.add(make_claim("c", [("gpu", "gpu-0")]))
        assert menv.state.prepare([ref])[ref.uid].error is None
        (menv.tmp / "state" / "checkpoint.json").unlink()
        menv.state = menv.new_state()
        assert menv.state.prepared_claims() == {}
        # A container may still be (re)created from them; the kubelet's Unprepare removes them.
        assert len(menv.metadata_files()) == 2
        assert MetadataFiles(menv.tmp / "state", menv.cdi_root, DRIVER).claims() == {ref.uid}


def test_flag_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    def settings(*argv: str) -> bool:
        parser = argparse.ArgumentParser()
        add_plugin_arguments(parser)
        return plugin_settings(parser.parse_args(["--node-name=n", *argv])).device_metadata

    assert settings() is True
    assert settings("--no-device-metadata") is False
    monkeypatch.setenv("DEVICE_METADATA", "false")
    assert settings() is False


def test_paths_never_leave_their_directories(tmp_path: Path) -> None:
    files = MetadataFiles(tmp_path / "state", tmp_path / "cdi", DRIVER)
    with pytest.raises(MetadataError):
        files.host_path(str(uuid.uuid4()), "../x")
    with pytest.raises(MetadataError):
        files.write(MetadataClaim(UID, "ns", "../escape"),
                    md.with_cdi_ids(DRIVER, UID, [prepared("gpu-0", "gpu")]), {})
    assert not (tmp_path / "state").exists()
