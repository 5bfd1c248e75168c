"""The ``dra-driver`` command: ``kubelet-plugin``, ``controller``, ``explain``, ``debug-bundle`` and ``probe``;
and ``kubectl-dra``, the kubectl plugin (``kubectl dra explain``, ``kubectl dra debug-bundle``).

Errors a user can act on end in one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from dra_driver import __version__
from dra_driver.allocator.rules import RULE_CHOICES
from dra_driver.config import add_scheduler_rules_argument, add_shared_arguments
from dra_driver.controller import settings as controller_settings
from dra_driver.node import settings as plugin_settings


def build_parser(prog: str = "dra-driver", *, kubectl_plugin: bool = False) -> argparse.ArgumentParser:
    """The command's flags; ``kubectl_plugin``: only the commands a person runs from a laptop."""
    parser = argparse.ArgumentParser(prog=prog, description="Kubernetes DRA driver for NVIDIA GPUs")
    parser.add_argument("--version", action="version", version=f"dra-driver {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    if not kubectl_plugin:
        plugin_settings.add_plugin_arguments(sub.add_parser("kubelet-plugin", help="run the node plugin next to the kubelet"))
        controller_settings.add_controller_arguments(sub.add_parser("controller", help="explain and allocate ResourceClaims"))
    explain = sub.add_parser("explain", help="say why a pod waits, or why a ResourceClaim can or cannot be allocated")
    explain.add_argument("target", nargs="?", default=None,
                         help="pod/NAME, claim/NAME or NAMESPACE/CLAIM; none: list the pending claims by reason")
    explain.add_argument("--namespace", "-n", default=None,
                         help="the namespace of a pod/ or claim/ name, or the one to list; default: the context's")
    explain.add_argument("--all-namespaces", "-A", action="store_true", help="list the pending claims of every namespace")
    explain.add_argument("--context", default=None, help="the kubeconfig context to use; default: its current one")
    add_shared_arguments(explain)
    explain.add_argument("--output", "-o", choices=["text", "json", "yaml", "wide"], default="text",
                         help="wide: a list also names the pods waiting for each claim")
    add_scheduler_rules_argument(explain, RULE_CHOICES)
    bundle = sub.add_parser("debug-bundle", help="write a tar.gz with what a bug report needs (redacted)")
    add_shared_arguments(bundle)
    bundle.add_argument("--output", "-o", default=None,
                        help="file to write ('-' for stdout); default dra-driver-debug-<time>.tar.gz")
    bundle.add_argument("--node", default=None,
                        help="add this node's checkpoint, CDI specs and plugin /metrics, read here (on the node or in "
                             "its plugin pod); default $NODE_NAME")
    bundle.add_argument("--state-dir", default=None, help="the plugin's checkpoint directory, when not the default")
    bundle.add_argument("--cdi-root", default=None, help="the plugin's CDI spec directory, when not the default")
    bundle.add_argument("--metrics-url", default=None, help="the plugin's /metrics; default http://127.0.0.1:$HEALTH_PORT")
    if kubectl_plugin:
        return parser
    probe = sub.add_parser("probe", help="check that a running node plugin answers on its sockets")
    probe.add_argument("--registration-socket", default=None,
                       help="the plugin's registration socket; default: the one the plugin names from the same "
                            "environment (DRIVER_NAME, KUBELET_REGISTRY_DIR, ROLLING_UPDATE, POD_UID)")
    add_shared_arguments(probe, kubeconfig=False)
    return parser


def kubectl_main(argv: list[str] | None = None) -> int:
    """``kubectl-dra``: kubectl runs it for ``kubectl dra ...`` (found on ``PATH``) with the words after ``dra``."""
    return main(argv, build_parser("kubectl dra", kubectl_plugin=True))


def main(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    args = (parser or build_parser()).parse_args(argv)
    try:
        if args.command == "kubelet-plugin":
            from dra_driver.node import plugin

            return plugin.run(plugin_settings.plugin_settings(args))
        if args.command == "controller":
            from dra_driver.controller import reconciler

            return reconciler.run(controller_settings.controller_settings(args))
        if args.command == "debug-bundle":
            from dra_driver.tools import bundle

            return bundle.main(kubeconfig=args.kubeconfig, output=args.output, node=args.node, state_dir=args.state_dir,
                               cdi_root=args.cdi_root, metrics_url=args.metrics_url, driver=args.driver_name)
        if args.command == "probe":
            from dra_driver.node.kubelet import probe

            socket = args.registration_socket or plugin_settings.registration_socket_from_env(os.environ, args.driver_name)
            return probe.main(str(socket), args.driver_name)
        from dra_driver.tools import explain

        return explain.main(args.target, kubeconfig=args.kubeconfig, output=args.output, namespace=args.namespace,
                            all_namespaces=args.all_namespaces, context=args.context, driver=args.driver_name,
                            scheduler_rules=args.scheduler_rules)
    except KeyboardInterrupt:
        return 130
    except ValueError as exc:
        print(f"dra-driver {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
