"""The ``dra-driver`` command: ``kubelet-plugin``, ``controller``, ``explain``, ``get``, ``top``, ``fit``,
``migrate``, ``debug-bundle`` and ``probe``; and ``kubectl-dra``, the kubectl plugin (``kubectl dra explain``,
``kubectl dra get gpus``, ``kubectl dra debug-bundle``, ``kubectl dra migrate``, ...).

Exit status: 0 done (``explain``: whatever the verdict); 1 an error, printed as one line on stderr
that starts with the command as it was called (``kubectl dra explain: ...``) and names what is
wrong: a malformed environment variable, settings that contradict each other, a kubeconfig or
cluster problem, an unexpected failure; 2 a usage error, printed by argparse (the usage line, then
the error) for an unknown flag, a missing or malformed flag value; 130 interrupted. Never a
traceback. The parser reads no environment: each command reads its variables when it runs
(:func:`dra_driver.flags.resolve_environment`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dra_driver import __version__
from dra_driver.allocator.rules import RULE_CHOICES
from dra_driver.controller import settings as controller_settings
from dra_driver.flags import (
    SettingsError,
    add_env_argument,
    add_scheduler_rules_argument,
    add_shared_arguments,
    boolean,
    resolve_environment,
)
from dra_driver.k8s.credentials import KubeconfigError
from dra_driver.node import settings as plugin_settings
from dra_driver.tools.explain.targets import OUTPUTS
from dra_driver.tools.fleet import args as fleet_args
from dra_driver.tools.migrate.config import CONFIG_LABEL as MIGRATE_CONFIG_LABEL
from dra_driver.tools.migrate.config import OUTPUTS as MIGRATE_OUTPUTS
from dra_driver.tools.terminal import printable

if TYPE_CHECKING:
    from dra_driver.k8s.client import KubeApi
    from dra_driver.tools.migrate.workloads import FitFn

PROGRAM = "dra-driver"
KUBECTL_PLUGIN = "kubectl dra"
KUBECTL_BOOLEANS = ("--all-namespaces", "-A")
"""Flags that take kubectl's ``--flag=true|false`` as well as ``--flag``."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Epilogs (the examples) as written; a flag's default after its help where it has one worth
    saying (the flags read from the environment say theirs themselves, with the variable)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "%(default)" in text or default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: {'%(default)s'})"


EXAMPLES = {
    "explain": """Examples:
  # Why the pod waits, claim by claim
  %(prog)s pod/trainer-0 -n ml
  %(prog)s pod trainer-0 -n ml
  # One claim, as a document
  %(prog)s claim/gpu-claim -o yaml
  # The pending claims of every namespace by reason, with the pods waiting for them
  %(prog)s -A -o wide
  # The names of the pending claims of the current namespace
  %(prog)s -o name""",
    "debug-bundle": """Examples:
  # From a laptop: the cluster's view, for a bug report
  %(prog)s --context prod -o bundle.tar.gz
  # In the plugin's pod: the node's checkpoint, CDI specs and metrics too
  kubectl exec -n dra-driver ds/dra-driver-kubelet-plugin -- dra-driver debug-bundle -o - > bundle.tar.gz""",
    "migrate": """Examples:
  # What the GPU Operator's configs become: classes, workloads, each node's steps
  %(prog)s --configmap gpu-operator/device-plugin-config --default-config default
  # The DeviceClasses for one config file, for kubectl apply -f -
  %(prog)s -f dp-config.yaml -o yaml
  # Create them
  %(prog)s -f dp-config.yaml --apply""",
    "kubelet-plugin": """Examples:
  %(prog)s --node-name "$NODE_NAME" --gpu-backend nvml
  %(prog)s --node-name sim-1 --gpu-backend simulated --simulated-profile h100-8x --kubeconfig ~/.kube/config""",
    "controller": """Examples:
  %(prog)s --kubeconfig ~/.kube/config --no-leader-elect --log-format console""",
    "probe": """Examples:
  # The chart's liveness check, in the plugin's container
  %(prog)s""",
    **fleet_args.EXAMPLES,
}


