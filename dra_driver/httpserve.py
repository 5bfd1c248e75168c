"""The small HTTP server behind the node plugin's and the controller's ``/healthz`` and ``/metrics``.

Each program names its pages; a page answers ``(status, body, content type)``. Query strings are
ignored, requests are not logged (probes every few seconds would drown the real log), and any
other path is a 404.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Page = Callable[[], tuple[int, bytes, str]]
HEALTH_PATHS = ("/healthz", "/livez", "/readyz")


def bind(host: str, port: int, pages: Mapping[str, Page]) -> ThreadingHTTPServer:
    """A server bound to ``host:port`` (port 0: any free one), not yet serving."""
    routes = dict(pages)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            page = routes.get(self.path.split("?", 1)[0])
            if page is None:
                self._reply(404, b"not found\n", "text/plain")
                return
            self._reply(*page())

        def _reply(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    return ThreadingHTTPServer((host, port), Handler)


def serve_in_background(server: ThreadingHTTPServer, name: str) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
    thread.start()
    return thread
