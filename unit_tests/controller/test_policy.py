"""The controller allocates under the scheduler's policy (issue 50): only in the namespaces the
admin allows, never a device a DeviceTaintRule took out of service, and for a claim a pod waits for
only on a node that pod can be scheduled to; against a fake API server."""

from __future__ import annotations

import argparse
import threading
from typing import Any

import pytest
from ctrlfix import (
    DRIVER,
    add_claim,
    add_pod,
    ann,
    claim,
    cluster,
    events,
    make_controller,
    pod,
    settings,
    step,
)
from kubefake import FakeKube

from dra_driver.controller.keys import EXPLANATION_ANNOTATION, SUMMARY_ANNOTATION
from dra_driver.controller.reconciler import Controller
from dra_driver.controller.settings import add_controller_arguments, controller_settings
from dra_driver.controller.verdicts import memo_key
from dra_driver.k8s.claims import device_ids
from dra_driver.k8s.client import CLAIMS, DEVICE_TAINT_RULES, NAMESPACES, NODES, PODS, SLICES, ApiError
from dra_driver.k8s.labels import parse_selector

FIRST_GPU = [{"cel": {"expression": 'device.attributes["gpu.dra-driver.io"].index == 0'}}]


def allocated(kube: FakeKube, key: str = "default/c1") -> set[tuple[str, str, str]]:
    obj = kube.obj(CLAIMS, key)
    assert obj is not None
    return device_ids((obj.get("status") or {}).get("allocation"))


def gated(kube: FakeKube, selector: str | None) -> Controller:
    ctrl, _ = make_controller(kube)
    allowed = None if selector is None else parse_selector(selector)
    return Controller(kube, settings(allocation_namespaces=allowed), clock=ctrl.clock, sleep=lambda _s: None)


class TestNamespaceGate:
    def test_off_unless_turned_on(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(opt_in=True))
        ctrl = gated(kube, None)
        step(ctrl)
        assert not allocated(kube)
        assert ann(kube)[SUMMARY_ANNOTATION].startswith(
            "controller allocation is not allowed here: it is turned off in this cluster; remove the "
            "gpu.dra-driver.io/allocate annotation")
        (event,) = events(kube, "NotAllowed", "ResourceClaim")
        assert event["type"] == "Warning" and "not allowed here" in event["note"]
        assert ctrl.namespaces is None, "with allocation off the controller does not read namespaces"

    def test_only_in_the_namespaces_the_selector_names(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim("c1", ns="team-a", opt_in=True))
        add_claim(kube, claim("c2", ns="team-b", opt_in=True))
        kube.set(NAMESPACES, {"metadata": {"name": "team-a", "labels": {"gpu.dra-driver.io/controller-allocation": "enabled"}}})
        ctrl = gated(kube, "gpu.dra-driver.io/controller-allocation=enabled")
        step(ctrl)
        assert len(allocated(kube, "team-a/c1")) == 1
        assert not allocated(kube, "team-b/c2")
        summary = ann(kube, "team-b/c2")[SUMMARY_ANNOTATION]
        assert "not allowed here: namespace team-b is not one the cluster's admin opened to it" in summary
        assert "gpu.dra-driver.io/controller-allocation=enabled" in summary
        # The admin opens team-b: its claim is allocated on the next look, and the refusal goes.
        kube.set(NAMESPACES, {"metadata": {"name": "team-b", "labels": {"gpu.dra-driver.io/controller-allocation": "enabled"}}})
        step(ctrl)
        assert len(allocated(kube, "team-b/c2")) == 1
        assert SUMMARY_ANNOTATION not in ann(kube, "team-b/c2")

    def test_an_allocation_made_before_is_still_finalized(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim(opt_in=True))
        ctrl = gated(kube, "")
        step(ctrl)
        assert allocated(kube)
        off = gated(kube, None)
        kube.delete(CLAIMS, "default/c1")
        step(off)
        assert kube.obj(CLAIMS, "default/c1") is None, "the finalizer is removed even with allocation off"


def taint_rule(name: str, **selector: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"deviceSelector": {"driver": DRIVER, **selector},
                                                  "taint": {"key": "maintenance", "value": "planned", "effect": "NoSchedule"}}}


