"""What the controller concludes about one claim: the action it takes and the verdict of resolving it
(engine + opaque config validation). Pure functions; nothing here writes."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import orjson

from dra_driver.allocator.inventory import AllocatedState, Inventory
from dra_driver.allocator.resolve import Engine, Resolution
from dra_driver.allocator.rules import SchedulerRules
from dra_driver.controller.keys import ALLOCATE_ANNOTATION, MAX_SUMMARY_BYTES, OUR_ANNOTATIONS, wants_controller_allocation
from dra_driver.controller.ownership import alternatives
from dra_driver.gpuconfig import ConfigError
from dra_driver.k8s.bodies import DeviceClasses
from dra_driver.k8s.claims import (
    annotations_of,
    device_ids,
    has_finalizer,
    is_allocated,
    is_deleting,
    is_generated_for_pod,
    reserved_for,
)
from dra_driver.k8s.fields import one_line
from dra_driver.k8s.labels import LabelSelector
from dra_driver.opaqueconfig import decode

# --------------------------------------------------------------------------------------------
# Opaque configuration validation


def config_errors(configs: Any, driver: str, path: str) -> list[str]:
    """Field-path messages for every opaque config of ``driver`` in ``configs`` that does not decode, in
    this driver's API or NVIDIA's (:mod:`dra_driver.opaqueconfig`); no device is known yet, so which
    device type an NVIDIA kind applies to is checked at prepare."""
    errors: list[str] = []
    if configs is None:
        return errors
    if not isinstance(configs, list):
        return [f"{path}: must be a list"]
    for i, entry in enumerate(configs):
        opaque = entry.get("opaque") if isinstance(entry, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
            continue
        where = f"{path}[{i}].opaque.parameters"
        try:
            decode(opaque.get("parameters"))
        except ConfigError as exc:
            errors.append(f"{where}.{exc.path}: {exc.detail}" if exc.path else f"{where}: {exc.detail}")
        except Exception as exc:  # last resort: a decoder bug is this field's config error, not a crash
            errors.append(f"{where}: cannot be decoded ({type(exc).__name__}: {exc})")
    return errors


def object_config_errors(obj: Mapping[str, Any], driver: str) -> list[str]:
    """Config errors of a ResourceClaim, ResourceClaimTemplate or DeviceClass."""
    kind = obj.get("kind")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return []
    if kind == "DeviceClass":
        return config_errors(spec.get("config"), driver, "spec.config")
    if kind == "ResourceClaimTemplate":
        inner = spec.get("spec")
        devices = inner.get("devices") if isinstance(inner, Mapping) else None
        return config_errors(devices.get("config") if isinstance(devices, Mapping) else None, driver,
                             "spec.spec.devices.config")
    devices = spec.get("devices")
    return config_errors(devices.get("config") if isinstance(devices, Mapping) else None, driver,
                         "spec.devices.config")


def claim_class_names(claim: Mapping[str, Any]) -> list[str]:
    return list(dict.fromkeys(str(alt["deviceClassName"]) for alt in alternatives(claim) if alt.get("deviceClassName")))


def pending_classes(claims: Iterable[Mapping[str, Any]]) -> set[str]:
    """The DeviceClasses that claims not allocated (nor being deleted) ask for: what the first
    evaluations after a start need grouped."""
    return {name for c in claims if not is_allocated(c) and not is_deleting(c) for name in claim_class_names(c)}


def claim_config_errors(claim: Mapping[str, Any], classes: DeviceClasses, driver: str) -> list[str]:
    """The claim's own config errors plus those of the DeviceClasses it uses."""
    errors = object_config_errors({**claim, "kind": "ResourceClaim"}, driver)
    for name in claim_class_names(claim):
        cls = classes.get(name)
        if cls is not None:
            errors += [f"deviceclass {name}: {e}" for e in object_config_errors({**cls, "kind": "DeviceClass"}, driver)]
    return errors


# --------------------------------------------------------------------------------------------
# Pure decisions


class Action(StrEnum):
    IGNORE = "ignore"
    """Not pending, nothing of ours on it."""
    CLEAR = "clear"
    """Allocated or no longer pending: remove our explanation annotations."""
    EXPLAIN = "explain"
    """Pending, the scheduler allocates it: explain only."""
    ALLOCATE = "allocate"
    """Pending and opted in to controller allocation."""
    FINALIZE = "finalize"
    """Opted-in claim being deleted, unreserved, with the finalizer: deallocate and release."""


