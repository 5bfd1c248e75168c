"""Which claims a controller leaves to another driver's (:mod:`dra_driver.controller.ownership`),
and two controllers of different drivers on one cluster not writing each other's claims."""

from __future__ import annotations

from typing import Any

import pytest
from ctrlfix import DEVICE_CLASSES, add_claim, add_pod, ann, claim, cluster, device_class, gpu_slice, make_controller, pod, step

from dra_driver.controller.annotations import explained_by
from dra_driver.controller.keys import SUMMARY_ANNOTATION
from dra_driver.controller.ownership import conjuncts, foreign_drivers, pinned_drivers
from dra_driver.controller.verdicts import Action, classify
from dra_driver.k8s.client import CLAIMS, SLICES

OURS, THEIRS = "gpu.dra-driver.io", "gpu.nvidia.com"


@pytest.mark.parametrize(("expr", "pinned"), [
    ("device.driver == 'gpu.nvidia.com'", {THEIRS}),
    ('"gpu.nvidia.com" == device.driver', {THEIRS}),
    ("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'", {THEIRS}),
    ("(device.driver == 'a' && (device.attributes['a'].x == 'y || z'))", {"a"}),
    ("device.driver in ['a', \"b\"] && device.driver == 'b'", {"b"}),
    ("device.driver == 'a' && device.driver == 'b'", set()),  # matches nothing: pinned to no driver
    ("device.driver == 'a' || device.driver == 'b'", None),  # a disjunction is not read
    ("device.driver == 'a' ? true : false", None),
    ("!(device.driver == 'a')", None),
    ("device.driver != 'a'", None),
    ("device.attributes['a'].?model.orValue('') == 'x' && device.driver == 'a'", {"a"}),
    ("device.attributes['a'].type == 'gpu'", None),
    ("device.driver == 'it''s'", None),
    ("((device.driver == 'a')", None),  # unbalanced: nothing read
])
def test_pinned_drivers(expr: str, pinned: set[str] | None) -> None:
    assert pinned_drivers(expr) == (None if pinned is None else frozenset(pinned))


def test_conjuncts_respect_strings_and_brackets() -> None:
    assert conjuncts("a && 'x && y' && f(b && c)") == ["a", "'x && y'", "f(b && c)"]


def _claim(*alternatives: tuple[str, str | None]) -> dict[str, Any]:
    """A claim whose one request has these (class, request selector) alternatives."""
    subs = [{"name": f"s{i}", "deviceClassName": cls, **({"selectors": [{"cel": {"expression": sel}}]} if sel else {})}
            for i, (cls, sel) in enumerate(alternatives)]
    req: dict[str, Any] = {"name": "gpu", "exactly": subs[0]} if len(subs) == 1 else {"name": "gpu", "firstAvailable": subs}
    return {"metadata": {"name": "c", "namespace": "default"}, "spec": {"devices": {"requests": [req]}}}


BAD = {"opaque": {"driver": THEIRS, "parameters": {
    "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "Bogus"}}}}
"""NVIDIA's config, invalid: only the gpu.nvidia.com controller reads it."""

CLASSES = {"ours": device_class("ours", OURS), "theirs": device_class("theirs", THEIRS),
           "any": {"metadata": {"name": "any"}, "spec": {}}}


@pytest.mark.parametrize(("alternatives", "foreign"), [
    ([("theirs", None)], [THEIRS]),
    ([("ours", None)], None),
    ([("theirs", None), ("ours", None)], None),  # a firstAvailable entry we could serve
    ([("any", f"device.driver == '{THEIRS}'")], [THEIRS]),  # pinned by the request's own selector
    ([("any", None)], None),
    ([("missing", None)], None),  # a missing class is explained by every controller that sees it
])
def test_foreign_drivers(alternatives: list[tuple[str, str | None]], foreign: list[str] | None) -> None:
    assert foreign_drivers(_claim(*alternatives), CLASSES, OURS) == foreign


def test_a_claim_without_requests_is_ours() -> None:
    assert foreign_drivers({"spec": {"devices": {"requests": []}}}, CLASSES, OURS) is None


def test_classify_leaves_claims_their_drivers_controller_explained() -> None:
    c = claim(opt_in=True)
    assert classify(c, waited_for=True, ours=False) is Action.IGNORE
    assert classify(claim(), waited_for=True, ours=False) is Action.IGNORE
    marked = claim(annotations={SUMMARY_ANNOTATION: "theirs"})
    assert classify(marked, waited_for=True, ours=False) is Action.IGNORE  # the other controller's words stay


def test_two_drivers_controllers_each_explain_only_their_own_claims() -> None:
    kube = cluster(gpus=1)
    kube.add(SLICES, gpu_slice("node-b", 1, driver=THEIRS))
    kube.add(DEVICE_CLASSES, device_class("theirs", THEIRS))
    add_claim(kube, claim("mine", count=2))
    # Each controller reads only its own driver's opaque config: were both to explain this claim,
    # one would call it invalid and the other merely unsatisfiable, and overwrite each other.
    add_claim(kube, claim("yours", count=2, cls="theirs", config=[BAD]))
    add_pod(kube, pod("p1", "mine"))
    add_pod(kube, pod("p2", "yours"))
    ours, _ = make_controller(kube)
    theirs, _ = make_controller(kube, driver=THEIRS, fenced=False)
    for _ in range(3):
        step(ours)
        step(theirs)
    mine, yours = ann(kube, "default/mine"), ann(kube, "default/yours")
    assert "need 2" in mine[SUMMARY_ANNOTATION]
    assert yours[SUMMARY_ANNOTATION].startswith(f"invalid configuration for {THEIRS}"), yours
    versions = {k: kube.obj(CLAIMS, k)["metadata"]["resourceVersion"] for k in ("default/mine", "default/yours")}
    for _ in range(3):  # settled: neither rewrites the other's claim
        ours.resync()
        theirs.resync()
        step(ours)
        step(theirs)
    assert {k: kube.obj(CLAIMS, k)["metadata"]["resourceVersion"] for k in versions} == versions


@pytest.mark.parametrize("first", ["ours", "theirs"])
def test_the_claims_own_drivers_words_stand_whoever_writes_first(first: str) -> None:
    kube = cluster(gpus=1)
    kube.add(SLICES, gpu_slice("node-b", 1, driver=THEIRS))
    kube.add(DEVICE_CLASSES, device_class("theirs", THEIRS))
    add_claim(kube, claim(count=2, cls="theirs", config=[BAD]))
    add_pod(kube, pod("p", "c1"))
    controllers = {"ours": make_controller(kube)[0], "theirs": make_controller(kube, driver=THEIRS, fenced=False)[0]}
    order = [controllers[first], controllers["theirs" if first == "ours" else "ours"]]
    for _ in range(3):
        for ctrl in order:
            ctrl.resync()
            step(ctrl)
    assert explained_by(ann(kube)) == THEIRS
    assert ann(kube)[SUMMARY_ANNOTATION].startswith(f"invalid configuration for {THEIRS}")


def test_a_lone_controller_still_explains_another_drivers_claim() -> None:
    """With no controller of that driver to explain it, this one does, as it always has."""
    kube = cluster(gpus=1)
    kube.add(SLICES, gpu_slice("node-b", 1, driver=THEIRS))
    kube.add(DEVICE_CLASSES, device_class("theirs", THEIRS))
    add_claim(kube, claim(count=2, cls="theirs"))
    add_pod(kube, pod("p", "c1"))
    step(make_controller(kube)[0])
    assert explained_by(ann(kube)) == OURS and "need 2" in ann(kube)[SUMMARY_ANNOTATION]
