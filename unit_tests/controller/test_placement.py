"""Which nodes a pod could be scheduled to (issue 50): the scheduler's NodeAffinity, TaintToleration
and NodeUnschedulable filters, over the controller's view of a Node."""

from __future__ import annotations

from typing import Any

from dra_driver.controller.placement import allowed_nodes, fits, node_view, restricting, same_placement


def node(name: str, labels: dict[str, str] | None = None, taints: list[dict[str, Any]] | None = None,
         unschedulable: bool = False, rv: str = "1") -> dict[str, Any]:
    view = node_view({"metadata": {"name": name, "resourceVersion": rv, "labels": labels or {}},
                      "spec": {"taints": taints or [], "unschedulable": unschedulable},
                      "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    assert view is not None
    return view


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def test_node_selector_and_required_affinity() -> None:
    ml = node("n1", {"team": "ml", "zone": "a"})
    other = node("n2", {"team": "web", "zone": "b"})
    assert fits(pod(nodeSelector={"team": "ml"}), ml) and not fits(pod(nodeSelector={"team": "ml"}), other)
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n3"]}]}]}}}
    assert fits(pod(affinity=affinity), other) and not fits(pod(affinity=affinity), ml)
    assert fits(pod(affinity=affinity), node("n3"))  # the second term, by name
    preferred = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}}]}}
    assert fits(pod(affinity=preferred), ml), "a preference does not filter"


def test_taints_against_tolerations() -> None:
    tainted = node("n1", taints=[GPU_TAINT])
    assert not fits(pod(), tainted)
    assert fits(pod(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]), tainted)
    assert fits(pod(tolerations=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]), tainted)
    assert not fits(pod(tolerations=[{"key": "nvidia.com/gpu", "value": "absent"}]), tainted)
    assert not fits(pod(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}]), tainted)
    assert fits(pod(tolerations=[{"operator": "Exists"}]), tainted), "an empty key with Exists tolerates everything"
    assert fits(pod(), node("n2", taints=[{"key": "k", "effect": "PreferNoSchedule"}]))
    assert not fits(pod(), node("n3", taints=[{"key": "k", "effect": "NoExecute"}]))


def test_cordoned_nodes() -> None:
    cordoned = node("n1", unschedulable=True)
    assert not fits(pod(), cordoned)
    assert fits(pod(tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
                                  "effect": "NoSchedule"}]), cordoned)


def test_allowed_nodes_of_several_pods_and_unknown_nodes() -> None:
    known = {"n1": node("n1", {"team": "ml"}), "n2": node("n2", {"team": "web"}), "n3": node("n3", taints=[GPU_TAINT])}
    names = ["n1", "n2", "n3", "n4"]
    assert allowed_nodes([], names, known) is None
    assert allowed_nodes([pod(tolerations=[{"operator": "Exists"}])], names, known) is None, "nothing to restrict"
    assert allowed_nodes([pod(nodeSelector={"team": "ml"})], names, known) == ["n1", "n4"], "n4 has no Node object"
    both = [pod(nodeSelector={"team": "ml"}), pod(nodeSelector={"team": "web"})]
    assert allowed_nodes(both, names, known) == ["n4"]
    # Unconstrained pods: only the tainted and cordoned nodes need a look.
    assert restricting(known.values()) == {"n3"}
    assert allowed_nodes([pod()], names, known, candidates=["n3"]) == ["n1", "n2", "n4"]


def test_a_heartbeat_places_pods_as_before() -> None:
    a = node("n1", {"team": "ml"}, rv="1")
    assert same_placement(a, node("n1", {"team": "ml"}, rv="2"))
    assert not same_placement(a, node("n1", {"team": "web"}))
    assert not same_placement(a, node("n1", {"team": "ml"}, unschedulable=True))
    assert not same_placement(None, a)
