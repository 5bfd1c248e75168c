"""NVML discovery backend (``pynvml`` from nvidia-ml-py).

All NVML calls go through one lock: NVML is thread-safe but MIG changes and the enumeration of MIG
devices race badly under concurrency, and serialising is what the reference driver does too.
The module is imported lazily and can be injected (``nvml_module=``) so unit tests run against a
fake; the errors caught are the module's own ``NVMLError`` (:func:`nvml_error_type`), turned into
:class:`NvmlError` where a call must succeed and into "not supported" where it may fail. Anything
else (a ``TypeError``, an ``AttributeError``) is a bug of ours and propagates as it is.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from dra_driver import logs
from dra_driver.node.discovery import sysfs
from dra_driver.node.discovery.model import Gpu, MigDevice, MigEngines, MigPlacement, MigProfile
from dra_driver.node.metrics import METRICS

_log = logs.get("discovery.nvml")
T = TypeVar("T")

MIB = 1024 * 1024

# nvmlBrandType_t → the names go-nvlib uses (and the reference driver publishes).
BRAND_NAMES = {
    0: "Unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "Grid", 5: "GeForce", 6: "Titan", 7: "NvidiaVApps",
    8: "NvidiaVPC", 9: "NvidiaVCS", 10: "NvidiaVWS", 11: "NvidiaCloudGaming", 12: "QuadroRTX", 13: "NvidiaRTX",
    14: "Nvidia", 15: "GeForceRTX", 16: "TitanRTX",
}
# nvmlDeviceArchitecture_t → name.
ARCH_NAMES = {
    2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere", 8: "Ada Lovelace", 9: "Hopper",
    10: "Blackwell", 13: "Rubin",
}

# NVML return codes (stable C API values) → what they mean for an operator.
_ERROR_HINTS = {
    1: "NVML is not initialised",
    2: "invalid argument",
    3: "not supported on this GPU or driver",
    4: "insufficient permissions (MIG changes need root / CAP_SYS_ADMIN on the host)",
    6: "not found",
    9: "the NVIDIA kernel driver is not loaded",
    10: "timed out",
    12: "libnvidia-ml.so.1 was not found (is the driver installed and its root mounted into the container?)",
    13: "the driver's NVML library lacks this function (driver too old)",
    15: "the GPU is lost (fell off the bus); it needs a reset or a reboot",
    16: "the GPU requires a reset (e.g. a pending MIG mode change)",
    17: "the operating system blocked the request",
    18: "libnvidia-ml and the kernel module versions differ (driver upgraded without reboot?)",
    19: "the GPU is in use (processes are running on it)",
    23: "insufficient free MIG resources for this profile and placement",
    27: "the GPU is not ready",
    29: "the GPU is in an invalid state for this request",
}
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_DEVICE_MIG_ENABLE = 1


class NvmlError(RuntimeError):
    """An NVML failure with an operator-readable message; ``code`` is the NVML return code."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


def nvml_error_type(nv: ModuleType) -> type[Exception]:
    """The class every pynvml failure is an instance of (``NVML_ERROR_*`` subclasses and
    ``NVMLError_LibraryNotFound`` included): the module's own, so an injected fake brings its own."""
    error: type[Exception] = nv.NVMLError
    return error


def error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def explain(exc: BaseException, what: str) -> NvmlError:
    code = error_code(exc)
    hint = _ERROR_HINTS.get(code) if code is not None else None
    detail = hint or str(exc) or type(exc).__name__
    suffix = f" (NVML error {code})" if code is not None else ""
    return NvmlError(f"{what}: {detail}{suffix}", code)


def count_error(fn: Callable[..., Any]) -> None:
    """One failed NVML call, labelled by the NVML function's name (a fixed set)."""
    METRICS.nvml_errors.labels(function=getattr(fn, "__name__", "unknown")).inc()


def nvml_text(value: Any) -> str:
    """A string NVML returned (bytes, NUL-padded, in older bindings) as text."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00")
    return str(value)


def format_cuda_version(value: int) -> str:
    """NVML's CUDA driver version integer (13000, 12080) → ``13.0`` / ``12.8``."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def architecture_from_cc(cc: str) -> str:
    major, _, minor = cc.partition(".")
    table = {"3": "Kepler", "5": "Maxwell", "6": "Pascal", "7": "Volta", "8": "Ampere", "9": "Hopper",
             "10": "Blackwell", "12": "Blackwell"}
    if major == "7" and minor == "5":
        return "Turing"
    if major == "8" and minor == "9":
        return "Ada Lovelace"
    return table.get(major, "Unknown")


