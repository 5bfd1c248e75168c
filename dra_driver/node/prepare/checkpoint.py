"""Prepared claims on disk: ``<state_dir>/checkpoint.json``.

The file survives plugin restarts (and node reboots, when the state dir is on persistent disk) so
that a re-sent NodePrepareResources returns the same devices, NodeUnprepareResources works in a
new process, and claims half-prepared by a crashed process can be rolled back.

Format: JSON lines. The first line is a **snapshot** of every entry (shown indented)::

    {
      "kind": "DraDriverCheckpoint",
      "version": 2,
      "checksum": "sha256:<hex of SHA-256 over the canonical JSON of data>",
      "data": {
        "nodeName": "node-a", "driverName": "gpu.dra-driver.io", "bootID": "<boot id at write>",
        "claims": {
          "<claim uid>": {
            "state": "PrepareStarted" | "PrepareCompleted",
            "namespace": "ns", "name": "claim", "bootID": "<boot id when prepared>",
            "updated": "2026-01-01T00:00:00.000000Z", "podClaimName": "gpu" (claims from a template),
            "preparedBy": "<pod UID of the plugin instance>" (when it knew its pod),
            "devices": [{"pool": "node-a", "device": "gpu-0", "requests": ["req/sub"],
                         "cdiDeviceIDs": ["k8s.gpu.dra-driver.io/claim=<uid>-gpu-0"],
                         "sharing": {"strategy": "Exclusive"}, "shareID": null, "adminAccess": false,
                         "uuid": "GPU-...", "gpuUUID": "GPU-...", "gpuMinor": 0, "migCaps": [],
                         "migInstance": null, "kind": "gpu", "placement": null,
                         "consumedCapacity": {}, "memoryShareBytes": null, "computeSharePercent": null}]
          }
        }
      }
    }

Every later line is a **journal record**, the change one save made, applied in order::

    {"checksum": "sha256:<hex over the canonical JSON of record>",
     "record": {"seq": 1, "bootID": "<boot id at write>", "set": {"<uid>": {<entry>}}, "del": ["<uid>"]}}

Canonical JSON = ``json.dumps(x, sort_keys=True, separators=(",", ":"), ensure_ascii=True)``; every
line is canonical JSON. A version 1 file (the snapshot alone) loads as it is. An entry and its
devices are read and written by :mod:`dra_driver.node.prepare.entries`; this module is the file.

**Why a journal.** A save appends one record and makes it durable with one ``fdatasync``: the
file's directory entry is already durable, and an append changes only the file's data and size,
which ``fdatasync`` flushes. Rewriting the whole file atomically costs two fsyncs (the file, then
the directory for the rename) and serializes and checksums every claim on every save. So a
prepare (``PrepareStarted``, then ``PrepareCompleted``) costs two flushes and an unprepare one,
each record as long as the claims it changes. The durability order is unchanged: a save returns
only once its record is on disk. When the records outgrow the snapshot (:data:`COMPACT_MIN_BYTES`,
twice the snapshot), the next save writes a new snapshot atomically (temporary file, fsync,
rename, directory fsync) in place of the file; so does the first save of a process.

**A torn tail.** A power loss during an append can leave its record cut short, or the file's new
length filled with NUL bytes. Such a record was never acknowledged (its save had not returned), so
a last line without its newline is dropped with a warning. Anything else that does not verify
(a line with a bad checksum, out of sequence, or a damaged snapshot) is damage, not a torn write.

**Upgrades and rollbacks.** A plugin pod of one release may read a file the other release wrote,
both ways: a rolling update runs the two side by side on one state directory, and a rollback
starts the previous release on what the new one left. The rule: *a release writes nothing that the
previous release cannot read.* Readers ignore fields they do not know, in the snapshot, its
entries and devices, and in journal records (the checksum covers them all the same); so a new
optional field (``preparedBy``) ships in one release. A change that cannot be ignored (a field whose
absence or old meaning would be wrong, a new ``state`` or device ``kind``, a new ``version``) ships its
reader one release before its writer. ``version`` changes only with such a change: a reader refuses
(quarantines) a newer version. A release that saves drops the fields it does not know; they are
only what the newer release may lack.

Loading never raises for bad content: a file that does not parse, fails a checksum, has a newer
version, or belongs to another node or driver is renamed to ``checkpoint.json.corrupt-<UTC
timestamp>`` and recovery starts empty. A different boot ID keeps the entries (``/var/run/cdi`` is
emptied by a reboot, so re-prepare must re-write the specs). The file is 0600 inside a 0700
directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from dra_driver import failpoints, logs
from dra_driver.node.fileio import atomic_write, ensure_dir, remove_stale_temp_files, temp_name_prefix
from dra_driver.node.metrics import METRICS
from dra_driver.node.prepare.entries import ClaimEntry
from dra_driver.node.prepare.entries import ClaimState as ClaimState  # e2e/suites still import it from here
from dra_driver.node.prepare.journal import CheckpointError, canonical, checksum, claims_of, read_record
from dra_driver.ondisk import CHECKPOINT_FILE

CHECKPOINT_KIND = "DraDriverCheckpoint"
CHECKPOINT_VERSION = 2
COMPACT_MIN_BYTES = 256 * 1024
"""Journal records are compacted into a new snapshot once they exceed this and twice the snapshot."""
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")

_log = logs.get("checkpoint")


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


class _Replayed(NamedTuple):
    entries: dict[str, ClaimEntry]
    boot_id: str  # the last save's
    torn: int  # bytes of a last record cut short (0: none)
    version: int
    records: int
    snapshot_size: int


# --- the store --------------------------------------------------------------------------------


class CheckpointStore:
    """Loads and saves ``<state_dir>/checkpoint.json`` for one node and driver.

    One process saves (the plugin); others may :meth:`load` at any time and see the last complete
    save. Not thread-safe: the caller serializes saves (the plugin's state lock does).
    """

    def __init__(
        self,
        state_dir: Path,
        node_name: str,
        driver_name: str,
        *,
        boot_id: str | None = None,
        boot_id_path: Path = BOOT_ID_PATH,
        instance: str | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.instance = instance
        """This plugin instance's pod UID, recorded in the entries it prepares."""
        self.path = self.state_dir / CHECKPOINT_FILE
        self.node_name = node_name
        self.driver_name = driver_name
        self.boot_id = boot_id if boot_id is not None else read_boot_id(boot_id_path)
        self.rebooted = False
        """Set by :meth:`load` when the file was written in another boot."""
        self.saved_boot_id = ""
        """Set by :meth:`load`: the boot ID of the file's last save."""
        self.quarantined: Path | None = None
        """Set by :meth:`load` when it moved a bad file aside."""
        self.quarantine_reason: str | None = None
        """Set by :meth:`load` when the file was unusable: why."""
        self._log = _log.bind(node=node_name, path=str(self.path))
        # What this process knows the file holds, for appending: None until its first save,
        # which writes a snapshot (a loaded file may end in a torn record, and is not appended to).
        self._saved: dict[str, ClaimEntry] | None = None
        self._fd: int | None = None
        self._size = 0
        self._snapshot_size = 0
        self._seq = 0
        # (device, inode, size) of the file as this process last read or wrote it: another
        # instance's save changes it (see sync).
        self._seen: tuple[int, int, int] | None = None

    def close(self) -> None:
        """Close the file kept open for appending; the next save writes a snapshot."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None
        self._saved = None

    def load(self, *, adopt: bool = False) -> dict[str, ClaimEntry]:
        """The saved entries; empty (after quarantining the file) when the file is unusable.

        ``adopt``: the next save appends to the file when it ends in a whole record of this version
        (not only after a save of this process)."""
        self.rebooted = False
        self.quarantined = None
        self.quarantine_reason = None
        self.close()
        self._seen = None
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
                st = os.fstat(f.fileno())
        except FileNotFoundError:
            return {}
        except OSError as exc:
            self._log.error("checkpoint unreadable; starting with no prepared claims", error=str(exc))
            self._quarantine(f"unreadable: {exc}")
            return {}
        try:
            replayed = self._replay(raw)
        except (CheckpointError, ValueError, TypeError, KeyError, AttributeError) as exc:
            self._quarantine(str(exc))
            return {}
        entries, saved_boot, torn = replayed.entries, replayed.boot_id, replayed.torn
        self._seen = (st.st_dev, st.st_ino, len(raw))
        if adopt and not torn and replayed.version == CHECKPOINT_VERSION:
            self._adopt(replayed, st)
        if torn:
            self._log.warning("dropped a checkpoint record cut short by a crash or power loss; its save had not "
                              "returned, so nothing was acknowledged from it", bytes=torn)
        self.saved_boot_id = saved_boot
        if saved_boot and self.boot_id and saved_boot != self.boot_id:
            self.rebooted = True
            self._log.warning(
                "node rebooted since the checkpoint was written; keeping prepared claims so that "
                "re-prepare re-creates their CDI specs",
                saved_boot_id=saved_boot, boot_id=self.boot_id, claims=len(entries),
            )
        return entries

    def _adopt(self, replayed: _Replayed, st: os.stat_result) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino, now.st_size) != (st.st_dev, st.st_ino, st.st_size):
            os.close(fd)  # replaced meanwhile (not under the serialize lock): the next save writes a snapshot
            return
        self._fd, self._saved = fd, dict(replayed.entries)
        self._size, self._snapshot_size, self._seq = st.st_size, replayed.snapshot_size, replayed.records

    def sync(self) -> dict[str, ClaimEntry] | None:
        """What the file holds now when another process (a second plugin instance, see
        :mod:`~dra_driver.node.prepare.sharedstate`) saved since this one last read or wrote it; None
        when nothing changed. Called under the serialize lock, so nobody writes meanwhile.

        Records appended to the file this process knows are read alone; a file replaced (the other
        instance wrote a snapshot) or cut short is loaded whole, and appended to from then on.
        """
        try:
            st = os.stat(self.path)
            now: tuple[int, int, int] | None = (st.st_dev, st.st_ino, st.st_size)
        except FileNotFoundError:
            now = None
        seen = self._seen
        if now == seen:
            return None
        if now is not None and seen is not None and now[:2] == seen[:2] and now[2] > seen[2]:
            caught_up = self._catch_up(now)
            if caught_up is not None:
                return caught_up
        return self.load(adopt=True)

    def _catch_up(self, now: tuple[int, int, int]) -> dict[str, ClaimEntry] | None:
        """The entries after the records appended since this process's last save; None when they
        cannot be read alone (a torn last record, or this process has not saved: load it whole)."""
        saved = self._saved
        if saved is None or self._fd is None:  # the open descriptor is what keeps the inode ours
            return None
        with open(self.path, "rb") as f:
            f.seek(self._size)
            tail = f.read(now[2] - self._size)
        if not tail.endswith(b"\n"):
            return None
        entries = dict(saved)
        seq = self._seq
        try:
            for line in tail[:-1].split(b"\n"):
                seq += 1
                record = read_record(line, seq)
                for uid, entry in record["set"].items():
                    entries[uid] = ClaimEntry.from_dict(uid, entry)
                for uid in record["del"]:
                    entries.pop(uid, None)
                self.saved_boot_id = record["bootID"]
        except (CheckpointError, ValueError, TypeError, KeyError, AttributeError):
            return None
        self._saved, self._size, self._seq, self._seen = entries, now[2], seq, now
        return dict(entries)

    def remove_stale_temp_files(self) -> list[str]:
        """Delete temporary files of checkpoint writes interrupted by a crash (start-up only)."""
        prefix = temp_name_prefix(self.path)
        return remove_stale_temp_files(self.state_dir, lambda name: name.startswith(prefix))

    def _replay(self, raw: bytes) -> _Replayed:
        lines = raw.split(b"\n")
        tail = lines.pop()  # b"" when the file ends with its last newline
        if not lines:
            # Snapshots are written whole (temp file, rename), so one without its newline is still
            # the snapshot: if it is cut short, parsing says so.
            lines, tail = [tail], b""
        torn = len(tail)
        version, data = self._parse(lines[0])
        entries = {uid: ClaimEntry.from_dict(uid, e) for uid, e in claims_of(data).items()}
        boot = str(data.get("bootID") or "")
        if version < 2 and len(lines) > 1:
            raise CheckpointError(f"version {version} has no journal, but the file has {len(lines)} lines")
        for number, line in enumerate(lines[1:], start=1):
            record = read_record(line, number)
            for uid, entry in record["set"].items():
                entries[uid] = ClaimEntry.from_dict(uid, entry)
            for uid in record["del"]:
                entries.pop(uid, None)
            boot = record["bootID"]
        return _Replayed(entries, boot, torn, version, len(lines) - 1, len(lines[0]) + 1)

    def _parse(self, raw: bytes) -> tuple[int, dict[str, Any]]:
        """The snapshot line's version and verified ``data``."""
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"not valid JSON (truncated or corrupted): {exc}") from None
        if not isinstance(doc, dict):
            raise CheckpointError("not a JSON object")
        if doc.get("kind") != CHECKPOINT_KIND:
            raise CheckpointError(f"kind is {doc.get('kind')!r}, want {CHECKPOINT_KIND!r}")
        version = doc.get("version")
        if isinstance(version, bool) or not isinstance(version, int):
            raise CheckpointError(f"version is {version!r}, want an integer")
        if version > CHECKPOINT_VERSION:
            raise CheckpointError(
                f"version {version} is newer than this driver understands ({CHECKPOINT_VERSION}); "
                "was the driver downgraded?"
            )
        if version < 1:
            raise CheckpointError(f"unsupported version {version}")
        data = doc.get("data")
        if not isinstance(data, dict):
            raise CheckpointError("data is missing")
        want = checksum(canonical(data))
        if doc.get("checksum") != want:
            raise CheckpointError(f"checksum mismatch: file says {doc.get('checksum')!r}, content is {want!r}")
        if data.get("nodeName") != self.node_name:
            raise CheckpointError(f"written for node {data.get('nodeName')!r}, this is node {self.node_name!r}")
        if data.get("driverName") != self.driver_name:
            raise CheckpointError(
                f"written for driver {data.get('driverName')!r}, this is driver {self.driver_name!r}"
            )
        return version, data

    def _quarantine(self, reason: str) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        self.quarantine_reason = reason
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while target.exists():
            target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
            n += 1
        try:
            os.replace(self.path, target)
            self.quarantined = target
            self._log.error(
                "checkpoint is unusable; moved it aside and starting with no prepared claims",
                reason=reason, quarantined_to=str(target),
            )
        except OSError as exc:
            self._log.error(
                "checkpoint is unusable and could not be moved aside; starting with no prepared claims",
                reason=reason, error=str(exc),
            )

    def encode(self, entries: Mapping[str, ClaimEntry]) -> bytes:
        """A snapshot line of ``entries``."""
        data = {
            "nodeName": self.node_name,
            "driverName": self.driver_name,
            "bootID": self.boot_id,
            "claims": {uid: entry.to_dict() for uid, entry in sorted(entries.items())},
        }
        doc = {
            "kind": CHECKPOINT_KIND,
            "version": CHECKPOINT_VERSION,
            "checksum": checksum(canonical(data)),
            "data": data,
        }
        # Canonical (compact) like the checksummed part: json's C encoder writes it; an indented
        # dump goes through its pure-Python encoder, which made each save several times slower.
        return canonical(doc) + b"\n"

    def save(self, entries: Mapping[str, ClaimEntry]) -> None:
        """Make ``entries`` what the file holds, durably; OSError (e.g. ENOSPC) propagates and the
        file keeps what it held."""
        started = time.perf_counter()
        saved, fd = self._saved, self._fd
        journal = self._size - self._snapshot_size
        if saved is None or fd is None or journal > max(COMPACT_MIN_BYTES, 2 * self._snapshot_size):
            self._write_snapshot(entries)
        else:
            self._append(fd, saved, entries)
        METRICS.checkpoint_write_seconds.observe(time.perf_counter() - started)

    def _write_snapshot(self, entries: Mapping[str, ClaimEntry]) -> None:
        self.close()
        ensure_dir(self.state_dir, 0o700)
        data = self.encode(entries)
        atomic_write(self.path, data, 0o600)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._saved = dict(entries)
        self._size = self._snapshot_size = len(data)
        self._seq = 0
        st = os.fstat(self._fd)
        self._seen = (st.st_dev, st.st_ino, self._size)

    def _append(self, fd: int, saved: dict[str, ClaimEntry], entries: Mapping[str, ClaimEntry]) -> None:
        changed = {uid: entry.to_dict() for uid, entry in entries.items() if saved.get(uid) is not entry}
        removed = [uid for uid in saved if uid not in entries]
        if not changed and not removed:
            return
        record = canonical({"seq": self._seq + 1, "bootID": self.boot_id, "set": changed, "del": sorted(removed)})
        # The canonical JSON of {"checksum": ..., "record": ...}, without encoding the record twice.
        line = b'{"checksum":"%s","record":%s}\n' % (checksum(record).encode(), record)
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
            failpoints.hit("checkpoint.before-flush")
            os.fdatasync(fd)
        except OSError:
            # Cut the file back to its last complete save. If even that fails, the next save
            # replaces the whole file with a snapshot.
            try:
                os.ftruncate(fd, self._size)
            except OSError:
                self.close()
            raise
        self._size += len(line)
        self._seq += 1
        self._saved = dict(entries)
        if self._seen is not None:
            self._seen = (self._seen[0], self._seen[1], self._size)
