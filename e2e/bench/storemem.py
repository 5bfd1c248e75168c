"""Memory per object in the controller's informer stores, before and after its projections.

``python -m e2e.bench.storemem [N]`` lists N realistic objects of each kind through the real client
(``RestKubeApi`` against a loopback server serving the JSON list in pages of 500) into an informer's
store, once as the store kept them before (whole) and once with the controller's transforms
(:mod:`dra_driver.controller.views`), and prints the bytes each object leaves allocated
(``tracemalloc``: what stays after the list, transient decoding excluded). The 5,000-node and
150,000-pod figures are these slopes times the counts.

The objects are what a GPU cluster holds (:mod:`e2e.generators.clusterobjects`): pods of a training
Job as the API server returns them, claims generated from a template and allocated by the
scheduler, and ResourceSlices made by the node plugin's own path from the ``h100-8x`` profile.
"""

from __future__ import annotations

import gc
import sys
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from dra_driver.controller.views import claim_view, pod_view, slice_view
from dra_driver.k8s.client import CLAIMS, PODS, SLICES, Resource, RestKubeApi
from dra_driver.k8s.credentials import Connection, Credentials
from dra_driver.k8s.informer import Informer, Transform
from dra_driver.k8s.objects import Obj
from e2e.generators.clusterobjects import explained_claim, job_claim, job_pod, mig_slice, plugin_slice

PAGE = 500


def _pages(items: list[Obj]) -> dict[str, bytes]:
    """The list as the API server pages it: continue token -> body."""
    out: dict[str, bytes] = {}
    for start in range(0, max(len(items), 1), PAGE):
        nxt = start + PAGE
        md: Obj = {"resourceVersion": "7"}
        if nxt < len(items):
            md["continue"] = str(nxt)
        out[str(start) if start else ""] = orjson.dumps({"metadata": md, "items": items[start:nxt]})
    return out


@contextmanager
def serving(pages: dict[str, bytes]) -> Iterator[RestKubeApi]:
    """A loopback API server answering list requests from ``pages``, and a client for it."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            body = pages[parse_qs(urlsplit(self.path).query).get("continue", [""])[0]]
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    host = f"http://127.0.0.1:{httpd.server_address[1]}"
    loaded = Connection(host=host, ca_file=None, verify_ssl=False, tls_server_name=None, proxy_url=None, cert_file=None,
                        key_file=None, authorization=lambda: None)
    api = RestKubeApi(Credentials(lambda: loaded, "loopback"))
    try:
        yield api
    finally:
        api.close()
        httpd.shutdown()
        httpd.server_close()


def retained_bytes(resource: Resource, items: list[Obj], transform: Transform | None) -> tuple[float, int]:
    """(bytes per object left allocated, objects kept) after an informer lists ``items``."""
    pages = _pages(items)
    with serving(pages) as api:
        informer = Informer(api, resource, transform=transform)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            informer.relist()
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        return (after - before) / len(items), len(informer.store)


KINDS: dict[str, tuple[Resource, Callable[[int], Obj], Callable[[], Transform]]] = {
    "pod, no claim": (PODS, job_pod, lambda: pod_view),
    "pod with a claim": (PODS, lambda i: job_pod(i, claim=f"job-{i:06d}-abcde-gpu-xyz12"), lambda: pod_view),
    "claim, allocated": (CLAIMS, job_claim, lambda: claim_view),
    "claim, pending": (CLAIMS, lambda i: job_claim(i, allocated=False), lambda: claim_view),
    "claim, explained": (CLAIMS, explained_claim, lambda: claim_view),
    "slice, 8 GPUs": (SLICES, plugin_slice, slice_view),
    "slice, 64 MIG": (SLICES, mig_slice, slice_view),
}


def measure(n: int = 1000) -> dict[str, dict[str, float]]:
    """Bytes per object of every kind, whole and as the controller keeps it."""
    out: dict[str, dict[str, float]] = {}
    for name, (resource, make, transform) in KINDS.items():
        items = [make(i) for i in range(n)]
        whole, _ = retained_bytes(resource, items, None)
        kept, count = retained_bytes(resource, items, transform())
        out[name] = {"json_bytes": len(orjson.dumps(items)) / n, "whole": whole, "kept": kept, "kept_objects": count}
    return out


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 1000
    print(f"{'object':18s} {'JSON':>8s} {'before':>9s} {'after':>9s}  (bytes per object, {n} objects)")
    for name, row in measure(n).items():
        print(f"{name:18s} {row['json_bytes']:8.0f} {row['whole']:9.0f} {row['kept']:9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
