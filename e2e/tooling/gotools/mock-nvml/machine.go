package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/uuid"
)

const defaultMachine = "dgxh100"

var machines = map[string]func() *server.Server{
	"dgxa100": dgxa100.New, "dgxh100": dgxh100.New, "dgxh200": dgxh200.New, "dgxb200": dgxb200.New,
}

// The driver's MIG capability layout has 15 GPU-instance slots of 8 compute instances, and hands
// out GPU instance IDs from 1; go-nvml's counters would grow without bound.
const (
	firstGpuInstanceID    = 1
	lastGpuInstanceID     = 14
	lastComputeInstanceID = 7
)

// Every machine runs one driver install, a real R570 datacenter release (CUDA 12.8): a node has one
// driver whatever its GPUs, and the fake driver root (e2e/testbed/fakedriver.py) names its files
// after this version, as the NVIDIA Container Toolkit looks them up by it. go-nvml's mocks report
// 550.54.15 (B200: 560.28.03), older than the driver this project is tested for.
const (
	installedDriverVersion = "570.172.08"
	installedNvmlVersion   = "12." + installedDriverVersion
	installedCudaVersion   = 12080
)

var uuidNamespace = uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://gpu.dra-driver.io/mock-nvml"))

// Machine is one mock server and what this library adds to it: stable UUIDs, real NVML's checks on
// MIG changes, and where its MIG state is kept.
type Machine struct {
	Name      string
	Server    *server.Server
	GPUs      []*server.Device
	StatePath string
	// Compute modes (go-nvml's mock keeps none): the current one and every change, per GPU.
	Modes []computeMode
}

// computeMode is a GPU's NVML_COMPUTEMODE_* and the modes it was set to, in order, for tests to read.
type computeMode struct {
	Current int
	Changes []int
}

// MigDevice is what NVML calls a MIG device: one compute instance, addressed as a device.
type MigDevice struct {
	GPU *server.Device
	GI  *server.GpuInstance
	CI  *server.ComputeInstance
}

// giProfile is a GPU-instance profile with the NVML_GPU_INSTANCE_PROFILE_* index it is listed under.
type giProfile struct {
	index int
	info  nvml.GpuInstanceProfileInfo
}

