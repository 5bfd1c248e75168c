"""Which prepared claims are really gone from the API server: the stale-claim sweep's decisions.

The kubelet unprepares a claim when its pod is done. The sweep is the backstop for a claim the
kubelet will never unprepare (pod and claim force-deleted while the kubelet was away): it reads
each prepared claim and unprepares the ones that are gone. Unpreparing a live claim pulls the GPU
from under a running pod (its CDI spec and MIG instance go, and the checkpoint entry that keeps
another claim off the device), so "gone" must be certain, and a control plane that answers 404
for everything (a rollback, a missing API group, a misrouting proxy) must unprepare nothing:

* A claim counts as gone on a 404 whose Status names that claim (``reason: NotFound``,
  ``details.kind: resourceclaims``, its name), seen in two consecutive sweeps; or on a successful
  read of its namespace/name that returns a claim with another UID (the claim was deleted and a
  new one made under its name). Any other answer, or none, is "unknown" and breaks the streak.
  (The plugin may only ``get`` claims, not list them: a read of the claim's own name stands in
  for a list that lacks its UID.)
* A claim found gone keeps everything it holds, its checkpoint entry included, for a grace period
  (``--stale-claim-grace``), so that the kubelet's own Unprepare, which follows once the pod's
  containers are stopped, is what normally releases it; the sweep unprepares it only after that.
* One sweep unprepares at most ``--max-stale-unprepares`` claims, the longest gone first; more
  are left to the next sweeps, and that is said (a log line, an Event on the Node, a metric).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dra_driver.k8s import client as kube
from dra_driver.node.prepare.calls import ClaimRef

NOT_FOUND_SWEEPS = 2
"""Consecutive sweeps that must see a 404 naming the claim before it counts as gone."""


class Seen(StrEnum):
    """What one read of a prepared claim showed."""

    PRESENT = "present"
    NOT_FOUND = "not-found"
    """A 404 whose Status names the claim."""
    REPLACED = "replaced"
    """A claim of that namespace and name with another UID."""
    UNKNOWN = "unknown"
    """Anything else: another error, a 404 that names something else or nothing, no answer."""


def names_claim(exc: kube.ApiError, name: str) -> bool:
    """Whether a 404 is the API server saying that this claim does not exist, rather than that the
    path, the resource or the API group does not (a missing group's Status names no kind)."""
    details: Mapping[str, Any] = exc.details
    return (exc.not_found and exc.reason == "NotFound" and details.get("kind") == kube.CLAIMS.plural
            and details.get("name") == name and details.get("group", kube.CLAIMS.group) == kube.CLAIMS.group)


def read_claim(api: kube.KubeApi, ref: ClaimRef) -> Seen:
    """One GET of a prepared claim, and what it showed."""
    try:
        obj = api.get(kube.CLAIMS, ref.name, namespace=ref.namespace)
    except kube.ApiError as exc:
        return Seen.NOT_FOUND if names_claim(exc, ref.name) else Seen.UNKNOWN
    except Exception:  # the client's transport failures: unknown as well
        return Seen.UNKNOWN
    md = obj.get("metadata")
    md = md if isinstance(md, dict) else {}
    if obj.get("kind", kube.CLAIMS.kind) != kube.CLAIMS.kind or md.get("name") != ref.name \
            or md.get("namespace") != ref.namespace or not md.get("uid"):
        return Seen.UNKNOWN  # not the claim asked for: a proxy answering for something else
    return Seen.PRESENT if md["uid"] == ref.uid else Seen.REPLACED


@dataclass(frozen=True)
class Verdict:
    """One sweep's decision."""

    unprepare: list[ClaimRef]
    """Gone, past the grace period: unprepare now (at most the bound)."""
    deferred: list[ClaimRef]
    """Gone, past the grace period, over the bound: left to the next sweeps."""
    waiting: list[ClaimRef]
    """Gone, within the grace period: kept, holding their devices."""
    suspected: list[ClaimRef]
    """Seen not found once: the next sweep decides."""


@dataclass
class StaleClaims:
    """What the sweeps have seen of each prepared claim; :meth:`decide` is pure but for this memory."""

    grace: float
    max_per_sweep: int
    _not_found: dict[str, int] = field(default_factory=dict)
    """Consecutive sweeps in which a claim was seen not found, by UID."""
    _gone_since: dict[str, float] = field(default_factory=dict)
    """When each claim was first found gone, by UID."""

    def decide(self, seen: Mapping[str, tuple[ClaimRef, Seen]], now: float) -> Verdict:
        """``seen``: every claim prepared now, by UID, with what this sweep's read showed. What the
        kubelet unprepared meanwhile is forgotten."""
        for memory in (self._not_found, self._gone_since):
            for uid in [u for u in memory if u not in seen]:
                del memory[uid]
        suspected = []
        for uid, (ref, what) in seen.items():
            if what is Seen.PRESENT:
                self._not_found.pop(uid, None)
                self._gone_since.pop(uid, None)
            elif what is Seen.UNKNOWN:
                self._not_found.pop(uid, None)  # no longer consecutive; a claim already found gone stays so
            elif what is Seen.REPLACED:
                self._gone_since.setdefault(uid, now)
            else:
                streak = self._not_found.get(uid, 0) + 1
                self._not_found[uid] = streak
                if streak >= NOT_FOUND_SWEEPS:
                    self._gone_since.setdefault(uid, now)
                elif uid not in self._gone_since:
                    suspected.append(ref)
        gone = sorted((since, uid) for uid, since in self._gone_since.items())
        due = [seen[uid][0] for since, uid in gone if now - since >= self.grace]
        waiting = [seen[uid][0] for since, uid in gone if now - since < self.grace]
        bound = max(0, self.max_per_sweep)
        return Verdict(unprepare=due[:bound], deferred=due[bound:], waiting=waiting, suspected=suspected)

    def unprepared(self, uid: str) -> None:
        """The sweep unprepared it: nothing more to remember."""
        self._not_found.pop(uid, None)
        self._gone_since.pop(uid, None)
