"""Fuzzing the DRA gRPC service: a real PluginServers on a temporary Unix socket, backed by a real
DeviceState whose ResourceClaims come from a fake reader.

Whatever the kubelet sends (no claims, duplicate UIDs, thousands of claims, huge strings, names and
UIDs with ``/``, ``..`` or NUL): every claim UID gets an entry, errors are plain sentences, answers
come in bounded time, and no file appears outside the CDI root and the state directory.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from fuzzing import NASTY, examples, json_values
from hypothesis import given, settings
from hypothesis import strategies as st
from nodefix import FakeBackend, build_devices

from dra_driver._proto.dra.v1 import api_pb2 as v1
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver._proto.dra.v1beta1 import api_pb2 as v1beta1
from dra_driver._proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from dra_driver.k8s.client import ApiError, Resource
from dra_driver.node.kubelet.grpc import PluginServers
from dra_driver.node.prepare.cdi import CdiSpecs
from dra_driver.node.prepare.checkpoint import CheckpointStore
from dra_driver.node.prepare.state import DeviceState

DRIVER = "gpu.dra-driver.io"
NODE = "node-a"
DEVICE_NAMES = sorted(build_devices())
CALL_BUDGET_S = 20.0
TRACEBACK_MARKERS = ("Traceback", 'File "', "line ", "raise ")


@dataclass
class FuzzReader:
    """ResourceClaims keyed by (namespace, name): a dict, or an exception to raise."""

    claims: dict[tuple[str, str], Any] = field(default_factory=dict)

    def get(self, res: Resource, name: str, *, namespace: str | None = None,
            meanwhile: Callable[[], object] | None = None) -> dict[str, Any]:
        if meanwhile is not None:
            meanwhile()
        value = self.claims.get((namespace, name))
        if value is None:
            raise ApiError(404, "NotFound", f"{namespace}/{name}")
        if isinstance(value, Exception):
            raise value
        return json.loads(json.dumps(value)) if isinstance(value, dict) else value


@dataclass
class Rig:
    root: Path
    cdi: Path
    state_dir: Path
    reader: FuzzReader
    state: DeviceState
    servers: PluginServers
    v1: Any
    v1beta1: Any

    def tree(self) -> set[str]:
        out = set()
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in dirnames + filenames:
                out.add(os.path.relpath(os.path.join(dirpath, name), self.root))
        return out


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    # Short (Unix socket paths are limited) and nested, so that any ".." escape still lands inside root.
    root = Path(tempfile.mkdtemp(prefix="fz", dir="/tmp"))
    base = root / "a" / "b"
    cdi, state_dir = base / "cdi", base / "state"
    reader = FuzzReader()
    state = DeviceState(node_name=NODE, driver_name=DRIVER, devices=build_devices(),
                        cdi=CdiSpecs(cdi, DRIVER, base / "dev", node_name=NODE),
                        checkpoint=CheckpointStore(state_dir, NODE, DRIVER, boot_id="boot"),
                        api=reader, backend=FakeBackend(), proc_root=None)
    servers = PluginServers(driver_name=DRIVER, node_name=NODE, dra_socket=base / "s" / "dra.sock",
                            registration_socket=base / "r" / "reg.sock", handler=state)
    servers.start()
    channel = grpc.insecure_channel(f"unix:{servers.dra_socket}",
                                    options=[("grpc.max_receive_message_length", 64 << 20)])
    try:
        yield Rig(root, cdi, state_dir, reader, state, servers, v1_grpc.DRAPluginStub(channel),
                  v1beta1_grpc.DRAPluginStub(channel))
    finally:
        channel.close()
        servers.stop(0)
        state.close()
        shutil.rmtree(root, ignore_errors=True)


def allowed_new_path(rel: str) -> bool:
    """Only the CDI root's specs and the state directory's files may appear."""
    parts = rel.split(os.sep)
    if parts[:3] == ["a", "b", "cdi"]:
        return len(parts) == 3 or (len(parts) == 4 and parts[3].startswith(f"k8s.{DRIVER}-claim_"))
    return parts[:3] == ["a", "b", "state"]


def allocated_claim(ns: str, name: str, uid: str, device: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name, "uid": uid},
            "status": {"allocation": {
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
                "devices": {"results": [{"driver": DRIVER, "pool": NODE, "device": device, "request": "r"}],
                            "config": [], **(extra or {})}}}}


STRINGS = st.one_of(NASTY, st.text(max_size=30), st.just("x" * 100_000), st.just("../" * 50 + "etc/passwd"),
                    st.builds(lambda: str(uuid.uuid4())))
BEHAVIOUR = st.sampled_from(["valid", "missing", "wrong-uid", "garbage", "raise", "foreign-node", "bad-device"])


@st.composite
def claim_batches(draw: st.DrawFn) -> list[tuple[str, str, str, str, Any]]:
    """(namespace, name, uid, behaviour, garbage) per claim; duplicates on purpose."""
    n = draw(st.integers(0, 12))
    batch = []
    for _ in range(n):
        batch.append((draw(STRINGS), draw(STRINGS), draw(STRINGS), draw(BEHAVIOUR), draw(json_values(8))))
    if batch and draw(st.booleans()):
        batch.append(batch[0])  # the same UID twice in one request
    if len(batch) > 1 and draw(st.booleans()):
        ns, name, _, behaviour, junk = batch[1]
        batch.append((ns, name, batch[0][2], behaviour, junk))  # a different claim with a repeated UID
    return batch


def install(rig: Rig, batch: list[tuple[str, str, str, str, Any]], device_pick: int) -> None:
    rig.reader.claims.clear()
    for i, (ns, name, uid, behaviour, junk) in enumerate(batch):
        device = DEVICE_NAMES[(device_pick + i) % len(DEVICE_NAMES)]
        key = (ns, name)
        if behaviour == "valid":
            rig.reader.claims[key] = allocated_claim(ns, name, uid, device)
        elif behaviour == "wrong-uid":
            rig.reader.claims[key] = allocated_claim(ns, name, str(uuid.uuid4()), device)
        elif behaviour == "garbage":
            rig.reader.claims[key] = junk if isinstance(junk, dict) else {"metadata": junk, "status": junk}
        elif behaviour == "raise":
            rig.reader.claims[key] = RuntimeError(f"API server said no to {name[:20]!r}")
        elif behaviour == "foreign-node":
            claim = allocated_claim(ns, name, uid, device)
            claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] = ["x"]
            rig.reader.claims[key] = claim
        elif behaviour == "bad-device":
            rig.reader.claims[key] = allocated_claim(ns, name, uid, junk if isinstance(junk, str) else "../../x")


def check_errors(errors: list[str]) -> None:
    for error in errors:
        assert error.strip(), "an error must say something"
        for marker in TRACEBACK_MARKERS[:2]:
            assert marker not in error, f"traceback text in {error[:300]!r}"


def call(rig: Rig, batch: list[tuple[str, str, str, str, Any]], beta: bool) -> None:
    pb, stub = (v1beta1, rig.v1beta1) if beta else (v1, rig.v1)
    claims = [pb.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid, _, _ in batch]
    uids = {c.uid for c in claims}
    start = time.monotonic()
    prepared = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=claims), timeout=CALL_BUDGET_S)
    assert time.monotonic() - start < CALL_BUDGET_S
    assert set(prepared.claims) == uids
    check_errors([r.error for r in prepared.claims.values() if r.error])
    for uid, result in prepared.claims.items():
        if not result.error:
            for dev in result.devices:
                assert dev.pool_name == NODE and dev.device_name in DEVICE_NAMES
                assert all(i.startswith(f"k8s.{DRIVER}/claim=") for i in dev.cdi_device_ids)
            assert uid in rig.state.prepared_claims() or not result.devices
    start = time.monotonic()
    unprepared = stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=claims), timeout=CALL_BUDGET_S)
    assert time.monotonic() - start < CALL_BUDGET_S
    assert set(unprepared.claims) == uids
    check_errors([r.error for r in unprepared.claims.values() if r.error])
    assert not uids & set(rig.state.prepared_claims()), "unprepare must forget every claim it answered"


@settings(max_examples=examples(0.75), deadline=None)
@given(claim_batches(), st.integers(0, 100), st.booleans())
def test_prepare_unprepare_hostile_batches(rig: Rig, batch: list[tuple[str, str, str, str, Any]], pick: int,
                                           beta: bool) -> None:
    before = rig.tree()
    install(rig, batch, pick)
    call(rig, batch, beta)
    new = rig.tree() - before
    assert all(allowed_new_path(p) for p in new), sorted(p for p in new if not allowed_new_path(p))
    assert not list(rig.cdi.glob("*")), "unprepare must leave no CDI spec behind"


def test_empty_requests(rig: Rig) -> None:
    assert not rig.v1.NodePrepareResources(v1.NodePrepareResourcesRequest(), timeout=5).claims
    assert not rig.v1.NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(), timeout=5).claims
    assert not rig.v1beta1.NodePrepareResources(v1beta1.NodePrepareResourcesRequest(), timeout=5).claims


def test_thousands_of_claims_in_one_request(rig: Rig) -> None:
    batch = []
    for i in range(3000):
        behaviour = ("valid", "missing", "garbage", "wrong-uid")[i % 4]
        batch.append(("ns", f"claim-{i}", str(uuid.uuid4()), behaviour, {"status": [i]}))
    batch += batch[:500]  # and duplicates
    install(rig, batch, 0)
    start = time.monotonic()
    call(rig, batch, beta=False)
    elapsed = time.monotonic() - start
    assert elapsed < 2 * CALL_BUDGET_S, f"3000 claims took {elapsed:.1f}s"


def test_nul_slash_and_dotdot_uids_never_reach_a_path(rig: Rig) -> None:
    before = rig.tree()
    batch = [("ns", f"c{i}", uid, "valid", None) for i, uid in enumerate(
        ["../../../../evil", "a/b", "\x00", "..", "/", str(uuid.uuid4()).upper(), str(uuid.uuid4()) + "/..",
         "k8s.gpu.dra-driver.io-claim_x"])]
    install(rig, batch, 0)
    response = rig.v1.NodePrepareResources(v1.NodePrepareResourcesRequest(
        claims=[v1.Claim(namespace=n, name=m, uid=u) for n, m, u, _, _ in batch]), timeout=10)
    for _, _, uid, _, _ in batch:
        assert "not a lower-case RFC 4122 UUID" in response.claims[uid].error
    assert rig.tree() - before <= {"a/b/state/checkpoint.json"} | {p for p in rig.tree() if p.startswith("a/b/state")}


def test_socket_and_state_permissions(rig: Rig) -> None:
    """The DRA and registration sockets are 0600; the checkpoint 0600 in a 0700 directory."""
    for sock in (rig.servers.dra_socket, rig.servers.registration_socket):
        st_ = os.lstat(sock)
        assert stat.S_ISSOCK(st_.st_mode) and stat.S_IMODE(st_.st_mode) == 0o600, (sock, oct(st_.st_mode))
    ns, name, uid = "ns", "perm", str(uuid.uuid4())
    rig.reader.claims[(ns, name)] = allocated_claim(ns, name, uid, "gpu-1")
    response = rig.v1.NodePrepareResources(v1.NodePrepareResourcesRequest(
        claims=[v1.Claim(namespace=ns, name=name, uid=uid)]), timeout=10)
    try:
        assert not response.claims[uid].error, response.claims[uid].error
        assert stat.S_IMODE(os.stat(rig.state_dir).st_mode) == 0o700
        files = [p for p in rig.state_dir.iterdir() if p.is_file()]
        assert files, "no checkpoint written"
        for path in files:
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, (path, oct(os.stat(path).st_mode))
        # The CDI spec path is built from the validated UID and nothing else.
        specs = [p.name for p in rig.cdi.iterdir()]
        assert specs == [f"k8s.{DRIVER}-claim_{uid}.json"]
    finally:
        rig.v1.NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(
            claims=[v1.Claim(namespace=ns, name=name, uid=uid)]), timeout=10)
