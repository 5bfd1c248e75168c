"""Helpers of the reliability tests (crash, outage, load): results file, plugin supervision, invariants."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dra_driver import CONFIG_API_VERSION
from dra_driver.k8s.client import CLAIMS, ApiError, RestKubeApi
from dra_driver.node.kubelet import probe
from dra_driver.node.prepare.cdi import CdiSpecs
from dra_driver.node.prepare.checkpoint import CheckpointStore, ClaimEntry, ClaimState
from dra_driver.node.prepare.metadata import HOST_SUBDIR, MetadataFiles
from e2e.testbed.clusterview import CONTAINERS_ANNOTATION, DRIVER, Bed, slice_devices, wait_for

RESULTS = Path(__file__).resolve().parents[1] / "results" / "reliability.json"


def record(section: str, key: str, value: dict[str, Any], results: Path = RESULTS) -> None:
    """Merge ``value`` into ``results`` (``reliability.json``) at ``[section][key]``; other writers' keys stay."""
    results.parent.mkdir(parents=True, exist_ok=True)
    # The lock file lives outside the repository so that it never shows up as a change.
    with open(Path(tempfile.gettempdir()) / "dra-driver-reliability.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            doc = json.loads(results.read_text()) if results.exists() else {}
        except ValueError:
            doc = {}
        doc.setdefault(section, {})[key] = {**value, "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        tmp = results.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, results)


# --- claims ------------------------------------------------------------------------------------------


def allocate(api: RestKubeApi, ns: str, name: str, node: str, device: str,
             sharing: str | dict[str, Any] = "TimeSlicing") -> tuple[str, str, str]:
    """A claim for ``device`` of ``node`` with the allocation written by the test (no scheduler), as
    (namespace, name, UID) for a DRA call. ``sharing``: a strategy, or the GpuConfig's whole ``sharing``."""
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
            # A class nobody defines: no scheduler or controller allocates this claim, the test does.
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "load-test.invalid"}}]}}}
    obj = api.create(CLAIMS, body, namespace=ns)
    status = {"allocation": {
        "devices": {
            "results": [{"request": "gpu", "driver": DRIVER, "pool": node, "device": device}],
            "config": [{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig",
                "sharing": sharing if isinstance(sharing, dict) else {"strategy": sharing}}}}],
        },
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
    }}
    for _ in range(10):
        try:
            api.replace_status(CLAIMS, {**obj, "status": status})
            break
        except ApiError as exc:
            if exc.status != 409:  # our controller may annotate the claim meanwhile
                raise
            obj = api.get(CLAIMS, name, namespace=ns)
    return ns, name, str(obj["metadata"]["uid"])


# --- the plugin process ---------------------------------------------------------------------------


def plugin_name(node: str) -> str:
    return f"plugin-{node}"


def registration_socket(bed: Bed, node: str) -> Path:
    return Path(bed.fleet.nodes[node].registry_dir) / f"{DRIVER}-reg.sock"


def start_plugin(bed: Bed, node: str, extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> Any:
    fleet = bed.fleet
    return fleet.procs.start(plugin_name(node), fleet.nodes[node].plugin_args(fleet.kubeconfig, extra), env=env)


def wait_serving(bed: Bed, node: str, timeout: float = 60) -> None:
    sock = registration_socket(bed, node)
    wait_for(f"plugin of {node} answering GetInfo", lambda: probe.check(sock, DRIVER, timeout=2.0) is None, timeout)


def restart_plugin_clean(bed: Bed, node: str, extra: tuple[str, ...] = ()) -> None:
    """Stop (SIGTERM) whatever plugin runs for ``node`` and start a plain one; wait until it serves."""
    bed.fleet.procs.stop(plugin_name(node))
    start_plugin(bed, node, extra)
    wait_serving(bed, node)


def log_path(bed: Bed, name: str) -> Path:
    return Path(bed.fleet.procs.logs) / f"{name}.log"


class Supervisor:
    """Restarts a node's plugin whenever it dies, like the DaemonSet's restartPolicy, counting deaths."""

    def __init__(self, bed: Bed, node: str, failpoints: str, seed: int) -> None:
        self.bed, self.node, self.failpoints, self.seed = bed, node, failpoints, seed
        self.kills = 0
        self.other_exits: list[int] = []
        self.restarts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"supervise-{node}", daemon=True)

    def _env(self) -> dict[str, str]:
        self.seed += 1
        return {"DRA_DRIVER_FAILPOINTS": self.failpoints, "DRA_DRIVER_FAILPOINTS_SEED": str(self.seed)}

    def start(self) -> Supervisor:
        self.bed.fleet.procs.stop(plugin_name(self.node))
        start_plugin(self.bed, self.node, env=self._env())
        self._thread.start()
        return self

    def _run(self) -> None:
        procs = self.bed.fleet.procs.procs
        while not self._stop.wait(0.1):
            proc = procs.get(plugin_name(self.node))
            if proc is None or proc.poll() is None:
                continue
            if proc.returncode == -9:
                self.kills += 1
            else:
                self.other_exits.append(proc.returncode)
            start_plugin(self.bed, self.node, env=self._env())
            self.restarts += 1

    def stop(self) -> None:
        """Stop supervising and leave a plugin without failpoints running."""
        self._stop.set()
        self._thread.join(timeout=10)
        restart_plugin_clean(self.bed, self.node)


