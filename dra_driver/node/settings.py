"""Settings of the node plugin (``dra-driver kubelet-plugin``): every one a flag with an environment
variable.

Several node plugins must be able to run side by side on one machine (one per simulated node),
so every path is configurable."""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver import apiprofile
from dra_driver.flags import (
    SettingsError,
    add_env_argument,
    add_shared_arguments,
    api_profile,
    boolean,
    non_negative_number,
    port,
    positive_integer,
    positive_number,
    resolve_environment,
)
from dra_driver.gpuconfig import Strategy
from dra_driver.k8s.names import is_driver_name
from dra_driver.node.describe.shares import DISABLED, ConsumableShares, parse_consumable_shares
from dra_driver.node.discovery.select import BACKENDS, BackendChoice
from dra_driver.ondisk import CDI_ROOT, KUBELET_PLUGINS_DIR, KUBELET_REGISTRY_DIR, SocketPaths, socket_paths

SHARING_STRATEGIES = tuple(s.value for s in Strategy)


@dataclass(frozen=True)
class PluginSettings:
    node_name: str
    driver_name: str
    backend: str
    simulated_profile: str
    registry_dir: Path
    plugins_dir: Path
    cdi_root: Path
    state_dir: Path
    dev_root: Path
    sysfs_root: Path
    kubeconfig: str | None
    log_format: str
    log_level: str
    dynamic_mig: bool
    socket_group: str | None
    cleanup_interval: float
    health_file: Path | None
    ignored_xids: tuple[int, ...]
    health_port: int
    health_monitoring: bool = True
    sharing_strategies: tuple[str, ...] = SHARING_STRATEGIES
    nvidia_driver_root: Path = Path("/")
    consumable_shares: ConsumableShares = DISABLED
    device_metadata: bool = True
    """Give containers a metadata file describing their devices (KEP-5304)."""
    driver_edits: bool = True
    """NVML backend: add the driver's CDI edits from the NVIDIA Container Toolkit to every claim's spec."""
    nvidia_ctk_path: Path = Path("nvidia-ctk")
    nvidia_cdi_hook_path: Path | None = None
    """As the host's runtime finds it; default: next to nvidia-ctk."""
    host_driver_root: Path | None = None
    """The driver root as the host sees it; default: --nvidia-driver-root."""
    boot_id_path: Path = Path("/proc/sys/kernel/random/boot_id")
    """Where the boot ID is read; tests point it at a file to simulate a reboot."""
    stale_claim_grace: float = 300.0
    """Seconds a claim found gone keeps its devices before the sweep unprepares it (dra_driver.node.stale)."""
    max_stale_unprepares: int = 10
    """Claims one stale-claim sweep unprepares at most."""
    rolling_update: bool = False
    """Sockets of their own per pod, so that a new pod serves beside the old one (kubelet 1.33 or later)."""
    pod_uid: str | None = None
    """This instance's pod; required with ``rolling_update``."""
    ignore_device_plugin: bool = False
    """Publish even where the Node shows NVIDIA's device plugin serving the GPUs (a node being migrated)."""
    api_profile: apiprofile.ApiProfile = apiprofile.OWN
    """Whose names the node publishes (dra_driver.apiprofile)."""

    @property
    def plugin_data_dir(self) -> Path:
        return self.plugins_dir / self.driver_name

    @property
    def sockets(self) -> SocketPaths:
        return socket_paths(self.driver_name, self.registry_dir, self.plugin_data_dir,
                            self.pod_uid if self.rolling_update else None)

    @property
    def dra_socket(self) -> Path:
        return self.sockets.dra

    @property
    def registration_socket(self) -> Path:
        return self.sockets.registration

    @property
    def backend_choice(self) -> BackendChoice:
        return BackendChoice(self.backend, self.node_name, self.simulated_profile, self.state_dir,
                             self.nvidia_driver_root, self.sysfs_root, self.dev_root)


# Non-fatal XIDs that NVIDIA documents as application-level errors; a GPU reporting only these
# is still healthy.
DEFAULT_IGNORED_XIDS = (13, 31, 43, 45, 68, 109)
DEFAULT_CLEANUP_INTERVAL = 60.0
_POD_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def instance_pod_uid(rolling_update: bool, pod_uid: str | None) -> str | None:
    """The pod UID that names this instance's sockets: None without rolling updates; with them, a
    missing or malformed UID is an error (sockets named after it could collide with another pod's)."""
    if not rolling_update:
        return None
    if not pod_uid:
        raise SettingsError("--rolling-update needs this pod's UID: set --pod-uid or POD_UID (the chart sets it "
                         "from metadata.uid)")
    if not _POD_UID.fullmatch(pod_uid):
        raise SettingsError(f"--pod-uid {pod_uid!r} is not a pod UID (lower-case UUID)")
    return pod_uid


