"""The driver's common CDI edits, from the NVIDIA Container Toolkit: what a CUDA container needs besides
its device nodes (the driver's user-space libraries, ``nvidia-smi`` and friends, firmware, IPC sockets,
and the ``create-symlinks``/``update-ldcache`` hooks of ``nvidia-cdi-hook``).

Library discovery is the toolkit's (``nvidia-ctk cdi generate --mode management``): its spec-level
``containerEdits`` are taken, without the device nodes (each claim gets only its own) and without
``NVIDIA_VISIBLE_DEVICES`` (each claim sets its own). A plugin in a container sees the host's driver
root at ``--nvidia-driver-root`` (``/driver-root``); ``nvidia-ctk cdi transform root`` rewrites the
host paths to ``--host-driver-root``, since the runtime that applies the spec runs on the host.

The edits are generated once and again whenever the driver's libraries change (a stat of
``libnvidia-ml.so.1`` and ``libcuda.so.1``). A driver the toolkit cannot find is remembered as an
error that every prepare reports: a spec that would start a container without the driver is never
written.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

LIBRARY_DIRS = (
    "/usr/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current", "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/lib64", "/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu/nvidia/current", "/lib/aarch64-linux-gnu/nvidia/current",
)
"""Where nvidia-ctk (v1.20) looks for the driver's libraries under the driver root, after its ld.so.cache."""

FINGERPRINT_LIBRARIES = ("libnvidia-ml.so.1", "libcuda.so.1")
GENERATE_TIMEOUT_S = 60.0


class DriverEditsError(RuntimeError):
    """The toolkit could not produce the driver's edits; the message names what is missing and where."""


@dataclass(frozen=True)
class ToolkitConfig:
    ctk_path: Path
    hook_path: Path
    """``nvidia-cdi-hook`` as the host's runtime finds it (the hooks run on the host)."""
    driver_root: Path
    """The driver root as this process sees it."""
    host_driver_root: Path
    """The same root as the host sees it."""
    dev_root: Path


Fingerprint = tuple[tuple[str, str, int, int], ...]


def driver_fingerprint(driver_root: Path) -> Fingerprint:
    """Which driver libraries are installed (resolved name, size, mtime): changes when the driver does."""
    found = []
    for directory in LIBRARY_DIRS:
        for name in FINGERPRINT_LIBRARIES:
            path = driver_root / directory.lstrip("/") / name
            try:
                st = path.stat()
            except OSError:
                continue
            found.append((str(path), os.path.realpath(path), st.st_size, st.st_mtime_ns))
    return tuple(found)