class TestTaintRules:
    def test_a_tainted_device_is_refused_naming_the_rule_until_the_rule_goes(self) -> None:
        kube = cluster(gpus=2)
        kube.add(DEVICE_TAINT_RULES, taint_rule("gpu-0-maintenance", pool="node-a", device="gpu-0"))
        add_claim(kube, claim(opt_in=True, selectors=FIRST_GPU))
        ctrl, _ = make_controller(kube)
        step(ctrl)
        assert not allocated(kube)
        explanation = ann(kube)[EXPLANATION_ANNOTATION]
        assert "taint maintenance=planned:NoSchedule from DeviceTaintRule gpu-0-maintenance not tolerated" in explanation
        assert "from DeviceTaintRule gpu-0-maintenance" in ann(kube)[SUMMARY_ANNOTATION]
        (event,) = events(kube, "Unsatisfiable", "ResourceClaim")
        assert "DeviceTaintRule gpu-0-maintenance" in event["note"]
        # The slice stays as published: only the engine's copy carries the taint.
        assert "taints" not in kube.obj(SLICES, "node-a-" + DRIVER)["spec"]["devices"][0]  # type: ignore[index]
        kube.delete(DEVICE_TAINT_RULES, "gpu-0-maintenance")
        step(ctrl)
        assert allocated(kube) == {(DRIVER, "node-a", "gpu-0")}

    def test_a_rule_for_a_whole_pool_leaves_the_other_pools(self) -> None:
        kube = cluster(slices=2, gpus=1)
        kube.add(DEVICE_TAINT_RULES, taint_rule("node-a-drain", pool="node-a"))
        add_claim(kube, claim(opt_in=True))
        ctrl, _ = make_controller(kube)
        step(ctrl)
        assert allocated(kube) == {(DRIVER, "node-b", "gpu-0")}

    def test_a_server_without_the_resource_has_no_rules(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim(opt_in=True))
        ctrl, _ = make_controller(kube)
        real_list = kube.list

        def list_(res: Any, **kw: Any) -> Any:
            if res is DEVICE_TAINT_RULES:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return real_list(res, **kw)

        kube.list = list_  # type: ignore[method-assign]
        for inf in ctrl.informers:
            if inf is not ctrl.taint_rules:
                inf.relist()
        stop = threading.Event()
        ctrl.taint_rules.max_backoff = 0.01
        t = threading.Thread(target=ctrl.taint_rules.run, args=(stop,), daemon=True)
        t.start()
        assert ctrl.taint_rules.synced.wait(5), "an unserved kind counts as none listed"
        stop.set()
        t.join(5)
        assert ctrl.taint_rules.errors == 0
        while ctrl.process_next(timeout=0):
            pass
        assert allocated(kube)


def node_obj(name: str, labels: dict[str, str] | None = None, taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"taints": taints or []}}


class TestPodPlacement:
    def test_a_waiting_pods_node_selector_confines_the_claim(self) -> None:
        kube = cluster(slices=2, gpus=1)
        kube.add(NODES, node_obj("node-a", {"team": "web"}))
        kube.add(NODES, node_obj("node-b", {"team": "ml"}))
        add_claim(kube, claim(opt_in=True))
        waiting = pod("p", "c1")
        waiting["spec"]["nodeSelector"] = {"team": "ml"}
        add_pod(kube, waiting)
        ctrl, _ = make_controller(kube)
        step(ctrl)
        assert allocated(kube) == {(DRIVER, "node-b", "gpu-0")}, "node-a comes first, but the pod cannot go there"

    def test_a_tainted_node_the_pod_does_not_tolerate_is_refused_and_said(self) -> None:
        kube = cluster(slices=1, gpus=1)
        kube.add(NODES, node_obj("node-a", taints=[{"key": "tenant", "value": "b", "effect": "NoSchedule"}]))
        add_claim(kube, claim(opt_in=True))
        add_pod(kube, pod("p", "c1"))
        ctrl, _ = make_controller(kube)
        step(ctrl)
        assert not allocated(kube)
        assert ann(kube)[SUMMARY_ANNOTATION].startswith(
            "on the 0 of 1 nodes with devices that its pods can be scheduled to (node selector, node affinity, "
            "node taints, cordons): ")
        tolerant = kube.obj(PODS, "default/p")
        assert tolerant is not None
        tolerant["spec"]["tolerations"] = [{"key": "tenant", "operator": "Equal", "value": "b"}]
        kube.set(PODS, tolerant)
        step(ctrl)
        assert allocated(kube) == {(DRIVER, "node-a", "gpu-0")}

    def test_a_claim_without_a_pod_may_use_any_node(self) -> None:
        kube = cluster(slices=1, gpus=1)
        kube.add(NODES, node_obj("node-a", taints=[{"key": "tenant", "value": "b", "effect": "NoSchedule"}]))
        add_claim(kube, claim(opt_in=True))
        ctrl, _ = make_controller(kube)
        step(ctrl)
        assert allocated(kube) == {(DRIVER, "node-a", "gpu-0")}


def test_copies_in_other_namespaces_do_not_share_an_explanation() -> None:
    # An explanation names the holders of the claim's own namespace: a copy's answer is its namespace's.
    a, b = claim("c", ns="a"), claim("c", ns="b")
    assert memo_key(a, None) != memo_key(b, None)
    assert memo_key(a, None) == memo_key(claim("d", ns="a"), None)


def test_the_namespace_selector_setting(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_controller_arguments(parser)

    def allowed(*argv: str) -> Any:
        return controller_settings(parser.parse_args(list(argv))).allocation_namespaces

    assert allowed() is None, "off by default"
    assert allowed("--allocation-namespace-selector", " ") is None
    selector = allowed("--allocation-namespace-selector", "team in (ml,vision)")
    assert selector.matches({"team": "ml"}) and not selector.matches({"team": "web"})
    with pytest.raises(SystemExit):  # argparse's usage error, as for any malformed flag value
        allowed("--allocation-namespace-selector", "team in ml")
    assert "argument --allocation-namespace-selector: label selector: 'team in ml'" in capsys.readouterr().err
