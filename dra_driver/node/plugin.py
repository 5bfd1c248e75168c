"""`dra-driver kubelet-plugin`: discover → describe → publish, and serve the kubelet.

The DRA socket is up before the registration socket appears, so the kubelet never registers a
plugin that cannot answer yet; slices are published in the background so a slow API server does
not delay registration.

Two instances on one node (``--rolling-update``: the DaemonSet starts the new pod before it stops
the old one; kubelet 1.33 or later sends calls to the newest registered instance). Who owns what:

* sockets: each instance its own pair, named after its pod UID (:func:`dra_driver.ondisk.socket_paths`),
  and removes only those;
* the checkpoint, CDI specs and metadata files: shared; every prepare, unprepare and stale-claim
  sweep runs under ``<state dir>/serialize.lock`` and starts from the checkpoint on disk
  (:mod:`dra_driver.node.prepare.sharedstate`), so either instance can unprepare what the other
  prepared;
* the node's ResourceSlices, the health taints in them and the device health Events: the holder
  of ``<state dir>/publisher.lock``, the instance that started first. The other keeps its desired
  slices current without writing them and takes the lock (within about a second) when the holder
  exits, SIGKILL included, then publishes its own content once
  (:mod:`dra_driver.node.publish.ownership`);
* health monitoring and the kubelet's health stream: both, each streaming its own view;
* a claim's ``status.devices``, its Events, and stale-claim Events: the instance that handled the
  call.

SIGTERM (or SIGINT): the registration socket goes first, so the kubelet drops this instance; calls
in flight finish (new ones are refused), then the DRA socket goes, the locks are released with the
process, and it exits 0, in well under the pod's 30 s grace period.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from dra_driver import __version__, logs, memory
from dra_driver.k8s import client as kube
from dra_driver.k8s.events import EventRecorder
from dra_driver.logs import Logger
from dra_driver.node import events as notices
from dra_driver.node.describe.devices import AllocatableDevice, describe, enumerate_devices
from dra_driver.node.discovery.backend import Backend
from dra_driver.node.discovery.model import Gpu
from dra_driver.node.discovery.nvml import NvmlBackend, NvmlError
from dra_driver.node.discovery.select import open_backend
from dra_driver.node.fileio import restrict_dir
from dra_driver.node.kubelet import httpport, probe, rivals
from dra_driver.node.kubelet.grpc import HealthSource, PluginServers, PrepareHandler
from dra_driver.node.metrics import METRICS
from dra_driver.node.prepare.calls import ClaimRef
from dra_driver.node.prepare.cdi import CdiSpecs
from dra_driver.node.prepare.checkpoint import CheckpointStore
from dra_driver.node.prepare.claimstatus import ClaimStatusWriter, ReportingHandler
from dra_driver.node.prepare.gpupolicy import GpuControl, NoGpuControl, NvmlControl, SmiControl, find_tool
from dra_driver.node.prepare.metadata import MetadataFiles
from dra_driver.node.prepare.mps import MpsDaemons, MpsSupervisor
from dra_driver.node.prepare.reading import CLAIM_READ_CONCURRENCY
from dra_driver.node.prepare.state import DeviceState
from dra_driver.node.prepare.toolkit import DriverEdits, ToolkitConfig
from dra_driver.node.publish import gate
from dra_driver.node.publish.gate import Closed, PublishGate
from dra_driver.node.publish.health import (
    HealthChange,
    HealthFileSource,
    HealthMonitor,
    NvmlEventSource,
    publish_device_counts,
)
from dra_driver.node.publish.healthboard import HealthBoard
from dra_driver.node.publish.ownership import PublisherLock
from dra_driver.node.publish.publisher import SlicePublisher
from dra_driver.node.settings import PluginSettings
from dra_driver.node.stale import StaleClaims, read_claim
from dra_driver.ondisk import PUBLISHER_LOCK_FILE

DRAIN_SECONDS = 20.0
"""How long calls in flight at SIGTERM may take to finish: inside the pod's 30 s grace period (a call
normally takes milliseconds; a claim read against a slow API server, up to its 20 s timeout)."""
PLUGIN_DIR_MODE = 0o750
"""The most the plugin's own directory may allow: the owner, and a socket group's traversal."""


def api_client(kubeconfig: str | None) -> kube.RestKubeApi:
    """The plugin's one API client: one connection pool, sized for a batch of claim reads, shared
    with slice publication."""
    return kube.RestKubeApi.from_kubeconfig(kubeconfig, pool_size=CLAIM_READ_CONCURRENCY, request_timeout=20.0,
                                            user_agent=rivals.PLUGIN_USER_AGENT)


def sweep_stale_claims(state: DeviceState, api: kube.KubeApi, claims: StaleClaims, now: float, log: Logger,
                       events: notices.NodeEvents) -> None:
    """One sweep: read every prepared claim, unprepare what :class:`StaleClaims` finds gone
    (:mod:`dra_driver.node.stale`), say what waits."""
    state.refresh()
    seen = {}
    for uid, entry in state.prepared_claims().items():
        ref = ClaimRef(uid, entry.namespace, entry.name)
        seen[uid] = (ref, read_claim(api, ref))
    verdict = claims.decide(seen, now)
    for ref in verdict.suspected:
        log.info("a prepared claim was not found; it counts as gone only if the next sweep does not find it either",
                 claim_uid=ref.uid, claim=ref.ref)
    for ref in verdict.waiting:
        log.info("a prepared claim is gone from the API server; it keeps its devices for the grace period, for the "
                 "kubelet's own Unprepare", claim_uid=ref.uid, claim=ref.ref, grace_seconds=claims.grace)
    if verdict.deferred:
        METRICS.stale_claims_deferred.inc(len(verdict.deferred))
        log.warning("more prepared claims are gone than one sweep unprepares; the rest wait for the next sweeps",
                    unprepared=len(verdict.unprepare), waiting=len(verdict.deferred), bound=claims.max_per_sweep,
                    claim_uids=[ref.uid for ref in verdict.deferred])
        events.on_node(notices.stale_claims_deferred(len(verdict.deferred), claims.max_per_sweep))
    for ref in verdict.unprepare:
        error = state.unprepare([ref]).get(ref.uid)
        if error is None:
            claims.unprepared(ref.uid)
        METRICS.stale_claims_unprepared.labels(result="error" if error else "success").inc()
        log.info("unprepared a claim deleted from the API server", claim_uid=ref.uid, claim=ref.ref, error=error)
        events.on_node(notices.stale_claim_unprepared(ref, error))


def _cleanup_loop(state: DeviceState, api: kube.KubeApi, settings: PluginSettings, stop: threading.Event,
                  log: Logger, events: notices.NodeEvents) -> None:
    claims = StaleClaims(grace=settings.stale_claim_grace, max_per_sweep=settings.max_stale_unprepares)
    while not stop.wait(settings.cleanup_interval):
        sweep_stale_claims(state, api, claims, time.monotonic(), log, events)


MPS_UNHEALTHY = "MPS control daemon: "
"""How the device health this plugin's MPS watch reports starts, so that it clears only its own."""
MPS_CHECK_INTERVAL_S = 5.0
"""How often the plugin asks its MPS control daemons whether they still answer."""


