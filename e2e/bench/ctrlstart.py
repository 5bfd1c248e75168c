"""The real ``dra-driver controller`` process at scale, against a loopback stand-in for the API server.

``python -m e2e.bench.ctrlstart [--nodes N] [--claims N] [--pods N]`` starts the controller as
production does (its informers, queue, workers and write budget) against a local HTTP server that
answers list requests in pages of 500 from N synthetic objects (the node plugin's own ResourceSlices
for the ``h100-8x`` profile, claims allocated by "the scheduler", pods of training Jobs; see
:mod:`e2e.generators.clusterobjects`), holds watches open without events, and records the writes. Two more
claims are pending, each with its pod: one fits, one cannot (a GPU with 1 TiB of memory). Measured:

* start: process start until the unsatisfiable claim's explanation arrives (the first write);
* lists: process start until the last list page was served (every informer has listed);
* RSS of the controller then, and its peak, from ``/proc`` (with ``--synced``: no pending claim, the
  RSS once every informer has listed, before the engine builds anything);
* with ``--backlog N``: N more copies of the unsatisfiable claim, and how long after the first
  explanation the last of them is explained, through the controller's write budget.

What this leaves out, and the kwok bench (``make bench-scale``) has: the API server's own cost of
encoding lists, and other clients beside ours. The server here is in another process but on the
same two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from e2e.generators.clusterobjects import DRIVER, gpu_node, job_claim, job_pod, plugin_slice

PAGE = 500
Obj = dict[str, Any]
FITS, UNSATISFIABLE, BACKLOG = "bench-fits", "bench-unsatisfiable", "backlog-"


HUGE = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("1Ti")) >= 0'
"""What no GPU has: the unsatisfiable claim of the issue's measurements."""


def _pending(name: str, selector: str | None) -> tuple[Obj, Obj]:
    exactly: Obj = {"deviceClassName": DRIVER, "count": 1}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}", "resourceVersion": "10"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": f"{name}-pod", "namespace": "bench", "uid": f"pod-{name}", "resourceVersion": "11"},
           "spec": {"containers": [{"name": "c", "image": "x"}], "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]},
           "status": {"phase": "Pending"}}  # fmt: skip
    return claim, pod


class Cluster:
    """The objects, made on demand per page: 150,000 pods are 600 MB of JSON."""

    def __init__(self, nodes: int, claims: int, pods: int, backlog: int = 0, pending: bool = True) -> None:
        fits, fits_pod = _pending(FITS, None)
        unsat, unsat_pod = _pending(UNSATISFIABLE, HUGE)
        copies = [_pending(f"{BACKLOG}{i:05d}", HUGE) for i in range(backlog)]
        first = [unsat, fits] + [c for c, _ in copies] if pending else []
        self.pending = {c["metadata"]["name"]: c for c in first}
        first_pods = [unsat_pod, fits_pod] + [p for _, p in copies] if pending else []
        device_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DRIVER},
                        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}
        claim_pods = min(claims, pods)
        self.kinds: dict[str, tuple[int, Callable[[int], Obj]]] = {
            "resourceslices": (nodes, plugin_slice),
            "deviceclasses": (1, lambda i: device_class),
            "resourceclaimtemplates": (0, lambda i: {}),
            # What a waiting pod's claim may use (dra_driver.controller.placement); no taint rules.
            "nodes": (nodes, gpu_node),
            "devicetaintrules": (0, lambda i: {}),
            # The pending claims first: the controller's queue takes them in list order.
            "resourceclaims": (claims + len(first), lambda i: first[i] if i < len(first) else job_claim(i - len(first))),
            "pods": (pods + len(first), lambda i: first_pods[i] if i < len(first) else
                     job_pod(i - len(first), claim=f"job-{i - len(first):06d}-abcde-gpu-xyz12"
                             if i - len(first) < claim_pods else None)),
        }
        self.listed: dict[str, float] = {}
        self.writes: list[tuple[float, str, str]] = []

    def page(self, plural: str, start: int) -> bytes:
        count, make = self.kinds[plural]
        end = min(start + PAGE, count)
        md: Obj = {"resourceVersion": "100"}
        if end < count:
            md["continue"] = str(end)
        else:
            self.listed[plural] = time.monotonic()
        return orjson.dumps({"metadata": md, "items": [make(i) for i in range(start, end)]})


