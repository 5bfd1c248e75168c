"""The names of the Go tool sets (:data:`e2e.tooling.gotools.TOOLS`) that the bed's parts build.

The bed's modules build their tools by these names (``gotools.ensure([name])``), and ``make test``'s
prefetch (:mod:`e2e.tooling.prefetch`) warms the same sets ahead of the stages that ask for them.
The tooling sits below the bed, so the names live here, where both read them, rather than in the
bed's modules.
"""

from __future__ import annotations

CDI_VALIDATE_TOOL = "cdi-validate"
"""The reference CDI validator (``e2e/testbed/cdicheck.py``)."""
MOCK_NVML_TOOL = "mock-nvml"
"""NVML on CPU-only machines (``e2e/testbed/mocknvml.py``)."""
FAKE_DRIVER_TOOL = "nvidia-container-toolkit"
"""The NVIDIA Container Toolkit the fake driver root is checked with (``e2e/testbed/fakedriver.py``)."""
KWOK_TOOL = "kwok"
"""The scale smoke's simulated nodes (``e2e/testbed/kwok.py``)."""

# The kind node image, assembled offline (``e2e/testbed/kindnode.py``).
KIND_TOOL = "kind"
KIND_NODE_TOOLS = ("kubernetes-node",)
"""kubeadm and kube-proxy, at the bed's Kubernetes version in their own pins."""
KIND_ETCD_TOOL = "etcd-kind"
CRICTL_TOOL = "cri-tools"
COREDNS_TOOL = "coredns"
KINDNET_TOOL = "kindnet"
LOCAL_PATH_TOOL = "local-path-provisioner"
