"""CEL evaluation cost per device for typical DRA selectors (no bed needed).

The device is gpu-0 of the simulated h100-8x node exactly as the plugin publishes it. Compilation
is cached by expression text and the per-device activation is built once and reused for every
selector (that is how the engine evaluates), so the steady-state figure is one
``CompiledSelector.evaluate``; the first evaluation on a device (which converts the activation
into CEL values) is reported apart.
"""

from __future__ import annotations

import argparse
import time

from dra_driver.allocator.cel.compile import compile_selector, compile_uncached, device_activation
from dra_driver.node.describe.devices import describe, enumerate_devices
from dra_driver.node.discovery.select import open_backend
from dra_driver.node.settings import add_plugin_arguments, plugin_settings
from e2e.bench.common import Result, percentile
from e2e.bench.sharedbed import BenchBed
from e2e.testbed.nodes import DRIVER_NAME

D = f'device.attributes["{DRIVER_NAME}"]'
C = f'device.capacity["{DRIVER_NAME}"]'
SELECTORS = {
    "productName equality": f'{D}.productName == "NVIDIA H100 80GB HBM3"',
    "memory compareTo quantity": f'{C}.memory.compareTo(quantity("40Gi")) >= 0',
    "driverVersion semver comparison": f'{D}.driverVersion.isGreaterThan(semver("550.0.0"))',
    "driver + type (the gpu DeviceClass)": f"device.driver == '{DRIVER_NAME}' && {D}.type == 'gpu'",
}


def _device() -> dict[str, object]:
    parser = argparse.ArgumentParser()
    add_plugin_arguments(parser)
    settings = plugin_settings(parser.parse_args(["--node-name=cel", "--gpu-backend=simulated",
                                                  "--simulated-profile=h100-8x"]))
    devices_json, _ = describe(enumerate_devices(open_backend(settings.backend_choice).discover(), False), DRIVER_NAME, False)
    return devices_json[0]


def run(bed: BenchBed, quick: bool) -> Result:
    del bed  # no cluster needed
    evaluations = 2_000 if quick else 20_000
    rounds = 5
    device = _device()
    result = Result("cel", "CEL evaluation per device", {
        "evaluations_per_round": evaluations, "rounds": rounds, "device": "h100-8x gpu-0 as published",
        "selectors": SELECTORS,
    })
    figures: dict[str, dict[str, float]] = {}
    for label, expression in SELECTORS.items():
        t0 = time.perf_counter()
        compile_uncached(expression)  # uncached, to report the compile cost
        compile_us = (time.perf_counter() - t0) * 1e6
        selector = compile_selector(expression)
        firsts = []
        for _ in range(50):
            activation = device_activation(DRIVER_NAME, device["attributes"], device["capacity"])  # type: ignore[arg-type]
            t0 = time.perf_counter()
            assert selector.evaluate(activation) is True
            firsts.append(time.perf_counter() - t0)
        per_round = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(evaluations):
                selector.evaluate(activation)
            per_round.append((time.perf_counter() - t0) / evaluations)
        figures[label] = {
            "us_per_evaluation_median_round": round(percentile(per_round, 50) * 1e6, 2),
            "us_per_evaluation_best_round": round(min(per_round) * 1e6, 2),
            "us_first_evaluation_on_a_device_p50": round(percentile(firsts, 50) * 1e6, 1),
            "us_compile": round(compile_us, 1),
        }
    t0 = time.perf_counter()
    for _ in range(1000):
        device_activation(DRIVER_NAME, device["attributes"], device["capacity"])  # type: ignore[arg-type]
    result.figures["us_build_activation"] = round((time.perf_counter() - t0) / 1000 * 1e6, 1)
    result.figures["selectors"] = figures
    result.figures["headline"] = {label: f"{f['us_per_evaluation_median_round']:.1f} µs/eval" for label, f in figures.items()}
    return result
