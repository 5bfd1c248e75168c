"""The node plugin's places on the node, by default: where it writes, what its files are called, and
where it answers. The plugin writes them and ``dra-driver debug-bundle`` reads them back, so both take
the names from here rather than typing them twice."""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

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
SERIALIZE_LOCK_FILE = "serialize.lock"
"""In the state directory: held (flock) by whichever plugin instance prepares or unprepares."""
PUBLISHER_LOCK_FILE = "publisher.lock"
"""In the state directory: held (flock) by the one plugin instance that publishes the node's slices."""
MAX_SOCKET_PATH = 107
"""The longest Unix socket path: ``sun_path`` is 108 bytes, and gRPC's C core wants its NUL in them
(Go's net package allows 108, so at exactly 108 bytes the Go helper keeps a name that we shorten)."""


@dataclass(frozen=True)
class SocketPaths:
    registration: Path
    dra: Path


def _digest(text: str, length: int) -> str:
    """The first ``length`` bytes of SHA-256 of ``text``, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()[:length]).decode().rstrip("=")


def _first_short(directory: Path, names: list[str]) -> Path:
    """The first name that makes a socket path short enough; the last one otherwise (its listen fails
    naming the path)."""
    for name in names:
        if len(os.fsencode(directory / name)) <= MAX_SOCKET_PATH:
            return directory / name
    return directory / names[-1]


def socket_paths(driver: str, registry_dir: Path, plugin_data_dir: Path, pod_uid: str | None) -> SocketPaths:
    """The plugin's two sockets. One instance per node (``pod_uid`` None): ``<driver>-reg.sock`` and
    ``dra.sock``. With rolling updates every pod has its own pair, named as the Go kubeletplugin helper
    names them, so that two instances of one driver never share (or delete) a socket: the
    registration socket is the first of ``<driver>-<pod UID>-reg.sock``,
    ``<driver>-<hash of the UID>-reg.sock`` and ``dra-<hash of driver and UID>-reg.sock`` whose path
    fits, the DRA socket ``dra-<pod UID>.sock`` (or ``dra-<hash of the UID>.sock``)."""
    if pod_uid is None:
        return SocketPaths(registry_dir / f"{driver}-reg.sock", plugin_data_dir / "dra.sock")
    registration = _first_short(registry_dir, [
        f"{driver}-{pod_uid}-reg.sock",
        f"{driver}-{_digest(pod_uid, 8)}-reg.sock",
        f"dra-{_digest(driver + chr(0) + pod_uid, 16)}-reg.sock",
    ])
    dra = _first_short(plugin_data_dir, [f"dra-{pod_uid}.sock", f"dra-{_digest(pod_uid, 8)}.sock"])
    return SocketPaths(registration, dra)