def common_edits(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec-level edits of a generated spec that every claim needs: no device nodes, no
    ``NVIDIA_VISIBLE_DEVICES``."""
    edits = dict(spec.get("containerEdits") or {})
    edits.pop("deviceNodes", None)
    env = [e for e in edits.get("env") or [] if not e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    if env:
        edits["env"] = env
    else:
        edits.pop("env", None)
    if not edits.get("mounts"):
        raise DriverEditsError("nvidia-ctk generated no mounts of the driver's libraries")
    return edits


def merge_edits(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with every list of ``extra`` appended, entries already in ``base`` left out."""
    merged = {k: list(v) if isinstance(v, list) else v for k, v in base.items()}
    for key, values in extra.items():
        if not isinstance(values, list):
            merged.setdefault(key, values)
            continue
        have = merged.setdefault(key, [])
        for value in values:
            if value not in have:
                have.append(value)
    return merged


def search_path(driver_root: Path) -> str:
    return ", ".join([str(driver_root / "etc/ld.so.cache"), *(str(driver_root / d.lstrip("/")) for d in LIBRARY_DIRS)])


def describe_failure(driver_root: Path, stderr: str) -> str:
    """The toolkit's complaint, with what it searched: its last error line, and the search path."""
    lines = [ln for ln in stderr.splitlines() if "level=error" in ln or ln.startswith("Error")]
    detail = (lines[-1] if lines else stderr.strip().splitlines()[-1] if stderr.strip() else "no output")
    if 'msg="' in detail:
        detail = detail.split('msg="', 1)[1].rstrip('"')
    detail = detail.replace("\\n", "; ").replace('\\"', '"')
    return (f"the NVIDIA driver was not found under driver root {driver_root}: nvidia-ctk: {detail} "
            f"(searched {search_path(driver_root)})")


def missing_libcuda(edits: Mapping[str, Any]) -> str | None:
    """``libcuda.so.<version>`` when the edits mount no libcuda (the toolkit then settles for the
    libnvidia-ml it found, but no CUDA program can run); None when they do."""
    names = [Path(m.get("containerPath", "")).name for m in edits.get("mounts", [])]
    if any(n.startswith("libcuda.so.") for n in names):
        return None
    versions = [n.removeprefix("libnvidia-ml.so.") for n in names if n.startswith("libnvidia-ml.so.")]
    return f"libcuda.so.{versions[0] if versions else '<version>'}"


def generate_command(config: ToolkitConfig) -> list[str]:
    return [str(config.ctk_path), "--quiet", "cdi", "generate", "--format", "json", "--mode", "management",
            "--driver-root", str(config.driver_root), "--dev-root", str(config.dev_root),
            "--nvidia-cdi-hook-path", str(config.hook_path)]


def transform_command(config: ToolkitConfig) -> list[str]:
    return [str(config.ctk_path), "--quiet", "cdi", "transform", "root", "--from", str(config.driver_root),
            "--to", str(config.host_driver_root), "--relative-to", "host", "--input", "-"]


Runner = Callable[[list[str], str | None], subprocess.CompletedProcess[str]]


def run_tool(cmd: list[str], stdin: str | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False, timeout=GENERATE_TIMEOUT_S)


def generate(config: ToolkitConfig, runner: Runner = run_tool) -> dict[str, Any]:
    """The driver's common edits, with host paths; DriverEditsError naming what is missing."""
    try:
        proc = runner(generate_command(config), None)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DriverEditsError(f"cannot run nvidia-ctk at {config.ctk_path}: {exc}") from None
    if proc.returncode != 0:
        raise DriverEditsError(describe_failure(config.driver_root, proc.stderr))
    output = proc.stdout
    if config.driver_root.resolve() != config.host_driver_root.resolve():
        try:
            moved = runner(transform_command(config), output)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DriverEditsError(f"cannot run nvidia-ctk at {config.ctk_path}: {exc}") from None
        if moved.returncode != 0:
            raise DriverEditsError(f"nvidia-ctk cdi transform root failed: {moved.stderr.strip()[-500:]}")
        output = moved.stdout
    try:
        # generate writes JSON, transform YAML (which JSON is a subset of).
        spec = yaml.safe_load(output)
    except yaml.YAMLError as exc:
        raise DriverEditsError(f"nvidia-ctk wrote no CDI spec: {exc}") from None
    if not isinstance(spec, dict):
        raise DriverEditsError("nvidia-ctk wrote no CDI spec: not an object")
    edits = common_edits(spec)
    lib = missing_libcuda(edits)
    if lib is not None:
        raise DriverEditsError(f"the NVIDIA driver under driver root {config.driver_root} is incomplete: nvidia-ctk "
                               f"found no {lib} (searched {search_path(config.driver_root)})")
    return edits


class DriverEdits:
    """The cached common edits, regenerated when the driver changes; thread-safe."""

    def __init__(self, config: ToolkitConfig, runner: Runner = run_tool,
                 on_change: Callable[[dict[str, Any] | None, str | None], None] | None = None) -> None:
        self.config = config
        self._runner = runner
        self._on_change = on_change
        self._lock = threading.Lock()
        self._fingerprint: Fingerprint | None = None
        self._edits: dict[str, Any] | None = None
        self._error: str | None = None
        self.generations = 0

    def refresh(self) -> str | None:
        """Regenerate if the driver changed since the last time; returns the current error, if any."""
        with self._lock:
            return self._refresh_locked()[1]

    def edits(self) -> dict[str, Any]:
        """The current edits; DriverEditsError when the toolkit found no driver."""
        with self._lock:
            edits, error = self._refresh_locked()
        if edits is None:
            raise DriverEditsError(error or "the driver's CDI edits are unavailable")
        return edits

    def _refresh_locked(self) -> tuple[dict[str, Any] | None, str | None]:
        fingerprint = driver_fingerprint(self.config.driver_root)
        if fingerprint != self._fingerprint:
            self.generations += 1
            try:
                self._edits, self._error = generate(self.config, self._runner), None
            except DriverEditsError as exc:
                self._edits, self._error = None, str(exc)
            self._fingerprint = fingerprint
            if self._on_change is not None:
                self._on_change(self._edits, self._error)
        return self._edits, self._error
