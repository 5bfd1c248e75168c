"""Which pods have been told why a claim they wait for cannot be allocated.

``kubectl describe pod`` is what a person reads first; the scheduler's Event there says only
"cannot allocate all claims". So while a pod waits for a claim the controller explains, the pod
gets a Warning Event too (reason as on the claim, note
``claim <the pod's name for it> (<ResourceClaim name>): <the claim's summary>``): one per claim
that cannot be allocated, written when that claim's verdict changes or the pod starts waiting for
it, not on every re-evaluation. A pod counts as told once its Event is handed to the recorder,
which does not drop it for want of write budget (under a backlog it waits for what the claims'
explanations leave) and writes it only while the pod is still told that verdict here. What was
told lives in memory only: a new controller process tells each waiting pod once more, and since
an Event's name is derived from what it says (:func:`dra_driver.k8s.events.event_name`), that
repeat folds into the Event already there.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from dra_driver.k8s.objects import Obj, key_of


def pod_event_note(pod_names: Sequence[str], claim_name: str, summary: str) -> str:
    """``claim gpu (unsatisfiable-gpu-gjx2m): no device matches ...``; the ResourceClaim's own
    name stands in when the pod gives it none."""
    return f"claim {', '.join(pod_names) or claim_name} ({claim_name}): {summary}"


class PodNotices:
    """Per claim, the pods told its verdict and which verdict (a digest of it). Entries go when
    the claim is allocated or no longer explained (:meth:`forget_claim`) and when the pod stops
    waiting for it (:meth:`forget_pod`), so what is kept is bounded by the pods waiting now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._told: dict[str, dict[str, str]] = {}

    def untold(self, claim_key: str, pods: Iterable[Obj], digest: str) -> list[Obj]:
        """The pods among ``pods`` not yet told ``digest`` of the claim."""
        with self._lock:
            told = self._told.get(claim_key, {})
            return [p for p in pods if told.get(key_of(p)) != digest]

    def is_told(self, claim_key: str, pod_key: str, digest: str) -> bool:
        """Whether the pod still waits for the claim and was last told ``digest`` of it."""
        with self._lock:
            return self._told.get(claim_key, {}).get(pod_key) == digest

    def told(self, claim_key: str, pod_key: str, digest: str) -> None:
        with self._lock:
            self._told.setdefault(claim_key, {})[pod_key] = digest

    def forget_claim(self, claim_key: str) -> None:
        with self._lock:
            self._told.pop(claim_key, None)

    def forget_pod(self, pod_key: str, claim_keys: Iterable[str]) -> None:
        with self._lock:
            for ck in claim_keys:
                told = self._told.get(ck)
                if told is not None:
                    told.pop(pod_key, None)
                    if not told:
                        del self._told[ck]

    def clear(self) -> None:
        with self._lock:
            self._told.clear()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(t) for t in self._told.values())
