"""MPS control daemons for the GPUs that MPS claims use: one per GPU, started before the first such
claim's prepare returns, stopped after its last claim is unprepared.

A daemon is ``nvidia-cuda-mps-control -d`` from the driver root, run by the plugin (not a pod,
see docs/sharing.md for why and what it costs), with ``CUDA_VISIBLE_DEVICES`` the GPU and its pipe
and log directories in ``<state dir>/mps/<GPU UUID>/``. Before it starts the GPU goes into
``EXCLUSIVE_PROCESS``, so that a process outside MPS cannot use it beside the daemon's server; after
it stops the GPU goes back to ``DEFAULT``. A container of an MPS claim gets both directories
mounted (:func:`container_edits`) and its client limits in its environment (the edits module);
the daemon's defaults, the smallest limits of the GPU's claims, bind a client that drops them.

What runs follows from the checkpoint's entries (:func:`wanted`), as for time-slices
(:mod:`~dra_driver.node.prepare.gpupolicy`): a claim's entry is on disk before its daemon starts,
and stays there until the daemon is stopped. A daemon is found by asking it (its control answers
in its pipe directory), never by a process list; every start, stop and adoption runs under the
state's lock and ``serialize.lock``, which two plugin instances of a node share, so they never
start two daemons for one GPU. A plugin that restarts finds a running daemon and adopts it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.gpuconfig import Strategy
from dra_driver.node.prepare.entries import ClaimEntry, DeviceKind, PreparedDevice
from dra_driver.node.prepare.gpupolicy import (
    DEFAULT_COMPUTE_MODE,
    SMI_DIRS,
    GpuControl,
    GpuPolicyError,
    find_tool,
    tool_environment,
)

TOOL = "nvidia-cuda-mps-control"
MPS_DIR = "mps"
"""``<state dir>/mps/<GPU UUID>/{pipe,log}``."""
EXCLUSIVE_PROCESS = "Exclusive_Process"
CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"
CONTAINER_LOG_DIR = "/var/log/nvidia-mps"
PID_FILE = "nvidia-cuda-mps-control.pid"
READY_TIMEOUT_S = 30.0
"""How long a started daemon may take to answer its control; then the claim fails."""
ASK_TIMEOUT_S = 10.0
_GPU_UUID = re.compile(r"GPU-[0-9a-fA-F-]{1,64}")


# --- decisions --------------------------------------------------------------------------------


def runs_mps(dev: PreparedDevice) -> bool:
    """Whether a prepared device needs its GPU's daemon: an MPS config on a whole GPU (a MIG slice
    gets the client limits in its environment and no daemon, see docs/sharing.md)."""
    return dev.sharing.strategy is Strategy.MPS and dev.kind is DeviceKind.GPU and bool(dev.gpu_uuid)


@dataclass(frozen=True)
class Defaults:
    """A daemon's default client limits: the smallest of its GPU's claims (None: none set one)."""

    active_thread_percentage: int | None = None
    pinned_memory_bytes: int | None = None


def _smallest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def wanted(entries: Iterable[ClaimEntry]) -> dict[str, Defaults]:
    """GPU UUID -> its daemon's defaults, for the GPUs the entries' MPS devices use."""
    out: dict[str, Defaults] = {}
    for entry in entries:
        for dev in entry.devices:
            if not runs_mps(dev):
                continue
            mps = dev.sharing.mps
            have = out.get(dev.gpu_uuid, Defaults())
            out[dev.gpu_uuid] = Defaults(
                _smallest(have.active_thread_percentage, mps.default_active_thread_percentage if mps else None),
                _smallest(have.pinned_memory_bytes, mps.default_pinned_device_memory_limit_bytes if mps else None))
    return out


def gpus_of(entry: ClaimEntry) -> list[str]:
    return list(dict.fromkeys(d.gpu_uuid for d in entry.devices if runs_mps(d)))


def to_stop(gone: Iterable[ClaimEntry], remaining: Iterable[ClaimEntry]) -> list[str]:
    """The GPUs whose daemon stops when the ``gone`` entries are removed: no ``remaining`` one uses them."""
    held = wanted(remaining)
    return [gpu for gpu in dict.fromkeys(g for e in gone for g in gpus_of(e)) if gpu not in held]


def control_commands(defaults: Defaults) -> list[str]:
    """The control commands that set a daemon's defaults (device 0: the daemon sees its GPU alone)."""
    out = []
    if defaults.active_thread_percentage is not None:
        out.append(f"set_default_active_thread_percentage {defaults.active_thread_percentage}")
    if defaults.pinned_memory_bytes is not None:
        out.append(f"set_default_device_pinned_mem_limit 0 {max(1, defaults.pinned_memory_bytes // 2**20)}M")
    return out