# --- invariants --------------------------------------------------------------------------------------


def checkpoint_at(state_dir: Path, node: str) -> tuple[dict[str, ClaimEntry], Path | None]:
    """The checkpoint of a plugin's ``--state-dir``, read as the plugin reads it."""
    store = CheckpointStore(state_dir, node, DRIVER, boot_id="")
    return store.load(), store.quarantined


def checkpoint_entries(bed: Bed, node: str) -> tuple[dict[str, ClaimEntry], Path | None]:
    return checkpoint_at(bed.fleet.nodes[node].state_dir, node)


def spec_uids(bed: Bed, node: str) -> set[str]:
    return set(CdiSpecs(bed.fleet.nodes[node].cdi_dir, DRIVER).list_claim_specs())


def temp_files(state_dir: Path, cdi_dir: Path) -> list[str]:
    dirs = (cdi_dir, state_dir, state_dir / HOST_SUBDIR)
    return [p.name for d in dirs if d.exists() for p in d.iterdir() if ".tmp-" in p.name]


def spec_device_ids(bed: Bed, node: str) -> set[str]:
    """Every fully-qualified CDI device ID that the node's spec files define (what a runtime resolves)."""
    return {i for ids in spec_ids_by_claim(Path(bed.fleet.nodes[node].cdi_dir)).values() for i in ids}


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def spec_ids_by_claim(cdi_dir: Path) -> dict[str, set[str]]:
    """The fully-qualified CDI device IDs that the spec files define, by the claim UID their file is
    named after (a claim's spec and its device metadata specs)."""
    out: dict[str, set[str]] = {}
    for path in Path(cdi_dir).glob("*.json"):
        spec = json.loads(path.read_text())
        found = UUID.search(path.name)
        out.setdefault(found.group(0) if found else path.name, set()).update(
            f"{spec['kind']}={d['name']}" for d in spec.get("devices", []))
    return out


def spec_problems(entries: dict[str, ClaimEntry], cdi_dir: Path) -> list[str]:
    """Where the CDI specs on disk and the checkpoint's prepared claims disagree on devices: each
    completed claim's specs define exactly the CDI devices the checkpoint handed out, and no GPU is
    in two claims' specs unless neither holds it exclusively."""
    problems = []
    by_claim = spec_ids_by_claim(cdi_dir)
    for uid, entry in entries.items():
        if entry.state is not ClaimState.PREPARE_COMPLETED:
            continue
        handed_out = {i for d in entry.devices for i in d.cdi_device_ids}
        if by_claim.get(uid, set()) != handed_out:
            problems.append(f"claim {uid}: specs define {sorted(by_claim.get(uid, set()))}, "
                            f"the checkpoint handed out {sorted(handed_out)}")
    holders: dict[str, list[str]] = {}
    specs = CdiSpecs(cdi_dir, DRIVER)
    for uid in specs.list_claim_specs():
        spec = json.loads(specs.spec_path(uid).read_text())
        gpus = {n["path"] for d in spec.get("devices", []) for n in d["containerEdits"].get("deviceNodes", [])
                if n["path"].removeprefix("/dev/nvidia").isdigit()}
        for gpu in gpus:
            holders.setdefault(gpu, []).append(uid)
    for gpu, uids in holders.items():
        exclusive = [u for u in uids if u not in entries
                     or any(not d.sharing.allows_sharing for d in entries[u].devices)]
        if len(uids) > 1 and exclusive:
            problems.append(f"{gpu} is in the specs of claims {sorted(uids)}, held exclusively by {sorted(exclusive)}")
    return problems


def exclusive_conflicts(entries: dict[str, ClaimEntry]) -> list[str]:
    """Pairs of claims that hold overlapping hardware while at least one of them is exclusive."""
    holds = [(e.uid, d) for e in entries.values() for d in e.devices]
    conflicts = []
    for i, (ua, a) in enumerate(holds):
        for ub, b in holds[i + 1:]:
            if ua == ub or a.gpu_uuid != b.gpu_uuid:
                continue
            overlap = a.device == b.device or "gpu" in (a.kind, b.kind) or (
                a.placement is not None and b.placement is not None
                and a.placement[0] < b.placement[0] + b.placement[1] and b.placement[0] < a.placement[0] + a.placement[1])
            exclusive = not (a.sharing.allows_sharing and b.sharing.allows_sharing)
            if overlap and exclusive:
                conflicts.append(f"{ua}:{a.device} and {ub}:{b.device} on {a.gpu_uuid}")
    return conflicts


