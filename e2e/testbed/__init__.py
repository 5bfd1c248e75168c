"""The local test bed: real Kubernetes control-plane binaries and an emulated kubelet."""
