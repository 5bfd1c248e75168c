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

from dra_driver.config import add_shared_arguments, env, env_flag
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
        raise ValueError("--rolling-update needs this pod's UID: set --pod-uid or POD_UID (the chart sets it "
                         "from metadata.uid)")
    if not _POD_UID.fullmatch(pod_uid):
        raise ValueError(f"--pod-uid {pod_uid!r} is not a pod UID (lower-case UUID)")
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

    pod_uid = instance_pod_uid(env_flag(environ.get("ROLLING_UPDATE")), environ.get("POD_UID"))
    return socket_paths(driver, Path(get("KUBELET_REGISTRY_DIR", KUBELET_REGISTRY_DIR)),
                        Path(get("KUBELET_PLUGINS_DIR", KUBELET_PLUGINS_DIR)) / driver, pod_uid).registration


def add_plugin_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--node-name", default=env("NODE_NAME"), help="Node this plugin serves [NODE_NAME] (required)")
    add_shared_arguments(parser)
    add("--gpu-backend", default=env("GPU_BACKEND", "nvml"), choices=list(BACKENDS),
        help="GPU discovery backend: nvml (real GPUs) or simulated (fake GPUs of --simulated-profile; only when "
             "named, never as a fallback) [GPU_BACKEND]")
    add("--simulated-profile", default=env("SIMULATED_PROFILE", "h100-8x"),
        help="Built-in simulated node profile name or a YAML file [SIMULATED_PROFILE]")
    add("--kubelet-registry-dir", default=env("KUBELET_REGISTRY_DIR", KUBELET_REGISTRY_DIR),
        help="Kubelet plugin-registration directory [KUBELET_REGISTRY_DIR]")
    add("--kubelet-plugins-dir", default=env("KUBELET_PLUGINS_DIR", KUBELET_PLUGINS_DIR),
        help="Kubelet plugins directory; the DRA socket is <dir>/<driver>/dra.sock [KUBELET_PLUGINS_DIR]")
    add("--cdi-root", default=env("CDI_ROOT", CDI_ROOT), help="CDI spec directory [CDI_ROOT]")
    add("--state-dir", default=env("STATE_DIR"), help="Checkpoint directory; default <plugins-dir>/<driver> [STATE_DIR]")
    add("--dev-root", default=env("DEV_ROOT", "/"),
        help="Root under which /dev/nvidia* live; a fake root for simulated GPUs [DEV_ROOT]")
    add("--sysfs-root", default=env("SYSFS_ROOT", "/sys"), help="sysfs mount, for PCI NUMA/root lookups [SYSFS_ROOT]")
    add("--log-format", default=env("LOG_FORMAT", "json"), choices=["json", "console"], help="[LOG_FORMAT]")
    add("--log-level", default=env("LOG_LEVEL", "info"), help="[LOG_LEVEL]")
    add("--dynamic-mig", action="store_true", default=env_flag(env("DYNAMIC_MIG")),
        help="Publish every MIG profile x placement as a partitionable device [DYNAMIC_MIG]")
    add("--socket-group", default=env("SOCKET_GROUP"), help="Group that may use the sockets (mode 0660) [SOCKET_GROUP]")
    add("--cleanup-interval", type=float,
        default=float(env("CLEANUP_INTERVAL", str(DEFAULT_CLEANUP_INTERVAL)) or DEFAULT_CLEANUP_INTERVAL),
        help="Seconds between sweeps that unprepare claims deleted from the API server [CLEANUP_INTERVAL]")
    add("--stale-claim-grace", type=float, default=float(env("STALE_CLAIM_GRACE", "300") or 300),
        help="Seconds a claim the sweep found gone keeps its devices (CDI spec, checkpoint entry) for the kubelet's "
             "own Unprepare before the sweep unprepares it [STALE_CLAIM_GRACE]")
    add("--max-stale-unprepares", type=int, default=int(env("MAX_STALE_UNPREPARES", "10") or 10),
        help="Claims one sweep unprepares at most; more wait for the next sweeps, with a warning [MAX_STALE_UNPREPARES]")
    add("--health-file", default=env("HEALTH_FILE"),
        help="Simulated backend: JSON file of injected health events, re-read on change [HEALTH_FILE]")
    add("--ignored-xids", default=env("IGNORED_XIDS", ",".join(map(str, DEFAULT_IGNORED_XIDS))),
        help="Comma-separated XIDs that do not make a GPU unhealthy [IGNORED_XIDS]")
    # Hidden: only the reboot test needs another boot ID source.
    add("--boot-id-path", default=env("BOOT_ID_PATH", "/proc/sys/kernel/random/boot_id"), help=argparse.SUPPRESS)
    add("--health-port", type=int, default=int(env("HEALTH_PORT", "0") or 0),
        help="Port for /healthz (checks the plugin's own sockets); 0 disables [HEALTH_PORT]")
    add("--health-monitoring", action=argparse.BooleanOptionalAction, default=env_flag(env("HEALTH_MONITORING", "true")),
        help="Watch GPU health (NVML events, or the simulated health file) and taint unhealthy devices [HEALTH_MONITORING]")
    add("--sharing-strategies", default=env("SHARING_STRATEGIES", ",".join(SHARING_STRATEGIES)),
        help="GpuConfig sharing strategies this node accepts; others fail at prepare [SHARING_STRATEGIES]")
    add("--consumable-shares", default=env("CONSUMABLE_SHARES", "disabled"),
        help="Publish full GPUs and static MIG devices for several claims at once: disabled, memory (claims "
             "consume memory in 1Gi steps, all of it by default), unlimited (0 by default) or N (also N "
             "'shares') [CONSUMABLE_SHARES]")
    add("--device-metadata", action=argparse.BooleanOptionalAction, default=env_flag(env("DEVICE_METADATA", "true")),
        help="Mount a file describing its devices (metadata.resource.k8s.io, Kubernetes 1.37 format) into every "
             "container that gets them; --no-device-metadata turns it off for new claims [DEVICE_METADATA]")
    add("--nvidia-driver-root", default=env("NVIDIA_DRIVER_ROOT", "/"),
        help="Where the host's NVIDIA driver is mounted; libnvidia-ml, nvidia-smi (time-slicing) and "
             "nvidia-cuda-mps-control (MPS) are looked up under it [NVIDIA_DRIVER_ROOT]")
    add("--host-driver-root", default=env("HOST_DRIVER_ROOT"),
        help="The driver root as the host sees it, when --nvidia-driver-root is its mount in this container "
             "(/driver-root); CDI specs name host paths. Default: --nvidia-driver-root [HOST_DRIVER_ROOT]")
    add("--driver-edits", action=argparse.BooleanOptionalAction, default=env_flag(env("DRIVER_EDITS", "true")),
        help="NVML backend: put the driver's libraries, binaries and hooks (from nvidia-ctk cdi generate) in every "
             "claim's CDI spec [DRIVER_EDITS]")
    add("--nvidia-ctk-path", default=env("NVIDIA_CTK_PATH", "nvidia-ctk"),
        help="The NVIDIA Container Toolkit's nvidia-ctk [NVIDIA_CTK_PATH]")
    add("--rolling-update", action=argparse.BooleanOptionalAction, default=env_flag(env("ROLLING_UPDATE")),
        help="Sockets named after this pod (--pod-uid), so that an updated pod serves beside the old one before it "
             "stops (needs kubelet 1.33 or later) [ROLLING_UPDATE]")
    add("--ignore-device-plugin", action=argparse.BooleanOptionalAction,
        default=env_flag(env("IGNORE_DEVICE_PLUGIN")),
        help="Publish this node's GPUs even while its Node advertises nvidia.com/gpu or nvidia.com/mig-* (NVIDIA's "
             "device plugin serves them too); only while moving a node from the device plugin to DRA, with nothing "
             "scheduled through the device plugin [IGNORE_DEVICE_PLUGIN]")
    add("--pod-uid", default=env("POD_UID"), help="This plugin pod's UID; required with --rolling-update [POD_UID]")
    add("--nvidia-cdi-hook-path", default=env("NVIDIA_CDI_HOOK_PATH"),
        help="nvidia-cdi-hook as the host's container runtime finds it; default: beside nvidia-ctk "
             "[NVIDIA_CDI_HOOK_PATH]")


