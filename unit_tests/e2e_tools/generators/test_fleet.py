"""The fleet's slices are the plugin's own, for every node, not only the template's."""

from __future__ import annotations

import pytest

from dra_driver.allocator.inventory import build_inventory
from e2e.generators import fleet


@pytest.mark.parametrize("index", [0, 1, 2, 3, 4100])
def test_plain_node_equals_the_plugin_path(index: int) -> None:
    (got,) = fleet.plugin_slices(1, first=index)
    kind = fleet.node_kind(index, mig=False)
    assert [got] == fleet.plugin_path_slices(kind, fleet.node_name(index))


@pytest.mark.parametrize("index", [7, 8])
def test_dynamic_mig_node_equals_the_plugin_path(index: int) -> None:
    got = fleet.plugin_slices(1, mig_nodes=1, first=index)
    kind = fleet.node_kind(index, mig=True)
    assert got == fleet.plugin_path_slices(kind, fleet.node_name(index))
    assert got[0]["spec"].get("sharedCounters"), "a dynamic-MIG node publishes its counter sets first"
    assert len(got) > 2


def test_nodes_differ_in_uuids_and_names_and_mix_models() -> None:
    slices = fleet.plugin_slices(8)
    assert [s["spec"]["nodeName"] for s in slices] == [f"gpu-node-{i}" for i in range(1, 9)]
    uuids = [d["attributes"]["uuid"]["string"] for s in slices for d in s["spec"]["devices"]]
    assert len(uuids) == len(set(uuids)) == 64
    products = {d["attributes"]["productName"]["string"] for s in slices for d in s["spec"]["devices"]}
    assert len(products) == 4
    memories = {d["capacity"]["memory"]["value"] for s in slices for d in s["spec"]["devices"]}
    assert len(memories) == 4
    assert len({s["metadata"]["name"] for s in slices}) == 8


def test_the_allocator_reads_the_fleet() -> None:
    inventory = build_inventory(fleet.plugin_slices(6, mig_nodes=2))
    assert len({d.node_name for d in inventory.devices}) == 6


def test_owned_by_adds_the_node_reference_without_touching_the_template() -> None:
    (s,) = fleet.plugin_slices(1)
    owned = fleet.owned_by(s, "uid-1")
    assert owned["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1", "uid": "uid-1", "controller": True}]
    assert "ownerReferences" not in s["metadata"]


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="mig_nodes"):
        fleet.plugin_slices(2, mig_nodes=3)
