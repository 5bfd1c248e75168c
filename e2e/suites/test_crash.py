"""Crash safety of the node plugin on the local bed: failpoint storms, reboot, damaged state, stale claims.

The storm kills the plugin with SIGKILL at the failpoints placed between the steps of prepare and
unprepare while the kubelet peer prepares and unprepares several claims at once; a supervisor
restarts it (as the DaemonSet would) and the peer retries (as the kubelet does). Afterwards every
running pod must see exactly its allocated devices, and the node's files must agree with each other
and with the API server. Figures go to ``e2e/results/reliability.json`` under ``crash``.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from dra_driver.node.prepare.checkpoint import CHECKPOINT_VERSION, CheckpointStore
from dra_driver.node.prepare.metadata import HOST_SUBDIR
from e2e.suites.reliability import (
    Supervisor,
    checkpoint_entries,
    log_path,
    node_state_problems,
    plugin_name,
    pod_device_problems,
    record,
    registration_socket,
    restart_plugin_clean,
    spec_device_ids,
    spec_uids,
    start_plugin,
    wait_serving,
)
from e2e.testbed.clusterview import DRIVER, Bed, wait_for

NODE_GPU, NODE_MIG = "gpu-node-1", "gpu-node-2"
CLASSES = {NODE_GPU: "gpu.gpu.dra-driver.io", NODE_MIG: "mig.gpu.dra-driver.io"}
FAILPOINTS = ("prepare.after-intent=0.05,prepare.after-started=0.05,prepare.after-cdi-write=0.05,"
              "prepare.after-completed=0.05,unprepare.after-spec-delete=0.05,unprepare.after-checkpoint=0.05,atomic-write.before-rename=0.03,"
              "checkpoint.before-flush=0.03")

pytestmark = pytest.mark.testbed_only


def templates() -> list[dict[str, Any]]:
    return [{
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": f"t-{node}"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls}}]}}},
    } for node, cls in CLASSES.items()]


def pod(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"crash-test": "yes"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": f"t-{node}"}],
            "containers": [{"name": "ctr0", "image": "busybox:1.36", "command": ["sleep", "86400"],
                            "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }


def phases(bed: Bed, ns: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p.get("status", {}).get("phase", "")
            for p in bed.get("pods", ns=ns)["items"] if not p["metadata"].get("deletionTimestamp")}


def failpoint_counts(bed: Bed, node: str, offset: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    with open(log_path(bed, plugin_name(node)), "rb") as f:
        f.seek(offset)
        for line in f.read().decode(errors="replace").splitlines():
            if "failpoint fired" in line:
                with_point = json.loads(line).get("failpoint", "?")
                counts[with_point] = counts.get(with_point, 0) + 1
    return counts


def quiet_state(bed: Bed, ns: str, timeout: float = 120) -> tuple[int, list[str]]:
    """Wait until the pods and the nodes' files agree; returns (running pods, remaining problems)."""
    last: tuple[int, list[str]] = (0, ["not checked"])

    def probe() -> bool:
        nonlocal last
        checked, problems, live = pod_device_problems(bed, ns)
        for node in CLASSES:
            problems += node_state_problems(bed, node, live.get(node, set()))
        last = (checked, problems)
        return not problems

    with contextlib.suppress(AssertionError):  # the caller reports what is still wrong
        wait_for("pods and node state to agree", probe, timeout, interval=2)
    return last


