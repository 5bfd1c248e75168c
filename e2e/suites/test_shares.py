"""Sharing a GPU the DRA way, as a user runs it: the examples of deploy/examples on the bed.

The bed's plugins start without --consumable-shares and --dynamic-mig (the chart's defaults), so
these tests restart gpu-node-1's plugin with the flag an example needs and restore it afterwards.
Each test waits until its namespace is gone, so that the next one finds the GPUs as they were.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.k8s.quantity import parse_quantity
from dra_driver.node.describe.shares import parse_consumable_shares, shared_capacity
from dra_driver.node.discovery.select import SIMULATED_STATE_FILE
from e2e.suites.reliability import plugin_name, restart_plugin_clean
from e2e.testbed.clusterview import (
    DRIVER,
    Bed,
    allocated,
    attr,
    claim_of,
    example,
    names_of,
    observed,
    slice_devices,
    wait_for,
    wait_running,
)
from e2e.testbed.standins import install as standin_tools

NODE = "gpu-node-1"  # h100-8x: 81559Mi per GPU, MIG-capable with a profile catalogue
pytestmark = pytest.mark.testbed_only


def node_devices(bed: Bed) -> dict[str, dict[str, Any]]:
    return {name: d for (pool, name), d in slice_devices(bed).items() if pool == NODE}


def restart_with(bed: Bed, flags: tuple[str, ...], published: Any, what: str) -> None:
    restart_plugin_clean(bed, NODE, flags)
    wait_for(what, lambda: published(node_devices(bed)), 90)


def shareable(devices: dict[str, dict[str, Any]]) -> bool:
    return bool(devices) and all(d.get("allowMultipleAllocations") for d in devices.values())


def plain(devices: dict[str, dict[str, Any]]) -> bool:
    return set(devices) == {f"gpu-{i}" for i in range(8)} and not any(d.get("allowMultipleAllocations") for d in devices.values())


@pytest.fixture()
def clean_ns(bed: Bed) -> Iterator[str]:
    """A namespace that is deleted, and waited for, at the end: its claims must not hold GPUs of
    the next test."""
    name = f"e2e-{secrets.token_hex(3)}"
    bed.kubectl("create", "namespace", name)
    wait_for(f"default ServiceAccount in {name}",
             lambda: bed.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0)
    yield name
    bed.kubectl("delete", "namespace", name, "--wait=true", "--timeout=180s", check=False, timeout=200)


@pytest.fixture(scope="module")
def shares_on(bed: Bed) -> Iterator[None]:
    restart_with(bed, ("--consumable-shares=memory",), shareable, f"{NODE}'s GPUs published as shareable")
    try:
        yield
    finally:
        restart_with(bed, (), plain, f"{NODE}'s GPUs published without shares again")


@pytest.mark.parametrize(("node", "flag"), [(NODE, "unlimited"), (NODE, "4"), ("gpu-node-2", "memory")])
def test_every_mode_is_published_as_the_api_server_validated_it(bed: Bed, node: str, flag: str) -> None:
    """The API server validates request policies; what it stored must be what the plugin meant."""
    shares = parse_consumable_shares(flag)

    def devices() -> dict[str, dict[str, Any]]:
        return {name: d for (pool, name), d in slice_devices(bed).items() if pool == node}

    def published(found: dict[str, dict[str, Any]]) -> bool:
        return bool(found) and all(d.get("allowMultipleAllocations") for d in found.values())

    restart_plugin_clean(bed, node, (f"--consumable-shares={flag}",))
    try:
        found = wait_for(f"{node}'s devices published with --consumable-shares={flag}",
                         lambda: (d := devices()) and published(d) and d, 90)
        for name, device in found.items():
            memory = parse_quantity(device["capacity"]["memory"]["value"]).as_integer()
            sms = parse_quantity(device["capacity"].get("multiprocessors", {}).get("value", "0")).as_integer()
            assert device["capacity"] == shared_capacity(memory, sms, shares), name
        kinds = {attr(d, "type") for d in found.values()}
        assert kinds == ({"gpu"} if node == NODE else {"gpu", "mig"}), kinds
    finally:
        restart_plugin_clean(bed, node)
        wait_for(f"{node}'s devices published without shares again",
                 lambda: (d := devices()) and not any(x.get("allowMultipleAllocations") for x in d.values()), 90)


def controller_counts(bed: Bed) -> tuple[float, float]:
    """The claims holding shares of H100s, and the H100s shared, as the controller's /metrics says."""
    with urllib.request.urlopen(f"http://127.0.0.1:{bed.fleet.controller_port}/metrics", timeout=10) as resp:
        families = text_string_to_metric_families(resp.read().decode())
    found = [(s.name, s.labels, s.value) for fam in families for s in fam.samples]
    shares = sum(v for n, lbl, v in found if n == "dra_driver_controller_device_shares" and "H100" in lbl["model"])
    shared = sum(v for n, lbl, v in found if n == "dra_driver_controller_devices" and "H100" in lbl["model"]
                 and lbl["state"] == "shared")
    return shares, shared


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = claim["status"]["allocation"]["devices"]["results"]
    return found


