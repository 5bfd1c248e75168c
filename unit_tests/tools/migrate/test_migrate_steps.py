"""The steps that move a node from the device plugin to this driver."""

from __future__ import annotations

from migfix import DRIVER, pod

from dra_driver.tools.migrate.config import parse_config
from dra_driver.tools.migrate.steps import OPERATOR_LABEL, NodeState, fleet_steps, node_steps, pods_by_node


def test_a_device_plugin_node_in_order() -> None:
    config = parse_config("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 4}]}}\n", "shared")
    todo = node_steps(NodeState("n1", config, ("nvidia.com/gpu",), False, ("ml/a",)), DRIVER)
    assert todo[0] == "kubectl cordon n1"
    assert "ml/a" in todo[1] and "kubectl drain n1" in todo[1]
    assert "--consumable-shares=4" in todo[2]
    assert todo[3].startswith(f"kubectl label node n1 {OPERATOR_LABEL}=false --overwrite")
    assert "advertises none of nvidia.com/gpu" in todo[4]
    assert "spec.nodeName=n1" in todo[5] and todo[-1] == "kubectl uncordon n1"


def test_no_pods_no_drain_no_sharing_no_flag() -> None:
    todo = node_steps(NodeState("n1", parse_config("version: v1\n"), ("nvidia.com/gpu",), False), DRIVER)
    assert not any("drain" in s or "consumable" in s for s in todo)


def test_moved_and_silent_nodes() -> None:
    steps = fleet_steps([NodeState("b", None, (), True), NodeState("a", None, (), False)], DRIVER)
    assert list(steps) == ["a", "b"]
    assert steps["b"][0].startswith("already moved")
    assert "publishes nothing yet" in steps["a"][0]


def test_pods_by_node_reads_requests_and_limits() -> None:
    pods = [pod("a", {"nvidia.com/gpu": "1"}, node_name="n1"), pod("b", {"cpu": "1"}, node_name="n1"),
            pod("c", {"nvidia.com/gpu": "1"})]
    assert pods_by_node(pods, {"nvidia.com/gpu"}) == {"n1": ["ml/a"]}


def test_a_renamed_name_the_gate_does_not_see() -> None:
    todo = node_steps(NodeState("n1", None, ("nvidia.com/tesla-t4",), False), DRIVER)
    assert todo[1] == (f"keep {DRIVER}'s plugin off n1 until the device plugin is gone: its publish gate does not hold "
                       "back for nvidia.com/tesla-t4")
    # renameByDefault's nvidia.com/gpu.shared holds the gate: no such step.
    gated = node_steps(NodeState("n1", None, ("nvidia.com/gpu.shared",), False), DRIVER)
    assert not any("publish gate" in step for step in gated), gated
    warned = node_steps(NodeState("n1", None, ("nvidia.com/gpu.shared",), True), DRIVER)
    assert warned[0].startswith(f"WARNING: {DRIVER} already publishes the GPUs of n1")
