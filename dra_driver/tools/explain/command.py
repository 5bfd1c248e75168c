"""``dra-driver explain``: the command, which reads its target, the cluster's rules and its output
format, and hands the target to the report that answers it.

Arguments and flags are kubectl's (``-n``, ``-A``, ``--context``, ``--kubeconfig``, ``-o
text|json|yaml|wide|name``; :mod:`dra_driver.tools.explain.targets`), and the same command runs as
the kubectl plugin ``kubectl dra explain``. The claim is decided as the cluster's own kube-scheduler
decides it: with the rules of the API server's version (``--scheduler-rules auto``, see
:func:`dra_driver.allocator.rules.choose_rules`) or of the version named, and the report says which
(``rules: kube-scheduler 1.38 (stable allocator)``). ``-o json`` and ``-o yaml`` print a document
with the same content as the text. Every failure (bad name, pod or claim not found, a pod without
claims, another driver's claim, a namespace RBAC forbids, a context that is not there, cluster
unreachable, no kubeconfig) is one line on stderr and exit status 1; verdicts exit 0.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

import yaml

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.allocator.resolve import Engine
from dra_driver.allocator.rules import AUTO, SchedulerRules, choose_rules
from dra_driver.k8s.client import ApiError, KubeApi, KubeconfigError, RestKubeApi, kubeconfig_context, kubeconfig_path
from dra_driver.tools.explain import claim, pending, pod
from dra_driver.tools.explain.targets import OUTPUTS, Kind, TargetError, parse_target
from dra_driver.tools.terminal import api_error_line, one_line, printable


def rules_for(choice: str, server_version: Callable[[], str] | None) -> tuple[SchedulerRules, str | None]:
    """The rules ``--scheduler-rules`` ``choice`` means here, and a warning where ``auto`` had to
    guess; the version is asked only for ``auto`` (without a way to ask: the newest rules)."""
    if choice != AUTO or server_version is None:
        return choose_rules(choice, None)[0], None
    try:
        version: str | None = server_version()
    except Exception as exc:  # the rules then say what they had to assume
        rules, warning = choose_rules(choice, None)
        return rules, f"{warning} ({type(exc).__name__}: {exc})"
    return choose_rules(choice, version)


def target_text(target: str | Sequence[str] | None) -> str:
    return target if isinstance(target, str) else " ".join(target or ())


CLAIM_RESOURCE = "resourceclaim.resource.k8s.io"


def report_names(report: Mapping[str, Any], absent: tuple[str, ...] = ()) -> list[str]:
    """``-o name``: the ResourceClaims a report is about, as kubectl's ``-o name`` writes them
    (``resourceclaim.resource.k8s.io/NAME``, no namespace): the claim, a pod's claims (but those
    whose state is one of ``absent``), or the pending ones of a list."""
    if "groups" in report:
        keys = [str(row["claim"]) for g in report.get("groups") or [] for row in g.get("claims") or []]
    elif "pod" in report:
        keys = [str(c["claim"]) for c in report.get("claims") or [] if c.get("state") not in absent]
    else:
        keys = [str(report["claim"])]
    return [f"{CLAIM_RESOURCE}/{key.rpartition('/')[2]}" for key in keys]


def main(
    target: str | Sequence[str] | None,
    kubeconfig: str | None = None,
    output: str = "text",
    *,
    namespace: str | None = None,
    all_namespaces: bool = False,
    context: str | None = None,
    api: KubeApi | None = None,
    engine: Engine | None = None,
    driver: str = DEFAULT_DRIVER_NAME,
    out: TextIO | None = None,
    err: TextIO | None = None,
    server_version: Callable[[], str] | None = None,
    scheduler_rules: str = AUTO,
    prog: str = "dra-driver explain",
) -> int:
    """``target``: ``pod/NAME``, ``claim/NAME``, ``NAMESPACE/NAME``, the words ``TYPE NAME``, or
    None (the pending claims of ``namespace``, of every namespace with ``all_namespaces``), read as
    kubectl reads them (:mod:`dra_driver.tools.explain.targets`); ``context``: the kubeconfig context, whose
    namespace is the default one; ``server_version``: the API server's version where ``api`` is
    given (else the client asks); ``scheduler_rules``: ``auto`` (that version's rules) or a minor
    such as ``1.37``; ``prog``: how messages name the command (``kubectl dra explain``)."""
    stdout = out or sys.stdout
    stderr = err or sys.stderr
    owned: RestKubeApi | None = None
    try:
        if output not in OUTPUTS:
            raise claim.ExplainError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")
        default_namespace = "default"
        # Read once before the kubeconfig, so that a mistyped argument is the error, not a missing cluster.
        parse_target(target, namespace=namespace, all_namespaces=all_namespaces, default_namespace=default_namespace)
        if api is None:
            path = kubeconfig_path(kubeconfig)
            if path is not None:
                context, context_namespace = kubeconfig_context(path, context)
                default_namespace = context_namespace or default_namespace
            owned = RestKubeApi.from_kubeconfig(kubeconfig, context, request_timeout=15.0)
            api = owned
            rest = owned
            server_version = lambda: str(rest.server_version().get("gitVersion", ""))  # noqa: E731
        what = parse_target(target, namespace=namespace, all_namespaces=all_namespaces,
                            default_namespace=default_namespace)
        engine = engine or Engine()
        render: Callable[[dict[str, Any]], str]
        if what.kind is Kind.PENDING:
            report = pending.read_pending(api, what.namespace, driver=driver, wide=output == "wide")
            render = pending.render_pending
        else:
            namespace_, name = str(what.namespace), what.name
            warnings: list[str | None] = []

            def decide() -> SchedulerRules:
                rules, warning = rules_for(scheduler_rules, server_version)
                warnings.append(warning)
                return rules

            if what.kind is Kind.POD:
                report = pod.explain_pod(api, namespace_, name, engine=engine, driver=driver, rules=decide())
                render = pod.render_pod
            else:
                try:
                    # Decided once the slices are being read: the version's round trip overlaps that read.
                    report = claim.explain_claim(api, namespace_, name, engine=engine, driver=driver, rules=decide)
                except claim.NotFoundError as exc:
                    if not what.namespace_form:
                        raise
                    raise claim.NotFoundError(f"{exc} (read {target_text(target)!r} as NAMESPACE/CLAIM; a pod is "
                                              "pod/NAME, a claim in another namespace claim/NAME -n NAMESPACE)") from None
                render = claim.render_text
            if warnings and warnings[0]:
                report["rulesWarning"] = warnings[0]
    except (claim.ExplainError, TargetError, KubeconfigError) as exc:
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
    if output == "name":
        names = report_names(report, (pod.NOT_CREATED, pod.MISSING))
        if names:
            print("\n".join(names), file=stdout)
    elif output == "json":
        print(json.dumps(report, indent=2, sort_keys=True, default=str), file=stdout)
    elif output == "yaml":
        print(yaml.safe_dump(json.loads(json.dumps(report, default=str)), sort_keys=True, allow_unicode=True).rstrip(),
              file=stdout)
    else:
        print(printable(render(report)), file=stdout)
    return 0
