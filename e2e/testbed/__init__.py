"""The local test bed: the real control plane on loopback, simulated nodes with the kubelet peer, the
real node (kubelet, containerd), the kind node image and the bed's own dockerd."""
