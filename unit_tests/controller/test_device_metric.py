"""The controller's device metric (``dra_driver_controller_devices{model,state}`` and
``dra_driver_controller_device_shares{model}``): counted from the controller's own inventory and
claims by the code the fleet views decide a device's state with, so it agrees with ``kubectl dra
top`` on the same cluster; recounted only when the slices or the holdings changed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ctrlfix import add_claim, allocated_status, claim, make_controller, sync
from fleetfix import A100, H100, dynamic_mig, fleet, run
from kubefake import FakeKube
from structlog.testing import capture_logs

from dra_driver.allocator.devicestates import STATES, withheld_note
from dra_driver.allocator.resolve import Engine
from dra_driver.controller import reconciler
from dra_driver.controller.reconciler import Controller
from dra_driver.k8s.client import CLAIMS, EVENTS, SLICES, ApiError


def exported(ctrl: Controller) -> tuple[dict[tuple[str, str], float], dict[str, float]]:
    """The series the controller's /metrics page holds now, as a scrape reads them."""
    from prometheus_client.parser import text_string_to_metric_families

    devices: dict[tuple[str, str], float] = {}
    shares: dict[str, float] = {}
    for fam in text_string_to_metric_families(ctrl.metrics.registry.exposition().decode()):
        for s in fam.samples:
            if s.name == "dra_driver_controller_devices":
                devices[(s.labels["model"], s.labels["state"])] = s.value
            elif s.name == "dra_driver_controller_device_shares":
                shares[s.labels["model"]] = s.value
    return devices, shares


def counted(kube: FakeKube) -> Controller:
    ctrl, _ = make_controller(kube)
    sync(ctrl)
    ctrl.count_devices()
    return ctrl


def test_devices_by_model_and_state_and_the_shares_held() -> None:
    devices, shares = exported(counted(fleet()))
    assert {k: v for k, v in devices.items() if k[0] == H100} == {
        (H100, "free"): 1, (H100, "allocated"): 1, (H100, "shared"): 1, (H100, "tainted"): 1, (H100, "blocked"): 0,
        (H100, "withheld"): 0}
    assert {k: v for k, v in devices.items() if k[0] == A100} == {(A100, s): (2 if s == "free" else 0) for s in STATES}
    assert shares == {H100: 2, A100: 0, "unknown": 0}
    # The fleet's one DeviceWithheld Event is in the words of a plugin before the model and the
    # driver were in them: a device of unknown model, counted for any driver.
    assert {k: v for k, v in devices.items() if k[0] == "unknown" and v} == {("unknown", "withheld"): 1}
    assert {m for m, _ in devices} == {H100, A100, "unknown"}, "another driver's devices are not counted"


def withheld_event(name: str, node: str, device: str, driver: str, model: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"}, "reason": "DeviceWithheld",
            "regarding": {"kind": "Node", "name": node},
            "note": withheld_note(device, driver, model, "attributes: too many (rule maxAttributes)")}


def test_withheld_devices_are_counted_by_the_model_their_events_name_for_this_driver_only() -> None:
    kube = fleet()
    kube.delete(EVENTS, "default/w1")
    kube.add(EVENTS, withheld_event("w2", "node-b", "gpu-8", "gpu.dra-driver.io", H100))
    kube.add(EVENTS, withheld_event("w3", "node-b", "gpu-9", "gpu.dra-driver.io", "NVIDIA L4"))
    kube.add(EVENTS, withheld_event("w4", "node-c", "gpu-0", "gpu.nvidia.com", H100))
    ctrl = counted(kube)
    devices, shares = exported(ctrl)
    assert devices[(H100, "withheld")] == 1 and devices[(H100, "free")] == 1
    assert {k: v for k, v in devices.items() if k[0] == "NVIDIA L4"} == {
        ("NVIDIA L4", s): (1 if s == "withheld" else 0) for s in STATES}
    assert shares["NVIDIA L4"] == 0
    # The plugin published the device again and its Event expired: counted at the next resync.
    kube.delete(EVENTS, "default/w3")
    ctrl.count_devices()
    assert "NVIDIA L4" not in {m for m, _ in exported(ctrl)[0]}