def _mps_loop(state: DeviceState, devices: Mapping[str, AllocatableDevice], board: HealthBoard,
              stop: threading.Event) -> None:
    """A dead MPS control daemon is started again; meanwhile (and for as long as it cannot be) the
    devices of its GPU are reported Unhealthy to the kubelet."""
    while not stop.wait(MPS_CHECK_INTERVAL_S):
        check_mps_daemons(state, devices, board)


def check_mps_daemons(state: DeviceState, devices: Mapping[str, AllocatableDevice], board: HealthBoard) -> list[str]:
    """One round of :func:`_mps_loop`; the GPUs whose daemon was found dead. A device another health
    source reports Unhealthy (an XID) keeps that report: it is that source's to clear."""
    dead = state.dead_mps()
    if not dead:
        return []
    foreign = {r.device_name for r in board.snapshot()[1]
               if r.health != "Healthy" and not r.message.startswith(MPS_UNHEALTHY)}
    on_gpu = {gpu: [name for name, d in devices.items() if d.gpu.uuid == gpu and name not in foreign] for gpu in dead}
    for gpu, names in on_gpu.items():
        for name in names:
            board.update(name, "Unhealthy", f"{MPS_UNHEALTHY}the daemon of GPU {gpu} stopped; starting it again")
    errors = state.restart_mps()
    for gpu, names in on_gpu.items():
        for name in names:
            if gpu in errors:
                board.update(name, "Unhealthy", f"{MPS_UNHEALTHY}{errors[gpu]}")
            else:
                board.update(name, "Healthy")
    return dead


