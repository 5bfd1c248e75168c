"""Settings of ``dra-driver controller``: every one a flag with an environment variable."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.allocator.rules import AUTO, RULE_CHOICES
from dra_driver.controller import fence
from dra_driver.flags import (
    SettingsError,
    add_env_argument,
    add_scheduler_rules_argument,
    add_shared_arguments,
    port,
    positive_number,
    resolve_environment,
)
from dra_driver.k8s.labels import LabelSelector, parse_selector
from dra_driver.k8s.names import parse_namespaced_name

DEFAULT_MAX_WRITES_PER_SECOND = 250.0
"""The controller's default write budget. A backlog of 10,000 pending claims must be explained
within a minute, one merge patch each: 167 writes a second at the least; at 250 the patches take
40 s, and the Events get what is left: the claims' are best effort (see dra_driver.k8s.ratelimit),
the waiting pods' go out once the explanations are written (dra_driver.controller.pod_notices).
client-go's own default (5/s, burst 10) would take over half an hour. For scale: the kube-scheduler
writes more than this budget at 5,000 nodes (a binding and a claim status per pod;
docs/scale.md#the-codes-figures), and API Priority and Fairness still throttles us before the API
server suffers (429s are honoured). In steady state the controller writes only when a verdict
changes."""


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
    max_writes_per_second: float = DEFAULT_MAX_WRITES_PER_SECOND
    """Writes to the API server at most this often, on average; a second's worth may go at once."""
    scheduler_rules: str = AUTO
    """Whose allocation rules the engine follows: ``auto`` (the API server's version) or ``1.37``..."""
    pod_events: bool = True
    """A Warning Event on each pod waiting for a claim that cannot be allocated (dra_driver.controller.pod_notices)."""
    allocation_namespaces: LabelSelector | None = None
    """The namespaces (by their labels) whose claims the controller allocates when annotated
    ``gpu.dra-driver.io/allocate: controller``; None: it allocates none (the default)."""


def add_controller_arguments(parser: argparse.ArgumentParser) -> None:
    def add(flag: str, variable: str, help: str, default: Any = None, **kw: Any) -> None:
        add_env_argument(parser, flag, variable=variable, default=default, help=help, **kw)

    add_shared_arguments(parser)
    add("--log-format", "LOG_FORMAT", "Log format", "json", choices=("json", "console"))
    add("--log-level", "LOG_LEVEL", "Log level", "info")
    add("--leader-elect", "LEADER_ELECT", "Take a Lease before acting, so only one replica writes", True,
        boolean_flag=True)
    add("--leader-election-namespace", "POD_NAMESPACE", "Namespace of the leader-election Lease", "kube-system")
    add("--leader-election-id", "LEADER_ELECTION_ID", "Name of the leader-election Lease", "dra-driver-controller")
    add("--identity", "POD_NAME", "This replica's identity in the Lease", shown="<hostname>-<pid>")
    add("--metrics-port", "METRICS_PORT", "Port for /metrics and /healthz; 0 disables", 8080, convert=port)
    add("--resync-seconds", "RESYNC_SECONDS", "Seconds between full re-evaluations of pending claims", 30.0,
        convert=positive_number)
    add("--max-writes-per-second", "MAX_WRITES_PER_SECOND",
        "Writes to the API server (explanations, Events, allocations) at most this many a second, on average; "
        "Events about claims are dropped rather than delayed when the budget is spent; a pod's Event waits "
        "for it", DEFAULT_MAX_WRITES_PER_SECOND, convert=_write_rate)
    add("--allocation-ledger", "ALLOCATION_LEDGER",
        "NAMESPACE/NAME of the ConfigMap the allocation-fence admission policy reads",
        shown="dra-driver-allocations in the leader-election namespace")
    add("--pod-events", "POD_EVENTS", "Tell each pod that waits for a claim that cannot be allocated why, in a "
        "Warning Event on the pod (one write per pod and verdict, from the same write budget)", True,
        boolean_flag=True)
    add("--allocation-namespace-selector", "ALLOCATION_NAMESPACE_SELECTOR",
        "Allocate claims annotated gpu.dra-driver.io/allocate: controller only in namespaces whose labels match "
        "this label selector (e.g. gpu.dra-driver.io/controller-allocation=enabled); empty (the default): the "
        "controller allocates no claim, and says so on each annotated one", convert=_label_selector)
    add_scheduler_rules_argument(parser, RULE_CHOICES)


def controller_settings(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ControllerSettings:
    """The settings of ``args`` (flags, then the variables of ``environ``, default the process's);
    SettingsError says what cannot be used."""
    resolve_environment(args, environ)
    return ControllerSettings(
        driver_name=args.driver_name,
        kubeconfig=args.kubeconfig,
        log_format=args.log_format,
        log_level=args.log_level,
        leader_elect=bool(args.leader_elect),
        leader_election_namespace=args.leader_election_namespace,
        leader_election_id=args.leader_election_id,
        identity=args.identity or f"{os.uname().nodename}-{os.getpid()}",
        metrics_port=int(args.metrics_port),
        resync_seconds=float(args.resync_seconds),
        allocation_ledger=_ledger_ref(args.allocation_ledger, args.leader_election_namespace),
        max_writes_per_second=float(args.max_writes_per_second),
        scheduler_rules=str(args.scheduler_rules),
        pod_events=bool(args.pod_events),
        allocation_namespaces=args.allocation_namespace_selector,
    )


def _write_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of writes a second, got {text!r}")
    return value


def _label_selector(text: str) -> LabelSelector | None:
    if not text.strip():
        return None
    try:
        return parse_selector(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ledger_ref(text: str | None, namespace: str) -> tuple[str, str]:
    if not text:
        return namespace, fence.DEFAULT_LEDGER
    try:
        return parse_namespaced_name(text, "ConfigMap")
    except ValueError as exc:
        raise SettingsError(f"--allocation-ledger (or $ALLOCATION_LEDGER): {exc}") from None
