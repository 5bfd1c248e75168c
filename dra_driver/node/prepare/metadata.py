"""Device metadata for containers (KEP-5304: ``metadata.resource.k8s.io/v1beta1``, beta in Kubernetes 1.37).

Each request of a prepared claim gets one file that describes its devices, bind-mounted read-only
into every container that gets the request's devices, at

* ``/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json``
  for a claim the pod names, or
* ``.../resourceclaimtemplates/<pod claim name>/<request>/<driver>-metadata.json`` for a claim made
  from a template (it has the ``resource.kubernetes.io/pod-claim-name`` annotation): a pod spec
  cannot know the generated claim name, only its own name for the claim.

``<request>`` is the request's name without a subrequest. The file is a JSON stream of one
``DeviceMetadata`` object encoded as v1beta1 and then as v1alpha1 (for readers built against
1.36), each indented by two spaces and followed by a newline: byte for byte what the Go helper
(``k8s.io/dynamic-resource-allocation/kubeletplugin`` v0.37) writes, so its decoder reads ours.
Each device has its driver, pool, name and the attributes our ResourceSlice publishes, plus the
``uuid`` of the MIG instance made for a dynamic-MIG partition (a slice cannot know it).

On the host:

* the file is ``<state dir>/device-metadata/<claim UID>_<request>.json``: 0644, because any user in
  the container reads it through the mount, in a 0700 directory, because only the container
  runtime opens the mount's source;
* its CDI spec is ``<cdi root>/<driver>_metadata_<claim UID>_<request>.json`` (kind
  ``<driver>/metadata``, device ``<claim UID>_<request>``, one read-only bind mount). Its ID is
  added to the CDI IDs of the request's first device in the NodePrepareResources answer.

The checkpoint records which claims have metadata: their devices carry those IDs. The files are
written again for exactly the IDs that were handed out (after a reboot, or when a spec is missing),
whatever ``--no-device-metadata`` says now, and removed for every claim that is unprepared or
rolled back. Every name that ends up in a path is validated first.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

import orjson

from dra_driver import apiprofile
from dra_driver.gpuconfig import base_request
from dra_driver.k8s.bodies import RawClaim
from dra_driver.k8s.names import is_dns_label
from dra_driver.k8s.objects import as_mapping, meta
from dra_driver.node.describe.devices import AllocatableDevice, device_attributes
from dra_driver.node.fileio import atomic_write, ensure_dir, holds, remove_stale_temp_files
from dra_driver.node.prepare.calls import (
    UUID_PATTERN,
    MetadataError,
    validate_claim_name,
    validate_claim_uid,
    validate_driver_name,
    validate_request_name,
)
from dra_driver.node.prepare.cdispec import DERIVED_FILES_DURABLE, DIR_MODE, SPEC_MODE, minimum_cdi_version, spec_bytes
from dra_driver.node.prepare.entries import PreparedDevice
from dra_driver.ondisk import METADATA_SUBDIR as HOST_SUBDIR
from dra_driver.ondisk import metadata_spec_prefix

GROUP = "metadata.resource.k8s.io"
API_VERSIONS = (f"{GROUP}/v1beta1", f"{GROUP}/v1alpha1")
"""Newest first: a reader takes the first object of the stream whose apiVersion it knows."""
KIND = "DeviceMetadata"
CONTAINER_DIR = PurePosixPath("/var/run/kubernetes.io/dra-device-attributes")
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
FILE_MODE = 0o644
HOST_DIR_MODE = 0o700

_HOST_FILE = re.compile(rf"^(?P<uid>{UUID_PATTERN})_[a-z0-9-]+\.json$")
# Go's encoder escapes these inside strings; so must we, for the same bytes.
_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


@dataclass(frozen=True)
class MetadataClaim:
    """What a metadata file says about its claim, and where it is mounted."""

    uid: str
    namespace: str
    name: str
    pod_claim_name: str | None = None


def pod_claim_name(claim: RawClaim) -> str | None:
    """The pod's own name for a claim made from a template (the annotation kube-controller-manager
    sets); None for a claim the pod names directly. ``claim`` is verified (its metadata is an object:
    :func:`~dra_driver.node.prepare.plan.verify_claim` matched its UID)."""
    value = as_mapping(meta(claim).get("annotations")).get(POD_CLAIM_NAME_ANNOTATION)
    if value is None or value == "":
        return None
    if not is_dns_label(value):
        raise MetadataError(f"annotation {POD_CLAIM_NAME_ANNOTATION}={value!r} is not a DNS label")
    return value


# --- names ------------------------------------------------------------------------------------


def container_path(driver: str, claim: MetadataClaim, request: str) -> str:
    file = f"{driver}-metadata.json"
    if claim.pod_claim_name:
        return str(CONTAINER_DIR / "resourceclaimtemplates" / claim.pod_claim_name / request / file)
    return str(CONTAINER_DIR / "resourceclaims" / claim.name / request / file)


def cdi_kind(driver: str) -> str:
    return f"{driver}/metadata"


def cdi_device_name(uid: str, request: str) -> str:
    return f"{uid}_{request}"


def cdi_device_id(driver: str, uid: str, request: str) -> str:
    return f"{cdi_kind(driver)}={cdi_device_name(uid, request)}"


def _base_requests(dev: PreparedDevice) -> list[str]:
    return list(dict.fromkeys(base_request(r) for r in dev.requests))


# --- decisions --------------------------------------------------------------------------------


def with_cdi_ids(driver: str, uid: str, devices: Sequence[PreparedDevice]) -> tuple[PreparedDevice, ...]:
    """``devices`` with each request's metadata CDI ID added to the request's first device (the
    kubelet gives a container the IDs of all devices of the requests it uses; once is enough)."""
    seen: set[str] = set()
    out: list[PreparedDevice] = []
    for dev in devices:
        extra = []
        for request in _base_requests(dev):
            if request not in seen:
                seen.add(request)
                extra.append(cdi_device_id(driver, uid, validate_request_name(request)))
        out.append(replace(dev, cdi_device_ids=(*dev.cdi_device_ids, *extra)) if extra else dev)
    return tuple(out)


def requests_with_metadata(driver: str, uid: str, devices: Sequence[PreparedDevice]) -> dict[str, list[PreparedDevice]]:
    """Base request name -> its devices, for each request whose metadata CDI ID was handed out."""
    handed_out = {i for d in devices for i in d.cdi_device_ids}
    out: dict[str, list[PreparedDevice]] = {}
    for dev in devices:
        for request in _base_requests(dev):
            if cdi_device_id(driver, uid, request) in handed_out:
                out.setdefault(request, []).append(dev)
    return out


def device_entry(driver: str, dev: PreparedDevice, known: AllocatableDevice | None) -> dict[str, Any]:
    """One device of a metadata file, its attributes as the driver's slices publish them (the driver
    name says whose names those are); none when the device is no longer published."""
    entry: dict[str, Any] = {"driver": driver, "pool": dev.pool, "name": dev.device}
    attributes = device_attributes(known, apiprofile.for_driver(driver)) if known is not None else {}
    if dev.mig_instance is not None:
        attributes["uuid"] = {"string": dev.mig_instance.uuid}
    if attributes:
        entry["attributes"] = dict(sorted(attributes.items()))  # Go writes map keys sorted
    return entry


def build_document(claim: MetadataClaim, requests: Sequence[tuple[str, Sequence[Mapping[str, Any]]]],
                   generation: int = 1) -> dict[str, Any]:
    """The ``DeviceMetadata`` object without its apiVersion; ``requests``: (full request name, devices).

    Keys are in the order of the Go types' fields, as Go writes them.
    """
    doc: dict[str, Any] = {
        "kind": KIND,
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid, "generation": generation},
    }
    if claim.pod_claim_name:
        doc["podClaimName"] = claim.pod_claim_name
    doc["requests"] = [{"name": name, "devices": list(devices)} if devices else {"name": name}
                       for name, devices in requests]
    return doc


def go_json(obj: Any) -> str:
    """``obj`` as Go's ``json.MarshalIndent(obj, "", "  ")`` writes it (dict order = struct field order).

    orjson, not json: an indented ``json.dumps`` takes json's pure-Python path, the costliest step of
    writing a claim's files on the prepare path; orjson's two-space indent writes the same bytes.
    """
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode().translate(_GO_ESCAPES)


def encode_stream(doc: Mapping[str, Any]) -> bytes:
    """The file's bytes: ``doc`` once per API version, newest first, each followed by a newline."""
    rest = {k: v for k, v in doc.items() if k != "kind"}
    return "".join(go_json({"kind": doc["kind"], "apiVersion": version, **rest}) + "\n" for version in API_VERSIONS).encode()