def node_state_problems(bed: Bed, node: str, live_claim_uids: set[str] | None) -> list[str]:
    """What is wrong with a quiet node's prepared state; ``live_claim_uids``: claims that must be prepared."""
    n = bed.fleet.nodes[node]
    return state_problems(node, Path(n.state_dir), Path(n.cdi_dir), live_claim_uids)


def state_problems(node: str, state_dir: Path, cdi_dir: Path, live_claim_uids: set[str] | None,
                   calls_in_flight: bool = False) -> list[str]:
    """:func:`node_state_problems` of any plugin's state and CDI directories. ``calls_in_flight``:
    read between a plugin's batches (under its lock) while the kubelet's calls run, where a claim
    recorded ahead of its preparation (PrepareStarted, no devices yet: its GET is in flight) is normal."""
    problems: list[str] = []
    entries, quarantined = checkpoint_at(state_dir, node)
    if quarantined:
        problems.append(f"{node}: checkpoint did not load, quarantined to {quarantined}")
    started = sorted(u for u, e in entries.items() if e.state is not ClaimState.PREPARE_COMPLETED
                     and not (calls_in_flight and not e.devices))
    if started:
        problems.append(f"{node}: entries left PrepareStarted: {started}")
    completed = {u for u, e in entries.items() if e.state is ClaimState.PREPARE_COMPLETED}
    specs = set(CdiSpecs(cdi_dir, DRIVER).list_claim_specs())
    if specs - completed:
        problems.append(f"{node}: CDI specs without a prepared claim: {sorted(specs - completed)}")
    if completed - specs:
        problems.append(f"{node}: prepared claims without a CDI spec: {sorted(completed - specs)}")
    metadata = MetadataFiles(state_dir, cdi_dir, DRIVER).claims()
    if metadata - completed:
        problems.append(f"{node}: device metadata without a prepared claim: {sorted(metadata - completed)}")
    if live_claim_uids is not None and completed != live_claim_uids:
        problems.append(f"{node}: prepared {sorted(completed)} but live claims are {sorted(live_claim_uids)}")
    leftovers = temp_files(state_dir, cdi_dir)
    if leftovers:
        problems.append(f"{node}: temporary files left: {leftovers}")
    problems += [f"{node}: exclusive conflict {c}" for c in exclusive_conflicts(entries)]
    return problems


def pod_device_problems(bed: Bed, ns: str) -> tuple[int, list[str], dict[str, set[str]]]:
    """Running pods whose containers do not see exactly their allocated devices.

    Returns (running pods checked, problems, live claim UIDs per node).
    """
    pods = bed.get("pods", ns=ns)["items"]
    claims = {c["metadata"]["name"]: c for c in bed.get("resourceclaims", ns=ns)["items"]}
    devices = slice_devices(bed)
    problems: list[str] = []
    live: dict[str, set[str]] = {}
    checked = 0
    for pod in pods:
        name = pod["metadata"]["name"]
        if pod.get("status", {}).get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
            continue
        checked += 1
        statuses = pod.get("status", {}).get("resourceClaimStatuses", [])
        want: set[str] = set()
        for st in statuses:
            claim = claims.get(st.get("resourceClaimName", ""))
            if claim is None:
                problems.append(f"pod {name}: claim {st.get('resourceClaimName')} is gone")
                continue
            live.setdefault(pod["spec"].get("nodeName", ""), set()).add(claim["metadata"]["uid"])
            for r in claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", []):
                if r["driver"] == DRIVER:
                    uuid = devices[(r["pool"], r["device"])].get("attributes", {}).get("uuid", {}).get("string")
                    want.add(str(uuid))
        raw = pod["metadata"].get("annotations", {}).get(CONTAINERS_ANNOTATION)
        if not raw:
            problems.append(f"pod {name}: Running without the {CONTAINERS_ANNOTATION} annotation")
            continue
        for container, view in json.loads(raw).items():
            got = {u for u in view.get("env", {}).get("NVIDIA_VISIBLE_DEVICES", "").split(",") if u}
            if got != want:
                problems.append(f"pod {name}/{container}: sees {sorted(got)}, allocated {sorted(want)}")
    return checked, problems, live


@contextlib.contextmanager
def timed() -> Iterator[dict[str, float]]:
    out: dict[str, float] = {}
    start = time.monotonic()
    try:
        yield out
    finally:
        out["seconds"] = round(time.monotonic() - start, 2)