def storm(bed: Bed, ns: str, kills_wanted: int, budget_s: float, wave_size: int, key: str) -> None:
    bed.apply(templates(), ns=ns)
    offsets = {n: log_path(bed, plugin_name(n)).stat().st_size for n in CLASSES}
    supervisors = {n: Supervisor(bed, n, FAILPOINTS, seed=1000 * i).start() for i, n in enumerate(CLASSES)}
    started = time.monotonic()
    waves = pods_created = 0
    stalled: list[str] = []
    device_problems: list[str] = []
    pods_checked = 0
    previous: list[str] = []
    try:
        while sum(s.kills for s in supervisors.values()) < kills_wanted and time.monotonic() - started < budget_s:
            names = [f"w{waves}-{n[-1]}-{i}" for n in CLASSES for i in range(wave_size)]
            bed.apply([pod(name, f"gpu-node-{name.split('-')[1]}") for name in names], ns=ns)
            pods_created += len(names)
            if previous:  # unprepare the last wave while this one prepares
                bed.kubectl("delete", "pods", "-n", ns, "--wait=false", *previous)
            try:
                wait_for(f"wave {waves} running",
                         lambda names=names: all(phases(bed, ns).get(n) == "Running" for n in names),
                         timeout=150, interval=1)
            except AssertionError:
                now = phases(bed, ns)
                stalled += [n for n in names if now.get(n) != "Running"]
                break
            checked, wrong, _ = pod_device_problems(bed, ns)
            pods_checked += checked
            device_problems += wrong
            previous = names
            waves += 1
    finally:
        for s in supervisors.values():
            s.stop()
    storm_s = time.monotonic() - started
    kills = {n: s.kills for n, s in supervisors.items()}
    # With the plugins steady again, the last wave must run and everything must agree.
    running, problems = quiet_state(bed, ns)
    problems = device_problems + problems
    # Then everything goes away: nothing may stay prepared or on disk.
    bed.kubectl("delete", "pods", "-n", ns, "--all", "--wait=false")
    wait_for("pods deleted", lambda: not bed.get("pods", ns=ns)["items"], timeout=120, interval=1)
    leftovers: list[str] = []

    def drained() -> bool:
        nonlocal leftovers
        leftovers = [p for n in CLASSES for p in node_state_problems(bed, n, set())]
        return not leftovers

    with contextlib.suppress(AssertionError):
        wait_for("nodes drained", drained, timeout=60, interval=2)
    result = {
        "what": "SIGKILL at failpoints in prepare/unprepare (and atomic writes) while the kubelet peer prepares "
                "a wave of pods per node and unprepares the previous one; supervisor restarts the plugin",
        "failpoints": FAILPOINTS, "kills": sum(kills.values()), "kills_per_node": kills,
        "kills_per_failpoint": {n: failpoint_counts(bed, n, offsets[n]) for n in CLASSES},
        "unexpected_exits": {n: s.other_exits for n, s in supervisors.items()},
        "waves": waves, "pods": pods_created, "wave_size_per_node": wave_size, "storm_seconds": round(storm_s, 1),
        "running_pods_checked": pods_checked + running, "lost": {"stalled_pods": stalled, "state_problems": problems,
                                                  "leftovers_after_delete": leftovers},
    }
    record("crash", key, result)
    assert not stalled, f"pods never ran: {stalled}"
    assert not problems, problems
    assert not leftovers, leftovers
    assert all(not s.other_exits for s in supervisors.values()), result["unexpected_exits"]
    assert sum(kills.values()) >= kills_wanted, f"only {kills} kills in {storm_s:.0f}s"


@pytest.mark.timeout(600)
def test_crash_storm(bed: Bed, ns: str) -> None:
    storm(bed, ns, kills_wanted=30, budget_s=170, wave_size=3, key="storm")


@pytest.mark.long
@pytest.mark.timeout(2700)
def test_crash_storm_long(bed: Bed, ns: str) -> None:
    storm(bed, ns, kills_wanted=300, budget_s=2400, wave_size=4, key="storm_long")


# --- reboot ---------------------------------------------------------------------------------------------


def test_reboot_rewrites_specs(bed: Bed, ns: str, tmp_path: Path) -> None:
    node = NODE_GPU
    n = bed.fleet.nodes[node]
    bed.apply(templates(), ns=ns)
    bed.apply([pod(f"r{i}", node) for i in range(2)], ns=ns)
    wait_for("pods running", lambda: list(phases(bed, ns).values()) == ["Running"] * 2, 120)
    before = spec_uids(bed, node)
    assert len(before) >= 2
    bed.fleet.procs.kill(plugin_name(node))
    for spec in Path(n.cdi_dir).glob("*.json"):  # a reboot empties /var/run/cdi (tmpfs)
        spec.unlink()
    # The device metadata files are not fsynced (cdispec.DERIVED_FILES_DURABLE): after a power loss the
    # persistent state dir may hold them empty. The new boot must write them again.
    metadata = {p: p.read_bytes() for p in (Path(n.state_dir) / HOST_SUBDIR).glob("*.json")
                if p.name.split("_")[0] in before}
    assert metadata, "the pods' claims have device metadata files"
    for path in metadata:
        path.write_bytes(b"")
    boot = tmp_path / "boot_id"
    boot.write_text("11111111-2222-3333-4444-555555555555\n")
    started = time.monotonic()
    start_plugin(bed, node, extra=(f"--boot-id-path={boot}",))
    wait_serving(bed, node)
    rewritten = time.monotonic() - started
    entries, quarantined = checkpoint_entries(bed, node)
    assert quarantined is None
    assert spec_uids(bed, node) == set(entries) == before, "the reboot must not lose or invent prepared claims"
    missing = {i for e in entries.values() for d in e.devices for i in d.cdi_device_ids} - spec_device_ids(bed, node)
    assert not missing, f"prepared devices that a runtime cannot resolve: {missing}"
    assert {p: p.read_bytes() for p in metadata} == metadata, "torn device metadata files re-written"
    store = CheckpointStore(Path(n.state_dir), node, DRIVER, boot_id="")
    store.load()
    assert store.saved_boot_id == "11111111-2222-3333-4444-555555555555"
    # A pod started after the reboot works, and everything agrees.
    bed.apply([pod("r-after", node)], ns=ns)
    wait_for("new pod running", lambda: phases(bed, ns).get("r-after") == "Running", 120)
    _, problems = quiet_state(bed, ns, timeout=60)
    restart_plugin_clean(bed, node)  # back to the real boot ID for the following tests (a second "reboot")
    record("crash", "reboot", {
        "what": "plugin killed, CDI dir emptied, boot ID changed, plugin restarted",
        "prepared_claims": len(before), "specs_rewritten": len(spec_uids(bed, node)),
        "seconds_to_serving": round(rewritten, 2), "lost": problems,
    })
    assert not problems, problems