def plugin_settings(args: argparse.Namespace) -> PluginSettings:
    if not args.node_name:
        raise ValueError("--node-name (or NODE_NAME) is required")
    plugins_dir = Path(args.kubelet_plugins_dir)
    try:
        xids = tuple(int(x) for x in str(args.ignored_xids).split(",") if x.strip())
    except ValueError as exc:
        raise ValueError(f"--ignored-xids must be comma-separated integers: {exc}") from None
    strategies = tuple(x.strip() for x in str(args.sharing_strategies).split(",") if x.strip())
    unknown = sorted(set(strategies) - set(SHARING_STRATEGIES))
    if unknown or not strategies:
        raise ValueError(
            f"--sharing-strategies must name some of {', '.join(SHARING_STRATEGIES)}; got {args.sharing_strategies!r}")
    if args.stale_claim_grace < 0 or args.max_stale_unprepares < 1:
        raise ValueError(f"--stale-claim-grace must be 0 or more (got {args.stale_claim_grace:g}) and "
                         f"--max-stale-unprepares 1 or more (got {args.max_stale_unprepares})")
    instance_pod_uid(bool(args.rolling_update), args.pod_uid)  # refuses to start without a usable one
    settings = PluginSettings(
        node_name=args.node_name,
        driver_name=args.driver_name,
        backend=args.gpu_backend,
        simulated_profile=args.simulated_profile,
        registry_dir=Path(args.kubelet_registry_dir),
        plugins_dir=plugins_dir,
        cdi_root=Path(args.cdi_root),
        state_dir=Path(args.state_dir) if args.state_dir else plugins_dir / args.driver_name,
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
        ignored_xids=xids,
        health_port=int(args.health_port),
        health_monitoring=bool(args.health_monitoring),
        sharing_strategies=strategies,
        nvidia_driver_root=Path(args.nvidia_driver_root),
        consumable_shares=parse_consumable_shares(str(args.consumable_shares)),
        device_metadata=bool(args.device_metadata),
        driver_edits=bool(args.driver_edits),
        nvidia_ctk_path=Path(args.nvidia_ctk_path),
        nvidia_cdi_hook_path=Path(args.nvidia_cdi_hook_path) if args.nvidia_cdi_hook_path else None,
        host_driver_root=Path(args.host_driver_root) if args.host_driver_root else None,
        boot_id_path=Path(args.boot_id_path),
        rolling_update=bool(args.rolling_update),
        pod_uid=args.pod_uid or None,
        ignore_device_plugin=bool(args.ignore_device_plugin),
    )
    problems = registration_problems(settings.driver_name, settings.sockets, settings.rolling_update)
    if problems:
        raise ValueError("; ".join(problems))
    return settings
