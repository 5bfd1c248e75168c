"""``dra-driver get gpus|nodes``, ``top`` and ``fit`` (and ``kubectl dra ...``): the commands, which
read the cluster through a client that can only read (:class:`~dra_driver.tools.fleet.reads.ReadOnly`),
build the engine's inventory, and print the view asked for.

kubectl's flags (``-n``, ``-A``, ``--context``, ``--kubeconfig``, ``-o text|wide|json|yaml``); the
scheduler's rules as ``explain`` picks them (``--scheduler-rules auto``: the API server's version).
Every failure (a bad argument, a template or pod not there, another driver's claim, an invalid CEL
selector, a forbidden read, a cluster that cannot be reached, no kubeconfig) is one line on stderr
and exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TextIO

import yaml

from dra_driver.allocator.resolve import Engine
from dra_driver.k8s.client import ApiError, KubeApi, KubeconfigError, RestKubeApi, kubeconfig_context, kubeconfig_path
from dra_driver.k8s.names import is_dns_label
from dra_driver.tools.explain.command import rules_for
from dra_driver.tools.fleet import fit, gpus, nodes, top
from dra_driver.tools.fleet.args import GPU_WORDS, FitTarget, FleetError, parse_fit_target
from dra_driver.tools.fleet.devices import device_rows
from dra_driver.tools.fleet.reads import ReadOnly, read_fleet
from dra_driver.tools.terminal import api_error_line, one_line, printable


def _file_text(path: str, stdin: TextIO | None) -> str:
    if path == "-":
        return (stdin or sys.stdin).read()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise FleetError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None


def _check(args: argparse.Namespace) -> None:
    """The arguments that need no cluster, checked before the kubeconfig is read."""
    namespace = getattr(args, "namespace", None)
    if namespace is not None and not is_dns_label(namespace):
        raise FleetError(f"invalid namespace {namespace!r} (must be a DNS label)")
    if getattr(args, "all_namespaces", False) and namespace is not None:
        raise FleetError("-A reads every namespace; leave out -n")
    if args.command == "fit":
        if not 1 <= args.count <= fit.MAX_COUNT:
            raise FleetError(f"--count must be between 1 and {fit.MAX_COUNT}, got {args.count}")
        parse_fit_target(args.target, filename=args.filename, template=args.template, namespace=namespace or "default")


COLLECTOR_THRESHOLDS = (50_000, 20, 100)
"""The cyclic collector's thresholds while a command reads and computes (Python's: 700, 10, 10):
the lists of a large cluster decode into millions of dicts, which the views keep until the end,
and at the default every 700 of them set off a collection that walked them all, most of a view's
time (docs/fleet.md#speed). The objects are acyclic: nothing is left for the collector."""


@contextlib.contextmanager
def _few_collections() -> Iterator[None]:
    before = gc.get_threshold()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def report_for(args: argparse.Namespace, reader: ReadOnly, *, engine: Engine, default_namespace: str,
               stdin: TextIO | None) -> tuple[dict[str, Any], Callable[[Mapping[str, Any]], str]]:
    """The document the command prints, and how its text form is rendered."""
    rules, warning = rules_for(args.scheduler_rules, reader.server_version)
    namespace = getattr(args, "namespace", None) or default_namespace
    driver = args.driver_name
    target: FitTarget | None = None
    file_text: str | None = None
    if args.command == "fit":
        target = parse_fit_target(args.target, filename=args.filename, template=args.template, namespace=namespace)
        file_text = _file_text(target.name, stdin) if target.kind == "file" else None
    wants_pods = args.command == "get" and args.resource in GPU_WORDS
    objects, inventory = read_fleet(reader, None if getattr(args, "all_namespaces", False) else namespace,
                                    engine=engine, pods=wants_pods)
    report: dict[str, Any]
    render: Callable[[Mapping[str, Any]], str]
    if target is not None:
        unit = fit.read_unit(reader, target, file_text, objects.classes, objects.claims, driver)
        report = fit.fit_report(unit, args.count, inventory=inventory, classes=objects.classes, claims=objects.claims,
                                engine=engine, rules=rules, driver=driver)
        render = fit.render_fit
    else:
        rows = device_rows(objects, inventory, driver=driver, placements=getattr(args, "partitions", False))
        wide = args.output == "wide"
        if args.command == "top":
            report, render = top.top_report(rows, objects.classes, inventory, rules), top.render_top
        elif args.resource in GPU_WORDS:
            filters = gpus.Filters(args.node, args.model, args.free, args.selector)
            kept, undecided = gpus.selected(rows, filters, inventory, rules)
            report = gpus.gpus_report(kept, hidden=objects.pods_hidden, withheld_hidden=objects.withheld_hidden,
                                      not_decided=undecided, unreadable=objects.unreadable, rules=rules)
            render = lambda r: gpus.render_gpus(r, wide=wide)  # noqa: E731
        else:
            kept, _ = gpus.selected(rows, gpus.Filters(args.node, args.model), inventory, rules)
            report = nodes.nodes_report(kept)
            render = lambda r: nodes.render_nodes(r, wide=wide)  # noqa: E731
    if warning:
        report["rulesWarning"] = warning
    return report, render


def main(args: argparse.Namespace, *, prog: str, api: KubeApi | None = None, engine: Engine | None = None,
         out: TextIO | None = None, err: TextIO | None = None, stdin: TextIO | None = None,
         server_version: Callable[[], str] | None = None) -> int:
    """``args``: the parsed command line (``command``: get, top or fit); ``api``: a client to read
    through (else the kubeconfig's), wrapped so that nothing can write; ``prog``: how messages
    name the command (``kubectl dra get``)."""
    stdout = out or sys.stdout
    stderr = err or sys.stderr
    owned: RestKubeApi | None = None
    try:
        _check(args)
        default_namespace = "default"
        if api is None:
            path = kubeconfig_path(args.kubeconfig)
            context = args.context
            if path is not None:
                context, context_namespace = kubeconfig_context(path, context)
                default_namespace = context_namespace or default_namespace
            owned = RestKubeApi.from_kubeconfig(args.kubeconfig, context, request_timeout=15.0)
            rest = owned
            server_version = lambda: str(rest.server_version().get("gitVersion", ""))  # noqa: E731
            api = owned
        with _few_collections():
            report, render = report_for(args, ReadOnly(api, server_version), engine=engine or Engine(),
                                        default_namespace=default_namespace, stdin=stdin)
    except (FleetError, KubeconfigError) as exc:
        print(f"{prog}: {one_line(exc)}", file=stderr)
        return 1
    except ApiError as exc:
        print(f"{prog}: {api_error_line(exc)}", file=stderr)
        return 1
    except Exception as exc:  # last resort: never a traceback for a user
        print(f"{prog}: unexpected error: {type(exc).__name__}: {one_line(exc)}", file=stderr)
        return 1
    finally:
        if owned is not None:
            owned.close()
    if args.output == "json":
        print(json.dumps(report, indent=2, sort_keys=True, default=str), file=stdout)
    elif args.output == "yaml":
        print(yaml.safe_dump(json.loads(json.dumps(report, default=str)), sort_keys=True, allow_unicode=True).rstrip(),
              file=stdout)
    else:
        print(printable(render(report)), file=stdout)
    return 0
