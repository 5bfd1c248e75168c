"""The controller's own allocation of opted-in claims, through the fence ledger, against a fake API
server with the fence's admission policy; finalization; the conflicts a post-write check finds."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ctrlfix import (
    DRIVER,
    add_claim,
    add_pod,
    allocated_status,
    ann,
    claim,
    cluster,
    device_class,
    drain,
    events,
    gpu_slice,
    make_controller,
    pod,
    step,
    sync,
)
from kubefake import FakeKube

from dra_driver.controller.allocating import ALLOCATION_SETTLE_SECONDS, allocation_conflicts
from dra_driver.controller.keys import EXPLANATION_ANNOTATION, SUMMARY_ANNOTATION
from dra_driver.k8s.claims import FINALIZER, device_ids
from dra_driver.k8s.client import CLAIMS, CONFIGMAPS, DEVICE_CLASSES, SLICES, ApiError, ListResult
from dra_driver.k8s.objects import key_of
from dra_driver.k8s.quarantine import Undecodable
from dra_driver.k8s.wire import allocation_view


class TestConflicts:
    def test_exclusive_overlap_only(self) -> None:
        mine = allocated_status(["gpu-0", "gpu-1"])["allocation"]
        other = claim("o")
        other["metadata"]["uid"] = "o"
        other["status"] = allocated_status(["gpu-1"])
        admin = claim("a")
        admin["metadata"]["uid"] = "a"
        admin["status"] = allocated_status(["gpu-0"])
        admin["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
        found = allocation_conflicts(mine, "me", [other, admin])
        assert [(key_of(c), d) for c, d in found] == [("default/o", {(DRIVER, "node-a", "gpu-1")})]
        assert allocation_conflicts(mine, "o", [other]) == []  # itself


FIRST_GPU = 'device.attributes["gpu.dra-driver.io"].index == 0'


class TestAllocate:
    def test_allocates_opted_in_claim(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(count=2, opt_in=True))
        ctrl, _ = make_controller(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None
        assert FINALIZER in c["metadata"]["finalizers"]
        assert device_ids(c["status"]["allocation"]) == {(DRIVER, "node-a", "gpu-0"), (DRIVER, "node-a", "gpu-1")}
        assert c["status"]["allocation"]["nodeSelector"]
        # finalizer first (update), then status (update of the subresource), no patches of status
        writes = [w for w in kube.writes() if w[1] == "resourceclaims"]
        assert [w[0] for w in writes] == ["replace", "dry_run_status", "replace_status"]
        assert ctrl.metrics.value("claims_allocated_total") == 1
        assert events(kube, "Allocated")[0]["type"] == "Normal"

    def test_two_opted_in_claims_never_share_a_device(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim("c1", opt_in=True))
        add_claim(kube, claim("c2", opt_in=True))
        add_claim(kube, claim("c3", opt_in=True))
        ctrl, _ = make_controller(kube)
        step(ctrl)
        got = [kube.obj(CLAIMS, f"default/c{i}") for i in (1, 2, 3)]
        devs = [device_ids(c["status"].get("allocation")) for c in got if c and c.get("status")]
        allocated = [d for d in devs if d]
        assert len(allocated) == 2 and not (allocated[0] & allocated[1])
        left = [c for c in got if c and not (c.get("status") or {}).get("allocation")]
        assert len(left) == 1 and SUMMARY_ANNOTATION in left[0]["metadata"]["annotations"]

    def test_ledger_covers_informer_lag(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim("c1", opt_in=True))
        add_claim(kube, claim("c2", opt_in=True))
        ctrl, _ = make_controller(kube)
        sync(ctrl)
        # Process both without letting the informers see the first write.
        drain(ctrl)
        a = kube.obj(CLAIMS, "default/c1")
        b = kube.obj(CLAIMS, "default/c2")
        assert a and b
        assert not (device_ids(a["status"]["allocation"]) & device_ids(b["status"]["allocation"]))

    def test_fresh_list_sees_what_the_cache_missed(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim("c1", opt_in=True))
        ctrl, _ = make_controller(kube)
        sync(ctrl)
        # The scheduler allocated the only GPU to another claim; our informer has not seen it.
        other = claim("sched")
        other["status"] = allocated_status(["gpu-0"])
        add_claim(kube, other)
        drain(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None and not c.get("status", {}).get("allocation")
        assert "Unsatisfiable" in ann(kube)[EXPLANATION_ANNOTATION]

    def test_conflict_on_status_write_re_resolves(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(opt_in=True))
        ctrl, clock = make_controller(kube)
        sync(ctrl)

        def scheduler_writes_first(k: FakeKube, res: Any, _: Any) -> None:
            c = k.obj(CLAIMS, "default/c1")
            assert c is not None
            c["status"] = allocated_status(["gpu-1"])
            k.set(CLAIMS, c)

        kube.hooks["replace_status:resourceclaims"] = scheduler_writes_first
        drain(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None
        assert device_ids(c["status"]["allocation"]) == {(DRIVER, "node-a", "gpu-1")}  # the scheduler's
        assert ctrl.metrics.value("errors_total", {"kind": "conflict"}) == 1
        assert ctrl.metrics.value("claims_allocated_total") == 0
        clock.advance(1)
        step(ctrl)
        assert device_ids(kube.obj(CLAIMS, "default/c1")["status"]["allocation"]) == {
            (DRIVER, "node-a", "gpu-1")}

    def test_conflict_on_finalizer_write_retries(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim(opt_in=True))
        ctrl, clock = make_controller(kube)
        sync(ctrl)

        def touch(k: FakeKube, res: Any, _: Any) -> None:
            c = k.obj(CLAIMS, "default/c1")
            assert c is not None
            c["metadata"].setdefault("labels", {})["x"] = "y"
            k.set(CLAIMS, c)

        kube.hooks["replace:resourceclaims"] = touch
        drain(ctrl)
        assert not kube.writes("replace_status")
        clock.advance(1)
        step(ctrl)
        assert kube.obj(CLAIMS, "default/c1")["status"]["allocation"]

    def _race_after_write(self, kube: FakeKube, reserved: bool) -> None:
        """After our status write, the scheduler writes another claim with the same GPU."""

        def after_our_write(k: FakeKube, res: Any, _: Any) -> None:
            def scheduler(k2: FakeKube, res2: Any, _2: Any) -> None:
                other = claim("sched")
                other["status"] = allocated_status(["gpu-0"])
                k2.add(CLAIMS, other)
                if reserved:
                    c = k2.obj(CLAIMS, "default/c1")
                    assert c is not None
                    c["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "pu"}]
                    k2.set(CLAIMS, c)

            k.hooks["list:resourceclaims"] = scheduler

        kube.hooks["replace_status:resourceclaims"] = after_our_write

    def test_post_write_conflict_rolls_back(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(opt_in=True, selectors=[{"cel": {"expression": FIRST_GPU}}]))
        ctrl, _ = make_controller(kube)
        sync(ctrl)
        self._race_after_write(kube, reserved=False)
        drain(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None and not c["status"].get("allocation")
        assert events(kube, "AllocationRolledBack")
        assert ctrl.metrics.value("errors_total", {"kind": "allocation_conflict"}) == 1

    def test_post_write_conflict_in_use_is_reported(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(opt_in=True, selectors=[{"cel": {"expression": FIRST_GPU}}]))
        ctrl, _ = make_controller(kube)
        sync(ctrl)
        self._race_after_write(kube, reserved=True)
        drain(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None and c["status"].get("allocation")  # in use: never pulled away
        assert events(kube, "DeviceConflict")
        assert ctrl.metrics.value("errors_total", {"kind": "double_allocation"}) == 1

    def test_settled_verification_ends_tracking(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(opt_in=True))
        ctrl, clock = make_controller(kube)
        step(ctrl)
        assert ctrl.accounting.written()
        clock.advance(ALLOCATION_SETTLE_SECONDS + 0.1)
        step(ctrl)
        assert not ctrl.accounting.written()
        lists = len([c for c in kube.calls if c[0] == "list"])
        ctrl.resync()
        drain(ctrl)
        assert len([c for c in kube.calls if c[0] == "list"]) == lists  # no more verification reads

    def test_foreign_driver_is_not_allocated(self) -> None:
        kube = FakeKube()
        kube.add(SLICES, gpu_slice("node-a", 1, driver="nic.example.com"))
        kube.add(DEVICE_CLASSES, device_class("nic", driver="nic.example.com"))
        add_claim(kube, claim(opt_in=True, cls="nic"))
        step(make_controller(kube)[0])
        assert not kube.writes("replace_status")
        doc = json.loads(ann(kube)[EXPLANATION_ANNOTATION])
        assert doc["verdict"] == "NotAllocatable"
        assert events(kube, "NotAllocatable")

    def test_already_allocated_by_the_scheduler_is_left_alone(self) -> None:
        kube = cluster()
        c = claim(opt_in=True)
        c["status"] = allocated_status(["gpu-0"])
        add_claim(kube, c)
        step(make_controller(kube)[0])
        assert kube.writes() == []

    def test_non_leader_writes_nothing(self) -> None:
        class Follower:
            def is_leader(self) -> bool:
                return False

        kube = cluster(gpus=1)
        add_claim(kube, claim(opt_in=True))
        add_claim(kube, claim("c2", count=3))
        add_pod(kube, pod("p", "c2"))
        ctrl, _ = make_controller(kube, leadership=Follower())
        step(ctrl)
        assert kube.writes() == []


class TestFinalize:
    def test_deleted_opted_in_claim_is_released(self) -> None:
        kube = cluster()
        add_claim(kube, claim(opt_in=True))
        ctrl, clock = make_controller(kube)
        step(ctrl)
        assert kube.obj(CLAIMS, "default/c1")["status"]["allocation"]
        kube.delete(CLAIMS, "default/c1")
        clock.advance(10)
        step(ctrl)
        assert kube.obj(CLAIMS, "default/c1") is None

    def test_reserved_claim_is_kept(self) -> None:
        kube = cluster()
        add_claim(kube, claim(opt_in=True))
        ctrl, clock = make_controller(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None
        c["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "1"}]
        kube.set(CLAIMS, c)
        kube.delete(CLAIMS, "default/c1")
        clock.advance(10)
        step(ctrl)
        kept = kube.obj(CLAIMS, "default/c1")
        assert kept is not None and kept["status"]["allocation"] and FINALIZER in kept["metadata"]["finalizers"]


class TestAllocationFence:
    """Opt-in allocation goes through the fence ledger (dra_driver.controller.fence): devices are recorded
    and the admission policy's denial of a sentinel proves them enforced before the write."""

    @staticmethod
    def ledger(kube: FakeKube) -> dict[str, str]:
        cm = kube.obj(CONFIGMAPS, "kube-system/dra-driver-allocations")
        return dict((cm or {}).get("data") or {})

    def test_devices_are_in_the_ledger_before_the_allocation(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(count=2, opt_in=True))
        seen: list[dict[str, str]] = []
        kube.hooks["replace_status:resourceclaims"] = lambda k, res, _: seen.append(self.ledger(k))
        ctrl, _ = make_controller(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None and c["status"].get("allocation")
        uid = c["metadata"]["uid"]
        held = {k for k, v in seen[0].items() if v == uid}
        assert held == {f"{DRIVER}_node-a_gpu-0", f"{DRIVER}_node-a_gpu-1"}
        assert [w[0] for w in kube.calls if w[1] == "resourceclaims" and w[0] == "dry_run_status"] == ["dry_run_status"]
        # The entries stay while the claim holds the devices.
        assert {k for k, v in self.ledger(kube).items() if v == uid} == held

    def test_a_scheduler_write_of_a_held_device_is_refused(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim("c1", opt_in=True))
        add_claim(kube, claim("sched"))
        ctrl, _ = make_controller(kube)
        step(ctrl)
        other = kube.obj(CLAIMS, "default/sched")
        assert other is not None
        other["status"] = allocated_status(["gpu-0"])
        with pytest.raises(ApiError) as err:
            kube.replace_status(CLAIMS, other)
        assert err.value.status == 403 and "allocation fence" in str(err.value)

    def test_without_the_policy_nothing_is_allocated_and_the_claim_says_why(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim("c1", opt_in=True))
        ctrl, _ = make_controller(kube, fenced=False)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None and not (c.get("status") or {}).get("allocation")
        assert not kube.writes("replace_status")
        note = events(kube, "AllocationFenceMissing")[0]["note"]
        assert "<release>-allocation-fence" in note and "kube-system/dra-driver-allocations" in note
        assert ctrl.metrics.value("errors_total", {"kind": "fence_inactive"}) == 1
        assert not [k for k, v in self.ledger(kube).items() if v == c["metadata"]["uid"]]  # released

    def test_a_stale_ledger_in_admission_is_waited_out(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim("c1", opt_in=True))
        stale = {"left": 3}

        def older_ledger(verb: str, res: Any, new: Any, old: Any) -> None:
            if verb == "dry_run_status" and stale["left"]:
                stale["left"] -= 1
                raise ApiError(403, "Forbidden", f"allocation fence: device {DRIVER}_node-a_gpu-0 is held by "
                                                 "the dra-driver controller for claim released-long-ago")

        kube.admission.insert(0, older_ledger)
        ctrl, _ = make_controller(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None and c["status"].get("allocation")
        assert stale["left"] == 0 and len([w for w in kube.calls if w[0] == "dry_run_status"]) == 4

    def test_device_held_for_another_claim_is_not_reserved(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim("c1", opt_in=True))
        kube.add(CONFIGMAPS, {"metadata": {"name": "dra-driver-allocations", "namespace": "kube-system"},
                              "data": {f"{DRIVER}_node-a_gpu-0": "someone-else"}})  # fmt: skip
        ctrl, _ = make_controller(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None and not (c.get("status") or {}).get("allocation")
        assert self.ledger(kube) == {f"{DRIVER}_node-a_gpu-0": "someone-else"}

    def test_ledger_entries_go_with_the_claim(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim("c1", opt_in=True))
        ctrl, _ = make_controller(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None and any(v == c["metadata"]["uid"] for v in self.ledger(kube).values())
        kube.delete(CLAIMS, "c1", namespace="default")
        step(ctrl)
        assert kube.obj(CLAIMS, "default/c1") is None  # finalizer released after deallocation
        assert not any(v == c["metadata"]["uid"] for v in self.ledger(kube).values())

    def test_collection_drops_entries_of_vanished_claims_only(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim("c1", opt_in=True))
        ctrl, _ = make_controller(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None
        cm = kube.obj(CONFIGMAPS, "kube-system/dra-driver-allocations")
        assert cm is not None
        cm["data"][f"{DRIVER}_node-a_gpu-1"] = "gone-uid"
        kube.set(CONFIGMAPS, cm)
        ctrl.allocator.collect_ledger()
        assert {v for k, v in self.ledger(kube).items() if not k.startswith("fence.")} == {c["metadata"]["uid"]}

    def test_device_allocated_before_the_fence_is_not_written(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim("c1", opt_in=True))

        def scheduler_allocates(k: FakeKube, res: Any, _: Any) -> None:
            other = claim("sched")
            other["status"] = allocated_status(["gpu-0"])
            k.add(CLAIMS, other)

        kube.hooks["replace:resourceclaims"] = scheduler_allocates
        ctrl, _ = make_controller(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None and not (c.get("status") or {}).get("allocation")
        assert not kube.writes("replace_status")


class TestUndecodableClaims:
    def test_what_an_undecodable_claim_holds_is_never_handed_out(self) -> None:
        # A claim whose raw parameters do not decode is left out of lists and of the cache; the
        # devices it holds still count against a controller allocation.
        kube = cluster(gpus=2)
        bad = claim("bad")
        bad["metadata"]["uid"] = "bad"
        bad["status"] = allocated_status(["gpu-0"])
        add_claim(kube, bad)
        add_claim(kube, claim(count=2, opt_in=True))
        listed = kube.list

        def list_without_bad(res: Any, **kw: Any) -> ListResult:
            result = listed(res, **kw)
            if res is not CLAIMS:
                return result
            view = allocation_view(kube.obj(CLAIMS, "default/bad") or {})
            return ListResult([i for i in result.items if i["metadata"]["name"] != "bad"], result.resource_version,
                              [Undecodable(view, "str is not valid UTF-8")])

        kube.list = list_without_bad  # type: ignore[method-assign]
        ctrl, _ = make_controller(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None and not (c.get("status") or {}).get("allocation")
        assert ctrl.metrics.value("claims_allocated_total") == 0
        assert [e["regarding"]["name"] for e in events(kube, "Undecodable")] == ["bad"]
        assert ctrl.metrics.value("undecodable_objects_total", {"resource": "resourceclaims"}) == 1


class TestLedgerBound:
    """The ledger is one ConfigMap: it never grows past the API server's 1 MiB limit on its data."""

    def test_a_claim_without_room_in_the_ledger_is_not_allocated_and_says_why(self) -> None:
        from dra_driver.controller import fence

        kube = cluster(gpus=1)
        add_claim(kube, claim("c1", opt_in=True))
        # Other entries fill the ledger to a few bytes under the bound (long values: a cheap fake).
        filler = {f"{DRIVER}_node-{i}_gpu-0": "u" * 100_000 for i in range(10)}
        filler["pad"] = "u" * (fence.MAX_LEDGER_BYTES - fence.ledger_bytes(filler) - 3 - 40)
        kube.add(CONFIGMAPS, {"metadata": {"name": "dra-driver-allocations", "namespace": "kube-system"},
                              "data": dict(filler)})
        ctrl, _ = make_controller(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None and not (c.get("status") or {}).get("allocation")
        assert not kube.writes("replace_status")
        cm = kube.obj(CONFIGMAPS, "kube-system/dra-driver-allocations")
        assert cm is not None and cm["data"] == filler, "the ledger is left as it was"
        note = events(kube, "AllocationLedgerFull")[0]["note"]
        assert "kube-system/dra-driver-allocations" in note and f"{len(filler)} entries" in note
        assert ctrl.metrics.value("errors_total", {"kind": "ledger_full"}) == 1

    def test_ledger_bytes_counts_as_the_api_server_does(self) -> None:
        from dra_driver.controller import fence

        assert fence.ledger_bytes({"ab": "cde", "é": "x"}) == 2 + 3 + 2 + 1
        # About 11,000 devices of realistic names fit (docs/architecture.md).
        one = {f"{DRIVER}_gpu-node-1234_gpu-7-mig-1g.10gb-3": "0b1c2d3e-0000-4000-8000-000000000001"}
        assert 10_000 < fence.MAX_LEDGER_BYTES // fence.ledger_bytes(one) < 12_500
