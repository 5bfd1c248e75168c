"""The peer's checkpoint of prepared claims (``<state-dir>/peer-state.json``).

Like the kubelet's DRA checkpoint, a claim is recorded together with the pods that use it
*before* the driver is called, so a crash between the call and the record cannot leak a
prepared claim: the reconcile loop will unprepare it.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .model import ClaimRef, PreparedDevice

STATE_VERSION = 1


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass
class DriverState:
    prepared: bool = False
    devices: list[PreparedDevice] = field(default_factory=list)


@dataclass
class ClaimRecord:
    namespace: str
    name: str
    uid: str
    drivers: dict[str, DriverState] = field(default_factory=dict)
    pods: set[str] = field(default_factory=set)

    @property
    def ref(self) -> ClaimRef:
        return ClaimRef(self.namespace, self.name, self.uid)

    def fully_prepared(self) -> bool:
        return all(d.prepared for d in self.drivers.values())

    def devices(self) -> list[PreparedDevice]:
        return [dev for d in self.drivers.values() for dev in d.devices]

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
            "pods": sorted(self.pods),
            "drivers": {
                name: {"prepared": d.prepared, "devices": [x.to_json() for x in d.devices]} for name, d in self.drivers.items()
            },
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ClaimRecord:
        return cls(
            namespace=d["namespace"],
            name=d["name"],
            uid=d["uid"],
            pods=set(d.get("pods") or ()),
            drivers={
                name: DriverState(
                    prepared=bool(s.get("prepared")),
                    devices=[PreparedDevice.from_json(x) for x in s.get("devices") or ()],
                )
                for name, s in (d.get("drivers") or {}).items()
            },
        )


class PeerState:
    """Claim records keyed by claim UID. Callers hold ``lock`` while reading or mutating."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.RLock()
        self.claims: dict[str, ClaimRecord] = {}

    def load(self) -> None:
        with self.lock:
            try:
                raw = json.loads(self.path.read_text())
            except FileNotFoundError:
                return
            self.claims = {uid: ClaimRecord.from_json(c) for uid, c in (raw.get("claims") or {}).items()}

    def save(self) -> None:
        with self.lock:
            doc = {"version": STATE_VERSION, "claims": {uid: c.to_json() for uid, c in sorted(self.claims.items())}}
            atomic_write(self.path, json.dumps(doc, indent=2, sort_keys=True))

    def claims_of_pod(self, pod_uid: str) -> list[ClaimRecord]:
        with self.lock:
            return [c for c in self.claims.values() if pod_uid in c.pods]
