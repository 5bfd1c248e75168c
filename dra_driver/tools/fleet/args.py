"""The fleet commands' flags (``get gpus|nodes``, ``top``, ``fit``), kubectl's where kubectl has
them, and what ``fit`` is asked about. Pure: nothing here reads the cluster, so the command line
loads no view to declare its flags.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from dra_driver.allocator.rules import RULE_CHOICES
from dra_driver.flags import add_scheduler_rules_argument, add_shared_arguments
from dra_driver.k8s.names import is_dns_label, is_dns_subdomain


class FleetError(Exception):
    """A problem the user can act on (bad argument, object not there, another driver's claim, an
    invalid selector); printed as one line, exit status 1."""


OUTPUTS = ("text", "wide", "json", "yaml")
GPU_WORDS = ("gpus", "gpu", "devices", "device")
NODE_WORDS = ("nodes", "node", "no")
GET_WORDS = (*GPU_WORDS, *NODE_WORDS)
COMMANDS = ("get", "top", "fit")
POD_WORDS = ("pod", "pods", "po")

EXAMPLES = {
    "get": """Examples:
  # Every GPU of the driver: where, what, its state and who holds it
  %(prog)s gpus -A
  # The free H100s, and the devices a selector picks, as a request's selector would
  %(prog)s gpus --free --model H100
  %(prog)s gpus --selector 'device.capacity["gpu.dra-driver.io"].memory.compareTo(quantity("40Gi")) >= 0'
  # One row per node
  %(prog)s nodes -o wide""",
    "top": """Examples:
  # The cluster by model and by DeviceClass
  %(prog)s
  %(prog)s -o json""",
    "fit": """Examples:
  # How many more claims of this template fit now, and where
  %(prog)s --template ml/one-gpu --count 100
  # A claim from a file; a pod's claims, all of them on one node
  %(prog)s -f claim.yaml
  %(prog)s pod/trainer-0 -n ml --count 8""",
}

HELP = {
    "get": "list the driver's GPUs (get gpus, also devices) or its nodes (get nodes): state, holders, health",
    "top": "count the cluster's devices by model and by DeviceClass: total, allocated, free, unhealthy",
    "fit": "say how many more of a claim, template or pod fit now, on which nodes; allocates nothing",
}


def _common(parser: argparse.ArgumentParser, *, namespaces: bool) -> None:
    if namespaces:
        parser.add_argument("--namespace", "-n", default=None,
                            help="the namespace whose pods (get) or template and pod (fit) are read; default: the "
                                 "context's")
    parser.add_argument("--context", default=None, help="the kubeconfig context to use; default: its current one")
    add_shared_arguments(parser)
    parser.add_argument("--output", "-o", choices=OUTPUTS, default="text",
                        help="wide: more columns; json, yaml: the documents of docs/fleet.md")
    add_scheduler_rules_argument(parser, RULE_CHOICES)


def add_get_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("resource", choices=GET_WORDS, metavar="gpus|nodes",
                        help="gpus (also devices): one row per device; nodes: one row per node")
    _common(parser, namespaces=True)
    parser.add_argument("--all-namespaces", "-A", action="store_true",
                        help="read the pods of every namespace (also --all-namespaces=true|false)")
    parser.add_argument("--no-all-namespaces", dest="all_namespaces", action="store_false", help=argparse.SUPPRESS)
    parser.add_argument("--node", default=None, help="only this node's devices")
    parser.add_argument("--model", default=None, help="only devices whose product name contains this (any case)")
    parser.add_argument("--free", action="store_true", help="only free devices")
    parser.add_argument("--selector", "-l", default=None, metavar="CEL",
                        help="only devices this CEL expression selects, evaluated as a request's selector is")
    parser.add_argument("--partitions", action="store_true",
                        help="also list, one row each, the MIG partitions a GPU can still be cut into (dynamic MIG)")


def add_top_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser, namespaces=False)


def add_fit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="*", metavar="pod/NAME", help="a pod, all of whose claims must fit on one node")
    parser.add_argument("--filename", "-f", default=None, metavar="FILE",
                        help="a ResourceClaim or ResourceClaimTemplate (YAML or JSON; '-' for stdin)")
    parser.add_argument("--template", default=None, metavar="[NAMESPACE/]NAME", help="a ResourceClaimTemplate")
    parser.add_argument("--count", type=int, default=1, metavar="N", help="how many more to try")
    _common(parser, namespaces=True)


ADD_ARGUMENTS = {"get": add_get_arguments, "top": add_top_arguments, "fit": add_fit_arguments}


@dataclass(frozen=True)
class FitTarget:
    kind: str
    """``file``, ``template`` or ``pod``."""
    namespace: str
    name: str


def parse_fit_target(words: list[str], *, filename: str | None, template: str | None, namespace: str) -> FitTarget:
    """What ``fit`` is asked about: exactly one of ``-f FILE``, ``--template [NS/]NAME``, ``pod/NAME``
    (or ``pod NAME``); ``namespace``: ``-n``, else the context's."""
    given = [w for w in (filename, template) if w is not None] + ([" ".join(words)] if words else [])
    if len(given) != 1:
        raise FleetError("name one thing to fit: -f FILE, --template [NAMESPACE/]NAME or pod/NAME"
                         + (f"; got {', '.join(repr(g) for g in given)}" if given else ""))
    if not is_dns_label(namespace):
        raise FleetError(f"invalid namespace {namespace!r} (must be a DNS label)")
    if filename is not None:
        return FitTarget("file", namespace, filename)
    if template is not None:
        ns, slash, name = template.rpartition("/")
        if slash and not is_dns_label(ns):
            raise FleetError(f"invalid namespace {ns!r} in --template {template!r} (must be a DNS label)")
        if not is_dns_subdomain(name):
            raise FleetError(f"invalid template name {name!r} (must be a DNS subdomain)")
        return FitTarget("template", ns or namespace, name)
    if len(words) == 2 and words[0].lower() in POD_WORDS:
        word, name = words
    else:
        word, slash, name = " ".join(words).partition("/")
        if not slash or word.lower() not in POD_WORDS:
            raise FleetError(f"fit takes a pod as pod/NAME (or -f FILE, --template NAME); got {' '.join(words)!r}")
    if not is_dns_subdomain(name):
        raise FleetError(f"invalid pod name {name!r} (must be a DNS subdomain)")
    return FitTarget("pod", namespace, name)
