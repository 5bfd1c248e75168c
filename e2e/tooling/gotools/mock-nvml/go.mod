// Pinned build of github.com/NVIDIA/go-nvml; regenerate with: python -m e2e.testbed.gotools pin mock-nvml@<version>
module dra-driver.local/gotools/mock-nvml

go 1.24

require (
	github.com/NVIDIA/go-nvml v0.13.4-1
	github.com/google/uuid v1.6.0
)
