"""The checkpoint's lines as bytes and JSON (:mod:`~dra_driver.node.prepare.checkpoint` has the
format): canonical JSON, checksums, and the verification of a journal record."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


class CheckpointError(Exception):
    """Why a checkpoint file could not be used (it has been quarantined)."""


def canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def checksum(payload: bytes) -> str:
    """The ``checksum`` field of a snapshot or record over its canonical JSON ``payload``."""
    return "sha256:" + hashlib.sha256(payload).hexdigest()


def read_record(line: bytes, number: int) -> dict[str, Any]:
    """A verified journal record (line ``number``; the snapshot is line 0)."""
    try:
        doc = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"journal line {number} is not valid JSON: {exc}") from None
    record = doc.get("record") if isinstance(doc, dict) else None
    if not isinstance(record, dict):
        raise CheckpointError(f"journal line {number} has no record")
    want = checksum(canonical(record))
    if doc.get("checksum") != want:
        raise CheckpointError(f"checksum mismatch in journal line {number}: file says {doc.get('checksum')!r}, "
                              f"content is {want!r}")
    if record.get("seq") != number:
        raise CheckpointError(f"journal line {number} has sequence number {record.get('seq')!r}: a record is missing "
                              "or out of order")
    if not isinstance(record.get("set"), dict) or not isinstance(record.get("del"), list) \
            or not isinstance(record.get("bootID"), str):
        raise CheckpointError(f"journal line {number} is not a record of set, del and bootID")
    return record


def claims_of(data: Mapping[str, Any]) -> dict[str, Any]:
    claims = data.get("claims") or {}
    if not isinstance(claims, dict) or not all(isinstance(v, dict) for v in claims.values()):
        raise CheckpointError("claims must be an object of objects")
    return claims
