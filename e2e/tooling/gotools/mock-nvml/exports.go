package main

// Every exported function is declared by nvml.h (from the pinned go-nvml module, found by the
// build), so the C compiler checks each signature and struct layout against NVIDIA's header.
// Go cannot spell a const-qualified parameter or result: the header declares those few functions
// under other names, and the prototypes cgo writes for the exports below stand in their place.

/*
#cgo CFLAGS: -DNVML_NO_UNVERSIONED_FUNC_DEFS=1
#define nvmlErrorString dra_declared_nvmlErrorString
#define nvmlDeviceGetHandleByUUID dra_declared_nvmlDeviceGetHandleByUUID
#define nvmlDeviceGetHandleByPciBusId_v2 dra_declared_nvmlDeviceGetHandleByPciBusId_v2
#define nvmlDeviceCreateGpuInstanceWithPlacement dra_declared_nvmlDeviceCreateGpuInstanceWithPlacement
#include <nvml.h>
#undef nvmlErrorString
#undef nvmlDeviceGetHandleByUUID
#undef nvmlDeviceGetHandleByPciBusId_v2
#undef nvmlDeviceCreateGpuInstanceWithPlacement
*/
import "C"

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// One session (nvmlInit to the matching nvmlShutdown) at a time, shared by every thread, as NVML's.
var (
	mu       sync.Mutex
	sessions int
	machine  *Machine
	faults   map[string]nvml.Return
	reg      *handles
	texts    = map[C.nvmlReturn_t]*C.char{}
)

type eventSet struct{ freed bool }

func complain(err error) {
	fmt.Fprintf(os.Stderr, "mock-nvml: %v\n", err)
}

// call runs body under the session lock, after the checks every NVML function makes.
func call(name string, body func(m *Machine) nvml.Return) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if sessions == 0 {
		return C.NVML_ERROR_UNINITIALIZED
	}
	if ret, ok := faults[name]; ok {
		return C.nvmlReturn_t(ret)
	}
	return C.nvmlReturn_t(body(machine))
}

// changed persists a MIG change; the change stands either way, as a driver's would.
func changed(m *Machine) nvml.Return {
	if err := m.save(); err != nil {
		complain(err)
		return nvml.ERROR_UNKNOWN
	}
	return nvml.SUCCESS
}

func initialize(name string) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	parsed, err := parseFaults(getenv("DRA_MOCK_NVML_FAIL"))
	if err != nil {
		complain(err)
		return C.NVML_ERROR_UNKNOWN
	}
	if ret, ok := parsed[name]; ok {
		return C.nvmlReturn_t(ret)
	}
	if sessions == 0 {
		m, err := openMachine(getenv("DRA_MOCK_NVML_MACHINE"), getenv("DRA_MOCK_NVML_STATE"))
		if err != nil {
			complain(err)
			return C.NVML_ERROR_UNKNOWN
		}
		machine, faults, reg = m, parsed, newHandles()
	}
	sessions++
	return C.NVML_SUCCESS
}

// --- handles and buffers ------------------------------------------------------------------------

func gpuOf(h C.nvmlDevice_t) (*server.Device, bool) {
	obj, ok := reg.lookup(unsafe.Pointer(h.handle))
	gpu, isGpu := obj.(*server.Device)
	return gpu, ok && isGpu
}

func migOf(h C.nvmlDevice_t) (MigDevice, bool) {
	obj, ok := reg.lookup(unsafe.Pointer(h.handle))
	mig, isMig := obj.(MigDevice)
	return mig, ok && isMig
}

func giOf(h C.nvmlGpuInstance_t) (*server.GpuInstance, bool) {
	obj, ok := reg.lookup(unsafe.Pointer(h.handle))
	gi, isGi := obj.(*server.GpuInstance)
	return gi, ok && isGi
}

func ciOf(h C.nvmlComputeInstance_t) (*server.ComputeInstance, bool) {
	obj, ok := reg.lookup(unsafe.Pointer(h.handle))
	ci, isCi := obj.(*server.ComputeInstance)
	return ci, ok && isCi
}

// nvml.h wraps each handle's pointer in a one-member struct: the same ABI as the bare pointer.
func deviceHandle(obj any) C.nvmlDevice_t {
	return C.nvmlDevice_t{handle: (*C.struct_nvmlDevice_st)(reg.of(obj))}
}

func giHandle(gi *server.GpuInstance) C.nvmlGpuInstance_t {
	return C.nvmlGpuInstance_t{handle: (*C.struct_nvmlGpuInstance_st)(reg.of(gi))}
}

func ciHandle(ci *server.ComputeInstance) C.nvmlComputeInstance_t {
	return C.nvmlComputeInstance_t{handle: (*C.struct_nvmlComputeInstance_st)(reg.of(ci))}
}

