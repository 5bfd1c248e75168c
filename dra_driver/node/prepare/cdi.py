"""CDI specs: one transient spec file per prepared claim.

* file: ``<cdi_root>/k8s.<driver>-claim_<claimUID>.json`` (mode 0644, written atomically)
* kind: ``k8s.<driver>/claim``
* device names: ``<claimUID>-<deviceName>``, ``<claimUID>-<deviceName>-<shareID>`` for a consumable
  share; fully-qualified ID ``k8s.<driver>/claim=<name>``
* ``cdiVersion``: the lowest version the content needs (0.5.0 once ``hostPath`` is used or a device
  name starts with a digit, else 0.3.0)

The container edits come from :mod:`dra_driver.node.prepare.edits` (what each device and the claim
get); with the NVML backend the driver's own edits from the NVIDIA Container Toolkit (libraries,
binaries, firmware, hooks: :mod:`dra_driver.node.prepare.toolkit`) join the claim-level edits.

Every name that ends up in a path is validated first (claim UID, driver name).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dra_driver import apiprofile
from dra_driver.node.fileio import atomic_write, ensure_dir, holds, remove_stale_temp_files
from dra_driver.node.metrics import METRICS
from dra_driver.node.prepare.calls import (
    CdiError,
    is_uuid,
    validate_claim_uid,
    validate_device_name,
    validate_driver_name,
    validate_share_id,
)
from dra_driver.node.prepare.cdispec import DERIVED_FILES_DURABLE, DIR_MODE, SPEC_MODE, minimum_cdi_version, spec_bytes
from dra_driver.node.prepare.edits import ClaimDevice, claim_edits
from dra_driver.node.prepare.mps import container_edits
from dra_driver.node.prepare.toolkit import merge_edits
from dra_driver.ondisk import claim_spec_prefix

_SPEC_FILE = re.compile(r"k8s\.(?P<driver>.+)-claim_(?P<uid>[0-9a-f-]{36})\.json")


class CdiSpecs:
    """Writes, deletes and lists the per-claim CDI specs of one driver in one directory."""

    def __init__(self, cdi_root: Path, driver_name: str, dev_root: Path = Path("/"),
                 *, node_name: str = "", driver_edits: Callable[[], dict[str, Any]] | None = None,
                 mps_state_dir: Path | None = None) -> None:
        self.cdi_root = Path(cdi_root)
        self.driver_name = validate_driver_name(driver_name)
        self.kind = apiprofile.for_driver(driver_name).cdi_kind(driver_name)
        self.dev_root = Path(dev_root)
        self.node_name = node_name
        self._host_dev = self.dev_root / "dev" if self.dev_root.resolve() != Path("/") else None
        # The driver's libraries, binaries and hooks (dra_driver.node.prepare.toolkit); raises when the driver
        # is missing, so that no spec starts a container without it.
        self._driver_edits = driver_edits
        self.mps_state_dir = mps_state_dir
        """Set when the plugin runs MPS control daemons there: MPS claims' containers get their directories."""

    # names
    def cdi_device_name(self, claim_uid: str, device_name: str, share_id: str | None = None) -> str:
        """``<claimUID>-<device>``, and ``-<shareID>`` for a share: a claim may hold two shares of one
        device (two requests), and each is its own CDI device."""
        name = f"{validate_claim_uid(claim_uid)}-{validate_device_name(device_name)}"
        return f"{name}-{validate_share_id(share_id)}" if share_id else name

    def cdi_device_id(self, claim_uid: str, device_name: str, share_id: str | None = None) -> str:
        return f"{self.kind}={self.cdi_device_name(claim_uid, device_name, share_id)}"

    def spec_path(self, claim_uid: str) -> Path:
        return self.cdi_root / f"{claim_spec_prefix(self.driver_name)}{validate_claim_uid(claim_uid)}.json"

    def require_driver(self) -> None:
        """Raise DriverEditsError, naming what is missing, when the driver's edits cannot be had."""
        if self._driver_edits is not None:
            self._driver_edits()

    # content
    def build_spec(self, claim_uid: str, namespace: str, name: str, devices: Sequence[ClaimDevice]) -> dict[str, Any]:
        validate_claim_uid(claim_uid)
        if not devices:
            raise CdiError("a CDI spec needs at least one device")
        for value in (namespace, name):
            if "\x00" in value or "\n" in value:
                raise CdiError(f"invalid claim reference {namespace!r}/{name!r}")
        edits = claim_edits(claim_uid, f"{namespace}/{name}", self.driver_name, self.node_name, devices, self._host_dev)
        spec: dict[str, Any] = {
            "cdiVersion": "",
            "kind": self.kind,
            "devices": [{"name": self.cdi_device_name(claim_uid, d.device.device_name, d.device.share_id),
                         "containerEdits": d.edits} for d in edits.devices],
            "containerEdits": edits.common,
        }
        if self.mps_state_dir is not None:
            # On the MPS devices only: a container of another request of the claim is no MPS client.
            daemons = container_edits(self.mps_state_dir, [d.mps_gpu for d in devices if d.mps_gpu])
            for entry, device in zip(edits.devices, spec["devices"], strict=True):
                if entry.device.mps_gpu:
                    device["containerEdits"] = merge_edits(device["containerEdits"], daemons)
        if self._driver_edits is not None:
            spec["containerEdits"] = merge_edits(spec["containerEdits"], self._driver_edits())
        spec["cdiVersion"] = minimum_cdi_version(spec)
        return spec

    # files
    def write_claim_spec(self, claim_uid: str, namespace: str, name: str,
                         devices: Sequence[ClaimDevice]) -> list[str]:
        """Write (or replace) the claim's spec; returns the fully-qualified CDI device IDs.

        Raises CdiError for invalid input and OSError (ENOSPC, ...) for write failures.
        """
        spec = self.build_spec(claim_uid, namespace, name, devices)
        data = spec_bytes(spec)
        try:
            ensure_dir(self.cdi_root, DIR_MODE)
            path = self.spec_path(claim_uid)
            if not holds(path, data, SPEC_MODE):
                atomic_write(path, data, SPEC_MODE, durable=DERIVED_FILES_DURABLE)
        except OSError:
            METRICS.cdi_spec_writes.labels(result="error").inc()
            raise
        METRICS.cdi_spec_writes.labels(result="success").inc()
        return list(dict.fromkeys(self.cdi_device_id(claim_uid, d.device_name, d.share_id) for d in devices))

    def spec_is_current(self, claim_uid: str, namespace: str, name: str, devices: Sequence[ClaimDevice]) -> bool:
        """Whether the claim's spec holds exactly what :meth:`write_claim_spec` writes now."""
        return holds(self.spec_path(claim_uid), spec_bytes(self.build_spec(claim_uid, namespace, name, devices)))

    def spec_exists(self, claim_uid: str) -> bool:
        return self.spec_path(claim_uid).is_file()

    def delete_claim_spec(self, claim_uid: str) -> bool:
        """Remove the claim's spec; False when there was none."""
        try:
            os.unlink(self.spec_path(claim_uid))
        except FileNotFoundError:
            return False
        return True

    def remove_stale_temp_files(self) -> list[str]:
        """Delete temporary spec files of writes interrupted by a crash (only this driver's names)."""
        # atomic_write names them ".<spec file name>.tmp-<random>".
        prefix = f".{claim_spec_prefix(self.driver_name)}"
        return remove_stale_temp_files(self.cdi_root, lambda name: name.startswith(prefix))

    def list_claim_specs(self) -> list[str]:
        """Claim UIDs that have a spec of this driver in the directory."""
        try:
            names = os.listdir(self.cdi_root)
        except FileNotFoundError:
            return []
        uids = []
        for entry in names:
            m = _SPEC_FILE.fullmatch(entry)
            if m and m["driver"] == self.driver_name and is_uuid(m["uid"]):
                uids.append(m["uid"])
        return sorted(uids)
