"""`get gpus`, `get nodes` and `top` against a fake API server."""

from __future__ import annotations

import json

import yaml
from ctrlfix import allocated_status, claim
from fleetfix import A100, H100, devices, dynamic_mig, fleet, gpu, node_slice, one_line, run, shipped_classes
from kubefake import FakeKube

from dra_driver.k8s.client import DEVICE_CLASSES, EVENTS, SLICES, ApiError
from dra_driver.node.publish.health import TAINT_KEY
from e2e.generators.fleet import plugin_slices

# --- get gpus ------------------------------------------------------------------------------------


def test_each_device_has_its_state_and_holders() -> None:
    found = devices(fleet(), "-A")
    assert set(found) == {("node-a", f"gpu-{i}") for i in range(4)} | {("node-b", "gpu-0"), ("node-b", "gpu-1"),
                                                                         ("node-b", "gpu-7")}
    held = found[("node-a", "gpu-0")]
    assert held["state"] == "allocated" and held["model"] == H100 and held["memory"] == "80Gi"
    assert held["holders"] == [{"claim": "default/c1", "pods": ["default/p1"], "consumedCapacity": {}, "share": False,
                                "adminAccess": False}]
    shared = found[("node-a", "gpu-1")]
    assert shared["state"] == "shared" and shared["detail"] == "2 claims, 24Gi/80Gi"
    assert shared["capacityUsed"] == {"memory": {"used": "24Gi", "total": "80Gi"}}
    assert [(h["claim"], h["consumedCapacity"]) for h in shared["holders"]] == [
        ("ml/s1", {"memory": "16Gi"}), ("ml/s2", {"memory": "8Gi"})]
    tainted = found[("node-a", "gpu-2")]
    assert tainted["state"] == "tainted" and tainted["detail"] == "NoSchedule" and tainted["health"] == "unhealthy"
    assert tainted["taints"] == [f"{TAINT_KEY}=xid-79:NoSchedule"]
    assert found[("node-a", "gpu-3")]["state"] == "free"
    withheld = found[("node-b", "gpu-7")]
    assert withheld["state"] == "withheld" and withheld["detail"] == "attributes: too many (rule maxAttributes)"


def test_a_withheld_device_shows_the_model_its_event_names_and_another_drivers_is_not_shown() -> None:
    from dra_driver.allocator.devicestates import withheld_note

    kube = fleet()
    for name, device, driver in (("w2", "gpu-8", "gpu.dra-driver.io"), ("w3", "gpu-9", "gpu.nvidia.com")):
        kube.add(EVENTS, {"metadata": {"name": name, "namespace": "default"}, "reason": "DeviceWithheld",
                          "regarding": {"kind": "Node", "name": "node-b"},
                          "note": withheld_note(device, driver, "NVIDIA L4", "x: y (rule z)")})
    found = devices(kube, "-A")
    assert (found[("node-b", "gpu-8")]["state"], found[("node-b", "gpu-8")]["model"]) == ("withheld", "NVIDIA L4")
    assert found[("node-b", "gpu-7")]["model"] == ""  # its Event (an earlier plugin's) names no model
    assert ("node-b", "gpu-9") not in found


def test_the_text_names_claims_and_pods() -> None:
    rc, out, _ = run(fleet(), "get", "devices", "-A")
    lines = out.splitlines()
    assert rc == 0 and lines[0].split()[:3] == ["NODE", "DEVICE", "MODEL"]
    row = next(line for line in lines if line.startswith("node-a") and " gpu-0 " in line)
    assert "allocated" in row and "default/c1 (default/p1)" in row
    shared = next(line for line in lines if " gpu-1 " in line and line.startswith("node-a"))
    assert "shared (2 claims, 24Gi/80Gi)" in shared and "ml/s1 (no pod)" in shared


def test_pods_of_another_namespace_are_not_read_without_all_namespaces() -> None:
    rc, out, _ = run(fleet(), "get", "gpus", "-n", "ml")
    assert rc == 0 and "default/c1 (pods not read: another namespace)" in out
    found = devices(fleet(), "-n", "ml")
    assert found[("node-a", "gpu-0")]["holders"][0]["pods"] is None  # default/c1: namespace not read
    assert found[("node-a", "gpu-1")]["holders"][0]["pods"] == []


def test_a_forbidden_pod_list_hides_pod_names_but_not_claims() -> None:
    kube = fleet()
    kube.fail["list:pods"] = ApiError(403, "Forbidden", 'pods is forbidden: User "dev" cannot list resource "pods"')
    rc, out, _ = run(kube, "get", "gpus", "-A", "-o", "json")
    doc = json.loads(out)
    assert rc == 0 and "pods in every namespace" in doc["podsHidden"]
    held = next(d for d in doc["devices"] if d["state"] == "allocated")
    assert held["holders"][0]["claim"] == "default/c1" and held["holders"][0]["pods"] is None
    rc, out, _ = run(kube, "get", "gpus", "-A")
    assert "default/c1 (pods hidden)" in out and "pod names hidden: you may not list pods in every namespace" in out


