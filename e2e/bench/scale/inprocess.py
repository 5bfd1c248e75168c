"""The allocator at fleet scale, in this process: ``python -m e2e.bench.scale.inprocess --nodes 5000``.

The slices are the plugin's own (:mod:`e2e.generators.fleet`: 8 GPUs per node, four models), the class
is the chart's ``gpu.gpu.dra-driver.io`` (``deploy/deviceclasses/gpu.yaml``), claims ask for one
GPU with a selector on ``productName``. Rows (issue 30):

* **first claim**: building the inventory, then resolving the first fitting claim (what the
  controller does for the first claim after start), with the memory both leave behind (RSS);
* **fitting claim**: with ``--claims`` GPUs allocated (the first nodes of the inventory filled, as
  first-fit fills them: the hard case for a search that walks the nodes in order), one fitting
  claim after another, each allocation counted for the next; p50 and p90;
* **explain**: a claim no device satisfies (``memory >= 1Ti``), resolved and rendered as the
  controller renders it (summary, JSON document, text), p50; its extra memory is the traced peak
  above what was allocated before (tracemalloc, in a pass of its own: tracing slows the clock);
* **cel import**: what importing the allocator's CEL package loads (a fresh interpreter).

``--profile`` adds where the time went (cProfile, top functions by own time) for the first claim
and one explanation, and ``--json PATH`` writes every figure.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from dra_driver.allocator.inventory import AllocatedState, Inventory, build_inventory
from dra_driver.allocator.resolve import Resolution, resolve
from dra_driver.controller.views import slice_view
from e2e.bench.common import REPO, percentile
from e2e.generators.fleet import DRIVER, plugin_slices

GPU_CLASS = REPO / "deploy" / "deviceclasses" / "gpu.yaml"
PRODUCT = "NVIDIA H100 80GB HBM3"
FIT_SELECTOR = f'device.attributes["{DRIVER}"].productName == "{PRODUCT}"'
UNSATISFIABLE_SELECTOR = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("1Ti")) >= 0'
CEL_CLI_MODULES = ("typer", "prompt_toolkit", "rich", "pygments")


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def gpu_class() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(GPU_CLASS.read_text())
    return data


CLASS_NAME = gpu_class()["metadata"]["name"]


def claim(name: str, selector: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": CLASS_NAME, "count": 1,
                "selectors": [{"cel": {"expression": selector}}]}}]}}}


def explained(resolution: Resolution) -> Resolution:
    """The resolution, rendered as the controller renders it (controller/verdicts.evaluate)."""
    expl = resolution.explanation
    _ = expl.summary, json.dumps(expl.to_dict(), default=str), expl.render()
    return resolution


def packed(inventory: Inventory, count: int) -> AllocatedState:
    """``count`` devices allocated, the inventory's first nodes filled first."""
    state = AllocatedState()
    by_node: dict[str, list[Any]] = {}
    for d in inventory.devices:
        by_node.setdefault(d.node_name or "", []).append(d)
    for node in inventory.node_names:
        for d in by_node.get(node, []):
            if len(state.devices) >= count:
                return state
            state.devices.add(d.key)
    return state


