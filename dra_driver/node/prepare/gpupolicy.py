"""A GPU's time-slice, programmed for the claims that time-slice it.

The time-slice interval of a GPU is GPU-wide: every process on it runs with the one the driver
holds. A claim whose sharing is ``TimeSlicing`` therefore sets it on each whole GPU it was given,
and the GPU goes back to the driver's default interval when the last claim that time-slices it is
unprepared. Two claims on one GPU always agree on it: :mod:`~dra_driver.node.prepare.exclusive`
refuses a second interval, naming the claim that holds the first.

What a GPU should have follows from the checkpoint's entries alone (:func:`wanted`), so the
checkpoint says what was set: a claim's entry, its devices and their sharing are on
disk before its interval is set (the state forces that save), and the entry stays there until the
GPU is back to its default. A crash at any line thus leaves one of: an entry the start-up rolls
back (its GPUs reset unless another claim still time-slices them), an entry still prepared (its
interval set again, which is idempotent), or no entry and a GPU already reset.

The interval is set the way NVIDIA documents it: the compute mode back to ``DEFAULT`` (through NVML
on real GPUs, :class:`NvmlControl`), then ``nvidia-smi compute-policy -i <uuid> --set-timeslice=<0..3>``
with ``nvidia-smi`` from the driver root; NVML has no call for the interval. A GPU
whose compute mode is not ``Default`` was set so by someone else (this driver never leaves one in
another mode for time-slicing), and a claim asking to time-slice it is refused rather than
overriding them. MIG devices are not programmed: the interval is the whole GPU's, and a MIG slice's
processes are scheduled within their instance.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from dra_driver.gpuconfig import Strategy, TimeSliceInterval
from dra_driver.node.discovery.nvml import NvmlBackend, NvmlError
from dra_driver.node.prepare.calls import ClaimFailure
from dra_driver.node.prepare.entries import ClaimEntry, DeviceKind, PreparedDevice

TIME_SLICE_VALUES: Mapping[TimeSliceInterval, int] = {
    TimeSliceInterval.DEFAULT: 0, TimeSliceInterval.SHORT: 1, TimeSliceInterval.MEDIUM: 2, TimeSliceInterval.LONG: 3,
}
"""``--set-timeslice`` values, as ``nvidia-smi compute-policy --help`` lists them."""
DEFAULT_COMPUTE_MODE = "Default"
"""How ``nvidia-smi --query-gpu=compute_mode`` prints the mode every process may use."""
SMI_DIRS = ("usr/bin", "bin", "usr/local/bin", "usr/sbin")
"""Where driver installs put ``nvidia-smi`` below the driver root."""
LIBRARY_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib/aarch64-linux-gnu", "lib64", "usr/lib", "lib")
"""Where nvidia-smi's libnvidia-ml may sit below a driver root mounted into the plugin's container."""
SMI_TIMEOUT_S = 30.0
"""nvidia-smi waits for the driver's lock; longer than this, the node has a bigger problem."""


class GpuPolicyError(ClaimFailure):
    """A GPU's compute policy could not be read or set; the message says which GPU and why."""


# --- decisions --------------------------------------------------------------------------------


def time_slice_of(dev: PreparedDevice) -> TimeSliceInterval | None:
    """The interval a prepared device sets on its GPU, or None when it sets none (not time-sliced,
    or a MIG slice)."""
    if dev.sharing.strategy is not Strategy.TIME_SLICING or dev.kind is not DeviceKind.GPU or not dev.gpu_uuid:
        return None
    return dev.sharing.interval or TimeSliceInterval.DEFAULT


def wanted(entries: Iterable[ClaimEntry]) -> dict[str, tuple[TimeSliceInterval, str]]:
    """GPU UUID -> (its interval, the first claim wanting it) for the entries' time-sliced GPUs."""
    out: dict[str, tuple[TimeSliceInterval, str]] = {}
    for entry in entries:
        for dev in entry.devices:
            interval = time_slice_of(dev)
            if interval is not None:
                out.setdefault(dev.gpu_uuid, (interval, entry.ref))
    return out


