"""GPU sharing across plugin crashes and upgrades, on gpu-node-1 with the stand-in tools (issue 51).

The claims here are allocated by the test (no scheduler, no pods) and prepared straight on the
plugin's DRA socket, as the kubelet calls it; that keeps each restart to a few seconds. One claim,
the *keeper*, holds an MPS daemon on its own GPU throughout: whatever the other claims' crashes
do, its daemon (the same process) must keep running.

What must hold after each kill and restart, and after the kubelet's retry:

* at most one stand-in MPS control daemon answers per GPU, at any check;
* the keeper's daemon is the one it had, the GPU still in Exclusive_Process;
* a GPU no prepared claim uses is in compute mode Default with time-slice 0, and has no daemon
  directory; a prepared MPS claim's GPU has exactly one daemon, a prepared time-sliced one its interval.
"""

from __future__ import annotations

import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_driver.k8s.client import CLAIMS, RestKubeApi
from dra_driver.node.kubelet import probe
from dra_driver.node.prepare.checkpoint import ClaimState
from dra_driver.ondisk import socket_paths
from e2e.suites.reliability import (
    allocate,
    checkpoint_entries,
    log_path,
    plugin_name,
    record,
    restart_plugin_clean,
    start_plugin,
    wait_serving,
)
from e2e.suites.test_shares import end_standin_daemons
from e2e.testbed.clusterview import DRIVER, Bed, attr, slice_devices, wait_for
from e2e.testbed.dracalls import Claim, DraClient, dra_socket
from e2e.testbed.standins import install as standin_tools

NODE = "gpu-node-1"
pytestmark = pytest.mark.testbed_only

MPS = {"strategy": "MPS"}
LONG = {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}

# (failpoint, the call it is in, the claim it kills: "ts" time-sliced, "mps" an MPS claim)
FAILPOINTS = (
    ("prepare.after-started", "prepare", "mps"),
    ("prepare.after-time-slice", "prepare", "ts"),
    ("prepare.after-mps-start", "prepare", "mps"),
    ("prepare.after-cdi-write", "prepare", "mps"),
    ("prepare.after-completed", "prepare", "mps"),
    ("unprepare.after-spec-delete", "unprepare", "mps"),
    ("unprepare.after-time-slice", "unprepare", "ts"),
    ("unprepare.after-mps-stop", "unprepare", "mps"),
    ("unprepare.after-checkpoint", "unprepare", "mps"),
)


def fresh_standins(bed: Bed, name: str) -> Path:
    """The stand-ins in a driver root of their own: no call or GPU state of an earlier test."""
    root = bed.fleet.nodes[NODE].root / name
    shutil.rmtree(root, ignore_errors=True)
    return standin_tools.install(root)


def uuids(bed: Bed, *devices: str) -> dict[str, str]:
    found = slice_devices(bed)
    return {d: str(attr(found[(NODE, d)], "uuid")) for d in devices}


def alive(pid: int) -> bool:
    """A stand-in daemon still running (not a zombie, not a reused pid)."""
    try:
        return b"nvidia-cuda-mps-control" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def live_daemons(root: Path) -> dict[str, set[int]]:
    """GPU UUID -> pids of the stand-in daemons that answered for it and still run."""
    out: dict[str, set[int]] = {}
    for call in standin_tools.mps_calls(root):
        if "daemon" in call and alive(int(call["daemon"])):
            out.setdefault(Path(call["pipe"]).parent.name, set()).add(int(call["daemon"]))
    return out


def gpu_state(root: Path, gpu: str) -> tuple[str, int]:
    held = standin_tools.gpus(root).get(gpu, {})
    return str(held.get("computeMode", "Default")), int(held.get("timeslice", 0))


def call_dies(bed: Bed, call: str, claim: Claim, point: str) -> None:
    """The call through the plugin armed at ``point``: it must die there, by SIGKILL."""
    client = DraClient(dra_socket(bed, NODE))
    try:
        with pytest.raises(grpc.RpcError):
            getattr(client, call)([claim], timeout=30)
    finally:
        client.close()
    proc = bed.fleet.procs.procs.pop(plugin_name(NODE))
    bed.fleet.procs.started.pop(plugin_name(NODE), None)
    assert proc.wait(timeout=30) == -signal.SIGKILL, f"{point}: the plugin exited with {proc.returncode}"


def answered(bed: Bed, call: str, claim: Claim) -> str:
    client = DraClient(dra_socket(bed, NODE))
    try:
        return str(getattr(client, call)([claim], timeout=60)[claim[2]].error)
    finally:
        client.close()


@pytest.fixture()
def api(bed: Bed) -> RestKubeApi:
    return RestKubeApi.from_kubeconfig(str(bed.kubeconfig))


