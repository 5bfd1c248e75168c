package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The DRA_MOCK_NVML_STATE file. UUIDs and profile names are written for people and tests to read;
// loading ignores them (they follow from the machine and the IDs).
type stateFile struct {
	Machine string     `json:"machine"`
	GPUs    []gpuState `json:"gpus"`
}

type gpuState struct {
	Index        int       `json:"index"`
	UUID         string    `json:"uuid,omitempty"`
	MigMode      int       `json:"migMode"`
	GpuInstances []giState `json:"gpuInstances"`
	// NVML_COMPUTEMODE_* now, and every mode nvmlDeviceSetComputeMode set, in order.
	ComputeMode        int   `json:"computeMode"`
	ComputeModeChanges []int `json:"computeModeChanges"`
}

type giState struct {
	ID               uint32    `json:"id"`
	ProfileID        uint32    `json:"profileId"`
	Profile          string    `json:"profile,omitempty"`
	Placement        placement `json:"placement"`
	ComputeInstances []ciState `json:"computeInstances"`
}

type placement struct {
	Start uint32 `json:"start"`
	Size  uint32 `json:"size"`
}

type ciState struct {
	ID        uint32 `json:"id"`
	ProfileID uint32 `json:"profileId"`
	UUID      string `json:"uuid,omitempty"`
}

// openMachine builds the machine and restores the MIG state kept in statePath, if any.
func openMachine(name, statePath string) (*Machine, error) {
	if name == "" {
		name = defaultMachine
	}
	m, err := newMachine(name)
	if err != nil {
		return nil, err
	}
	m.StatePath = statePath
	if statePath == "" {
		return m, nil
	}
	data, err := os.ReadFile(statePath)
	if errors.Is(err, fs.ErrNotExist) {
		return m, m.save()
	}
	if err != nil {
		return nil, fmt.Errorf("DRA_MOCK_NVML_STATE: %w", err)
	}
	if err := m.restore(data); err != nil {
		return nil, fmt.Errorf("DRA_MOCK_NVML_STATE %s: %w", statePath, err)
	}
	return m, m.save()
}

func (m *Machine) restore(data []byte) error {
	var state stateFile
	decoder := json.NewDecoder(bytes.NewReader(data))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&state); err != nil {
		return err
	}
	if state.Machine != m.Name {
		return fmt.Errorf("holds machine %q, but DRA_MOCK_NVML_MACHINE asks for %q", state.Machine, m.Name)
	}
	for _, g := range state.GPUs {
		if g.Index < 0 || g.Index >= len(m.GPUs) {
			return fmt.Errorf("gpus: index %d is not a GPU of %s (it has %d)", g.Index, m.Name, len(m.GPUs))
		}
		gpu := m.GPUs[g.Index]
		m.Modes[g.Index] = computeMode{Current: g.ComputeMode, Changes: append([]int{}, g.ComputeModeChanges...)}
		if ret := setMigMode(gpu, g.MigMode); ret != nvml.SUCCESS {
			return fmt.Errorf("GPU %d: migMode %d: %s", g.Index, g.MigMode, returnText(ret))
		}
		for _, s := range g.GpuInstances {
			where := fmt.Sprintf("GPU %d: GPU instance %d (profile %d at %d+%d)", g.Index, s.ID, s.ProfileID,
				s.Placement.Start, s.Placement.Size)
			if s.ID == 0 {
				return fmt.Errorf("%s: GPU instance IDs start at %d", where, firstGpuInstanceID)
			}
			gi, ret := createGpuInstance(gpu, s.ProfileID, &nvml.GpuInstancePlacement{Start: s.Placement.Start,
				Size: s.Placement.Size}, s.ID)
			if ret != nvml.SUCCESS {
				return fmt.Errorf("%s: %s", where, returnText(ret))
			}
			for _, c := range s.ComputeInstances {
				if _, ret := createComputeInstance(gi, c.ProfileID, c.ID); ret != nvml.SUCCESS {
					return fmt.Errorf("%s: compute instance %d (profile %d): %s", where, c.ID, c.ProfileID, returnText(ret))
				}
			}
		}
	}
	return nil
}

func (m *Machine) snapshot() stateFile {
	state := stateFile{Machine: m.Name, GPUs: []gpuState{}}
	for i, gpu := range m.GPUs {
		g := gpuState{Index: i, UUID: gpu.UUID, MigMode: gpu.MigMode, GpuInstances: []giState{},
			ComputeMode: m.Modes[i].Current, ComputeModeChanges: append([]int{}, m.Modes[i].Changes...)}
		for _, gi := range gpuInstances(gpu) {
			profile, _ := gpuInstanceProfile(gpu, gi.Info.ProfileId)
			s := giState{ID: gi.Info.Id, ProfileID: gi.Info.ProfileId, Profile: gpuInstanceProfileName(profile),
				Placement: placement{gi.Info.Placement.Start, gi.Info.Placement.Size}, ComputeInstances: []ciState{}}
			for _, ci := range computeInstances(gi) {
				s.ComputeInstances = append(s.ComputeInstances, ciState{ID: ci.Info.Id, ProfileID: ci.Info.ProfileId,
					UUID: migUUID(MigDevice{gpu, gi, ci})})
			}
			g.GpuInstances = append(g.GpuInstances, s)
		}
		state.GPUs = append(state.GPUs, g)
	}
	return state
}

// save writes the state file crash-safely (temporary file, fsync, rename, fsync of the folder).
func (m *Machine) save() error {
	if m.StatePath == "" {
		return nil
	}
	data, err := json.MarshalIndent(m.snapshot(), "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(m.StatePath)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(m.StatePath)+".*")
	if err != nil {
		return fmt.Errorf("DRA_MOCK_NVML_STATE: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("DRA_MOCK_NVML_STATE: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("DRA_MOCK_NVML_STATE: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("DRA_MOCK_NVML_STATE: %w", err)
	}
	if err := os.Rename(tmp.Name(), m.StatePath); err != nil {
		return fmt.Errorf("DRA_MOCK_NVML_STATE: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

func returnText(ret nvml.Return) string {
	return fmt.Sprintf("%s (NVML error %d)", ret.Error(), int32(ret))
}
