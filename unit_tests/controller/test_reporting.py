"""What the controller says: Events about claims and other objects, and invalid opaque config flagged
on claims, DeviceClasses and ResourceClaimTemplates."""

from __future__ import annotations

import json

from ctrlfix import (
    add_claim,
    add_pod,
    ann,
    claim,
    cluster,
    device_class,
    drain,
    events,
    make_controller,
    pod,
    sharing_config,
    step,
)
from kubefake import FakeKube

from dra_driver.controller.keys import EXPLANATION_ANNOTATION, REPORTING_CONTROLLER
from dra_driver.k8s.client import CLAIM_TEMPLATES, CLAIMS, DEVICE_CLASSES
from dra_driver.k8s.events import Occurrence


class TestEvents:
    def test_claim_event(self) -> None:
        kube = FakeKube()
        ctrl, _ = make_controller(kube)
        c = claim()
        c["metadata"].update(uid="u1", resourceVersion="7")
        c.update(apiVersion="resource.k8s.io/v1", kind="ResourceClaim")
        ctrl.reporter.emit(c, Occurrence("Warning", "Unsatisfiable", "Explain", "x" * 3000), CLAIMS)
        drain(ctrl)
        [ev] = events(kube)
        assert ev["apiVersion"] == "events.k8s.io/v1"
        assert ev["reportingController"] == REPORTING_CONTROLLER == "gpu.dra-driver.io/controller"
        assert ev["type"] == "Warning" and ev["reason"] == "Unsatisfiable" and ev["action"] == "Explain"
        assert len(ev["note"].encode()) <= 1024
        assert ev["regarding"] == {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "name": "c1",
                                   "namespace": "default", "uid": "u1", "resourceVersion": "7"}
        assert ev["metadata"]["namespace"] == "default" and ev["metadata"]["name"].startswith("c1.")
        assert ev["eventTime"].endswith("Z")

    def test_cluster_scoped_object_events_go_to_default(self) -> None:
        kube = FakeKube()
        ctrl, _ = make_controller(kube)
        ctrl.reporter.emit(device_class(), Occurrence("Warning", "InvalidConfig", "Validate", "n"), DEVICE_CLASSES)
        drain(ctrl)
        [ev] = events(kube)
        assert ev["metadata"]["namespace"] == "default"
        assert "namespace" not in ev["regarding"] and ev["regarding"]["kind"] == "DeviceClass"


class TestInvalidConfig:
    def test_claim_config_error_in_annotation_and_event(self) -> None:
        kube = cluster()
        add_claim(kube, claim(config=[sharing_config("Bogus")]))
        add_pod(kube, pod("p", "c1"))
        step(make_controller(kube)[0])
        doc = json.loads(ann(kube)[EXPLANATION_ANNOTATION])
        assert doc["verdict"] == "InvalidConfig"
        assert doc["configErrors"][0].startswith("spec.devices.config[0].opaque.parameters.sharing.strategy")
        evs = events(kube, "InvalidConfig", "ResourceClaim")
        assert len(evs) == 1 and "sharing.strategy" in evs[0]["note"]
        [on_pod] = events(kube, "InvalidConfig", "Pod")
        assert on_pod["note"].startswith("claim gpu (c1): invalid configuration for") and "sharing.strategy" in on_pod["note"]

    def test_flagged_before_any_pod_uses_it(self) -> None:
        kube = cluster()
        add_claim(kube, claim(config=[sharing_config("Bogus")]))
        step(make_controller(kube)[0])
        assert json.loads(ann(kube)[EXPLANATION_ANNOTATION])["verdict"] == "InvalidConfig"
        assert len(events(kube, "InvalidConfig")) == 1

    def test_opted_in_claim_with_bad_config_is_not_allocated(self) -> None:
        kube = cluster()
        add_claim(kube, claim(opt_in=True, config=[sharing_config("Bogus")]))
        step(make_controller(kube)[0])
        assert not kube.writes("replace_status")
        assert events(kube, "InvalidConfig")

    def test_device_class_and_template_events_once(self) -> None:
        kube = FakeKube()
        kube.add(DEVICE_CLASSES, device_class("bad", config=[sharing_config("Bogus")]))
        kube.add(CLAIM_TEMPLATES, {"metadata": {"name": "t", "namespace": "ns1"},
                                   "spec": {"spec": {"devices": {"config": [sharing_config("Nope")]}}}})
        ctrl, _ = make_controller(kube)
        step(ctrl)
        ctrl.resync()
        step(ctrl)
        evs = events(kube, "InvalidConfig")
        assert len(evs) == 2
        by_kind = {e["regarding"]["kind"]: e for e in evs}
        assert by_kind["DeviceClass"]["metadata"]["namespace"] == "default"
        assert "spec.config[0].opaque.parameters.sharing.strategy" in by_kind["DeviceClass"]["note"]
        assert by_kind["ResourceClaimTemplate"]["metadata"]["namespace"] == "ns1"
        assert "spec.spec.devices.config[0]" in by_kind["ResourceClaimTemplate"]["note"]

    def test_a_restarted_controller_adds_to_the_same_event(self) -> None:
        kube = FakeKube()
        kube.add(DEVICE_CLASSES, device_class("bad", config=[sharing_config("Bogus")]))
        for _ in range(3):  # each new process validates the class once more
            step(make_controller(kube)[0])
        [ev] = events(kube, "InvalidConfig")
        assert ev["series"]["count"] == 3, "one Event, counted three times (it was three Events)"