def gpus_of(entry: ClaimEntry) -> list[str]:
    """The GPUs whose interval ``entry`` sets, in order, each once."""
    return list(dict.fromkeys(d.gpu_uuid for d in entry.devices if time_slice_of(d) is not None))


@dataclass(frozen=True)
class Change:
    gpu_uuid: str
    interval: TimeSliceInterval
    reset: bool
    """True: back to the default because no claim time-slices the GPU any more."""


def to_set(entry: ClaimEntry, others: Iterable[ClaimEntry]) -> list[Change]:
    """What preparing ``entry`` sets: its GPUs that no other claim time-slices yet (one that does
    has the interval set already, and the same one: exclusivity saw to that)."""
    held = wanted(e for e in others if e.uid != entry.uid)
    mine = wanted([entry])
    return [Change(gpu, mine[gpu][0], reset=False) for gpu in gpus_of(entry) if gpu not in held]


def to_reset(gone: Iterable[ClaimEntry], remaining: Iterable[ClaimEntry]) -> list[Change]:
    """What removing the ``gone`` entries resets: their GPUs no ``remaining`` entry time-slices."""
    held = wanted(remaining)
    gpus = dict.fromkeys(gpu for entry in gone for gpu in gpus_of(entry))
    return [Change(gpu, TimeSliceInterval.DEFAULT, reset=True) for gpu in gpus if gpu not in held]


# --- the GPU ----------------------------------------------------------------------------------


class GpuControl(Protocol):
    """The node's GPUs' compute policy."""

    def compute_mode(self, gpu_uuid: str) -> str:
        """As nvidia-smi prints it: ``Default``, ``Exclusive_Process``, ``Prohibited``."""
        ...

    def set_compute_mode(self, gpu_uuid: str, mode: str) -> None:
        """``DEFAULT``, ``EXCLUSIVE_PROCESS`` or ``PROHIBITED``."""
        ...

    def set_time_slice(self, gpu_uuid: str, value: int) -> None: ...


class NoGpuControl:
    """Simulated GPUs have no compute policy: the interval is recorded and told to the container,
    and nothing else happens."""

    def compute_mode(self, gpu_uuid: str) -> str:
        return DEFAULT_COMPUTE_MODE

    def set_compute_mode(self, gpu_uuid: str, mode: str) -> None:
        return None

    def set_time_slice(self, gpu_uuid: str, value: int) -> None:
        return None


def find_tool(driver_root: Path, name: str) -> Path | None:
    for directory in SMI_DIRS:
        path = driver_root / directory / name
        if os.access(path, os.X_OK) and path.is_file():
            return path
    return None


