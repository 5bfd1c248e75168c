"""status.devices of prepared claims: what is written, that only this driver's entries change, and
that a failed write is retried without ever failing the prepare."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubefake import FakeKube
from nodefix import DRIVER, NODE, FakeBackend, build_devices, make_claim

from dra_driver.k8s.client import CLAIMS, ApiError
from dra_driver.node.discovery.model import MigDevice, MigPlacement
from dra_driver.node.prepare.calls import ClaimRef
from dra_driver.node.prepare.cdi import CdiSpecs
from dra_driver.node.prepare.checkpoint import CheckpointStore
from dra_driver.node.prepare.claimstatus import ClaimStatusWriter, ReportingHandler, apply_body, device_data, device_statuses
from dra_driver.node.prepare.entries import ClaimEntry, ClaimState, DeviceKind, PreparedDevice
from dra_driver.node.prepare.state import DeviceState

DEVICES = build_devices()
OTHER = {"driver": "nic.example.com", "pool": NODE, "device": "nic-0", "data": {"mac": "aa"}}


def prepared(device: str, **kw: Any) -> PreparedDevice:
    d = DEVICES[device]
    uuid = kw.pop("uuid", d.mig.uuid if d.mig else d.gpu.uuid)
    return PreparedDevice(pool=NODE, device=device, requests=("gpu",), cdi_device_ids=(f"k8s.{DRIVER}/claim=x-{device}",),
                          uuid=uuid, gpu_uuid=d.gpu.uuid, kind=DeviceKind(d.kind), **kw)


def test_data_of_a_full_gpu_a_static_and_a_dynamic_mig_device() -> None:
    assert device_data(prepared("gpu-0"), DEVICES["gpu-0"]) == {
        "uuid": DEVICES["gpu-0"].gpu.uuid, "productName": "NVIDIA H100", "memory": "80Gi"}
    static = device_data(prepared("gpu-2-mig-1"), DEVICES["gpu-2-mig-1"])
    assert static == {"uuid": "MIG-2-1", "productName": "NVIDIA H100", "memory": "10Gi", "migProfile": "1g.10gb",
                      "parentUUID": DEVICES["gpu-2"].gpu.uuid, "gpuInstanceID": 8, "computeInstanceID": 0}
    inst = MigDevice(uuid="MIG-created-7", profile="1g.10gb", parent_uuid=DEVICES["gpu-3"].gpu.uuid,
                     memory_bytes=10 * 2**30, multiprocessors=16, gpu_instance_id=9, compute_instance_id=0,
                     placement=MigPlacement(1, 1))
    dynamic = device_data(prepared("gpu-3-1g-1", mig_instance=inst, uuid=inst.uuid), DEVICES["gpu-3-1g-1"])
    assert dynamic["uuid"] == dynamic["migUUID"] == "MIG-created-7"  # the instance created for the claim
    assert dynamic["migProfile"] == "1g.10gb" and dynamic["gpuInstanceID"] == 9 and dynamic["memory"] == "10Gi"
    assert dynamic["parentUUID"] == DEVICES["gpu-3"].gpu.uuid


def test_statuses_have_a_ready_condition_and_the_share_id() -> None:
    entry = ClaimEntry(uid="u1", namespace="ns", name="c", state=ClaimState.PREPARE_COMPLETED,
                       devices=(prepared("gpu-0"), prepared("gpu-1", share_id="s-1")),
                       updated="2026-11-23T10:00:00.123456Z")
    out = device_statuses(DRIVER, NODE, entry, DEVICES)
    assert [(s["driver"], s["pool"], s["device"], s.get("shareID")) for s in out] == [
        (DRIVER, NODE, "gpu-0", None), (DRIVER, NODE, "gpu-1", "s-1")]
    (cond,) = out[0]["conditions"]
    assert cond == {"type": "Ready", "status": "True", "reason": "Prepared",
                    "message": f"prepared on node {NODE}: k8s.{DRIVER}/claim=x-gpu-0",
                    "lastTransitionTime": "2026-11-23T10:00:00Z"}
    body = apply_body("u1", "ns", "c", out)
    assert body["metadata"] == {"name": "c", "namespace": "ns", "uid": "u1"} and body["status"]["devices"] == out
    assert apply_body("u1", "ns", "c", [])["status"] == {}


class Bed:
    def __init__(self, tmp: Path) -> None:
        self.kube = FakeKube()
        self.state = DeviceState(node_name=NODE, driver_name=DRIVER, devices=DEVICES,
                                 cdi=CdiSpecs(tmp / "cdi", DRIVER, tmp / "devroot", node_name=NODE),
                                 checkpoint=CheckpointStore(tmp / "state", NODE, DRIVER, boot_id="b"),
                                 api=self.kube, backend=FakeBackend(), proc_root=None)
        self.writer = ClaimStatusWriter(self.kube, DRIVER, NODE, retry_base=0.01, retry_max=0.05)
        self.handler = ReportingHandler(self.state, self.writer, DEVICES)

    def claim(self, name: str, devices: list[str], other_driver: bool = True) -> ClaimRef:
        c = make_claim(name, [("gpu", d) for d in devices])
        if other_driver:  # another driver's device in the same claim, with its own status entry
            c["status"]["allocation"]["devices"]["results"].append({"request": "nic", **{k: OTHER[k] for k in
                                                                                         ("driver", "pool", "device")}})
            c["status"]["devices"] = [dict(OTHER)]
        self.kube.add(CLAIMS, c)
        m = c["metadata"]
        return ClaimRef(m["uid"], m["namespace"], m["name"])

    def devices(self, ref: ClaimRef) -> list[dict[str, Any]]:
        obj = self.kube.obj(CLAIMS, f"{ref.namespace}/{ref.name}")
        assert obj is not None
        return list(obj.get("status", {}).get("devices") or [])


@pytest.fixture
def bed(tmp_path: Path) -> Bed:
    return Bed(tmp_path)


def test_prepare_sets_and_unprepare_clears_only_our_entries(bed: Bed) -> None:
    ref = bed.claim("c", ["gpu-0", "gpu-2-mig-0"])
    assert bed.handler.prepare([ref])[ref.uid].ok
    assert bed.writer.pending() == [ref.uid]
    assert bed.kube.writes("apply_status") == []  # the kubelet's answer did not wait for it
    assert bed.writer.write(ref.uid) and bed.writer.pending() == []
    got = {d["device"]: d for d in bed.devices(ref)}
    assert set(got) == {"nic-0", "gpu-0", "gpu-2-mig-0"} and got["nic-0"] == OTHER
    assert got["gpu-0"]["data"]["uuid"] == DEVICES["gpu-0"].gpu.uuid
    assert got["gpu-2-mig-0"]["data"]["uuid"] == "MIG-2-0" and got["gpu-0"]["conditions"][0]["type"] == "Ready"
    assert bed.handler.unprepare([ref]) == {ref.uid: None}
    assert bed.writer.write(ref.uid)
    assert bed.devices(ref) == [OTHER]


def test_dynamic_mig_status_carries_the_created_instance(bed: Bed) -> None:
    ref = bed.claim("c", ["gpu-3-1g-1"], other_driver=False)
    assert bed.handler.prepare([ref])[ref.uid].ok
    bed.writer.write(ref.uid)
    (status,) = bed.devices(ref)
    created = bed.state.prepared_claims()[ref.uid].devices[0].mig_instance
    assert created is not None and status["data"]["migUUID"] == status["data"]["uuid"] == created.uuid


def test_a_failed_prepare_writes_nothing(bed: Bed) -> None:
    ref = bed.claim("c", ["gpu-99"], other_driver=False)
    assert not bed.handler.prepare([ref])[ref.uid].ok
    assert bed.writer.pending() == []


def test_a_failed_write_is_retried_and_never_fails_the_prepare(bed: Bed) -> None:
    ref = bed.claim("c", ["gpu-0"], other_driver=False)
    bed.kube.fail["apply_status:resourceclaims"] = ApiError(403, "Forbidden", "resourceclaims/driver is forbidden")
    assert bed.handler.prepare([ref])[ref.uid].ok
    assert not bed.writer.write(ref.uid) and bed.writer.pending() == [ref.uid]
    del bed.kube.fail["apply_status:resourceclaims"]  # the admin fixed the RBAC
    stop = threading.Event()
    bed.writer.start(stop)
    try:
        deadline = time.monotonic() + 10
        while bed.writer.pending() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bed.writer.pending() == [] and [d["device"] for d in bed.devices(ref)] == ["gpu-0"]
    finally:
        stop.set()


def test_unprepare_overtaking_a_pending_write_only_clears(bed: Bed) -> None:
    ref = bed.claim("c", ["gpu-0"])
    bed.handler.prepare([ref])
    bed.handler.unprepare([ref])
    assert bed.writer.write(ref.uid)
    assert len(bed.kube.writes("apply_status")) == 1 and bed.devices(ref) == [OTHER]


@pytest.mark.parametrize("gone", ["deleted", "replaced"])
def test_a_claim_that_is_gone_or_replaced_is_given_up(bed: Bed, gone: str) -> None:
    ref = bed.claim("c", ["gpu-0"], other_driver=False)
    bed.handler.prepare([ref])
    bed.kube.delete(CLAIMS, "c", namespace="default")
    if gone == "replaced":  # same name, new UID: its status must not get the old claim's devices
        bed.claim("c", ["gpu-0"], other_driver=False)
    assert bed.writer.write(ref.uid) and bed.writer.pending() == []
    if gone == "replaced":
        assert bed.devices(ref) == []


def test_restart_writes_the_checkpointed_claims_again(bed: Bed, tmp_path: Path) -> None:
    ref = bed.claim("c", ["gpu-1"], other_driver=False)
    bed.handler.prepare([ref])  # and the process dies before the write
    again = Bed(tmp_path)
    again.kube = bed.kube
    again.writer = ClaimStatusWriter(bed.kube, DRIVER, NODE)
    again.handler = ReportingHandler(again.state, again.writer, DEVICES)
    again.handler.report_recovered()
    assert again.writer.pending() == [ref.uid] and again.writer.write(ref.uid)
    assert [d["device"] for d in again.devices(ref)] == ["gpu-1"]


def test_the_write_waits_until_the_kubelets_calls_have_settled(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    bed.writer = ClaimStatusWriter(bed.kube, DRIVER, NODE, settle=0.3)
    bed.handler = ReportingHandler(bed.state, bed.writer, DEVICES)
    stop = threading.Event()
    bed.writer.start(stop)
    try:
        refs = [bed.claim(f"c{i}", [f"gpu-{i}"], other_driver=False) for i in range(2)]
        started = time.monotonic()
        for ref in refs:
            assert bed.handler.prepare([ref])[ref.uid].ok
        time.sleep(0.1)
        assert bed.kube.writes("apply_status") == [], "no API write while the calls are being answered"
        while bed.writer.pending() and time.monotonic() < started + 10:
            time.sleep(0.01)
        assert time.monotonic() - started >= 0.3
        assert all(bed.devices(ref) for ref in refs)
    finally:
        stop.set()


def test_the_idle_hook_runs_once_the_writes_of_a_burst_are_done(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    idle: list[int] = []
    bed.writer = ClaimStatusWriter(bed.kube, DRIVER, NODE, settle=0.1,
                                   on_idle=lambda: idle.append(len(bed.kube.writes("apply_status"))))
    bed.handler = ReportingHandler(bed.state, bed.writer, DEVICES)
    stop = threading.Event()
    bed.writer.start(stop)
    try:
        refs = [bed.claim(f"c{i}", [f"gpu-{i}"], other_driver=False) for i in range(3)]
        assert all(o.ok for o in bed.handler.prepare(refs).values())
        deadline = time.monotonic() + 10
        while not idle and time.monotonic() < deadline:
            time.sleep(0.01)
        assert idle and idle[0] == 3, "called after the last write of the burst, not between them"
    finally:
        stop.set()
