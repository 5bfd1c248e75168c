"""NodePrepareResources latency of the node plugin against the bed's apiserver.

Two ways, both over a real Unix socket with the generated v1 stubs:

* **process**: the plugin as its own process with the bed's flags (what a node runs). Gives the
  end-to-end latency the kubelet sees, the batch figures (100 claims in one request, 100
  concurrent single-claim requests) and, separately, the time of a claim GET made with the same
  client settings the plugin uses (:func:`dra_driver.node.plugin.api_client`).
* **instrumented**: the same DeviceState and gRPC servers built in this process, with a claim
  reader that times its own GET and a counter on ``os.fsync`` and ``os.fdatasync``. Each sample's GET is subtracted
  from that same sample's round trip, which is what the target is about ("p99 excluding the
  claim GET"); a whole-process difference of percentiles would mix unrelated samples.

Claims are created by the benchmark and allocated by writing ``status.allocation`` directly (no
scheduler): device ``gpu-N`` of pool ``bench-node`` with a TimeSlicing ``GpuConfig`` from the
claim, so any number of claims may share the 8 simulated H100s without breaking exclusivity.

The fsync floor (write + fsync + rename + directory fsync of a small file in the plugin's state
directory, i.e. one :func:`dra_driver.node.fileio.atomic_write`) is measured alongside: a prepare
cannot be faster than the durable writes it makes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import structlog

from dra_driver import logs
from dra_driver.k8s.client import CLAIMS, ApiError, Resource, RestKubeApi
from dra_driver.node.describe.devices import enumerate_devices
from dra_driver.node.discovery.select import open_backend
from dra_driver.node.fileio import atomic_write
from dra_driver.node.plugin import api_client, device_state, plugin_servers
from dra_driver.node.prepare.calls import PrepareOutcome
from dra_driver.node.prepare.state import DeviceState
from dra_driver.node.settings import add_plugin_arguments, plugin_settings
from e2e.bench.common import RESULTS, Result, percentile, summarize_ms
from e2e.bench.plot import plot_latency
from e2e.bench.plugin import start_plugin, wait_get_info
from e2e.bench.sharedbed import PLUGIN_NODE, BenchBed, parallel
from e2e.testbed.dracalls import DraClient, check_errors
from e2e.testbed.nodes import DRIVER_NAME, SimNode

NAMESPACE = "bench-prepare"
GPUS = 8
GPU_CONFIG = {
    "apiVersion": "gpu.dra-driver.io/v1alpha1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Default"}},
}

Claim = tuple[str, str, str]  # namespace, name, uid
PLOT_FILE = "prepare-latency.png"


def _claim_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": f"gpu.{DRIVER_NAME}", "count": 1}}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": DRIVER_NAME, "parameters": GPU_CONFIG}}],
        }},
    }  # fmt: skip


def _allocate(obj: dict[str, Any], device: str) -> dict[str, Any]:
    obj["status"] = {"allocation": {
        "devices": {
            "results": [{"request": "gpu", "driver": DRIVER_NAME, "pool": PLUGIN_NODE, "device": device}],
            "config": [{"source": "FromClaim", "requests": ["gpu"],
                        "opaque": {"driver": DRIVER_NAME, "parameters": GPU_CONFIG}}],
        },
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [PLUGIN_NODE]}]}]},
    }}  # fmt: skip
    return obj


def create_claims(bed: BenchBed, prefix: str, count: int) -> list[Claim]:
    """``count`` allocated claims, claim i on ``gpu-(i % 8)``."""

    def one(i: int) -> Claim:
        name = f"{prefix}-{i}"
        try:
            obj = bed.api.create(CLAIMS, _claim_body(name), namespace=NAMESPACE)
        except ApiError as exc:
            if exc.status != 409:
                raise
            obj = bed.api.get(CLAIMS, name, namespace=NAMESPACE)
        obj = bed.api.replace_status(CLAIMS, _allocate(obj, f"gpu-{i % GPUS}"))
        return (NAMESPACE, name, str(obj["metadata"]["uid"]))

    result: list[Claim] = parallel(one, range(count), workers=8)
    return result


def fsync_floor(directory: Path, samples: int) -> dict[str, float]:
    """One durable small-file replacement (what every checkpoint/CDI write costs at least)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "bench-fsync-floor.json"
    payload = b"{" + b'"x":0,' * 200 + b'"y":1}'  # about the size of a one-claim checkpoint
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        atomic_write(path, payload, 0o600)
        times.append(time.perf_counter() - t0)
    path.unlink(missing_ok=True)
    return summarize_ms(times)


