"""Whether a node's devices are published at all (dra_driver.node.publish.gate)."""

from __future__ import annotations

from typing import Any

from dra_driver.node.publish import gate


def node(capacity: dict[str, str], allocatable: dict[str, str] | None = None) -> dict[str, Any]:
    return {"status": {"capacity": capacity, "allocatable": capacity if allocatable is None else allocatable}}


def test_the_device_plugins_resources_are_found_in_capacity_or_allocatable() -> None:
    assert gate.device_plugin_resources(node({"cpu": "8", "nvidia.com/gpu": "8"})) == ["nvidia.com/gpu"]
    assert gate.device_plugin_resources(node({}, {"nvidia.com/mig-1g.10gb": "7"})) == ["nvidia.com/mig-1g.10gb"]
    # Zero is what a device plugin that went away leaves behind; another vendor's GPUs are not ours.
    assert gate.device_plugin_resources(node({"nvidia.com/gpu": "0", "amd.com/gpu": "2"})) == []
    # Time-slicing with renameByDefault advertises only the renamed name: still the same GPUs.
    assert gate.device_plugin_resources(node({"nvidia.com/gpu.shared": "32"})) == ["nvidia.com/gpu.shared"]
    # NVIDIA's network operator's RDMA and SR-IOV resources are not GPUs.
    assert gate.device_plugin_resources(node({"nvidia.com/rdma_shared_device_a": "63", "nvidia.com/hostdev": "2",
                                              "nvidia.com/gpus": "1"})) == []
    assert gate.device_plugin_resources({}) == [] and gate.device_plugin_closed({"status": None}, "n") is None
    closed = gate.device_plugin_closed(node({"nvidia.com/gpu": "1", "nvidia.com/mig-2g.20gb": "3"}), "gpu-7")
    assert closed is not None and closed.reason == gate.DEVICE_PLUGIN
    assert "node gpu-7 advertises nvidia.com/gpu, nvidia.com/mig-2g.20gb" in closed.message


def test_the_gate_passes_devices_while_open_and_nothing_while_closed() -> None:
    sent: list[list[Any]] = []
    changes: list[tuple[str | None, str | None]] = []
    g = gate.PublishGate(lambda devices, counters: sent.append(list(devices)),
                         lambda old, new: changes.append((old and old.reason, new and new.reason)))
    g.update([{"name": "gpu-0"}])
    assert sent == [], "nothing before the first decision"
    closed = gate.device_plugin_closed(node({"nvidia.com/gpu": "1"}), "n")
    g.decide(closed)
    assert sent == [[]] and g.closed == closed
    g.update([{"name": "gpu-0", "taints": []}])
    g.decide(closed)  # the same decision again: nothing new sent or said
    assert sent == [[], []] and changes == [(None, "device_plugin")]
    g.decide(None)
    assert sent[-1] == [{"name": "gpu-0", "taints": []}] and changes[-1] == ("device_plugin", None)
    g.update([{"name": "gpu-1"}])
    assert sent[-1] == [{"name": "gpu-1"}]


def test_the_first_decision_publishes_even_when_open() -> None:
    sent: list[list[Any]] = []
    g = gate.PublishGate(lambda devices, counters: sent.append(list(devices)), lambda old, new: None)
    g.update([{"name": "gpu-0"}])
    g.decide(None)
    assert sent == [[{"name": "gpu-0"}]] and g.closed is None