func machineNames() []string {
	names := make([]string, 0, len(machines))
	for name := range machines {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

func newMachine(name string) (*Machine, error) {
	build, ok := machines[name]
	if !ok {
		return nil, fmt.Errorf("DRA_MOCK_NVML_MACHINE=%q is not a mock machine; use one of %s",
			name, strings.Join(machineNames(), ", "))
	}
	m := &Machine{Name: name, Server: build()}
	m.Server.DriverVersion = installedDriverVersion
	m.Server.NvmlVersion = installedNvmlVersion
	m.Server.CudaDriverVersion = installedCudaVersion
	for i, d := range m.Server.Devices {
		gpu := d.(*server.Device)
		// go-nvml draws random UUIDs; a real GPU keeps its UUID, and the plugin's checkpoint relies on it.
		gpu.UUID = "GPU-" + uuid.NewSHA1(uuidNamespace, []byte(fmt.Sprintf("%s/gpu/%d", name, i))).String()
		m.GPUs = append(m.GPUs, gpu)
	}
	m.Modes = make([]computeMode, len(m.GPUs))
	return m, nil
}

// modeOf is the compute-mode record of gpu (nil for a device that is not one of the machine's GPUs).
func (m *Machine) modeOf(gpu *server.Device) *computeMode {
	for i, g := range m.GPUs {
		if g == gpu {
			return &m.Modes[i]
		}
	}
	return nil
}

func migUUID(d MigDevice) string {
	key := fmt.Sprintf("%s/gi/%d/ci/%d", d.GPU.UUID, d.GI.Info.Id, d.CI.Info.Id)
	return "MIG-" + uuid.NewSHA1(uuidNamespace, []byte(key)).String()
}

// --- profiles -----------------------------------------------------------------------------------

func gpuInstanceProfile(gpu *server.Device, id uint32) (giProfile, bool) {
	for index, info := range gpu.Config.MIGProfiles.GpuInstanceProfiles {
		if info.Id == id {
			return giProfile{index, info}, true
		}
	}
	return giProfile{}, false
}

func computeInstanceProfile(gi *server.GpuInstance, id uint32) (int, nvml.ComputeInstanceProfileInfo, bool) {
	for index, info := range gi.MIGProfiles.ComputeInstanceProfiles[int(gi.Info.ProfileId)] {
		if info.Id == id {
			return index, info, true
		}
	}
	return 0, nvml.ComputeInstanceProfileInfo{}, false
}

// Suffixes NVML gives the variants of a slice count (media extensions, graphics).
var profileSuffix = map[int]string{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: "+me", nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1: "+me",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME: "-me", nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME: "-me",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME: "+me.all", nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME: "+me.all",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX: "+gfx", nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX: "+gfx",
	nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX: "+gfx", nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX: "+gfx",
}

// gpuInstanceProfileName is NVML's name for a profile without its "MIG " prefix: 1g.10gb, 1g.10gb+me.
func gpuInstanceProfileName(p giProfile) string {
	gigabytes := (p.info.MemorySizeMB + 1023) / 1024
	return fmt.Sprintf("%dg.%dgb%s", p.info.SliceCount, gigabytes, profileSuffix[p.index])
}

// computeInstanceProfileName is 1c.3g.40gb for a compute instance smaller than its GPU instance.
func computeInstanceProfileName(gi giProfile, ci nvml.ComputeInstanceProfileInfo) string {
	if ci.SliceCount < gi.info.SliceCount {
		return fmt.Sprintf("%dc.%s", ci.SliceCount, gpuInstanceProfileName(gi))
	}
	return gpuInstanceProfileName(gi)
}

// --- what exists ----------------------------------------------------------------------------------

func gpuInstances(gpu *server.Device) []*server.GpuInstance {
	gis := make([]*server.GpuInstance, 0, len(gpu.GpuInstances))
	for gi := range gpu.GpuInstances {
		gis = append(gis, gi)
	}
	sort.Slice(gis, func(i, j int) bool { return gis[i].Info.Id < gis[j].Info.Id })
	return gis
}

func computeInstances(gi *server.GpuInstance) []*server.ComputeInstance {
	cis := make([]*server.ComputeInstance, 0, len(gi.ComputeInstances))
	for ci := range gi.ComputeInstances {
		cis = append(cis, ci)
	}
	sort.Slice(cis, func(i, j int) bool { return cis[i].Info.Id < cis[j].Info.Id })
	return cis
}

func migDevices(gpu *server.Device) []MigDevice {
	var out []MigDevice
	for _, gi := range gpuInstances(gpu) {
		for _, ci := range computeInstances(gi) {
			out = append(out, MigDevice{gpu, gi, ci})
		}
	}
	return out
}

// maxMigDevices is the most MIG devices the GPU can hold: one per compute slice.
func maxMigDevices(gpu *server.Device) uint32 {
	var most uint32
	for _, info := range gpu.Config.MIGProfiles.GpuInstanceProfiles {
		most = max(most, info.SliceCount)
	}
	return most
}

func overlaps(aStart, aSize, bStart, bSize uint32) bool {
	return aStart < bStart+bSize && bStart < aStart+aSize
}

// --- MIG changes, with the checks a real driver makes and go-nvml's mock leaves out ---------------

func setMigMode(gpu *server.Device, mode int) nvml.Return {
	if mode != nvml.DEVICE_MIG_DISABLE && mode != nvml.DEVICE_MIG_ENABLE {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	if mode == nvml.DEVICE_MIG_DISABLE && len(gpu.GpuInstances) > 0 {
		return nvml.ERROR_IN_USE
	}
	_, ret := gpu.SetMigMode(mode)
	return ret
}

// createGpuInstance places a GPU instance; a nil placement takes the first free one, and id 0
// the lowest free GPU instance ID.
func createGpuInstance(gpu *server.Device, profileID uint32, placement *nvml.GpuInstancePlacement,
	id uint32) (*server.GpuInstance, nvml.Return) {
	if gpu.MigMode != nvml.DEVICE_MIG_ENABLE {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	profile, ok := gpuInstanceProfile(gpu, profileID)
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	existing := gpuInstances(gpu)
	same := 0
	for _, gi := range existing {
		if gi.Info.ProfileId == profileID {
			same++
		}
	}
	if same >= int(profile.info.InstanceCount) {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	free := func(p nvml.GpuInstancePlacement) bool {
		for _, gi := range existing {
			if overlaps(p.Start, p.Size, gi.Info.Placement.Start, gi.Info.Placement.Size) {
				return false
			}
		}
		return true
	}
	possible := gpu.Config.MIGProfiles.GpuInstancePlacements[profile.index]
	var chosen *nvml.GpuInstancePlacement
	for i := range possible {
		p := possible[i]
		if placement == nil && free(p) {
			chosen = &p
			break
		}
		if placement != nil && p == *placement {
			if !free(p) {
				return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
			}
			chosen = &p
			break
		}
	}
	if chosen == nil {
		if placement != nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	used := map[uint32]bool{}
	for _, gi := range existing {
		used[gi.Info.Id] = true
	}
	if id == 0 {
		for candidate := uint32(firstGpuInstanceID); candidate <= lastGpuInstanceID && id == 0; candidate++ {
			if !used[candidate] {
				id = candidate
			}
		}
		if id == 0 {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
	} else if id > lastGpuInstanceID || used[id] {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	created, ret := gpu.CreateGpuInstanceWithPlacement(&profile.info, chosen)
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	gi := created.(*server.GpuInstance)
	gi.Info.Id = id
	return gi, nvml.SUCCESS
}

// createComputeInstance adds a compute instance of profile profileID to gi; id 0xFFFFFFFF asks for
// the lowest free compute instance ID.
func createComputeInstance(gi *server.GpuInstance, profileID uint32, id uint32) (*server.ComputeInstance, nvml.Return) {
	index, profile, ok := computeInstanceProfile(gi, profileID)
	if !ok {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	existing := computeInstances(gi)
	free := func(p nvml.ComputeInstancePlacement) bool {
		for _, ci := range existing {
			if overlaps(p.Start, p.Size, ci.Info.Placement.Start, ci.Info.Placement.Size) {
				return false
			}
		}
		return true
	}
	giProfile, _ := gpuInstanceProfile(gi.Info.Device.(*server.Device), gi.Info.ProfileId)
	possible := gi.MIGProfiles.ComputeInstancePlacements[int(gi.Info.ProfileId)][index]
	if len(possible) == 0 { // some mocks list none: every aligned offset within the GPU instance
		for start := uint32(0); start+profile.SliceCount <= giProfile.info.SliceCount; start += profile.SliceCount {
			possible = append(possible, nvml.ComputeInstancePlacement{Start: start, Size: profile.SliceCount})
		}
	}
	var chosen *nvml.ComputeInstancePlacement
	for _, p := range possible {
		if free(p) {
			chosen = &p
			break
		}
	}
	if chosen == nil {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	used := map[uint32]bool{}
	for _, ci := range existing {
		used[ci.Info.Id] = true
	}
	if id == anyComputeInstanceID {
		for candidate := uint32(0); candidate <= lastComputeInstanceID && id == anyComputeInstanceID; candidate++ {
			if !used[candidate] {
				id = candidate
			}
		}
		if id == anyComputeInstanceID {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
	} else if id > lastComputeInstanceID || used[id] {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	created, ret := gi.CreateComputeInstance(&profile)
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	ci := created.(*server.ComputeInstance)
	ci.Info.Id = id
	ci.Info.Placement = *chosen
	return ci, nvml.SUCCESS
}

const anyComputeInstanceID = ^uint32(0)

func destroyGpuInstance(gi *server.GpuInstance) nvml.Return {
	if len(gi.ComputeInstances) > 0 {
		return nvml.ERROR_IN_USE
	}
	return gi.Destroy()
}