def health_event(change: HealthChange, ownership: PublisherLock, events: notices.NodeEvents) -> None:
    """Only the publishing instance tells of health changes: two instances would say each twice."""
    if ownership.held.is_set():
        events.on_node(notices.health_changed(change))


def check_kubelet_version(api: kube.KubeApi, node_name: str, events: notices.NodeEvents, log: Logger) -> None:
    """Rolling updates on a kubelet older than 1.33: say so loudly (the plugin still serves)."""
    try:
        version = str(api.get(kube.NODES, node_name).get("status", {}).get("nodeInfo", {}).get("kubeletVersion", ""))
    except Exception as exc:  # the client's (ApiError, transport failures): only a warning is at stake
        log.warning("could not read the node's kubelet version to check rolling updates", error=str(exc))
        return
    if notices.kubelet_too_old_for_rolling_update(version):
        log.error("rolling updates need kubelet 1.33 or newer: set kubeletPlugin.rollingUpdate=false",
                  kubelet_version=version)
        events.on_node(notices.rolling_update_unsupported(version))


def report_quarantine(state: DeviceState, events: notices.NodeEvents) -> None:
    store = state.checkpoint
    if store.quarantine_reason is not None:
        events.on_node(notices.checkpoint_quarantined(store.path, store.quarantine_reason, store.quarantined))


def discover(settings: PluginSettings) -> tuple[Backend | None, list[Gpu], Closed | None]:
    """The backend and its GPUs, or why this node publishes nothing for good: no NVML, or no GPUs.
    Either way the plugin stays up (exiting would crash-loop the pod on every node without GPUs)."""
    try:
        backend = open_backend(settings.backend_choice)
        gpus = backend.discover()
    except NvmlError as exc:
        return None, [], gate.backend_closed(str(exc))
    return backend, gpus, None if gpus else gate.no_gpus_closed(backend.name)


GATE_RECHECK_SECONDS = 30.0
"""How often the Node is read again for NVIDIA's device plugin (one GET per node)."""
GATE_RETRY_SECONDS = 2.0
"""Until the first read succeeds: nothing is published before the plugin knows."""


def gate_changed(old: Closed | None, new: Closed | None, events: notices.NodeEvents, log: Logger) -> None:
    """Say why the node publishes nothing, or that it publishes again: log, Event, metric."""
    for reason in gate.REASONS:
        METRICS.not_publishing.labels(reason=reason).set(1 if new is not None and new.reason == reason else 0)
    if new is not None:
        log.error("publishing no devices; the plugin stays up", reason=new.reason, why=new.message)
        events.on_node(notices.not_publishing(new))
    elif old is not None:
        log.info("publishing the node's devices again", was=old.reason)
        events.on_node(notices.publishing_resumed(old))