UNIX_PATH_MAX = 108
"""The kubelet (1.38) refuses an endpoint of this many bytes or more."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def socket_problem(path: Path) -> str | None:
    """Why the 1.38 kubelet would refuse ``path`` as a plugin endpoint (k/k #140837), or None: it
    must be absolute, shorter than 108 bytes, and plain, i.e. ``unix:`` + path reads back as the same
    path through URL parsing (gRPC dials it that way), so no ``%``, ``?``, ``#``, control characters or
    leading ``//`` (a host)."""
    text = str(path)
    size = len(text.encode("utf-8", "surrogateescape"))
    if not text.startswith("/"):
        return "must be an absolute path"
    if size >= UNIX_PATH_MAX:
        return f"must be shorter than {UNIX_PATH_MAX} bytes, is {size}"
    odd = sorted({c for c in text if c in "%?#"} | ({"a control character"} if _CONTROL.search(text) else set()))
    if odd:
        return f"must be a plain path: no {', '.join(odd)} (unix:PATH must read back unchanged as a URL)"
    if text.startswith("//"):
        return "must be a plain path: a leading // reads as a host in unix://HOST/PATH"
    return None


def registration_problems(driver_name: str, sockets: SocketPaths, rolling_update: bool) -> list[str]:
    """What the 1.38 kubelet would refuse at registration, each naming the flag to change: the driver
    name (the CSI driver-name rule) and both socket paths."""
    problems = []
    if not is_driver_name(driver_name):
        problems.append(f"--driver-name {driver_name!r} must be at most 63 characters and a DNS-1123 subdomain "
                        "(lower case after lower-casing: letters, digits, '-' and '.'); the kubelet refuses "
                        "to register any other name")
    pod = " and --pod-uid" if rolling_update else ""
    for what, flag, path in (("DRA socket", "--kubelet-plugins-dir", sockets.dra),
                             ("registration socket", "--kubelet-registry-dir", sockets.registration)):
        problem = socket_problem(path)
        if problem:
            problems.append(f"the {what} {str(path)!r} (from {flag}, --driver-name{pod}) {problem}; the kubelet "
                            "refuses to register such an endpoint")
    return problems


def registration_socket_from_env(environ: Mapping[str, str], driver: str) -> Path:
    """The registration socket of the plugin of ``driver`` running with ``environ`` (``dra-driver
    probe`` in the plugin's container): KUBELET_REGISTRY_DIR, ROLLING_UPDATE and POD_UID as the
    plugin reads them."""
    def get(name: str, default: str) -> str:
        return environ.get(name) or default

    try:
        rolling = boolean(environ.get("ROLLING_UPDATE") or "false")
    except argparse.ArgumentTypeError as exc:
        raise SettingsError(f"$ROLLING_UPDATE (for --rolling-update): {exc}") from None
    pod_uid = instance_pod_uid(rolling, environ.get("POD_UID"))
    return socket_paths(driver, Path(get("KUBELET_REGISTRY_DIR", KUBELET_REGISTRY_DIR)),
                        Path(get("KUBELET_PLUGINS_DIR", KUBELET_PLUGINS_DIR)) / driver, pod_uid).registration


def ignored_xids(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers (XIDs), got {text!r}") from None


def sharing_strategies(text: str) -> tuple[str, ...]:
    strategies = tuple(x.strip() for x in text.split(",") if x.strip())
    if not strategies or set(strategies) - set(SHARING_STRATEGIES):
        raise argparse.ArgumentTypeError(f"must name some of {', '.join(SHARING_STRATEGIES)}, got {text!r}")
    return strategies


def consumable_shares(text: str) -> ConsumableShares:
    try:
        return parse_consumable_shares(text)
    except ValueError as exc:  # its text names the flag; here the flag or the variable is named before it
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--consumable-shares ")) from None


def add_plugin_arguments(parser: argparse.ArgumentParser) -> None:
    def add(flag: str, variable: str, help: str, default: Any = None, **kw: Any) -> None:
        add_env_argument(parser, flag, variable=variable, default=default, help=help, **kw)

    add("--node-name", "NODE_NAME", "Node this plugin serves (required)")
    add_shared_arguments(parser)
    add("--gpu-backend", "GPU_BACKEND", "GPU discovery backend: nvml (real GPUs) or simulated (fake GPUs of "
        "--simulated-profile; only when named, never as a fallback)", "nvml", choices=tuple(BACKENDS))
    add("--simulated-profile", "SIMULATED_PROFILE", "Built-in simulated node profile name or a YAML file", "h100-8x")
    add("--kubelet-registry-dir", "KUBELET_REGISTRY_DIR", "Kubelet plugin-registration directory", KUBELET_REGISTRY_DIR)
    add("--kubelet-plugins-dir", "KUBELET_PLUGINS_DIR",
        "Kubelet plugins directory; the DRA socket is <dir>/<driver>/dra.sock", KUBELET_PLUGINS_DIR)
    add("--cdi-root", "CDI_ROOT", "CDI spec directory", CDI_ROOT)
    add("--state-dir", "STATE_DIR", "Checkpoint directory",
        shown="<plugins-dir>/<driver>; <plugins-dir>/gpu.nvidia.com/dra-driver with --api-profile nvidia")
    add("--dev-root", "DEV_ROOT", "Root under which /dev/nvidia* live; a fake root for simulated GPUs", "/")
    add("--sysfs-root", "SYSFS_ROOT", "sysfs mount, for PCI NUMA/root lookups", "/sys")
    add("--log-format", "LOG_FORMAT", "Log format", "json", choices=("json", "console"))
    add("--log-level", "LOG_LEVEL", "Log level", "info")
    add("--dynamic-mig", "DYNAMIC_MIG", "Publish every MIG profile x placement as a partitionable device", False,
        boolean_flag=True)
    add("--socket-group", "SOCKET_GROUP", "Group that may use the sockets (mode 0660); default: root only")
    add("--cleanup-interval", "CLEANUP_INTERVAL",
        "Seconds between sweeps that unprepare claims deleted from the API server", DEFAULT_CLEANUP_INTERVAL,
        convert=positive_number)
    add("--stale-claim-grace", "STALE_CLAIM_GRACE",
        "Seconds a claim the sweep found gone keeps its devices (CDI spec, checkpoint entry) for the kubelet's "
        "own Unprepare before the sweep unprepares it", 300.0, convert=non_negative_number)
    add("--max-stale-unprepares", "MAX_STALE_UNPREPARES",
        "Claims one sweep unprepares at most; more wait for the next sweeps, with a warning", 10,
        convert=positive_integer)
    add("--health-file", "HEALTH_FILE", "Simulated backend: JSON file of injected health events, re-read on change")
    add("--ignored-xids", "IGNORED_XIDS", "Comma-separated XIDs that do not make a GPU unhealthy",
        DEFAULT_IGNORED_XIDS, convert=ignored_xids)
    # Hidden: only the reboot test needs another boot ID source.
    add("--boot-id-path", "BOOT_ID_PATH", argparse.SUPPRESS, "/proc/sys/kernel/random/boot_id")
    add("--health-port", "HEALTH_PORT", "Port for /healthz (checks the plugin's own sockets); 0 disables", 0,
        convert=port)
    add("--health-monitoring", "HEALTH_MONITORING",
        "Watch GPU health (NVML events, or the simulated health file) and taint unhealthy devices", True,
        boolean_flag=True)
    add("--sharing-strategies", "SHARING_STRATEGIES", "GpuConfig sharing strategies this node accepts; others fail "
        "at prepare", SHARING_STRATEGIES, convert=sharing_strategies)
    add("--consumable-shares", "CONSUMABLE_SHARES",
        "Publish full GPUs and static MIG devices for several claims at once: disabled, memory (claims "
        "consume memory in 1Gi steps, all of it by default), unlimited (0 by default) or N (also N "
        "'shares')", DISABLED, convert=consumable_shares, shown="disabled")
    add("--device-metadata", "DEVICE_METADATA",
        "Mount a file describing its devices (metadata.resource.k8s.io, Kubernetes 1.37 format) into every "
        "container that gets them; --no-device-metadata turns it off for new claims", True, boolean_flag=True)
    add("--nvidia-driver-root", "NVIDIA_DRIVER_ROOT",
        "Where the host's NVIDIA driver is mounted; libnvidia-ml, nvidia-smi (time-slicing) and "
        "nvidia-cuda-mps-control (MPS) are looked up under it", "/")
    add("--host-driver-root", "HOST_DRIVER_ROOT",
        "The driver root as the host sees it, when --nvidia-driver-root is its mount in this container "
        "(/driver-root); CDI specs name host paths", shown="--nvidia-driver-root")
    add("--driver-edits", "DRIVER_EDITS", "NVML backend: put the driver's libraries, binaries and hooks (from "
        "nvidia-ctk cdi generate) in every claim's CDI spec", True, boolean_flag=True)
    add("--nvidia-ctk-path", "NVIDIA_CTK_PATH", "The NVIDIA Container Toolkit's nvidia-ctk", "nvidia-ctk")
    add("--rolling-update", "ROLLING_UPDATE",
        "Sockets named after this pod (--pod-uid), so that an updated pod serves beside the old one before it "
        "stops (needs kubelet 1.33 or later)", False, boolean_flag=True)
    add("--ignore-device-plugin", "IGNORE_DEVICE_PLUGIN",
        "Publish this node's GPUs even while its Node advertises nvidia.com/gpu, nvidia.com/gpu.* or nvidia.com/mig-* (NVIDIA's "
        "device plugin serves them too); only while moving a node from the device plugin to DRA, with nothing "
        "scheduled through the device plugin", False, boolean_flag=True)
    add("--pod-uid", "POD_UID", "This plugin pod's UID; required with --rolling-update")
    add("--nvidia-cdi-hook-path", "NVIDIA_CDI_HOOK_PATH",
        "nvidia-cdi-hook as the host's container runtime finds it", shown="beside nvidia-ctk")


def plugin_settings(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> PluginSettings:
    """The settings of ``args`` (flags, then the variables of ``environ``, default the process's);
    SettingsError says what cannot be used."""
    resolve_environment(args, environ)
    if not args.node_name:
        raise SettingsError("--node-name (or $NODE_NAME) is required")
    plugins_dir = Path(args.kubelet_plugins_dir)
    profile = api_profile(args)
    own_dir = plugins_dir / args.driver_name
    instance_pod_uid(bool(args.rolling_update), args.pod_uid)  # refuses to start without a usable one
    settings = PluginSettings(
        node_name=args.node_name,
        driver_name=args.driver_name,
        backend=args.gpu_backend,
        simulated_profile=args.simulated_profile,
        registry_dir=Path(args.kubelet_registry_dir),
        plugins_dir=plugins_dir,
        cdi_root=Path(args.cdi_root),
        state_dir=Path(args.state_dir) if args.state_dir else own_dir / profile.state_subdir,
        dev_root=Path(args.dev_root),
        sysfs_root=Path(args.sysfs_root),
        kubeconfig=args.kubeconfig,
        log_format=args.log_format,
        log_level=args.log_level,
        dynamic_mig=bool(args.dynamic_mig),
        socket_group=args.socket_group,
        cleanup_interval=float(args.cleanup_interval),
        stale_claim_grace=float(args.stale_claim_grace),
        max_stale_unprepares=int(args.max_stale_unprepares),
        health_file=Path(args.health_file) if args.health_file else None,
        ignored_xids=tuple(args.ignored_xids),
        health_port=int(args.health_port),
        health_monitoring=bool(args.health_monitoring),
        sharing_strategies=tuple(args.sharing_strategies),
        nvidia_driver_root=Path(args.nvidia_driver_root),
        consumable_shares=args.consumable_shares,
        device_metadata=bool(args.device_metadata),
        driver_edits=bool(args.driver_edits),
        nvidia_ctk_path=Path(args.nvidia_ctk_path),
        nvidia_cdi_hook_path=Path(args.nvidia_cdi_hook_path) if args.nvidia_cdi_hook_path else None,
        host_driver_root=Path(args.host_driver_root) if args.host_driver_root else None,
        boot_id_path=Path(args.boot_id_path),
        rolling_update=bool(args.rolling_update),
        pod_uid=args.pod_uid or None,
        ignore_device_plugin=bool(args.ignore_device_plugin),
        api_profile=profile,
    )
    problems = registration_problems(settings.driver_name, settings.sockets, settings.rolling_update)
    if problems:
        raise SettingsError("; ".join(problems))
    return settings