def env_by_request(env: dict[str, str]) -> dict[str, dict[str, str]]:
    """DRA_GPU_<i>_* variables grouped by the device's request."""
    out: dict[str, dict[str, str]] = {}
    for i in range(int(env["DRA_GPU_COUNT"])):
        prefix = f"DRA_GPU_{i}_"
        values = {k.removeprefix(prefix): v for k, v in env.items() if k.startswith(prefix)}
        out[values["REQUEST"]] = values
    return out


def test_memory_share_two_pods_on_one_gpu_third_on_another(bed: Bed, clean_ns: str, shares_on: None) -> None:
    docs = example("memory-share")
    bed.apply(docs, ns=clean_ns)
    pods = names_of(docs, "Pod")
    placed: dict[str, tuple[str, str]] = {}
    share_ids = set()
    for pod in pods:
        wait_running(bed, clean_ns, pod, timeout=180)
        claim = claim_of(bed, clean_ns, pod, "gpu")
        (result,) = results(claim)
        assert result["consumedCapacity"] == {"memory": "30Gi", "multiprocessors": "0"}, result
        assert result.get("shareID"), f"{pod}: no shareID in {result}"
        share_ids.add(result["shareID"])
        (device,) = allocated(bed, claim)
        assert "H100" in attr(device, "productName") and device.get("allowMultipleAllocations") is True
        placed[pod] = (result["pool"], result["device"])
        env = observed(bed, clean_ns, pod)["ctr0"]["env"]
        assert env["NVIDIA_VISIBLE_DEVICES"] == attr(device, "uuid"), env
        assert env["DRA_GPU_0_DEVICE"] == result["device"]
        assert env["DRA_GPU_0_SHARE_ID"] == result["shareID"]
        assert env["DRA_GPU_0_MEMORY_SHARE"] == "30Gi"
        assert env["DRA_GPU_0_MEMORY_SHARE_BYTES"] == str(30 * 2**30)
    assert len(share_ids) == 3
    # 2 x 30Gi fit in 81559Mi, a third does not: two pods on one GPU, the third on another.
    assert sorted(Counter(placed.values()).values()) == [1, 2], placed
    # The dashboard's "Shares in use" (the controller's count at its 5 s resync): three claims
    # hold shares of two H100s.
    wait_for("the controller counting the shares", lambda: controller_counts(bed) == (3, 2), 30)
    print(f"\nmemory-share placement: {placed}")


