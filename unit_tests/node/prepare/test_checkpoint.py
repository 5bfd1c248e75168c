"""The on-disk checkpoint of prepared claims."""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dra_driver.gpuconfig import EXCLUSIVE, SharingConfig, Strategy, TimeSliceInterval
from dra_driver.node.discovery.model import MigDevice, MigPlacement
from dra_driver.node.fileio import describe_os_error, ensure_dir
from dra_driver.node.prepare.checkpoint import CHECKPOINT_VERSION, CheckpointStore
from dra_driver.node.prepare.entries import ClaimEntry, ClaimState, DeviceKind, PreparedDevice

DRIVER = "gpu.dra-driver.io"
UID = "0b6f7c7e-8d8a-4c1e-9f55-3f1d0c2a9b10"
UID2 = "1b6f7c7e-8d8a-4c1e-9f55-3f1d0c2a9b10"


def entries() -> dict[str, ClaimEntry]:
    mig = MigDevice("MIG-1", "1g.10gb", "GPU-a", 10 * 2**30, 16, 7, 0, MigPlacement(6, 1))
    return {
        UID: ClaimEntry(
            UID, "ns", "a", ClaimState.PREPARE_COMPLETED,
            (PreparedDevice("node-a", "gpu-0", ("gpu",), (f"k8s.{DRIVER}/claim={UID}-gpu-0",),
                            SharingConfig(Strategy.TIME_SLICING, TimeSliceInterval.LONG), "share-1", False,
                            "GPU-a", "GPU-a", 0),),
            boot_id="boot-1", updated="2026-01-01T00:00:00.000000Z",
        ),
        UID2: ClaimEntry(
            UID2, "ns", "b", ClaimState.PREPARE_STARTED,
            (PreparedDevice("node-a", "gpu-1-mig-1g-6", ("r/sub",), (), EXCLUSIVE, None, True,
                            "MIG-1", "GPU-a", 1, (3, 4), mig, DeviceKind.MIG, (6, 1)),),
            boot_id="boot-1",
        ),
    }


def store(tmp_path: Path, node: str = "node-a", boot: str = "boot-1") -> CheckpointStore:
    return CheckpointStore(tmp_path / "state", node, DRIVER, boot_id=boot)


def corrupt_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "state").glob("checkpoint.json.corrupt-*"))


class TestRoundTrip:
    def test_missing_file_is_empty(self, tmp_path: Path) -> None:
        assert store(tmp_path).load() == {}

    def test_a_created_mig_instance_keeps_its_field_names(self) -> None:
        """Files written by earlier versions name the instance's fields so; they must keep loading."""
        device = entries()[UID2].devices[0]
        saved = device.to_dict()["migInstance"]
        assert saved == {"uuid": "MIG-1", "profile": "1g.10gb", "parentUUID": "GPU-a", "memoryBytes": 10 * 2**30,
                         "multiprocessors": 16, "gpuInstanceID": 7, "computeInstanceID": 0,
                         "placementStart": 6, "placementSize": 1}
        assert PreparedDevice.from_dict(device.to_dict()) == device

    def test_save_load(self, tmp_path: Path) -> None:
        s = store(tmp_path)
        s.save(entries())
        loaded = store(tmp_path).load()
        assert loaded == entries()
        assert loaded[UID].devices[0].sharing == SharingConfig(Strategy.TIME_SLICING, TimeSliceInterval.LONG)
        assert loaded[UID].devices[0].to_dict()["sharing"] == {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}
        assert loaded[UID2].devices[0].mig_instance == entries()[UID2].devices[0].mig_instance
        assert loaded[UID2].devices[0].placement == (6, 1)

    def test_permissions(self, tmp_path: Path) -> None:
        old = os.umask(0)
        try:
            store(tmp_path).save(entries())
        finally:
            os.umask(old)
        path = tmp_path / "state" / "checkpoint.json"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700

    def test_format(self, tmp_path: Path) -> None:
        store(tmp_path).save(entries())
        doc = json.loads((tmp_path / "state" / "checkpoint.json").read_text())
        assert doc["kind"] == "DraDriverCheckpoint"
        assert doc["version"] == CHECKPOINT_VERSION
        assert doc["checksum"].startswith("sha256:")
        data = doc["data"]
        assert data["nodeName"] == "node-a" and data["bootID"] == "boot-1" and data["driverName"] == DRIVER
        claim = data["claims"][UID]
        assert claim["state"] == "PrepareCompleted"
        assert claim["namespace"] == "ns" and claim["name"] == "a"
        dev = claim["devices"][0]
        assert dev["pool"] == "node-a" and dev["device"] == "gpu-0" and dev["requests"] == ["gpu"]
        assert dev["cdiDeviceIDs"] == [f"k8s.{DRIVER}/claim={UID}-gpu-0"]
        assert dev["shareID"] == "share-1"
        assert data["claims"][UID2]["state"] == "PrepareStarted"

    def test_no_temp_files_left(self, tmp_path: Path) -> None:
        s = store(tmp_path)
        s.save(entries())
        s.save({})
        assert [p.name for p in (tmp_path / "state").iterdir()] == ["checkpoint.json"]


