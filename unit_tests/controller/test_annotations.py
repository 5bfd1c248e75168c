"""The explanation written on a claim: its annotations, their size, the patch and when an Event follows."""

from __future__ import annotations

import json
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME as DRIVER
from dra_driver.controller.annotations import annotation_patch, desired_annotations, explanation_document, needs_event
from dra_driver.controller.keys import (
    EXPLAINED_BY_ANNOTATION,
    EXPLANATION_ANNOTATION,
    HASH_ANNOTATION,
    MAX_SUMMARY_BYTES,
    SUMMARY_ANNOTATION,
)
from dra_driver.controller.verdicts import Outcome, Verdict
from dra_driver.k8s.fields import one_line


def outcome(summary: str = "cannot allocate: request gpu: 2 candidates, need 3", **kw: Any) -> Outcome:
    base: dict[str, Any] = dict(verdict=Verdict.UNSATISFIABLE, summary=summary, explanation={"k": "v"}, text=summary)
    base.update(kw)
    return Outcome(**base)


class TestAnnotations:
    def test_document_shape(self) -> None:
        doc = json.loads(explanation_document(outcome(config_errors=("a: b",))))
        assert doc == {"verdict": "Unsatisfiable", "summary": outcome().summary, "configErrors": ["a: b"],
                       "explanation": {"k": "v"}, "truncated": False}

    def test_trimmed_to_32_kib(self) -> None:
        big = {"requests": [{"closest": ["x" * 100] * 1000}]}
        text = "line\n" * 20000
        doc_text = explanation_document(outcome(explanation=big, text=text))
        assert len(doc_text.encode()) <= 32 * 1024
        doc = json.loads(doc_text)
        assert doc["truncated"] is True and doc["explanation"]["text"].startswith("line")

    def test_trimmed_even_with_huge_config_errors(self) -> None:
        errs = tuple(f"spec.devices.config[{i}].opaque.parameters: " + "é" * 2000 for i in range(40))
        doc_text = explanation_document(outcome(config_errors=errs, text="t" * 50000))
        assert len(doc_text.encode()) <= 32 * 1024
        assert json.loads(doc_text)["truncated"] is True

    def test_patch_dedup_by_hash(self) -> None:
        want = desired_annotations(outcome(), DRIVER)
        assert want is not None
        assert set(want) == {EXPLANATION_ANNOTATION, SUMMARY_ANNOTATION, HASH_ANNOTATION, EXPLAINED_BY_ANNOTATION}
        assert want[EXPLAINED_BY_ANNOTATION] == DRIVER
        assert annotation_patch({}, want) == want
        assert annotation_patch(dict(want), want) is None
        changed = desired_annotations(outcome("cannot allocate: other reason"), DRIVER)
        assert changed is not None
        assert annotation_patch(dict(want), changed) == changed

    def test_clear(self) -> None:
        assert annotation_patch({"other": "x"}, None) is None
        cur = {"other": "x", SUMMARY_ANNOTATION: "s", HASH_ANNOTATION: "h"}
        assert annotation_patch(cur, None) == {SUMMARY_ANNOTATION: None, HASH_ANNOTATION: None}
        assert desired_annotations(outcome(verdict=Verdict.SATISFIABLE), DRIVER) is None

    def test_event_only_when_the_verdict_line_changes(self) -> None:
        o = outcome()
        assert needs_event({}, o)
        assert not needs_event({SUMMARY_ANNOTATION: o.summary}, o)
        assert needs_event({SUMMARY_ANNOTATION: "older"}, o)
        assert not needs_event({}, outcome(verdict=Verdict.SATISFIABLE))

    def test_summary_is_one_short_line(self) -> None:
        s = one_line("a\nb " + "x" * 5000, MAX_SUMMARY_BYTES)
        assert "\n" not in s and len(s.encode()) <= 1024
