"""The controller decides with the cluster's kube-scheduler rules (``--scheduler-rules``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ctrlfix import DRIVER, FakeClock, add_claim, add_pod, ann, claim, cluster, fence_policy, pod, settings, step

from dra_driver.allocator.rules import SchedulerRules
from dra_driver.controller.keys import EXPLANATION_ANNOTATION, SUMMARY_ANNOTATION
from dra_driver.controller.reconciler import Controller
from dra_driver.controller.rules_source import REFRESH_SECONDS, RulesSource
from dra_driver.controller.settings import add_controller_arguments, controller_settings


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.lines.append(("info", event, kw))

    def warning(self, event: str, **kw: Any) -> None:
        self.lines.append(("warning", event, kw))


class Version:
    def __init__(self, text: str) -> None:
        self.text, self.reads = text, 0

    def __call__(self) -> str:
        self.reads += 1
        if self.text == "unreachable":
            raise OSError("connection refused")
        return self.text


def test_auto_follows_the_api_server_and_logs_a_change_once() -> None:
    clock, log, version = FakeClock(), Log(), Version("v1.37.2")
    source = RulesSource("auto", version, clock, log)
    assert source.refresh() == SchedulerRules(37) and source.current() == SchedulerRules(37)
    assert log.lines == [("info", "scheduler rules", {"rules": "kube-scheduler 1.37 (incubating allocator)", "minor": 37,
                                                      "previous": "kube-scheduler 1.38 (stable allocator)",
                                                      "kubernetes": "v1.37.2", "choice": "auto"})]  # fmt: skip
    # The control plane is upgraded: seen at the next due read, not before.
    version.text = "v1.38.0"
    assert source.refresh() == SchedulerRules(37) and version.reads == 1
    clock.advance(REFRESH_SECONDS)
    assert source.refresh() == SchedulerRules(38) and version.reads == 2
    assert log.lines[-1][2]["rules"] == "kube-scheduler 1.38 (stable allocator)"
    clock.advance(REFRESH_SECONDS)
    source.refresh()
    assert len(log.lines) == 2  # unchanged: nothing logged


def test_auto_on_an_unknown_version_warns_once() -> None:
    clock, log = FakeClock(), Log()
    source = RulesSource("auto", Version("v1.41.0"), clock, log)
    for _ in range(3):
        assert source.refresh(force=True) == SchedulerRules(38)
    warnings = [line for line in log.lines if line[0] == "warning"]
    reason = "Kubernetes v1.41.0 is newer than the engine knows: deciding as kube-scheduler 1.38 (stable allocator)"
    assert warnings == [("warning", "scheduler rules guessed", {"reason": reason})]
    old = RulesSource("auto", Version("v1.35.4"), clock, Log())
    assert old.refresh() == SchedulerRules(36)
    down = RulesSource("auto", Version("unreachable"), clock, Log())
    assert down.refresh() == SchedulerRules()  # the rules in force stay


def test_named_rules_never_read_the_version() -> None:
    version = Version("v1.38.0")
    source = RulesSource("1.36", version, FakeClock(), Log())
    assert source.refresh(force=True) == SchedulerRules(36) and version.reads == 0


def test_the_flag_and_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    def parse(*argv: str) -> str:
        parser = argparse.ArgumentParser()
        add_controller_arguments(parser)
        return controller_settings(parser.parse_args(list(argv))).scheduler_rules

    assert parse() == "auto"
    assert parse("--scheduler-rules", "1.37") == "1.37"
    monkeypatch.setenv("SCHEDULER_RULES", "1.36")
    assert parse() == "1.36"
    with pytest.raises(SystemExit):
        parse("--scheduler-rules", "1.35")


def test_the_controller_explains_with_the_clusters_rules() -> None:
    # A claim holding a negative consumedCapacity stops every allocation on 1.38, not on 1.37;
    # the explanation names that claim.
    kube = cluster(gpus=2)
    fence_policy(kube)
    broken = claim("broken")
    broken["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0", "shareID": "s",
         "consumedCapacity": {"memory": "-1Gi"}}]}}}  # fmt: skip
    add_claim(kube, broken)
    add_claim(kube, claim("c1", count=2))
    add_pod(kube, pod("p", "c1"))
    version = Version("v1.37.2")
    clock = FakeClock()
    ctrl = Controller(kube, settings(), clock=clock, sleep=lambda _s: None, server_version=version)
    ctrl.resync()
    step(ctrl)
    assert EXPLANATION_ANNOTATION not in ann(kube)  # 1.37: satisfiable, gpu-0 and gpu-1
    version.text = "v1.38.0"
    clock.advance(REFRESH_SECONDS)
    ctrl.resync()
    step(ctrl)
    a = ann(kube)
    assert "default/broken" in a[SUMMARY_ANNOTATION], a
    doc = json.loads(a[EXPLANATION_ANNOTATION])
    assert "must not be negative" in json.dumps(doc)