def profiled(fn: Callable[[], Any], top: int = 25) -> str:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def traced_extra_mib(fn: Callable[[], Any]) -> float:
    """Peak traced memory while ``fn`` runs, above what was traced before it."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return (peak - before) / 2**20


def traced_kept_mib(fn: Callable[[], Any]) -> tuple[Any, float]:
    """What ``fn`` returns, and the traced memory it still holds (what it built and kept)."""
    gc.collect()
    tracemalloc.start()
    value = fn()
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return value, kept / 2**20


def cel_import() -> dict[str, Any]:
    code = ("import resource, sys; import dra_driver.allocator.cel.compile; "
            f"print(sorted(m for m in {CEL_CLI_MODULES!r} if m in sys.modules)); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024); print(len(sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    loaded, rss, modules = out.strip().splitlines()
    return {"cli_modules_loaded": loaded, "max_rss_mib": round(float(rss), 1), "modules": int(modules)}


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """(what ``fn`` returned, wall seconds, CPU seconds of this process): on a machine shared with
    other work the CPU time is what the code itself cost."""
    t0, c0 = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - t0, time.process_time() - c0


def stats(samples: list[tuple[float, float]]) -> dict[str, float]:
    walls, cpus = [w for w, _ in samples], [c for _, c in samples]
    return {"p50_ms": round(percentile(walls, 50) * 1000, 2), "p90_ms": round(percentile(walls, 90) * 1000, 2),
            "cpu_p50_ms": round(percentile(cpus, 50) * 1000, 2)}


def run(nodes: int, claims: int, samples: int, mig_nodes: int, profile: bool) -> dict[str, Any]:
    figures: dict[str, Any] = {"nodes": nodes, "mig_nodes": mig_nodes, "allocated_claims": claims,
                               "load_before": os.getloadavg()[0]}
    classes = [gpu_class()]
    # As the controller's informer holds them: equal values shared between devices.
    view = slice_view()
    slices, wall, _ = timed(lambda: [view(s) for s in plugin_slices(nodes, mig_nodes=mig_nodes)])
    figures["fleet_build_s"] = round(wall, 2)
    gc.collect()
    rss0 = rss_mib()
    figures["rss_slices_mib"] = round(rss0, 1)

    # -- the first claim after start
    inventory, inv_wall, inv_cpu = timed(lambda: build_inventory(slices))
    first, res_wall, res_cpu = timed(lambda: explained(resolve(claim("first", FIT_SELECTOR), inventory, classes)))
    if first.allocation is None:
        raise RuntimeError(f"the first claim did not fit: {first.explanation.summary}")
    gc.collect()
    figures["devices"] = len(inventory.devices)
    figures["first_claim"] = {"inventory_s": round(inv_wall, 3), "resolve_s": round(res_wall, 3),
                              "total_s": round(inv_wall + res_wall, 3), "cpu_s": round(inv_cpu + res_cpu, 3),
                              "rss_added_mib": round(rss_mib() - rss0, 1)}
    # The same, traced: what the inventory and the first claim's caches hold.
    def first_claim() -> Any:
        inv = build_inventory(slices)
        explained(resolve(claim("first-traced", FIT_SELECTOR), inv, classes))
        return inv

    _, figures["first_claim"]["traced_mib"] = traced_kept_mib(first_claim)
    figures["first_claim"]["traced_mib"] = round(figures["first_claim"]["traced_mib"], 1)
    # A slice update: one node's slice changes, the controller rebuilds with its last inventory.
    changed = [*slices[:-1], json.loads(json.dumps(slices[-1]))]
    changed[-1]["spec"]["pool"]["generation"] += 1
    rebuilt, wall, cpu = timed(lambda: build_inventory(changed, previous=inventory))
    figures["inventory_after_one_slice_changed"] = {"s": round(wall, 3), "cpu_s": round(cpu, 3)}
    _, wall, cpu = timed(lambda: explained(resolve(claim("after-change", FIT_SELECTOR), rebuilt, classes)))
    figures["claim_after_one_slice_changed"] = {"s": round(wall, 3), "cpu_s": round(cpu, 3)}
    if profile:
        fresh = build_inventory(slices)
        figures["profile_inventory"] = profiled(lambda: build_inventory(slices))
        figures["profile_first_claim"] = profiled(
            lambda: explained(resolve(claim("first-profiled", FIT_SELECTOR), fresh, classes)))
        del fresh

    # -- explain with every GPU free
    def unsatisfiable(name: str, allocated: AllocatedState | None = None) -> Resolution:
        res = explained(resolve(claim(name, UNSATISFIABLE_SELECTOR), inventory, classes, allocated))
        if res.allocation is not None:
            raise RuntimeError("a claim for 1Ti of GPU memory was allocated")
        return res

    runs = [timed(lambda i=i: unsatisfiable(f"big-free-{i}")) for i in range(samples)]
    figures["explain_free"] = stats([(w, c) for _, w, c in runs])
    text = runs[-1][0].explanation.render()

    # -- fitting claims with `claims` GPUs allocated, each allocation counted for the next
    allocated = packed(inventory, claims)
    fits = []
    for i in range(samples):
        res, wall, cpu = timed(lambda i=i: explained(resolve(claim(f"fit-{i}", FIT_SELECTOR), inventory, classes,
                                                             allocated)))
        if res.allocation is None:
            raise RuntimeError(f"fitting claim {i} was not allocated: {res.explanation.summary}")
        allocated.devices.update((r["driver"], r["pool"], r["device"]) for r in res.allocation["devices"]["results"])
        fits.append((wall, cpu))
    figures["fitting_claim"] = {**stats(fits), "node": res.node}
    if profile:
        figures["profile_fitting_claim"] = profiled(
            lambda: explained(resolve(claim("fit-profiled", FIT_SELECTOR), inventory, classes, allocated)))

    # -- explain an unsatisfiable claim, same allocated state
    runs = [timed(lambda i=i: unsatisfiable(f"big-{i}", allocated)) for i in range(samples)]
    figures["explain"] = stats([(w, c) for _, w, c in runs])
    figures["explain"]["extra_mib"] = round(traced_extra_mib(lambda: unsatisfiable("big-traced", allocated)), 2)
    figures["explain_text"] = text
    if profile:
        figures["profile_explain"] = profiled(lambda: unsatisfiable("big-profiled", allocated))
    gc.collect()
    figures["rss_end_mib"] = round(rss_mib(), 1)
    figures["cel_import"] = cel_import()
    figures["load_after"] = os.getloadavg()[0]
    return figures


def report(f: dict[str, Any]) -> str:
    first, fit, free, big = f["first_claim"], f["fitting_claim"], f["explain_free"], f["explain"]

    def ms(row: dict[str, Any]) -> str:
        return f"p50 {row['p50_ms']} ms, p90 {row['p90_ms']} ms (CPU p50 {row['cpu_p50_ms']} ms)"

    lines = [
        f"fleet: {f['nodes']} nodes ({f['mig_nodes']} with dynamic MIG), {f['devices']} devices; "
        f"slices built in {f['fleet_build_s']} s, RSS with the slices {f['rss_slices_mib']} MiB; "
        f"load average {f['load_before']:.1f} before, {f['load_after']:.1f} after",
        f"first claim after start: {first['total_s']:.3f} s (inventory {first['inventory_s']:.3f} s, resolve "
        f"{first['resolve_s']:.3f} s; CPU {first['cpu_s']:.3f} s), +{first['rss_added_mib']} MiB RSS, "
        f"{first['traced_mib']} MiB traced   [target <= 1 s, <= 100 MiB]",
        f"inventory rebuilt after one slice changed: {f['inventory_after_one_slice_changed']['s']} s "
        f"(CPU {f['inventory_after_one_slice_changed']['cpu_s']} s); the next claim "
        f"{f['claim_after_one_slice_changed']['s']} s (CPU {f['claim_after_one_slice_changed']['cpu_s']} s)",
        f"fitting claim, {f['allocated_claims']} allocated: {ms(fit)}, last on {fit['node']}   [target p50 <= 5 ms]",
        f"explain unsatisfiable, all free: {ms(free)}",
        f"explain unsatisfiable, {f['allocated_claims']} allocated: {ms(big)}, extra memory {big['extra_mib']} MiB"
        "   [target p50 <= 100 ms, <= 10 MiB]",
        f"cel import: CLI modules loaded {f['cel_import']['cli_modules_loaded']}, "
        f"max RSS {f['cel_import']['max_rss_mib']} MiB, {f['cel_import']['modules']} modules",
        f"RSS at the end: {f['rss_end_mib']} MiB",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.bench.scale.inprocess", description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--claims", type=int, default=20000, help="GPUs allocated before the fitting claims")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--mig-nodes", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="cProfile the inventory, the first claim, a fitting "
                        "claim and one explanation")
    parser.add_argument("--text", action="store_true", help="print the explanation a person reads")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    figures = run(args.nodes, args.claims, args.samples, args.mig_nodes, args.profile)
    print(report(figures))
    if args.text:
        print(figures["explain_text"])
    if args.profile:
        print("== profile: inventory\n" + figures["profile_inventory"])
        print("== profile: first claim\n" + figures["profile_first_claim"])
        print("== profile: fitting claim\n" + figures["profile_fitting_claim"])
        print("== profile: explain\n" + figures["profile_explain"])
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
