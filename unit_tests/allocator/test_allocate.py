"""``allocate``: the allocation ``resolve`` makes, without the explanation, on the differential's
generated scenarios (``e2e.generators.scenarios``), each claim allocated again and again as ``fit``
does (the next one against what the earlier ones took), with and without ``skip_before``."""

from __future__ import annotations

import random

import pytest
from allocfix import CLASSES, claim, dev, request, slice_

from dra_driver.allocator.inventory import AllocatedState, Inventory, allocated_state, build_inventory
from dra_driver.allocator.resolve import allocate, resolve
from dra_driver.allocator.rules import SchedulerRules
from dra_driver.k8s.claims import device_ids
from dra_driver.tools.fleet.fit import copied, merge
from e2e.generators.scenarios import generate_many

RULES = (SchedulerRules(), SchedulerRules.for_version("v1.37.2"))


def _held(state: AllocatedState, c: dict[str, object], allocation: dict[str, object]) -> AllocatedState:
    after = copied(state)
    merge(after, allocated_state([{**c, "status": {"allocation": allocation}}]))
    return after


def _node_position(inventory: Inventory, allocation: dict[str, object]) -> int:
    nodes = [d.node_name for k in sorted(device_ids(allocation)) if (d := inventory.by_key.get(k)) and d.node_name]
    return inventory.node_positions.get(nodes[0], 0) if nodes else 0


def _again_and_again(c: dict[str, object], inventory: Inventory, classes: object, state: AllocatedState | None,
                     rules: SchedulerRules, tries: int = 4) -> int:
    """Allocate ``c`` ``tries`` times (a new UID each), comparing at every step; how many fitted."""
    state = state or AllocatedState()
    skip = 0
    for i in range(tries):
        attempt = {**c, "metadata": {**c["metadata"], "name": f"c-{i}", "uid": f"uid-{i}"}}  # type: ignore[dict-item]
        full = resolve(attempt, inventory, classes, state, rules=rules)  # type: ignore[arg-type]
        assert not any("internal error" in e for e in full.explanation.errors), full.explanation.errors
        assert allocate(attempt, inventory, classes, state, rules=rules) == full.allocation  # type: ignore[arg-type]
        assert allocate(attempt, inventory, classes, state, rules=rules, skip_before=skip) == full.allocation  # type: ignore[arg-type]
        if full.allocation is None:
            return i
        skip = _node_position(inventory, full.allocation)
        state = _held(state, attempt, full.allocation)
    return tries


@pytest.mark.parametrize("first", range(0, 320, 80))
def test_generated_scenarios_allocate_as_resolve_does(first: int) -> None:
    features = frozenset({"selectors", "all", "constraints", "firstAvailable", "counters", "taints", "taint-none",
                          "shares"})
    fitted = 0
    for sc in generate_many(first, 80, nodes=("node-0", "node-1", "node-2"), features=features):
        inventory = build_inventory(sc.slices)
        rng = random.Random(sc.seed)
        others = AllocatedState()
        for sl in sc.slices:
            for d in sl["spec"].get("devices") or []:
                if not d.get("allowMultipleAllocations") and rng.random() < 0.2:
                    others.devices.add((sl["spec"]["driver"], sl["spec"]["pool"]["name"], d["name"]))
        for rules in RULES:
            for state in (None, others):
                fitted += _again_and_again(sc.claim, inventory, sc.classes, state, rules)
    assert fitted > 50  # the scenarios allocate, not only fail


def test_skip_before_is_not_used_where_the_search_must_reach_every_node() -> None:
    # An All request must see every node: the nodes before skip_before are searched all the same
    # (an All request on node-a takes all its devices; skipping node-a would pick node-b).
    slices = [slice_("node-a", [dev("gpu-0"), dev("gpu-1")]), slice_("node-b", [dev("gpu-0")])]
    inventory = build_inventory(slices)
    c = claim(request(count=None, allocationMode="All"))
    full = resolve(c, inventory, CLASSES)
    assert full.allocation is not None and full.node == "node-a"
    assert allocate(c, inventory, CLASSES, skip_before=1) == full.allocation


def test_a_claim_that_cannot_be_parsed_is_left_to_resolve() -> None:
    inventory = build_inventory([slice_("node-a", [dev("gpu-0")])])
    broken = claim(request(cls="broken"))
    assert resolve(broken, inventory, CLASSES).allocation is None
    assert allocate(broken, inventory, CLASSES) is None
