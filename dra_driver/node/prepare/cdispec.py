"""What every CDI spec file the node plugin writes has in common: the modes of the files and their
directory, whether they are fsynced, the bytes a spec is written as and the lowest ``cdiVersion``
its content needs. The two writers stand on it side by side: the claims' specs
(:mod:`dra_driver.node.prepare.cdi`) and the device metadata specs
(:mod:`dra_driver.node.prepare.metadata`).
"""

from __future__ import annotations

import json
from typing import Any

SPEC_MODE = 0o644
DIR_MODE = 0o755
DERIVED_FILES_DURABLE = False
"""Whether claims' CDI specs and device metadata files are fsynced. They are not: they are derived
from the checkpoint, and a power loss, the one thing that can tear them, ends in a new boot that
re-writes every prepared claim's files from it before serving (:mod:`dra_driver.node.prepare.state`,
"Durability"; ``test_power_loss_*`` in the unit tests)."""


# --- spec content -----------------------------------------------------------------------------


def spec_bytes(spec: dict[str, Any]) -> bytes:
    """A spec file's content: compact JSON, which json's C encoder writes (an indented dump goes
    through its pure-Python encoder, several times slower on the prepare path)."""
    return json.dumps(spec, separators=(",", ":")).encode() + b"\n"


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def minimum_cdi_version(spec: dict[str, Any]) -> str:
    """The lowest ``cdiVersion`` whose features cover what ``spec`` uses (of what we emit)."""
    version = "0.3.0"

    def need(v: str) -> None:
        nonlocal version
        if _version_tuple(v) > _version_tuple(version):
            version = v

    edits = [spec.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in spec.get("devices", [])]
    for e in edits:
        if any("hostPath" in n for n in e.get("deviceNodes", [])):
            need("0.5.0")
        if any("type" in m for m in e.get("mounts", [])):
            need("0.4.0")
        if "intelRdt" in e or "additionalGids" in e:
            need("0.7.0")
        if "netDevices" in e:
            need("1.1.0")
    for d in spec.get("devices", []):
        if d["name"][:1].isdigit():
            need("0.5.0")
        if "annotations" in d:
            need("0.6.0")
    if "annotations" in spec or "." in spec["kind"].split("/", 1)[1]:
        need("0.6.0")
    return version
