"""The node plugin's gRPC servers: kubelet plugin registration and the DRA service.

* Registration (``pluginregistration.Registration``) on ``settings.registration_socket``:
  GetInfo answers type ``DRAPlugin``, the driver name, the absolute DRA socket path and
  ``v1.DRAPlugin``, ``v1beta1.DRAPlugin``, ``v1.DRAResourceHealth``, ``v1alpha1.DRAResourceHealth``.
* DRA (``settings.dra_socket``): ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`` and the v1beta1
  service with the same handlers (v1beta1 has no ``share_id``), and
  ``DRAResourceHealth/NodeWatchResources`` in v1 (which a 1.37 kubelet prefers) and v1alpha1
  (which 1.36 speaks, and 1.37 to 1.39 still accept): the same messages, so one stream serves both.
  It sends the complete device health list whenever it changes and at least every
  ``resend_interval`` seconds.

Sockets: gRPC listens on a hidden temporary name in the target directory (the kubelet ignores
names starting with ``.``); the socket is chmod-ed (0600, or 0660 and chgrp with a socket group)
and then renamed over the public name, so it never appears with looser permissions and a stale
socket is replaced atomically. Missing parent directories are created 0750. On stop only a socket
that is still ours (same inode) is removed: a newer instance's socket survives (with rolling updates
every instance has sockets of its own names anyway, :func:`dra_driver.ondisk.socket_paths`). Stop
deregisters first, then drains the calls in flight (:meth:`PluginServers.stop`).

A claim the kubelet names twice is passed to the handler once. The handler answers every claim
and never raises (:class:`PrepareHandler`): the prepare state's per-claim errors, its last resorts
included, are the answers, so this layer adds no defence of its own.
"""

from __future__ import annotations

import grp
import importlib
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import grpc

from dra_driver import logs
from dra_driver._proto.dra.v1 import api_pb2 as dra_v1
from dra_driver._proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from dra_driver._proto.drahealth.v1 import api_pb2 as health_v1
from dra_driver._proto.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from dra_driver._proto.pluginregistration import api_pb2 as reg_pb
from dra_driver.node.fileio import ensure_dir
from dra_driver.node.prepare.calls import ClaimRef, PrepareOutcome
from dra_driver.node.publish.healthboard import HEALTHY, UNHEALTHY, DeviceHealthReport, HealthBoard
from dra_driver.ondisk import MAX_SOCKET_PATH


def _servicers(module: str) -> Any:
    # The generated *_grpc modules have no stubs and no annotations: strict mypy would refuse every
    # call into them, so they are loaded by name. The message modules are imported above, typed by
    # their generated stubs.
    return importlib.import_module(f"dra_driver._proto.{module}")


dra_v1_grpc = _servicers("dra.v1.api_pb2_grpc")
dra_v1beta1_grpc = _servicers("dra.v1beta1.api_pb2_grpc")
health_v1_grpc = _servicers("drahealth.v1.api_pb2_grpc")
health_v1alpha1_grpc = _servicers("drahealth.v1alpha1.api_pb2_grpc")
reg_grpc = _servicers("pluginregistration.api_pb2_grpc")

PrepareRequest = dra_v1.NodePrepareResourcesRequest | dra_v1beta1.NodePrepareResourcesRequest
PrepareResponse = dra_v1.NodePrepareResourcesResponse | dra_v1beta1.NodePrepareResourcesResponse
UnprepareRequest = dra_v1.NodeUnprepareResourcesRequest | dra_v1beta1.NodeUnprepareResourcesRequest
UnprepareResponse = dra_v1.NodeUnprepareResourcesResponse | dra_v1beta1.NodeUnprepareResourcesResponse

SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
PLUGIN_TYPE = "DRAPlugin"
SOCKET_DIR_MODE = 0o750
DEFAULT_RESEND_INTERVAL = 10.0

_log = logs.get("grpc")


class PrepareHandler(Protocol):
    """What the DRA service needs from the driver state (:class:`dra_driver.node.prepare.state.DeviceState`):
    an answer for every claim it is given (each UID once), and never an exception."""

    def prepare(self, claims: Iterable[ClaimRef]) -> dict[str, PrepareOutcome]: ...

    def unprepare(self, claims: Iterable[ClaimRef]) -> dict[str, str | None]: ...


