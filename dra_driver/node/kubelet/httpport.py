"""The node plugin's HTTP port: ``/healthz`` and ``/livez`` answer the socket check of
:mod:`~dra_driver.node.kubelet.probe`, ``/readyz`` adds publishing, and ``/metrics`` the plugin's metrics.

``/readyz`` says whether publishing is degraded (a device withheld from the ResourceSlices because
the API server would refuse it), with the devices and rules in its body. Degraded is *not ready*, never *not
alive*: the liveness and startup probes stay on the socket check, so the kubelet does not restart a
plugin that serves the node's other GPUs (a restart would withhold the same device again). The
kubelet keeps calling a plugin that is not Ready: registration goes through the sockets.

The chart wires a readiness probe to ``/readyz`` only on request
(``kubeletPlugin.probes.readiness.enabled``): with the default surge rollout the old pod goes only
once the new one is Ready, so one degraded node would stop the DaemonSet's rollout everywhere, the
rollout of a fix included. What an operator sees by default is the ``DeviceWithheld`` Event on
the Node, ``dra_driver_plugin_devices_withheld{reason}`` (the one to alert on) and the log line.

A node that publishes nothing on purpose (no NVML, no GPUs, NVIDIA's device plugin serving them:
:mod:`dra_driver.node.publish.gate`) is *ready*, and ``/readyz`` says why in its 200 answer: such
a pod is working as meant, and a not-Ready one would stop ``kubectl rollout status`` on every
mixed cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from dra_driver import httpserve

READY_PATH = "/readyz"


def serve(port: int, check_fn: Callable[[], str | None], host: str = "0.0.0.0",
          pages: Mapping[str, Callable[[], tuple[bytes, str]]] | None = None,
          degraded_fn: Callable[[], str | None] | None = None,
          note_fn: Callable[[], str | None] | None = None) -> httpserve.Server:
    """``GET /healthz`` (and ``/livez``): 200 when ``check_fn`` finds nothing wrong, else 503 with
    the problem; ``/readyz`` also asks ``degraded_fn``, and a ready answer carries ``note_fn``'s
    remark (why the node publishes nothing). ``pages`` adds more paths (``/metrics``), each
    answering ``(body, content type)``."""
    def answer(problem: str | None, note: str | None = None) -> tuple[int, bytes, str]:
        if problem:
            return 503, f"{problem}\n".encode(), "text/plain"
        return 200, (f"ok: {note}\n" if note else "ok\n").encode(), "text/plain"

    def health() -> tuple[int, bytes, str]:
        return answer(check_fn())

    def ready() -> tuple[int, bytes, str]:
        return answer(check_fn() or (degraded_fn() if degraded_fn is not None else None),
                      note_fn() if note_fn is not None else None)

    def ok(page: Callable[[], tuple[bytes, str]]) -> httpserve.Page:
        return lambda: (200, *page())

    routes: dict[str, httpserve.Page] = {path: health for path in httpserve.HEALTH_PATHS}
    routes[READY_PATH] = ready
    routes.update({path: ok(page) for path, page in (pages or {}).items()})
    server = httpserve.bind(host, port, routes)
    httpserve.serve_in_background(server, "healthz")
    return server