def test_init_container_and_container_share_one_gpu(bed: Bed, clean_ns: str, shares_on: None) -> None:
    docs = example("init-container-share")
    bed.apply(docs, ns=clean_ns)
    (pod,) = names_of(docs, "Pod")
    wait_running(bed, clean_ns, pod, timeout=180)
    claim = claim_of(bed, clean_ns, pod, "gpu")
    (result,) = results(claim)
    assert result["consumedCapacity"] == {"memory": "10Gi", "multiprocessors": "0"} and result.get("shareID")
    (device,) = allocated(bed, claim)
    views = observed(bed, clean_ns, pod)
    assert set(views) == {"prepare", "main"}
    for name, view in views.items():
        env = view["env"]
        assert env["NVIDIA_VISIBLE_DEVICES"] == attr(device, "uuid"), (name, env)
        assert env["DRA_GPU_0_SHARE_ID"] == result["shareID"], (name, env)
        assert env["DRA_GPU_0_MEMORY_SHARE"] == "10Gi", (name, env)
        assert f"/dev/nvidia{attr(device, 'minor')}" in {d["path"] for d in view["devices"]}, name


def test_one_container_two_requests(bed: Bed, clean_ns: str, shares_on: None) -> None:
    docs = example("two-requests")
    bed.apply(docs, ns=clean_ns)
    (pod,) = names_of(docs, "Pod")
    wait_running(bed, clean_ns, pod, timeout=180)
    claim = claim_of(bed, clean_ns, pod, "gpus")
    by_request = {r["request"]: r for r in results(claim)}
    assert set(by_request) == {"big", "small"}
    assert by_request["big"]["consumedCapacity"] == {"memory": "40Gi", "multiprocessors": "0"}
    assert by_request["small"]["consumedCapacity"] == {"memory": "10Gi", "multiprocessors": "0"}
    env = observed(bed, clean_ns, pod)["ctr0"]["env"]
    assert env["DRA_GPU_COUNT"] == "2", env
    seen = env_by_request(env)
    for request, memory in (("big", "40Gi"), ("small", "10Gi")):
        assert seen[request]["DEVICE"] == by_request[request]["device"]
        assert seen[request]["SHARE_ID"] == by_request[request]["shareID"]
        assert seen[request]["MEMORY_SHARE"] == memory
    uuids = {attr(d, "uuid") for d in allocated(bed, claim)}
    assert set(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == uuids
    same = by_request["big"]["device"] == by_request["small"]["device"]
    print(f"\ntwo-requests: big on {by_request['big']['device']}, small on {by_request['small']['device']}"
          f" ({'two shares of one GPU' if same else 'two GPUs'})")


def time_sliced(ns: str, pods: int) -> list[dict[str, Any]]:
    """A template for a 30Gi share of the GPU with minor 0 time-sliced with interval Long, and pods using it."""
    template = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "ts-long"},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "shared-gpu.gpu.dra-driver.io", "capacity": {"requests": {"memory": "30Gi"}},
                "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].minor == 0'}}]}}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": "gpu.dra-driver.io/v1alpha1", "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}}}}]}}},
    }
    docs: list[dict[str, Any]] = [template]
    for i in range(pods):
        docs.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"ts-{i}", "namespace": ns},
                     "spec": {"terminationGracePeriodSeconds": 1,
                              "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "ts-long"}],
                              "containers": [{"name": "ctr0", "image": "busybox:1.36", "command": ["sleep", "86400"],
                                              "resources": {"claims": [{"name": "gpu"}]}}]}})
    return docs


def unprepared(bed: Bed, claim: str) -> bool:
    """Whether NODE's plugin log says it unprepared ``claim`` (namespace/name)."""
    for line in bed.plugin_log(NODE).splitlines():
        if '"unprepared claim"' in line and f'"claim": "{claim}"' in line.replace('":"', '": "'):
            return True
    return False


