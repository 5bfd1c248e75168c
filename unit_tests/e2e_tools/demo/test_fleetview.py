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
    assert lines[1].split()[-2:] == ["allocated", "default/p1"], "the pod, not its claim"
    assert "shared (2 claims, 24Gi/80Gi)" in lines[2] and lines[2].endswith("ml/s1, ml/s2"), "claims without pods"
    assert "tainted (NoSchedule)" in lines[3] and "H100 80GB HBM3" in lines[3] and "NVIDIA" not in lines[3]
    assert "withheld (attributes: too many (rule maxAttributes))" in lines[4]
    assert lines[-1] == "... and 3 free devices not shown (node-a 1, node-b 2): kubectl dra get gpus --free"


def test_long_names_fit_120_columns_and_pod_names_give_way_last() -> None:
    pod = "demo-1-two-pods-distinct-gpus/two-pods-distinct-gpus-1"
    held = {"devices": [{"node": "gpu-node-2", "device": "gpu-0-mig-1-0", "model": "NVIDIA A100-SXM4-40GB",
                         "migProfile": "1g.5gb", "state": "shared", "detail": "3 claims, 24Gi/40Gi",
                         "holders": [{"claim": "a/b", "pods": [pod]}]}]}
    header, row = gpus_excerpt(held)
    assert max(len(header), len(row)) <= 120 and row.startswith("gpu-node-2  gpu-0-mig-1-0  A100")
    assert row.endswith(pod) and "shared (3" in row, "the state gives way before the pod"


def test_all_free_is_one_line_and_nothing_free_has_no_count() -> None:
    kube = FakeKube()
    kube.add(SLICES, node_slice("n", [gpu("gpu-0"), gpu("gpu-1")]))
    kube.add(DEVICE_CLASSES, device_class())
    assert gpus_excerpt(fleet_report("get", "gpus", "-A", api=kube)) == [
        "... and 2 free devices not shown (n 2): kubectl dra get gpus --free"]
    assert gpus_excerpt({"devices": []}) == ["no devices"]
    held = {"devices": [{"node": "n", "device": "gpu-0", "model": H100, "state": "allocated",
                         "holders": [{"claim": "a/b", "pods": ["a/p"]}]}]}
    (header, row) = gpus_excerpt(held)
    assert row.endswith("a/p") and not any(line.startswith("...") for line in (header, row))


def test_top_is_printed_whole() -> None:
    lines = top_lines(fleet_report("top", api=fleet()))
    assert lines[0].startswith("MODEL") and any(line.startswith(H100) for line in lines)
    assert any(line.startswith("DEVICECLASS") for line in lines)
