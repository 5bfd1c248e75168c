"""Kubelet plugin watcher + DRA plugin manager: registration, connectivity, wipe timer, health.

The decision rules are pure functions (``negotiate_version``, ``validate_plugin_info``,
``discover_sockets``); ``PluginManager`` applies them to a registry directory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc

from .draclient import CALL_TIMEOUT_S, DRAClient
from .health import HealthStore, health_entries
from .logutil import kv
from .model import ClaimRef, ClaimResult, DriverCallError
from .protos import DRA_SERVICES, HEALTH_SERVICES, REGISTRATION_SERVICE, Protos

log = logging.getLogger("kubelet_peer.registration")

PLUGIN_TYPE = "DRAPlugin"
KNOWN_DRA_VERSIONS: tuple[str, ...] = tuple(DRA_SERVICES)
DIAL_TIMEOUT_S = 10.0
GET_INFO_TIMEOUT_S = 1.0
NOTIFY_TIMEOUT_S = 5.0
HEALTH_RETRY_S = 5.0
RETRY_INITIAL_S = 0.5
RETRY_MAX_S = 5.0

SocketIdent = tuple[int, int]  # (inode, mtime_ns): a re-created socket is a new plugin instance


def negotiate_version(supported: Sequence[str]) -> str | None:
    """First entry of the *plugin's* list that the peer speaks (kubelet >= 1.34 rule)."""
    for v in supported:
        if v in KNOWN_DRA_VERSIONS:
            return v
    return None


@dataclass(frozen=True)
class Accepted:
    driver: str
    endpoint: str
    version: str
    health: str | None  # the health service to watch, None when the plugin offers none we know


@dataclass(frozen=True)
class Rejected:
    reason: str


def validate_plugin_info(
    plugin_type: str, name: str, endpoint: str, supported: Sequence[str], socket_path: str
) -> Accepted | Rejected:
    if plugin_type != PLUGIN_TYPE:
        return Rejected(f'plugin type "{plugin_type}" is not handled (want "{PLUGIN_TYPE}")')
    if not name:
        return Rejected("plugin name is empty")
    endpoint = endpoint or socket_path
    if not os.path.isabs(endpoint):
        return Rejected(f'endpoint "{endpoint}" is not an absolute path')
    version = negotiate_version(supported)
    if version is None:
        return Rejected(f"none of the supported versions {list(supported)} is known (known: {list(KNOWN_DRA_VERSIONS)})")
    health = next((h for h in HEALTH_SERVICES if h in supported), None)
    return Accepted(driver=name, endpoint=endpoint, version=version, health=health)


def discover_sockets(root: str) -> dict[str, SocketIdent]:
    """Unix sockets under ``root`` (recursively, like the kubelet), skipping names starting with '.'."""
    found: dict[str, SocketIdent] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for fn in filenames:
            if fn.startswith("."):
                continue
            path = os.path.join(dirpath, fn)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISSOCK(st.st_mode):
                found[path] = (st.st_ino, st.st_mtime_ns)
    return found


def unix_target(path: str) -> str:
    return "unix:" + path


@dataclass
class Instance:
    socket_path: str
    ident: SocketIdent
    driver: str
    endpoint: str
    version: str
    health: str | None
    channel: grpc.Channel
    client: DRAClient
    registered_at: float
    stop: threading.Event = field(default_factory=threading.Event)
    state: grpc.ChannelConnectivity = grpc.ChannelConnectivity.IDLE
    health_call: Any = None

    def on_state(self, s: grpc.ChannelConnectivity) -> None:
        self.state = s

    @property
    def connected(self) -> bool:
        return bool(self.state == grpc.ChannelConnectivity.READY)


@dataclass
class _Retry:
    ident: SocketIdent
    not_before: float
    delay: float


@dataclass
class _DriverTimer:
    down_since: float | None = None
    wiped: bool = False