def daemon_dir(state_dir: Path, gpu_uuid: str) -> Path:
    if not _GPU_UUID.fullmatch(gpu_uuid):
        raise GpuPolicyError(f"{gpu_uuid!r} is not a GPU UUID; no MPS daemon directory is made for it")
    return state_dir / MPS_DIR / gpu_uuid


def container_edits(state_dir: Path, gpu_uuids: Iterable[str]) -> dict[str, Any]:
    """What a container of an MPS claim needs of its GPU's daemon: the pipe and log directories at
    the places CUDA looks (one daemon per claim container: a claim's MPS devices share a GPU's, the
    first one's), and host IPC's /dev/shm, where MPS keeps what its clients and server share."""
    gpus = list(dict.fromkeys(gpu_uuids))
    if not gpus:
        return {}
    home = daemon_dir(state_dir, gpus[0])
    mount = ["rbind", "rw", "nosuid", "nodev"]
    return {
        "env": [f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}", f"CUDA_MPS_LOG_DIRECTORY={CONTAINER_LOG_DIR}"],
        "mounts": [
            {"hostPath": str(home / "pipe"), "containerPath": CONTAINER_PIPE_DIR, "options": mount},
            {"hostPath": str(home / "log"), "containerPath": CONTAINER_LOG_DIR, "options": mount},
            {"hostPath": "/dev/shm", "containerPath": "/dev/shm", "options": mount},
        ],
    }


# --- the daemons ------------------------------------------------------------------------------


