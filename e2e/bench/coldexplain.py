"""``explain`` of one claim whose selector nothing has evaluated yet (a cold cache), in this process.

The controller's case, and a person's ``dra-driver explain`` of a new claim (issue 43): the
inventory is built and the DeviceClass's grouping too (the controller's warm-up builds both at
start and then freezes them out of the garbage collector's walk, as here), and a claim arrives whose
selector reads a field no selector has read (``memory``, with a literal no selector has used): the
devices must be grouped by what it reads and each group's outcome found. Timed: the engine's
resolve of that claim and its explanation rendered as the controller renders it (summary, JSON
document, text). Each sample starts from a fresh inventory, built and primed untimed.

The fleet is the scale bench's (:mod:`e2e.generators.fleet`: 8 GPUs per node, H100, A100, L4 and T4 in
turn) as the controller's informer holds it; the class is the chart's GPU class. Measured at 1,000
and 5,000 nodes (8,000 and 40,000 GPUs), for the slope. ``python -m e2e.bench.coldexplain`` prints
the figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dra_driver.allocator.inventory import build_inventory
from dra_driver.allocator.resolve import Engine, resolve
from dra_driver.controller.reconciler import GC_THRESHOLDS
from dra_driver.controller.views import slice_view
from e2e.bench.common import percentile
from e2e.bench.scale.inprocess import CLASS_NAME, claim, explained, gpu_class
from e2e.generators.fleet import DRIVER, plugin_slices

NODES = (1000, 5000)
TARGET_MS = 100.0  # at 5,000 nodes


def selector(i: int) -> str:
    """A selector no device satisfies, with a literal of its own."""
    return f'device.capacity["{DRIVER}"].memory.compareTo(quantity("{1024 + i}Gi")) >= 0'


@contextmanager
def as_the_controller() -> Iterator[None]:
    """The cyclic collector as the controller sets it (``dra-driver controller``)."""
    before = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def measure(nodes: int, samples: int) -> dict[str, Any]:
    """Wall and CPU milliseconds per cold explanation, p50 and worst, at ``nodes`` fleet nodes."""
    view = slice_view()
    slices = [view(s) for s in plugin_slices(nodes)]
    classes = {CLASS_NAME: gpu_class()}
    walls, cpus = [], []
    summary = ""
    with as_the_controller():
        for i in range(samples):
            gc.unfreeze()
            inventory = build_inventory(slices)
            Engine().prime(inventory, CLASS_NAME, classes)
            gc.collect()
            gc.freeze()
            t0, c0 = time.perf_counter(), time.process_time()
            res = explained(resolve(claim(f"cold-{i}", selector(i)), inventory, classes))
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            if res.allocation is not None:
                raise RuntimeError("a claim for over 1Ti of GPU memory was allocated")
            summary = res.explanation.summary
            del inventory, res
    return {"nodes": nodes, "devices": nodes * 8, "samples": samples,
            "p50_ms": round(percentile(walls, 50) * 1000, 2), "max_ms": round(max(walls) * 1000, 2),
            "cpu_p50_ms": round(percentile(cpus, 50) * 1000, 2), "summary": summary}


def figures(quick: bool) -> dict[str, dict[str, Any]]:
    samples = 3 if quick else 10
    return {f"{nodes * 8}_devices": measure(nodes, samples) for nodes in NODES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.bench.coldexplain", description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 samples instead of 10")
    args = parser.parse_args(argv)
    print(json.dumps(figures(args.quick), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