// putString fills a caller's buffer of length bytes, NUL included, as NVML's string getters do.
func putString(buf *C.char, length C.uint, s string) nvml.Return {
	if buf == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	if uint64(len(s))+1 > uint64(length) {
		return nvml.ERROR_INSUFFICIENT_SIZE
	}
	dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(length))
	dst[copy(dst, s)] = 0
	return nvml.SUCCESS
}

// putField fills a fixed char array of a struct, truncating like NVML.
func putField(field []C.char, s string) {
	dst := unsafe.Slice((*byte)(unsafe.Pointer(&field[0])), len(field))
	dst[copy(dst[:len(dst)-1], s)] = 0
}

// --- initialisation and system ------------------------------------------------------------------

//export nvmlInit_v2
func nvmlInit_v2() C.nvmlReturn_t { return initialize("nvmlInit_v2") }

//export nvmlInitWithFlags
func nvmlInitWithFlags(flags C.uint) C.nvmlReturn_t { return initialize("nvmlInitWithFlags") }

//export nvmlShutdown
func nvmlShutdown() C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if sessions == 0 {
		return C.NVML_ERROR_UNINITIALIZED
	}
	sessions--
	if sessions == 0 {
		machine, faults, reg = nil, nil, nil
	}
	return C.NVML_SUCCESS
}

//export nvmlErrorString
func nvmlErrorString(result C.nvmlReturn_t) *C.char {
	mu.Lock()
	defer mu.Unlock()
	text, ok := texts[result]
	if !ok {
		text = C.CString(nvml.Return(result).Error()) // kept for the life of the process, as NVML's
		texts[result] = text
	}
	return text
}

//export nvmlSystemGetDriverVersion
func nvmlSystemGetDriverVersion(version *C.char, length C.uint) C.nvmlReturn_t {
	return call("nvmlSystemGetDriverVersion", func(m *Machine) nvml.Return {
		return putString(version, length, m.Server.DriverVersion)
	})
}

//export nvmlSystemGetNVMLVersion
func nvmlSystemGetNVMLVersion(version *C.char, length C.uint) C.nvmlReturn_t {
	return call("nvmlSystemGetNVMLVersion", func(m *Machine) nvml.Return {
		return putString(version, length, m.Server.NvmlVersion)
	})
}

func cudaDriverVersion(name string, version *C.int) C.nvmlReturn_t {
	return call(name, func(m *Machine) nvml.Return {
		if version == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*version = C.int(m.Server.CudaDriverVersion)
		return nvml.SUCCESS
	})
}

//export nvmlSystemGetCudaDriverVersion
func nvmlSystemGetCudaDriverVersion(version *C.int) C.nvmlReturn_t {
	return cudaDriverVersion("nvmlSystemGetCudaDriverVersion", version)
}

//export nvmlSystemGetCudaDriverVersion_v2
func nvmlSystemGetCudaDriverVersion_v2(version *C.int) C.nvmlReturn_t {
	return cudaDriverVersion("nvmlSystemGetCudaDriverVersion_v2", version)
}

// --- finding devices ----------------------------------------------------------------------------

