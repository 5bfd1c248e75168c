"""dra-driver: a Kubernetes DRA driver for NVIDIA GPUs."""

__version__ = "0.1.0"

DEFAULT_DRIVER_NAME = "gpu.dra-driver.io"
"""Driver name, attribute domain and opaque-config driver; a DNS subdomain the project owns."""

CONFIG_API_GROUP = "gpu.dra-driver.io"
CONFIG_API_VERSION = f"{CONFIG_API_GROUP}/v1alpha1"
