"""The annotations and Events the controller writes on a claim.

``gpu.dra-driver.io/explanation``: JSON, at most 32 KiB::

    {"verdict": "Unsatisfiable" | "InvalidConfig" | "NotAllocatable" | "Error",
     "summary": "<one line>",
     "configErrors": ["spec.devices.config[0].opaque.parameters.sharing.strategy: ..."],
     "explanation": {...engine's Explanation.to_dict()...},
     "truncated": false}

When the document is larger than 32 KiB the engine's structured explanation is replaced by
``{"text": "<render(), cut>"}`` and ``truncated`` becomes true.
``gpu.dra-driver.io/explanation-summary``: the summary (≤ 1024 characters).
``gpu.dra-driver.io/explained-by``: the driver whose controller wrote them, so that a claim of
another driver's is left to that driver's controller once it has explained it
(:mod:`dra_driver.controller.ownership`).
``gpu.dra-driver.io/explanation-hash``: 16 hex digits of SHA-256 over the explanation
document; a write whose hash equals the one on the claim is skipped. A Warning Event (reason
``Unsatisfiable``, ``InvalidConfig``, ``NotAllocatable`` or ``ResolveError``; note = summary;
reportingController ``gpu.dra-driver.io/controller``) is emitted only when the summary changes,
so a verdict is announced once, also across controller restarts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from dra_driver.controller.keys import (
    EXPLAINED_BY_ANNOTATION,
    EXPLANATION_ANNOTATION,
    HASH_ANNOTATION,
    MAX_EXPLANATION_BYTES,
    OUR_ANNOTATIONS,
    SUMMARY_ANNOTATION,
)
from dra_driver.controller.verdicts import Outcome, Verdict
from dra_driver.k8s.fields import one_line


def explanation_document(outcome: Outcome, *, limit: int = MAX_EXPLANATION_BYTES) -> str:
    """The explanation annotation's JSON, trimmed to ``limit`` bytes."""
    doc: dict[str, Any] = {
        "verdict": outcome.verdict.value,
        "summary": outcome.summary,
        "configErrors": list(outcome.config_errors),
        "explanation": outcome.explanation if outcome.explanation is not None else {"text": outcome.text},
        "truncated": False,
    }
    text = dumps(doc)
    if len(text.encode()) <= limit:
        return text
    doc["truncated"] = True
    doc["explanation"] = {"text": ""}
    base = len(dumps(doc).encode())
    budget = limit - base - 64
    if budget > 0:
        doc["explanation"] = {"text": _cut_json_string(outcome.text or outcome.summary, budget)}
        text = dumps(doc)
        if len(text.encode()) <= limit:
            return text
    # Still too big: the config errors themselves are huge. Keep as many as fit.
    doc["explanation"] = {"text": ""}
    kept: list[str] = []
    for err in outcome.config_errors:
        trial = {**doc, "configErrors": [*kept, one_line(err, 512)]}
        if len(dumps(trial).encode()) > limit - 64:
            break
        kept.append(one_line(err, 512))
    doc["configErrors"] = kept
    return dumps(doc)


def _cut_json_string(text: str, budget: int) -> str:
    """A prefix of ``text`` whose JSON encoding fits ``budget`` bytes."""
    if len(json.dumps(text).encode()) <= budget:
        return text
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(json.dumps(text[:mid] + "...").encode()) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo] + "..."


def dumps(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def desired_annotations(outcome: Outcome | None, driver: str) -> dict[str, str] | None:
    """Our annotations for an outcome, as ``driver``'s controller writes them; None means "none of
    ours should be there"."""
    if outcome is None or outcome.verdict is Verdict.SATISFIABLE:
        return None
    doc = explanation_document(outcome)
    return {
        EXPLAINED_BY_ANNOTATION: driver,
        EXPLANATION_ANNOTATION: doc,
        SUMMARY_ANNOTATION: outcome.summary,
        HASH_ANNOTATION: content_hash(doc),
    }


def annotation_patch(current: Mapping[str, str], desired: Mapping[str, str] | None) -> dict[str, str | None] | None:
    """The merge patch of ``metadata.annotations`` that brings ``current`` to ``desired``; None if
    nothing needs writing (the hash on the object equals the new one, or nothing of ours to clear)."""
    if desired is None:
        present = [a for a in OUR_ANNOTATIONS if a in current]
        return dict.fromkeys(present) if present else None
    if current.get(HASH_ANNOTATION) == desired[HASH_ANNOTATION] and all(a in current for a in OUR_ANNOTATIONS):
        return None
    return dict(desired)


def needs_event(current: Mapping[str, str], outcome: Outcome) -> bool:
    """A Warning Event goes out when the verdict line changes, not on every re-evaluation."""
    return outcome.verdict is not Verdict.SATISFIABLE and current.get(SUMMARY_ANNOTATION) != outcome.summary


def explained_by(current: Mapping[str, str]) -> str | None:
    """The driver whose controller wrote the explanation in ``current``, if one did."""
    return current.get(EXPLAINED_BY_ANNOTATION) or None