# --- the instrumented, in-process plugin ------------------------------------------------------


class _TimedReader:
    """The plugin's API client for claim reads, recording how long each GET took (per thread, per
    request)."""

    def __init__(self, inner: RestKubeApi) -> None:
        self.inner = inner
        self.local = threading.local()

    def get(self, res: Resource, name: str, *, namespace: str | None = None,
            meanwhile: Callable[[], object] | None = None) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            return self.inner.get(res, name, namespace=namespace, meanwhile=meanwhile)
        finally:
            self.local.last = time.perf_counter() - t0


class _TimedHandler:
    """Wraps DeviceState: time inside ``prepare`` and the GET it made (single-claim requests)."""

    def __init__(self, state: DeviceState, reader: _TimedReader) -> None:
        self.state = state
        self.reader = reader
        self.samples: list[tuple[float, float]] = []  # (handler seconds, GET seconds)

    def prepare(self, claims: Any) -> dict[str, PrepareOutcome]:
        t0 = time.perf_counter()
        out = self.state.prepare(claims)
        self.samples.append((time.perf_counter() - t0, getattr(self.reader.local, "last", 0.0)))
        return out

    def unprepare(self, claims: Any) -> dict[str, str | None]:
        return self.state.unprepare(claims)


@contextlib.contextmanager
def _count_flushes() -> Iterator[list[int]]:
    """Counts ``os.fsync`` and ``os.fdatasync`` calls (the checkpoint journal flushes with the latter)."""
    counter = [0]
    real = {name: getattr(os, name) for name in ("fsync", "fdatasync")}

    def counting(name: str) -> Any:
        def call(fd: Any) -> None:
            counter[0] += 1
            real[name](fd)
        return call

    for name in real:
        setattr(os, name, counting(name))
    try:
        yield counter
    finally:
        for name, fn in real.items():
            setattr(os, name, fn)


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """Send this process's stdout/stderr (file descriptors) to ``path``.

    Module-level loggers of the driver are bound at import time, before any configure() call, so
    they keep structlog's default stdout logger; only redirecting the descriptors moves them.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


@contextlib.contextmanager
def _in_process_plugin(root: Path, kubeconfig: Path, log_file: Path) -> Iterator[tuple[_TimedHandler, Path]]:
    """Our plugin's DeviceState + PluginServers in this process, logging JSON at info like the real one."""
    node = SimNode(PLUGIN_NODE, "h100-8x", root / "inproc")
    parser = argparse.ArgumentParser()
    add_plugin_arguments(parser)
    command = node.plugin_args(kubeconfig)
    settings = plugin_settings(parser.parse_args(command[command.index("kubelet-plugin") + 1:]))
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with _output_to(log_file), open(log_file, "a") as log:
        logs.configure("json", "info")
        structlog.configure(logger_factory=structlog.WriteLoggerFactory(file=log))
        backend = open_backend(settings.backend_choice)
        devices = enumerate_devices(backend.discover(), settings.dynamic_mig)
        reader = _TimedReader(api_client(str(kubeconfig)))
        state = device_state(settings, devices, reader, backend=backend)
        handler = _TimedHandler(state, reader)
        servers = plugin_servers(settings, handler, device_names=sorted(devices))
        servers.start()
        try:
            yield handler, servers.dra_socket
        finally:
            servers.stop()
            state.close()
            logs.configure("console", "warning")


