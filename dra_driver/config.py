"""Settings come from flags whose defaults come from environment variables; the helpers here read
those variables the same way for every command, and declare the flags every command shares."""

from __future__ import annotations

import argparse
import os

from dra_driver import DEFAULT_DRIVER_NAME


def env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def env_flag(text: str | None) -> bool:
    return (text or "").strip().lower() in ("1", "true", "yes", "on")


def add_shared_arguments(parser: argparse.ArgumentParser, *, kubeconfig: bool = True, driver_name: bool = True) -> None:
    """``--kubeconfig`` and ``--driver-name``, the flags of the programs and the operator tools alike."""
    if driver_name:
        parser.add_argument("--driver-name", default=env("DRIVER_NAME", DEFAULT_DRIVER_NAME),
                            help="DRA driver name [DRIVER_NAME]")
    if kubeconfig:
        parser.add_argument("--kubeconfig", default=env("KUBECONFIG"),
                            help="kubeconfig; in-cluster config, then ~/.kube/config, when unset [KUBECONFIG]")


def add_scheduler_rules_argument(parser: argparse.ArgumentParser, choices: tuple[str, ...]) -> None:
    """``--scheduler-rules``: which kube-scheduler version's allocation rules the engine follows
    (``choices``: ``auto`` and the minors the engine knows, dra_driver.allocator.rules)."""
    parser.add_argument("--scheduler-rules", default=env("SCHEDULER_RULES", "auto"), choices=list(choices),
                        help="Decide as the kube-scheduler of this Kubernetes version does; auto: the API server's "
                             "version, re-read now and then [SCHEDULER_RULES]")
