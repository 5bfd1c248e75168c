"""The ``dra-driver`` command: ``kubelet-plugin``, ``controller``, ``explain``, ``debug-bundle`` and ``probe``.

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dra-driver", description="Kubernetes DRA driver for NVIDIA GPUs")
    parser.add_argument("--version", action="version", version=f"dra-driver {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    plugin_settings.add_plugin_arguments(sub.add_parser("kubelet-plugin", help="run the node plugin next to the kubelet"))
    controller_settings.add_controller_arguments(sub.add_parser("controller", help="explain and allocate ResourceClaims"))
    explain = sub.add_parser("explain", help="say why a ResourceClaim can or cannot be allocated")
    explain.add_argument("claim", help="NAMESPACE/NAME of the ResourceClaim")
    add_shared_arguments(explain, driver_name=False)
    explain.add_argument("--output", "-o", choices=["text", "json"], default="text")
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
    probe = sub.add_parser("probe", help="check that a running node plugin answers on its sockets")
    probe.add_argument("--registration-socket", default=None,
                       help="the plugin's registration socket; default: the one the plugin names from the same "
                            "environment (DRIVER_NAME, KUBELET_REGISTRY_DIR, ROLLING_UPDATE, POD_UID)")
    add_shared_arguments(probe, kubeconfig=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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

        return explain.main(args.claim, kubeconfig=args.kubeconfig, output=args.output,
                            scheduler_rules=args.scheduler_rules)
    except KeyboardInterrupt:
        return 130
    except ValueError as exc:
        print(f"dra-driver {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
