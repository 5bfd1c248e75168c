"""Synthetic ResourceSlices and a resolution micro-benchmark, for the benchmarks and their tests."""

from __future__ import annotations

from typing import Any

from dra_driver.allocator.inventory import AllocatedState, build_inventory
from dra_driver.allocator.resolve import resolve

# =========================================================================== benchmark


def synthetic_slices(nodes: int = 100, gpus: int = 8, driver: str = "gpu.dra-driver.io") -> list[dict[str, Any]]:
    """One slice per node with ``gpus`` GPUs (two NUMA nodes) for benchmarks."""
    out = []
    for n in range(nodes):
        node = f"node-{n:03d}"
        devices = [
            {
                "name": f"gpu-{g}",
                "attributes": {
                    "model": {"string": "H100" if g % 2 == 0 else "A100"},
                    "index": {"int": g},
                    "numa.dra-driver.io/node": {"int": g // (gpus // 2 or 1)},
                    "driverVersion": {"version": "550.54.15"},
                },
                "capacity": {"memory": {"value": "80Gi"}},
            }
            for g in range(gpus)
        ]
        out.append({
            "metadata": {"name": f"{node}-gpu"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices},
        })  # fmt: skip
    return out


def benchmark_resolve(claims: int = 100, nodes: int = 100, gpus: int = 8) -> dict[str, float]:
    """Time ``resolve`` for ``claims`` claims over a synthetic ``nodes`` x ``gpus`` inventory."""
    import time

    t0 = time.perf_counter()
    inventory = build_inventory(synthetic_slices(nodes, gpus))
    t1 = time.perf_counter()
    classes = [{"metadata": {"name": "gpu"}, "spec": {"selectors": [
        {"cel": {"expression": 'device.driver == "gpu.dra-driver.io"'}}]}}]  # fmt: skip
    claim = {
        "metadata": {"name": "bench", "namespace": "default", "uid": "bench"},
        "spec": {"devices": {
            "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu", "count": 2, "selectors": [
                {"cel": {"expression": 'device.attributes["gpu.dra-driver.io"].model == "H100" && '
                                       'device.capacity["gpu.dra-driver.io"].memory.compareTo(quantity("40Gi")) >= 0'}}]}}],
            "constraints": [{"matchAttribute": "numa.dra-driver.io/node"}],
        }},
    }  # fmt: skip
    timings = []
    allocated = AllocatedState()
    for _ in range(claims):
        start = time.perf_counter()
        res = resolve(claim, inventory, classes, allocated)
        timings.append(time.perf_counter() - start)
        if res.allocation is None:
            break
        for r in res.allocation["devices"]["results"]:
            allocated.devices.add((r["driver"], r["pool"], r["device"]))
    timings_sorted = sorted(timings)
    return {
        "inventory_s": t1 - t0,
        "claims": float(len(timings)),
        "first_ms": timings[0] * 1000,
        "median_ms": timings_sorted[len(timings) // 2] * 1000,
        "max_ms": timings_sorted[-1] * 1000,
        "total_s": sum(timings),
    }
