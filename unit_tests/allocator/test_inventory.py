"""The inventory (dra_driver.allocator.inventory): pools and their generations, slices that are garbage,
node selection, what other claims hold, and pools lent from one build to the next; seen through resolve."""

from __future__ import annotations

import json
from typing import Any

from allocfix import CLASSES, NODE_B, D, claim, dev, picked, request, slice_

from dra_driver.allocator.inventory import allocated_state, build_inventory
from dra_driver.allocator.resolve import resolve


def test_incomplete_pool_not_used_and_generations() -> None:
    old = slice_("node-a", [dev("gpu-0")], gen=1, name="old")
    new_part = slice_("node-a", [dev("gpu-5")], gen=2, count=2, name="new")
    inv = build_inventory([old, new_part])
    assert inv.pools[0].generation == 2 and not inv.pools[0].complete
    res = resolve(claim(request()), inv, CLASSES)
    assert res.allocation is None
    assert any("incomplete" in p for p in res.explanation.pools)
    inv = build_inventory([old, new_part, slice_("node-a", [dev("gpu-6")], gen=2, count=2, name="new2")])
    assert picked(resolve(claim(request()), inv, CLASSES)) == ["node-a/gpu-5"]


def test_duplicate_device_names_invalidate_pool() -> None:
    bad = slice_("node-a", [dev("gpu-0"), dev("gpu-0")])
    res = resolve(claim(request()), build_inventory([bad]), CLASSES)
    assert res.allocation is None
    assert any("duplicate device name" in p for p in res.explanation.pools)


def test_garbage_slices_do_not_raise() -> None:
    garbage: list[Any] = [
        {}, {"spec": None}, {"spec": {"driver": D}}, "nonsense",
        {"spec": {"driver": D, "pool": {"name": "p", "generation": "x", "resourceSliceCount": None},
                  "nodeName": "n", "devices": [{"name": 5}, {"name": "ok", "attributes": {"a": {"int": 1, "string": "x"}},
                                                             "capacity": {"m": {"value": "huge"}}}, None]}},
    ]  # fmt: skip
    inv = build_inventory(garbage)
    res = resolve(claim(request()), inv, CLASSES)
    assert res.allocation is None
    res = resolve({"spec": "garbage"}, inv, CLASSES)  # type: ignore[arg-type]
    assert res.allocation is None and res.explanation.summary


def test_already_allocated_and_exclude_uid() -> None:
    other = {"metadata": {"uid": "other"}, "status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": D, "pool": "node-b", "device": "gpu-0"},
        {"request": "gpu", "driver": D, "pool": "node-b", "device": "gpu-1", "adminAccess": True}]}}}}  # fmt: skip
    state = allocated_state([other])
    assert state.devices == {(D, "node-b", "gpu-0")}
    assert allocated_state([other], exclude_uid="other").devices == set()
    res = resolve(claim(request(count=2)), build_inventory([NODE_B]), CLASSES, state)
    assert res.allocation is None
    stages = {s.stage: s.kept for s in res.explanation.requests[0].stages}
    assert stages["not allocated to other claims"] == 1


def test_network_attached_and_node_selector_slices() -> None:
    shared = slice_(None, [dev("gpu-0")], pool="fabric")
    res = resolve(claim(request()), build_inventory([shared]), CLASSES)
    assert res.allocation is not None and "nodeSelector" not in res.allocation
    sel = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}
    rack = slice_(None, [dev("gpu-0")], pool="rack", nodeSelector=sel)
    nodes = [{"metadata": {"name": "n1", "labels": {"zone": "b"}}}, {"metadata": {"name": "n2", "labels": {"zone": "a"}}}]
    res = resolve(claim(request()), build_inventory([rack]), CLASSES, nodes=nodes)
    assert res.allocation is not None and res.allocation["nodeSelector"] == sel
    assert res.node == "n2"


def test_per_device_node_selection() -> None:
    devices = [dev("gpu-0", nodeName="n1"), dev("gpu-1", nodeName="n2")]
    inv = build_inventory([slice_(None, devices, pool="p", perDeviceNodeSelection=True)])
    res = resolve(claim(request()), inv, CLASSES, nodes=["n2"])
    assert picked(res) == ["p/gpu-1"]
    assert res.allocation is not None
    assert res.allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["n2"]


MODEL_B = f'device.attributes["{D}"].model == "B"'


def models(*names: str, node: str = "node-a") -> dict[str, Any]:
    return slice_(node, [dev(f"gpu-{i}", m) for i, m in enumerate(names)])


def test_previous_inventory_lends_unchanged_pools() -> None:
    a, b = models("A", "A"), models("A", node="node-b")
    first = build_inventory([a, b])
    again = build_inventory([a, json.loads(json.dumps(b))], previous=first)  # the same object, and an equal one
    assert all(d is first.by_key[d.key] for d in again.devices)
    assert again.pools[0] is first.pools[0] and again.pools[1] is first.pools[1]