class MpsDaemons:
    """Starts, adopts and stops the node's MPS control daemons; the caller holds the state lock."""

    def __init__(self, driver_root: Path, state_dir: Path, control: GpuControl, *,
                 ready_timeout_s: float = READY_TIMEOUT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.driver_root = driver_root
        self.state_dir = state_dir
        self.control = control
        self.ready_timeout_s = ready_timeout_s
        self._clock = clock

    def _tool(self) -> Path:
        path = find_tool(self.driver_root, TOOL)
        if path is None:
            searched = ", ".join(str(self.driver_root / d / TOOL) for d in SMI_DIRS)
            raise GpuPolicyError(f"MPS needs {TOOL} from the NVIDIA driver, and there is none under "
                                 f"--nvidia-driver-root {self.driver_root} (searched {searched})")
        return path

    def _env(self, gpu_uuid: str) -> dict[str, str]:
        home = daemon_dir(self.state_dir, gpu_uuid)
        return {**tool_environment(self.driver_root), "CUDA_VISIBLE_DEVICES": gpu_uuid,
                "CUDA_MPS_PIPE_DIRECTORY": str(home / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(home / "log")}

    def ask(self, gpu_uuid: str, commands: Iterable[str]) -> str | None:
        """The daemon's answers to ``commands``; None when no daemon answers for the GPU."""
        if not (daemon_dir(self.state_dir, gpu_uuid) / "pipe").is_dir():
            return None
        try:
            done = subprocess.run([str(self._tool())], input="".join(f"{c}\n" for c in commands), capture_output=True,
                                  text=True, timeout=ASK_TIMEOUT_S, check=False, env=self._env(gpu_uuid))
        except (subprocess.TimeoutExpired, OSError):
            return None
        return done.stdout if done.returncode == 0 else None

    def running(self, gpu_uuid: str) -> bool:
        return self.ask(gpu_uuid, ["get_default_active_thread_percentage"]) is not None

    def ensure(self, gpu_uuid: str, defaults: Defaults) -> str:
        """The GPU's daemon running with ``defaults``: ``adopted`` (it ran) or ``started``."""
        tool = self._tool()
        if self.running(gpu_uuid):
            self._set_defaults(gpu_uuid, defaults)
            return "adopted"
        home = daemon_dir(self.state_dir, gpu_uuid)
        mode = self.control.compute_mode(gpu_uuid)
        # Exclusive_Process with our directory there: this driver set it, and a crash or a dead
        # daemon left it so. Anything else is someone else's setting, kept as it is.
        if mode != DEFAULT_COMPUTE_MODE and not (mode == EXCLUSIVE_PROCESS and home.is_dir()):
            raise GpuPolicyError(
                f"GPU {gpu_uuid} is in compute mode {mode or 'unknown'}, which this driver did not set; MPS "
                f"needs it in Default to start its control daemon (nvidia-smi -i {gpu_uuid} -c DEFAULT)")
        for sub in ("pipe", "log"):
            (home / sub).mkdir(parents=True, exist_ok=True, mode=0o755)
        self.control.set_compute_mode(gpu_uuid, "EXCLUSIVE_PROCESS")
        try:
            self._start(tool, gpu_uuid, home)
            self._set_defaults(gpu_uuid, defaults)
        except GpuPolicyError:
            self.stop(gpu_uuid)
            raise
        return "started"

    def _start(self, tool: Path, gpu_uuid: str, home: Path) -> None:
        try:
            done = subprocess.run([str(tool), "-d"], capture_output=True, text=True, timeout=ASK_TIMEOUT_S,
                                  check=False, env=self._env(gpu_uuid), start_new_session=True,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise GpuPolicyError(f"starting the MPS control daemon of GPU {gpu_uuid}: {TOOL} -d did not return "
                                 f"within {ASK_TIMEOUT_S:g}s") from None
        except OSError as exc:
            raise GpuPolicyError(f"starting the MPS control daemon of GPU {gpu_uuid}: {exc.strerror or exc}") from None
        if done.returncode != 0:
            detail = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
            raise GpuPolicyError(f"starting the MPS control daemon of GPU {gpu_uuid}: {TOOL} -d exited "
                                 f"{done.returncode}: {detail}")
        deadline = self._clock() + self.ready_timeout_s
        while not self.running(gpu_uuid):
            if self._clock() >= deadline:
                raise GpuPolicyError(f"the MPS control daemon of GPU {gpu_uuid} did not become ready within "
                                     f"{self.ready_timeout_s:g}s (its log: {home / 'log' / 'control.log'})")
            time.sleep(0.1)

    def _set_defaults(self, gpu_uuid: str, defaults: Defaults) -> None:
        commands = control_commands(defaults)
        if commands and self.ask(gpu_uuid, commands) is None:
            raise GpuPolicyError(f"the MPS control daemon of GPU {gpu_uuid} did not take its default limits "
                                 f"({'; '.join(commands)})")

    def stop(self, gpu_uuid: str) -> bool:
        """No daemon for the GPU and the GPU back in Default; whether one was running. Idempotent."""
        home = daemon_dir(self.state_dir, gpu_uuid)
        if not home.exists():
            return False
        was = self.ask(gpu_uuid, ["quit"]) is not None
        deadline = self._clock() + self.ready_timeout_s
        while self.running(gpu_uuid) and self._clock() < deadline:
            time.sleep(0.1)
        self._kill_starting(home)
        self.control.set_compute_mode(gpu_uuid, "DEFAULT")
        import shutil  # here: at module level it brings bz2 and lzma into the plugin for this one removal

        shutil.rmtree(home, ignore_errors=True)
        return was

    @staticmethod
    def _kill_starting(home: Path) -> None:
        """A daemon that never answered (not ready in time) is ended by the pid it wrote."""
        try:
            pid = int((home / "pipe" / PID_FILE).read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return
        if TOOL.encode() in cmdline:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def known(self) -> list[str]:
        """The GPUs with a daemon directory: started by this driver, maybe still running."""
        root = self.state_dir / MPS_DIR
        try:
            return sorted(p.name for p in root.iterdir() if p.is_dir() and _GPU_UUID.fullmatch(p.name))
        except OSError:
            return []


@dataclass
class Reconciled:
    done: dict[str, str] = field(default_factory=dict)
    """GPU -> ``adopted`` or ``started``."""
    stopped: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class MpsSupervisor:
    """The daemons the entries want, no more: applied at prepare, unprepare and start-up."""

    daemons: MpsDaemons

    def start_for(self, entry: ClaimEntry, all_entries: Iterable[ClaimEntry]) -> dict[str, str]:
        """``entry``'s GPUs' daemons running with the defaults of every claim on them; GPU -> what was done."""
        gpus = gpus_of(entry)
        if len(gpus) > 1:
            raise GpuPolicyError(f"MPS on {len(gpus)} GPUs in one claim is not supported: a container's CUDA connects "
                                 "to one MPS control daemon, and this driver runs one per GPU; use one claim per GPU")
        want = wanted(all_entries)
        return {gpu: self.daemons.ensure(gpu, want.get(gpu, Defaults())) for gpu in gpus}

    def stop_for(self, gone: Iterable[ClaimEntry], remaining: Iterable[ClaimEntry]) -> list[str]:
        stopped = to_stop(gone, remaining)
        for gpu in stopped:
            self.daemons.stop(gpu)
        return stopped

    def reconcile(self, entries: Iterable[ClaimEntry]) -> Reconciled:
        """Start-up, and a dead daemon: the wanted daemons running (adopted or started again), the
        others stopped."""
        want = wanted(entries)
        out = Reconciled()
        for gpu, defaults in want.items():
            try:
                out.done[gpu] = self.daemons.ensure(gpu, defaults)
            except GpuPolicyError as exc:
                out.errors[gpu] = str(exc)
        for gpu in self.daemons.known():
            if gpu not in want:
                self.daemons.stop(gpu)
                out.stopped.append(gpu)
        return out

    def dead(self, entries: Iterable[ClaimEntry]) -> list[str]:
        """The wanted daemons that do not answer."""
        return [gpu for gpu in wanted(entries) if not self.daemons.running(gpu)]


