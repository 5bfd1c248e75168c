"""Upgrade and rollback across releases: the checkpoint and the CDI specs one release writes are read
by the other (the rule is in :mod:`dra_driver.node.prepare.checkpoint`, "Upgrades and rollbacks").

The previous release is the commit before rolling updates, :data:`OLD`:

* upgrade: what it wrote is read by this code, every claim kept and answered with the same devices.
  Once from a fixture it wrote (``fixtures/upgrade-557764c``, made by ``python
  unit_tests/node/test_upgrade_compat.py <dir>``, which runs the old code as the test below does),
  so that it is tested without the repository's history too; and once from the old code itself.
* rollback: a checkpoint this code wrote, with a field the old code does not know (``preparedBy``),
  is loaded by the old code, run from ``git archive`` of :data:`OLD` in a subprocess: every claim
  kept (none quarantined), re-prepare answered with the same devices.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from nodefix import Env, make_claim

from dra_driver.ondisk import CHECKPOINT_FILE, claim_spec_prefix

REPO = Path(__file__).resolve().parents[2]
OLD = "557764c"
FIXTURE = Path(__file__).parent / "fixtures" / f"upgrade-{OLD}"
POD = "0f0f0f0f-2222-4000-8000-000000000001"
DRIVER = "gpu.dra-driver.io"

# Runs in the old tree: recover from <root>, prepare every claim of <claims.json>, print what it saw.
OLD_INSTANCE = """
import json, sys
from pathlib import Path
import dra_driver
from nodefix import Env
assert Path(dra_driver.__file__).resolve().is_relative_to(Path.cwd().resolve()), dra_driver.__file__
env = Env(Path(sys.argv[1]))
seen = {"quarantined": env.state.checkpoint.quarantine_reason, "recovered": sorted(env.state.prepared_claims())}
answers = {}
for claim in json.loads(Path(sys.argv[2]).read_text()):
    ref = env.reader.add(claim)
    out = env.state.prepare([ref])[ref.uid]
    answers[ref.uid] = [out.error, [[d.device_name, list(d.cdi_device_ids)] for d in out.devices]]
env.state.close()
print(json.dumps({**seen, "answers": answers}))
"""


def claims() -> list[dict[str, Any]]:
    uids = [f"5a5a5a5a-0000-4000-8000-00000000000{i}" for i in range(3)]
    return [make_claim("whole", [("gpu", "gpu-0")], uid=uids[0]),
            make_claim("two", [("a", "gpu-1"), ("b", "gpu-2")], uid=uids[1]),
            make_claim("mig", [("gpu", "gpu-3-1g-0")], uid=uids[2])]


def old_tree(dest: Path) -> Path:
    """The old release's package and test bed, from the repository's history."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", OLD, "dra_driver", "unit_tests/nodefix.py"],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        pytest.skip(f"commit {OLD} is not in this checkout's history: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def run_old(tree: Path, root: Path, claims_file: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", OLD_INSTANCE, str(root), str(claims_file)], cwd=tree,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tree}:{tree / 'unit_tests'}"},
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def answers_of(env: Env, wanted: list[dict[str, Any]]) -> dict[str, Any]:
    answers = {}
    for claim in wanted:
        ref = env.reader.add(claim)
        out = env.state.prepare([ref])[ref.uid]
        answers[ref.uid] = [out.error, [[d.device_name, list(d.cdi_device_ids)] for d in out.devices]]
    return answers


def write_claims(path: Path) -> list[dict[str, Any]]:
    wanted = claims()
    path.write_text(json.dumps(wanted))
    return wanted


def check_upgrade(root: Path, wanted: list[dict[str, Any]], old_answers: dict[str, Any]) -> None:
    assert all(error is None for error, _ in old_answers.values()), old_answers
    env = Env(root)
    assert env.state.checkpoint.quarantine_reason is None
    assert set(env.state.prepared_claims()) == {c["metadata"]["uid"] for c in wanted}
    assert answers_of(env, wanted) == old_answers
    specs = sorted(p.name for p in (root / "cdi").iterdir())
    assert specs == sorted(f"{claim_spec_prefix(DRIVER)}{c['metadata']['uid']}.json" for c in wanted)
    env.state.close()