def serve(cluster: Cluster) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # As the API server (Go) does: without it, the body written after the headers waits for
            # the client's delayed ACK, 40 ms a request.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def _reply(self, code: int, body: bytes, close: bool = False) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            if close:
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _not_found(self) -> None:
            self._reply(404, b'{"kind":"Status","status":"Failure","reason":"NotFound","code":404}')

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            plural = url.path.rstrip("/").rsplit("/", 1)[-1]
            if plural not in cluster.kinds:
                self._not_found()
                return
            if query.get("sendInitialEvents") == ["true"]:
                # No streaming lists here: the controller lists in pages, as from an API server
                # without WatchList.
                self._reply(422, b'{"kind":"Status","status":"Failure","reason":"Invalid","code":422}')
                return
            if query.get("watch") == ["true"]:
                # An idle watch: headers now, then nothing until the server stops.
                self.close_connection = True
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.flush()
                stop.wait(float(query.get("timeoutSeconds", ["300"])[0]))
                return
            self._reply(200, cluster.page(plural, int(query.get("continue", ["0"])[0] or 0)))

        def do_PATCH(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            patch = json.loads(self.rfile.read(n))
            name = urlsplit(self.path).path.rsplit("/", 1)[-1]
            cluster.writes.append((time.monotonic(), "PATCH", name))
            claim = cluster.pending.get(name)
            if claim is None:
                self._not_found()
                return
            # What the API server answers: the whole claim, as patched.
            annotations = {**claim["metadata"].get("annotations", {}), **patch["metadata"]["annotations"]}
            self._reply(200, orjson.dumps({**claim, "metadata": {
                **claim["metadata"], "resourceVersion": "200", "annotations": {
                    k: v for k, v in annotations.items() if v is not None}}}))

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n)
            cluster.writes.append((time.monotonic(), "POST", urlsplit(self.path).path.rsplit("/", 1)[-1]))
            self._reply(201, body)

        do_PUT = do_DELETE = _not_found

        def log_message(self, *args: Any) -> None:
            return

    stop = threading.Event()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.stop = stop  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def _checkout() -> dict[str, str]:
    """``CTRLSTART_CHECKOUT``: run the controller from another source tree (say, an export of an
    older commit, for a before and after), with this bench's stand-in unchanged."""
    other = os.environ.get("CTRLSTART_CHECKOUT")
    return {"PYTHONPATH": other} if other else {}


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def synced(nodes: int, claims: int, pods: int, settle: float = 5.0, timeout: float = 900.0) -> dict[str, Any]:
    """The controller with every informer synced and no pending claim (so no device inventory yet,
    the engine's part): its RSS ``settle`` seconds after the last list page was served."""
    cluster = Cluster(nodes, claims, pods, pending=False)
    with _controller(cluster) as proc:
        t0 = time.monotonic()
        while len(cluster.listed) < len(cluster.kinds) and time.monotonic() - t0 < timeout and proc.poll() is None:
            time.sleep(0.1)
        if len(cluster.listed) < len(cluster.kinds):
            raise RuntimeError(f"lists unfinished after {timeout:.0f} s: {sorted(cluster.listed)}")
        listed = time.monotonic() - t0
        time.sleep(settle)
        status = _status(proc.pid)
    mib = 1024 * 1024
    return {"nodes": nodes, "claims": claims, "pods": pods, "start_to_all_listed_s": round(listed, 2),
            "rss_synced_mib": round(status["VmRSS"] / mib, 1), "rss_peak_mib": round(status["VmHWM"] / mib, 1)}