def classify(claim: Mapping[str, Any], *, waited_for: bool, ours: bool = True) -> Action:
    """What the controller does with ``claim``; ``waited_for``: a pod that is not done uses it;
    ``ours``: False for a claim only another driver could serve, which that driver's controller has
    explained (:mod:`dra_driver.controller.ownership`): left to it."""
    opted_in = wants_controller_allocation(claim)
    if is_deleting(claim):
        if ours and opted_in and has_finalizer(claim) and not reserved_for(claim) and not is_generated_for_pod(claim):
            return Action.FINALIZE
        return Action.IGNORE
    has_ours = any(a in annotations_of(claim) for a in OUR_ANNOTATIONS)
    if is_allocated(claim):
        return Action.CLEAR if has_ours else Action.IGNORE
    if not ours:
        return Action.IGNORE
    if opted_in and not is_generated_for_pod(claim):
        return Action.ALLOCATE
    if waited_for or opted_in:
        return Action.EXPLAIN
    return Action.CLEAR if has_ours else Action.IGNORE


class Verdict(StrEnum):
    SATISFIABLE = "Satisfiable"
    UNSATISFIABLE = "Unsatisfiable"
    INVALID_CONFIG = "InvalidConfig"
    NOT_ALLOCATABLE = "NotAllocatable"
    NOT_ALLOWED = "NotAllowed"
    """Annotated for controller allocation in a namespace where the admin does not allow it."""
    ERROR = "Error"


EVENT_REASON = {
    Verdict.UNSATISFIABLE: "Unsatisfiable",
    Verdict.INVALID_CONFIG: "InvalidConfig",
    Verdict.NOT_ALLOCATABLE: "NotAllocatable",
    Verdict.NOT_ALLOWED: "NotAllowed",
    Verdict.ERROR: "ResolveError",
}


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """Result of evaluating one claim (engine + config validation), before any write."""

    verdict: Verdict
    summary: str
    allocation: dict[str, Any] | None = None
    explanation: dict[str, Any] | None = None
    text: str = ""
    config_errors: tuple[str, ...] = ()


class VerdictMemo:
    """Engine results shared by claims that differ only in name, while nothing else changes.

    A burst of pending claims is mostly copies: one template, one spec, 10,000 claims. Resolved
    against the same devices, classes and allocations, with nobody's allocation their own, they
    get the same answer, apart from the claim's name in the explanation, which is put back per
    claim. ``state`` names what the answers were computed against (versions of the slices, the
    classes and the allocations); a new state starts afresh. Only for explaining: an allocation's
    share IDs are made from the claim's UID, so an answer used to allocate is never shared.
    """

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._state: Hashable = None
        self._answers: dict[Hashable, Resolution] = {}
        self._documents: dict[Hashable, dict[str, Any]] = {}
        self.hits = 0

    def get(self, state: Hashable, key: Hashable) -> Resolution | None:
        if state != self._state:
            self._state, self._answers, self._documents = state, {}, {}
            return None
        found = self._answers.get(key)
        self.hits += found is not None
        return found

    def put(self, state: Hashable, key: Hashable, resolution: Resolution) -> None:
        if state == self._state and len(self._answers) < self.limit:
            self._answers[key] = resolution

    def document(self, key: Hashable, resolution: Resolution, claim: str) -> dict[str, Any]:
        """The explanation's annotation form for ``claim``: built once per answer, the name put
        in per claim (``to_dict`` was a tenth of the controller's time in a backlog). The
        nested parts are shared between claims, and only read."""
        doc = self._documents.get(key)
        if doc is None:
            doc = self._documents[key] = resolution.explanation.to_dict()
        return {**doc, "claim": claim}


def memo_key(claim: Mapping[str, Any], nodes: Sequence[str] | None) -> Hashable:
    """What the engine's answer for an unallocated claim depends on besides the shared state: its
    spec, the nodes it may use, and its namespace (an explanation names the claims of the claim's
    own namespace that hold a device, and only counts the others)."""
    spec = claim.get("spec")
    namespace = claim_label(claim).partition("/")[0]
    return (orjson.dumps(spec, option=orjson.OPT_SORT_KEYS, default=str), tuple(nodes) if nodes is not None else None,
            namespace)


def claim_label(claim: Mapping[str, Any]) -> str:
    """The claim's name as the engine writes it in an explanation."""
    m = claim.get("metadata")
    m = m if isinstance(m, Mapping) else {}
    return f"{m.get('namespace') or 'default'}/{m.get('name') or '<unnamed>'}"


def _resolved(engine: Engine, claim: Mapping[str, Any], inventory: Inventory, classes: DeviceClasses,
              allocated: AllocatedState, nodes: list[str] | None, memo: tuple[VerdictMemo, Hashable] | None,
              rules: SchedulerRules | None) -> tuple[Resolution, Callable[[], dict[str, Any]] | None]:
    """The engine's answer, and for a memoised one how to have its explanation's annotation form
    (the memo's state must tell the rules apart)."""
    if memo is None:
        return engine.resolve(claim, inventory, classes, allocated, nodes, rules), None
    cache, state = memo
    key = memo_key(claim, nodes)
    known = cache.get(state, key)
    if known is None:
        res = engine.resolve(claim, inventory, classes, allocated, nodes, rules)
        cache.put(state, key, res)
        return res, None
    label = claim_label(claim)
    return replace(known, explanation=replace(known.explanation, claim=label)), lambda: cache.document(key, known, label)


