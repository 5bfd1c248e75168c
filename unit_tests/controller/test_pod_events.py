"""The controller's Warning Events on the pods that wait for a claim it cannot see allocated
(dra_driver.controller.pod_notices), against a fake API server."""

from __future__ import annotations

from typing import Any

import pytest
from ctrlfix import (
    FakeClock,
    add_claim,
    add_pod,
    allocated_status,
    ann,
    claim,
    cluster,
    drain,
    events,
    pod,
    settings,
    step,
    sync,
)
from kubefake import FakeKube

from dra_driver.controller.keys import SUMMARY_ANNOTATION
from dra_driver.controller.pod_notices import PodNotices, pod_event_note
from dra_driver.controller.reconciler import RESCAN, Controller
from dra_driver.controller.views import pod_view
from dra_driver.k8s.claims import EXTENDED_RESOURCES_CLAIM, POD_CLAIM_NAME_ANNOTATION, pod_claim_keys, pod_claim_names
from dra_driver.k8s.client import CLAIMS, PODS
from dra_driver.k8s.objects import Obj


def make(kube: FakeKube, **kw: Any) -> Controller:
    return Controller(kube, settings(), clock=FakeClock(), sleep=lambda _s: None, **kw)


def pod_events(kube: FakeKube, name: str = "p") -> list[Obj]:
    return sorted((e for e in events(kube, kind="Pod") if e["regarding"]["name"] == name), key=lambda e: e["note"])


def two_claim_pod() -> Obj:
    p = pod("p", "big")
    p["spec"]["resourceClaims"] = [{"name": "train", "resourceClaimName": "big"},
                                   {"name": "infer", "resourceClaimTemplateName": "tmpl"},
                                   {"name": "small", "resourceClaimName": "small"}]
    p["status"]["resourceClaimStatuses"] = [{"name": "infer", "resourceClaimName": "p-infer-x7"}]
    return p


class TestNames:
    def test_every_claim_with_the_pods_name_for_it(self) -> None:
        p = two_claim_pod()
        p["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": "p-extended-resources-q2", "requestMappings": []}
        assert pod_claim_names(p) == {"default/big": ["train"], "default/p-infer-x7": ["infer"], "default/small": ["small"],
                                      "default/p-extended-resources-q2": [EXTENDED_RESOURCES_CLAIM]}
        assert set(pod_claim_names(p)) == pod_claim_keys(p)

    def test_a_claim_the_pod_names_twice(self) -> None:
        p = pod("p", "shared")
        p["spec"]["resourceClaims"].append({"name": "again", "resourceClaimName": "shared"})
        assert pod_claim_names(p) == {"default/shared": ["gpu", "again"]}
        assert pod_event_note(["gpu", "again"], "shared", "no") == "claim gpu, again (shared): no"

    def test_a_done_pod_names_none(self) -> None:
        assert pod_claim_names(pod("p", "c", phase="Succeeded")) == {}

    def test_the_informers_view_keeps_the_names_and_the_uid(self) -> None:
        p = two_claim_pod()
        p["metadata"]["uid"] = "u-1"
        view = pod_view(p)
        assert view is not None and view["metadata"]["uid"] == "u-1"
        assert pod_claim_names(view) == pod_claim_names(p)


