"""Publishing the dynamic-MIG catalogue of an 8-GPU node (simulated h100-8x with ``--dynamic-mig``).

With dynamic MIG every profile x placement of every GPU is a partitionable device consuming
shared counters, so the node publishes ~150 devices. Measured: the time of one publish from
empty (the publisher's GET of the Node, LIST and the creates) against the bed's apiserver, the API
requests by verb as the publisher counts them, and the re-publish after a no-op update, which must
write nothing. Each repetition uses a fresh node so it starts from empty.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from dra_driver.k8s import client as kube
from dra_driver.node.describe.devices import describe, enumerate_devices
from dra_driver.node.discovery.select import open_backend
from dra_driver.node.publish.publisher import SlicePublisher
from dra_driver.node.settings import add_plugin_arguments, plugin_settings
from e2e.bench.common import Result, summarize_ms
from e2e.bench.sharedbed import NODES, BenchBed
from e2e.testbed.nodes import DRIVER_NAME


def catalogue(node: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float]:
    """devices and counter sets of h100-8x with dynamic MIG, and the seconds describe() took."""
    parser = argparse.ArgumentParser()
    add_plugin_arguments(parser)
    settings = plugin_settings(parser.parse_args([
        f"--node-name={node}", "--gpu-backend=simulated", "--simulated-profile=h100-8x", "--dynamic-mig"]))
    gpus = open_backend(settings.backend_choice).discover()
    t0 = time.perf_counter()
    devices_json, counters_json = describe(enumerate_devices(gpus, True), DRIVER_NAME, True)
    return devices_json, counters_json, time.perf_counter() - t0


def run(bed: BenchBed, quick: bool) -> Result:
    reps = 3 if quick else 10
    result = Result("mig_publish", "Dynamic-MIG catalogue publish", {
        "profile": "h100-8x", "dynamic_mig": True, "repetitions": reps, "client": "RestKubeApi",
    })
    devices_json, counters_json, describe_s = catalogue("bench-mig-0")
    result.parameters["devices"] = len(devices_json)
    result.parameters["counter_sets"] = len(counters_json)
    result.parameters["catalogue_json_bytes"] = len(json.dumps([devices_json, counters_json]))
    api = kube.RestKubeApi.from_kubeconfig(str(bed.kubeconfig), user_agent="dra-driver-bench")
    first, noop, first_requests, noop_requests, slices, writes, noop_writes = [], [], [], [], [], [], []
    for r in range(reps):
        node = f"bench-mig-{r}"
        bed.api.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        publisher = SlicePublisher(api, DRIVER_NAME, node)
        t0 = time.perf_counter()
        publisher.update(devices_json, counters_json)
        plan = publisher.sync()
        first.append(time.perf_counter() - t0)
        assert plan is not None
        first_requests.append(dict(publisher.requests))
        slices.append(plan.slice_count)
        writes.append(plan.writes)
        before = sum(publisher.requests.values())
        t0 = time.perf_counter()
        publisher.update(devices_json, counters_json)  # same content: a no-op for the API
        again = publisher.sync()
        noop.append(time.perf_counter() - t0)
        assert again is not None
        noop_writes.append(again.writes)
        noop_requests.append({k: v - first_requests[-1].get(k, 0) for k, v in publisher.requests.items()
                              if v - first_requests[-1].get(k, 0)})
        assert sum(publisher.requests.values()) - before == sum(noop_requests[-1].values())
    api.close()
    bed.remove_nodes(f"bench-mig-{r}" for r in range(reps))
    first_ms = summarize_ms(first)
    result.figures.update({
        "describe_ms": round(describe_s * 1000, 2),
        "publish_from_empty": first_ms,
        "republish_noop": summarize_ms(noop),
        "slices": slices[0],
        "requests_from_empty": first_requests[0],
        "requests_noop": noop_requests[0],
        "writes_from_empty": writes,
        "writes_noop": noop_writes,
        "headline": {"publish from empty (p50)": f"{first_ms['p50_ms']:.0f} ms for {len(devices_json)} devices"},
    })
    per_slice = max(w / s for w, s in zip(writes, slices, strict=True))
    result.target("writes per slice, publish from empty (worst repetition)", per_slice, 1, "writes/slice")
    result.target("writes on no-op re-publish (worst repetition)", max(noop_writes), 0, "writes")
    result.notes.append(
        f"{len(devices_json)} devices + {len(counters_json)} counter sets in {slices[0]} slice(s); from empty "
        f"p50 {first_ms['p50_ms']} ms with requests {first_requests[0]}; no-op re-publish requests {noop_requests[0]}."
    )
    return result
