"""``dra-driver explain -n NS`` and ``-A``: every pending claim of the driver, grouped by the reason
the controller wrote on it.

Read from the claims' annotations (:mod:`dra_driver.controller.annotations`), not re-resolved: one
list of claims answers for 10,000 of them, where resolving each would take minutes. The list is
read in protobuf, each claim reduced to what the report reads (:func:`dra_driver.k8s.wire.noted_claims`):
as JSON, decoding 30,000 claims cost more CPU than all else the command does (docs/scale.md). A pending
claim without our annotations is one the controller found satisfiable (it waits for the
scheduler), one no pod waits for, or one it has not evaluated yet; they are listed under one
heading saying so. Claims whose DeviceClasses select another driver's devices are left out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver.controller.keys import EXPLANATION_ANNOTATION, SUMMARY_ANNOTATION
from dra_driver.controller.verdicts import EVENT_REASON, Verdict
from dra_driver.k8s.bodies import RawBody, RawDeviceClass
from dra_driver.k8s.claims import annotations_of, classes_by_name, is_allocated, is_deleting, pod_claim_names
from dra_driver.k8s.client import CLAIMS, DEVICE_CLASSES, PODS, KubeApi, ListResult
from dra_driver.k8s.objects import key_of
from dra_driver.k8s.wire import POD_CLAIM_REFS, noted_claims
from dra_driver.tools.explain.drivers import claim_drivers

NOT_EXPLAINED = "NotExplained"
NOT_EXPLAINED_TEXT = ("no explanation from the controller: satisfiable and waiting for the scheduler, "
                      "no pod waits for it, or not evaluated yet")
_VERDICT_AT_END = re.compile(r'"verdict":"([A-Za-z]+)"}\s*$')
NOTED_CLAIMS = noted_claims((EXPLANATION_ANNOTATION, SUMMARY_ANNOTATION))
WAITING_PODS = "status.phase=Pending"
"""The pods ``-o wide`` lists beside the claims they wait for: those not running yet."""


def written_verdict(claim: Mapping[str, Any]) -> str | None:
    """The verdict in the controller's explanation document (its last key: the document is written
    with sorted keys, so the 32 KiB need not be parsed), None when there is none."""
    doc = annotations_of(claim).get(EXPLANATION_ANNOTATION)
    if not doc:
        return None
    found = _VERDICT_AT_END.search(doc)
    if found:
        return found.group(1)
    try:
        verdict = json.loads(doc).get("verdict")
    except (ValueError, AttributeError):
        return None
    return str(verdict) if verdict else None


def reason_of(verdict: str | None) -> str:
    """The reason the controller's Events give a verdict (``Unsatisfiable``, ``ResolveError``)."""
    if verdict is None:
        return NOT_EXPLAINED
    try:
        return EVENT_REASON.get(Verdict(verdict), verdict)
    except ValueError:
        return verdict


def read_pending(api: KubeApi, namespace: str | None, *, driver: str, wide: bool) -> dict[str, Any]:
    """:func:`pending_report` of the claims of ``namespace`` (every namespace: None), from the API
    server's watch cache; with ``wide``, with the pods that wait for them."""
    claims = api.list(CLAIMS, namespace=namespace, cached=True, reduced=NOTED_CLAIMS)
    classes = api.list(DEVICE_CLASSES, cached=True)
    pods = api.list(PODS, namespace=namespace, field_selector=WAITING_PODS, cached=True,
                    reduced=POD_CLAIM_REFS) if wide else None
    report = pending_report(claims.items, classes.items, pods.items if pods else None, driver=driver,
                            namespace=namespace)
    # An object the API server serves but nobody can decode is left out of its list; the report
    # says which, so a claim (or the class that decides its driver) never goes missing unsaid.
    report["unreadable"] = unreadable({CLAIMS.kind: claims, DEVICE_CLASSES.kind: classes,
                                       **({PODS.kind: pods} if pods else {})})
    return report


def unreadable(listed: Mapping[str, ListResult]) -> list[str]:
    """``KIND NAMESPACE/NAME: why`` for every object these lists (by kind) could not decode."""
    return [f"{kind} {bad.ref}: {bad.reason}" for kind, result in listed.items() for bad in result.undecodable]


def pending_report(claims: Sequence[RawBody], classes: Sequence[RawDeviceClass], pods: Sequence[RawBody] | None, *, driver: str,
                   namespace: str | None) -> dict[str, Any]:
    """The document ``explain -n``/``-A`` prints: the unallocated claims of ``driver`` (not being
    deleted) in groups of one reason and summary, largest first; with ``pods`` (``-o wide``),
    each claim's waiting pods as ``NAME (claim NAME-IN-POD)``."""
    class_map = classes_by_name(classes)
    waiting: dict[str, list[str]] = {}
    for pod in pods or ():
        pod_name = str(pod.get("metadata", {}).get("name", ""))
        for claim_key, names in pod_claim_names(pod).items():
            waiting.setdefault(claim_key, []).append(f"{pod_name} (claim {', '.join(names) or '?'})")
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for claim in claims:
        if is_allocated(claim) or is_deleting(claim):
            continue
        drivers = claim_drivers(claim, class_map)
        if drivers and driver not in drivers:
            continue
        reason = reason_of(written_verdict(claim))
        summary = annotations_of(claim).get(SUMMARY_ANNOTATION) or NOT_EXPLAINED_TEXT
        row: dict[str, Any] = {"claim": key_of(claim)}
        if pods is not None:
            row["pods"] = sorted(waiting.get(key_of(claim), []))
        groups.setdefault((reason, summary), []).append(row)
    ordered = sorted(groups.items(), key=lambda kv: (kv[0][0] == NOT_EXPLAINED, -len(kv[1]), kv[0]))
    return {
        "namespace": namespace,
        "pending": sum(len(rows) for rows in groups.values()),
        "groups": [{"reason": reason, "summary": summary, "claims": sorted(rows, key=lambda r: r["claim"])}
                   for (reason, summary), rows in ordered],
    }


def render_pending(report: Mapping[str, Any]) -> str:
    where = f"namespace {report['namespace']}" if report.get("namespace") else "all namespaces"
    count = report.get("pending", 0)
    bad = report.get("unreadable") or []
    left_out = ["", f"{len(bad)} object(s) could not be read and are left out:", *(f"  {b}" for b in bad)] if bad else []
    if not count:
        return "\n".join([f"no pending claims in {where}", *left_out])
    groups = report.get("groups") or []
    lines = [f"{count} pending claim(s) in {where}, {len(groups)} reason(s):"]
    for g in groups:
        lines += ["", f"{g['reason']} ({len(g['claims'])}): {g['summary']}"]
        for row in g["claims"]:
            pods = row.get("pods")
            waiting = "" if pods is None else f"  pods: {', '.join(pods) or 'none waiting'}"
            lines.append(f"  {row['claim']}{waiting}")
    return "\n".join([*lines, *left_out])
