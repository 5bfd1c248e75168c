"""Node selectors read once (dra_driver.k8s.objects.selector_terms): matched against a node, and described."""

from __future__ import annotations

from typing import Any

from dra_driver.k8s.objects import Node, as_mappings, describe_node_selector, selector_matches


def selector(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeSelectorTerms": list(terms)}


def field_in(*names: str) -> dict[str, Any]:
    return {"matchFields": [{"key": "metadata.name", "operator": "In", "values": list(names)}]}


NODE_A = Node("node-a", (("zone", "z1"), ("kubernetes.io/hostname", "node-a")))


def test_a_term_matches_when_all_its_requirements_do() -> None:
    assert selector_matches(selector(field_in("node-a")), NODE_A)
    assert not selector_matches(selector(field_in("node-b")), NODE_A)
    zone = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}
    both = {**zone, **field_in("node-b")}
    assert selector_matches(selector(zone), NODE_A) and not selector_matches(selector(both), NODE_A)
    assert selector_matches(selector(both, field_in("node-a")), NODE_A), "terms are ORed"
    assert not selector_matches(selector({}), NODE_A), "an empty term matches nothing"
    assert selector_matches(selector(field_in("node-b")), Node(None)), "an anonymous node is optimistic"


def test_garbage_terms_match_nothing_and_do_not_raise() -> None:
    for sel in ({"nodeSelectorTerms": "x"}, {"nodeSelectorTerms": [None, 3, {"matchFields": "y"}]}):
        assert not selector_matches(sel, NODE_A)


def test_describe_names_pinned_nodes() -> None:
    assert describe_node_selector(None) == "any node"
    assert describe_node_selector({"nodeSelector": None}) == "any node"
    assert describe_node_selector({"nodeSelector": selector(field_in("node-a"), field_in("node-b", "node-a"))}) == (
        "node node-a, node-b")
    host = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["h1"]}]}
    assert describe_node_selector({"nodeSelector": selector(host)}) == "node h1"


def test_describe_falls_back_to_the_selector_itself() -> None:
    zone = {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["z2"]}]}
    assert describe_node_selector({"nodeSelector": selector(zone)}) == (
        'nodes matching {"nodeSelectorTerms":[{"matchExpressions":[{"key":"zone","operator":"NotIn","values":["z2"]}]}]}')
    assert describe_node_selector({"nodeSelector": "garbage"}) == 'nodes matching "garbage"'


def test_as_mappings_keeps_the_mappings_of_a_list_only() -> None:
    assert as_mappings([{"a": 1}, "x", None, 3, {"b": 2}]) == [{"a": 1}, {"b": 2}]
    for not_a_list in (None, "abc", {"a": 1}, 7, ({"a": 1},)):
        assert as_mappings(not_a_list) == []
