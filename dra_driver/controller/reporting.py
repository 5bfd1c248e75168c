"""What the controller tells people: its explanation of a claim as annotations, and Events, on the
claim and on the pods that wait for it (:mod:`dra_driver.controller.pod_notices`).

Every write here is best effort for the reader and leader-only: a replica that lost the Lease
stays quiet. Events go through the :class:`dra_driver.k8s.events.EventRecorder`, which folds
repeats into a series and writes in the background.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from dra_driver import logs
from dra_driver.controller.accounting import Accounting
from dra_driver.controller.annotations import annotation_patch, content_hash, desired_annotations, needs_event
from dra_driver.controller.keys import MAX_EVENT_NOTE, wants_controller_allocation
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.pod_notices import PodNotices, pod_event_note
from dra_driver.controller.verdicts import EVENT_REASON, Outcome, Verdict, object_config_errors
from dra_driver.k8s.claims import annotations_of, pod_claim_names, uid_of
from dra_driver.k8s.client import CLAIMS, PODS, ApiError, KubeApi, Resource
from dra_driver.k8s.events import EventRecorder, Occurrence, object_ref
from dra_driver.k8s.fields import one_line
from dra_driver.k8s.leader import Leadership
from dra_driver.k8s.objects import Obj, key_of, meta
from dra_driver.k8s.quarantine import Undecodable


class Reporter:
    """Annotations on claims and Events about any object, written through ``api`` and ``events``."""

    def __init__(self, api: KubeApi, events: EventRecorder, *, driver: str, leadership: Leadership,
                 metrics: ControllerMetrics, accounting: Accounting, log: logs.Logger, pod_events: bool = True) -> None:
        self.api = api
        self.events = events
        self.driver = driver
        self.leadership = leadership
        self.metrics = metrics
        self.accounting = accounting
        self.log = log
        self._lock = threading.Lock()
        self._validated: dict[str, str] = {}
        self.pod_notices = PodNotices()
        self.pod_events = pod_events

    def emit(self, regarding: Mapping[str, Any], what: Occurrence, resource: Resource, *,
             wanted: Callable[[], bool] | None = None) -> None:
        """Best effort (the annotation carries the same information): written in the background, a
        repeat folded into the Event already there, one given up on counted as error kind ``event``.
        With ``wanted``, one that waits for the write budget rather than being dropped
        (:class:`EventRecorder`). The note is cut here, ending in ``...`` as the controller's notes
        always have, so the recorder's own cut (``…``) never changes it."""
        if not self.leadership.is_leader():
            return
        self.events.record(object_ref(regarding, resource), replace(what, note=one_line(what.note, MAX_EVENT_NOTE)),
                           wanted=wanted)

    def write_annotations(self, claim: Obj, outcome: Outcome | None, log: logs.Logger) -> Obj | None:
        """Bring our annotations in line with ``outcome``. Returns the claim as it now stands on the
        server: the written one, ``claim`` when there was nothing to write, None when it could not
        be written (gone, or not the leader)."""
        current = annotations_of(claim)
        patch = annotation_patch(current, desired_annotations(outcome, self.driver))
        event = outcome is not None and needs_event(current, outcome)
        if patch is None and not event:
            return claim
        if not self.leadership.is_leader():
            return None
        m = meta(claim)
        updated = claim
        if patch is not None:
            try:
                updated = self.api.merge_patch(
                    CLAIMS, str(m.get("name")), {"metadata": {"annotations": patch}}, namespace=m.get("namespace")
                )
            except ApiError as exc:
                if exc.not_found:
                    return None
                raise
            self.accounting.keep(updated, claim)
        if outcome is not None:
            if event:
                self.emit(claim, Occurrence("Warning", EVENT_REASON.get(outcome.verdict, "Unsatisfiable"),
                                            "Allocate" if wants_controller_allocation(claim) else "Explain",
                                            outcome.summary), CLAIMS)
            self.metrics.claims_explained.inc()
            log.info("claim explained", verdict=outcome.verdict.value, summary=outcome.summary)
        else:
            log.info("explanation cleared")
        return updated

    def tell_pods(self, claim: Obj, outcome: Outcome | None, pods: list[Obj]) -> None:
        """A Warning Event on each of ``pods`` (those waiting for ``claim``) not yet told this
        verdict; nothing for a claim that can be allocated, whose pods forget what they were told.
        They go through :meth:`emit`, leader only, from the controller's write budget: the pod's
        Event is the one a person reads, so under a backlog it waits for the budget the claims'
        explanations leave rather than being dropped, and it is not written at all if by then the
        pod no longer waits for this verdict."""
        key = key_of(claim)
        if not self.pod_events:
            return
        if outcome is None or outcome.verdict is Verdict.SATISFIABLE:
            self.pod_notices.forget_claim(key)
            return
        if not self.leadership.is_leader():
            return
        digest = content_hash(f"{outcome.verdict.value}|{outcome.summary}")
        reason = EVENT_REASON.get(outcome.verdict, "Unsatisfiable")
        name = str(meta(claim).get("name"))
        for pod in self.pod_notices.untold(key, pods, digest):
            note = pod_event_note(pod_claim_names(pod).get(key, []), name, outcome.summary)
            pod_key = key_of(pod)
            # Told first: the writer's thread asks ``wanted`` and may do so before emit returns.
            self.pod_notices.told(key, pod_key, digest)
            self.emit(pod, Occurrence("Warning", reason, "Explain", note), PODS,
                      wanted=self._still_told(key, pod_key, digest))

    def _still_told(self, claim_key: str, pod_key: str, digest: str) -> Callable[[], bool]:
        return lambda: self.leadership.is_leader() and self.pod_notices.is_told(claim_key, pod_key, digest)

    def record(self, claim: Obj, outcome: Outcome, log: logs.Logger) -> Obj | None:
        if outcome.verdict is Verdict.ERROR:
            self.metrics.error("resolve")
            log.warning("claim evaluation failed", error=outcome.text)
        return self.write_annotations(claim, outcome, log)

    def undecodable(self, bad: Undecodable, resource: Resource) -> None:
        """A Warning Event ``Undecodable`` on an object the informers could not decode (once per
        version of it: the informer tells each once), and the metric."""
        self.metrics.undecodable_objects.labels(resource=resource.plural).inc()
        note = (f"the controller cannot decode this {resource.kind} ({bad.reason}) and leaves it out of its view "
                "until a version of it decodes: its raw fields (opaque parameters) hold text that is not valid "
                "UTF-8, a lone surrogate, or nesting too deep to read")
        self.emit(bad.view, Occurrence("Warning", "Undecodable", "Read", note), resource)

    def validate_object(self, obj: Obj, resource: Resource) -> list[str]:
        """Warning Event ``InvalidConfig`` once per (object, generation, set of errors)."""
        errors = object_config_errors({**obj, "kind": obj.get("kind") or resource.kind}, self.driver)
        uid = uid_of(obj)
        if not errors:
            with self._lock:
                self._validated.pop(uid, None)
            return errors
        digest = content_hash(f"{meta(obj).get('generation')}|" + "\n".join(errors))
        with self._lock:
            if self._validated.get(uid) == digest:
                return errors
        note = f"invalid configuration for {self.driver}: " + "; ".join(errors)
        self.emit(obj, Occurrence("Warning", "InvalidConfig", "Validate", note), resource)
        with self._lock:
            self._validated[uid] = digest
        self.log.warning("invalid opaque configuration", kind=resource.kind, object=key_of(obj), uid=uid,
                          errors=errors)
        return errors
