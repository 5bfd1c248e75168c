"""The ``dra-driver`` command: ``kubelet-plugin``, ``controller`` and ``explain``.

Errors a user can act on end in one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from dra_driver import DEFAULT_DRIVER_NAME, __version__
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
    explain.add_argument("--kubeconfig", default=None, help="kubeconfig; $KUBECONFIG or in-cluster when unset")
    explain.add_argument("--output", "-o", choices=["text", "json"], default="text")
    probe = sub.add_parser("probe", help="check that a running node plugin answers on its sockets")
    probe.add_argument("--registration-socket", required=True, help="path of <driver>-reg.sock")
    probe.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME)
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
        if args.command == "probe":
            from dra_driver.node import probe

            return probe.main(args.registration_socket, args.driver_name)
        from dra_driver.controller import explain

        return explain.main(args.claim, kubeconfig=args.kubeconfig, output=args.output)
    except KeyboardInterrupt:
        return 130
    except ValueError as exc:
        print(f"dra-driver {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
