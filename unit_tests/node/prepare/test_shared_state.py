"""Two plugin instances over one state directory (a rolling update): each batch starts from the
checkpoint on disk under serialize.lock, so each instance sees the other's work."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

from nodefix import NODE, Env, make_claim

from dra_driver.node.prepare.checkpoint import CheckpointStore
from dra_driver.node.prepare.entries import ClaimState
from dra_driver.node.prepare.materialize import Materializer
from dra_driver.ondisk import SERIALIZE_LOCK_FILE


def devices_of(outcome: Any) -> list[str]:
    assert outcome.ok, outcome.error
    return [d.device_name for d in outcome.devices]


def test_two_instances_see_each_others_claims(env: Env) -> None:
    a, b = env.state, env.new_state()
    first = env.reader.add(make_claim("first", [("gpu", "gpu-0")]))
    assert devices_of(a.prepare([first])[first.uid]) == ["gpu-0"]
    spec = env.cdi_root / f"k8s.gpu.dra-driver.io-claim_{first.uid}.json"
    inode = spec.stat().st_ino
    # B answers A's claim from the checkpoint: the same devices, the spec A wrote left as it is.
    again = b.prepare([first])[first.uid]
    assert devices_of(again) == ["gpu-0"] and again == a.prepare([first])[first.uid]
    assert spec.stat().st_ino == inode
    # No device for two claims: B knows that A gave gpu-0 away.
    rival = env.reader.add(make_claim("rival", [("gpu", "gpu-0")]))
    refused = b.prepare([rival])[rival.uid]
    assert refused.error is not None and "gpu-0" in refused.error, refused
    # B unprepares A's claim: A's files go, and A sees the device free again.
    assert b.unprepare([first]) == {first.uid: None}
    assert not spec.exists()
    assert devices_of(a.prepare([rival])[rival.uid]) == ["gpu-0"]
    assert b.prepared_claims() == {}, "B's view is as of its last batch"
    b.refresh()
    assert set(b.prepared_claims()) == {rival.uid}
    # Dynamic MIG: an instance created by A is destroyed by B's unprepare.
    mig = env.reader.add(make_claim("mig", [("gpu", "gpu-3-1g-0")]))
    assert devices_of(a.prepare([mig])[mig.uid]) == ["gpu-3-1g-0"] and len(env.backend.live) == 1
    assert b.unprepare([mig, rival]) == {mig.uid: None, rival.uid: None}
    assert env.backend.live == {}
    assert set(a.prepared_claims()) == {rival.uid, mig.uid}, "A's view is as of its last batch"
    a.refresh()
    assert a.prepared_claims() == {} and env.checkpoint() == {}
    lock = env.tmp / "state" / SERIALIZE_LOCK_FILE
    assert lock.stat().st_mode & 0o777 == 0o600


def test_alternating_instances_keep_one_consistent_checkpoint(env: Env) -> None:
    """Many rounds, each instance appending to or replacing the file the other wrote."""
    states = [env.state, env.new_state()]
    live: dict[str, str] = {}
    refs = [env.reader.add(make_claim(f"c{i}", [("gpu", f"gpu-{i % 3}")])) for i in range(12)]
    for i, ref in enumerate(refs):
        state = states[i % 2]
        if i >= 3:  # the claim three before holds the device: the other instance unprepares it
            old = refs[i - 3]
            assert states[(i + 1) % 2].unprepare([old]) == {old.uid: None}
            live.pop(old.uid)
        assert devices_of(state.prepare([ref])[ref.uid]) == [f"gpu-{i % 3}"]
        live[ref.uid] = f"gpu-{i % 3}"
        on_disk = CheckpointStore(env.tmp / "state", NODE, "gpu.dra-driver.io", boot_id="").load()
        assert {u: e.devices[0].device for u, e in on_disk.items()} == live
        assert all(e.state is ClaimState.PREPARE_COMPLETED for e in on_disk.values())
    for state in states:
        state.refresh()
        assert {u: e.devices[0].device for u, e in state.prepared_claims().items()} == live


# --- two processes ------------------------------------------------------------------------------------


def _instance(tmp: str, claims: list[dict[str, Any]], barrier: Any, results: Any) -> None:
    """One plugin instance in its own process: prepares then unprepares each claim at the same moment
    as the other process; every write of a claim's files is counted in a shared file."""
    env = Env(Path(tmp))
    env.reader.delay = 0.02  # the API round trip, so that both calls are in flight together
    write = Materializer.write

    def counted(self: Materializer, entry: Any, devices: Any) -> None:
        with open(os.path.join(tmp, "writes"), "a") as f:
            f.write(entry.uid + "\n")
        write(self, entry, devices)

    Materializer.write = counted  # type: ignore[method-assign]
    for claim in claims:
        ref = env.reader.add(claim)
        barrier.wait(timeout=60)
        out = env.state.prepare([ref])[ref.uid]
        results.put((ref.uid, out.error, [(d.device_name, d.cdi_device_ids) for d in out.devices]))
        barrier.wait(timeout=60)
        results.put((ref.uid, "unprepare", env.state.unprepare([ref])[ref.uid]))
    env.state.close()


def test_two_processes_prepare_one_claim_once(tmp_path: Path) -> None:
    claims = [make_claim(f"c{i}", [("gpu", f"gpu-{i % 2}")]) for i in range(8)]
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_instance, args=(str(tmp_path), claims, barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    answers = [results.get(timeout=120) for _ in range(2 * 2 * len(claims))]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for claim in claims:
        uid = claim["metadata"]["uid"]
        prepared = [a for a in answers if a[0] == uid and a[1] != "unprepare"]
        assert len(prepared) == 2 and prepared[0] == prepared[1], prepared
        assert prepared[0][1] is None and prepared[0][2][0][0] == claim["status"]["allocation"]["devices"]["results"][0]["device"]
        assert [a[2] for a in answers if a[0] == uid and a[1] == "unprepare"] == [None, None]
    writes = (tmp_path / "writes").read_text().split()
    assert sorted(writes) == sorted(c["metadata"]["uid"] for c in claims), "each claim prepared exactly once"
    assert CheckpointStore(tmp_path / "state", NODE, "gpu.dra-driver.io", boot_id="").load() == {}


def test_a_claim_recorded_ahead_and_rolled_back_by_a_starting_instance_is_recorded_again(env: Env) -> None:
    """The new pod's recovery rolls back what the old pod recorded ahead while reading a claim; the
    old pod's preparation then records the claim with its devices before it writes files, so a crash
    in between is still rolled back."""
    ref = env.reader.add(make_claim("c", [("gpu", "gpu-1")]))
    started: list[Any] = []
    env.reader.while_reading = lambda name: started.append(env.new_state())
    assert devices_of(env.state.prepare([ref])[ref.uid]) == ["gpu-1"]
    assert len(started) == 1
    lines = [json.loads(line) for line in (env.tmp / "state" / "checkpoint.json").read_text().splitlines()]
    records = [line["record"]["set"].get(ref.uid) for line in lines[1:]]
    assert any(r is not None and r["state"] == "PrepareStarted" and r["devices"] for r in records), records
    started[0].refresh()
    assert set(started[0].prepared_claims()) == {ref.uid}
