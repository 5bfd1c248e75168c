"""The local test bed: the real control plane on loopback, simulated nodes with the kubelet peer, the
real node (kubelet, containerd), the kind node image and the bed's own dockerd."""

import os

# The bed starts its daemons with a preexec_fn (die_with_parent), so subprocess forks rather than
# vforks, and fork runs gRPC's fork handlers. With a channel of the tests' own in use those can wait
# forever, holding the GIL: a test hung there in a cold make test, past every timeout. The children
# exec at once and use no gRPC state, so the handlers have nothing to protect. gRPC reads this once,
# when it loads: this package is imported before anything of the bed's loads gRPC.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