def watch_gate(settings: PluginSettings, api: kube.KubeApi, publish_gate: PublishGate, fixed: Closed | None,
               stop: threading.Event, log: Logger) -> None:
    """Decide the gate now and, while the device plugin can come or go, again every
    :data:`GATE_RECHECK_SECONDS`. A Node that cannot be read keeps the last decision."""
    decided = False
    while True:
        if fixed is not None or settings.ignore_device_plugin:
            publish_gate.decide(fixed)
            return
        try:
            node = api.get(kube.NODES, settings.node_name)
        except Exception as exc:  # the client's (ApiError, transport failures): retried
            log.warning("cannot read the Node to look for NVIDIA's device plugin", error=str(exc),
                        publishing="waits" if not decided else "unchanged")
        else:
            publish_gate.decide(gate.device_plugin_closed(node, settings.node_name))
            decided = True
        if stop.wait(GATE_RECHECK_SECONDS if decided else GATE_RETRY_SECONDS):
            return


def gpu_control(settings: PluginSettings, backend: Backend | None) -> GpuControl:
    """nvidia-smi from the driver root for real GPUs. Simulated ones have no compute policy, unless a
    driver root of stand-in tools is given (the tests' way to watch what the plugin sets)."""
    root = settings.nvidia_driver_root
    if isinstance(backend, NvmlBackend):
        return NvmlControl(backend, root)
    if str(root) != "/" and find_tool(root, "nvidia-smi") is not None:
        return SmiControl(root)
    return NoGpuControl()


def device_state(settings: PluginSettings, devices: Mapping[str, AllocatableDevice], api: kube.KubeApi,
                 backend: Backend | None = None, driver_edits: Callable[[], dict[str, Any]] | None = None,
                 on_prepare_error: Callable[[ClaimRef, str], None] | None = None) -> DeviceState:
    """The prepare state, its CDI specs, checkpoint and device metadata where the settings put them."""
    control = gpu_control(settings, backend)
    # The daemons run where the driver's tools do: real GPUs, or simulated ones given stand-in tools.
    mps = (MpsSupervisor(MpsDaemons(settings.nvidia_driver_root, settings.state_dir, control))
           if isinstance(control, SmiControl | NvmlControl) else None)
    return DeviceState(
        node_name=settings.node_name,
        driver_name=settings.driver_name,
        devices=devices,
        cdi=CdiSpecs(settings.cdi_root, settings.driver_name, settings.dev_root, node_name=settings.node_name,
                     driver_edits=driver_edits, mps_state_dir=settings.state_dir if mps else None),
        checkpoint=CheckpointStore(settings.state_dir, settings.node_name, settings.driver_name,
                                   boot_id_path=settings.boot_id_path, instance=settings.pod_uid),
        api=api,
        backend=backend,
        sharing_strategies=settings.sharing_strategies,
        consumable_shares=settings.consumable_shares,
        metadata=MetadataFiles(settings.state_dir, settings.cdi_root, settings.driver_name,
                               enabled=settings.device_metadata),
        on_prepare_error=on_prepare_error,
        gpu_control=control,
        mps=mps,
    )


def plugin_servers(settings: PluginSettings, handler: PrepareHandler, health: HealthSource | None = None,
                   device_names: Sequence[str] = ()) -> PluginServers:
    """The DRA and registration servers on the settings' sockets."""
    return PluginServers(driver_name=settings.driver_name, node_name=settings.node_name,
                         dra_socket=settings.dra_socket, registration_socket=settings.registration_socket,
                         handler=handler, socket_group=settings.socket_group, health=health,
                         device_names=device_names)


def toolkit_config(settings: PluginSettings) -> ToolkitConfig:
    ctk = settings.nvidia_ctk_path
    if not ctk.is_absolute():
        import shutil  # here: at module level it brings bz2 and lzma into the plugin for this one lookup

        found = shutil.which(str(ctk))
        ctk = Path(found) if found else ctk
    return ToolkitConfig(
        ctk_path=ctk,
        hook_path=settings.nvidia_cdi_hook_path or ctk.parent / "nvidia-cdi-hook",
        driver_root=settings.nvidia_driver_root,
        host_driver_root=settings.host_driver_root or settings.nvidia_driver_root,
        dev_root=settings.dev_root,
    )