class PluginManager:
    def __init__(
        self,
        registry_dir: str,
        protos: Protos,
        *,
        on_wipe: Callable[[str], None] | None = None,
        health_store: HealthStore | None = None,
        poll_interval: float = 0.1,
        wipe_delay: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry_dir = registry_dir
        self._protos = protos
        self._on_wipe = on_wipe
        self._health = health_store
        self._poll = poll_interval
        self._wipe_delay = wipe_delay
        self._clock = clock
        self._lock = threading.RLock()
        self._instances: dict[str, Instance] = {}  # by registration socket path
        self._in_flight: set[str] = set()
        self._retry: dict[str, _Retry] = {}
        self._timers: dict[str, _DriverTimer] = {}
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="plugin-register")

    # --- public API used by the pod loop ----------------------------------------------------

    def drivers(self) -> dict[str, list[Instance]]:
        with self._lock:
            out: dict[str, list[Instance]] = {}
            for inst in self._instances.values():
                out.setdefault(inst.driver, []).append(inst)
            return out

    def client_for(self, driver: str) -> DRAClient:
        """Newest connected instance, else the newest one (the kubelet's preference since 1.33)."""
        instances = sorted(self.drivers().get(driver, []), key=lambda i: i.registered_at, reverse=True)
        if not instances:
            raise DriverCallError(f'DRA driver "{driver}" is not registered on this node')
        connected = [i for i in instances if i.connected]
        return (connected or instances)[0].client

    def prepare(self, driver: str, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        return self.client_for(driver).prepare(claims, CALL_TIMEOUT_S)

    def unprepare(self, driver: str, claims: Sequence[ClaimRef]) -> dict[str, str]:
        return self.client_for(driver).unprepare(claims, CALL_TIMEOUT_S)

    # --- loops ------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        monitor = threading.Thread(target=self._monitor_loop, args=(stop,), name="plugin-monitor", daemon=True)
        monitor.start()
        while not stop.is_set():
            try:
                self.scan()
            except Exception:
                log.exception(kv("registry scan failed", dir=self.registry_dir))
            stop.wait(self._poll)
        monitor.join(timeout=2)
        self.close()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for inst in list(self._instances.values()):
                self._drop(inst, "peer shutting down")

    def _monitor_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.check_wipe()
            except Exception:
                log.exception(kv("wipe check failed"))
            stop.wait(0.5)

    def scan(self) -> None:
        current = discover_sockets(self.registry_dir) if os.path.isdir(self.registry_dir) else {}
        now = self._clock()
        with self._lock:
            for path, inst in list(self._instances.items()):
                if current.get(path) != inst.ident:
                    self._drop(inst, "registration socket removed" if path not in current else "socket re-created")
            for path in list(self._retry):
                if current.get(path) != self._retry[path].ident:
                    del self._retry[path]
            for path, ident in current.items():
                if path in self._instances or path in self._in_flight:
                    continue
                r = self._retry.get(path)
                if r is not None and now < r.not_before:
                    continue
                self._in_flight.add(path)
                self._pool.submit(self._register_safe, path, ident)

    def check_wipe(self) -> None:
        """Start/stop each known driver's wipe timer; wipe its slices once it expires."""
        now = self._clock()
        due: list[str] = []
        with self._lock:
            by_driver = self.drivers()
            for driver, timer in self._timers.items():
                up = any(i.connected for i in by_driver.get(driver, []))
                if up:
                    if timer.down_since is not None:
                        log.info(kv("driver connected", driver=driver))
                    timer.down_since, timer.wiped = None, False
                elif timer.down_since is None:
                    timer.down_since = now
                    log.info(
                        kv("driver has no connected plugin, wipe timer started", driver=driver, wipe_delay_s=self._wipe_delay)
                    )
                elif not timer.wiped and now - timer.down_since >= self._wipe_delay:
                    due.append(driver)
        for driver in due:
            try:
                if self._on_wipe is not None:
                    self._on_wipe(driver)
            except Exception as e:
                log.warning(kv("wiping ResourceSlices failed, will retry", driver=driver, error=e))
                continue
            with self._lock:
                t = self._timers.get(driver)
                if t is not None and t.down_since is not None:
                    t.wiped = True

    # --- registration -----------------------------------------------------------------------

    def _register_safe(self, path: str, ident: SocketIdent) -> None:
        try:
            ok = self._register(path, ident)
        except Exception as e:
            log.warning(kv("plugin registration failed", socket=path, error=e))
            ok = False
        with self._lock:
            self._in_flight.discard(path)
            if ok:
                self._retry.pop(path, None)
            else:
                prev = self._retry.get(path)
                delay = RETRY_INITIAL_S if prev is None or prev.ident != ident else min(prev.delay * 2, RETRY_MAX_S)
                self._retry[path] = _Retry(ident=ident, not_before=self._clock() + delay, delay=delay)

    def _notify(self, channel: grpc.Channel, registered: bool, error: str) -> None:
        status = self._protos.request_type(REGISTRATION_SERVICE, "NotifyRegistrationStatus")
        notify = self._protos.unary(channel, REGISTRATION_SERVICE, "NotifyRegistrationStatus")
        notify(status(plugin_registered=registered, error=error), timeout=NOTIFY_TIMEOUT_S)

    def _register(self, path: str, ident: SocketIdent) -> bool:
        reg_channel = grpc.insecure_channel(unix_target(path))
        try:
            grpc.channel_ready_future(reg_channel).result(timeout=DIAL_TIMEOUT_S)
            info_req = self._protos.request_type(REGISTRATION_SERVICE, "GetInfo")
            info = self._protos.unary(reg_channel, REGISTRATION_SERVICE, "GetInfo")(info_req(), timeout=GET_INFO_TIMEOUT_S)
            decision = validate_plugin_info(info.type, info.name, info.endpoint, list(info.supported_versions), path)
            if isinstance(decision, Accepted):
                with self._lock:
                    clash = [i for i in self._instances.values() if i.endpoint == decision.endpoint and i.socket_path != path]
                if clash:
                    decision = Rejected(f'endpoint "{decision.endpoint}" is already registered by {clash[0].socket_path}')
            if isinstance(decision, Rejected):
                log.warning(kv("plugin rejected", socket=path, driver=info.name or None, reason=decision.reason))
                try:
                    self._notify(reg_channel, False, decision.reason)
                except grpc.RpcError as e:
                    log.info(kv("NotifyRegistrationStatus(false) failed", socket=path, error=e.details()))
                return False

            inst = self._connect(path, ident, decision)
            try:
                self._notify(reg_channel, True, "")
            except grpc.RpcError as e:
                log.warning(kv("NotifyRegistrationStatus(true) failed, dropping plugin", socket=path, error=e.details()))
                with self._lock:
                    self._drop(inst, "registration notification failed")
                return False
            return True
        except grpc.FutureTimeoutError:
            log.info(kv("cannot dial plugin registration socket", socket=path, timeout_s=DIAL_TIMEOUT_S))
            return False
        except grpc.RpcError as e:
            log.info(kv("GetInfo failed", socket=path, code=e.code().name, error=e.details()))
            return False
        finally:
            reg_channel.close()

    def _connect(self, path: str, ident: SocketIdent, d: Accepted) -> Instance:
        channel = grpc.insecure_channel(unix_target(d.endpoint))
        inst = Instance(
            socket_path=path,
            ident=ident,
            driver=d.driver,
            endpoint=d.endpoint,
            version=d.version,
            health=d.health,
            channel=channel,
            client=DRAClient(self._protos, channel, d.version),
            registered_at=self._clock(),
        )
        # try_to_connect keeps the channel reconnecting, so READY reflects whether the plugin is up.
        channel.subscribe(inst.on_state, try_to_connect=True)
        with self._lock:
            self._instances[path] = inst
            self._timers.setdefault(d.driver, _DriverTimer())
        log.info(kv("plugin registered", driver=d.driver, socket=path, endpoint=d.endpoint, version=d.version, health=d.health))
        if d.health and self._health is not None:
            threading.Thread(target=self._health_loop, args=(inst,), name=f"health-{d.driver}", daemon=True).start()
        return inst

    def _drop(self, inst: Instance, why: str) -> None:
        self._instances.pop(inst.socket_path, None)
        inst.stop.set()
        call = inst.health_call
        if call is not None:
            call.cancel()
        with contextlib.suppress(ValueError):
            inst.channel.unsubscribe(inst.on_state)
        inst.channel.close()
        log.info(kv("plugin deregistered", driver=inst.driver, socket=inst.socket_path, reason=why))

    # --- health -----------------------------------------------------------------------------

    def _health_loop(self, inst: Instance) -> None:
        assert self._health is not None
        assert inst.health is not None
        req = self._protos.request_type(inst.health, "NodeWatchResources")
        watch = self._protos.server_stream(inst.channel, inst.health, "NodeWatchResources")
        while not inst.stop.is_set():
            try:
                call = watch(req())
                inst.health_call = call
                if inst.stop.is_set():
                    call.cancel()
                for resp in call:
                    self._health.set_driver(inst.driver, health_entries(resp.devices))
                log.info(kv("health stream ended", driver=inst.driver))
            except grpc.RpcError as e:
                if not inst.stop.is_set():
                    log.info(kv("health stream failed", driver=inst.driver, code=e.code().name, error=e.details()))
            finally:
                inst.health_call = None
            # The kubelet forgets a driver's health when its stream ends.
            self._health.clear_driver(inst.driver)
            inst.stop.wait(HEALTH_RETRY_S)