# --- damaged checkpoint -------------------------------------------------------------------------------


def _valid_doc(node: str) -> dict[str, Any]:
    return json.loads(CheckpointStore(Path("/nonexistent"), node, DRIVER, boot_id="b").encode({}))


def _damages(node: str) -> dict[str, bytes]:
    good = json.dumps(_valid_doc(node)).encode()
    future = _valid_doc(node)
    future["version"] = CHECKPOINT_VERSION + 1
    foreign = _valid_doc("some-other-node")
    flipped = bytearray(good)
    flipped[len(flipped) // 2] ^= 0x55
    tampered = _valid_doc(node)
    tampered["data"]["claims"] = {"0b1c2d3e-0000-4000-8000-000000000000": {}}
    return {
        "truncated": good[: len(good) // 2],
        "corrupted": bytes(flipped),
        "checksum-mismatch": json.dumps(tampered).encode(),
        "future-version": json.dumps(future).encode(),
        "foreign-node": json.dumps(foreign).encode(),
        "empty": b"",
    }


def test_damaged_checkpoint_is_quarantined(bed: Bed) -> None:
    node = NODE_MIG
    state_dir = Path(bed.fleet.nodes[node].state_dir)
    wait_for(f"{node} with nothing prepared", lambda: not checkpoint_entries(bed, node)[0], 60)
    outcomes: dict[str, Any] = {}
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # absent when nothing was ever prepared here
    try:
        for kind, content in _damages(node).items():
            outcomes[kind] = _damage_once(bed, node, state_dir, kind, content)
    finally:
        restart_plugin_clean(bed, node)
    record("crash", "damaged_checkpoint", {
        "what": "checkpoint damaged while the plugin was down, then restarted", "variants": outcomes,
        "lost": "nothing prepared on the node beforehand; quarantined copy kept byte for byte",
    })


def _damage_once(bed: Bed, node: str, state_dir: Path, kind: str, content: bytes) -> dict[str, Any]:
    bed.fleet.procs.stop(plugin_name(node))
    before = set(state_dir.glob("checkpoint.json.corrupt-*"))
    (state_dir / "checkpoint.json").write_bytes(content)
    offset = Path(log_path(bed, plugin_name(node))).stat().st_size
    started = time.monotonic()
    proc = start_plugin(bed, node)
    wait_serving(bed, node, timeout=60)
    serving = time.monotonic() - started
    time.sleep(3)  # a crash loop would show up as an exit here
    assert proc.poll() is None, f"{kind}: plugin exited with {proc.returncode}"
    assert registration_socket(bed, node).exists()
    quarantined = set(state_dir.glob("checkpoint.json.corrupt-*")) - before
    assert len(quarantined) == 1, f"{kind}: quarantined copies {quarantined}"
    assert next(iter(quarantined)).read_bytes() == content, f"{kind}: the quarantined copy is not the original"
    with open(log_path(bed, plugin_name(node)), "rb") as f:
        f.seek(offset)
        lines = [json.loads(x) for x in f.read().decode(errors="replace").splitlines() if x.startswith("{")]
    said = [x for x in lines if "checkpoint is unusable" in x.get("event", "")]
    assert said and said[0].get("reason") and said[0].get("quarantined_to"), f"{kind}: no clear log line in {lines[:8]}"
    return {"seconds_to_serving": round(serving, 2), "reason": str(said[0]["reason"])[:160]}


# --- stale claims ---------------------------------------------------------------------------------------


def test_stale_claim_cleanup(bed: Bed, ns: str) -> None:
    node = NODE_MIG
    bed.apply(templates(), ns=ns)
    bed.apply([pod("stale", node)], ns=ns)
    wait_for("pod running", lambda: phases(bed, ns).get("stale") == "Running", 120)
    claim = bed.get("resourceclaims", ns=ns)["items"][0]
    uid = claim["metadata"]["uid"]
    assert uid in spec_uids(bed, node) and uid in checkpoint_entries(bed, node)[0]
    peer = f"peer-{node}"
    bed.fleet.procs.stop(peer)  # the kubelet is gone: nobody will call Unprepare
    try:
        bed.kubectl("delete", "pod", "stale", "-n", ns, "--grace-period=0", "--force")
        bed.kubectl("delete", "resourceclaim", claim["metadata"]["name"], "-n", ns, "--grace-period=0", "--force",
                    "--wait=false", check=False)
        wait_for("claim gone from the API server",
                 lambda: not bed.get("resourceclaims", ns=ns)["items"], 60)
        gone = time.monotonic()
        wait_for("plugin cleanup to unprepare the stale claim",
                 lambda: uid not in spec_uids(bed, node) and uid not in checkpoint_entries(bed, node)[0], 60)
        took = time.monotonic() - gone
    finally:
        fleet = bed.fleet
        fleet.procs.start(peer, fleet.nodes[node].peer_args(fleet.kubeconfig))
    record("crash", "stale_claims", {
        "what": "pod and claim force-deleted while the kubelet peer was stopped; plugin cleanup (interval 5 s)",
        "claims": 1, "seconds_to_unprepare": round(took, 1), "lost": [],
    })