def start_driver_edits(settings: PluginSettings, backend: Backend, log: Logger) -> DriverEdits | None:
    """The driver's CDI edits from the toolkit (NVML backend only); a missing driver is logged and
    counted, and the plugin stays up: each prepare then fails naming it."""
    if backend.name != "nvml" or not settings.driver_edits:
        log.info("claims' CDI specs carry no driver edits", backend=backend.name, driver_edits=settings.driver_edits)
        return None

    def changed(edits: dict[str, Any] | None, error: str | None) -> None:
        METRICS.driver_edits_available.set(0 if error else 1)
        METRICS.driver_edits_generations.labels(result="error" if error else "success").inc()
        if error:
            log.error("the NVIDIA driver was not found: claims on this node fail to prepare until it is there",
                      driver_root=str(settings.nvidia_driver_root), error=error)
        else:
            assert edits is not None
            log.info("the driver's CDI edits are ready", driver_root=str(settings.nvidia_driver_root),
                     mounts=len(edits.get("mounts", [])), hooks=len(edits.get("hooks", [])))

    cache = DriverEdits(toolkit_config(settings), on_change=changed)
    cache.refresh()
    return cache


def start_health(settings: PluginSettings, backend: Backend, gpu_uuids: list[str], monitor: HealthMonitor,
                 health_file: HealthFileSource | None, stop: threading.Event, log: Logger) -> None:
    """NVML events for real GPUs; the --health-file for simulated ones (or NVML ones, for tests)."""
    if health_file is not None:
        health_file.monitor = monitor
        health_file.start(stop)
        log.info("watching the health file", path=str(settings.health_file))
    nv = getattr(backend, "nv", None)
    if backend.name == "nvml" and nv is not None:
        try:
            NvmlEventSource(nv, gpu_uuids, monitor, settings.ignored_xids).start(stop)
            log.info("watching NVML health events", ignored_xids=list(settings.ignored_xids))
        except Exception as exc:  # last resort: NVML's errors, an old driver's missing symbol, or a bug
            # Without events the GPUs stay Healthy, as they would with an old driver: serve anyway.
            log.error("cannot watch NVML health events", error=str(exc))
    elif health_file is None:
        log.info("no health source: devices are reported Healthy")