def cleanup(bed: Bed, api: RestKubeApi, flags: tuple[str, ...], claims: list[Claim]) -> None:
    """Unprepared by a plugin that runs the stand-ins (their daemons stop), deleted, the plugin plain again."""
    try:
        restart_plugin_clean(bed, NODE, flags)
        for claim in claims:
            answered(bed, "unprepare", claim)
    finally:
        for ns, name, _ in claims:
            api.delete(CLAIMS, name, namespace=ns)
        end_standin_daemons(bed.fleet.nodes[NODE].state_dir)
        restart_plugin_clean(bed, NODE)


@pytest.mark.timeout(420)
def test_sigkill_at_each_sharing_failpoint_leaves_one_daemon_and_no_compute_mode(
        bed: Bed, ns: str, api: RestKubeApi) -> None:
    root = fresh_standins(bed, "standin-crash-root")
    node = bed.fleet.nodes[NODE]
    flags = (f"--nvidia-driver-root={root}",)
    gpus = uuids(bed, "gpu-4", "gpu-5", "gpu-6")
    claims = {"mps": allocate(api, ns, "mps", NODE, "gpu-4", MPS),
              "ts": allocate(api, ns, "ts", NODE, "gpu-5", LONG),
              "keeper": allocate(api, ns, "keeper", NODE, "gpu-6", MPS)}
    on = {"mps": gpus["gpu-4"], "ts": gpus["gpu-5"], "keeper": gpus["gpu-6"]}
    prepared = {"mps": False, "ts": False, "keeper": True}
    seen: list[dict[str, Any]] = []

    def problems(when: str) -> list[str]:
        daemons = live_daemons(root)
        out = [f"{when}: {len(p)} daemons for GPU {g}: {sorted(p)}" for g, p in daemons.items() if len(p) > 1]
        if daemons.get(on["keeper"]) != {keeper_pid}:
            out.append(f"{when}: the keeper's daemon {keeper_pid} is now {daemons.get(on['keeper'])}")
        if gpu_state(root, on["keeper"])[0] != "Exclusive_Process":
            out.append(f"{when}: the keeper's GPU in {gpu_state(root, on['keeper'])}")
        return out

    def settled(when: str) -> list[str]:
        out = problems(when)
        daemons = live_daemons(root)
        entries, _ = checkpoint_entries(bed, NODE)
        for key in ("mps", "ts"):
            gpu, uid = on[key], claims[key][2]
            state = entries.get(uid)
            if prepared[key] != (state is not None and state.state is ClaimState.PREPARE_COMPLETED):
                out.append(f"{when}: {key} should be {'prepared' if prepared[key] else 'gone'}; checkpoint: {state}")
            mode, slice_ = gpu_state(root, gpu)
            want = (("Exclusive_Process", 0) if key == "mps" else ("Default", 3)) if prepared[key] else ("Default", 0)
            if (mode, slice_) != want:
                out.append(f"{when}: {key}'s GPU in ({mode}, time-slice {slice_}), not {want}")
            count = len(daemons.get(gpu, set()))
            if count != (1 if key == "mps" and prepared[key] else 0):
                out.append(f"{when}: {key}'s GPU has {count} daemons")
            if key == "mps" and not prepared[key] and (node.state_dir / "mps" / gpu).exists():
                out.append(f"{when}: {key}'s daemon directory left behind")
        return out

    offset = log_path(bed, plugin_name(NODE)).stat().st_size
    try:
        restart_plugin_clean(bed, NODE, flags)
        assert answered(bed, "prepare", claims["keeper"]) == ""
        (keeper_pid,) = live_daemons(root)[on["keeper"]]
        for point, call, key in FAILPOINTS:
            started = time.monotonic()
            if prepared[key] != (call == "unprepare"):  # the claim in the state the call changes
                assert answered(bed, "unprepare" if prepared[key] else "prepare", claims[key]) == "", point
                prepared[key] = not prepared[key]
            bed.fleet.procs.stop(plugin_name(NODE))
            start_plugin(bed, NODE, flags, env={"DRA_DRIVER_FAILPOINTS": f"{point}=1"})
            wait_serving(bed, NODE)
            call_dies(bed, call, claims[key], point)
            start_plugin(bed, NODE, flags)
            wait_serving(bed, NODE)
            after_restart = problems(f"{point}, restarted")
            assert answered(bed, call, claims[key]) == "", f"{point}: the kubelet's retry of {call} failed"
            prepared[key] = call == "prepare"
            wrong = after_restart + settled(f"{point}, retried")
            seen.append({"failpoint": point, "claim": key, "seconds": round(time.monotonic() - started, 1),
                         "problems": wrong})
            assert not wrong, wrong
        with open(log_path(bed, plugin_name(NODE)), "rb") as f:
            f.seek(offset)
            fired = f.read().decode(errors="replace").count('"failpoint fired, killing the process"')
        assert fired == len(FAILPOINTS), f"{fired} failpoints fired, {len(FAILPOINTS)} armed"
    finally:
        record("crash", "sharing_failpoints", {
            "what": "SIGKILL of gpu-node-1's plugin at each failpoint of the time-slice and MPS path (stand-in "
                    "tools), restart, the kubelet's retry; an MPS claim on another GPU prepared throughout",
            "kills": len(seen), "cycles": seen})
        cleanup(bed, api, flags, list(claims.values()))
    print(f"\nsharing failpoints: {len(seen)} kills, {sum(c['seconds'] for c in seen):.0f}s; "
          f"the keeper's daemon {keeper_pid} ran throughout")