def test_filters() -> None:
    kube = fleet()
    assert set(devices(kube, "--free")) == {("node-a", "gpu-3"), ("node-b", "gpu-0"), ("node-b", "gpu-1")}
    assert set(devices(kube, "--model", "a100", "--node", "node-b")) == {("node-b", "gpu-0"), ("node-b", "gpu-1")}
    big = 'device.capacity["gpu.dra-driver.io"].memory.compareTo(quantity("50Gi")) >= 0'
    assert set(devices(kube, "--selector", big)) == {("node-a", f"gpu-{i}") for i in range(4)}
    assert set(devices(kube, "-l", 'device.attributes["gpu.dra-driver.io"].productName.startsWith("NVIDIA A")')) == {
        ("node-b", "gpu-0"), ("node-b", "gpu-1")}


def test_a_selector_failing_on_devices_says_so() -> None:
    rc, out, _ = run(fleet(), "get", "gpus", "-o", "json", "--selector", 'device.attributes["x.io"].nope == 1')
    doc = json.loads(out)
    assert rc == 0 and doc["devices"] == [] and doc["selectorErrors"][0].startswith("6 device(s): ")


def test_an_invalid_selector_is_one_line_naming_it_and_where() -> None:
    err = one_line(run(fleet(), "get", "gpus", "--selector", "device.driver =="))
    assert err == ("kubectl dra get: invalid --selector 'device.driver ==': compilation failed: unexpected "
                   "'end of input' at offset 16")


