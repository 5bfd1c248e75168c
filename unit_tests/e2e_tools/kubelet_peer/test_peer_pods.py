"""The pod loop against fake API server and driver objects (no cluster, no gRPC)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.kubelet_peer.model import ClaimRef, ClaimResult, DriverCallError, PreparedDevice
from e2e.kubelet_peer.pods import (
    CONTAINERS_ANNOTATION,
    PREPARED_CONDITION,
    REASON_CDI_FAILED,
    REASON_PREPARE_FAILED,
    PodController,
    Retry,
    backoff_delay,
    check_prepare_response,
    claim_not_ready,
)
from e2e.kubelet_peer.state import PeerState

DRIVER = "gpu.example.com"


class FakeKube:
    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.pod_patches: list[tuple[str, dict[str, Any]]] = []
        self.status_patches: list[tuple[str, dict[str, Any]]] = []
        self.events: list[tuple[str, str, str]] = []
        self.deleted: list[tuple[str, str, str]] = []

    def list_pods(self, node: str) -> tuple[list[dict[str, Any]], str]:
        return [], "1"

    def watch_pods(self, node: str, resource_version: str, timeout_s: int) -> Any:
        return iter(())

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.claims.get((namespace, name))

    def patch_pod(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.pod_patches.append((name, body))

    def patch_pod_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.status_patches.append((name, body))

    def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        self.deleted.append((namespace, name, uid))

    def create_pod_event(self, pod: dict[str, Any], reason: str, message: str, node: str, type_: str) -> None:
        self.events.append((pod["metadata"]["name"], reason, message))


class FakeDrivers:
    def __init__(self) -> None:
        self.prepare_calls: list[list[str]] = []
        self.unprepare_calls: list[list[str]] = []
        self.prepare_error = ""
        self.unprepare_error = ""
        self.unreachable = False

    def prepare(self, driver: str, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        if self.unreachable:
            raise DriverCallError("connection refused")
        self.prepare_calls.append([c.name for c in claims])
        return {
            c.uid: ClaimResult(
                devices=[
                    PreparedDevice("node", "gpu-0", ("gpu",), (f"example.com/gpu={c.uid}-0",)),
                    PreparedDevice("node", "gpu-1", ("other",), (f"example.com/gpu={c.uid}-1",)),
                ],
                error=self.prepare_error,
            )
            for c in claims
        }

    def unprepare(self, driver: str, claims: Sequence[ClaimRef]) -> dict[str, str]:
        self.unprepare_calls.append([c.name for c in claims])
        return {c.uid: self.unprepare_error for c in claims}


def make_claim(name: str, uid: str, reserved_for: list[str], allocated: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = {"reservedFor": [{"resource": "pods", "name": "x", "uid": u} for u in reserved_for]}
    if allocated:
        status["allocation"] = {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "node", "device": "gpu-0"}]}}
    return {"metadata": {"namespace": "ns", "name": name, "uid": uid}, "status": status}


def make_pod(name: str, uid: str, claim: str = "shared") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": uid},
        "spec": {
            "nodeName": "n1",
            "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}],
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "env": [{"name": "A", "value": "1"}],
                    "resources": {"claims": [{"name": "gpus", "request": "gpu"}]},
                },
                {"name": "side", "image": "busybox"},
            ],
        },
        "status": {"phase": "Pending"},
    }


def write_cdi(cdi_dir: Path, claim_uid: str) -> None:
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "example.com/gpu",
        "devices": [
            {
                "name": f"{claim_uid}-{i}",
                "containerEdits": {
                    "env": [f"GPU_{i}=yes"],
                    "deviceNodes": [{"path": f"/dev/gpu{i}", "hostPath": f"/dev/gpu{i}"}],
                },
            }
            for i in (0, 1)
        ],
    }
    (cdi_dir / f"example.com-gpu_{claim_uid}.yaml").write_text(yaml.safe_dump(spec))


@pytest.fixture
def env(tmp_path: Path) -> tuple[PodController, FakeKube, FakeDrivers, PeerState]:
    kube, drivers = FakeKube(), FakeDrivers()
    state = PeerState(tmp_path / "state" / "peer-state.json")
    (tmp_path / "cdi").mkdir()
    write_cdi(tmp_path / "cdi", "claim-uid")
    ctl = PodController(kube, drivers, state, "n1", tmp_path / "cdi")
    return ctl, kube, drivers, state


def add(ctl: PodController, pod: dict[str, Any]) -> None:
    ctl.apply_event("ADDED", pod)


def test_prepare_inject_and_run(env: Any) -> None:
    ctl, kube, drivers, state = env
    kube.claims[("ns", "shared")] = make_claim("shared", "claim-uid", ["p1"])
    pod = make_pod("a", "p1")
    add(ctl, pod)
    ctl.sync(pod)
    assert drivers.prepare_calls == [["shared"]]
    _name, body = kube.pod_patches[-1]
    containers = json.loads(body["metadata"]["annotations"][CONTAINERS_ANNOTATION])
    assert containers["main"] == {
        "env": {"A": "1", "GPU_0": "yes"},
        "devices": [{"path": "/dev/gpu0", "hostPath": "/dev/gpu0"}],
        "mounts": [],
        "cdiDevices": ["example.com/gpu=claim-uid-0"],
    }
    assert containers["side"]["cdiDevices"] == []
    status = kube.status_patches[-1][1]["status"]
    assert status["phase"] == "Running"
    conds = {c["type"]: c["status"] for c in status["conditions"]}
    assert conds[PREPARED_CONDITION] == conds["Ready"] == conds["ContainersReady"] == conds["Initialized"] == "True"
    assert [s["name"] for s in status["containerStatuses"]] == ["main", "side"]
    assert all("running" in s["state"] and s["ready"] for s in status["containerStatuses"])
    # The record survives a restart of the peer.
    reloaded = PeerState(state.path)
    reloaded.load()
    rec = reloaded.claims["claim-uid"]
    assert rec.pods == {"p1"} and rec.drivers[DRIVER].prepared
    assert rec.drivers[DRIVER].devices[0].cdi_device_ids == ("example.com/gpu=claim-uid-0",)


def test_shared_claim_prepared_once_and_unprepared_after_last_pod(env: Any) -> None:
    ctl, kube, drivers, _ = env
    kube.claims[("ns", "shared")] = make_claim("shared", "claim-uid", ["p1", "p2"])
    p1, p2 = make_pod("a", "p1"), make_pod("b", "p2")
    for p in (p1, p2):
        add(ctl, p)
        ctl.sync(p)
    assert drivers.prepare_calls == [["shared"]]

    p1["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    ctl.apply_event("MODIFIED", p1)
    ctl.sync(p1)
    assert drivers.unprepare_calls == []
    assert kube.deleted == [("ns", "a", "p1")]
    ctl.apply_event("DELETED", p1)

    p2["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    ctl.apply_event("MODIFIED", p2)
    ctl.sync(p2)
    assert drivers.unprepare_calls == [["shared"]]
    assert kube.deleted[-1] == ("ns", "b", "p2")
    assert ctl._state.claims == {}


def test_prepare_error_is_shown_on_pod_and_retried(env: Any) -> None:
    ctl, kube, drivers, state = env
    kube.claims[("ns", "shared")] = make_claim("shared", "claim-uid", ["p1"])
    drivers.prepare_error = "GPU on fire"
    pod = make_pod("a", "p1")
    add(ctl, pod)
    ctl._queue.get(timeout=0)  # drain the ADDED key so the retry is observable
    ctl.process("p1")
    ctl.process("p1")  # same message: no second event
    assert len(kube.events) == 1
    assert kube.events[0][1] == REASON_PREPARE_FAILED and "GPU on fire" in kube.events[0][2]
    cond = kube.status_patches[0][1]["status"]["conditions"][0]
    assert cond["type"] == PREPARED_CONDITION and cond["status"] == "False" and "GPU on fire" in cond["message"]
    assert ctl._failures["p1"] == 2
    # Recorded before the call, not marked prepared: the next attempt calls the driver again.
    assert state.claims["claim-uid"].pods == {"p1"} and not state.claims["claim-uid"].drivers[DRIVER].prepared
    drivers.prepare_error = ""
    ctl.process("p1")
    assert "p1" not in ctl._failures
    assert drivers.prepare_calls == [["shared"]] * 3


def test_driver_unreachable_is_retried(env: Any) -> None:
    ctl, kube, drivers, _ = env
    kube.claims[("ns", "shared")] = make_claim("shared", "claim-uid", ["p1"])
    drivers.unreachable = True
    pod = make_pod("a", "p1")
    add(ctl, pod)
    with pytest.raises(Retry, match="connection refused"):
        ctl.sync(pod)


@pytest.mark.parametrize(
    ("claim", "why"),
    [
        (make_claim("shared", "claim-uid", ["p1"], allocated=False), "not allocated"),
        (make_claim("shared", "claim-uid", ["other"]), "not reserved"),
        (None, "not found"),
    ],
)
def test_claim_not_ready_waits(env: Any, claim: dict[str, Any] | None, why: str) -> None:
    ctl, kube, drivers, _ = env
    if claim:
        kube.claims[("ns", "shared")] = claim
    pod = make_pod("a", "p1")
    with pytest.raises(Retry, match=why):
        ctl.sync(pod)
    assert drivers.prepare_calls == []


def test_cdi_failure_fails_pod_then_unprepares(env: Any, tmp_path: Path) -> None:
    ctl, kube, drivers, _ = env
    kube.claims[("ns", "other")] = make_claim("other", "other-uid", ["p1"])  # no CDI spec for it
    pod = make_pod("a", "p1", claim="other")
    add(ctl, pod)
    ctl.sync(pod)
    status = kube.status_patches[-1][1]["status"]
    assert status["phase"] == "Failed" and status["reason"] == REASON_CDI_FAILED
    assert "example.com/gpu=other-uid-0" in status["message"]
    assert kube.events[-1][1] == REASON_CDI_FAILED
    pod["status"] = {"phase": "Failed"}
    ctl.apply_event("MODIFIED", pod)
    ctl.sync(pod)
    assert drivers.unprepare_calls == [["other"]]
    assert kube.deleted == []


def test_unprepare_failure_blocks_deletion(env: Any) -> None:
    ctl, kube, drivers, state = env
    kube.claims[("ns", "shared")] = make_claim("shared", "claim-uid", ["p1"])
    pod = make_pod("a", "p1")
    add(ctl, pod)
    ctl.sync(pod)
    drivers.unprepare_error = "busy"
    pod["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    ctl.apply_event("MODIFIED", pod)
    with pytest.raises(Retry, match="busy"):
        ctl.sync(pod)
    assert kube.deleted == [] and "claim-uid" in state.claims
    drivers.unprepare_error = ""
    ctl.sync(pod)
    assert kube.deleted == [("ns", "a", "p1")] and state.claims == {}


def test_reconcile_unprepares_claims_of_vanished_pods(env: Any) -> None:
    ctl, kube, drivers, state = env
    kube.claims[("ns", "shared")] = make_claim("shared", "claim-uid", ["p1"])
    pod = make_pod("a", "p1")
    add(ctl, pod)
    ctl.sync(pod)
    ctl.reconcile()
    assert drivers.unprepare_calls == []
    ctl.apply_event("DELETED", pod)  # force deletion: no deletionTimestamp seen
    kube.claims.clear()  # the claim object may be gone too
    ctl.reconcile()
    assert drivers.unprepare_calls == [["shared"]]
    assert state.claims == {}


def test_pure_helpers() -> None:
    assert [backoff_delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert claim_not_ready(make_claim("c", "u", ["p"]), "p") is None
    refs = [ClaimRef("ns", "a", "u1"), ClaimRef("ns", "b", "u2")]
    ok, errs = check_prepare_response(DRIVER, refs, {"u1": ClaimResult(devices=[]), "u3": ClaimResult()})
    assert list(ok) == ["u1"]
    assert any("no result for ResourceClaim ns/b" in e for e in errs)
    assert any("unknown claim UIDs ['u3']" in e for e in errs)
