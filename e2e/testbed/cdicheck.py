"""CDI spec files as the reference CDI library sees them: the ``cdi-validate`` Go tool.

``cdi-validate`` (``e2e/tooling/gotools/cdi-validate/main.go``) is built from its pin over
``tags.cncf.io/container-device-interface`` at the version containerd in the bed links. It reads each
spec file as a runtime's spec directory scan does, and resolves and injects each of its devices
through a CDI cache, as containerd does for a container. One process checks any number of paths.

    check([dir_or_file, ...])             # a Verdict per spec file and per device
    inject(cdi_dir, ["vendor/class=name"]) # the OCI spec that containerd would give a container

The unit suite checks every spec the driver writes with it (``unit_tests/cdispecs.py``).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.tooling import gotools
from e2e.tooling.toolsets import CDI_VALIDATE_TOOL as TOOL

INJECTED = "ok"
NEEDS_HOST_DEVICES = "needs-host-devices"
"""Injection looks up, on this machine, each device node the spec does not fully describe; where one
is absent here, whether the device injects depends on the host, not on the spec."""


class CdiCheckError(RuntimeError):
    """The tool could not run or was used wrongly (not a verdict on a spec)."""


@dataclass(frozen=True)
class Verdict:
    """The library's word on one spec file (``device`` empty) or on one device of a loaded spec."""

    spec: str
    ok: bool
    error: str = ""
    device: str = ""
    kind: str = ""
    cdi_version: str = ""
    minimum_version: str = ""
    """The lowest ``cdiVersion`` the spec's content needs, by the library's rules."""
    injected: str = ""
    absent_host_devices: tuple[str, ...] = ()

    @classmethod
    def from_line(cls, line: dict[str, Any]) -> Verdict:
        return cls(spec=line["spec"], ok=line["ok"], error=line.get("error", ""), device=line.get("device", ""),
                   kind=line.get("kind", ""), cdi_version=line.get("cdiVersion", ""),
                   minimum_version=line.get("minimumVersion", ""), injected=line.get("injected", ""),
                   absent_host_devices=tuple(line.get("absentHostDevices", ())))


@dataclass(frozen=True)
class Injection:
    devices: tuple[str, ...]
    ok: bool
    error: str
    oci: dict[str, Any]
    """The OCI runtime spec after injection into an empty one (``process.env``, ``mounts``, ``linux.devices``)."""


def binary() -> Path:
    """The built tool (built from its pin on first use, saying so: half a minute cold; then cached)."""
    return gotools.ensure([TOOL], log=True) / TOOL


def _run(args: Sequence[str], paths: Sequence[Path | str]) -> list[dict[str, Any]]:
    proc = subprocess.run([str(binary()), *args, "-"], input="".join(f"{p}\n" for p in paths),
                          capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1):
        raise CdiCheckError(f"{TOOL} failed ({proc.returncode}): {proc.stderr.strip()}")
    return [json.loads(line) for line in proc.stdout.splitlines()]


def check(paths: Sequence[Path | str]) -> list[Verdict]:
    """The verdicts on every spec file of these paths: a directory is read as a runtime's spec
    directory (one cache over it), a file alone."""
    if not paths:
        return []
    return [Verdict.from_line(line) for line in _run([], paths)]


def inject(cdi_dir: Path, devices: Sequence[str]) -> tuple[list[Verdict], Injection]:
    """The directory's verdicts, and these devices injected together as containerd does for one container."""
    if not devices:
        raise CdiCheckError("inject: name at least one device")
    *lines, last = _run(["-inject", ",".join(devices)], [cdi_dir])
    injection = Injection(devices=tuple(last["inject"]), ok=last["ok"], error=last.get("error", ""),
                          oci=last.get("oci") or {})
    return [Verdict.from_line(line) for line in lines], injection


def problems(verdicts: Sequence[Verdict]) -> list[str]:
    """One line per verdict that is not ok, naming the spec file (and device) and the library's error."""
    return [f"{v.spec}{f' device {v.device}' if v.device else ''}: {v.error}" for v in verdicts if not v.ok]
