"""``dra-driver explain pod/NAME``: every claim of a pod explained, those made from a template included.

A pod names its claims in ``spec.resourceClaims`` (directly, or by a ResourceClaimTemplate whose
claim's generated name the resourceclaim controller writes to ``status.resourceClaimStatuses``), and
the scheduler's claim for extended resources in ``status.extendedResourceClaimStatus``. Each claim
of this driver gets the report ``explain claim/NAME`` gives
(:func:`dra_driver.tools.explain.claim.build_report`), with the devices, cluster state and inventory read
once for all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from dra_driver.allocator.inventory import Inventory
from dra_driver.allocator.resolve import Engine
from dra_driver.allocator.rules import SchedulerRules
from dra_driver.k8s.claims import EXTENDED_RESOURCES_CLAIM, classes_by_name, is_allocated, pod_node, status_of
from dra_driver.k8s.client import CLAIMS, DEVICE_CLASSES, PODS, ApiError, KubeApi
from dra_driver.k8s.objects import Obj, meta
from dra_driver.tools.explain.claim import ExplainError, build_report, render_text, tainted_slices
from dra_driver.tools.explain.drivers import claim_drivers

NOT_CREATED = "not-created"
MISSING = "missing"
OTHER_DRIVER = "other-driver"


def pod_claims(pod: Mapping[str, Any]) -> list[dict[str, str | None]]:
    """The claims a pod names, in its order: ``podClaim`` (the pod's name for it), ``claim`` (the
    ResourceClaim's name; None while a template's claim is not created) and ``template``."""
    spec = pod.get("spec")
    generated = {str(st.get("name")): st.get("resourceClaimName")
                 for st in status_of(pod).get("resourceClaimStatuses") or [] if isinstance(st, Mapping)}
    out: list[dict[str, str | None]] = []
    for rc in (spec.get("resourceClaims") if isinstance(spec, Mapping) else None) or []:
        if not isinstance(rc, Mapping):
            continue
        name = str(rc.get("name", ""))
        template = rc.get("resourceClaimTemplateName")
        claim = rc.get("resourceClaimName") or generated.get(name)
        out.append({"podClaim": name, "claim": str(claim) if claim else None,
                    "template": str(template) if template else None})
    ext = status_of(pod).get("extendedResourceClaimStatus")
    if isinstance(ext, Mapping) and ext.get("resourceClaimName"):
        out.append({"podClaim": EXTENDED_RESOURCES_CLAIM, "claim": str(ext["resourceClaimName"]), "template": None})
    return out


def explain_pod(api: KubeApi, namespace: str, name: str, *, engine: Engine, driver: str,
                rules: SchedulerRules | None = None) -> dict[str, Any]:
    """The document ``explain pod/NAME`` prints; ExplainError for a pod that is not there, one
    without claims, and one whose claims are all another driver's."""
    try:
        pod = api.get(PODS, name, namespace=namespace)
    except ApiError as exc:
        if exc.not_found:
            raise ExplainError(f"pod {namespace}/{name} not found") from None
        raise
    entries = pod_claims(pod)
    if not entries:
        raise ExplainError(f"pod {namespace}/{name} has no resource claims (spec.resourceClaims is empty)")
    claims: dict[str, Obj] = {}
    for entry in entries:
        if entry["claim"] is not None and entry["claim"] not in claims:
            try:
                claims[entry["claim"]] = api.get(CLAIMS, entry["claim"], namespace=namespace)
            except ApiError as exc:
                if not exc.not_found:
                    raise
    slices = tainted_slices(api)
    classes = api.list(DEVICE_CLASSES, cached=True).items
    class_map = classes_by_name(classes)
    ours = {k: c for k, c in claims.items() if not (d := claim_drivers(c, class_map)) or driver in d}
    if claims and not ours and all(e["claim"] in claims for e in entries):
        others = sorted({d for c in claims.values() for d in claim_drivers(c, class_map)})
        raise ExplainError(f"pod {namespace}/{name} has no claim of {driver}: its claims are for {', '.join(others)}")
    allocations = api.list_claim_allocations().items if any(not is_allocated(c) for c in ours.values()) else []
    inventory: Future[Inventory] | None = None
    if allocations:
        inventory = Future()
        try:
            inventory.set_result(engine.build_inventory(slices))
        except Exception as exc:  # build_report reports it for each claim
            inventory.set_exception(exc)
    reports: list[dict[str, Any]] = []
    for entry in entries:
        claim_name = entry["claim"]
        head: dict[str, Any] = {"podClaim": entry["podClaim"], "claim": f"{namespace}/{claim_name or '?'}"}
        if entry["template"]:
            head["template"] = entry["template"]
        if claim_name is None:
            reports.append({**head, "state": NOT_CREATED,
                            "summary": f"not created yet from ResourceClaimTemplate {entry['template']}"})
        elif claim_name not in claims:
            reports.append({**head, "state": MISSING, "summary": f"ResourceClaim {namespace}/{claim_name} not found"})
        elif claim_name not in ours:
            drivers = ", ".join(sorted(claim_drivers(claims[claim_name], class_map)))
            reports.append({**head, "state": OTHER_DRIVER, "summary": f"a claim of {drivers}, not {driver}"})
        else:
            report = build_report(claims[claim_name], slices, classes, allocations, engine=engine, driver=driver,
                                  inventory=inventory, rules=rules)
            reports.append({**head, **report})
    m = meta(pod)
    return {"pod": f"{namespace}/{name}", "uid": str(m.get("uid", "")), "phase": status_of(pod).get("phase"),
            "node": pod_node(pod), "claims": reports}


STATE_WORDS = {
    "allocated": "allocated",
    "satisfiable": "not allocated yet; satisfiable now",
    "unsatisfiable": "cannot be allocated",
    "invalid-config": "invalid configuration",
    "error": "cannot be evaluated",
    NOT_CREATED: "not created yet",
    MISSING: "missing",
    OTHER_DRIVER: "another driver's",
}
BLOCKING = frozenset({"unsatisfiable", "invalid-config", "error", MISSING})


def render_pod(report: Mapping[str, Any]) -> str:
    """One line per claim (``claim gpu (unsatisfiable-gpu-gjx2m): cannot be allocated: ...``), then
    each claim's own report, indented."""
    claims = report.get("claims") or []
    blocked = sum(1 for c in claims if c.get("state") in BLOCKING)
    where = f" on node {report['node']}" if report.get("node") else ""
    lines = [f"Pod {report['pod']} ({report.get('phase') or 'phase unknown'}{where}): {len(claims)} claim(s), "
             f"{blocked} cannot be allocated"]
    for c in claims:
        name = str(c.get("claim", "")).partition("/")[2]
        word = STATE_WORDS.get(str(c.get("state")), str(c.get("state")))
        said = c.get("summary") or (f"on {c['where']}" if c.get("state") == "allocated" and c.get("where") else "")
        summary = f": {said}" if said else ""
        lines.append(f"claim {c['podClaim']} ({name}): {word}{summary}")
    for c in claims:
        if c.get("state") in (NOT_CREATED, MISSING, OTHER_DRIVER):
            continue
        # The claim's own report, less what the line about it above says: its name, and the summary.
        own = render_text(c).splitlines()[1:]
        if own and c.get("summary") and own[0].endswith(str(c["summary"])):
            own = own[1:]
        while own and not own[0]:
            own = own[1:]
        lines += ["", *("  " + line if line else "" for line in own)]
    return "\n".join(lines)
