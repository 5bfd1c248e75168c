"""The demo's fleet excerpt: `get gpus` cut to the devices that are not free, and a count of the
free ones per node; `top` whole. Run against the fleet commands' fake cluster."""

from __future__ import annotations

from ctrlfix import device_class
from fleetfix import H100, fleet, gpu, node_slice
from kubefake import FakeKube

from dra_driver.k8s.client import DEVICE_CLASSES, SLICES
from e2e.demo.fleetview import fleet_report, gpus_excerpt, top_lines


def test_only_the_devices_not_free_and_a_count_of_the_free_ones() -> None:
    report = fleet_report("get", "gpus", "-A", api=fleet())
    lines = gpus_excerpt(report)
    assert lines[0].split()[:3] == ["NODE", "DEVICE", "MODEL"]
    rows = [line.split()[:2] for line in lines[1:-1]]
    assert rows == [["node-a", "gpu-0"], ["node-a", "gpu-1"], ["node-a", "gpu-2"], ["node-b", "gpu-7"]]
    assert "default/c1 (default/p1)" in lines[1] and "shared (2 claims, 24Gi/80Gi)" in lines[2]
    assert "withheld" in lines[4]
    assert lines[-1] == "... and 3 free devices not shown (node-a 1, node-b 2): kubectl dra get gpus --free"


def test_all_free_is_one_line_and_nothing_free_has_no_count() -> None:
    kube = FakeKube()
    kube.add(SLICES, node_slice("n", [gpu("gpu-0"), gpu("gpu-1")]))
    kube.add(DEVICE_CLASSES, device_class())
    assert gpus_excerpt(fleet_report("get", "gpus", "-A", api=kube)) == [
        "... and 2 free devices not shown (n 2): kubectl dra get gpus --free"]
    assert gpus_excerpt({"devices": []}) == ["no devices"]
    held = {"devices": [{"node": "n", "device": "gpu-0", "model": H100, "memory": "80Gi", "state": "allocated",
                         "holders": [{"claim": "a/b", "pods": ["a/p"]}]}]}
    (header, row) = gpus_excerpt(held)
    assert "a/b (a/p)" in row and not any(line.startswith("...") for line in (header, row))


def test_top_is_printed_whole() -> None:
    lines = top_lines(fleet_report("top", api=fleet()))
    assert lines[0].startswith("MODEL") and any(line.startswith(H100) for line in lines)
    assert any(line.startswith("DEVICECLASS") for line in lines)
