"""The controller against a fake API server: explaining pending claims, reusing the inventory, bad
input contained, queue items for objects that are gone."""

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
    drain,
    events,
    gpu_slice,
    make_controller,
    pod,
    step,
    sync,
)

from dra_driver.allocator.resolve import Engine
from dra_driver.controller.annotations import content_hash
from dra_driver.controller.keys import EXPLANATION_ANNOTATION, HASH_ANNOTATION, SUMMARY_ANNOTATION
from dra_driver.controller.reconciler import Item, Kind
from dra_driver.k8s.claims import POD_CLAIM_NAME_ANNOTATION
from dra_driver.k8s.client import CLAIMS, PODS, SLICES, ApiError


class SpyEngine(Engine):
    """The real engine, counting resolve calls (optionally raising)."""

    def __init__(self, raise_on_resolve: Exception | None = None) -> None:
        self.calls: list[str] = []
        self.raise_on_resolve = raise_on_resolve

    def resolve(self, claim: Any, inventory: Any, classes: Any, allocated: Any = None, nodes: Any = None,
                rules: Any = None) -> Any:
        self.calls.append(claim["metadata"]["name"])
        if self.raise_on_resolve is not None:
            raise self.raise_on_resolve
        return super().resolve(claim, inventory, classes, allocated, nodes, rules)


class TestInventoryReuse:
    SPECIAL = 'device.attributes["gpu.dra-driver.io"].type == "special"'

    def test_slice_update_rebuilds_the_changed_pool_only(self) -> None:
        kube = cluster(slices=2, gpus=2)
        add_claim(kube, claim(selectors=[{"cel": {"expression": self.SPECIAL}}]))
        add_pod(kube, pod("p", "c1"))
        builds: list[Any] = []

        class Recording(SpyEngine):
            def build_inventory(self, slices: list[Any], previous: Any = None, prebuilt: Any = None) -> Any:
                inv = super().build_inventory(slices, previous, prebuilt)
                builds.append((inv, previous))
                return inv

        ctrl, _ = make_controller(kube, engine=Recording())
        step(ctrl)
        assert "0 candidates" in ann(kube)[SUMMARY_ANNOTATION]  # no device is "special" yet
        first = builds[-1][0]
        s = kube.obj(SLICES, "node-a-gpu.dra-driver.io")
        assert s is not None
        s["spec"]["devices"][1]["attributes"]["type"] = {"string": "special"}
        kube.set(SLICES, s)
        step(ctrl)
        second, previous = builds[-1]
        assert previous is first  # the controller hands its last inventory over
        changed, unchanged = (second.by_key[("gpu.dra-driver.io", f"node-{n}", "gpu-0")] for n in "ab")
        assert changed is not first.by_key[changed.key]  # its slice changed: digested again
        assert unchanged is first.by_key[unchanged.key]  # taken over
        assert not any(k.startswith("gpu.dra-driver.io/explanation") for k in ann(kube))  # now satisfiable