def evaluate(
    engine: Engine,
    claim: Mapping[str, Any],
    inventory: Inventory,
    classes: DeviceClasses,
    allocated: AllocatedState,
    *,
    driver: str,
    nodes: list[str] | None = None,
    require_own_driver: bool = False,
    memo: tuple[VerdictMemo, Hashable] | None = None,
    rules: SchedulerRules | None = None,
) -> Outcome:
    """Resolve ``claim`` and validate its config; never raises for bad input. ``memo``: a
    :class:`VerdictMemo` and the state ``allocated``, ``inventory`` and ``rules`` are from, for a
    claim that is only explained and holds no devices; ``rules``: the scheduler version to decide
    as (the newest the engine knows by default)."""
    errors = tuple(claim_config_errors(claim, classes, driver))
    try:
        res, known_doc = _resolved(engine, claim, inventory, classes, allocated, nodes, memo, rules)
        expl = res.explanation
        summary = str(expl.summary)
        allocation = res.allocation
        try:
            doc = known_doc() if known_doc is not None else expl.to_dict()
        except Exception as exc:  # last resort: the verdict stands without its document
            doc = {"error": f"explanation not serializable: {exc}"}
        try:
            text = expl.render()
        except Exception:  # last resort: the summary stands in for a text that cannot be rendered
            text = summary
    except Exception as exc:  # last resort: an engine bug must not take the controller down
        msg = f"cannot evaluate the claim: {type(exc).__name__}: {exc}"
        return Outcome(verdict=Verdict.ERROR, summary=one_line(msg, MAX_SUMMARY_BYTES), text=msg, config_errors=errors)
    if errors:
        head = invalid_config_summary(errors, driver, summary if allocation is None else None)
        return Outcome(verdict=Verdict.INVALID_CONFIG, summary=head, explanation=doc, text=text, config_errors=errors)
    if allocation is None:
        return Outcome(verdict=Verdict.UNSATISFIABLE, summary=one_line(summary, MAX_SUMMARY_BYTES), explanation=doc,
                       text=text, config_errors=errors)
    if require_own_driver:
        foreign = sorted({d for d, _, _ in device_ids(allocation) if d != driver})
        if foreign:
            msg = (
                f"the controller allocates only claims served entirely by {driver} devices; "
                f"this claim needs devices of {', '.join(foreign)}: remove the "
                f"{ALLOCATE_ANNOTATION} annotation and let the scheduler allocate it"
            )
            return Outcome(verdict=Verdict.NOT_ALLOCATABLE, summary=one_line(msg, MAX_SUMMARY_BYTES), explanation=doc,
                           text=text, config_errors=errors)
    return Outcome(verdict=Verdict.SATISFIABLE, summary=one_line(summary, MAX_SUMMARY_BYTES), allocation=allocation,
                   explanation=doc, text=text, config_errors=errors)


def allocation_refusal(namespace: str, labels: Mapping[str, str] | None, allowed: LabelSelector | None) -> str | None:
    """Why the controller does not allocate a claim of ``namespace`` (whose labels are ``labels``,
    None when the controller does not know the namespace) that asks it to; None when it may.

    The annotation lets a claim's author have devices without a pod, so without the scheduler's
    say: only the namespaces an admin opened to it (``allowed``, a label selector) get that."""
    if allowed is None:
        why = "it is turned off in this cluster"
    elif labels is None:
        why = f"namespace {namespace} is not known to the controller"
    elif not allowed.matches(labels):
        why = (f"namespace {namespace} is not one the cluster's admin opened to it "
               f"(namespaces labelled {allowed.text or 'with any labels'})")
    else:
        return None
    return one_line(f"controller allocation is not allowed here: {why}; remove the {ALLOCATE_ANNOTATION} annotation "
                    "and let the scheduler allocate the claim for a pod that uses it", MAX_SUMMARY_BYTES)


def not_allowed_outcome(reason: str) -> Outcome:
    return Outcome(verdict=Verdict.NOT_ALLOWED, summary=reason, text=reason)


def invalid_config_summary(errors: Sequence[str], driver: str, unsatisfiable: str | None = None) -> str:
    head = f"invalid configuration for {driver}: {errors[0]}"
    if len(errors) > 1:
        head += f" (and {len(errors) - 1} more)"
    if unsatisfiable:
        head += f"; also unsatisfiable: {unsatisfiable}"
    return one_line(head, MAX_SUMMARY_BYTES)


def config_only_outcome(errors: Sequence[str], driver: str) -> Outcome:
    """The verdict for a claim nobody waits for yet whose configuration is already known bad."""
    summary = invalid_config_summary(errors, driver)
    return Outcome(verdict=Verdict.INVALID_CONFIG, summary=summary, text=summary, config_errors=tuple(errors))

