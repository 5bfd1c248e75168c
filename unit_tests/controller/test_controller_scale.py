"""The controller's manners at scale: a write budget, no write or evaluation that changes nothing,
one evaluation for many copies of a claim, and a throttled API server."""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from ctrlfix import (
    CLASS,
    FakeClock,
    add_claim,
    add_pod,
    ann,
    claim,
    cluster,
    device_class,
    drain,
    events,
    gpu_slice,
    pod,
    settings,
    step,
    sync,
)
from kubefake import FakeKube
from structlog.testing import capture_logs

from dra_driver.allocator import groups
from dra_driver.allocator.resolve import Engine
from dra_driver.controller.keys import EXPLANATION_ANNOTATION, SUMMARY_ANNOTATION
from dra_driver.controller.reconciler import RESCAN, Controller, Kind
from dra_driver.controller.settings import DEFAULT_MAX_WRITES_PER_SECOND, add_controller_arguments, controller_settings
from dra_driver.controller.verdicts import VerdictMemo, evaluate
from dra_driver.k8s.client import CLAIMS, DEVICE_CLASSES, EVENTS, PODS, SLICES, ApiError
from dra_driver.k8s.ratelimit import TokenBucket, WriteLimitedApi
from dra_driver.k8s.workqueue import WorkQueue


class Counting(Engine):
    """The real engine, counting what it is asked to do."""

    def __init__(self) -> None:
        self.resolves: list[str] = []

    def resolve(self, claim: Any, inventory: Any, classes: Any, allocated: Any = None, nodes: Any = None,
                rules: Any = None) -> Any:
        self.resolves.append(claim["metadata"]["name"])
        return super().resolve(claim, inventory, classes, allocated, nodes, rules)


def make(kube: FakeKube, **over: Any) -> tuple[Controller, Counting, FakeClock]:
    engine, clock = Counting(), FakeClock()
    return Controller(kube, settings(**over), engine=engine, clock=clock, sleep=lambda _s: None), engine, clock


def pending(kube: FakeKube, n: int, count: int = 3) -> None:
    """``n`` copies of one claim (as from one template), each with its pod."""
    for i in range(n):
        add_claim(kube, claim(f"c{i}", count=count))
        add_pod(kube, pod(f"p{i}", f"c{i}"))


