"""Which nodes a pod could be scheduled to, as far as a claim's devices are concerned: the
kube-scheduler's filters that read only the pod and the Node (``NodeName``, ``NodeAffinity``
(``nodeSelector`` and required node affinity), ``TaintToleration``, ``NodeUnschedulable``), so that
the controller never hands a claim devices on a node its pod could not run on. Resource fit, ports
and pod (anti-)affinity are left to the scheduler: they change by the minute and do not confine a
tenant to its nodes. Pure functions over the views :func:`node_view` and the pod's spec."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dra_driver.k8s.objects import Node, Obj, as_list, as_mapping, as_str, meta, selector_matches

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
"""The taint the NodeUnschedulable filter lets a pod tolerate on a cordoned node."""


def node_view(node: Obj) -> Obj | None:
    """What the controller keeps of a Node: its name, labels, taints and whether it is cordoned."""
    m = meta(node)
    spec = as_mapping(node.get("spec"))
    view: Obj = {"metadata": {"name": m.get("name"), "resourceVersion": m.get("resourceVersion"),
                              "labels": dict(as_mapping(m.get("labels")))},
                 "spec": {"taints": [dict(as_mapping(t)) for t in as_list(spec.get("taints"))],
                          "unschedulable": spec.get("unschedulable") is True}}
    return view


def same_placement(old: Obj | None, new: Obj | None) -> bool:
    """Whether two node views place pods alike (a heartbeat changes nothing the filters read)."""
    return _placing(old) == _placing(new)


def _placing(view: Obj | None) -> tuple[Any, Any] | None:
    return None if view is None else (meta(view).get("labels"), view.get("spec"))


def _tolerates(tol: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """core/v1 ``Toleration.ToleratesTaint``."""
    effect = as_str(tol.get("effect")) or ""
    if effect and effect != taint.get("effect"):
        return False
    key = as_str(tol.get("key")) or ""
    if key and key != taint.get("key"):
        return False
    operator = as_str(tol.get("operator")) or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (as_str(tol.get("value")) or "") == (as_str(taint.get("value")) or "")


def _required_affinity(pod_spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    affinity = as_mapping(as_mapping(pod_spec.get("affinity")).get("nodeAffinity"))
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    return required if isinstance(required, Mapping) else None


def fits(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether the scheduler's node filters above let ``pod`` onto ``node`` (a :func:`node_view`)."""
    spec = as_mapping(pod.get("spec"))
    name = as_str(meta(node).get("name")) or ""
    pinned = as_str(spec.get("nodeName"))
    if pinned and pinned != name:
        return False
    labels = {str(k): str(v) for k, v in as_mapping(meta(node).get("labels")).items()}
    for k, v in as_mapping(spec.get("nodeSelector")).items():
        if labels.get(str(k)) != str(v):
            return False
    required = _required_affinity(spec)
    if required is not None and not selector_matches(required, Node(name, tuple(sorted(labels.items())))):
        return False
    tolerations = [as_mapping(t) for t in as_list(spec.get("tolerations"))]
    node_spec = as_mapping(node.get("spec"))
    if node_spec.get("unschedulable") is True and not any(
            _tolerates(t, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}) for t in tolerations):
        return False
    for taint in as_list(node_spec.get("taints")):
        taint = as_mapping(taint)
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(_tolerates(t, taint) for t in tolerations):
            return False
    return True


def placement_key(pod: Mapping[str, Any]) -> tuple[Any, ...]:
    """What :func:`fits` reads of a pod, hashable: pods made from one template share their answers."""
    spec = as_mapping(pod.get("spec"))
    return (as_str(spec.get("nodeName")), repr(sorted(as_mapping(spec.get("nodeSelector")).items())),
            repr(_required_affinity(spec)), repr(as_list(spec.get("tolerations"))))


def unconstrained(pod: Mapping[str, Any]) -> bool:
    """A pod without node selector, required affinity or pinned node: only node taints and
    cordons can keep it off a node."""
    spec = as_mapping(pod.get("spec"))
    return not spec.get("nodeName") and not spec.get("nodeSelector") and _required_affinity(spec) is None


def allowed_nodes(pods: Sequence[Mapping[str, Any]], node_names: Sequence[str],
                  known: Mapping[str, Mapping[str, Any]], candidates: Iterable[str] | None = None) -> list[str] | None:
    """The names among ``node_names`` (the nodes with devices) that every one of ``pods`` fits,
    in order; None when that is all of them (nothing to restrict). Only ``candidates`` (default:
    all of them) are looked at: for unconstrained pods, the :func:`restricting` nodes. A node
    without a Node object is kept: the filters cannot read it, and the scheduler will not place a
    pod there before it exists."""
    if not pods:
        return None
    looked_at = node_names if candidates is None else candidates
    excluded = {n for n in looked_at if (node := known.get(n)) is not None and not all(fits(p, node) for p in pods)}
    return [n for n in node_names if n not in excluded] if excluded else None


def restricting(nodes: Iterable[Mapping[str, Any]]) -> set[str]:
    """The nodes an unconstrained pod may not fit: tainted or cordoned ones."""
    return {as_str(meta(n).get("name")) or "" for n in nodes
            if as_mapping(n.get("spec")).get("unschedulable") is True
            or any(as_mapping(t).get("effect") in ("NoSchedule", "NoExecute")
                   for t in as_list(as_mapping(n.get("spec")).get("taints")))}