def test_two_time_sliced_claims_on_one_gpu_set_its_interval_once(bed: Bed, clean_ns: str) -> None:
    """The plugin programs the GPU through nvidia-smi (the stand-in of e2e/testbed/standins, which
    records each call): compute mode Default and time-slice 3 (Long) when the first claim is prepared,
    nothing for the second, the default put back after the last."""
    root = standin_tools.install(bed.fleet.nodes[NODE].root / "standin-driver-root")
    restart_with(bed, ("--consumable-shares=memory", f"--nvidia-driver-root={root}"), shareable,
                 f"{NODE}'s GPUs published as shareable")
    try:
        bed.apply(time_sliced(clean_ns, 2), ns=clean_ns)
        for pod in ("ts-0", "ts-1"):
            wait_running(bed, clean_ns, pod, timeout=180)
            assert observed(bed, clean_ns, pod)["ctr0"]["env"]["DRA_GPU_0_TIMESLICE_INTERVAL"] == "Long"
        (uuid,) = {attr(d, "uuid") for pod in ("ts-0", "ts-1") for d in allocated(bed, claim_of(bed, clean_ns, pod, "gpu"))}
        policy = [c for c in standin_tools.calls(root) if "--query-gpu=compute_mode" not in c]
        assert policy == [["-i", uuid, "-c", "DEFAULT"], ["compute-policy", "-i", uuid, "--set-timeslice=3"]], policy
        first = claim_of(bed, clean_ns, "ts-0", "gpu")["metadata"]["name"]
        bed.delete("pod", "ts-0", clean_ns)
        wait_for(f"{first} unprepared", lambda: unprepared(bed, f"{clean_ns}/{first}"), 60)
        assert standin_tools.gpus(root)[uuid]["timeslice"] == 3, "ts-1 still runs time-sliced"
        bed.delete("pod", "ts-1", clean_ns)
        wait_for("the GPU's time-slice back to its default after the last claim",
                 lambda: standin_tools.gpus(root)[uuid]["timeslice"] == 0, 60)
        resets = [c for c in standin_tools.calls(root) if c == ["compute-policy", "-i", uuid, "--set-timeslice=0"]]
        assert len(resets) == 1, standin_tools.calls(root)
    finally:
        restart_with(bed, (), plain, f"{NODE}'s GPUs published without shares again")


def mps_shares(ns: str, memories: list[str]) -> list[dict[str, Any]]:
    """A claim per pod, each a share of the GPU with minor 0 with MPS, of the memory given."""
    docs: list[dict[str, Any]] = []
    for i, memory in enumerate(memories):
        docs.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": f"mps-{i}"},
                     "spec": {"devices": {
                         "requests": [{"name": "gpu", "exactly": {
                             "deviceClassName": "shared-gpu.gpu.dra-driver.io",
                             "capacity": {"requests": {"memory": memory}},
                             "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].minor == 0'}}]}}],
                         "config": [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {
                             "apiVersion": "gpu.dra-driver.io/v1alpha1", "kind": "GpuConfig",
                             "sharing": {"strategy": "MPS"}}}}]}}})
        docs.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"mps-{i}", "namespace": ns},
                     "spec": {"terminationGracePeriodSeconds": 1,
                              "resourceClaims": [{"name": "gpu", "resourceClaimName": f"mps-{i}"}],
                              "containers": [{"name": "ctr0", "image": "busybox:1.36", "command": ["sleep", "86400"],
                                              "resources": {"claims": [{"name": "gpu"}]}}]}})
    return docs