def build_parser(prog: str = PROGRAM, *, kubectl_plugin: bool = False) -> argparse.ArgumentParser:
    """The command's flags; ``kubectl_plugin``: only the commands a person runs from a laptop. Reads
    no environment variable (a malformed one must not break ``--version`` or ``--help``)."""
    parser = argparse.ArgumentParser(prog=prog, description="Kubernetes DRA driver for NVIDIA GPUs",
                                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"dra-driver {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help[:1].upper() + help[1:] + ".",
                              formatter_class=HelpFormatter, epilog=EXAMPLES[name])

    if not kubectl_plugin:
        plugin_settings.add_plugin_arguments(command("kubelet-plugin", "run the node plugin next to the kubelet"))
        controller_settings.add_controller_arguments(command("controller", "explain and allocate ResourceClaims"))
    explain = command("explain", "say why a pod waits, or why a ResourceClaim can or cannot be allocated")
    explain.add_argument("target", nargs="*", metavar="TYPE/NAME",
                         help="pod/NAME, claim/NAME, TYPE NAME (pod NAME, claim NAME) or NAMESPACE/CLAIM; "
                              "none: list the pending claims by reason")
    explain.add_argument("--namespace", "-n", default=None,
                         help="the namespace of a pod or claim name, or the one to list; default: the context's")
    explain.add_argument("--all-namespaces", "-A", action="store_true",
                         help="list the pending claims of every namespace (also --all-namespaces=true|false)")
    explain.add_argument("--no-all-namespaces", dest="all_namespaces", action="store_false", help=argparse.SUPPRESS)
    explain.add_argument("--context", default=None, help="the kubeconfig context to use; default: its current one")
    add_shared_arguments(explain)
    explain.add_argument("--output", "-o", choices=OUTPUTS, default="text",
                         help="wide: a list also names the pods waiting for each claim; name: only the claims' "
                              "names, as kubectl -o name writes them")
    add_scheduler_rules_argument(explain, RULE_CHOICES)
    for name in fleet_args.COMMANDS:
        fleet_args.ADD_ARGUMENTS[name](command(name, fleet_args.HELP[name]))
    bundle = command("debug-bundle", "write a tar.gz with what a bug report needs (redacted)")
    add_shared_arguments(bundle)
    bundle.add_argument("--context", default=None, help="the kubeconfig context to use; default: its current one")
    bundle.add_argument("--output", "-o", default=None,
                        help="file to write ('-' for stdout); default dra-driver-debug-<time>.tar.gz")
    add_env_argument(bundle, "--node", variable="NODE_NAME",
                     help="add this node's checkpoint, CDI specs and plugin /metrics, read here (on the node or "
                          "in its plugin pod)")
    bundle.add_argument("--state-dir", default=None,
                        help="the plugin's checkpoint directory; default: $STATE_DIR, else the plugin's")
    bundle.add_argument("--cdi-root", default=None, help="the plugin's CDI spec directory; default: $CDI_ROOT, "
                                                         "else the plugin's")
    bundle.add_argument("--metrics-url", default=None,
                        help="the plugin's /metrics; default http://127.0.0.1:$HEALTH_PORT/metrics")
    add_migrate_arguments(command("migrate", "serve NVIDIA's device plugin's resource names through this driver"))
    if kubectl_plugin:
        return parser
    probe = command("probe", "check that a running node plugin answers on its sockets")
    probe.add_argument("--registration-socket", default=None,
                       help="the plugin's registration socket; default: the one the plugin names from the same "
                            "environment (DRIVER_NAME, KUBELET_REGISTRY_DIR, ROLLING_UPDATE, POD_UID)")
    add_shared_arguments(probe, kubeconfig=False)
    return parser


def add_migrate_arguments(migrate: argparse.ArgumentParser) -> None:
    source = migrate.add_mutually_exclusive_group(required=True)
    source.add_argument("--filename", "-f", default=None, metavar="FILE",
                        help="the device plugin's config file, or a ConfigMap manifest of several ('-' for stdin)")
    source.add_argument("--configmap", default=None, metavar="NAMESPACE/NAME",
                        help="the device plugin's ConfigMap (its chart's or the GPU Operator's), one key per config")
    migrate.add_argument("--default-config", default=None, metavar="KEY",
                         help=f"the config of nodes without the {MIGRATE_CONFIG_LABEL} label; default: the only one")
    migrate.add_argument("--output", "-o", choices=MIGRATE_OUTPUTS, default="text",
                         help="yaml, json: the DeviceClasses, for kubectl apply -f -; text: the report")
    migrate.add_argument("--apply", action="store_true", help="create the DeviceClasses (the only mode that writes)")
    migrate.add_argument("--context", default=None, help="the kubeconfig context to use; default: its current one")
    add_shared_arguments(migrate)