def request_documents(driver: str, claim: MetadataClaim, devices: Sequence[PreparedDevice],
                      known: Mapping[str, AllocatableDevice]) -> dict[str, dict[str, Any]]:
    """Base request name -> its metadata document, for each request whose metadata ID was handed out."""
    out: dict[str, dict[str, Any]] = {}
    for request, devs in requests_with_metadata(driver, claim.uid, devices).items():
        by_ref: dict[str, list[dict[str, Any]]] = {}
        for dev in devs:
            for ref in dict.fromkeys(dev.requests):
                if base_request(ref) == request:
                    by_ref.setdefault(ref, []).append(device_entry(driver, dev, known.get(dev.device)))
        out[request] = build_document(claim, list(by_ref.items()))
    return out


def build_cdi_spec(driver: str, uid: str, request: str, host_path: Path, in_container: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "cdiVersion": "",
        "kind": cdi_kind(driver),
        "devices": [{
            "name": cdi_device_name(uid, request),
            "containerEdits": {
                "mounts": [{"hostPath": str(host_path), "containerPath": in_container, "options": ["ro", "bind"]}],
            },
        }],
    }
    spec["cdiVersion"] = minimum_cdi_version(spec)
    return spec


# --- files ------------------------------------------------------------------------------------


class MetadataFiles:
    """Writes, checks and removes the metadata files and their CDI specs of one driver.

    ``enabled`` says whether new claims get metadata; claims that already have it are served
    either way.
    """

    def __init__(self, state_dir: Path, cdi_root: Path, driver_name: str, *, enabled: bool = True) -> None:
        self.dir = Path(os.path.abspath(state_dir)) / HOST_SUBDIR
        self.cdi_root = Path(cdi_root)
        self.driver_name = validate_driver_name(driver_name)
        self.enabled = enabled
        self._spec_prefix = metadata_spec_prefix(driver_name)

    def host_path(self, uid: str, request: str) -> Path:
        return self.dir / f"{validate_claim_uid(uid)}_{validate_request_name(request)}.json"

    def spec_path(self, uid: str, request: str) -> Path:
        return self.cdi_root / f"{self._spec_prefix}{validate_claim_uid(uid)}_{validate_request_name(request)}.json"

    def with_cdi_ids(self, uid: str, devices: Sequence[PreparedDevice]) -> tuple[PreparedDevice, ...]:
        """The devices of a claim being prepared, with metadata IDs when new claims get metadata."""
        return with_cdi_ids(self.driver_name, validate_claim_uid(uid), devices) if self.enabled else tuple(devices)

    def write(self, claim: MetadataClaim, devices: Sequence[PreparedDevice],
              known: Mapping[str, AllocatableDevice]) -> list[str]:
        """Write (or replace) the file, then the CDI spec, of every request whose metadata ID the devices
        carry. Returns the devices no longer published (listed without attributes).

        Raises MetadataError/CdiError for names that cannot make a path, OSError for write failures.
        """
        validate_claim_uid(claim.uid)
        documents = request_documents(self.driver_name, claim, devices, known)
        if not documents:
            return []
        validate_claim_name(claim.name)
        ensure_dir(self.dir, HOST_DIR_MODE)
        ensure_dir(self.cdi_root, DIR_MODE)
        for request, doc in documents.items():
            host = self.host_path(claim.uid, request)
            data = encode_stream(doc)
            if not holds(host, data, FILE_MODE):
                atomic_write(host, data, FILE_MODE, durable=DERIVED_FILES_DURABLE)
            spec = spec_bytes(build_cdi_spec(self.driver_name, claim.uid, request, host,
                                             container_path(self.driver_name, claim, request)))
            if not holds(self.spec_path(claim.uid, request), spec, SPEC_MODE):
                atomic_write(self.spec_path(claim.uid, request), spec, SPEC_MODE, durable=DERIVED_FILES_DURABLE)
        described = requests_with_metadata(self.driver_name, claim.uid, devices).values()
        return sorted({d.device for devs in described for d in devs if d.device not in known})

    def current(self, claim: MetadataClaim, devices: Sequence[PreparedDevice],
                known: Mapping[str, AllocatableDevice]) -> bool:
        """Whether every file and spec of the claim holds exactly what :meth:`write` writes now."""
        for request, doc in request_documents(self.driver_name, claim, devices, known).items():
            host = self.host_path(claim.uid, request)
            spec = build_cdi_spec(self.driver_name, claim.uid, request, host,
                                  container_path(self.driver_name, claim, request))
            if not (holds(host, encode_stream(doc)) and holds(self.spec_path(claim.uid, request), spec_bytes(spec))):
                return False
        return True

    def complete(self, uid: str, devices: Sequence[PreparedDevice]) -> bool:
        """Whether every file and spec that the devices' metadata IDs need exists."""
        for request in requests_with_metadata(self.driver_name, uid, devices):
            if not (self.host_path(uid, request).is_file() and self.spec_path(uid, request).is_file()):
                return False
        return True

    def remove(self, uid: str) -> list[str]:
        """Delete the claim's CDI specs, then its files; returns the names deleted."""
        validate_claim_uid(uid)
        removed: list[str] = []
        for directory, prefix in ((self.cdi_root, f"{self._spec_prefix}{uid}_"), (self.dir, f"{uid}_")):
            try:
                names = sorted(os.listdir(directory))
            except FileNotFoundError:
                continue
            for name in names:
                if name.startswith(prefix) and name.endswith(".json"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(directory / name)
                        removed.append(name)
        return removed

    def remove_handed_out(self, uid: str, devices: Sequence[PreparedDevice]) -> list[str]:
        """Delete the specs, then the files, that the devices' metadata IDs name (a prepared claim's:
        exactly what :meth:`write` wrote, found without listing the directories); the names deleted."""
        removed: list[str] = []
        for request in requests_with_metadata(self.driver_name, validate_claim_uid(uid), devices):
            for path in (self.spec_path(uid, request), self.host_path(uid, request)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    removed.append(path.name)
        return removed

    def claims(self) -> set[str]:
        """Claim UIDs that have a metadata file or spec of this driver."""
        spec = re.compile(rf"^{re.escape(self._spec_prefix)}(?P<uid>{UUID_PATTERN})_[a-z0-9-]+\.json$")
        uids: set[str] = set()
        for directory, pattern in ((self.cdi_root, spec), (self.dir, _HOST_FILE)):
            try:
                names = os.listdir(directory)
            except FileNotFoundError:
                continue
            uids.update(m["uid"] for m in map(pattern.match, names) if m)
        return uids

    def remove_stale_temp_files(self) -> list[str]:
        """Delete temporary files of writes interrupted by a crash (start-up only)."""
        return (remove_stale_temp_files(self.cdi_root, lambda name: name.startswith(f".{self._spec_prefix}"))
                + remove_stale_temp_files(self.dir, lambda name: bool(_HOST_FILE.match(name[1:].split(".tmp-")[0]))))