def tool_environment(driver_root: Path) -> dict[str, str]:
    """The environment the driver's tools run with: their binaries and libraries from the driver
    root (the plugin's image has none of its own)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if str(driver_root) != "/":
        # The MPS control daemon starts nvidia-cuda-mps-server, which it looks for on PATH.
        env["PATH"] = ":".join([*(str(driver_root / d) for d in SMI_DIRS if (driver_root / d).is_dir()), env["PATH"]])
        dirs = [str(driver_root / d) for d in LIBRARY_DIRS if (driver_root / d).is_dir()]
        if dirs:
            env["LD_LIBRARY_PATH"] = ":".join(dirs)
    return env


class SmiControl:
    """``nvidia-smi`` from the driver root (``--nvidia-driver-root``)."""

    def __init__(self, driver_root: Path, timeout_s: float = SMI_TIMEOUT_S) -> None:
        self.driver_root = driver_root
        self.timeout_s = timeout_s

    def _smi(self) -> Path:
        path = find_tool(self.driver_root, "nvidia-smi")
        if path is None:
            searched = ", ".join(str(self.driver_root / d / "nvidia-smi") for d in SMI_DIRS)
            raise GpuPolicyError(f"time-slicing needs nvidia-smi from the NVIDIA driver, and there is none under "
                                 f"--nvidia-driver-root {self.driver_root} (searched {searched})")
        return path

    def _run(self, args: Sequence[str], what: str) -> str:
        command = [str(self._smi()), *args]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=self.timeout_s, check=False,
                                  env=tool_environment(self.driver_root))
        except subprocess.TimeoutExpired:
            raise GpuPolicyError(f"{what}: nvidia-smi did not answer within {self.timeout_s:g}s") from None
        except OSError as exc:
            raise GpuPolicyError(f"{what}: cannot run {command[0]}: {exc.strerror or exc}") from None
        if done.returncode != 0:
            detail = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
            raise GpuPolicyError(f"{what}: nvidia-smi {' '.join(args)} exited {done.returncode}: {detail}")
        return done.stdout

    def compute_mode(self, gpu_uuid: str) -> str:
        out = self._run(["--query-gpu=compute_mode", "--format=csv,noheader", "-i", gpu_uuid],
                        f"reading the compute mode of GPU {gpu_uuid}")
        return out.strip().splitlines()[0].strip() if out.strip() else ""

    def set_compute_mode(self, gpu_uuid: str, mode: str) -> None:
        self._run(["-i", gpu_uuid, "-c", mode], f"setting the compute mode of GPU {gpu_uuid} to {mode}")

    def set_time_slice(self, gpu_uuid: str, value: int) -> None:
        self._run(["compute-policy", "-i", gpu_uuid, f"--set-timeslice={value}"],
                  f"setting the time-slice of GPU {gpu_uuid} to {value}")


class NvmlControl:
    """Real GPUs: the compute mode through NVML (the backend's own session), the time-slice through
    nvidia-smi, which is the only way to it."""

    def __init__(self, backend: NvmlBackend, driver_root: Path) -> None:
        self.backend = backend
        self.smi = SmiControl(driver_root)

    def compute_mode(self, gpu_uuid: str) -> str:
        try:
            return self.backend.compute_mode(gpu_uuid)
        except NvmlError as exc:
            raise GpuPolicyError(str(exc)) from None

    def set_compute_mode(self, gpu_uuid: str, mode: str) -> None:
        try:
            self.backend.set_compute_mode(gpu_uuid, mode)
        except NvmlError as exc:
            raise GpuPolicyError(str(exc)) from None

    def set_time_slice(self, gpu_uuid: str, value: int) -> None:
        self.smi.set_time_slice(gpu_uuid, value)


# --- applying ---------------------------------------------------------------------------------


class TimeSlicer:
    """Applies :func:`to_set` and :func:`to_reset` to the GPUs; the caller holds the state lock."""

    def __init__(self, control: GpuControl) -> None:
        self.control = control

    def set_for(self, entry: ClaimEntry, others: Iterable[ClaimEntry]) -> list[Change]:
        """Set the intervals ``entry`` needs; what was set. GpuPolicyError names the GPU and why,
        before anything is changed on a GPU someone else put in another compute mode."""
        changes = to_set(entry, others)
        for change in changes:
            mode = self.control.compute_mode(change.gpu_uuid)
            if mode != DEFAULT_COMPUTE_MODE:
                raise GpuPolicyError(
                    f"GPU {change.gpu_uuid} is in compute mode {mode or 'unknown'}, which this driver did not set; "
                    f"time-slicing it needs the Default mode (nvidia-smi -i {change.gpu_uuid} -c DEFAULT)")
        for change in changes:
            self.control.set_compute_mode(change.gpu_uuid, "DEFAULT")
            self.control.set_time_slice(change.gpu_uuid, TIME_SLICE_VALUES[change.interval])
        return changes

    def reset(self, gone: Iterable[ClaimEntry], remaining: Iterable[ClaimEntry]) -> list[Change]:
        """Put back the default interval on the GPUs only ``gone`` time-sliced; what was reset."""
        changes = to_reset(gone, remaining)
        for change in changes:
            self.control.set_time_slice(change.gpu_uuid, TIME_SLICE_VALUES[TimeSliceInterval.DEFAULT])
        return changes

    def reapply(self, entries: Iterable[ClaimEntry]) -> list[Change]:
        """Set every prepared claim's interval again (start-up: a reboot or a crash may have lost it)."""
        changes = [Change(gpu, interval, reset=False) for gpu, (interval, _) in wanted(entries).items()]
        for change in changes:
            self.control.set_time_slice(change.gpu_uuid, TIME_SLICE_VALUES[change.interval])
        return changes