//export nvmlDeviceGetCount_v2
func nvmlDeviceGetCount_v2(count *C.uint) C.nvmlReturn_t {
	return call("nvmlDeviceGetCount_v2", func(m *Machine) nvml.Return {
		if count == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*count = C.uint(len(m.GPUs))
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetHandleByIndex_v2
func nvmlDeviceGetHandleByIndex_v2(index C.uint, device *C.nvmlDevice_t) C.nvmlReturn_t {
	return call("nvmlDeviceGetHandleByIndex_v2", func(m *Machine) nvml.Return {
		if device == nil || int(index) >= len(m.GPUs) {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*device = deviceHandle(m.GPUs[index])
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetHandleByUUID
func nvmlDeviceGetHandleByUUID(uuid *C.char, device *C.nvmlDevice_t) C.nvmlReturn_t {
	return call("nvmlDeviceGetHandleByUUID", func(m *Machine) nvml.Return {
		if uuid == nil || device == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		want := C.GoString(uuid)
		for _, gpu := range m.GPUs {
			if gpu.UUID == want {
				*device = deviceHandle(gpu)
				return nvml.SUCCESS
			}
			for _, mig := range migDevices(gpu) {
				if migUUID(mig) == want {
					*device = deviceHandle(mig)
					return nvml.SUCCESS
				}
			}
		}
		return nvml.ERROR_NOT_FOUND
	})
}

//export nvmlDeviceGetHandleByPciBusId_v2
func nvmlDeviceGetHandleByPciBusId_v2(busID *C.char, device *C.nvmlDevice_t) C.nvmlReturn_t {
	return call("nvmlDeviceGetHandleByPciBusId_v2", func(m *Machine) nvml.Return {
		if busID == nil || device == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		want, err := parseBusID(C.GoString(busID))
		if err != nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		for _, gpu := range m.GPUs {
			if have, err := parseBusID(gpu.PciBusID); err == nil && have == want {
				*device = deviceHandle(gpu)
				return nvml.SUCCESS
			}
		}
		return nvml.ERROR_NOT_FOUND
	})
}

type busID struct{ domain, bus, device, function uint32 }

func parseBusID(text string) (busID, error) {
	var b busID
	_, err := fmt.Sscanf(strings.ToLower(text), "%x:%x:%x.%x", &b.domain, &b.bus, &b.device, &b.function)
	return b, err
}

// --- what a device is ---------------------------------------------------------------------------

// onGpu runs body for a full GPU's handle; anything else is an invalid argument.
func onGpu(name string, device C.nvmlDevice_t, body func(m *Machine, gpu *server.Device) nvml.Return) C.nvmlReturn_t {
	return call(name, func(m *Machine) nvml.Return {
		gpu, ok := gpuOf(device)
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return body(m, gpu)
	})
}

//export nvmlDeviceGetIndex
func nvmlDeviceGetIndex(device C.nvmlDevice_t, index *C.uint) C.nvmlReturn_t {
	return onGpu("nvmlDeviceGetIndex", device, func(_ *Machine, gpu *server.Device) nvml.Return {
		if index == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*index = C.uint(gpu.Index)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetMinorNumber
func nvmlDeviceGetMinorNumber(device C.nvmlDevice_t, minor *C.uint) C.nvmlReturn_t {
	return onGpu("nvmlDeviceGetMinorNumber", device, func(_ *Machine, gpu *server.Device) nvml.Return {
		if minor == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*minor = C.uint(gpu.Minor)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetUUID
func nvmlDeviceGetUUID(device C.nvmlDevice_t, uuid *C.char, length C.uint) C.nvmlReturn_t {
	return call("nvmlDeviceGetUUID", func(m *Machine) nvml.Return {
		if gpu, ok := gpuOf(device); ok {
			return putString(uuid, length, gpu.UUID)
		}
		if mig, ok := migOf(device); ok {
			return putString(uuid, length, migUUID(mig))
		}
		return nvml.ERROR_INVALID_ARGUMENT
	})
}

//export nvmlDeviceGetName
func nvmlDeviceGetName(device C.nvmlDevice_t, name *C.char, length C.uint) C.nvmlReturn_t {
	return call("nvmlDeviceGetName", func(m *Machine) nvml.Return {
		if gpu, ok := gpuOf(device); ok {
			return putString(name, length, gpu.Config.Name)
		}
		if mig, ok := migOf(device); ok {
			profile, _ := gpuInstanceProfile(mig.GPU, mig.GI.Info.ProfileId)
			return putString(name, length, mig.GPU.Config.Name+" MIG "+gpuInstanceProfileName(profile))
		}
		return nvml.ERROR_INVALID_ARGUMENT
	})
}

//export nvmlDeviceGetBrand
func nvmlDeviceGetBrand(device C.nvmlDevice_t, brand *C.nvmlBrandType_t) C.nvmlReturn_t {
	return onGpu("nvmlDeviceGetBrand", device, func(_ *Machine, gpu *server.Device) nvml.Return {
		if brand == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*brand = C.nvmlBrandType_t(gpu.Config.Brand)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetArchitecture
func nvmlDeviceGetArchitecture(device C.nvmlDevice_t, arch *C.nvmlDeviceArchitecture_t) C.nvmlReturn_t {
	return onGpu("nvmlDeviceGetArchitecture", device, func(_ *Machine, gpu *server.Device) nvml.Return {
		if arch == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*arch = C.nvmlDeviceArchitecture_t(gpu.Config.Architecture)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetCudaComputeCapability
func nvmlDeviceGetCudaComputeCapability(device C.nvmlDevice_t, major *C.int, minor *C.int) C.nvmlReturn_t {
	return onGpu("nvmlDeviceGetCudaComputeCapability", device, func(_ *Machine, gpu *server.Device) nvml.Return {
		if major == nil || minor == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*major, *minor = C.int(gpu.Config.CudaMajor), C.int(gpu.Config.CudaMinor)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetMemoryInfo
func nvmlDeviceGetMemoryInfo(device C.nvmlDevice_t, memory *C.nvmlMemory_t) C.nvmlReturn_t {
	return call("nvmlDeviceGetMemoryInfo", func(m *Machine) nvml.Return {
		if memory == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if gpu, ok := gpuOf(device); ok {
			memory.total = C.ulonglong(gpu.MemoryInfo.Total)
			memory.free = C.ulonglong(gpu.MemoryInfo.Free)
			memory.used = C.ulonglong(gpu.MemoryInfo.Used)
			return nvml.SUCCESS
		}
		if mig, ok := migOf(device); ok {
			profile, _ := gpuInstanceProfile(mig.GPU, mig.GI.Info.ProfileId)
			memory.total = C.ulonglong(profile.info.MemorySizeMB * 1024 * 1024)
			memory.free, memory.used = memory.total, 0
			return nvml.SUCCESS
		}
		return nvml.ERROR_INVALID_ARGUMENT
	})
}

//export nvmlDeviceGetPciInfo_v3
func nvmlDeviceGetPciInfo_v3(device C.nvmlDevice_t, pci *C.nvmlPciInfo_t) C.nvmlReturn_t {
	return onGpu("nvmlDeviceGetPciInfo_v3", device, func(_ *Machine, gpu *server.Device) nvml.Return {
		if pci == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		// go-nvml's mock keeps the bus ID on the device but leaves it out of its PciInfo.
		b, err := parseBusID(gpu.PciBusID)
		if err != nil {
			return nvml.ERROR_UNKNOWN
		}
		info, _ := gpu.GetPciInfo()
		*pci = C.nvmlPciInfo_t{}
		putField(pci.busIdLegacy[:], fmt.Sprintf("%04X:%02X:%02X.%X", b.domain, b.bus, b.device, b.function))
		putField(pci.busId[:], fmt.Sprintf("%08X:%02X:%02X.%X", b.domain, b.bus, b.device, b.function))
		pci.domain, pci.bus, pci.device = C.uint(b.domain), C.uint(b.bus), C.uint(b.device)
		pci.pciDeviceId = C.uint(info.PciDeviceId)
		pci.pciSubSystemId = C.uint(info.PciSubSystemId)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetAttributes_v2
func nvmlDeviceGetAttributes_v2(device C.nvmlDevice_t, attributes *C.nvmlDeviceAttributes_t) C.nvmlReturn_t {
	return call("nvmlDeviceGetAttributes_v2", func(m *Machine) nvml.Return {
		if attributes == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if _, ok := gpuOf(device); ok {
			return nvml.ERROR_NOT_SUPPORTED // the mock does not know a full GPU's engine counts
		}
		mig, ok := migOf(device)
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		gi, _ := gpuInstanceProfile(mig.GPU, mig.GI.Info.ProfileId)
		_, ci, _ := computeInstanceProfile(mig.GI, mig.CI.Info.ProfileId)
		*attributes = C.nvmlDeviceAttributes_t{
			multiprocessorCount:       C.uint(ci.MultiprocessorCount),
			sharedCopyEngineCount:     C.uint(ci.SharedCopyEngineCount),
			sharedDecoderCount:        C.uint(ci.SharedDecoderCount),
			sharedEncoderCount:        C.uint(ci.SharedEncoderCount),
			sharedJpegCount:           C.uint(ci.SharedJpegCount),
			sharedOfaCount:            C.uint(ci.SharedOfaCount),
			gpuInstanceSliceCount:     C.uint(gi.info.SliceCount),
			computeInstanceSliceCount: C.uint(ci.SliceCount),
			memorySizeMB:              C.ulonglong(gi.info.MemorySizeMB),
		}
		return nvml.SUCCESS
	})
}

// --- MIG mode and MIG devices -------------------------------------------------------------------

//export nvmlDeviceGetMigMode
func nvmlDeviceGetMigMode(device C.nvmlDevice_t, current *C.uint, pending *C.uint) C.nvmlReturn_t {
	return onGpu("nvmlDeviceGetMigMode", device, func(_ *Machine, gpu *server.Device) nvml.Return {
		if current == nil || pending == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		now, next, ret := gpu.GetMigMode()
		*current, *pending = C.uint(now), C.uint(next)
		return ret
	})
}

//export nvmlDeviceSetMigMode
func nvmlDeviceSetMigMode(device C.nvmlDevice_t, mode C.uint, activation *C.nvmlReturn_t) C.nvmlReturn_t {
	return onGpu("nvmlDeviceSetMigMode", device, func(m *Machine, gpu *server.Device) nvml.Return {
		if activation == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if ret := setMigMode(gpu, int(mode)); ret != nvml.SUCCESS {
			return ret
		}
		*activation = C.NVML_SUCCESS // the mock applies the mode at once, as after a GPU reset
		return changed(m)
	})
}

//export nvmlDeviceGetComputeMode
func nvmlDeviceGetComputeMode(device C.nvmlDevice_t, mode *C.nvmlComputeMode_t) C.nvmlReturn_t {
	return onGpu("nvmlDeviceGetComputeMode", device, func(m *Machine, gpu *server.Device) nvml.Return {
		record := m.modeOf(gpu)
		if mode == nil || record == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*mode = C.nvmlComputeMode_t(record.Current)
		return nvml.SUCCESS
	})
}

// nvmlDeviceSetComputeMode takes the modes NVML documents as settable: DEFAULT, PROHIBITED and
// EXCLUSIVE_PROCESS (EXCLUSIVE_THREAD is deprecated and refused, as the driver refuses it).
//
//export nvmlDeviceSetComputeMode
func nvmlDeviceSetComputeMode(device C.nvmlDevice_t, mode C.nvmlComputeMode_t) C.nvmlReturn_t {
	return onGpu("nvmlDeviceSetComputeMode", device, func(m *Machine, gpu *server.Device) nvml.Return {
		record := m.modeOf(gpu)
		value := int(mode)
		if record == nil || (value != int(nvml.COMPUTEMODE_DEFAULT) && value != int(nvml.COMPUTEMODE_PROHIBITED) &&
			value != int(nvml.COMPUTEMODE_EXCLUSIVE_PROCESS)) {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		record.Current = value
		record.Changes = append(record.Changes, value)
		return changed(m)
	})
}

//export nvmlDeviceIsMigDeviceHandle
func nvmlDeviceIsMigDeviceHandle(device C.nvmlDevice_t, isMig *C.uint) C.nvmlReturn_t {
	return call("nvmlDeviceIsMigDeviceHandle", func(m *Machine) nvml.Return {
		if isMig == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if _, ok := gpuOf(device); ok {
			*isMig = 0
			return nvml.SUCCESS
		}
		if _, ok := migOf(device); ok {
			*isMig = 1
			return nvml.SUCCESS
		}
		return nvml.ERROR_INVALID_ARGUMENT
	})
}

//export nvmlDeviceGetMaxMigDeviceCount
func nvmlDeviceGetMaxMigDeviceCount(device C.nvmlDevice_t, count *C.uint) C.nvmlReturn_t {
	return onGpu("nvmlDeviceGetMaxMigDeviceCount", device, func(_ *Machine, gpu *server.Device) nvml.Return {
		if count == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*count = C.uint(maxMigDevices(gpu))
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetMigDeviceHandleByIndex
func nvmlDeviceGetMigDeviceHandleByIndex(device C.nvmlDevice_t, index C.uint, mig *C.nvmlDevice_t) C.nvmlReturn_t {
	return onGpu("nvmlDeviceGetMigDeviceHandleByIndex", device, func(_ *Machine, gpu *server.Device) nvml.Return {
		if mig == nil || uint32(index) >= maxMigDevices(gpu) {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if gpu.MigMode != nvml.DEVICE_MIG_ENABLE {
			return nvml.ERROR_NOT_SUPPORTED
		}
		existing := migDevices(gpu)
		if int(index) >= len(existing) {
			return nvml.ERROR_NOT_FOUND
		}
		*mig = deviceHandle(existing[index])
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetDeviceHandleFromMigDeviceHandle
func nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig C.nvmlDevice_t, device *C.nvmlDevice_t) C.nvmlReturn_t {
	return call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", func(m *Machine) nvml.Return {
		d, ok := migOf(mig)
		if !ok || device == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*device = deviceHandle(d.GPU)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetGpuInstanceId
func nvmlDeviceGetGpuInstanceId(device C.nvmlDevice_t, id *C.uint) C.nvmlReturn_t {
	return call("nvmlDeviceGetGpuInstanceId", func(m *Machine) nvml.Return {
		if _, ok := gpuOf(device); ok {
			return nvml.ERROR_NOT_SUPPORTED
		}
		mig, ok := migOf(device)
		if !ok || id == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*id = C.uint(mig.GI.Info.Id)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetComputeInstanceId
func nvmlDeviceGetComputeInstanceId(device C.nvmlDevice_t, id *C.uint) C.nvmlReturn_t {
	return call("nvmlDeviceGetComputeInstanceId", func(m *Machine) nvml.Return {
		if _, ok := gpuOf(device); ok {
			return nvml.ERROR_NOT_SUPPORTED
		}
		mig, ok := migOf(device)
		if !ok || id == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*id = C.uint(mig.CI.Info.Id)
		return nvml.SUCCESS
	})
}

// --- GPU instances ------------------------------------------------------------------------------

//export nvmlDeviceGetGpuInstanceProfileInfoV
func nvmlDeviceGetGpuInstanceProfileInfoV(device C.nvmlDevice_t, profile C.uint,
	info *C.nvmlGpuInstanceProfileInfo_v2_t) C.nvmlReturn_t {
	return onGpu("nvmlDeviceGetGpuInstanceProfileInfoV", device, func(_ *Machine, gpu *server.Device) nvml.Return {
		if info == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		version := info.version
		if version != C.nvmlGpuInstanceProfileInfo_v2 && version != C.nvmlGpuInstanceProfileInfo_v3 {
			return nvml.ERROR_ARGUMENT_VERSION_MISMATCH
		}
		p, ret := gpu.GetGpuInstanceProfileInfo(int(profile))
		if ret != nvml.SUCCESS {
			return ret
		}
		name := "MIG " + gpuInstanceProfileName(giProfile{int(profile), p})
		if version == C.nvmlGpuInstanceProfileInfo_v3 {
			v3 := (*C.nvmlGpuInstanceProfileInfo_v3_t)(unsafe.Pointer(info))
			*v3 = C.nvmlGpuInstanceProfileInfo_v3_t{version: version, id: C.uint(p.Id),
				sliceCount: C.uint(p.SliceCount), instanceCount: C.uint(p.InstanceCount),
				multiprocessorCount: C.uint(p.MultiprocessorCount), copyEngineCount: C.uint(p.CopyEngineCount),
				decoderCount: C.uint(p.DecoderCount), encoderCount: C.uint(p.EncoderCount),
				jpegCount: C.uint(p.JpegCount), ofaCount: C.uint(p.OfaCount),
				memorySizeMB: C.ulonglong(p.MemorySizeMB)}
			putField(v3.name[:], name)
			return nvml.SUCCESS
		}
		*info = C.nvmlGpuInstanceProfileInfo_v2_t{version: version, id: C.uint(p.Id),
			isP2pSupported: C.uint(p.IsP2pSupported), sliceCount: C.uint(p.SliceCount),
			instanceCount: C.uint(p.InstanceCount), multiprocessorCount: C.uint(p.MultiprocessorCount),
			copyEngineCount: C.uint(p.CopyEngineCount), decoderCount: C.uint(p.DecoderCount),
			encoderCount: C.uint(p.EncoderCount), jpegCount: C.uint(p.JpegCount), ofaCount: C.uint(p.OfaCount),
			memorySizeMB: C.ulonglong(p.MemorySizeMB)}
		putField(info.name[:], name)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetGpuInstancePossiblePlacements_v2
func nvmlDeviceGetGpuInstancePossiblePlacements_v2(device C.nvmlDevice_t, profileID C.uint,
	placements *C.nvmlGpuInstancePlacement_t, count *C.uint) C.nvmlReturn_t {
	return onGpu("nvmlDeviceGetGpuInstancePossiblePlacements_v2", device, func(_ *Machine, gpu *server.Device) nvml.Return {
		if count == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		profile, ok := gpuInstanceProfile(gpu, uint32(profileID))
		if !ok {
			return nvml.ERROR_NOT_SUPPORTED
		}
		possible := gpu.Config.MIGProfiles.GpuInstancePlacements[profile.index]
		if placements == nil { // the caller asks how many
			*count = C.uint(len(possible))
			return nvml.SUCCESS
		}
		if int(*count) < len(possible) {
			*count = C.uint(len(possible))
			return nvml.ERROR_INSUFFICIENT_SIZE
		}
		out := unsafe.Slice(placements, len(possible))
		for i, p := range possible {
			out[i] = C.nvmlGpuInstancePlacement_t{start: C.uint(p.Start), size: C.uint(p.Size)}
		}
		*count = C.uint(len(possible))
		return nvml.SUCCESS
	})
}

func createdGpuInstance(m *Machine, gpu *server.Device, profileID C.uint, placement *nvml.GpuInstancePlacement,
	out *C.nvmlGpuInstance_t) nvml.Return {
	if out == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	gi, ret := createGpuInstance(gpu, uint32(profileID), placement, 0)
	if ret != nvml.SUCCESS {
		return ret
	}
	*out = giHandle(gi)
	return changed(m)
}

//export nvmlDeviceCreateGpuInstance
func nvmlDeviceCreateGpuInstance(device C.nvmlDevice_t, profileID C.uint, gi *C.nvmlGpuInstance_t) C.nvmlReturn_t {
	return onGpu("nvmlDeviceCreateGpuInstance", device, func(m *Machine, gpu *server.Device) nvml.Return {
		return createdGpuInstance(m, gpu, profileID, nil, gi)
	})
}

//export nvmlDeviceCreateGpuInstanceWithPlacement
func nvmlDeviceCreateGpuInstanceWithPlacement(device C.nvmlDevice_t, profileID C.uint,
	placement *C.nvmlGpuInstancePlacement_t, gi *C.nvmlGpuInstance_t) C.nvmlReturn_t {
	return onGpu("nvmlDeviceCreateGpuInstanceWithPlacement", device, func(m *Machine, gpu *server.Device) nvml.Return {
		if placement == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		wanted := nvml.GpuInstancePlacement{Start: uint32(placement.start), Size: uint32(placement.size)}
		return createdGpuInstance(m, gpu, profileID, &wanted, gi)
	})
}

//export nvmlDeviceGetGpuInstanceById
func nvmlDeviceGetGpuInstanceById(device C.nvmlDevice_t, id C.uint, gi *C.nvmlGpuInstance_t) C.nvmlReturn_t {
	return onGpu("nvmlDeviceGetGpuInstanceById", device, func(_ *Machine, gpu *server.Device) nvml.Return {
		if gi == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if gpu.MigMode != nvml.DEVICE_MIG_ENABLE {
			return nvml.ERROR_NOT_SUPPORTED
		}
		for _, candidate := range gpuInstances(gpu) {
			if candidate.Info.Id == uint32(id) {
				*gi = giHandle(candidate)
				return nvml.SUCCESS
			}
		}
		return nvml.ERROR_NOT_FOUND
	})
}

//export nvmlGpuInstanceGetInfo
func nvmlGpuInstanceGetInfo(gi C.nvmlGpuInstance_t, info *C.nvmlGpuInstanceInfo_t) C.nvmlReturn_t {
	return call("nvmlGpuInstanceGetInfo", func(m *Machine) nvml.Return {
		instance, ok := giOf(gi)
		if !ok || info == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*info = C.nvmlGpuInstanceInfo_t{
			device: deviceHandle(instance.Info.Device.(*server.Device)), id: C.uint(instance.Info.Id),
			profileId: C.uint(instance.Info.ProfileId),
			placement: C.nvmlGpuInstancePlacement_t{start: C.uint(instance.Info.Placement.Start),
				size: C.uint(instance.Info.Placement.Size)},
		}
		return nvml.SUCCESS
	})
}

//export nvmlGpuInstanceDestroy
func nvmlGpuInstanceDestroy(gi C.nvmlGpuInstance_t) C.nvmlReturn_t {
	return call("nvmlGpuInstanceDestroy", func(m *Machine) nvml.Return {
		instance, ok := giOf(gi)
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if ret := destroyGpuInstance(instance); ret != nvml.SUCCESS {
			return ret
		}
		reg.retire(instance)
		return changed(m)
	})
}

// --- compute instances --------------------------------------------------------------------------

//export nvmlGpuInstanceGetComputeInstanceProfileInfoV
func nvmlGpuInstanceGetComputeInstanceProfileInfoV(gi C.nvmlGpuInstance_t, profile C.uint, engProfile C.uint,
	info *C.nvmlComputeInstanceProfileInfo_v2_t) C.nvmlReturn_t {
	return call("nvmlGpuInstanceGetComputeInstanceProfileInfoV", func(m *Machine) nvml.Return {
		instance, ok := giOf(gi)
		if !ok || info == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		version := info.version
		if version != C.nvmlComputeInstanceProfileInfo_v2 && version != C.nvmlComputeInstanceProfileInfo_v3 {
			return nvml.ERROR_ARGUMENT_VERSION_MISMATCH
		}
		p, ret := instance.GetComputeInstanceProfileInfo(int(profile), int(engProfile))
		if ret != nvml.SUCCESS {
			return ret
		}
		parent, _ := gpuInstanceProfile(instance.Info.Device.(*server.Device), instance.Info.ProfileId)
		name := "MIG " + computeInstanceProfileName(parent, p)
		if version == C.nvmlComputeInstanceProfileInfo_v3 {
			v3 := (*C.nvmlComputeInstanceProfileInfo_v3_t)(unsafe.Pointer(info))
			*v3 = C.nvmlComputeInstanceProfileInfo_v3_t{version: version, id: C.uint(p.Id),
				sliceCount: C.uint(p.SliceCount), instanceCount: C.uint(p.InstanceCount),
				multiprocessorCount: C.uint(p.MultiprocessorCount), sharedCopyEngineCount: C.uint(p.SharedCopyEngineCount),
				sharedDecoderCount: C.uint(p.SharedDecoderCount), sharedEncoderCount: C.uint(p.SharedEncoderCount),
				sharedJpegCount: C.uint(p.SharedJpegCount), sharedOfaCount: C.uint(p.SharedOfaCount)}
			putField(v3.name[:], name)
			return nvml.SUCCESS
		}
		*info = C.nvmlComputeInstanceProfileInfo_v2_t{version: version, id: C.uint(p.Id),
			sliceCount: C.uint(p.SliceCount), instanceCount: C.uint(p.InstanceCount),
			multiprocessorCount: C.uint(p.MultiprocessorCount), sharedCopyEngineCount: C.uint(p.SharedCopyEngineCount),
			sharedDecoderCount: C.uint(p.SharedDecoderCount), sharedEncoderCount: C.uint(p.SharedEncoderCount),
			sharedJpegCount: C.uint(p.SharedJpegCount), sharedOfaCount: C.uint(p.SharedOfaCount)}
		putField(info.name[:], name)
		return nvml.SUCCESS
	})
}

//export nvmlGpuInstanceCreateComputeInstance
func nvmlGpuInstanceCreateComputeInstance(gi C.nvmlGpuInstance_t, profileID C.uint,
	ci *C.nvmlComputeInstance_t) C.nvmlReturn_t {
	return call("nvmlGpuInstanceCreateComputeInstance", func(m *Machine) nvml.Return {
		instance, ok := giOf(gi)
		if !ok || ci == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		created, ret := createComputeInstance(instance, uint32(profileID), anyComputeInstanceID)
		if ret != nvml.SUCCESS {
			return ret
		}
		*ci = ciHandle(created)
		return changed(m)
	})
}

//export nvmlGpuInstanceGetComputeInstanceById
func nvmlGpuInstanceGetComputeInstanceById(gi C.nvmlGpuInstance_t, id C.uint, ci *C.nvmlComputeInstance_t) C.nvmlReturn_t {
	return call("nvmlGpuInstanceGetComputeInstanceById", func(m *Machine) nvml.Return {
		instance, ok := giOf(gi)
		if !ok || ci == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		for _, candidate := range computeInstances(instance) {
			if candidate.Info.Id == uint32(id) {
				*ci = ciHandle(candidate)
				return nvml.SUCCESS
			}
		}
		return nvml.ERROR_NOT_FOUND
	})
}

//export nvmlComputeInstanceGetInfo_v2
func nvmlComputeInstanceGetInfo_v2(ci C.nvmlComputeInstance_t, info *C.nvmlComputeInstanceInfo_t) C.nvmlReturn_t {
	return call("nvmlComputeInstanceGetInfo_v2", func(m *Machine) nvml.Return {
		instance, ok := ciOf(ci)
		if !ok || info == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*info = C.nvmlComputeInstanceInfo_t{
			device:      deviceHandle(instance.Info.Device.(*server.Device)),
			gpuInstance: giHandle(instance.Info.GpuInstance.(*server.GpuInstance)),
			id:          C.uint(instance.Info.Id), profileId: C.uint(instance.Info.ProfileId),
			placement: C.nvmlComputeInstancePlacement_t{start: C.uint(instance.Info.Placement.Start),
				size: C.uint(instance.Info.Placement.Size)},
		}
		return nvml.SUCCESS
	})
}

//export nvmlComputeInstanceDestroy
func nvmlComputeInstanceDestroy(ci C.nvmlComputeInstance_t) C.nvmlReturn_t {
	return call("nvmlComputeInstanceDestroy", func(m *Machine) nvml.Return {
		instance, ok := ciOf(ci)
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		gi := instance.Info.GpuInstance.(*server.GpuInstance)
		mig := MigDevice{instance.Info.Device.(*server.Device), gi, instance}
		if ret := instance.Destroy(); ret != nvml.SUCCESS {
			return ret
		}
		reg.retire(instance)
		reg.retire(mig)
		return changed(m)
	})
}

// --- health events: the mock's GPUs never fail, so a wait always times out ----------------------

const healthEvents = C.nvmlEventTypeXidCriticalError | C.nvmlEventTypeDoubleBitEccError | C.nvmlEventTypeSingleBitEccError

//export nvmlEventSetCreate
func nvmlEventSetCreate(set *C.nvmlEventSet_t) C.nvmlReturn_t {
	return call("nvmlEventSetCreate", func(m *Machine) nvml.Return {
		if set == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*set = C.nvmlEventSet_t{handle: (*C.struct_nvmlEventSet_st)(reg.of(&eventSet{}))}
		return nvml.SUCCESS
	})
}

func eventSetOf(set C.nvmlEventSet_t) (*eventSet, bool) {
	obj, ok := reg.lookup(unsafe.Pointer(set.handle))
	s, isSet := obj.(*eventSet)
	return s, ok && isSet && !s.freed
}

//export nvmlDeviceGetSupportedEventTypes
func nvmlDeviceGetSupportedEventTypes(device C.nvmlDevice_t, types *C.ulonglong) C.nvmlReturn_t {
	return onGpu("nvmlDeviceGetSupportedEventTypes", device, func(_ *Machine, _ *server.Device) nvml.Return {
		if types == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*types = healthEvents
		return nvml.SUCCESS
	})
}

//export nvmlDeviceRegisterEvents
func nvmlDeviceRegisterEvents(device C.nvmlDevice_t, types C.ulonglong, set C.nvmlEventSet_t) C.nvmlReturn_t {
	return onGpu("nvmlDeviceRegisterEvents", device, func(_ *Machine, _ *server.Device) nvml.Return {
		if _, ok := eventSetOf(set); !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if types&^healthEvents != 0 {
			return nvml.ERROR_NOT_SUPPORTED
		}
		return nvml.SUCCESS
	})
}

//export nvmlEventSetWait_v2
func nvmlEventSetWait_v2(set C.nvmlEventSet_t, data *C.nvmlEventData_t, timeoutMs C.uint) C.nvmlReturn_t {
	ret := call("nvmlEventSetWait_v2", func(m *Machine) nvml.Return {
		if _, ok := eventSetOf(set); !ok || data == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.SUCCESS
	})
	if ret != C.NVML_SUCCESS {
		return ret
	}
	// Sleep outside the lock, in steps, so MIG changes go on and a freed set ends the wait.
	deadline := time.Now().Add(time.Duration(timeoutMs) * time.Millisecond)
	for time.Now().Before(deadline) {
		time.Sleep(min(50*time.Millisecond, time.Until(deadline)))
		mu.Lock()
		live := reg != nil
		if live {
			_, live = eventSetOf(set)
		}
		mu.Unlock()
		if !live {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
	}
	return C.NVML_ERROR_TIMEOUT
}

//export nvmlEventSetFree
func nvmlEventSetFree(set C.nvmlEventSet_t) C.nvmlReturn_t {
	return call("nvmlEventSetFree", func(m *Machine) nvml.Return {
		s, ok := eventSetOf(set)
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		s.freed = true
		reg.retire(s)
		return nvml.SUCCESS
	})
}
