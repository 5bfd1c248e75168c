"""Settings of ``dra-driver controller``: every one a flag with an environment variable."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from dra_driver.allocator.rules import AUTO, RULE_CHOICES
from dra_driver.config import add_scheduler_rules_argument, add_shared_arguments, env, env_flag
from dra_driver.controller import fence
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
    add = parser.add_argument
    add_shared_arguments(parser)
    add("--log-format", default=env("LOG_FORMAT", "json"), choices=["json", "console"], help="[LOG_FORMAT]")
    add("--log-level", default=env("LOG_LEVEL", "info"), help="[LOG_LEVEL]")
    add("--leader-elect", action=argparse.BooleanOptionalAction, default=env_flag(env("LEADER_ELECT", "true")),
        help="Take a Lease before acting, so only one replica writes [LEADER_ELECT]")
    add("--leader-election-namespace", default=env("POD_NAMESPACE", "kube-system"),
        help="Namespace of the leader-election Lease [POD_NAMESPACE]")
    add("--leader-election-id", default=env("LEADER_ELECTION_ID", "dra-driver-controller"),
        help="Name of the leader-election Lease [LEADER_ELECTION_ID]")
    add("--identity", default=env("POD_NAME", os.uname().nodename + f"-{os.getpid()}"),
        help="This replica's identity in the Lease [POD_NAME]")
    add("--metrics-port", type=int, default=int(env("METRICS_PORT", "8080") or 8080),
        help="Port for /metrics and /healthz; 0 disables [METRICS_PORT]")
    add("--resync-seconds", type=float, default=float(env("RESYNC_SECONDS", "30") or 30),
        help="Seconds between full re-evaluations of pending claims [RESYNC_SECONDS]")
    add("--max-writes-per-second", type=_write_rate, default=env("MAX_WRITES_PER_SECOND", f"{DEFAULT_MAX_WRITES_PER_SECOND:g}"),
        help="Writes to the API server (explanations, Events, allocations) at most this many a second, on average; "
             "Events about claims are dropped rather than delayed when the budget is spent; a pod's Event waits "
             "for it [MAX_WRITES_PER_SECOND]")
    add("--allocation-ledger", default=env("ALLOCATION_LEDGER"),
        help="NAMESPACE/NAME of the ConfigMap the allocation-fence admission policy reads; default: "
             "dra-driver-allocations in the leader-election namespace [ALLOCATION_LEDGER]")
    add("--pod-events", action=argparse.BooleanOptionalAction, default=env_flag(env("POD_EVENTS", "true")),
        help="Tell each pod that waits for a claim that cannot be allocated why, in a Warning Event on the pod "
             "(one write per pod and verdict, from the same write budget) [POD_EVENTS]")
    add("--allocation-namespace-selector", default=env("ALLOCATION_NAMESPACE_SELECTOR", ""),
        help="Allocate claims annotated gpu.dra-driver.io/allocate: controller only in namespaces whose labels match "
             "this label selector (e.g. gpu.dra-driver.io/controller-allocation=enabled); empty (the default): the "
             "controller allocates no claim, and says so on each annotated one [ALLOCATION_NAMESPACE_SELECTOR]")
    add_scheduler_rules_argument(parser, RULE_CHOICES)


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
        max_writes_per_second=float(args.max_writes_per_second),
        scheduler_rules=str(args.scheduler_rules),
        pod_events=bool(args.pod_events),
        allocation_namespaces=_namespace_selector(args.allocation_namespace_selector),
    )


def _write_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of writes a second, got {text!r}")
    return value


def _namespace_selector(text: str | None) -> LabelSelector | None:
    if not text or not text.strip():
        return None
    try:
        return parse_selector(text)
    except ValueError as exc:
        raise ValueError(f"--allocation-namespace-selector: {exc}") from None


def _ledger_ref(text: str | None, namespace: str) -> tuple[str, str]:
    if not text:
        return namespace, fence.DEFAULT_LEDGER
    try:
        return parse_namespaced_name(text, "ConfigMap")
    except ValueError as exc:
        raise ValueError(f"--allocation-ledger: {exc}") from None