def test_dynamic_mig_shows_what_a_gpu_can_still_be_cut_into() -> None:
    kube = dynamic_mig()
    found = devices(kube)
    assert found[("gpu-node-1", "gpu-0-mig-3g40gb-0")]["state"] == "allocated"
    assert found[("gpu-node-1", "gpu-0-mig-3g40gb-0")]["parent"] == "gpu-0"
    gpu0 = found[("gpu-node-1", "gpu-0")]
    assert gpu0["state"] == "blocked" and gpu0["detail"] == "counters taken by gpu-0-mig-3g40gb-0"
    assert gpu0["canMake"] == {"1g.10gb": 3, "1g.20gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert found[("gpu-node-1", "gpu-1")]["canMake"]["7g.80gb"] == 1
    assert ("gpu-node-1", "gpu-1-mig-1g10gb-0") not in found
    assert ("gpu-node-1", "gpu-1-mig-1g10gb-0") in devices(kube, "--partitions")


# --- get nodes, top ------------------------------------------------------------------------------


def test_get_nodes() -> None:
    rc, out, _ = run(fleet(), "get", "nodes", "-o", "json")
    nodes = {n["node"]: n for n in json.loads(out)["nodes"]}
    assert rc == 0 and set(nodes) == {"node-a", "node-b"}
    assert nodes["node-a"]["gpus"] == {H100: {"total": 4, "free": 1}}
    assert nodes["node-a"]["sharesInUse"] == 2 and nodes["node-a"]["taints"] == {f"{TAINT_KEY}=xid-79:NoSchedule": 1}
    assert nodes["node-b"]["withheld"] == [{"device": "gpu-7", "rule": "attributes: too many (rule maxAttributes)"}]
    rc, out, _ = run(fleet(), "get", "nodes")
    assert rc == 0 and f"{H100} 1/4 free" in out


def test_top_by_model_and_class() -> None:
    rc, out, _ = run(fleet(), "top", "-o", "json")
    doc = json.loads(out)
    models = {m["model"]: m for m in doc["models"]}
    assert rc == 0 and models[H100] == {"model": H100, "total": 4, "allocated": 1, "shared": 1, "free": 1,
                                        "unhealthy": 1, "nodesAllFree": 0}
    assert models[A100]["nodesAllFree"] == 1 and models[A100]["free"] == 2
    assert doc["deviceClasses"] == [{"deviceClass": "gpu.dra-driver.io", "total": 6, "allocated": 1, "shared": 1,
                                     "free": 3, "unhealthy": 1, "nodesAllFree": 1}]
    assert doc["withheld"] == 1 and "Other" not in models
    rc, out, _ = run(fleet(), "top")
    assert rc == 0 and out.startswith("MODEL") and "DEVICECLASS" in out


def test_withheld_devices_unknown_when_events_are_forbidden() -> None:
    kube = fleet()
    kube.fail["list:events"] = ApiError(403, "Forbidden", "events is forbidden")
    rc, out, _ = run(kube, "get", "gpus", "-o", "json")
    doc = json.loads(out)
    assert rc == 0 and doc["withheldUnknown"] == "you may not list Events in namespace default (Forbidden)"
    assert all(d["state"] != "withheld" for d in doc["devices"])


def test_a_server_refusing_the_events_field_selector_is_asked_for_all_of_them() -> None:
    kube = fleet()

    def refuse(*_: object) -> None:
        raise ApiError(400, "BadRequest", 'field label not supported: reason')

    kube.hooks["list:events"] = refuse  # once: the second list goes through
    assert devices(kube)[("node-b", "gpu-7")]["state"] == "withheld"


def test_wide_and_yaml() -> None:
    rc, out, _ = run(fleet(), "get", "gpus", "-o", "wide", "--node", "node-a")
    header, *rows = out.splitlines()
    assert rc == 0 and header.split()[-5:] == ["POOL", "CAN", "MAKE", "CAPACITY", "USED"]
    assert any("memory 24Gi/80Gi" in r for r in rows)
    rc, out, _ = run(fleet(), "top", "-o", "yaml")
    assert rc == 0 and yaml.safe_load(out)["kind"] == "GpuTop"
    rc, out, _ = run(fleet(), "get", "nodes", "-o", "wide")
    assert rc == 0 and "gpu-7 (attributes: too many (rule maxAttributes))" in out


def test_a_class_whose_selector_does_not_compile_selects_nothing() -> None:
    kube = fleet()
    kube.add(DEVICE_CLASSES, {"metadata": {"name": "broken"}, "spec": {"selectors": [{"cel": {"expression": "device."}}]}})
    rc, out, _ = run(kube, "top", "-o", "json")
    assert rc == 0 and [c["deviceClass"] for c in json.loads(out)["deviceClasses"]] == ["gpu.dra-driver.io"]


def test_rows_are_in_node_and_device_order_numbers_by_value() -> None:
    kube = FakeKube()
    kube.add(SLICES, node_slice("node-a", [gpu(f"gpu-{i}") for i in (10, 2, 1)]))
    kube.add(EVENTS, {"metadata": {"name": "w", "namespace": "default"}, "reason": "DeviceWithheld",
                      "regarding": {"kind": "Node", "name": "node-a"},
                      "note": "device gpu-3 is not published, the node's other devices are: the API server would "
                              "refuse it: x (rule y)"})
    assert [d for _, d in devices(kube)] == ["gpu-1", "gpu-2", "gpu-3", "gpu-10"]



# --- CEL once per group of devices, as device by device ------------------------------------------


def test_selectors_and_classes_decide_per_group_as_per_device() -> None:
    from dra_driver.allocator.cel.compile import compile_selector
    from dra_driver.allocator.groups import outcome
    from dra_driver.allocator.inventory import build_inventory
    from dra_driver.allocator.rules import SchedulerRules
    from dra_driver.controller.views import slice_view
    from dra_driver.tools.fleet.selects import outcomes
    from dra_driver.tools.fleet.top import class_selects

    view = slice_view()
    inventory = build_inventory([view(s) for s in plugin_slices(4, mig_nodes=2)])
    classes = shipped_classes()
    rules = SchedulerRules.for_version("v1.37.2")
    expressions = ['device.attributes["gpu.dra-driver.io"].profile.startsWith("1g.")',  # a CEL error on GPUs
                   'device.capacity["gpu.dra-driver.io"].memory.compareTo(quantity("40Gi")) >= 0', "device.driver != ''"]
    for expression in expressions:
        compiled = compile_selector(expression)
        of = outcomes(compiled, inventory, rules)
        for dev in inventory.devices:
            want = outcome(compiled, dev, rules.qualified_names, rules.cel_converts_on_read)
            got = of(dev)
            assert type(got) is type(want) and (got == want if isinstance(want, bool) else got.message == want.message)
    chosen = 0
    for cls in classes:
        selects = class_selects(cls, inventory, rules)
        exprs = [s["cel"]["expression"] for s in cls["spec"].get("selectors", [])]
        picked = [d.key for d in inventory.devices if selects(d)]
        assert picked == [d.key for d in inventory.devices
                          if all(outcome(compile_selector(e), d, rules.qualified_names) is True for e in exprs)]
        chosen += len(picked)
    assert chosen > len(inventory.devices) / 2


def test_rows_without_placements_are_those_rows_less_the_placements() -> None:
    from dra_driver.allocator.devicestates import Withheld, is_placement
    from dra_driver.allocator.inventory import build_inventory
    from dra_driver.controller.views import slice_view
    from dra_driver.tools.fleet.devices import device_rows, row_document
    from dra_driver.tools.fleet.reads import FleetObjects

    view = slice_view()
    slices = [view(s) for s in plugin_slices(3, mig_nodes=2)]
    part = claim("mig")
    part["status"] = allocated_status(["gpu-0-mig-3g40gb-0", "gpu-1-mig-1g10gb-2"], node="gpu-node-1")
    whole = claim("whole")
    whole["status"] = allocated_status(["gpu-3"], node="gpu-node-3")
    withheld = [Withheld("gpu-node-1", "gpu-2-mig-1g10gb-0", "published"), Withheld("gpu-node-3", "gpu-9", "r")]
    fleet_objects = FleetObjects(slices=slices, classes=[], claims=[part, whole], pods=[], namespace=None,
                                 withheld=withheld)
    inventory = build_inventory(slices)
    every = device_rows(fleet_objects, inventory, driver="gpu.dra-driver.io")
    kept = device_rows(fleet_objects, inventory, driver="gpu.dra-driver.io", placements=False)
    assert len(kept) < len(every) and any(r.can_make for r in kept) and kept[-1].state == "withheld"
    assert [row_document(r) for r in kept] == [row_document(r) for r in every
                                               if r.source is None or not is_placement(r.source)]