# --- the benchmark ----------------------------------------------------------------------------


def _sequential(client: DraClient, claims: list[Claim], samples: int, api: RestKubeApi | None
                ) -> dict[str, list[float]]:
    prep, unprep, gets = [], [], []
    for i in range(samples):
        claim = claims[i % len(claims)]
        t0 = time.perf_counter()
        results = client.prepare([claim])
        t1 = time.perf_counter()
        check_errors(results, 1, "prepare")
        check_errors(client.unprepare([claim]), 1, "unprepare")
        t2 = time.perf_counter()
        prep.append(t1 - t0)
        unprep.append(t2 - t1)
        if api is not None:
            t3 = time.perf_counter()
            api.get(CLAIMS, claim[1], namespace=claim[0])
            gets.append(time.perf_counter() - t3)
    return {"prepare": prep, "unprepare": unprep, "get": gets}


def _batch(client: DraClient, claims: list[Claim], reps: int) -> dict[str, list[float]]:
    one_req, one_unreq, conc, conc_un = [], [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        results = client.prepare(claims)
        one_req.append(time.perf_counter() - t0)
        check_errors(results, len(claims), "batch prepare")
        t0 = time.perf_counter()
        check_errors(client.unprepare(claims), len(claims), "batch unprepare")
        one_unreq.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        futures = [client.stub.NodePrepareResources.future(client.prepare_request([c]), timeout=60) for c in claims]
        responses = [f.result() for f in futures]
        conc.append(time.perf_counter() - t0)
        errors = [r.error for resp in responses for r in resp.claims.values() if r.error]
        if errors:
            raise RuntimeError(f"concurrent prepare: {len(errors)} failed: {errors[0]}")
        t0 = time.perf_counter()
        futures = [client.stub.NodeUnprepareResources.future(client.unprepare_request([c]), timeout=60) for c in claims]
        for f in futures:
            f.result()
        conc_un.append(time.perf_counter() - t0)
    return {"batch_prepare": one_req, "batch_unprepare": one_unreq, "concurrent_prepare": conc,
            "concurrent_unprepare": conc_un}


def run(bed: BenchBed, quick: bool) -> Result:
    samples = 100 if quick else 500
    reps = 3 if quick else 10
    batch = 100
    result = Result("prepare", "NodePrepareResources", {
        "profile": "h100-8x", "sequential_samples": samples, "batch_claims": batch, "batch_repetitions": reps,
        "sharing": "TimeSlicing (FromClaim opaque GpuConfig)", "transport": "gRPC v1 over the Unix socket",
        "warmup_samples": 20,
    })
    root = bed.workdir / "prepare"
    bed.namespace(NAMESPACE)
    bed.cluster.kubectl("apply", "-f", str(Path(__file__).resolve().parents[2] / "deploy" / "deviceclasses"))
    t0 = time.perf_counter()
    singles = create_claims(bed, "single", GPUS)
    many = create_claims(bed, "batch", batch)
    result.figures["claim_setup_s"] = round(time.perf_counter() - t0, 2)

    plugin = start_plugin(root, bed.kubeconfig, PLUGIN_NODE)
    try:
        wait_get_info(plugin)
        client = DraClient(plugin.dra_socket)
        reader = api_client(str(bed.kubeconfig))
        _sequential(client, singles, 20, None)  # warm-up: connections, imports, caches
        seq = _sequential(client, singles, samples, reader)
        bat = _batch(client, many, reps)
        client.close()
        result.figures["fsync_floor"] = fsync_floor(plugin.node.state_dir, 200)
    finally:
        plugin.stop()

    proc_prep = summarize_ms(seq["prepare"])
    get = summarize_ms(seq["get"])
    result.figures["process"] = {
        "prepare": proc_prep,
        "unprepare": summarize_ms(seq["unprepare"]),
        "claim_get": get,
        "prepare_minus_median_get_p99_ms": round(proc_prep["p99_ms"] - get["p50_ms"], 3),
        "batch_100_one_request_prepare": summarize_ms(bat["batch_prepare"]),
        "batch_100_one_request_unprepare": summarize_ms(bat["batch_unprepare"]),
        "concurrent_100_requests_prepare": summarize_ms(bat["concurrent_prepare"]),
        "concurrent_100_requests_unprepare": summarize_ms(bat["concurrent_unprepare"]),
    }

    # Same state and servers in this process, each sample's own GET subtracted.
    with _in_process_plugin(root, bed.kubeconfig, root / "logs" / "inproc.log") as (handler, socket):
        client = DraClient(socket)
        _sequential(client, singles, 20, None)
        handler.samples.clear()
        rtts: list[float] = []
        with _count_flushes() as fsyncs:
            for i in range(samples):
                claim = singles[i % len(singles)]
                t0 = time.perf_counter()
                check_errors(client.prepare([claim]), 1, "prepare")
                rtts.append(time.perf_counter() - t0)
                if i == 0:
                    prepare_fsyncs = fsyncs[0]
                check_errors(client.unprepare([claim]), 1, "unprepare")
                if i == 0:
                    unprepare_fsyncs = fsyncs[0] - prepare_fsyncs
        client.close()
    handler_s = [h for h, _ in handler.samples]
    get_s = [g for _, g in handler.samples]
    excl = [rtt - g for rtt, (_, g) in zip(rtts, handler.samples, strict=True)]
    result.figures["instrumented"] = {
        "prepare_round_trip": summarize_ms(rtts),
        "claim_get_inside_prepare": summarize_ms(get_s),
        "prepare_excluding_get": summarize_ms(excl),
        "handler_excluding_get": summarize_ms([h - g for h, g in handler.samples]),
        "handler_total": summarize_ms(handler_s),
        "flushes_per_prepare": prepare_fsyncs,
        "flushes_per_unprepare": unprepare_fsyncs,
    }
    bed.cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")  # later benchmarks list claims
    # Every sample, so the distribution can be plotted again from the committed results.
    samples_ms = {"prepare (plugin process, with the claim GET)": [round(x * 1000, 3) for x in seq["prepare"]],
                  "prepare excluding the claim GET (instrumented)": [round(x * 1000, 3) for x in excl]}
    result.figures["samples_ms"] = samples_ms
    try:
        picture = plot_latency(samples_ms, RESULTS / PLOT_FILE,
                               f"NodePrepareResources, 1 claim per request ({samples} sequential requests)")
        result.figures["plot"] = str(picture.relative_to(RESULTS.parents[2]))
    except ImportError as exc:
        result.notes.append(f"plot skipped: {exc} (matplotlib is in the dev extra)")
    excl_p99 = percentile(excl, 99) * 1000
    result.figures["headline"] = {
        "1-claim p50 / p99 (process, with GET)": f"{proc_prep['p50_ms']:.2f} / {proc_prep['p99_ms']:.2f} ms",
        "claim GET p50 / p99": f"{get['p50_ms']:.2f} / {get['p99_ms']:.2f} ms",
    }
    result.target("1 claim, p99 excluding the claim GET", excl_p99, 10, "ms")
    result.target("100 claims in one request (median)", result.figures["process"]["batch_100_one_request_prepare"]["p50_ms"],
                  1000, "ms")
    result.target("100 concurrent 1-claim requests (median)",
                  result.figures["process"]["concurrent_100_requests_prepare"]["p50_ms"], 1000, "ms")
    result.notes.append(
        f"process: p50 {proc_prep['p50_ms']} ms / p99 {proc_prep['p99_ms']} ms end to end including the GET "
        f"(GET alone p50 {get['p50_ms']} ms / p99 {get['p99_ms']} ms); fsync floor p50 "
        f"{result.figures['fsync_floor']['p50_ms']} ms, {prepare_fsyncs} flushes (fsync or fdatasync) per 1-claim prepare."
    )
    return result
