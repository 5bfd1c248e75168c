"""The stale-claim sweep unprepares only what is really gone: a 404 naming the claim in two
consecutive sweeps, or its name now held by another UID; after a grace period; a bounded number
per sweep. A control plane answering 404 for everything unprepares nothing."""

from __future__ import annotations

from typing import Any

import pytest
from kubeserver import Server
from nodefix import Env, make_claim

from dra_driver.cli import build_parser
from dra_driver.k8s.client import ApiError
from dra_driver.k8s.events import ObjectRef, Occurrence
from dra_driver.logs import get
from dra_driver.node import events as notices
from dra_driver.node.metrics import METRICS
from dra_driver.node.plugin import sweep_stale_claims
from dra_driver.node.prepare.calls import ClaimRef
from dra_driver.node.settings import plugin_settings
from dra_driver.node.stale import Seen, StaleClaims, names_claim, read_claim

REF = ClaimRef("uid-1", "ns", "c1")


def claim_not_found(name: str) -> ApiError:
    """What the API server answers for a claim that does not exist."""
    return ApiError(404, "NotFound", f'resourceclaims.resource.k8s.io "{name}" not found',
                    {"name": name, "group": "resource.k8s.io", "kind": "resourceclaims"})


GROUP_MISSING = ApiError(404, "NotFound", "the server could not find the requested resource", {})
PAGE_NOT_FOUND = ApiError(404, "Not Found", "404 page not found")


class TestWhatAReadShows:
    def test_only_a_status_naming_the_claim_is_not_found(self) -> None:
        assert names_claim(claim_not_found("c1"), "c1")
        assert not names_claim(claim_not_found("other"), "c1")
        assert not names_claim(GROUP_MISSING, "c1") and not names_claim(PAGE_NOT_FOUND, "c1")
        pods = ApiError(404, "NotFound", "x", {"name": "c1", "kind": "pods"})
        assert not names_claim(pods, "c1")
        other_group = ApiError(404, "NotFound", "x", {"name": "c1", "kind": "resourceclaims", "group": "x.io"})
        assert not names_claim(other_group, "c1")

    @pytest.mark.parametrize(("answer", "seen"), [
        ({"kind": "ResourceClaim", "metadata": {"name": "c1", "namespace": "ns", "uid": "uid-1"}}, Seen.PRESENT),
        ({"kind": "ResourceClaim", "metadata": {"name": "c1", "namespace": "ns", "uid": "uid-2"}}, Seen.REPLACED),
        ({"kind": "Status", "metadata": {}}, Seen.UNKNOWN),
        ({"kind": "ResourceClaim", "metadata": {"name": "c1", "namespace": "other", "uid": "uid-2"}}, Seen.UNKNOWN),
        ({"kind": "ResourceClaim", "metadata": {"name": "c1", "namespace": "ns"}}, Seen.UNKNOWN),
        (claim_not_found("c1"), Seen.NOT_FOUND),
        (GROUP_MISSING, Seen.UNKNOWN),
        (ApiError(0, "ConnectionRefusedError"), Seen.UNKNOWN),
        (OSError("reset"), Seen.UNKNOWN),
    ])
    def test_a_read(self, answer: Any, seen: Seen) -> None:
        class Api:
            def get(self, *_a: Any, **_k: Any) -> Any:
                if isinstance(answer, Exception):
                    raise answer
                return answer

        assert read_claim(Api(), REF) is seen  # type: ignore[arg-type]


class TestDecide:
    def test_not_found_twice_in_a_row_then_the_grace_period(self) -> None:
        claims = StaleClaims(grace=30, max_per_sweep=10)
        v = claims.decide({REF.uid: (REF, Seen.NOT_FOUND)}, 0)
        assert v.suspected == [REF] and not v.unprepare and not v.waiting
        v = claims.decide({REF.uid: (REF, Seen.NOT_FOUND)}, 5)
        assert v.waiting == [REF] and not v.unprepare
        assert not claims.decide({REF.uid: (REF, Seen.NOT_FOUND)}, 34).unprepare  # 29 s since found gone
        assert claims.decide({REF.uid: (REF, Seen.UNKNOWN)}, 35).unprepare == [REF]  # found gone stays gone

    def test_an_unknown_answer_breaks_the_streak(self) -> None:
        claims = StaleClaims(grace=0, max_per_sweep=10)
        for t, seen in enumerate([Seen.NOT_FOUND, Seen.UNKNOWN, Seen.NOT_FOUND, Seen.PRESENT, Seen.NOT_FOUND]):
            assert not claims.decide({REF.uid: (REF, seen)}, t).unprepare
        assert claims.decide({REF.uid: (REF, Seen.NOT_FOUND)}, 9).unprepare == [REF]

    def test_present_again_is_forgiven(self) -> None:
        claims = StaleClaims(grace=10, max_per_sweep=10)
        claims.decide({REF.uid: (REF, Seen.REPLACED)}, 0)
        claims.decide({REF.uid: (REF, Seen.PRESENT)}, 5)
        assert not claims.decide({REF.uid: (REF, Seen.NOT_FOUND)}, 20).unprepare

    def test_another_uid_under_the_name_is_gone_at_once(self) -> None:
        claims = StaleClaims(grace=0, max_per_sweep=10)
        assert claims.decide({REF.uid: (REF, Seen.REPLACED)}, 0).unprepare == [REF]

    def test_what_the_kubelet_unprepared_is_forgotten(self) -> None:
        claims = StaleClaims(grace=0, max_per_sweep=10)
        claims.decide({REF.uid: (REF, Seen.NOT_FOUND)}, 0)
        claims.decide({}, 1)  # the kubelet unprepared it; a claim later prepared under that UID starts afresh
        assert not claims.decide({REF.uid: (REF, Seen.NOT_FOUND)}, 2).unprepare

    def test_a_sweep_unprepares_at_most_the_bound_longest_gone_first(self) -> None:
        claims = StaleClaims(grace=0, max_per_sweep=2)
        refs = [ClaimRef(f"u{i}", "ns", f"c{i}") for i in range(5)]
        claims.decide({refs[4].uid: (refs[4], Seen.REPLACED)}, 0)
        v = claims.decide({r.uid: (r, Seen.REPLACED) for r in refs}, 1)
        assert v.unprepare == [refs[4], refs[0]] and v.deferred == refs[1:4]


