"""Settings of the node plugin and the controller: every one a flag with an environment variable.

Several node plugins must be able to run side by side on one machine (one per simulated node),
so every path is configurable.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from dra_driver import DEFAULT_DRIVER_NAME, fence
from dra_driver.names import parse_namespaced_name

SHARING_STRATEGIES = ("Exclusive", "TimeSlicing", "MPS")


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
    boot_id_path: Path = Path("/proc/sys/kernel/random/boot_id")
    """Where the boot ID is read; tests point it at a file to simulate a reboot."""

    @property
    def plugin_data_dir(self) -> Path:
        return self.plugins_dir / self.driver_name

    @property
    def dra_socket(self) -> Path:
        return self.plugin_data_dir / "dra.sock"

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / f"{self.driver_name}-reg.sock"


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def _bool(text: str | None) -> bool:
    return (text or "").strip().lower() in ("1", "true", "yes", "on")


# Non-fatal XIDs that NVIDIA documents as application-level errors; a GPU reporting only these
# is still healthy.
DEFAULT_IGNORED_XIDS = (13, 31, 43, 45, 68, 109)


def add_plugin_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--node-name", default=_env("NODE_NAME"), help="Node this plugin serves [NODE_NAME] (required)")
    add("--driver-name", default=_env("DRIVER_NAME", DEFAULT_DRIVER_NAME), help="DRA driver name [DRIVER_NAME]")
    add("--gpu-backend", default=_env("GPU_BACKEND", "auto"), choices=["auto", "nvml", "simulated"],
        help="GPU discovery backend [GPU_BACKEND]")
    add("--simulated-profile", default=_env("SIMULATED_PROFILE", "h100-8x"),
        help="Built-in simulated node profile name or a YAML file [SIMULATED_PROFILE]")
    add("--kubelet-registry-dir", default=_env("KUBELET_REGISTRY_DIR", "/var/lib/kubelet/plugins_registry"),
        help="Kubelet plugin-registration directory [KUBELET_REGISTRY_DIR]")
    add("--kubelet-plugins-dir", default=_env("KUBELET_PLUGINS_DIR", "/var/lib/kubelet/plugins"),
        help="Kubelet plugins directory; the DRA socket is <dir>/<driver>/dra.sock [KUBELET_PLUGINS_DIR]")
    add("--cdi-root", default=_env("CDI_ROOT", "/var/run/cdi"), help="CDI spec directory [CDI_ROOT]")
    add("--state-dir", default=_env("STATE_DIR"), help="Checkpoint directory; default <plugins-dir>/<driver> [STATE_DIR]")
    add("--dev-root", default=_env("DEV_ROOT", "/"),
        help="Root under which /dev/nvidia* live; a fake root for simulated GPUs [DEV_ROOT]")
    add("--sysfs-root", default=_env("SYSFS_ROOT", "/sys"), help="sysfs mount, for PCI NUMA/root lookups [SYSFS_ROOT]")
    add("--kubeconfig", default=_env("KUBECONFIG"), help="kubeconfig; in-cluster config when unset [KUBECONFIG]")
    add("--log-format", default=_env("LOG_FORMAT", "json"), choices=["json", "console"], help="[LOG_FORMAT]")
    add("--log-level", default=_env("LOG_LEVEL", "info"), help="[LOG_LEVEL]")
    add("--dynamic-mig", action="store_true", default=_bool(_env("DYNAMIC_MIG")),
        help="Publish every MIG profile x placement as a partitionable device [DYNAMIC_MIG]")
    add("--socket-group", default=_env("SOCKET_GROUP"), help="Group that may use the sockets (mode 0660) [SOCKET_GROUP]")
    add("--cleanup-interval", type=float, default=float(_env("CLEANUP_INTERVAL", "60") or 60),
        help="Seconds between sweeps that unprepare claims deleted from the API server [CLEANUP_INTERVAL]")
    add("--health-file", default=_env("HEALTH_FILE"),
        help="Simulated backend: JSON file of injected health events, re-read on change [HEALTH_FILE]")
    add("--ignored-xids", default=_env("IGNORED_XIDS", ",".join(map(str, DEFAULT_IGNORED_XIDS))),
        help="Comma-separated XIDs that do not make a GPU unhealthy [IGNORED_XIDS]")
    # Hidden: only the reboot test needs another boot ID source.
    add("--boot-id-path", default=_env("BOOT_ID_PATH", "/proc/sys/kernel/random/boot_id"), help=argparse.SUPPRESS)
    add("--health-port", type=int, default=int(_env("HEALTH_PORT", "0") or 0),
        help="Port for /healthz (checks the plugin's own sockets); 0 disables [HEALTH_PORT]")
    add("--health-monitoring", action=argparse.BooleanOptionalAction, default=_bool(_env("HEALTH_MONITORING", "true")),
        help="Watch GPU health (NVML events, or the simulated health file) and taint unhealthy devices [HEALTH_MONITORING]")
    add("--sharing-strategies", default=_env("SHARING_STRATEGIES", ",".join(SHARING_STRATEGIES)),
        help="GpuConfig sharing strategies this node accepts; others fail at prepare [SHARING_STRATEGIES]")
    add("--nvidia-driver-root", default=_env("NVIDIA_DRIVER_ROOT", "/"),
        help="Where the host's NVIDIA driver is mounted; libnvidia-ml is looked up under it [NVIDIA_DRIVER_ROOT]")


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
    return PluginSettings(
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
        health_file=Path(args.health_file) if args.health_file else None,
        ignored_xids=xids,
        health_port=int(args.health_port),
        boot_id_path=Path(args.boot_id_path),
    )


@dataclass(frozen=True)
class ControllerSettings:
    driver_name: str
    kubeconfig: str | None
    log_format: str
    log_level: str
    leader_elect: bool
    leader_election_namespace: str
    leader_election_id: str
    identity: str
    metrics_port: int
    resync_seconds: float
    allocation_ledger: tuple[str, str]


def add_controller_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--driver-name", default=_env("DRIVER_NAME", DEFAULT_DRIVER_NAME), help="DRA driver name [DRIVER_NAME]")
    add("--kubeconfig", default=_env("KUBECONFIG"), help="kubeconfig; in-cluster config when unset [KUBECONFIG]")
    add("--log-format", default=_env("LOG_FORMAT", "json"), choices=["json", "console"], help="[LOG_FORMAT]")
    add("--log-level", default=_env("LOG_LEVEL", "info"), help="[LOG_LEVEL]")
    add("--leader-elect", action=argparse.BooleanOptionalAction, default=_bool(_env("LEADER_ELECT", "true")),
        help="Take a Lease before acting, so only one replica writes [LEADER_ELECT]")
    add("--leader-election-namespace", default=_env("POD_NAMESPACE", "kube-system"),
        help="Namespace of the leader-election Lease [POD_NAMESPACE]")
    add("--leader-election-id", default=_env("LEADER_ELECTION_ID", "dra-driver-controller"),
        help="Name of the leader-election Lease [LEADER_ELECTION_ID]")
    add("--identity", default=_env("POD_NAME", os.uname().nodename + f"-{os.getpid()}"),
        help="This replica's identity in the Lease [POD_NAME]")
    add("--metrics-port", type=int, default=int(_env("METRICS_PORT", "8080") or 8080),
        help="Port for /metrics and /healthz; 0 disables [METRICS_PORT]")
    add("--resync-seconds", type=float, default=float(_env("RESYNC_SECONDS", "30") or 30),
        help="Seconds between full re-evaluations of pending claims [RESYNC_SECONDS]")
    add("--allocation-ledger", default=_env("ALLOCATION_LEDGER"),
        help="NAMESPACE/NAME of the ConfigMap the allocation-fence admission policy reads; default: "
             "dra-driver-allocations in the leader-election namespace [ALLOCATION_LEDGER]")


def controller_settings(args: argparse.Namespace) -> ControllerSettings:
    return ControllerSettings(
        driver_name=args.driver_name,
        kubeconfig=args.kubeconfig,
        log_format=args.log_format,
        log_level=args.log_level,
        leader_elect=bool(args.leader_elect),
        leader_election_namespace=args.leader_election_namespace,
        leader_election_id=args.leader_election_id,
        identity=args.identity,
        metrics_port=int(args.metrics_port),
        resync_seconds=float(args.resync_seconds),
        allocation_ledger=_ledger_ref(args.allocation_ledger, args.leader_election_namespace),
    )


def _ledger_ref(text: str | None, namespace: str) -> tuple[str, str]:
    if not text:
        return namespace, fence.DEFAULT_LEDGER
    try:
        return parse_namespaced_name(text, "ConfigMap")
    except ValueError as exc:
        raise ValueError(f"--allocation-ledger: {exc}") from None