def held(kube: FakeKube, n: int, *, phase: str = "Pending") -> None:
    """``n`` allocated claims (one of node-a's two GPUs each), each used by a pod in ``phase``."""
    for i in range(n):
        c = claim(f"done{i}")
        c["status"] = {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.dra-driver.io", "pool": "node-a", "device": f"gpu-{i % 2}"}]}}}
        add_claim(kube, c)
        add_pod(kube, pod(f"p-done{i}", f"done{i}", phase=phase))


class TestTokenBucket:
    def test_a_burst_then_the_rate(self) -> None:
        now = [0.0]
        waits: list[float] = []

        def sleep(s: float) -> None:
            waits.append(s)

        bucket = TokenBucket(10, 3, clock=lambda: now[0], sleep=sleep)
        assert [bucket.take() for _ in range(3)] == [0, 0, 0]
        assert bucket.take() == pytest.approx(0.1) and bucket.take() == pytest.approx(0.2)  # reserved in order
        assert not bucket.try_take()  # others wait: nothing to spare
        now[0] = 1.0
        assert bucket.try_take() and waits == [pytest.approx(0.1), pytest.approx(0.2)]

    def test_refills_up_to_the_burst_only(self) -> None:
        now = [0.0]
        bucket = TokenBucket(100, 2, clock=lambda: now[0], sleep=lambda s: None)
        now[0] = 60.0
        assert [bucket.try_take() for _ in range(3)] == [True, True, False]

    def test_bad_settings(self) -> None:
        with pytest.raises(ValueError):
            TokenBucket(0, 1)

    def test_wall_clock_rate(self) -> None:
        bucket = TokenBucket(200, 1)
        t0 = time.monotonic()
        for _ in range(21):
            bucket.take()
        assert 0.09 < time.monotonic() - t0 < 1.0  # 20 writes past the burst at 200/s: 0.1 s


class TestWriteLimitedApi:
    def test_writes_pay_reads_do_not_and_events_are_dropped_when_spent(self) -> None:
        kube = cluster()
        waited: list[float] = []
        now = [0.0]
        api = WriteLimitedApi(kube, TokenBucket(1, 1, clock=lambda: now[0], sleep=lambda s: None),
                              best_effort=frozenset({EVENTS.plural}), on_wait=waited.append)
        add_claim(kube, claim())
        for _ in range(3):
            api.list(CLAIMS)
            api.get(CLAIMS, "c1", namespace="default")
        api.merge_patch(CLAIMS, "c1", {"metadata": {"labels": {"a": "b"}}}, namespace="default")
        with pytest.raises(ApiError) as info:
            api.create(EVENTS, {"metadata": {"name": "e", "namespace": "default"}}, namespace="default")
        assert info.value.throttled and info.value.reason == "ClientRateLimited"
        api.merge_patch(CLAIMS, "c1", {"metadata": {"labels": {"a": "c"}}}, namespace="default")
        assert waited == [1.0] and not kube.objects.get("events")


def test_the_write_budget_setting() -> None:
    import argparse

    def parse(*argv: str) -> float:
        parser = argparse.ArgumentParser()
        add_controller_arguments(parser)
        return controller_settings(parser.parse_args(list(argv))).max_writes_per_second

    assert parse() == DEFAULT_MAX_WRITES_PER_SECOND == 250
    assert parse("--max-writes-per-second", "50") == 50
    for bad in ("0", "-3", "x", "inf", "nan"):
        with pytest.raises(SystemExit):
            parse("--max-writes-per-second", bad)


class TestBudget:
    def test_events_give_way_to_explanations_and_the_pods_waits_for_the_budget(self) -> None:
        kube = cluster(gpus=2)
        pending(kube, 3)
        ctrl, _, _ = make(kube, max_writes_per_second=0.001)  # one write, then none for 1000 s
        sync(ctrl)
        with capture_logs() as logs:
            ctrl.process_next(timeout=0)
            # The recorder's background writes, done here: the pod's Event is still waiting.
            assert not ctrl.events.flush(timeout=0.3)
        assert SUMMARY_ANNOTATION in ann(kube, "default/c0") and not events(kube)
        assert ctrl.metrics.value("errors_total", {"kind": "event_throttled"}) == 1  # the claim's, dropped
        assert not [e for e in logs if e["log_level"] in ("warning", "error")]
        ctrl.api.bucket.rate = 1000.0  # type: ignore[attr-defined]  # the claims' writes are done
        assert ctrl.events.flush(timeout=5.0)
        [told] = events(kube)
        assert told["regarding"]["kind"] == "Pod" and told["regarding"]["name"] == "p0"
        assert "(c0)" in told["note"] and told["reason"] == "Unsatisfiable"

    def test_a_pods_event_waiting_for_the_budget_is_not_written_once_the_pod_is_gone(self) -> None:
        kube = cluster(gpus=2)
        pending(kube, 1)
        ctrl, _, _ = make(kube, max_writes_per_second=0.001)
        sync(ctrl)
        ctrl.process_next(timeout=0)
        assert not ctrl.events.flush(timeout=0.3)
        kube.delete(PODS, "default/p0")
        ctrl.api.bucket.rate = 1000.0  # type: ignore[attr-defined]
        step(ctrl)  # the pod's deletion seen, then the Events written
        assert events(kube, kind="Pod") == []

    def test_a_throttled_write_is_retried_quietly(self) -> None:
        kube = cluster(gpus=2)
        pending(kube, 1)
        ctrl, _, clock = make(kube)
        kube.fail["merge_patch:resourceclaims"] = ApiError(429, "TooManyRequests", "slow down")
        sync(ctrl)
        with capture_logs() as logs:
            drain(ctrl)
        assert [e["event"] for e in logs if e["log_level"] != "debug"] == ["throttled by the API server, retrying"]
        assert logs[0]["log_level"] == "info" and ctrl.metrics.value("errors_total", {"kind": "throttled"}) == 1
        del kube.fail["merge_patch:resourceclaims"]
        clock.advance(1)
        drain(ctrl)
        assert SUMMARY_ANNOTATION in ann(kube, "default/c0")


class TestNothingNew:
    def test_resync_and_rescan_neither_write_nor_evaluate_again(self) -> None:
        kube = cluster(gpus=2)
        pending(kube, 5)
        ctrl, engine, _ = make(kube)
        step(ctrl)
        writes, resolves = len(kube.writes()), len(engine.resolves)
        assert writes == 15 and resolves == 1  # per claim a patch, its Event and its pod's; one evaluation for five copies
        for _ in range(3):
            ctrl.resync()
            ctrl.queue.add(RESCAN)
            step(ctrl)
        assert len(kube.writes()) == writes and len(engine.resolves) == resolves

    def test_a_health_flap_on_500_nodes_writes_nothing(self) -> None:
        kube = FakeKube()
        for i in range(500):
            kube.add(SLICES, gpu_slice(f"node-{i:03d}", 2))
        step_class(kube)
        # Each claim asks for a GPU of a model no node has: what the flapping nodes do is no part of
        # its explanation.
        tpu = [{"cel": {"expression": 'device.attributes["gpu.dra-driver.io"].type == "tpu"'}}]
        for i in range(20):
            add_claim(kube, claim(f"c{i}", selectors=tpu))
            add_pod(kube, pod(f"p{i}", f"c{i}"))
        ctrl, engine, _ = make(kube)
        step(ctrl)
        explained = {f"c{i}": ann(kube, f"default/c{i}")[EXPLANATION_ANNOTATION] for i in range(20)}
        writes, resolves = len(kube.writes()), len(engine.resolves)
        assert writes == 60  # per claim a patch, its Event and its pod's
        for unhealthy in (True, False):
            for i in range(500):
                s = kube.obj(SLICES, f"node-{i:03d}-gpu.dra-driver.io")
                assert s is not None
                taint = {"key": "gpu.dra-driver.io/unhealthy", "effect": "NoSchedule"}
                s["spec"]["devices"][0]["taints"] = [taint] if unhealthy else []
                kube.set(SLICES, s)
            for event in kube.watch(SLICES, resource_version=ctrl.slices.resource_version, timeout_seconds=1):
                ctrl.slices.apply(event)
            queued = len(ctrl.queue)
            assert queued == 1, "500 slice events are one rescan"
            drain(ctrl)
        assert len(kube.writes()) == writes
        assert len(engine.resolves) == resolves + 2, "one evaluation per state, not per claim"
        assert {f"c{i}": ann(kube, f"default/c{i}")[EXPLANATION_ANNOTATION] for i in range(20)} == explained

    def test_our_own_patch_coming_back_is_not_evaluated_again(self) -> None:
        kube = cluster(gpus=2)
        pending(kube, 1)
        ctrl, engine, _ = make(kube)
        step(ctrl)
        rv = ctrl.claims.resource_version
        for event in kube.watch(CLAIMS, resource_version=rv, timeout_seconds=1):
            ctrl.claims.apply(event)
        drain(ctrl)
        assert len(engine.resolves) == 1


def step_class(kube: FakeKube) -> None:
    from ctrlfix import device_class

    from dra_driver.k8s.client import DEVICE_CLASSES

    kube.add(DEVICE_CLASSES, device_class())


class TestSharedVerdicts:
    def test_copies_share_one_evaluation_and_each_names_itself(self) -> None:
        kube = cluster(gpus=2)
        pending(kube, 50)
        ctrl, engine, _ = make(kube)
        step(ctrl)
        assert engine.resolves == ["c0"]
        for i in (0, 17, 49):
            doc = json.loads(ann(kube, f"default/c{i}")[EXPLANATION_ANNOTATION])
            assert doc["explanation"]["claim"] == f"default/c{i}"
        assert len(events(kube, "Unsatisfiable", "ResourceClaim")) == 50 == len(events(kube, "Unsatisfiable", "Pod"))

    def test_a_shared_answer_is_the_answer(self) -> None:
        kube = cluster(gpus=2)
        pending(kube, 2)
        ctrl, engine, _ = make(kube)
        sync(ctrl)
        claims = {c["metadata"]["name"]: c for c in ctrl.claims.store.values()}
        inv, classes = ctrl.inputs.inventory(), ctrl.inputs.class_map()
        _, held = ctrl.accounting.held_by_others(claims["c1"])
        memo = VerdictMemo()
        first = evaluate(engine, claims["c0"], inv, classes, held, driver="gpu.dra-driver.io", memo=(memo, 1))
        shared = evaluate(engine, claims["c1"], inv, classes, held, driver="gpu.dra-driver.io", memo=(memo, 1))
        direct = evaluate(Engine(), claims["c1"], inv, classes, held, driver="gpu.dra-driver.io")
        assert memo.hits == 1 and shared == direct and first.summary == shared.summary
        assert shared.text.startswith("Claim default/c1:") and first.text.startswith("Claim default/c0:")

    def test_workers_asking_at_once_add_the_holdings_up_once(self) -> None:
        kube = cluster(gpus=2)
        pending(kube, 2)
        sums: list[int] = []

        class Slow(Counting):
            def allocated_state(self, claims: Any, exclude_uid: str | None = None) -> Any:
                sums.append(1)
                time.sleep(0.05)
                return super().allocated_state(claims, exclude_uid)

        ctrl = Controller(kube, settings(), engine=Slow(), clock=FakeClock(), sleep=lambda _s: None)
        sync(ctrl)
        claim_ = next(iter(ctrl.claims.store.values()))
        answers: list[Any] = []
        threads = [threading.Thread(target=lambda: answers.append(ctrl.accounting.held_by_others(claim_)))
                   for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(sums) == 1 and len(answers) == 8 and len({id(state) for _, state in answers}) == 1

    def test_a_new_state_is_evaluated_afresh(self) -> None:
        kube = cluster(gpus=2)
        pending(kube, 3)
        ctrl, engine, _ = make(kube)
        step(ctrl)
        kube.add(SLICES, gpu_slice("node-b", 2))
        step(ctrl)
        assert len(engine.resolves) == 2
        assert "need 3" in ann(kube, "default/c2")[SUMMARY_ANNOTATION]

    def test_claims_that_hold_devices_are_not_shared(self) -> None:
        kube = cluster(gpus=4)
        pending(kube, 2, count=1)
        ctrl, engine, _ = make(kube)
        step(ctrl)  # satisfiable: nothing to write, both seen by one evaluation
        assert engine.resolves == ["c0"] and not kube.writes()


def test_claims_that_need_no_work_are_not_queued() -> None:
    """Nor by the pods that use them: at 5,000 nodes 20,000 running pods each hold an allocated
    claim, and the workers would go through all of them beside the start's first explanations."""
    kube = cluster(gpus=2)
    held(kube, 30)
    pending(kube, 1)
    ctrl, _, _ = make(kube)
    sync(ctrl)
    assert [k.key for k in ctrl.queue.pending() if k.kind is Kind.CLAIM] == ["default/c0"]
    assert ctrl.waited_for("default/done3")


def test_a_deferred_key_is_not_hurried() -> None:
    now = [0.0]
    q = WorkQueue(clock=lambda: now[0])
    q.add_after("a", 5)
    q.add("b")
    assert q.get(0) == "b"
    q.done("b")
    q.add_rate_limited("b")
    assert q.deferred("a") and q.deferred("b") and not q.deferred("c")
    now[0] = 10.0
    assert q.get(0) == "b" and q.deferred("b"), "still failing until forgotten"
    assert q.get(0) == "a" and not q.deferred("a")
    q.forget("b")
    assert not q.deferred("b")


def test_backlog_of_identical_claims_is_cheap() -> None:
    """A unit-sized backlog, in process: 1,000 pending copies over 100 nodes cost well under the
    6 ms of CPU per claim a 10,000-claim minute allows (e2e/bench/backlog.py measures bigger ones).
    The write budget is lifted: here only the controller's own work counts."""
    kube = FakeKube()
    for i in range(100):
        kube.add(SLICES, gpu_slice(f"node-{i:03d}", 8))
    step_class(kube)
    pending(kube, 1000, count=9)
    ctrl, engine, _ = make(kube, max_writes_per_second=1e9)
    sync(ctrl)
    t0 = time.process_time()
    drain(ctrl, limit=5000)
    cpu = time.process_time() - t0
    assert len(kube.writes("merge_patch")) == 1000 and len(engine.resolves) == 1
    assert cpu < 6.0, f"{cpu:.1f} s of CPU for 1,000 claims"


def test_the_write_budget_paces_a_backlog() -> None:
    kube = cluster(gpus=2)
    pending(kube, 40)
    ctrl, _, _ = make(kube, max_writes_per_second=20)  # a burst of 20, then 20 a second
    sync(ctrl)
    t0 = time.monotonic()
    drain(ctrl)
    elapsed = time.monotonic() - t0
    written = len(kube.writes("merge_patch")) + len(events(kube))
    assert len(kube.writes("merge_patch")) == 40, "every explanation is written"
    assert len(events(kube, kind="ResourceClaim")) < 40, "the claims' Events give way when the budget is spent"
    assert len(events(kube, kind="Pod")) == 40, "every pod is told, once the explanations are written"
    assert elapsed >= (written - 20) / 20 - 0.05
    assert ctrl.metrics.value("write_wait_seconds_total") > 0


def test_copied_objects_are_not_shared_with_the_store() -> None:
    kube = cluster(gpus=2)
    pending(kube, 1)
    ctrl, _, _ = make(kube)
    step(ctrl)
    cached = ctrl.claims.store.get("default/c0")
    assert cached is not None
    before = copy.deepcopy(cached)
    ctrl.resync()
    step(ctrl)
    assert ctrl.claims.store.get("default/c0") == before


def test_our_own_allocation_re_explains_the_others() -> None:
    from ctrlfix import fence_policy

    kube = cluster(gpus=1)
    pending(kube, 1, count=1)  # c0 waits for the one GPU: satisfiable, nothing to say ...
    fence_policy(kube)
    ctrl, _, _ = make(kube)
    step(ctrl)
    assert not kube.writes()
    add_claim(kube, claim("mine", opt_in=True))  # ... until the controller allocates it to this one
    step(ctrl)
    mine = kube.obj(CLAIMS, "default/mine")
    assert mine is not None and mine["status"]["allocation"]
    assert "cannot allocate" in ann(kube, "default/c0")[SUMMARY_ANNOTATION]


def _recording_start(monkeypatch: pytest.MonkeyPatch, kube: FakeKube, order: list[str]) -> Controller:
    """A controller that notes in ``order`` each inventory build, class grouping, sum of holdings
    and evaluation, in the order they happen."""
    real_build = groups._build

    def building(inventory: Any, projection: Any, *rest: Any) -> Any:
        order.append("group")
        return real_build(inventory, projection, *rest)

    monkeypatch.setattr(groups, "_build", building)

    class Recording(Engine):
        def build_inventory(self, *args: Any, **kwargs: Any) -> Any:
            order.append("inventory")
            return super().build_inventory(*args, **kwargs)

        def prime(self, inventory: Any, class_name: str, classes: Any) -> None:
            order.append(f"prime {class_name}")
            super().prime(inventory, class_name, classes)

        def allocated_state(self, claims: Any, exclude_uid: str | None = None) -> Any:
            order.append("held")
            return super().allocated_state(claims, exclude_uid)

        def resolve(self, claim: Any, *args: Any, **kwargs: Any) -> Any:
            order.append("resolve")
            return super().resolve(claim, *args, **kwargs)

    class SlowToHear(Controller):
        def _on_slice(self, old: Any, new: Any) -> None:
            # At 5,000 nodes the list's 7,000 notifications take a while: the inventory built at
            # start must count them all, or the first claim builds it again.
            time.sleep(0.05)
            super()._on_slice(old, new)

    return SlowToHear(kube, settings(), engine=Recording(), sleep=lambda _s: None)


@contextlib.contextmanager
def _warmed_up(ctrl: Controller) -> Iterator[list[dict[str, Any]]]:
    """``ctrl`` running, its logs captured, once its warm-up is over (every class grouped), or
    after 10 s; stopped on the way out."""
    stop = threading.Event()
    runner = threading.Thread(target=ctrl.run, args=(stop,), daemon=True)
    with capture_logs() as logs:
        runner.start()
        deadline = time.monotonic() + 10
        while not any(e["event"] == "warm-up over" for e in logs) and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            yield logs
        finally:
            stop.set()
            runner.join(timeout=10)


def test_the_inventory_is_built_and_grouped_before_the_first_claim_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 5,000 nodes building the inventory takes about a second, grouping its devices for a class
    a few tenths more, and adding up what 20,000 claims hold about 60 ms: the controller does all
    three once its informers have synced, so the first claim for one device of a class waits for
    none of them."""
    kube = cluster(slices=3)
    kube.add(DEVICE_CLASSES, device_class("other"))
    order: list[str] = []
    with _warmed_up(_recording_start(monkeypatch, kube, order)) as logs:
        before_any_claim = list(order)
        add_claim(kube, claim("c1", count=1))
        add_pod(kube, pod("p1", "c1"))
        deadline = time.monotonic() + 10
        while "resolve" not in order and time.monotonic() < deadline:
            time.sleep(0.01)
    # No claim was pending at start, so every class is grouped once the workers are idle. Both
    # classes select the same fields, so the second finds the first's grouping.
    assert before_any_claim == ["inventory", "held", f"prime {CLASS}", "group", "prime other"]
    assert order == [*before_any_claim, "resolve"], "the claim used the inventory, grouping and sum built at start"
    built = [entry for entry in logs if entry["event"] == "device inventory built"]
    assert len(built) == 1 and built[0]["devices"] == 6


def test_the_claims_pending_at_start_wait_only_for_their_own_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 5,000 nodes the dynamic-MIG class's grouping takes a second (76,000 partitionable
    devices); a claim pending at start for a GPU must not wait for it, nor for any class it does
    not use: those are grouped once the workers have nothing left to do."""
    kube = cluster(slices=3)
    other = device_class("other")
    other["spec"]["selectors"].append({"cel": {"expression": "device.attributes.exists(a, true) || true"}})
    kube.add(DEVICE_CLASSES, other)
    add_claim(kube, claim("c1", count=9))  # unsatisfiable: 6 GPUs
    add_pod(kube, pod("p1", "c1"))
    order: list[str] = []
    with _warmed_up(_recording_start(monkeypatch, kube, order)) as logs:
        pass
    assert order[:4] == ["inventory", f"prime {CLASS}", "group", "held"], order
    assert order.index("resolve") < order.index("prime other"), order
    assert "cannot allocate" in ann(kube, "default/c1")[SUMMARY_ANNOTATION]
    over = [e for e in logs if e["event"] == "warm-up over"]
    assert over and over[0]["grouped_first"] == 1


def test_the_controller_limits_malloc_arenas_before_any_thread_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each thread that decodes in an arena of its own keeps what it freed there: on the scale
    bench the synced controller grew with every batch of pods it drops; two arenas stop that
    (dra_driver.memory). The cap holds only for arenas made after it, so it comes first."""
    from dra_driver import memory
    from dra_driver.controller import reconciler
    from dra_driver.k8s.client import KubeconfigError, RestKubeApi

    seen: list[str] = []
    monkeypatch.setattr(memory, "limit_arenas", lambda arenas=2: seen.append(f"{arenas} arenas") or True)

    def no_cluster(*_args: Any, **_kwargs: Any) -> Any:
        seen.append("client")
        raise KubeconfigError("no cluster here")

    monkeypatch.setattr(RestKubeApi, "from_kubeconfig", staticmethod(no_cluster))
    # What else run() sets for the whole process stays as the other tests have it.
    monkeypatch.setattr(reconciler.logs, "configure", lambda *_args: None)
    monkeypatch.setattr(reconciler.gc, "set_threshold", lambda *_args: None)
    with pytest.raises(KubeconfigError, match="no cluster here"):
        reconciler.run(settings())
    assert seen == ["2 arenas", "client"]


def test_workers_start_when_the_informers_are_slow_to_sync() -> None:
    """The controller gives its informers two minutes, then starts its workers anyway; the warm-up,
    which waits for the same informers, must not hold them back."""
    kube = cluster(slices=1)
    stop = threading.Event()

    class NeverWarm(Controller):
        def wait_synced(self, stop: threading.Event, timeout: float = 120.0) -> bool:
            return False  # as after two minutes

    def never_warm(stop: threading.Event, *_: Any) -> None:
        stop.wait()  # as while a list never ends

    ctrl = NeverWarm(kube, settings(), sleep=lambda _s: None)
    ctrl.inputs.warm_up = never_warm  # type: ignore[method-assign]
    add_claim(kube, claim("c1", count=9))
    add_pod(kube, pod("p1", "c1"))
    runner = threading.Thread(target=ctrl.run, args=(stop,), daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while SUMMARY_ANNOTATION not in ann(kube) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "cannot allocate" in ann(kube).get(SUMMARY_ANNOTATION, "")
    finally:
        stop.set()
        runner.join(timeout=10)


def test_pools_are_digested_while_the_slices_arrive() -> None:
    """At 5,000 nodes the API server takes seconds to send the slices and digesting their devices
    as long again: the warm-up digests each pool as its slice arrives, and the first inventory
    takes those pools over instead of digesting them after the last slice."""

    class SlowSlices(FakeKube):
        def watch(self, res: Any, **kwargs: Any) -> Any:
            for event in super().watch(res, **kwargs):
                if res is SLICES and event["type"] == "ADDED":
                    time.sleep(0.3)  # the warm-up looks every 0.2 s
                yield event

    kube = SlowSlices()
    for i in range(4):
        kube.add(SLICES, gpu_slice(f"node-{i}", 2))
    kube.add(DEVICE_CLASSES, device_class())
    ctrl, _, _ = make(kube)
    stop = threading.Event()
    streaming = threading.Thread(target=ctrl.slices.stream, args=(stop,), daemon=True)
    with capture_logs() as logs:
        streaming.start()
        assert ctrl.inputs.prebuild(stop)
    streaming.join(timeout=10)
    early = dict(ctrl.inputs.prebuilt.pools) if ctrl.inputs.prebuilt is not None else {}
    done = next(e for e in logs if e["event"] == "pools digested while the slices arrived")
    assert done["slices"] >= 1 and len(early) == done["pools"] >= 1  # how many: up to the machine's load
    inventory = ctrl.inputs.inventory()
    assert [d.index for d in inventory.devices] == list(range(8))
    taken = [p for p in inventory.pools if early.get((p.driver, p.name)) is p]
    assert len(taken) == len(early)
    assert ctrl.inputs.prebuilt is None  # spent on the first inventory


def test_only_pods_not_yet_running_are_watched() -> None:
    """A running pod's claims are allocated: it can wait for nothing the controller explains. At
    5,000 nodes 150,000 such pods were most of what the controller listed at start."""
    kube = cluster(gpus=2)
    held(kube, 20, phase="Running")
    pending(kube, 1, count=9)
    ctrl, _, _ = make(kube)
    sync(ctrl)
    assert ctrl.pods.store.keys() == ["default/p0"]
    step(ctrl)
    assert "cannot allocate" in ann(kube, "default/c0")[SUMMARY_ANNOTATION]
    p0 = kube.obj(PODS, "default/p0")
    assert p0 is not None
    kube.replace_status(PODS, {**p0, "status": {"phase": "Failed"}})  # done: it waits no longer
    ctrl.pods.watch_once()
    assert not ctrl.pods.store.keys() and not ctrl.waited_for("default/c0")