def run(settings: PluginSettings) -> int:
    memory.limit_arenas()  # before any thread starts
    logs.configure(settings.log_format, settings.log_level)
    log = logs.get("plugin", node=settings.node_name, driver=settings.driver_name)
    started = time.monotonic()
    stop = threading.Event()

    # Sockets and the checkpoint live here; group-writable or world-readable it must not be.
    if restrict_dir(settings.plugin_data_dir, PLUGIN_DIR_MODE):
        log.info("tightened the plugin directory", path=str(settings.plugin_data_dir), mode=oct(PLUGIN_DIR_MODE))
    api = api_client(settings.kubeconfig)
    if settings.api_profile.refuses_rivals:
        rivals.refuse_beside_rivals(api, driver=settings.driver_name, node=settings.node_name,
                                    registry_dir=settings.registry_dir, own_socket=settings.registration_socket,
                                    state_dir=settings.state_dir, log=log)
    recorder = EventRecorder(api, notices.REPORTING_CONTROLLER, settings.node_name, on_drop=METRICS.events_dropped.inc)
    recorder.start(stop)
    events = notices.NodeEvents(recorder, settings.node_name)
    backend, gpus, fixed_closed = discover(settings)
    devices = enumerate_devices(gpus, settings.dynamic_mig, settings.api_profile)
    log.info("discovered GPUs", backend=settings.backend, gpus=len(gpus), devices=len(devices),
             consumable_shares=str(settings.consumable_shares))
    METRICS.build_info.labels(version=__version__, backend=settings.backend,
                              driver_version=gpus[0].driver_version if gpus else "").set(1)

    driver_edits = start_driver_edits(settings, backend, log) if backend is not None else None
    state = device_state(
        settings, devices, api, backend=backend, driver_edits=driver_edits.edits if driver_edits else None,
        on_prepare_error=lambda claim, error: events.on_claim(claim, notices.prepare_failed(error)))
    report_quarantine(state, events)
    board = HealthBoard(sorted(devices))
    status_writer = ClaimStatusWriter(api, settings.driver_name, settings.node_name, on_idle=memory.trim)
    handler = ReportingHandler(state, status_writer, devices)
    servers = plugin_servers(settings, handler, health=board)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("stopping", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    health_file = HealthFileSource(settings.health_file, None, settings.ignored_xids) if settings.health_file else None
    if health_file is not None:
        health_file.install_signal()  # before anything slow, so an early SIGUSR1 cannot kill the process

    servers.start()
    instance = (rivals.mark_instance(settings.state_dir, servers.registration_socket)
                if settings.api_profile.refuses_rivals else None)
    log.info("serving the kubelet", dra_socket=str(servers.dra_socket),
             registration_socket=str(servers.registration_socket), startup_seconds=round(time.monotonic() - started, 3))

    if settings.rolling_update:
        check_kubelet_version(api, settings.node_name, events, log)
    ownership = PublisherLock(settings.state_dir / PUBLISHER_LOCK_FILE, settings.node_name)
    ownership.try_take()  # now, so that health changes found at start-up are told when this one publishes
    publisher = SlicePublisher(api, settings.driver_name, settings.node_name, ownership=ownership,
                               on_withheld=lambda device, model, why: events.on_node(
                                   notices.device_withheld(device, settings.driver_name, model, why)))
    devices_json, counters_json = describe(devices, settings.driver_name, settings.dynamic_mig,
                                           settings.consumable_shares, settings.api_profile)
    publish_gate = PublishGate(publisher.update, lambda old, new: gate_changed(old, new, events, log))
    publish_gate.update(devices_json, counters_json)
    threading.Thread(target=watch_gate, args=(settings, api, publish_gate, fixed_closed, stop, log),
                     name="publish-gate", daemon=True).start()
    publish_device_counts(devices, {})
    if backend is None:
        log.info("no GPU backend: no health monitoring")
    elif settings.health_monitoring:
        monitor = HealthMonitor(devices, devices_json, board, lambda tainted: publish_gate.update(tainted, counters_json),
                                on_change=lambda change: health_event(change, ownership, events),
                                profile=settings.api_profile)
        start_health(settings, backend, [g.uuid for g in gpus], monitor, health_file, stop, log)
    else:
        log.info("health monitoring disabled: devices are reported Healthy")
    healthz = None
    if settings.health_port:
        try:
            healthz = httpport.serve(settings.health_port,
                                     lambda: probe.check(servers.registration_socket, settings.driver_name),
                                     pages={"/metrics": METRICS.page}, degraded_fn=publisher.degraded,
                                     note_fn=lambda: closed.message if (closed := publish_gate.closed) else None)
            log.info("serving /healthz and /metrics", port=settings.health_port)
        except OSError as exc:
            # The kubelet's sockets matter more than the probes: keep serving it, say why loudly.
            log.error("cannot serve /healthz and /metrics", port=settings.health_port, error=str(exc))
    publisher.start(stop)
    status_writer.start(stop)
    handler.report_recovered()
    threading.Thread(target=_cleanup_loop, args=(state, api, settings, stop, log, events),
                     name="stale-claim-cleanup", daemon=True).start()
    if state.runs_mps:
        threading.Thread(target=_mps_loop, args=(state, devices, board, stop), name="mps-daemons", daemon=True).start()

    stop.wait()
    servers.stop(DRAIN_SECONDS)
    if instance is not None:
        instance.unlink(missing_ok=True)
    if healthz is not None:
        healthz.shutdown()
    ownership.release()
    state.close()
    recorder.flush(timeout=2.0)
    log.info("stopped")
    return 0
