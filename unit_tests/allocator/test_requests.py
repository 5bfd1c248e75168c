"""A claim's requests (dra_driver.allocator.requests): classes, CEL that does not compile, counts; seen through resolve."""

from __future__ import annotations

from typing import Any

import pytest
from allocfix import CLASSES, NODE_A, claim, request

from dra_driver.allocator.inventory import build_inventory
from dra_driver.allocator.resolve import resolve


def test_missing_class_is_clear_error() -> None:
    res = resolve(claim(request(cls="nope")), build_inventory([NODE_A]), CLASSES)
    assert res.allocation is None
    assert "device class nope not found" in res.explanation.summary


@pytest.mark.parametrize(("cls", "feature"), [("vfio.gpu.nvidia.com", "VFIO passthrough"),
                                              ("compute-domain-default-channel.nvidia.com", "ComputeDomains")])
def test_nvidia_class_of_a_feature_this_driver_lacks(cls: str, feature: str) -> None:
    res = resolve(claim(request(cls=cls)), build_inventory([NODE_A]), CLASSES)
    assert res.allocation is None
    assert f"device class {cls} not found: it is NVIDIA's {feature}" in res.explanation.summary
    assert "this driver does not have" in res.explanation.summary


def test_malformed_cel_is_error_not_crash() -> None:
    res = resolve(claim(request(selectors=("device.attributes[",))), build_inventory([NODE_A]), CLASSES)
    assert res.allocation is None
    assert "CEL compile error" in res.explanation.summary
    res = resolve(claim(request(cls="broken")), build_inventory([NODE_A]), CLASSES)
    assert res.allocation is None and "compile" in res.explanation.summary


@pytest.mark.parametrize("count", [0, -1, 10**12, True])
def test_bad_counts(count: Any) -> None:
    res = resolve(claim(request(count=count)), build_inventory([NODE_A]), CLASSES)
    assert res.allocation is None
    assert res.explanation.summary.startswith("cannot allocate")