def kubectl_booleans(argv: Sequence[str], error: Callable[[str], Any]) -> list[str]:
    """kubectl's ``--all-namespaces=true`` (and ``false``, ``-A=true``) as argparse reads flags:
    ``--all-namespaces`` or ``--no-all-namespaces``; ``error`` (the parser's) for another value."""
    out: list[str] = []
    for i, word in enumerate(argv):
        if word == "--":
            return out + list(argv[i:])
        flag, equals, value = word.partition("=")
        if equals and flag in KUBECTL_BOOLEANS:
            try:
                out.append("--all-namespaces" if boolean(value) else "--no-all-namespaces")
            except argparse.ArgumentTypeError as exc:
                error(f"argument --all-namespaces/-A: {exc}")
            continue
        out.append(word)
    return out


def kubectl_main(argv: list[str] | None = None) -> int:
    """``kubectl-dra``: kubectl runs it for ``kubectl dra ...`` (found on ``PATH``) with the words after ``dra``;
    it names itself ``kubectl dra``, as it was called."""
    return main(argv, build_parser(KUBECTL_PLUGIN, kubectl_plugin=True))


def main(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    """``dra-driver``; also ``python -m dra_driver``, which names itself the same."""
    parser = parser or build_parser()
    args, extra = parser.parse_known_args(kubectl_booleans(sys.argv[1:] if argv is None else argv, parser.error))
    if extra and args.command in ("explain", "fit") and not any(word.startswith("-") for word in extra):
        args.target += extra  # kubectl's interspersed words: explain pod -n NS NAME
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    prog = f"{parser.prog} {args.command}"
    try:
        resolve_environment(args)
        return command(args, prog)()
    except KeyboardInterrupt:
        return 130
    except (SettingsError, KubeconfigError) as exc:  # the user's settings or cluster configuration
        return fail(prog, str(exc))
    except Exception as exc:  # last resort (a bug's ValueError too): one line, never a traceback
        return fail(prog, f"unexpected error: {type(exc).__name__}: {exc}")


def fail(prog: str, message: str) -> int:
    print(f"{prog}: {printable(' '.join(message.split()))}", file=sys.stderr)
    return 1


def migrate_fitter(driver: str) -> Callable[[KubeApi], FitFn]:
    """migrate's fit of each workload: the fleet view's, through migrate's own client, with the
    rules of the API server's version."""

    def make(api: KubeApi) -> FitFn:
        from dra_driver.k8s.client import RestKubeApi
        from dra_driver.tools.fleet import fit

        version = (lambda: str(api.server_version().get("gitVersion", ""))) if isinstance(api, RestKubeApi) else None
        return fit.workload_fitter(api, driver=driver, server_version=version)

    return make


def command(args: argparse.Namespace, prog: str) -> Callable[[], int]:
    """What ``args`` asks for, its settings read and checked (SettingsError) before anything runs."""
    if args.command == "kubelet-plugin":
        from dra_driver.node import plugin

        node = plugin_settings.plugin_settings(args)
        return lambda: plugin.run(node)
    if args.command == "controller":
        from dra_driver.controller import reconciler

        settings = controller_settings.controller_settings(args)
        return lambda: reconciler.run(settings)
    if args.command == "debug-bundle":
        from dra_driver.tools import bundle

        return lambda: bundle.main(kubeconfig=args.kubeconfig, output=args.output, node=args.node,
                                   state_dir=args.state_dir, cdi_root=args.cdi_root, metrics_url=args.metrics_url,
                                   driver=args.driver_name, context=args.context, prog=prog)
    if args.command == "probe":
        from dra_driver.node.kubelet import probe

        socket = args.registration_socket or plugin_settings.registration_socket_from_env(os.environ, args.driver_name)
        return lambda: probe.main(str(socket), args.driver_name)
    if args.command in fleet_args.COMMANDS:
        from dra_driver.tools.fleet import command as fleet

        return lambda: fleet.main(args, prog=prog)
    if args.command == "migrate":
        from dra_driver.tools.migrate import command as migrate

        return lambda: migrate.main(args.filename, args.configmap, default_config=args.default_config,
                                    output=args.output, apply=args.apply, kubeconfig=args.kubeconfig,
                                    context=args.context, driver=args.driver_name, prog=prog,
                                    fitter=migrate_fitter(args.driver_name))
    from dra_driver.tools.explain import command as explain

    return lambda: explain.main(args.target, kubeconfig=args.kubeconfig, output=args.output,
                                namespace=args.namespace, all_namespaces=args.all_namespaces, context=args.context,
                                driver=args.driver_name, scheduler_rules=args.scheduler_rules, prog=prog)


if __name__ == "__main__":
    sys.exit(main())
