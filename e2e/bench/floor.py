"""The gRPC floor: a NodePrepareResources round trip with nothing behind the handler.

Ours is the node plugin's own server stack (:class:`dra_driver.node.kubelet.grpc.PluginServers` on grpcio,
with the same options and sockets) around a handler that answers at once; the other is grpc-go
serving the same answer (``baseline-driver grpc-floor serve``). One Go client (grpc-go, as the
kubelet) calls each in turn, one call at a time with a pause between calls as when pods start one
after another, and times each round trip. Rounds alternate between the two servers, so both see the
same machine.

What it tells: the part of the real-node ratios (``real_node``) that no work in our handler can
remove. Server CPU per call is the process's user + system time while the calls were made, its
background wake-ups between calls included, divided by the calls.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dra_driver.node.kubelet.grpc import PluginServers
from dra_driver.node.prepare.calls import ClaimRef, PrepareOutcome, ResponseDevice
from e2e.bench.common import Result, summarize_ms
from e2e.bench.realnode import cpu_seconds, ratio
from e2e.bench.sharedbed import BenchBed
from e2e.tooling import gotools

REPO = Path(__file__).resolve().parents[2]
PAUSE = "100ms"
READY = "ready"


class _Answer:
    """The answer a prepare of one GPU gets, at once."""

    def prepare(self, claims: Iterable[ClaimRef]) -> dict[str, PrepareOutcome]:
        return {c.uid: PrepareOutcome(devices=(ResponseDevice(("gpu",), "floor", "gpu-0",
                                                              (f"k8s.floor.dra-driver.io/claim={c.uid}-gpu-0",)),))
                for c in claims}

    def unprepare(self, claims: Iterable[ClaimRef]) -> dict[str, str | None]:
        return {c.uid: None for c in claims}


def serve(folder: Path) -> int:
    """``python -m e2e.bench.floor serve FOLDER``: our servers with :class:`_Answer` until SIGTERM."""
    servers = PluginServers(driver_name="floor.dra-driver.io", node_name="floor", dra_socket=folder / "dra.sock",
                            registration_socket=folder / "registration.sock", handler=_Answer())
    servers.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(READY, flush=True)
    stop.wait()
    servers.stop(0)
    return 0


@contextmanager
def _server(command: list[str], env: dict[str, str] | None = None) -> Iterator[int]:
    with tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env={**os.environ, **(env or {})})
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.strip() == READY:
                    break
            else:
                stderr.seek(0)
                raise RuntimeError(f"{' '.join(command)} exited ({proc.wait()}) before it was ready: {stderr.read()[-2000:]}")
            yield proc.pid
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def run(bed: BenchBed, quick: bool) -> Result:
    rounds, calls = (1, 40) if quick else (4, 50)
    binary = gotools.ensure(["baseline-driver"]) / "baseline-driver"
    result = Result("grpc_floor", "gRPC floor: a no-op NodePrepareResources, ours (grpcio) and grpc-go",
                    {"rounds": rounds, "calls_per_round": calls, "pause": PAUSE, "client": "grpc-go (baseline-driver)"})
    with tempfile.TemporaryDirectory(prefix="dra-floor-") as tmp:
        folder = Path(tmp)
        sockets = {"ours": folder / "dra.sock", "grpc-go": folder / "go.sock"}
        with (_server([sys.executable, "-m", "e2e.bench.floor", "serve", str(folder)], {"PYTHONPATH": str(REPO)}) as ours,
              _server([str(binary), "grpc-floor", "serve", str(sockets["grpc-go"])]) as go):
            pids = {"ours": ours, "grpc-go": go}
            samples: dict[str, list[float]] = {who: [] for who in pids}
            cpu = dict.fromkeys(pids, 0.0)
            for i in range(rounds):
                for who in (("ours", "grpc-go") if i % 2 == 0 else ("grpc-go", "ours")):
                    before = cpu_seconds(pids[who])
                    out = subprocess.run([str(binary), "grpc-floor", "call", str(sockets[who]), str(calls), PAUSE],
                                         capture_output=True, text=True, check=True).stdout
                    cpu[who] += cpu_seconds(pids[who]) - before
                    samples[who] += [us / 1e6 for us in json.loads(out)]
    stats = {who: summarize_ms(s) for who, s in samples.items()}
    cpu_ms = {who: round(cpu[who] * 1000 / len(samples[who]), 3) for who in pids}
    o, g = stats["ours"], stats["grpc-go"]
    result.figures = {
        "round_trip_ms": stats,
        "server_cpu_ms_per_call": cpu_ms,
        "headline": {
            **{f"round trip {q}": f"{o[f'{q}_ms']:.2f} / {g[f'{q}_ms']:.2f} ms = {ratio(o[f'{q}_ms'], g[f'{q}_ms']):.2f}"
               for q in ("p50", "p90")},
            "server CPU per call": f"{cpu_ms['ours']:.2f} / {cpu_ms['grpc-go']:.2f} ms",
        },
    }
    result.notes.append("Figures in `headline` are ours / grpc-go. CPU is counted in clock ticks (10 ms) "
                        "over all calls of a server, background wake-ups between calls included, then divided "
                        "by the calls.")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.bench.floor", description="our no-op DRA server, for the floor")
    parser.add_argument("action", choices=["serve"])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    return serve(args.folder)


if __name__ == "__main__":
    sys.exit(main())
