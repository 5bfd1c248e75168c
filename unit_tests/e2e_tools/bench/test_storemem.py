"""The informer-memory bench (e2e.bench.storemem) shows what the controller's projections
(dra_driver.controller.views) are for: what each object leaves allocated in a store, whole and kept."""

from __future__ import annotations

from e2e.bench.storemem import measure


def test_memory_per_object_before_and_after() -> None:
    """The projections' purpose, measured through the real client: pods and claims that need no
    work cost close to nothing, slices a third."""
    got = measure(200)
    assert got["pod, no claim"]["whole"] > 10_000 and got["pod, no claim"]["kept"] < 200
    assert got["pod, no claim"]["kept_objects"] == 0
    assert got["pod with a claim"]["kept"] < 2_500 < 10_000 < got["pod with a claim"]["whole"]
    assert got["claim, allocated"]["kept"] < 2_500 < 5_000 < got["claim, allocated"]["whole"]
    assert got["claim, pending"]["kept"] < 0.6 * got["claim, pending"]["whole"]
    assert got["claim, explained"]["kept"] < 4_000 < 15_000 < got["claim, explained"]["whole"]
    assert got["slice, 8 GPUs"]["kept"] < 0.4 * got["slice, 8 GPUs"]["whole"]
    assert got["slice, 64 MIG"]["kept"] < 0.2 * got["slice, 64 MIG"]["whole"]
