"""A tiny local HTTP server that answers RestKubeApi with scripted replies (tests of dra_driver.k8s.client
and dra_driver.k8s.wire), and the ``srv`` fixture (in conftest.py) around it."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes.config import load_kube_config_from_dict

from dra_driver.k8s.client import Credentials, RestKubeApi
from dra_driver.k8s.credentials import official_loader

Reply = tuple[int, Any]
RawReply = tuple[int, str, bytes]  # status, Content-Type, body
HeaderReply = tuple[int, Any, dict[str, str]]  # status, JSON body, extra response headers


class Server:
    def __init__(self, user: dict[str, Any] | None = None, **api_kwargs: Any) -> None:
        self.requests: list[dict[str, Any]] = []
        self.replies: list[Reply | RawReply | HeaderReply | list[bytes]] = []
        self.close_after: set[int] = set()
        """Request numbers (1, 2, ...) after whose reply the server closes the connection, unannounced."""
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                outer.requests.append({"method": self.command, "path": self.path,
                                       "ctype": self.headers.get("Content-Type"),
                                       "auth": self.headers.get("Authorization"),
                                       "agent": self.headers.get("User-Agent"),
                                       "accept": self.headers.get("Accept"),
                                       "peer": self.client_address[1],
                                       "body": json.loads(body) if body else None})
                if len(outer.requests) in outer.close_after:
                    self.close_connection = True
                reply = outer.replies.pop(0)
                if isinstance(reply, list):  # a watch stream
                    data = b"".join(reply)
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                extra: dict[str, str] = {}
                if len(reply) == 3 and isinstance(reply[2], dict):
                    code, obj, extra = reply
                    ctype, data = "application/json", json.dumps(obj).encode()
                elif len(reply) == 3:
                    code, ctype, data = reply
                else:
                    code, obj = reply
                    ctype, data = "application/json", json.dumps(obj).encode()
                self.send_response(code)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_PATCH = do_DELETE = _handle

            def log_message(self, *a: Any) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.host = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.api = RestKubeApi(plain_credentials(self.host, user or {}), **api_kwargs)


def kubeconfig_dict(server: str, user: dict[str, Any], cluster: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "ctx",
            "clusters": [{"name": "c", "cluster": {"server": server, **(cluster or {})}}],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}]}


def plain_credentials(server: str, user: dict[str, Any] | None = None) -> Credentials:
    """Credentials for ``server`` read by the official loader from an in-memory kubeconfig."""
    doc = kubeconfig_dict(server, user or {})
    return Credentials(official_loader(lambda cfg: load_kube_config_from_dict(doc, client_configuration=cfg,
                                                                              persist_config=False)),
                       "test kubeconfig")