class Told:
    def __init__(self) -> None:
        self.events: list[Occurrence] = []

    def record(self, _ref: ObjectRef, what: Occurrence) -> None:
        self.events.append(what)


def sweep(env: Env, claims: StaleClaims, now: float) -> Told:
    told = Told()
    sweep_stale_claims(env.state, env.reader, claims, now, get("test"),  # type: ignore[arg-type]
                       notices.NodeEvents(told, "node-a"))  # type: ignore[arg-type]
    return told


def prepared(env: Env, n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        c = make_claim(f"c{i}", [("gpu", f"gpu-{i}")])
        assert env.prepare_one(c).error is None
        out.append(c)
    return out


class TestSweep:
    def test_an_api_group_answering_404_unprepares_nothing(self, env: Env) -> None:
        uids = [c["metadata"]["uid"] for c in prepared(env, 3)]
        for i in range(3):
            env.reader.errors[("default", f"c{i}")] = GROUP_MISSING
        before = env.checkpoint()
        claims = StaleClaims(grace=0, max_per_sweep=10)
        for t in range(20):
            assert not sweep(env, claims, t).events
        assert env.checkpoint() == before and all(env.spec_exists(u) for u in uids)

    def test_a_deleted_claim_is_unprepared_after_two_sweeps_and_the_grace(self, env: Env) -> None:
        [c] = prepared(env, 1)
        uid = c["metadata"]["uid"]
        env.reader.errors[("default", "c0")] = claim_not_found("c0")
        claims = StaleClaims(grace=60, max_per_sweep=10)
        sweep(env, claims, 0)
        sweep(env, claims, 60)  # gone from now on
        assert uid in env.checkpoint() and env.spec_exists(uid)  # held for the grace period
        before = METRICS.value("stale_claims_unprepared_total", {"result": "success"})
        told = sweep(env, claims, 120)
        assert uid not in env.checkpoint() and not env.spec_exists(uid)
        assert [e.reason for e in told.events] == ["StaleClaimUnprepared"]
        assert METRICS.value("stale_claims_unprepared_total", {"result": "success"}) == before + 1

    def test_over_the_bound_the_rest_wait_and_it_is_said(self, env: Env) -> None:
        for i, c in enumerate(prepared(env, 3)):
            env.reader.claims[("default", f"c{i}")] = {**c, "metadata": {**c["metadata"], "uid": f"new-{i}"}}
        claims = StaleClaims(grace=0, max_per_sweep=2)
        before = METRICS.value("stale_claims_deferred_total")
        told = sweep(env, claims, 0)
        assert sorted(e.reason for e in told.events) == ["StaleClaimUnprepared", "StaleClaimUnprepared",
                                                        "StaleClaimsDeferred"]
        assert len(env.checkpoint()) == 1 and METRICS.value("stale_claims_deferred_total") == before + 1
        told = sweep(env, claims, 1)
        assert [e.reason for e in told.events] == ["StaleClaimUnprepared"] and env.checkpoint() == {}


def test_the_flags() -> None:
    def parsed(*argv: str) -> Any:
        return plugin_settings(build_parser().parse_args(["kubelet-plugin", "--node-name=n", *argv]))

    s = parsed()
    assert (s.stale_claim_grace, s.max_stale_unprepares) == (300.0, 10)
    s = parsed("--stale-claim-grace=5", "--max-stale-unprepares=3")
    assert (s.stale_claim_grace, s.max_stale_unprepares) == (5.0, 3)
    with pytest.raises(SystemExit):  # argparse: argument --max-stale-unprepares: must be a whole number, 1 or more
        parsed("--max-stale-unprepares=0")


def test_what_the_api_server_sends_reaches_the_decision(srv: Server) -> None:
    srv.replies = [
        (404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
               "message": 'resourceclaims.resource.k8s.io "c1" not found',
               "details": {"name": "c1", "group": "resource.k8s.io", "kind": "resourceclaims"}}),
        (404, "text/plain; charset=utf-8", b"404 page not found\n"),
        (404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
               "message": "the server could not find the requested resource", "details": {}}),
    ]
    assert [read_claim(srv.api, REF) for _ in range(3)] == [Seen.NOT_FOUND, Seen.UNKNOWN, Seen.UNKNOWN]
