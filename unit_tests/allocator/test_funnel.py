"""The funnel (dra_driver.allocator.funnel): how a failed claim is explained, stage by stage and node by node."""

from __future__ import annotations

import json

from allocfix import CLASSES, NODE_A, NODE_B, D, claim, picked, request

from dra_driver.allocator.inventory import build_inventory
from dra_driver.allocator.resolve import resolve


def test_request_selectors_and_funnel() -> None:
    sel = f'device.attributes["{D}"].model == "A100"'
    res = resolve(claim(request(count=2, selectors=(sel,))), build_inventory([NODE_A, NODE_B]), CLASSES)
    assert res.allocation is None
    info = res.explanation.requests[0]
    assert [(s.stage, s.kept) for s in info.stages][:4] == [
        ("devices published", 6), ("in complete, valid pools", 6),
        ("class gpu selector #0", 6), ("request gpu selector #0", 1)]  # fmt: skip
    assert info.closest and "is false" in info.closest[0].failed
    assert "not enough devices" in res.explanation.summary


def test_all_nodes_tried_and_explained() -> None:
    res = resolve(claim(request(count=3)), build_inventory([NODE_B, NODE_A]), CLASSES, nodes=["node-b", "node-a"])
    assert picked(res)[0].startswith("node-a/")
    res = resolve(claim(request(count=3)), build_inventory([NODE_B]), CLASSES)
    assert res.allocation is None
    assert "not enough" in res.explanation.summary


def test_explanation_outputs() -> None:
    sel = tuple(f'device.attributes["{D}"].model == "{"X" * 300}{i}"' for i in range(5))
    res = resolve(claim(request(count=2, selectors=sel)), build_inventory([NODE_A, NODE_B]), CLASSES)
    assert len(res.explanation.summary.encode()) <= 1024
    assert "request gpu" in res.explanation.render()
    json.dumps(res.explanation.to_dict())