def test_upgrade_from_the_fixture_the_old_release_wrote(tmp_path: Path) -> None:
    root = tmp_path / "node"
    shutil.copytree(FIXTURE / "node", root)
    wanted = json.loads((FIXTURE / "claims.json").read_text())
    check_upgrade(root, wanted, json.loads((FIXTURE / "answers.json").read_text()))


def test_upgrade_from_the_old_release(tmp_path: Path) -> None:
    tree = old_tree(tmp_path / "old")
    wanted = write_claims(tmp_path / "claims.json")
    old = run_old(tree, tmp_path / "node", tmp_path / "claims.json")
    assert old["recovered"] == [] and old["quarantined"] is None
    check_upgrade(tmp_path / "node", wanted, old["answers"])


def test_rollback_to_the_old_release(tmp_path: Path) -> None:
    tree = old_tree(tmp_path / "old")
    wanted = write_claims(tmp_path / "claims.json")
    env = Env(tmp_path / "node")
    env.instance = POD
    env.state = env.new_state()
    new_answers = answers_of(env, wanted)
    env.state.close()
    saved = (tmp_path / "node" / "state" / CHECKPOINT_FILE).read_text()
    assert saved.count(f'"preparedBy":"{POD}"') >= len(wanted), "the new field is in what the old code reads"
    old = run_old(tree, tmp_path / "node", tmp_path / "claims.json")
    assert old["quarantined"] is None, old
    assert old["recovered"] == sorted(c["metadata"]["uid"] for c in wanted)
    assert old["answers"] == new_answers


def make_fixture(dest: Path) -> None:
    """Write :data:`FIXTURE`'s content with the old release (run from the repository root)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        tree = old_tree(Path(tmp) / "old")
        dest.mkdir(parents=True)
        write_claims(dest / "claims.json")
        old = run_old(tree, dest / "node", dest / "claims.json")
        (dest / "answers.json").write_text(json.dumps(old["answers"], indent=1) + "\n")


if __name__ == "__main__":
    make_fixture(Path(sys.argv[1]))


def test_this_reader_ignores_fields_a_later_release_adds(tmp_path: Path) -> None:
    """What makes the rollback above work one release later: unknown fields of the snapshot, its
    entries and devices, and of journal records are ignored."""
    from dra_driver.node.prepare.checkpoint import CheckpointStore
    from dra_driver.node.prepare.journal import canonical, checksum

    env = Env(tmp_path)
    wanted = claims()[:2]
    answers_of(env, wanted)
    env.state.close()
    path = tmp_path / "state" / CHECKPOINT_FILE
    before = CheckpointStore(tmp_path / "state", "node-a", DRIVER, boot_id="").load()
    snapshot = {uid: entry.to_dict() for uid, entry in before.items()}
    for entry in snapshot.values():
        entry["futureField"] = {"x": 1}
        for device in entry["devices"]:
            device["futureDeviceField"] = [1, 2]
    first, second = sorted(snapshot)
    data = {"nodeName": "node-a", "driverName": DRIVER, "bootID": "boot-1", "futureTop": True,
            "claims": {first: snapshot[first]}}
    record = {"seq": 1, "bootID": "boot-1", "set": {second: snapshot[second]}, "del": [], "futureRecord": "y"}
    path.write_bytes(canonical({"kind": "DraDriverCheckpoint", "version": 2, "checksum": checksum(canonical(data)),
                                "data": data, "futureDoc": 1}) + b"\n"
                     + canonical({"checksum": checksum(canonical(record)), "record": record}) + b"\n")
    store = CheckpointStore(tmp_path / "state", "node-a", DRIVER, boot_id="")
    assert store.load() == before and store.quarantine_reason is None
