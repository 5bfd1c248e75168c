"""Failpoints: parsing, zero effect when unset, and crash-recovery at every point in prepare/unprepare.

The crash is simulated in-process: the kill is replaced by a BaseException (which the prepare code
does not catch, just as it cannot catch SIGKILL), the DeviceState is dropped without cleanup and
a new one recovers from what is on disk, as a restarted plugin would.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from crashes import Crash
from nodefix import Env, make_claim

from dra_driver import failpoints
from dra_driver.node.fileio import atomic_write
from dra_driver.node.prepare.entries import ClaimState

REPO = Path(__file__).resolve().parents[3]


def arm(spec: str, seed: int = 1) -> None:
    failpoints.configure({failpoints.ENV: spec, failpoints.SEED_ENV: str(seed)})


def test_parse() -> None:
    assert failpoints.parse("prepare.after-started=0.5, unprepare.after-spec-delete") == {
        "prepare.after-started": 0.5, "unprepare.after-spec-delete": 1.0}
    assert failpoints.parse("") == {}
    with pytest.raises(ValueError, match=r"unknown failpoint 'prepare\.typo'"):
        failpoints.parse("prepare.typo=1")
    with pytest.raises(ValueError, match="not within"):
        failpoints.parse("prepare.after-started=1.5")
    with pytest.raises(ValueError, match="not a number"):
        failpoints.parse("prepare.after-started=often")


def test_unset_means_disarmed(crashing: None) -> None:
    failpoints.configure({})
    assert failpoints.armed() == {}
    for name in failpoints.POINTS:
        failpoints.hit(name)  # does not raise


def test_probability_and_seed(crashing: None) -> None:
    def fired(seed: int) -> list[bool]:
        arm("prepare.after-started=0.3", seed)
        out = []
        for _ in range(200):
            try:
                failpoints.hit("prepare.after-started")
                out.append(False)
            except Crash:
                out.append(True)
        return out

    first = fired(7)
    assert first == fired(7), "the same seed must give the same sequence"
    assert 30 <= sum(first) <= 90
    arm("prepare.after-started=0.3", 7)
    failpoints.hit("prepare.after-completed")  # not armed


def test_every_hit_names_a_known_point() -> None:
    names = set()
    for path in (REPO / "dra_driver").rglob("*.py"):
        names |= set(re.findall(r'failpoints\.hit\("([^"]+)"\)', path.read_text()))
    assert names == set(failpoints.POINTS), "a point is either placed and documented, or neither"


def test_kill_is_sigkill(tmp_path: Path) -> None:
    code = "from dra_driver import failpoints; failpoints.hit('prepare.after-started'); print('survived')"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"DRA_DRIVER_FAILPOINTS": "prepare.after-started=1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == -9
    assert "survived" not in proc.stdout
    assert '"failpoint":"prepare.after-started"' in proc.stderr


def test_bad_spec_fails_the_plugin_start() -> None:
    proc = subprocess.run([sys.executable, "-m", "dra_driver", "kubelet-plugin", "--node-name=n"], cwd=REPO,
                          capture_output=True, text=True, timeout=60,
                          env={"DRA_DRIVER_FAILPOINTS": "nope=1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1 and "unknown failpoint 'nope'" in proc.stderr


# --- crash recovery at each point -----------------------------------------------------------------

PREPARE_POINTS = ["prepare.after-started", "prepare.after-cdi-write", "prepare.after-completed",
                  "atomic-write.before-rename", "checkpoint.before-flush", "lock.acquired", "lock.before-release"]


def consistent(env: Env, state_uids: set[str]) -> None:
    """Specs on disk == completed entries == what the caller expects to be prepared; no temp files."""
    env.state.close()
    env.state = env.new_state()
    entries = env.state.prepared_claims()
    assert all(e.state is ClaimState.PREPARE_COMPLETED for e in entries.values())
    assert set(entries) == state_uids
    specs = {p.name for p in env.cdi_root.glob("*.json")}
    assert specs == {f"k8s.gpu.dra-driver.io-claim_{u}.json" for u in state_uids}
    leftovers = [p.name for d in (env.cdi_root, env.tmp / "state") if d.exists() for p in d.iterdir()
                 if ".tmp-" in p.name]
    assert leftovers == []


@pytest.mark.parametrize("point", PREPARE_POINTS)
def test_crash_in_prepare_then_retry(env: Env, crashing: None, point: str) -> None:
    claims = [make_claim(f"c{i}", [("gpu", f"gpu-{i}")]) for i in range(2)]
    refs = [env.reader.add(c) for c in claims]
    arm(f"{point}=1")
    with pytest.raises(Crash):
        env.state.prepare(refs)
    failpoints.configure({})
    # Restart: either rolled back (started) or kept (completed); never a spec without an entry.
    env.state = env.new_state()
    kept = set(env.state.prepared_claims())
    assert kept in (set(), {r.uid for r in refs}), kept
    assert {p.name for p in env.cdi_root.glob("*.json")} == {f"k8s.gpu.dra-driver.io-claim_{u}.json" for u in kept}
    # The kubelet retries and gets the devices; the same ones a crash-free run would give.
    out = env.state.prepare(refs)
    assert all(o.ok for o in out.values()), out
    assert [o.devices[0].device_name for o in (out[r.uid] for r in refs)] == ["gpu-0", "gpu-1"]
    consistent(env, {r.uid for r in refs})


@pytest.mark.parametrize("device", ["gpu-0", "gpu-3-1g-0"])
@pytest.mark.parametrize("point", ["prepare.after-intent", *PREPARE_POINTS])
def test_crash_in_a_one_claim_prepare_then_retry(env: Env, crashing: None, point: str, device: str) -> None:
    """The kubelet's usual request: one claim, recorded while its ResourceClaim is read."""
    ref = env.reader.add(make_claim("c", [("gpu", device)]))
    arm(f"{point}=1")
    with pytest.raises(Crash):
        env.state.prepare([ref])
    failpoints.configure({})
    env.state = env.new_state()
    kept = set(env.state.prepared_claims())
    assert kept in (set(), {ref.uid}), kept
    assert {p.name for p in env.cdi_root.glob("*.json")} == {f"k8s.gpu.dra-driver.io-claim_{u}.json" for u in kept}
    if not kept:
        assert env.backend.live == {}, "a dynamic MIG instance must not leak through a crash"
    out = env.state.prepare([ref])
    assert out[ref.uid].ok and out[ref.uid].devices[0].device_name == device, out
    consistent(env, {ref.uid})