def test_a_changed_slice_rebuilds_its_pool_only() -> None:
    first = build_inventory([models("A", "A"), models("A", node="node-b")])
    assert not resolve(claim(request(selectors=(MODEL_B,))), first, CLASSES).allocated
    # node-a's gpu-1 now publishes model B: node-a is digested again, node-b is taken over.
    second = build_inventory([models("A", "B"), models("A", node="node-b")], previous=first)
    assert all(d is not first.by_key[d.key] for d in second.pool_map[(D, "node-a")].devices)
    assert second.by_key[(D, "node-b", "gpu-0")] is first.by_key[(D, "node-b", "gpu-0")]
    assert picked(resolve(claim(request(selectors=(MODEL_B,))), second, CLASSES)) == ["node-a/gpu-1"]
    # And back: what the previous inventory knew about gpu-1 is not reused either.
    third = build_inventory([models("A", "A"), models("A", node="node-b")], previous=second)
    assert not resolve(claim(request(selectors=(MODEL_B,))), third, CLASSES).allocated


def test_pools_taken_over_are_renumbered_when_an_earlier_pool_changes_size() -> None:
    first = build_inventory([models("A"), models("A", "B", node="node-b")])
    second = build_inventory([models("A", "A"), models("A", "B", node="node-b")], previous=first)
    assert [d.index for d in second.devices] == list(range(4))
    moved = second.by_key[(D, "node-b", "gpu-1")]
    assert moved is not first.by_key[moved.key] and moved.index == 3 and first.by_key[moved.key].index == 2
    assert picked(resolve(claim(request(selectors=(MODEL_B,))), second, CLASSES)) == ["node-b/gpu-1"]


def test_unnamed_slices_are_not_taken_over() -> None:
    unnamed = models("A")
    del unnamed["metadata"]
    first = build_inventory([unnamed])
    second = build_inventory([models("A", node="node-b"), unnamed], previous=first)
    assert second.by_key[(D, "node-a", "gpu-0")] is not first.by_key[(D, "node-a", "gpu-0")]
    assert second.pool_map[(D, "node-a")].slices == ["slice-1"]  # named after its new position


def test_problems_of_pools_taken_over_are_kept() -> None:
    broken = slice_("node-a", [dev("gpu-0"), {"name": "gpu-1", "capacity": {"memory": {"value": "lots"}}}])
    first = build_inventory([broken, models("A", node="node-b")])
    second = build_inventory([broken, models("A", node="node-b")], previous=first)
    assert second.problems == first.problems and any("gpu-1: capacity memory" in p for p in second.problems)


def test_devices_sharing_a_broken_map_each_report_it() -> None:
    """Decoded slices share equal maps between devices; each device still names its own problems."""
    attributes = {"model": {"string": "A", "int": 1}, "ok": {"string": "x"}}
    capacity = {"memory": {"value": "lots"}}
    devices = [{"name": f"gpu-{i}", "attributes": attributes, "capacity": capacity} for i in range(2)]
    devices.append({"name": "gpu-2", "attributes": {"model": {"string": "A"}}, "capacity": {"memory": {"value": "8Gi"}}})
    inv = build_inventory([slice_("node-a", devices)])
    for name in ("gpu-0", "gpu-1"):
        d = inv.by_key[(D, "node-a", name)]
        assert not d.cel_clean
        assert d.problems == ("attribute model: exactly one value type must be set", "capacity memory: invalid quantity")
        assert sum(f"/{name}: " in p for p in inv.problems) == 2
    assert inv.by_key[(D, "node-a", "gpu-2")].cel_clean and not inv.by_key[(D, "node-a", "gpu-2")].problems


def test_a_shared_value_is_judged_for_every_map_that_holds_it() -> None:
    """Each value is checked once per build (the decoded maps share equal values, the GPU's own
    UUID aside): a broken one still makes every device holding it report it under its own name,
    and a version the CEL input cannot convert makes each of them unclean."""
    broken, odd, fine = {"string": "A", "int": 1}, {"version": "not-a-version"}, {"string": "x"}
    devices = [{"name": f"gpu-{i}", "attributes": {"uuid": {"string": f"GPU-{i}"}, "model": broken, "ok": fine}}
               for i in range(2)]
    devices += [{"name": f"gpu-{i}", "attributes": {"uuid": {"string": f"GPU-{i}"}, "driver": odd, "ok": fine}}
                for i in (2, 3)]
    devices.append({"name": "gpu-4", "attributes": {"uuid": {"string": "GPU-4"}, "ok": fine}})
    inv = build_inventory([slice_("node-a", devices)])
    for i in range(4):
        d = inv.by_key[(D, "node-a", f"gpu-{i}")]
        assert not d.cel_clean
        assert d.problems == (("attribute model: exactly one value type must be set",) if i < 2 else ())
    assert inv.by_key[(D, "node-a", "gpu-4")].cel_clean
    assert sorted(d.key[2] for d in inv.unclean) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def test_allocated_state_over_many_claims() -> None:
    claims = [{"metadata": {"uid": f"u{i}"}, "status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": D, "pool": f"node-{i // 8}", "device": f"gpu-{i % 8}"}]}}}} for i in range(800)]
    claims.append({"metadata": {"uid": "shared"}, "status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": D, "pool": "node-0", "device": "gpu-0", "shareID": "s",
         "consumedCapacity": {"memory": "1Gi"}}]}}}})
    claims.append({"metadata": {"uid": "pending"}})
    state = allocated_state(claims, exclude_uid="u0")
    assert len(state.devices) == 799 and (D, "node-0", "gpu-0") not in state.devices
    assert state.shared == {(D, "node-0", "gpu-0"): {"memory": 2**30}}  # as written, like the device's name