def end_standin_daemons(state_dir: Path) -> None:
    """A failed test must not leave the stand-in's daemons behind (each wrote its pid)."""
    for pid_file in state_dir.glob("mps/*/pipe/nvidia-cuda-mps-control.pid"):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_mps_shares_of_three_claims_use_one_daemon_that_outlives_a_plugin_kill(bed: Bed, clean_ns: str) -> None:
    """Three MPS shares of one GPU: one control daemon (the stand-in of e2e/testbed/standins) with the
    GPU in Exclusive_Process, three clients whose CDI specs carry their memory limits and the daemon's
    directories; a SIGKILLed plugin comes back to the same daemon; the last unprepare stops it and puts
    the GPU back in Default."""
    node = bed.fleet.nodes[NODE]
    root = standin_tools.install(node.root / "standin-driver-root")
    flags = ("--consumable-shares=memory", f"--nvidia-driver-root={root}")
    restart_with(bed, flags, shareable, f"{NODE}'s GPUs published as shareable")
    try:
        bed.apply(mps_shares(clean_ns, ["10Gi", "20Gi", "30Gi"]), ns=clean_ns)
        for i, memory in enumerate(("10Gi", "20Gi", "30Gi")):
            wait_running(bed, clean_ns, f"mps-{i}", timeout=180)
            env = observed(bed, clean_ns, f"mps-{i}")["ctr0"]["env"]
            assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={parse_quantity(memory).as_integer() // 2**20}M", env
            assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps" and env["CUDA_MPS_LOG_DIRECTORY"], env
        (uuid,) = {attr(d, "uuid") for i in range(3) for d in allocated(bed, claim_of(bed, clean_ns, f"mps-{i}", "gpu"))}
        starts = [c for c in standin_tools.mps_calls(root) if c.get("args") == ["-d"]]
        assert len(starts) == 1 and starts[0]["visible"] == uuid, starts
        assert standin_tools.gpus(root)[uuid]["computeMode"] == "Exclusive_Process"
        daemons = {c["daemon"] for c in standin_tools.mps_calls(root) if "daemon" in c}
        assert len(daemons) == 1, daemons
        assert "set_default_device_pinned_mem_limit 0 10240M" in {
            c["command"] for c in standin_tools.mps_calls(root) if "daemon" in c}
        bed.fleet.procs.kill(plugin_name(NODE), signal.SIGKILL)
        restart_with(bed, flags, shareable, f"{NODE}'s plugin serving again after a SIGKILL")
        starts = [c for c in standin_tools.mps_calls(root) if c.get("args") == ["-d"]]
        assert len(starts) == 1, f"the restarted plugin started a second daemon: {starts}"
        for i in range(3):
            bed.delete("pod", f"mps-{i}", clean_ns)
            bed.delete("resourceclaim", f"mps-{i}", clean_ns)
        wait_for("the daemon stopped and the GPU back in Default after the last claim",
                 lambda: standin_tools.gpus(root)[uuid]["computeMode"] == "Default", 90)
        assert [c["command"] for c in standin_tools.mps_calls(root) if "daemon" in c][-1] == "quit"
        assert not (node.state_dir / "mps" / uuid).exists()
    finally:
        end_standin_daemons(node.state_dir)
        restart_with(bed, (), plain, f"{NODE}'s GPUs published without shares again")


def test_dynamic_mig_partitions_then_whole_gpu_waits(bed: Bed, clean_ns: str) -> None:
    def catalogue(devices: dict[str, dict[str, Any]]) -> bool:
        return "gpu-0-mig-3g40gb-4" in devices and "gpu-0" in devices

    restart_with(bed, ("--dynamic-mig",), catalogue, f"{NODE}'s dynamic-MIG catalogue")
    try:
        docs = example("dynamic-mig")
        partitions_pod, whole_pod = names_of(docs, "Pod")
        bed.apply([d for d in docs if d["metadata"]["name"] == "dynamic-mig-partitions"], ns=clean_ns)
        wait_running(bed, clean_ns, partitions_pod, timeout=180)
        claim = bed.get("resourceclaim", "dynamic-mig-partitions", clean_ns)
        devices = allocated(bed, claim)
        profiles = sorted(str(attr(d, "profile")) for d in devices)
        assert [p.split(".")[0] for p in profiles] == ["1g", "1g", "3g"], profiles
        assert {r["pool"] for r in results(claim)} == {NODE}
        assert {attr(d, "parentIndex") for d in devices} == {0} and len({attr(d, "parentUUID") for d in devices}) == 1
        view = observed(bed, clean_ns, partitions_pod)["ctr0"]
        migs = view["env"]["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert len(migs) == 3 and all(u.startswith("MIG-") for u in migs), view["env"]
        assert any(d["path"].startswith("/dev/nvidia-caps/") for d in view["devices"]), view["devices"]

        bed.apply([d for d in docs if d["metadata"]["name"] == "dynamic-mig-whole-gpu"], ns=clean_ns)
        time.sleep(10)  # the scheduler has had its chances
        assert not bed.get("resourceclaim", "dynamic-mig-whole-gpu", clean_ns).get("status", {}).get("allocation")
        assert bed.get("pod", whole_pod, clean_ns)["status"].get("phase") == "Pending"

        started = time.monotonic()
        bed.delete("pod", partitions_pod, clean_ns)
        bed.delete("resourceclaim", "dynamic-mig-partitions", clean_ns)
        wait_running(bed, clean_ns, whole_pod, timeout=180)
        (result,) = results(bed.get("resourceclaim", "dynamic-mig-whole-gpu", clean_ns))
        assert (result["pool"], result["device"]) == (NODE, "gpu-0")
        print(f"\ndynamic-mig: partitions {profiles}; whole GPU running {time.monotonic() - started:.1f}s after release")
    finally:
        bed.kubectl("delete", "pod", "--all", "-n", clean_ns, "--wait=true", "--timeout=120s", check=False, timeout=150)
        bed.kubectl("delete", "resourceclaim", "--all", "-n", clean_ns, "--wait=true", "--timeout=120s", check=False,
                    timeout=150)
        # Creating partitions put GPU 0 in MIG mode, and a GPU stays in it (a real one until an admin
        # runs nvidia-smi -mig 0): reset the simulated GPUs so that the next tests find them as before.
        bed.fleet.procs.stop(plugin_name(NODE))
        (bed.fleet.nodes[NODE].state_dir / SIMULATED_STATE_FILE).unlink(missing_ok=True)
        restart_with(bed, (), plain, f"{NODE}'s GPUs published without dynamic MIG again")


def serves_v1_device_taint_rules(bed: Bed) -> bool:
    proc = bed.kubectl("get", "--raw", "/apis/resource.k8s.io/v1", check=False)
    return proc.returncode == 0 and '"devicetaintrules"' in proc.stdout


def test_device_taint_rule_takes_a_gpu_out_of_service(bed: Bed, clean_ns: str) -> None:
    if not serves_v1_device_taint_rules(bed):
        pytest.skip("resource.k8s.io/v1 DeviceTaintRule needs Kubernetes 1.37; this bed does not serve it")
    docs = example("device-taint-rule")
    (rule,) = names_of(docs, "DeviceTaintRule")
    (pod,) = names_of(docs, "Pod")
    target = (NODE, "gpu-7")

    def free() -> bool:
        everything = bed.kubectl("get", "resourceclaims", "--all-namespaces", "-o", "json").stdout
        for claim in json.loads(everything)["items"]:
            for r in (claim.get("status", {}).get("allocation") or {}).get("devices", {}).get("results", []):
                if r["driver"] == DRIVER and (r["pool"], r["device"]) == target:
                    return False
        return True

    wait_for(f"{target} to be free of earlier tests' claims", free, 180)
    try:
        bed.apply(docs, ns=clean_ns)
        time.sleep(10)  # the scheduler has had its chances
        claim = claim_of(bed, clean_ns, pod, "gpu")
        assert not claim.get("status", {}).get("allocation"), f"the tainted GPU was allocated: {claim['status']}"
        assert bed.get("pod", pod, clean_ns)["status"].get("phase") == "Pending"
        assert not slice_devices(bed)[target].get("taints"), "the rule must not change the slice"

        started = time.monotonic()
        bed.kubectl("delete", "devicetaintrule", rule, "--wait=true", "--timeout=60s")
        wait_running(bed, clean_ns, pod, timeout=180)
        (result,) = results(claim_of(bed, clean_ns, pod, "gpu"))
        assert (result["pool"], result["device"]) == target
        print(f"\ndevice-taint-rule: {target} allocated {time.monotonic() - started:.1f}s after the rule was deleted")
    finally:
        bed.kubectl("delete", "devicetaintrule", rule, "--ignore-not-found", check=False)