@contextmanager
def _controller(cluster: Cluster) -> Iterator[subprocess.Popen[bytes]]:
    """``dra-driver controller`` against a stand-in serving ``cluster``; stopped on the way out."""
    httpd = serve(cluster)
    with tempfile.TemporaryDirectory(prefix="ctrlstart-") as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{httpd.server_address[1]}"}}],
            "users": [{"name": "u", "user": {}}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
        log = (Path(tmp) / "controller.log").open("w+")
        proc = subprocess.Popen(
            [sys.executable, "-m", "dra_driver", "controller", "--kubeconfig", str(kubeconfig), "--no-leader-elect",
             "--metrics-port", "0", "--driver-name", DRIVER, "--log-level", "warning"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1", **_checkout()},
            cwd=os.environ.get("CTRLSTART_CHECKOUT"))  # python -m puts its directory first on the path
        try:
            yield proc
        except RuntimeError as exc:
            log.seek(0)
            raise RuntimeError(f"{exc}; controller log:\n{log.read()[-3000:]}") from None
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
            httpd.stop.set()  # type: ignore[attr-defined]
            httpd.shutdown()


def run(nodes: int = 5000, claims: int = 0, pods: int = 0, backlog: int = 0, settle: float = 3.0,
        timeout: float = 600.0) -> dict[str, Any]:
    cluster = Cluster(nodes, claims, pods, backlog)
    with _controller(cluster) as proc:
        t0 = time.monotonic()
        explained = None
        while time.monotonic() - t0 < timeout and proc.poll() is None:
            first = next((w for w in cluster.writes if w[1] == "PATCH" and w[2] == UNSATISFIABLE), None)
            if first is not None:
                explained = first[0]
                rss_then = _status(proc.pid)
                cpu_then = _cpu_seconds(proc.pid)
                break
            time.sleep(0.02)
        if explained is None:
            raise RuntimeError(f"no explanation within {timeout:.0f} s")
        while len(_backlog_patches(cluster)) < backlog and time.monotonic() - t0 < timeout and proc.poll() is None:
            time.sleep(0.1)
        cpu_backlog = _cpu_seconds(proc.pid) - cpu_then
        time.sleep(settle)
        settled = _status(proc.pid)
    mib = 1024 * 1024
    patched = _backlog_patches(cluster)
    result: dict[str, Any] = {}
    if backlog:
        result = {"backlog": backlog, "backlog_explained": len(patched),
                  "backlog_s": round(patched[-1] - explained, 2) if patched else None,
                  "backlog_cpu_ms_per_claim": round(cpu_backlog / backlog * 1000, 2),
                  "events": sum(1 for w in cluster.writes if w[1] == "POST")}
    return result | {
        "nodes": nodes, "claims": claims, "pods": pods,
        "start_to_first_explanation_s": round(explained - t0, 2),
        "start_to_all_listed_s": round(max(cluster.listed.values()) - t0, 2),
        "listed_s": {k: round(v - t0, 2) for k, v in sorted(cluster.listed.items(), key=lambda kv: kv[1])},
        "rss_at_first_explanation_mib": round(rss_then["VmRSS"] / mib, 1),
        "rss_settled_mib": round(settled["VmRSS"] / mib, 1), "rss_peak_mib": round(settled["VmHWM"] / mib, 1),
        "writes": len(cluster.writes),
        "fitting_claim_written": any(w[2] == FITS for w in cluster.writes),
    }


def _backlog_patches(cluster: Cluster) -> list[float]:
    return sorted(t for t, verb, name in list(cluster.writes) if verb == "PATCH" and name.startswith(BACKLOG))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.bench.ctrlstart", description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--claims", type=int, default=0, help="allocated claims besides the two pending ones")
    parser.add_argument("--pods", type=int, default=0, help="running pods besides the two pending ones; the first "
                        "--claims of them hold the allocated claims")
    parser.add_argument("--backlog", type=int, default=0, help="more copies of the unsatisfiable claim, each with its "
                        "pod: the time from the first explanation until all of them are explained")
    parser.add_argument("--synced", action="store_true", help="no pending claim: the RSS with every informer synced")
    args = parser.parse_args(argv)
    if args.synced:
        print(json.dumps(synced(args.nodes, args.claims, args.pods), indent=1))
        return 0
    print(json.dumps(run(args.nodes, args.claims, args.pods, args.backlog), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
