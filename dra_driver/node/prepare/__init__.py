"""Kubelet call -> prepare -> CDI: a claim's devices checked, configured, recorded and written as CDI
specs and device metadata for the container runtime."""