class TestPodEvents:
    def test_a_template_claim_is_named_as_the_pod_and_the_cluster_name_it(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim("p-gpu-x1", count=2, annotations={POD_CLAIM_NAME_ANNOTATION: "gpu"}))
        p = add_pod(kube, pod("p", "p-gpu-x1", via_template=True))
        step(make(kube))
        [ev] = pod_events(kube)
        summary = ann(kube, "default/p-gpu-x1")[SUMMARY_ANNOTATION]
        assert ev["note"] == f"claim gpu (p-gpu-x1): {summary}" and "need 2" in summary
        assert ev["type"] == "Warning" and ev["reason"] == "Unsatisfiable" and ev["action"] == "Explain"
        assert ev["regarding"] == {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "default",
                                   "uid": p["metadata"]["uid"], "resourceVersion": p["metadata"]["resourceVersion"]}
        assert ev["reportingController"] == "gpu.dra-driver.io/controller"

    def test_one_event_per_claim_that_cannot_be_allocated(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim("big", count=3))
        add_claim(kube, claim("p-infer-x7", count=5, annotations={POD_CLAIM_NAME_ANNOTATION: "infer"}))
        add_claim(kube, claim("small", count=1))
        add_pod(kube, two_claim_pod())
        step(make(kube))
        notes = [e["note"] for e in pod_events(kube)]
        assert len(notes) == 2 and notes[0].startswith("claim infer (p-infer-x7): ") and "need 5" in notes[0]
        assert notes[1].startswith("claim train (big): ") and "need 3" in notes[1]
        assert all("\n" not in n for n in notes)

    def test_written_when_the_verdict_changes_not_on_every_resync(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(count=3))
        add_pod(kube, pod("p", "c1"))
        ctrl = make(kube)
        step(ctrl)
        before = len(kube.writes())
        for _ in range(3):
            ctrl.resync()
            ctrl.queue.add(RESCAN)
            step(ctrl)
        assert len(kube.writes()) == before
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None
        c["spec"]["devices"]["requests"][0]["exactly"]["count"] = 4  # (spec is immutable; fine for the test)
        kube.set(CLAIMS, c)
        step(ctrl)
        assert ["need 3" in e["note"] for e in pod_events(kube)] == [True, False]
        assert all("series" not in e for e in pod_events(kube))

    def test_a_pod_that_starts_waiting_is_told_and_the_others_are_not_again(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim("shared", count=2))
        add_pod(kube, pod("p", "shared"))
        ctrl = make(kube)
        step(ctrl)
        assert len(pod_events(kube, "p")) == 1
        add_pod(kube, pod("q", "shared"))
        step(ctrl)
        assert len(pod_events(kube, "q")) == 1
        [told_p] = pod_events(kube, "p")
        assert "series" not in told_p, "p was not told again"

    def test_the_same_verdict_again_folds_into_a_series(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim(count=2))
        add_pod(kube, pod("p", "c1"))
        step(make(kube))
        step(make(kube))  # a new process: it tells the pod once more
        [ev] = pod_events(kube)
        assert ev["series"]["count"] == 2

    @pytest.mark.parametrize("how", ["scheduled", "deleted"])
    def test_nothing_more_once_the_pod_is_scheduled_or_deleted(self, how: str) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim(count=2))
        p = add_pod(kube, pod("p", "c1"))
        ctrl = make(kube)
        step(ctrl)
        assert len(ctrl.reporter.pod_notices) == 1
        if how == "scheduled":
            c = kube.obj(CLAIMS, "default/c1")
            assert c is not None
            c["status"] = allocated_status(["gpu-0"])
            kube.set(CLAIMS, c)
            p["spec"]["nodeName"] = "node-a"
            p["status"]["phase"] = "Running"
            kube.set(PODS, p)
        else:
            kube.delete(PODS, "default/p")
        step(ctrl)
        assert len(ctrl.reporter.pod_notices) == 0
        before = len(kube.writes("create")) + len(kube.writes("merge_patch"))
        for _ in range(3):
            ctrl.resync()
            step(ctrl)
        [ev] = pod_events(kube)
        assert "series" not in ev
        assert len(kube.writes("create")) + len(kube.writes("merge_patch")) == before

    def test_a_satisfiable_claim_tells_no_pod(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(count=1))
        add_pod(kube, pod("p", "c1"))
        step(make(kube))
        assert pod_events(kube) == []

    def test_switched_off(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim(count=2))
        add_pod(kube, pod("p", "c1"))
        step(Controller(kube, settings(pod_events=False), clock=FakeClock(), sleep=lambda _s: None))
        assert SUMMARY_ANNOTATION in ann(kube) and len(events(kube, kind="ResourceClaim")) == 1
        assert events(kube, kind="Pod") == []

    def test_the_flag(self) -> None:
        import argparse

        from dra_driver.controller.settings import add_controller_arguments, controller_settings

        def parse(*argv: str) -> bool:
            parser = argparse.ArgumentParser()
            add_controller_arguments(parser)
            return controller_settings(parser.parse_args(list(argv))).pod_events

        assert parse() is True and parse("--no-pod-events") is False and parse("--pod-events") is True

    def test_a_follower_tells_no_pod(self) -> None:
        class Follower:
            def is_leader(self) -> bool:
                return False

        kube = cluster(gpus=1)
        add_claim(kube, claim(count=2))
        add_pod(kube, pod("p", "c1"))
        ctrl = make(kube, leadership=Follower())
        step(ctrl)
        assert events(kube) == [] and len(ctrl.reporter.pod_notices) == 0

    def test_a_pod_told_while_leading_but_not_written_is_told_on_the_next_term(self) -> None:
        class Flip:
            leader = True

            def is_leader(self) -> bool:
                return self.leader

        kube = cluster(gpus=1)
        add_claim(kube, claim(count=2))
        add_pod(kube, pod("p", "c1"))
        lead = Flip()
        ctrl = make(kube, leadership=lead)
        sync(ctrl)
        while ctrl.process_next(timeout=0):
            pass  # the pod is told: its Event waits in the recorder
        lead.leader = False
        assert ctrl.events.flush(timeout=5.0)
        assert events(kube, kind="Pod") == [], "a replica that lost the Lease writes no pod Event"
        lead.leader = True
        ctrl.became_leader()
        drain(ctrl)
        [told] = events(kube, kind="Pod")
        assert told["regarding"]["name"] == "p"


class TestNotices:
    def test_forgetting(self) -> None:
        notices = PodNotices()
        a, b = {"metadata": {"name": "a", "namespace": "n"}}, {"metadata": {"name": "b", "namespace": "n"}}
        notices.told("n/c", "n/a", "d1")
        assert notices.untold("n/c", [a, b], "d1") == [b] and notices.untold("n/c", [a, b], "d2") == [a, b]
        notices.told("n/c", "n/b", "d1")
        notices.forget_pod("n/a", ["n/c"])
        assert notices.untold("n/c", [a, b], "d1") == [a] and len(notices) == 1
        notices.forget_claim("n/c")
        assert len(notices) == 0
