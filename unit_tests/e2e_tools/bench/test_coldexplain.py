"""The cold-selector explain row measures what it says: a claim no device satisfies, each sample with
a selector literal nothing evaluated before, on a fresh inventory whose class grouping is built."""

from __future__ import annotations

import gc

import pytest

from dra_driver.allocator import groups
from e2e.bench import coldexplain


def test_each_sample_reads_a_new_selector_on_a_primed_fresh_inventory(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    real_build, real_inventory = groups._build, coldexplain.build_inventory

    def grouping(inventory: object, projection: groups.Projection, *rest: object) -> groups.Partition:
        built.append("request" if projection.within else "class")
        return real_build(inventory, projection, *rest)  # type: ignore[arg-type]

    def inventory(slices: object) -> object:
        built.append("inventory")
        return real_inventory(slices)  # type: ignore[arg-type]

    monkeypatch.setattr(groups, "_build", grouping)
    monkeypatch.setattr(coldexplain, "build_inventory", inventory)
    threshold = gc.get_threshold()
    figures = coldexplain.measure(nodes=4, samples=2)
    assert gc.get_threshold() == threshold
    assert figures["devices"] == 32 and figures["samples"] == 2
    assert figures["summary"].startswith("cannot allocate")
    assert 0 < figures["p50_ms"] <= figures["max_ms"]
    # Per sample: a fresh inventory, the class's grouping (the warm-up), the request's within it.
    assert built == ["inventory", "class", "request"] * 2
    assert coldexplain.selector(0) != coldexplain.selector(1)
