// Command mock-nvml builds libnvidia-ml.so.1 for machines without NVIDIA GPUs: every exported NVML
// function is served by one of the mock DGX servers NVIDIA ships in github.com/NVIDIA/go-nvml
// (pkg/nvml/mock), so the node plugin's real pynvml path runs unchanged on a CPU-only machine.
//
// Every machine reports driver 570.172.08 (NVML 12.570.172.08, CUDA 12.8), whatever go-nvml's
// mock of it says: see installedDriverVersion in machine.go.
//
// Environment, read at the nvmlInit that starts a session (reference count 0 → 1):
//
//	DRA_MOCK_NVML_MACHINE  dgxh100 (default), dgxa100, dgxh200 or dgxb200.
//	DRA_MOCK_NVML_STATE    a JSON file holding the MIG state (MIG mode, GPU and compute instances)
//	                       and the UUIDs: read at nvmlInit when present, written (atomically) at
//	                       nvmlInit and after every MIG change. It makes MIG instances outlive the
//	                       process, as they outlive it on a real GPU, lets a test seed static MIG,
//	                       and shows a test what the mock holds.
//	DRA_MOCK_NVML_FAIL     NAME=CODE[,NAME=CODE...]: the NVML function NAME returns CODE (an
//	                       nvmlReturn_t value) on every call, to test how callers handle errors.
//
// A problem with these variables fails nvmlInit with NVML_ERROR_UNKNOWN and a line on stderr that
// names it. Everything the mock does not model (the SM count of a full GPU, health events) answers
// as a real driver answers when it has nothing to say: NOT_SUPPORTED, or a wait that times out.
package main

func main() {}