def mig_profile_name(compute_slices: int, memory_mib: int, ci_slices: int | None = None) -> str:
    """``3g.20gb`` (or ``1c.3g.20gb`` for a compute instance smaller than its GPU instance)."""
    name = f"{compute_slices}g.{math.ceil(memory_mib / 1024)}gb"
    if ci_slices is not None and ci_slices < compute_slices:
        name = f"{ci_slices}c.{name}"
    return name


def load_pynvml() -> ModuleType:
    import pynvml

    module: ModuleType = pynvml
    return module


def nvml_available(nvml_module: ModuleType | None = None) -> tuple[bool, str]:
    """Whether NVML initialises here; the reason when it does not."""
    try:
        nv = nvml_module or load_pynvml()
    except (ImportError, OSError) as exc:  # no pynvml; OSError: a loader that opens the library at import
        return False, str(explain(exc, "NVML initialisation failed"))
    try:
        nv.nvmlInit()
    except nvml_error_type(nv) as exc:
        count_error(nv.nvmlInit)
        return False, str(explain(exc, "NVML initialisation failed"))
    with contextlib.suppress(nvml_error_type(nv)):
        nv.nvmlShutdown()
    return True, ""


COMPUTE_MODE_NAMES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
"""NVML_COMPUTEMODE_* as nvidia-smi prints them."""
COMPUTE_MODE_VALUES = {"DEFAULT": 0, "PROHIBITED": 2, "EXCLUSIVE_PROCESS": 3}
"""The modes NVML sets (EXCLUSIVE_THREAD is deprecated)."""