def test_an_event_outliving_its_node_or_its_fix_counts_nothing() -> None:
    """Events stay for the API server's event TTL: a deleted node's, and one whose device its node
    publishes since, name nothing withheld now; the fleet views agree."""
    kube = fleet()
    kube.add(EVENTS, withheld_event("w2", "node-gone", "gpu-1", "gpu.dra-driver.io", "NVIDIA L4"))
    kube.add(EVENTS, withheld_event("w3", "node-b", "gpu-1", "gpu.dra-driver.io", A100))
    devices, _ = exported(counted(kube))
    assert "NVIDIA L4" not in {m for m, _ in devices}
    assert devices[(A100, "withheld")] == 0 and devices[(A100, "free")] == 2
    assert devices[("unknown", "withheld")] == 1, "node-b's gpu-7 is withheld still"
    rc, out, _ = run(kube, "get", "gpus", "-o", "json")
    assert rc == 0
    assert [(d["node"], d["device"]) for d in json.loads(out)["devices"] if d["state"] == "withheld"] == [
        ("node-b", "gpu-7")]


def test_events_that_cannot_be_read_leave_the_last_withheld_count_and_are_said_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kube = fleet()
    ctrl = counted(kube)
    assert exported(ctrl)[0][("unknown", "withheld")] == 1
    real = kube.list

    def forbidden(res: Any, **kw: Any) -> Any:
        if res == EVENTS:
            raise ApiError(403, "Forbidden", 'events.events.k8s.io is forbidden: cannot list resource "events"')
        return real(res, **kw)

    monkeypatch.setattr(kube, "list", forbidden)
    add_claim(kube, {**claim("c9"), "status": allocated_status(["gpu-3"])})
    sync(ctrl)
    with capture_logs() as logs:
        ctrl.count_devices()
        ctrl.count_devices()
        devices, _ = exported(ctrl)
        assert devices[("unknown", "withheld")] == 1 and devices[(H100, "free")] == 0
        assert ctrl.metrics.value("errors_total", {"kind": "withheld_events"}) == 2
        monkeypatch.setattr(kube, "list", real)
        ctrl.count_devices()
    said = [e["event"] for e in logs if "DeviceWithheld" in e["event"]]
    assert said == [("cannot read the DeviceWithheld Events: the device metric counts the withheld devices last read "
                     "until it can"),
                    "the DeviceWithheld Events can be read again"], said


def test_the_metric_agrees_with_kubectl_dra_top_on_the_same_cluster() -> None:
    kube = fleet()
    devices, _ = exported(counted(kube))
    rc, out, _ = run(kube, "top", "-o", "json")
    assert rc == 0
    for row in json.loads(out)["models"]:
        model = row["model"]
        assert sum(v for (m, _), v in devices.items() if m == model) == row["total"], model
        for state in ("free", "allocated", "shared"):
            assert devices[(model, state)] == row[state], (model, state)


def test_dynamic_mig_partitions_not_made_are_not_devices_and_a_taken_gpu_is_blocked() -> None:
    kube = dynamic_mig()
    devices, _ = exported(counted(kube))
    rc, out, _ = run(kube, "top", "-o", "json")
    top = {r["model"]: r for r in json.loads(out)["models"]}
    assert rc == 0 and {m for m, _ in devices} == set(top)
    (gpu_model,) = [m for m in top if "mig" not in m.lower() and "g." not in m]
    assert devices[(gpu_model, "blocked")] == 1, "the GPU under the partition"
    (mig_model,) = [m for m in top if m.endswith("3g.40gb")]
    assert devices[(mig_model, "allocated")] == 1 and sum(v for (m, _), v in devices.items() if m == mig_model) == 1


def test_a_change_is_counted_at_the_next_count_and_a_model_gone_stops_being_exported() -> None:
    kube = fleet()
    ctrl = counted(kube)
    kube.delete(CLAIMS, "default/c1")
    kube.delete(SLICES, "node-b-gpu.dra-driver.io")
    sync(ctrl)
    ctrl.count_devices()
    devices, shares = exported(ctrl)
    assert devices[(H100, "free")] == 2 and devices[(H100, "allocated")] == 0
    assert A100 not in {m for m, _ in devices} and A100 not in shares


def test_nothing_changed_is_not_counted_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = reconciler.device_census

    def spy(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(reconciler, "device_census", spy)
    kube = fleet()
    ctrl = counted(kube)
    ctrl.count_devices()
    assert len(calls) == 1
    add_claim(kube, {**claim("c9"), "status": allocated_status(["gpu-3"])})
    sync(ctrl)
    ctrl.count_devices()
    assert len(calls) == 2 and exported(ctrl)[0][(H100, "free")] == 0


def test_an_inventory_that_cannot_be_built_is_an_error_counted_not_a_crash() -> None:
    class Broken(Engine):
        def build_inventory(self, *args: Any, **kw: Any) -> Any:
            raise RuntimeError("boom")

    ctrl, _ = make_controller(fleet(), engine=Broken())
    sync(ctrl)
    ctrl.count_devices()
    assert ctrl.metrics.value("errors_total", {"kind": "device_count"}) == 1
    assert exported(ctrl) == ({}, {})