@pytest.mark.parametrize("point", ["unprepare.after-spec-delete", "unprepare.after-checkpoint",
                                   "checkpoint.before-flush", "lock.acquired", "lock.before-release"])
def test_crash_in_unprepare_then_retry(env: Env, crashing: None, point: str) -> None:
    refs = [env.reader.add(make_claim(f"c{i}", [("gpu", f"gpu-3-1g-{i}")])) for i in range(2)]
    assert all(o.ok for o in env.state.prepare(refs).values())
    arm(f"{point}=1")
    with pytest.raises(Crash):
        env.state.unprepare(refs)
    failpoints.configure({})
    env.state = env.new_state()
    assert env.state.unprepare(refs) == {r.uid: None for r in refs}
    consistent(env, set())
    assert env.backend.live == {}, "dynamic MIG instances must not leak through a crash"


def test_atomic_write_crash_leaves_old_content(tmp_path: Path, crashing: None) -> None:
    target = tmp_path / "f.json"
    atomic_write(target, b"old", 0o600)
    arm("atomic-write.before-rename=1")
    with pytest.raises(Crash):
        atomic_write(target, b"new", 0o600)
    assert target.read_bytes() == b"old"


def test_restart_removes_temp_files_of_killed_writes(env: Env) -> None:
    # In-process the write cleans up after itself; a SIGKILLed one cannot: leave what it would.
    ref = env.reader.add(make_claim("c", [("gpu", "gpu-0")]))
    assert env.state.prepare([ref])[ref.uid].ok
    spec_tmp = env.cdi_root / f".k8s.gpu.dra-driver.io-claim_{ref.uid}.json.tmp-0badf00d"
    ckpt_tmp = env.tmp / "state" / ".checkpoint.json.tmp-0badf00d"
    foreign = env.cdi_root / ".k8s.other.example.com-claim_x.json.tmp-0badf00d"
    for p in (spec_tmp, ckpt_tmp, foreign):
        p.write_text("partial")
    env.state.close()
    env.state = env.new_state()
    assert not spec_tmp.exists() and not ckpt_tmp.exists()
    assert foreign.exists(), "another driver's files in the shared CDI directory are not ours to delete"
    assert set(env.state.prepared_claims()) == {ref.uid}