class NvmlBackend:
    name = "nvml"

    def __init__(self, sysfs_root: Path = Path("/sys"), nvml_module: ModuleType | None = None) -> None:
        self.sysfs_root = Path(sysfs_root)
        self._lock = threading.RLock()
        try:
            self.nv = nvml_module or load_pynvml()
        except ImportError as exc:
            raise NvmlError(f"cannot import pynvml (nvidia-ml-py): {exc}") from None
        # What an NVML call raises when NVML refuses it: the clauses here catch this and nothing else.
        self.failed = nvml_error_type(self.nv)
        self._call("NVML initialisation failed", self.nv.nvmlInit)
        self._closed = False
        # (gpu uuid, profile name) → NVML GPU-instance profile id, filled during discovery.
        self._profile_ids: dict[tuple[str, str], int] = {}

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                try:
                    self.nv.nvmlShutdown()
                except self.failed as exc:
                    _log.warning("nvmlShutdown failed", error=str(exc))

    # -- plumbing ----------------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except self.failed as exc:
            count_error(fn)
            raise explain(exc, what) from exc

    def _try(self, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn``'s answer, or None when NVML refuses it (not supported on this GPU or driver)."""
        try:
            return fn(*args)
        except self.failed:
            return None

    # -- discovery ---------------------------------------------------------------------------------

    def discover(self) -> list[Gpu]:
        nv = self.nv
        with self._lock:
            driver = nvml_text(self._call("reading the driver version", nv.nvmlSystemGetDriverVersion))
            cuda_fn = getattr(nv, "nvmlSystemGetCudaDriverVersion_v2", None) or nv.nvmlSystemGetCudaDriverVersion
            cuda = format_cuda_version(int(self._call("reading the CUDA driver version", cuda_fn)))
            count = int(self._call("counting GPUs", nv.nvmlDeviceGetCount))
            gpus = [self._discover_gpu(i, driver, cuda) for i in range(count)]
        return gpus

    def _discover_gpu(self, index: int, driver: str, cuda: str) -> Gpu:
        nv = self.nv
        h = self._call(f"GPU {index}: getting its handle", nv.nvmlDeviceGetHandleByIndex, index)
        what = f"GPU {index}"
        uuid = nvml_text(self._call(f"{what}: reading the UUID", nv.nvmlDeviceGetUUID, h))
        name = nvml_text(self._call(f"{what}: reading the name", nv.nvmlDeviceGetName, h))
        minor = int(self._call(f"{what}: reading the minor number", nv.nvmlDeviceGetMinorNumber, h))
        memory = int(self._call(f"{what}: reading memory info", nv.nvmlDeviceGetMemoryInfo, h).total)
        pci = self._call(f"{what}: reading PCI info", nv.nvmlDeviceGetPciInfo, h)
        bus_id = sysfs.normalize_bus_id(nvml_text(pci.busId))
        major_minor = self._call(f"{what}: reading the compute capability", nv.nvmlDeviceGetCudaComputeCapability, h)
        cc = f"{int(major_minor[0])}.{int(major_minor[1])}"
        brand_code = self._try(nv.nvmlDeviceGetBrand, h)
        brand = BRAND_NAMES.get(int(brand_code), "Unknown") if brand_code is not None else "Unknown"
        arch_code = self._try(nv.nvmlDeviceGetArchitecture, h)
        arch = ARCH_NAMES.get(int(arch_code), "") if arch_code is not None else ""
        arch = arch or architecture_from_cc(cc)
        attrs = self._try(nv.nvmlDeviceGetAttributes, h)
        multiprocessors = int(attrs.multiprocessorCount) if attrs is not None else 0

        mig_capable, mig_enabled = False, False
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(h)
            mig_capable, mig_enabled = True, int(current) == NVML_DEVICE_MIG_ENABLE
        except self.failed as exc:
            if error_code(exc) not in (NVML_ERROR_NOT_SUPPORTED, None):
                _log.warning("cannot read MIG mode", gpu=index, error=str(explain(exc, "MIG mode")))

        profiles: tuple[MigProfile, ...] = ()
        migs: tuple[MigDevice, ...] = ()
        if mig_capable:
            profiles = self._profiles(h, uuid)
            if mig_enabled:
                migs = self._mig_devices(h, uuid, profiles)

        return Gpu(
            index=index,
            minor=minor,
            uuid=uuid,
            product_name=name,
            brand=brand,
            architecture=arch,
            cuda_compute_capability=cc,
            driver_version=driver,
            cuda_driver_version=cuda,
            memory_bytes=memory,
            multiprocessors=multiprocessors,
            pci=sysfs.pci_info(self.sysfs_root, bus_id),
            mig_capable=mig_capable,
            mig_enabled=mig_enabled,
            mig_devices=migs,
            mig_profiles=profiles,
            extra={"backend": "nvml"},
        )

    def _profiles(self, h: Any, uuid: str) -> tuple[MigProfile, ...]:
        """The GPU-instance profile catalogue with every possible placement."""
        nv = self.nv
        count = int(getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0x12))
        result: list[MigProfile] = []
        for idx in range(count):
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, idx)
            except self.failed:
                continue  # profile index not supported on this GPU
            if int(info.instanceCount) == 0:
                continue
            placements = self._placements(h, int(info.id))
            if not placements:
                continue
            raw_name = nvml_text(getattr(info, "name", b""))
            name = raw_name[4:] if raw_name.startswith("MIG ") else raw_name
            if not name:
                name = mig_profile_name(int(info.sliceCount), int(info.memorySizeMB))
            if any(p.name == name for p in result):
                continue
            self._profile_ids[(uuid, name)] = int(info.id)
            result.append(MigProfile(
                name=name,
                memory_bytes=int(info.memorySizeMB) * MIB,
                multiprocessors=int(info.multiprocessorCount),
                memory_slices=placements[0].size,
                compute_slices=int(info.sliceCount),
                placements=tuple(placements),
                profile_id=int(info.id),
                engines=MigEngines(copy_engines=int(getattr(info, "copyEngineCount", 0)),
                                   decoders=int(getattr(info, "decoderCount", 0)),
                                   encoders=int(getattr(info, "encoderCount", 0)),
                                   jpeg_engines=int(getattr(info, "jpegCount", 0)),
                                   ofa_engines=int(getattr(info, "ofaCount", 0))),
            ))
        return tuple(result)

    def _placements(self, h: Any, profile_id: int) -> list[MigPlacement]:
        nv = self.nv
        array = (nv.c_nvmlGpuInstancePlacement_t * 16)()
        count = ctypes.c_uint(16)
        try:
            nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, array, ctypes.pointer(count))
        except self.failed as exc:
            _log.debug("no placements", profile_id=profile_id, error=str(exc))
            return []
        return sorted((MigPlacement(int(array[i].start), int(array[i].size)) for i in range(count.value)),
                      key=lambda p: p.start)

    def _mig_devices(self, h: Any, parent_uuid: str, profiles: tuple[MigProfile, ...]) -> tuple[MigDevice, ...]:
        nv = self.nv
        by_id = {self._profile_ids.get((parent_uuid, p.name)): p for p in profiles}
        result: list[MigDevice] = []
        max_count = int(self._try(nv.nvmlDeviceGetMaxMigDeviceCount, h) or 0)
        for i in range(max_count):
            try:
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except self.failed:
                continue  # slot not populated
            try:
                mig_uuid = nvml_text(nv.nvmlDeviceGetUUID(mh))
                gi_id = int(nv.nvmlDeviceGetGpuInstanceId(mh))
                ci_id = int(nv.nvmlDeviceGetComputeInstanceId(mh))
                memory = int(nv.nvmlDeviceGetMemoryInfo(mh).total)
                attrs = nv.nvmlDeviceGetAttributes(mh)
                gi = nv.nvmlDeviceGetGpuInstanceById(h, gi_id)
                gi_info = nv.nvmlGpuInstanceGetInfo(gi)
            except self.failed as exc:
                _log.warning("skipping unreadable MIG device", parent=parent_uuid, slot=i,
                             error=str(explain(exc, "MIG device")))
                continue
            profile = by_id.get(int(gi_info.profileId))
            gi_slices = int(attrs.gpuInstanceSliceCount)
            ci_slices = int(attrs.computeInstanceSliceCount)
            if profile is not None and ci_slices >= profile.compute_slices:
                name = profile.name
            else:
                mem_mib = profile.memory_bytes // MIB if profile is not None else int(attrs.memorySizeMB)
                name = mig_profile_name(gi_slices, mem_mib, ci_slices)
            result.append(MigDevice(
                uuid=mig_uuid,
                profile=name,
                parent_uuid=parent_uuid,
                memory_bytes=memory,
                multiprocessors=int(attrs.multiprocessorCount),
                gpu_instance_id=gi_id,
                compute_instance_id=ci_id,
                placement=MigPlacement(int(gi_info.placement.start), int(gi_info.placement.size)),
                profile_id=int(gi_info.profileId),
                engines=profile.engines if profile is not None else MigEngines(),
            ))
        result.sort(key=lambda m: (m.placement.start, m.gpu_instance_id, m.compute_instance_id))
        return tuple(result)

    # -- compute mode ------------------------------------------------------------------------------

    def compute_mode(self, gpu_uuid: str) -> str:
        """The GPU's compute mode, named as nvidia-smi prints it (``Default``, ``Exclusive_Process``, ...)."""
        nv = self.nv
        with self._lock:
            h = self._call(f"GPU {gpu_uuid}: getting the GPU handle", nv.nvmlDeviceGetHandleByUUID, gpu_uuid)
            mode = int(self._call(f"GPU {gpu_uuid}: reading the compute mode", nv.nvmlDeviceGetComputeMode, h))
        return COMPUTE_MODE_NAMES.get(mode, f"mode {mode}")

    def set_compute_mode(self, gpu_uuid: str, mode: str) -> None:
        """``DEFAULT``, ``EXCLUSIVE_PROCESS`` or ``PROHIBITED`` (nvidia-smi's ``-c`` names)."""
        value = COMPUTE_MODE_VALUES.get(mode)
        if value is None:
            raise NvmlError(f"GPU {gpu_uuid}: {mode!r} is not a compute mode to set "
                            f"({', '.join(COMPUTE_MODE_VALUES)})")
        nv = self.nv
        with self._lock:
            h = self._call(f"GPU {gpu_uuid}: getting the GPU handle", nv.nvmlDeviceGetHandleByUUID, gpu_uuid)
            self._call(f"GPU {gpu_uuid}: setting the compute mode to {mode}", nv.nvmlDeviceSetComputeMode, h, value)
        _log.info("set the compute mode", gpu=gpu_uuid, mode=mode)

    # -- dynamic MIG -------------------------------------------------------------------------------

    def create_mig_instance(self, gpu: Gpu, profile: MigProfile, placement: MigPlacement) -> MigDevice:
        nv = self.nv
        what = f"GPU {gpu.index} ({gpu.uuid}): creating MIG {profile.name}@{placement.start}"
        with self._lock:
            h = self._call(f"{what}: getting the GPU handle", nv.nvmlDeviceGetHandleByUUID, gpu.uuid)
            current, _pending = self._call(f"{what}: reading MIG mode", nv.nvmlDeviceGetMigMode, h)
            if int(current) != NVML_DEVICE_MIG_ENABLE:
                self._call(f"{what}: enabling MIG mode", nv.nvmlDeviceSetMigMode, h, NVML_DEVICE_MIG_ENABLE)
                current, pending = self._call(f"{what}: reading MIG mode", nv.nvmlDeviceGetMigMode, h)
                if int(current) != NVML_DEVICE_MIG_ENABLE:
                    raise NvmlError(f"{what}: MIG mode is pending (pending={pending}); the GPU needs a reset "
                                    "with no processes running before MIG instances can be created", 16)
            profiles = self._profiles(h, gpu.uuid)
            for existing in self._mig_devices(h, gpu.uuid, profiles):
                if existing.profile == profile.name and existing.placement == placement:
                    return existing  # idempotent
            profile_id = self._profile_ids.get((gpu.uuid, profile.name))
            if profile_id is None:
                raise NvmlError(f"{what}: the GPU has no MIG profile {profile.name!r}")
            c_placement = nv.c_nvmlGpuInstancePlacement_t()
            c_placement.start = placement.start
            c_placement.size = placement.size
            # The C function takes a pointer: a Structure passed bare goes by value and NVML reads garbage.
            gi = self._call(f"{what}: creating the GPU instance", nv.nvmlDeviceCreateGpuInstanceWithPlacement,
                            h, profile_id, ctypes.byref(c_placement))
            try:
                gi_id = int(self._call(f"{what}: reading the GPU instance", nv.nvmlGpuInstanceGetInfo, gi).id)
                ci_profile = self._full_ci_profile(gi, profile.compute_slices, what)
                ci = self._call(f"{what}: creating the compute instance", nv.nvmlGpuInstanceCreateComputeInstance,
                                gi, ci_profile)
                ci_id = int(self._call(f"{what}: reading the compute instance", nv.nvmlComputeInstanceGetInfo,
                                       ci).id)
            except Exception:  # whatever failed, a bug too: no GPU instance left behind, then re-raised
                try:
                    nv.nvmlGpuInstanceDestroy(gi)
                except self.failed as exc:
                    _log.error("rollback: destroying the new GPU instance failed", error=str(exc))
                raise
            for mig in self._mig_devices(h, gpu.uuid, profiles):
                if mig.gpu_instance_id == gi_id and mig.compute_instance_id == ci_id:
                    _log.info("created MIG instance", gpu=gpu.index, profile=profile.name, start=placement.start,
                              uuid=mig.uuid)
                    return mig
            raise NvmlError(f"{what}: created GI {gi_id}/CI {ci_id} but NVML does not list the MIG device")

    def _full_ci_profile(self, gi: Any, compute_slices: int, what: str) -> int:
        nv = self.nv
        count = int(getattr(nv, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 9))
        engine = int(getattr(nv, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0))
        for idx in range(count):
            try:
                info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, idx, engine)
            except self.failed:
                continue
            if int(info.sliceCount) == compute_slices:
                return int(info.id)
        raise NvmlError(f"{what}: no compute-instance profile spans the whole GPU instance ({compute_slices} slices)")

    def destroy_mig_instance(self, mig: MigDevice) -> None:
        nv = self.nv
        what = f"destroying MIG device {mig.uuid} ({mig.profile}, GI {mig.gpu_instance_id}/CI {mig.compute_instance_id})"
        with self._lock:
            h = self._call(f"{what}: getting the parent GPU", nv.nvmlDeviceGetHandleByUUID, mig.parent_uuid)
            present = {m.uuid: m for m in self._mig_devices(h, mig.parent_uuid, self._profiles(h, mig.parent_uuid))}
            if mig.uuid not in present:
                return  # already gone
            live = present[mig.uuid]
            try:
                gi = nv.nvmlDeviceGetGpuInstanceById(h, live.gpu_instance_id)
            except self.failed as exc:
                if error_code(exc) in (NVML_ERROR_NOT_FOUND, NVML_ERROR_INVALID_ARGUMENT):
                    return
                raise explain(exc, f"{what}: looking up the GPU instance") from exc
            try:
                ci = nv.nvmlGpuInstanceGetComputeInstanceById(gi, live.compute_instance_id)
                self._call(f"{what}: destroying the compute instance", nv.nvmlComputeInstanceDestroy, ci)
            except self.failed as exc:  # the lookup's (_call turned the destroy's into an NvmlError)
                if error_code(exc) not in (NVML_ERROR_NOT_FOUND, NVML_ERROR_INVALID_ARGUMENT):
                    raise explain(exc, f"{what}: looking up the compute instance") from exc
            self._call(f"{what}: destroying the GPU instance", nv.nvmlGpuInstanceDestroy, gi)
            _log.info("destroyed MIG instance", uuid=mig.uuid)
