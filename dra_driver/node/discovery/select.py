"""Pick the discovery backend the plugin's flags ask for."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

from dra_driver import logs
from dra_driver.node.discovery.backend import Backend

_log = logs.get("discovery")

SIMULATED_STATE_FILE = "simulated-gpus.json"
BACKENDS = ("nvml", "simulated")
"""The ``--gpu-backend`` choices; ``simulated`` only ever when asked for by name."""

# Where distributions put libnvidia-ml below a driver root (a container mounts the host's at /driver-root).
NVML_LIBRARY_DIRS = ("usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib", "lib64")


@dataclass(frozen=True)
class BackendChoice:
    """Which backend to open, and what opening it needs."""

    backend: str
    """``nvml`` or ``simulated``."""
    node_name: str
    simulated_profile: str
    """A built-in profile name or a YAML file."""
    state_dir: Path
    """Where the simulated backend keeps its GPUs' state (:data:`SIMULATED_STATE_FILE`)."""
    nvidia_driver_root: Path = Path("/")
    sysfs_root: Path = Path("/sys")
    dev_root: Path = Path("/")
    """``/``, or a fake root under which the simulated backend makes its device nodes."""


def nvml_library_candidates(driver_root: Path) -> list[Path]:
    return [driver_root / d / "libnvidia-ml.so.1" for d in NVML_LIBRARY_DIRS]


def preload_nvml(driver_root: Path) -> Path | None:
    """Load libnvidia-ml from the host driver root, so pynvml's load by soname finds it already mapped."""
    if str(driver_root) == "/":
        return None
    for candidate in nvml_library_candidates(driver_root):
        if candidate.exists():
            try:
                ctypes.CDLL(str(candidate), mode=ctypes.RTLD_GLOBAL)
            except OSError as exc:
                _log.warning("could not load libnvidia-ml from the driver root", path=str(candidate), error=str(exc))
                continue
            return candidate
    _log.warning("no libnvidia-ml under the driver root", driver_root=str(driver_root))
    return None


def open_backend(choice: BackendChoice) -> Backend:
    """``nvml`` or ``simulated``, exactly as asked: there is no fallback from one to the other, so a
    node without a working NVML never publishes simulated GPUs that the scheduler would place real
    pods on. NVML's own failures surface when :meth:`discover` is called (:class:`NvmlError`)."""
    if choice.backend not in BACKENDS:
        raise ValueError(f"unknown GPU backend {choice.backend!r} (expected {' or '.join(BACKENDS)})")
    if choice.backend == "nvml":
        preload_nvml(choice.nvidia_driver_root)
        from dra_driver.node.discovery.nvml import NvmlBackend

        return NvmlBackend(sysfs_root=choice.sysfs_root)
    return open_simulated(choice)


def open_simulated(choice: BackendChoice) -> Backend:
    from dra_driver.node.discovery.simulated import SimulatedBackend

    backend = SimulatedBackend(
        choice.simulated_profile,
        choice.node_name,
        dev_root=choice.dev_root if str(choice.dev_root) != "/" else None,
        state_file=choice.state_dir / SIMULATED_STATE_FILE,
    )
    _log.info("using the simulated backend", profile=backend.profile.name, gpus=len(backend.profile.gpus),
              dev_root=str(choice.dev_root))
    return backend