def rolling(bed: Bed, name: str, flags: tuple[str, ...], pod_uid: str, health: bool) -> DraClient:
    """An instance of a rolling update (the chart's --rolling-update, its pod's UID) serving; its DRA client."""
    node = bed.fleet.nodes[NODE]
    extra = (*flags, "--rolling-update", f"--pod-uid={pod_uid}", *(() if health else ("--health-port=0",)))
    bed.fleet.procs.start(name, node.plugin_args(bed.fleet.kubeconfig, extra))
    sockets = socket_paths(DRIVER, Path(node.registry_dir), Path(node.plugins_dir) / DRIVER, pod_uid)
    wait_for(f"{name} answering GetInfo", lambda: probe.check(sockets.registration, DRIVER, timeout=2.0) is None, 60)
    return DraClient(sockets.dra)


@pytest.mark.timeout(240)
def test_mps_claims_keep_their_daemons_through_a_rolling_update(bed: Bed, ns: str, api: RestKubeApi) -> None:
    """Instance A prepares two MPS claims; B starts beside it (adopting their daemons, starting none),
    A gets SIGTERM; the daemons are the same processes throughout, and B's unprepare stops them and
    puts the GPUs back in Default."""
    root = fresh_standins(bed, "standin-upgrade-root")
    node = bed.fleet.nodes[NODE]
    flags = (f"--nvidia-driver-root={root}",)
    gpus = uuids(bed, "gpu-4", "gpu-5")
    claims = [allocate(api, ns, "mps-a", NODE, "gpu-4", MPS), allocate(api, ns, "mps-b", NODE, "gpu-5", MPS)]
    old, new = plugin_name(NODE), f"{plugin_name(NODE)}-next"
    clients: list[DraClient] = []
    try:
        bed.fleet.procs.stop(old)
        clients.append(rolling(bed, old, flags, str(uuid.uuid4()), health=True))
        answers = clients[0].prepare(claims)
        assert all(answers[c[2]].error == "" for c in claims), {u: a.error for u, a in answers.items()}
        before = live_daemons(root)
        assert {g: len(before.get(g, set())) for g in gpus.values()} == dict.fromkeys(gpus.values(), 1), before
        offset = log_path(bed, new).stat().st_size if log_path(bed, new).exists() else 0
        clients.append(rolling(bed, new, flags, str(uuid.uuid4()), health=False))
        assert live_daemons(root) == before, "the new instance started daemons of its own"
        with open(log_path(bed, new), "rb") as f:
            f.seek(offset)
            adopted = f.read().decode(errors="replace").count("MPS control daemon adopted at start-up")
        assert adopted == 2, f"the new instance adopted {adopted} daemons, not 2"
        clients[0].close()
        proc = bed.fleet.procs.procs[old]
        bed.fleet.procs.stop(old)
        assert proc.returncode == 0, f"the old instance exited with {proc.returncode}"
        assert live_daemons(root) == before, "the old instance's shutdown touched the daemons"
        assert {g: standin_tools.gpus(root)[g]["computeMode"] for g in gpus.values()} == dict.fromkeys(
            gpus.values(), "Exclusive_Process")
        again = clients[1].prepare(claims)  # the kubelet may call the new instance for prepared claims
        assert all(again[c[2]].error == "" for c in claims)
        assert live_daemons(root) == before
        answers = clients[1].unprepare(claims)
        assert all(answers[c[2]].error == "" for c in claims), {u: a.error for u, a in answers.items()}
        assert not live_daemons(root), f"daemons left after the last unprepare: {live_daemons(root)}"
        assert {g: gpu_state(root, g)[0] for g in gpus.values()} == dict.fromkeys(gpus.values(), "Default")
        assert not any((node.state_dir / "mps" / g).exists() for g in gpus.values())
        assert not checkpoint_entries(bed, NODE)[0]
        print(f"\nrolling update under MPS claims: daemons {sorted(p for s in before.values() for p in s)} "
              "kept through the handover, stopped by the new instance")
    finally:
        for client in clients:
            client.close()
        bed.fleet.procs.stop(new)
        bed.fleet.procs.stop(old)
        cleanup(bed, api, flags, claims)


@pytest.fixture(autouse=True)
def _no_daemons_left(bed: Bed) -> Iterator[None]:
    yield
    end_standin_daemons(bed.fleet.nodes[NODE].state_dir)