class TestQuarantine:
    def _check_quarantined(self, tmp_path: Path, s: CheckpointStore) -> None:
        assert s.load() == {}
        assert not (tmp_path / "state" / "checkpoint.json").exists()
        [q] = corrupt_files(tmp_path)
        assert s.quarantined == q
        # recovery starts empty and can write again
        s.save(entries())
        assert s.load() == entries()

    def test_garbage(self, tmp_path: Path) -> None:
        s = store(tmp_path)
        s.save(entries())
        (tmp_path / "state" / "checkpoint.json").write_bytes(b"\x00\xffnot json")
        self._check_quarantined(tmp_path, s)

    @pytest.mark.parametrize("keep", [0, 1, 10, 100, -1])
    def test_truncated(self, tmp_path: Path, keep: int) -> None:
        s = store(tmp_path)
        s.save(entries())
        path = tmp_path / "state" / "checkpoint.json"
        raw = path.read_bytes()
        path.write_bytes(raw[:keep] if keep >= 0 else raw[: len(raw) // 2])
        self._check_quarantined(tmp_path, s)

    def test_checksum_mismatch(self, tmp_path: Path) -> None:
        s = store(tmp_path)
        s.save(entries())
        path = tmp_path / "state" / "checkpoint.json"
        doc = json.loads(path.read_text())
        doc["data"]["claims"][UID]["devices"][0]["device"] = "gpu-7"  # tampered
        path.write_text(json.dumps(doc))
        self._check_quarantined(tmp_path, s)

    def test_future_version(self, tmp_path: Path) -> None:
        s = store(tmp_path)
        s.save(entries())
        path = tmp_path / "state" / "checkpoint.json"
        doc = json.loads(path.read_text())
        doc["version"] = CHECKPOINT_VERSION + 1
        path.write_text(json.dumps(doc))
        self._check_quarantined(tmp_path, s)

    def test_foreign_node(self, tmp_path: Path) -> None:
        store(tmp_path, node="node-b").save(entries())
        self._check_quarantined(tmp_path, store(tmp_path, node="node-a"))

    def test_wrong_shape_with_valid_checksum(self, tmp_path: Path) -> None:
        s = store(tmp_path)
        s.save(entries())
        path = tmp_path / "state" / "checkpoint.json"
        doc = json.loads(path.read_text())
        doc["data"]["claims"][UID]["state"] = "Exploded"
        import hashlib

        from dra_driver.node.prepare.checkpoint import canonical

        doc["checksum"] = "sha256:" + hashlib.sha256(canonical(doc["data"])).hexdigest()
        path.write_text(json.dumps(doc))
        self._check_quarantined(tmp_path, s)

    def test_not_an_object_and_wrong_kind(self, tmp_path: Path) -> None:
        s = store(tmp_path)
        (tmp_path / "state").mkdir()
        path = tmp_path / "state" / "checkpoint.json"
        path.write_text("[]")
        assert s.load() == {}
        path.write_text(json.dumps({"kind": "Other", "version": 1}))
        assert s.load() == {}
        assert len(corrupt_files(tmp_path)) == 2  # distinct names even within one second

    def test_quarantine_logs_clearly(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        s = store(tmp_path)
        s.save(entries())
        (tmp_path / "state" / "checkpoint.json").write_text("{")
        s.load()
        err = capsys.readouterr()
        text = err.out + err.err
        assert "checkpoint is unusable" in text and "corrupt-" in text


class TestBoot:
    def test_reboot_keeps_entries(self, tmp_path: Path) -> None:
        store(tmp_path, boot="boot-1").save(entries())
        s = store(tmp_path, boot="boot-2")
        assert s.load() == entries()
        assert s.rebooted

    def test_same_boot(self, tmp_path: Path) -> None:
        store(tmp_path).save(entries())
        s = store(tmp_path)
        s.load()
        assert not s.rebooted

    def test_boot_id_from_file(self, tmp_path: Path) -> None:
        f = tmp_path / "boot_id"
        f.write_text("abc-123\n")
        assert CheckpointStore(tmp_path, "n", DRIVER, boot_id_path=f).boot_id == "abc-123"
        assert CheckpointStore(tmp_path, "n", DRIVER, boot_id_path=tmp_path / "missing").boot_id == ""


class TestWriteFailures:
    def test_enospc_keeps_old_file(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        s = store(tmp_path)
        s.save(entries())

        def full(fd: int, data: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "write", full)
        with pytest.raises(OSError) as info:
            s.save({})
        monkeypatch.undo()
        assert "no space left on device" in describe_os_error(info.value, "x")
        assert s.load() == entries()
        assert [p.name for p in (tmp_path / "state").iterdir()] == ["checkpoint.json"]

    def test_ensure_dir_modes(self, tmp_path: Path) -> None:
        old = os.umask(0o022)
        try:
            ensure_dir(tmp_path / "a" / "b" / "c", 0o750)
        finally:
            os.umask(old)
        for p in ("a", "a/b", "a/b/c"):
            assert stat.S_IMODE((tmp_path / p).stat().st_mode) == 0o750


class TestJournal:
    """Saves after a process's first append one record, flushed with one fdatasync."""

    def lines(self, tmp_path: Path) -> list[bytes]:
        return (tmp_path / "state" / "checkpoint.json").read_bytes().splitlines()

    def test_a_save_appends_one_record_of_what_changed(self, tmp_path: Path) -> None:
        s = store(tmp_path)
        both = entries()
        s.save({UID: both[UID]})
        s.save(both)
        s.save({UID2: both[UID2]})
        first, *records = self.lines(tmp_path)
        assert json.loads(first)["data"]["claims"].keys() == {UID}
        assert [json.loads(r)["record"]["seq"] for r in records] == [1, 2]
        assert json.loads(records[0])["record"]["set"].keys() == {UID2} and json.loads(records[0])["record"]["del"] == []
        assert json.loads(records[1])["record"] == {"seq": 2, "bootID": "boot-1", "set": {}, "del": [UID]}
        assert store(tmp_path).load() == {UID2: both[UID2]}

    def test_nothing_changed_writes_nothing(self, tmp_path: Path) -> None:
        s = store(tmp_path)
        both = entries()
        s.save(both)
        s.save(dict(both))
        assert len(self.lines(tmp_path)) == 1

    def test_one_fdatasync_per_save_and_no_fsync(self, tmp_path: Path, flushes: Callable[[], list[str]]) -> None:
        s = store(tmp_path)
        s.save({})
        calls = flushes()
        s.save(entries())
        s.save({})
        assert calls == ["fdatasync", "fdatasync"]

    def test_first_save_of_a_process_is_a_snapshot(self, tmp_path: Path) -> None:
        store(tmp_path).save({})
        store(tmp_path).save(entries())
        s = store(tmp_path)
        assert s.load() == entries()
        s.save(entries())
        assert len(self.lines(tmp_path)) == 1

    def test_compaction(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr("dra_driver.node.prepare.checkpoint.COMPACT_MIN_BYTES", 4096)
        s = store(tmp_path)
        both = entries()
        s.save({})
        longest = 0
        for i in range(40):
            s.save(both if i % 2 else {})
            longest = max(longest, len(self.lines(tmp_path)))
            assert store(tmp_path).load() == (both if i % 2 else {})
        assert 2 < longest < 40, "records are compacted into a new snapshot"
        assert [p.name for p in (tmp_path / "state").iterdir()] == ["checkpoint.json"]

    def test_version_1_file_loads(self, tmp_path: Path) -> None:
        s = store(tmp_path)
        doc = json.loads(s.encode(entries()))
        doc["version"] = 1
        (tmp_path / "state").mkdir()
        (tmp_path / "state" / "checkpoint.json").write_text(json.dumps(doc) + "\n")
        assert s.load() == entries() and s.quarantined is None
        s.save({})
        assert json.loads(self.lines(tmp_path)[0])["version"] == CHECKPOINT_VERSION

    @pytest.mark.parametrize("tail", [b'{"checksum":"sha256:ab', b"\x00" * 700, b'{"checksum":"sha256:00","rec\x00\x00'])
    def test_torn_last_record_is_dropped(self, tmp_path: Path, tail: bytes,
                                         capsys: pytest.CaptureFixture[str]) -> None:
        s = store(tmp_path)
        s.save({})
        s.save(entries())
        path = tmp_path / "state" / "checkpoint.json"
        with open(path, "ab") as f:
            f.write(tail)
        loaded = store(tmp_path)
        assert loaded.load() == entries() and loaded.quarantined is None
        assert "cut short" in capsys.readouterr().out
        loaded.save({})  # a snapshot replaces the torn file
        assert store(tmp_path).load() == {} and len(self.lines(tmp_path)) == 1

    @pytest.mark.parametrize(("damage", "reason"), [
        (lambda lines: [lines[0], lines[1].replace(b'"gpu-0"', b'"gpu-7"'), lines[2]],  # valid JSON, wrong checksum
         "checksum mismatch in journal line 1"),
        (lambda lines: [lines[0], lines[2]], "sequence number 2"),  # a record missing
    ], ids=["bad-checksum", "missing-record"])
    def test_damaged_journal_is_quarantined(self, tmp_path: Path, damage: Any, reason: str) -> None:
        s = store(tmp_path)
        s.save({})
        s.save(entries())
        s.save({})
        path = tmp_path / "state" / "checkpoint.json"
        path.write_bytes(b"".join(damage(path.read_bytes().splitlines(keepends=True))))
        fresh = store(tmp_path)
        assert fresh.load() == {}
        assert reason in (fresh.quarantine_reason or "")

    def test_failed_append_is_cut_back(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        s = store(tmp_path)
        s.save({})
        real = os.write

        def half(fd: int, data: bytes) -> int:
            if len(data) > 64:
                return real(fd, bytes(data)[:64])
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "write", half)
        with pytest.raises(OSError):
            s.save(entries())
        monkeypatch.undo()
        assert self.lines(tmp_path) == self.lines(tmp_path)[:1], "the partial record was cut off"
        s.save({UID: entries()[UID]})  # appends after the last complete save
        assert store(tmp_path).load() == {UID: entries()[UID]}

    def test_failed_flush_is_cut_back(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        s = store(tmp_path)
        s.save({})

        def eio(fd: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", eio)
        with pytest.raises(OSError):
            s.save(entries())
        monkeypatch.undo()
        assert store(tmp_path).load() == {}, "a save that failed leaves the file as it was"

    def test_reboot_seen_in_the_last_record(self, tmp_path: Path) -> None:
        store(tmp_path, boot="boot-1").save({})
        s = store(tmp_path, boot="boot-2")
        s.load()
        s.save(entries())  # snapshot of boot-2
        s.save({})  # record of boot-2
        later = store(tmp_path, boot="boot-2")
        assert later.load() == {} and not later.rebooted and later.saved_boot_id == "boot-2"
        assert store(tmp_path, boot="boot-3").load() == {}