class TestExplain:
    def test_unsatisfiable_pod_claim_is_explained_once(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(count=3))
        add_pod(kube, pod("p", "c1"))
        ctrl, _ = make_controller(kube)
        step(ctrl)
        a = ann(kube)
        doc = json.loads(a[EXPLANATION_ANNOTATION])
        assert doc["verdict"] == "Unsatisfiable" and "need 3" in a[SUMMARY_ANNOTATION]
        assert a[HASH_ANNOTATION] == content_hash(a[EXPLANATION_ANNOTATION])
        evs = events(kube, "Unsatisfiable", "ResourceClaim")
        assert len(evs) == 1 and evs[0]["note"] == a[SUMMARY_ANNOTATION] and evs[0]["type"] == "Warning"
        [on_pod] = events(kube, "Unsatisfiable", "Pod")
        assert on_pod["note"] == f"claim gpu (c1): {a[SUMMARY_ANNOTATION]}" and on_pod["type"] == "Warning"
        assert ctrl.metrics.value("claims_explained_total") == 1
        # Nothing changed: a resync writes nothing.
        before = len(kube.writes())
        ctrl.resync()
        step(ctrl)
        assert len(kube.writes()) == before
        # The scheduler's job: the controller never touched status or finalizers.
        assert not kube.writes("replace_status") and not kube.writes("replace")

    def test_no_duplicate_event_after_restart(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim(count=2))
        add_pod(kube, pod("p", "c1"))
        step(make_controller(kube)[0])
        step(make_controller(kube)[0])
        assert len(events(kube, "Unsatisfiable", "ResourceClaim")) == 1
        [on_pod] = events(kube, "Unsatisfiable", "Pod")
        assert on_pod["series"]["count"] == 2, "a new process tells the pod once more, in the same Event"

    def test_becomes_satisfiable_then_annotations_go(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(count=3))
        add_pod(kube, pod("p", "c1"))
        ctrl, _ = make_controller(kube)
        step(ctrl)
        assert SUMMARY_ANNOTATION in ann(kube)
        kube.add(SLICES, gpu_slice("node-a", 4, name="bigger"))
        kube.delete(SLICES, "node-a-gpu.dra-driver.io")
        step(ctrl)
        assert not any(k.startswith("gpu.dra-driver.io/explanation") for k in ann(kube))
        assert not kube.writes("replace_status")

    def test_scheduler_allocation_clears_the_explanation(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim(count=2))
        add_pod(kube, pod("p", "c1"))
        ctrl, _ = make_controller(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None
        c["status"] = allocated_status(["gpu-0"])
        kube.set(CLAIMS, c)  # the scheduler wins, whatever we thought
        step(ctrl)
        assert ann(kube) == {}

    def test_verdict_change_updates_and_emits_again(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(count=3))
        add_pod(kube, pod("p", "c1"))
        ctrl, _ = make_controller(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None
        c["spec"]["devices"]["requests"][0]["exactly"]["count"] = 5  # (spec is immutable; fine for the test)
        kube.set(CLAIMS, c)
        step(ctrl)
        assert "need 5" in ann(kube)[SUMMARY_ANNOTATION]
        assert len(events(kube, "Unsatisfiable", "ResourceClaim")) == 2
        assert len(events(kube, "Unsatisfiable", "Pod")) == 2

    def test_claim_nobody_waits_for_is_left_alone(self) -> None:
        kube = cluster()
        add_claim(kube, claim(count=9))
        ctrl, _ = make_controller(kube)
        step(ctrl)
        assert kube.writes() == []

    def test_pod_finishing_clears_the_explanation(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim(count=2))
        p = add_pod(kube, pod("p", "c1"))
        ctrl, _ = make_controller(kube)
        step(ctrl)
        assert ann(kube)
        p["status"]["phase"] = "Failed"
        kube.set(PODS, p)
        step(ctrl)
        assert ann(kube) == {}

    def test_template_generated_claim_found_through_pod_status(self) -> None:
        kube = cluster(gpus=1)
        c = claim("p-gpu-x1", count=2, annotations={POD_CLAIM_NAME_ANNOTATION: "gpu"})
        add_claim(kube, c)
        add_pod(kube, pod("p", "p-gpu-x1", via_template=True))
        step(make_controller(kube)[0])
        assert "need 2" in ann(kube, "default/p-gpu-x1")[SUMMARY_ANNOTATION]

    def test_ten_events_one_resolve(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim(count=2))
        add_pod(kube, pod("p", "c1"))
        spy = SpyEngine()
        ctrl, _ = make_controller(kube, engine=spy)
        sync(ctrl)
        for _ in range(10):
            ctrl.queue.add(Item(Kind.CLAIM, "default/c1"))
        drain(ctrl)
        assert spy.calls == ["c1"]


class TestBadInput:
    @pytest.mark.parametrize(
        "mutate",
        [
            pytest.param(lambda c: c["spec"]["devices"]["requests"][0]["exactly"].update(
                selectors=[{"cel": {"expression": "device.attributes[ 'x' ==="}}]), id="malformed-cel"),
            pytest.param(lambda c: c["spec"]["devices"]["requests"][0]["exactly"].update(
                deviceClassName="nope"), id="unknown-class"),
            pytest.param(lambda c: c["spec"]["devices"]["requests"][0]["exactly"].update(count=0), id="count-0"),
            pytest.param(lambda c: c["spec"]["devices"]["requests"][0]["exactly"].update(count=10**12),
                         id="huge-count"),
            pytest.param(lambda c: c["spec"]["devices"].update(requests="garbage"), id="garbage-requests"),
            pytest.param(lambda c: c.update(spec=None), id="no-spec"),
        ],
    )
    def test_becomes_an_annotation_and_event(self, mutate: Any) -> None:
        kube = cluster()
        c = claim()
        mutate(c)
        add_claim(kube, c)
        add_pod(kube, pod("p", "c1"))
        ctrl, _ = make_controller(kube)
        step(ctrl)
        a = ann(kube)
        assert a[SUMMARY_ANNOTATION]
        assert json.loads(a[EXPLANATION_ANNOTATION])["verdict"] in ("Unsatisfiable", "Error")
        assert len(events(kube, kind="ResourceClaim")) == 1 and len(events(kube, kind="Pod")) == 1

    def test_garbage_slices(self) -> None:
        kube = cluster()
        kube.add(SLICES, {"metadata": {"name": "junk"}, "spec": "garbage"})
        kube.add(SLICES, {"metadata": {"name": "junk2"}, "spec": {"driver": DRIVER, "devices": [None, 5]}})
        add_claim(kube, claim(count=5))
        add_pod(kube, pod("p", "c1"))
        ctrl, _ = make_controller(kube)
        step(ctrl)
        assert SUMMARY_ANNOTATION in ann(kube)

    def test_engine_exception_is_contained(self) -> None:
        kube = cluster()
        add_claim(kube, claim())
        add_pod(kube, pod("p", "c1"))
        ctrl, _ = make_controller(kube, engine=SpyEngine(raise_on_resolve=RuntimeError("boom")))
        step(ctrl)
        a = ann(kube)
        assert json.loads(a[EXPLANATION_ANNOTATION])["verdict"] == "Error" and "boom" in a[SUMMARY_ANNOTATION]
        assert events(kube, "ResolveError")
        assert ctrl.metrics.value("errors_total", {"kind": "resolve"}) == 1

    def test_api_failure_is_counted_and_retried_and_others_proceed(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim("c1", count=2))
        add_claim(kube, claim("c2", count=2))
        add_pod(kube, pod("p1", "c1"))
        add_pod(kube, pod("p2", "c2"))
        ctrl, clock = make_controller(kube)
        kube.fail["merge_patch:resourceclaims"] = ApiError(500, "InternalError", "etcd down")
        step(ctrl)
        assert ctrl.metrics.value("errors_total", {"kind": "sync"}) == 2
        del kube.fail["merge_patch:resourceclaims"]
        clock.advance(1)
        drain(ctrl)
        assert SUMMARY_ANNOTATION in ann(kube, "default/c1") and SUMMARY_ANNOTATION in ann(kube, "default/c2")

    def test_event_failure_does_not_stop_annotation(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim(count=2))
        add_pod(kube, pod("p", "c1"))
        kube.fail["create:events"] = ApiError(403, "Forbidden", "no")
        ctrl, _ = make_controller(kube)
        step(ctrl)
        assert SUMMARY_ANNOTATION in ann(kube)
        assert ctrl.metrics.value("errors_total", {"kind": "event"}) == 2  # the claim's and the pod's


def test_queue_item_for_missing_objects_is_harmless() -> None:
    kube = cluster()
    ctrl, _ = make_controller(kube)
    for item in (Item(Kind.CLAIM, "default/ghost"), Item(Kind.CLASS, "ghost"), Item(Kind.TEMPLATE, "ns/ghost")):
        ctrl.queue.add(item)
    drain(ctrl)
    assert kube.writes() == []