# --- health -----------------------------------------------------------------------------------


class HealthSource(Protocol):
    """What the resource health stream reads (:class:`dra_driver.node.publish.healthboard.HealthBoard`)."""

    def snapshot(self) -> tuple[int, list[DeviceHealthReport]]:
        """A version number (bumped on every change) and the complete device list."""
        ...

    def wait_for_change(self, version: int, timeout: float) -> int:
        """Block until the version differs from ``version`` or ``timeout`` passes; the current version."""
        ...


# --- sockets ----------------------------------------------------------------------------------


def _resolve_group(group: str) -> int:
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(f"socket group {group!r} does not exist") from None


class _SocketServer:
    """One grpc.Server listening on a Unix socket that it alone owns."""

    def __init__(self, name: str, path: Path, server: grpc.Server, socket_group: str | None) -> None:
        self.name = name
        self.path = Path(os.path.abspath(path))
        self.server = server
        self.socket_group = socket_group
        self.inode: tuple[int, int] | None = None
        self._log = _log.bind(server=name, socket=str(self.path))

    def start(self) -> None:
        path = self.path
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            raise ValueError(f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes")
        ensure_dir(path.parent, SOCKET_DIR_MODE)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISSOCK(st.st_mode):
            raise ValueError(f"{path} exists and is not a socket; refusing to replace it")
        private = path.parent / f".tmp-{secrets.token_hex(4)}.sock"
        if len(os.fsencode(private)) > MAX_SOCKET_PATH:
            raise ValueError(f"socket directory {path.parent} is too long for a Unix socket path")
        if self.server.add_insecure_port(f"unix:{private}") == 0:
            raise RuntimeError(f"could not listen on {private}")
        self.server.start()
        try:
            if self.socket_group:
                os.chown(private, -1, _resolve_group(self.socket_group))
                os.chmod(private, 0o660)
            else:
                os.chmod(private, 0o600)
            if st is not None:
                self._log.info("replacing stale socket")
            os.replace(private, path)
        except BaseException:
            self.server.stop(0)
            raise
        new = os.lstat(path)
        self.inode = (new.st_dev, new.st_ino)
        self._log.info("listening", mode=oct(stat.S_IMODE(new.st_mode)))

    def stop(self, grace: float) -> None:
        self.server.stop(grace).wait()
        self.remove_socket()

    def remove_socket(self) -> None:
        """Remove the socket if it is still ours; the server, if running, keeps its connections."""
        if self.inode is None:
            return
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if (st.st_dev, st.st_ino) == self.inode:
            os.unlink(self.path)
            self._log.info("removed socket")
        else:
            self._log.info("socket was replaced by another instance; leaving it")
        self.inode = None


# --- services ---------------------------------------------------------------------------------


def _claims(request: PrepareRequest | UnprepareRequest) -> list[ClaimRef]:
    """The request's claims, each UID once: the kubelet may repeat one, and the first mention wins.
    The one place repeats are dropped: the handler is given each UID once."""
    seen: dict[str, ClaimRef] = {}
    for c in request.claims:
        seen.setdefault(c.uid, ClaimRef(uid=c.uid, namespace=c.namespace, name=c.name))
    return list(seen.values())


class _DraService:
    """The DRA handlers, shared by the v1 and v1beta1 services: each answers into the response of
    its own version."""

    def __init__(self, handler: PrepareHandler) -> None:
        self.handler = handler

    def prepare(self, request: PrepareRequest, response: PrepareResponse) -> PrepareResponse:
        claims = _claims(request)
        if not claims:
            return response
        outcomes = self.handler.prepare(claims)
        for claim in claims:
            outcome = outcomes[claim.uid]
            answer = response.claims[claim.uid]
            if outcome.error is not None:
                answer.error = outcome.error or "unknown error"
                continue
            for d in outcome.devices:
                dev = answer.devices.add(
                    request_names=list(d.request_names), pool_name=d.pool_name, device_name=d.device_name,
                    cdi_device_ids=list(d.cdi_device_ids),
                )
                if d.share_id and isinstance(dev, dra_v1.Device):  # v1beta1 has no share_id
                    dev.share_id = d.share_id
        return response

    def unprepare(self, request: UnprepareRequest, response: UnprepareResponse) -> UnprepareResponse:
        claims = _claims(request)
        if not claims:
            return response
        errors = self.handler.unprepare(claims)
        for claim in claims:
            answer = response.claims[claim.uid]
            error = errors[claim.uid]
            if error:
                answer.error = error
        return response


class _DraV1:
    def __init__(self, service: _DraService) -> None:
        self.service = service

    def NodePrepareResources(self, request: dra_v1.NodePrepareResourcesRequest,
                             context: grpc.ServicerContext) -> PrepareResponse:
        return self.service.prepare(request, dra_v1.NodePrepareResourcesResponse())

    def NodeUnprepareResources(self, request: dra_v1.NodeUnprepareResourcesRequest,
                               context: grpc.ServicerContext) -> UnprepareResponse:
        return self.service.unprepare(request, dra_v1.NodeUnprepareResourcesResponse())


class _DraV1beta1:
    def __init__(self, service: _DraService) -> None:
        self.service = service

    def NodePrepareResources(self, request: dra_v1beta1.NodePrepareResourcesRequest,
                             context: grpc.ServicerContext) -> PrepareResponse:
        return self.service.prepare(request, dra_v1beta1.NodePrepareResourcesResponse())

    def NodeUnprepareResources(self, request: dra_v1beta1.NodeUnprepareResourcesRequest,
                               context: grpc.ServicerContext) -> UnprepareResponse:
        return self.service.unprepare(request, dra_v1beta1.NodeUnprepareResourcesResponse())


class _Health:
    def __init__(self, pb: ModuleType, source: HealthSource, pool_name: str, resend_interval: float,
                 stopping: threading.Event, timeout_seconds: int = 0) -> None:
        self.pb = pb  # health_v1 or health_v1alpha1: the same messages under two package names
        self.version = pb.DESCRIPTOR.package
        self.source = source
        self.pool_name = pool_name
        self.resend_interval = resend_interval
        self.stopping = stopping
        self.timeout_seconds = timeout_seconds

    def _message(self, reports: Sequence[DeviceHealthReport]) -> Any:
        now = int(time.time())
        pb = self.pb
        out = pb.NodeWatchResourcesResponse()
        for r in reports:
            out.devices.add(
                device=pb.DeviceIdentifier(pool_name=self.pool_name, device_name=r.device_name),
                health={HEALTHY: pb.HEALTHY, UNHEALTHY: pb.UNHEALTHY}.get(r.health, pb.UNKNOWN),
                last_updated_time=int(r.updated) or now,
                health_check_timeout_seconds=self.timeout_seconds,
                message=r.message[:1024],
            )
        return out

    def NodeWatchResources(self, request: health_v1.NodeWatchResourcesRequest | health_v1alpha1.NodeWatchResourcesRequest,
                           context: grpc.ServicerContext) -> Iterator[Any]:
        _log.info("kubelet opened the device health stream", version=self.version)
        try:
            while context.is_active() and not self.stopping.is_set():
                version, reports = self.source.snapshot()
                yield self._message(reports)
                deadline = time.monotonic() + self.resend_interval
                while context.is_active() and not self.stopping.is_set():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    if self.source.wait_for_change(version, min(left, 0.5)) != version:
                        break
        except Exception:  # last resort: logged here, since gRPC only tells the kubelet
            _log.exception("device health stream failed", version=self.version)
            raise
        finally:
            _log.info("device health stream closed", version=self.version)


class _Registration:
    def __init__(self, driver_name: str, endpoint: str, on_status: Callable[[bool, str], None] | None) -> None:
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.on_status = on_status
        self.registered = threading.Event()
        self.log = _log.bind(driver=driver_name)

    def GetInfo(self, request: reg_pb.InfoRequest, context: grpc.ServicerContext) -> reg_pb.PluginInfo:
        return reg_pb.PluginInfo(type=PLUGIN_TYPE, name=self.driver_name, endpoint=self.endpoint,
                                 supported_versions=list(SUPPORTED_VERSIONS))

    def NotifyRegistrationStatus(self, request: reg_pb.RegistrationStatus,
                                 context: grpc.ServicerContext) -> reg_pb.RegistrationStatusResponse:
        if request.plugin_registered:
            self.registered.set()
            self.log.info("registered with the kubelet", endpoint=self.endpoint)
        else:
            self.registered.clear()
            self.log.error("kubelet rejected the registration", error=request.error)
        if self.on_status is not None:
            try:
                self.on_status(bool(request.plugin_registered), str(request.error))
            except Exception:  # last resort: the kubelet's notification is answered whatever the callback does
                self.log.exception("registration status callback failed")
        return reg_pb.RegistrationStatusResponse()


# --- the pair of servers ----------------------------------------------------------------------


class PluginServers:
    """The DRA server and the registration server; :meth:`start` serves DRA first, then registers."""

    def __init__(
        self,
        *,
        driver_name: str,
        node_name: str,
        dra_socket: Path,
        registration_socket: Path,
        handler: PrepareHandler,
        health: HealthSource | None = None,
        device_names: Iterable[str] = (),
        socket_group: str | None = None,
        resend_interval: float = DEFAULT_RESEND_INTERVAL,
        health_timeout_seconds: int = 0,
        max_workers: int = 16,
        on_registration: Callable[[bool, str], None] | None = None,
    ) -> None:
        self.driver_name = driver_name
        self.node_name = node_name
        self.health: HealthSource = health if health is not None else HealthBoard(device_names)
        self._stopping = threading.Event()
        dra_path = Path(os.path.abspath(dra_socket))
        # No BDP probing: the calls are small messages over a local socket, so there is no bandwidth to
        # estimate, and each probe is a PING round trip that wakes both sides during the call.
        dra = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="dra-grpc"),
                          options=[("grpc.http2.bdp_probe", 0)])
        service = _DraService(handler)
        dra_v1_grpc.add_DRAPluginServicer_to_server(_DraV1(service), dra)
        dra_v1beta1_grpc.add_DRAPluginServicer_to_server(_DraV1beta1(service), dra)
        for pb, pb_grpc in ((health_v1, health_v1_grpc), (health_v1alpha1, health_v1alpha1_grpc)):
            pb_grpc.add_DRAResourceHealthServicer_to_server(
                _Health(pb, self.health, node_name, resend_interval, self._stopping, health_timeout_seconds), dra
            )
        reg = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="reg-grpc"))
        self.registration = _Registration(driver_name, str(dra_path), on_registration)
        reg_grpc.add_RegistrationServicer_to_server(self.registration, reg)
        self._dra = _SocketServer("dra", dra_path, dra, socket_group)
        self._reg = _SocketServer("registration", Path(registration_socket), reg, socket_group)

    @property
    def dra_socket(self) -> Path:
        return self._dra.path

    @property
    def registration_socket(self) -> Path:
        return self._reg.path

    @property
    def registered(self) -> threading.Event:
        return self.registration.registered

    def start(self) -> None:
        self._stopping.clear()
        self._dra.start()
        try:
            self._reg.start()
        except BaseException:
            self._dra.stop(0)
            raise

    def stop(self, grace: float = 2.0) -> None:
        """Deregister, drain, and remove the sockets that are still ours.

        The registration socket goes first: its removal is what makes the kubelet drop this
        instance (and send its calls to another one, in a rolling update). Then the DRA server
        refuses new calls and lets those in flight finish, for up to ``grace`` seconds; the health
        streams end at once (``_stopping``), so this returns as soon as the last call is answered.
        """
        self._stopping.set()
        try:
            self._reg.remove_socket()
        except OSError:
            _log.exception("removing the registration socket failed")
        for server in (self._reg, self._dra):
            try:
                server.stop(grace)
            except Exception:  # last resort: the other server is stopped too
                _log.exception("stopping server failed", server=server.name)
