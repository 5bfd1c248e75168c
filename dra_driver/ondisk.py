"""The node plugin's places on the node, by default: where it writes, what its files are called, and
where it answers. The plugin writes them and ``dra-driver debug-bundle`` reads them back, so both take
the names from here rather than typing them twice."""

from __future__ import annotations

KUBELET_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
"""Where the kubelet looks for plugin registration sockets."""
KUBELET_PLUGINS_DIR = "/var/lib/kubelet/plugins"
"""``<dir>/<driver>`` holds the plugin's DRA socket and, unless told otherwise, its state."""
CDI_ROOT = "/var/run/cdi"
"""Where the container runtime reads CDI specs."""
CHECKPOINT_FILE = "checkpoint.json"
"""In the state directory; a quarantined copy keeps this name with ``.corrupt-<time>`` added."""
METADATA_SUBDIR = "device-metadata"
"""In the state directory: the device metadata files mounted into containers."""
HEALTH_PORT = 8081
"""The chart's port for the plugin's ``/healthz`` and ``/metrics`` (``kubeletPlugin.healthPort``); the
plugin itself serves none unless given ``--health-port``."""


def claim_spec_prefix(driver: str) -> str:
    """A claim's CDI spec in the CDI root is ``<prefix><claim UID>.json``."""
    return f"k8s.{driver}-claim_"


def metadata_spec_prefix(driver: str) -> str:
    """The CDI spec that mounts a request's device metadata is ``<prefix><claim UID>_<request>.json``."""
    return f"{driver}_metadata_"
