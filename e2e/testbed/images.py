"""OCI image archives for the real node, written by Python: no registry, no Docker.

Two images, both from Debian's ``busybox-static`` (``/bin/busybox``, statically linked):

* ``registry.k8s.io/pause:3.10``: the sandbox image containerd is configured with. Its entrypoint
  is a shell that sleeps until SIGTERM (busybox has no ``pause``, and a PID 1 without a handler
  would ignore SIGTERM).
* ``docker.io/library/busybox:1.36``: what ``deploy/examples`` run (``image: busybox:1.36``).

Each archive is an OCI image layout in a tar (``oci-layout``, ``index.json``, ``blobs/sha256/``)
with one uncompressed layer, and imports with ``ctr -n k8s.io images import``. The pods'
``imagePullPolicy`` defaults to ``IfNotPresent`` for a tagged image, so the kubelet never pulls.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.tooling import prereqs

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
BUSYBOX_IMAGE = "docker.io/library/busybox:1.36"
_EPOCH = 0


@dataclass(frozen=True)
class ImageSpec:
    name: str
    entrypoint: list[str]
    cmd: list[str]


IMAGES = (
    ImageSpec(PAUSE_IMAGE, ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"], []),
    ImageSpec(BUSYBOX_IMAGE, [], ["sh"]),
)


def _applets(busybox: Path) -> list[str]:
    out = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True).stdout
    return sorted({a.strip() for a in out.splitlines() if a.strip() and "/" not in a and a.strip() != "busybox"})


def _info(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.linkname = link
    info.mtime = _EPOCH
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def rootfs_layer(busybox: Path) -> bytes:
    """An uncompressed layer: /bin/busybox, one symlink per applet, and the usual empty dirs."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "dev", "etc", "proc", "sys", "tmp", "var", "root"):
            tar.addfile(_info(d, tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755))
        data = busybox.read_bytes()
        tar.addfile(_info("bin/busybox", tarfile.REGTYPE, 0o755, len(data)), io.BytesIO(data))
        for applet in _applets(busybox):
            tar.addfile(_info(f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox"))
        for name, text in (("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"), ("etc/group", "root:x:0:\n")):
            raw = text.encode()
            tar.addfile(_info(name, tarfile.REGTYPE, 0o644, len(raw)), io.BytesIO(raw))
    return buf.getvalue()


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def oci_archive(spec: ImageSpec, layer: bytes, out: Path) -> Path:
    """Write ``spec`` as an OCI image-layout tar at ``out``."""
    layer_digest, _ = _blob(layer)
    config = {
        "architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                   "Entrypoint": spec.entrypoint or None, "Cmd": spec.cmd or None, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "dra-driver e2e/testbed/images.py"}],
    }
    config_digest, config_raw = _blob(_json(config))
    manifest = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                   "size": len(config_raw)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest,
                    "size": len(layer)}],
    }
    manifest_digest, manifest_raw = _blob(_json(manifest))
    tag = spec.name.rsplit(":", 1)[1]
    index = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
            "size": len(manifest_raw), "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": spec.name, "org.opencontainers.image.ref.name": tag},
        }],
    }
    files = {
        "oci-layout": _json({"imageLayoutVersion": "1.0.0"}),
        "index.json": _json(index),
        f"blobs/sha256/{layer_digest.split(':')[1]}": layer,
        f"blobs/sha256/{config_digest.split(':')[1]}": config_raw,
        f"blobs/sha256/{manifest_digest.split(':')[1]}": manifest_raw,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w") as tar:
        for d in ("blobs", "blobs/sha256"):
            tar.addfile(_info(d, tarfile.DIRTYPE, 0o755))
        for name, data in files.items():
            tar.addfile(_info(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
    return out


def build_all(out_dir: Path) -> dict[str, Path]:
    """Both archives under ``out_dir``; returns image name -> archive path."""
    layer = rootfs_layer(prereqs.find_busybox())
    result = {}
    for spec in IMAGES:
        fname = spec.name.replace("/", "_").replace(":", "_") + ".oci.tar"
        result[spec.name] = oci_archive(spec, layer, out_dir / fname)
    return result
