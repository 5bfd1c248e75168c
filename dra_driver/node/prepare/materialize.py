"""A prepared claim made real on this node from its checkpoint entry: its dynamic MIG instances and
its files (the claim's CDI spec, its device metadata files and their specs).

They are made at prepare, made again when a reboot wiped them (or a file went missing), and
undone at unprepare or when a preparation is rolled back. Everything here is derived from the
entry, which is why the files need not be durable (:data:`dra_driver.node.prepare.cdispec.DERIVED_FILES_DURABLE`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from dra_driver.logs import Logger
from dra_driver.node.describe.devices import AllocatableDevice
from dra_driver.node.discovery.backend import Backend
from dra_driver.node.discovery.model import MigDevice
from dra_driver.node.discovery.sysfs import read_mig_cap_minors
from dra_driver.node.fileio import describe_os_error
from dra_driver.node.prepare.calls import CdiError, ClaimFailure
from dra_driver.node.prepare.cdi import CdiSpecs
from dra_driver.node.prepare.edits import ClaimDevice
from dra_driver.node.prepare.entries import ClaimEntry, DeviceKind, PreparedDevice, now_rfc3339
from dra_driver.node.prepare.metadata import MetadataClaim, MetadataFiles
from dra_driver.node.prepare.mps import runs_mps
from dra_driver.node.prepare.toolkit import DriverEditsError


def creates_mig(device: AllocatableDevice, prepared: PreparedDevice) -> bool:
    """Whether preparing ``prepared`` creates a dynamic MIG instance (whose record must be on disk first)."""
    return device.mig_profile is not None and prepared.mig_instance is None


def rebooted(entry: ClaimEntry, boot_id: str) -> bool:
    return bool(entry.boot_id and boot_id and entry.boot_id != boot_id)


def claim_device(dev: PreparedDevice) -> ClaimDevice:
    """A checkpointed device as the edits see it."""
    return ClaimDevice(
        device_name=dev.device, request=dev.requests[0] if dev.requests else "", uuid=dev.uuid,
        gpu_minor=dev.gpu_minor, mig_caps=dev.mig_caps, sharing=dev.sharing, admin_access=dev.admin_access,
        share_id=dev.share_id, memory_share_bytes=dev.memory_share_bytes,
        compute_share_percent=dev.compute_share_percent, mps_gpu=dev.gpu_uuid if runs_mps(dev) else None,
    )


class Materializer:
    """Makes and removes what prepared claims have on this node; the caller holds the state lock."""

    def __init__(self, cdi: CdiSpecs, metadata: MetadataFiles | None, backend: Backend | None,
                 proc_root: Path | None, log: Logger) -> None:
        self.cdi = cdi
        self.metadata = metadata
        self._backend = backend
        self._proc_root = proc_root
        self._log = log

    # -- dynamic MIG

    def create_mig(self, device: AllocatableDevice) -> MigDevice:
        if self._backend is None:
            raise ClaimFailure(f"device {device.name} needs a MIG instance but there is no GPU backend")
        if device.mig_profile is None or device.placement is None:
            raise ClaimFailure(f"device {device.name} has no MIG profile/placement")
        return self._backend.create_mig_instance(device.gpu, device.mig_profile, device.placement)

    def with_new_mig(self, dev: PreparedDevice, device: AllocatableDevice) -> PreparedDevice:
        """``dev`` with a MIG instance created for it."""
        inst = self.create_mig(device)
        caps = read_mig_cap_minors(dev.gpu_minor, inst.gpu_instance_id, inst.compute_instance_id, self._proc_root)
        return replace(dev, mig_instance=inst, uuid=inst.uuid, mig_caps=caps)

    def _destroy_migs(self, entry: ClaimEntry, devices: Mapping[str, AllocatableDevice]) -> list[str]:
        errors: list[str] = []
        for dev in entry.devices:
            inst = dev.mig_instance
            if inst is None and dev.kind is DeviceKind.MIG and self._backend is not None:
                # Interrupted between creating the instance and recording it: creation is
                # idempotent, so this finds the instance (or makes one) to destroy.
                known = devices.get(dev.device)
                if known is not None and known.mig_profile is not None:
                    try:
                        inst = self.create_mig(known)
                    except Exception as exc:  # the GPU backend's (NvmlError, a simulator's MigError): all reported
                        errors.append(f"{dev.device}: {exc}")
            if inst is not None:
                try:
                    if self._backend is None:
                        raise ClaimFailure(f"cannot destroy MIG instance {inst.uuid}: no GPU backend")
                    self._backend.destroy_mig_instance(inst)
                except Exception as exc:  # the GPU backend's, as above
                    errors.append(f"destroying MIG instance {inst.uuid} of {dev.device}: {exc}")
        return errors

    # -- files

    def write(self, entry: ClaimEntry, devices: Mapping[str, AllocatableDevice]) -> None:
        """The claim's files: device metadata (and its specs) first, then the claim's CDI spec."""
        try:
            self.cdi.require_driver()
        except DriverEditsError as exc:
            raise ClaimFailure(str(exc)) from None
        if self.metadata is not None:
            self._write_metadata(MetadataClaim(entry.uid, entry.namespace, entry.name, entry.pod_claim_name),
                                 entry.devices, devices)
        try:
            self.cdi.write_claim_spec(entry.uid, entry.namespace, entry.name, [claim_device(d) for d in entry.devices])
        except DriverEditsError as exc:
            raise ClaimFailure(str(exc)) from None
        except OSError as exc:
            raise ClaimFailure(describe_os_error(exc, f"CDI spec {self.cdi.spec_path(entry.uid)}")) from None

    def _write_metadata(self, claim: MetadataClaim, prepared: Sequence[PreparedDevice],
                        devices: Mapping[str, AllocatableDevice]) -> None:
        assert self.metadata is not None
        try:
            unpublished = self.metadata.write(claim, prepared, devices)
        except OSError as exc:
            raise ClaimFailure(describe_os_error(exc, f"device metadata {exc.filename or self.metadata.dir}")) from None
        if unpublished:
            self._log.bind(claim_uid=claim.uid, claim=f"{claim.namespace}/{claim.name}").warning(
                "device metadata lists devices no longer published without their attributes", devices=unpublished)

    # -- a prepared claim again

    def needs_rematerialize(self, entry: ClaimEntry, boot_id: str) -> bool:
        if not entry.devices:
            return False
        try:
            return (rebooted(entry, boot_id) or not self.cdi.spec_exists(entry.uid)
                    or (self.metadata is not None and not self.metadata.complete(entry.uid, entry.devices)))
        except CdiError:
            return False

    def renew(self, entry: ClaimEntry, boot_id: str,
              devices: Mapping[str, AllocatableDevice]) -> tuple[ClaimEntry, str | None]:
        """A prepared claim made current: re-created when a reboot wiped it or a file is missing (a
        new entry), its files re-written when they are not what this version writes; and what was
        done, for the log (None: nothing)."""
        if self.needs_rematerialize(entry, boot_id):
            return self.rematerialize(entry, boot_id, devices), "re-created the CDI spec of a prepared claim"
        if self.outdated(entry, devices):
            self.write(entry, devices)
            return entry, "re-wrote the CDI spec of a prepared claim: it was not what this version writes"
        return entry, None

    def outdated(self, entry: ClaimEntry, devices: Mapping[str, AllocatableDevice]) -> bool:
        """Whether a file of the prepared claim is not what this version writes: an earlier version (or
        someone else) wrote it. Unknown (False) when the content cannot be made now, e.g. without the
        driver's edits: the file there is then the best there is."""
        if not entry.devices:
            return False
        try:
            if not self.cdi.spec_is_current(entry.uid, entry.namespace, entry.name,
                                            [claim_device(d) for d in entry.devices]):
                return True
            return self.metadata is not None and not self.metadata.current(
                MetadataClaim(entry.uid, entry.namespace, entry.name, entry.pod_claim_name), entry.devices, devices)
        except (CdiError, DriverEditsError, OSError):
            return False

    def rematerialize(self, entry: ClaimEntry, boot_id: str, devices: Mapping[str, AllocatableDevice]) -> ClaimEntry:
        """Re-create what a reboot wiped: dynamic MIG instances (new boot) and the files."""
        prepared = list(entry.devices)
        if rebooted(entry, boot_id):
            for i, dev in enumerate(prepared):
                if dev.mig_instance is not None:
                    known = devices.get(dev.device)
                    if known is None:
                        raise ClaimFailure(f"dynamic MIG device {dev.device} is no longer published on this node")
                    prepared[i] = self.with_new_mig(dev, known)
        entry = replace(entry, devices=tuple(prepared))
        self.write(entry, devices)
        return replace(entry, boot_id=boot_id, updated=now_rfc3339())

    # -- undoing

    def rollback(self, entry: ClaimEntry, devices: Mapping[str, AllocatableDevice]) -> None:
        """Undo whatever a (partial) preparation did: MIG instances, CDI spec, device metadata."""
        errors = self._destroy_migs(entry, devices)
        try:
            self.cdi.delete_claim_spec(entry.uid)
        except (OSError, CdiError) as exc:
            errors.append(f"deleting CDI spec: {exc}")
        if self.metadata is not None:
            try:
                if entry.devices:
                    self.metadata.remove_handed_out(entry.uid, entry.devices)
                else:  # recorded before its devices were known (see prepare.state)
                    self.metadata.remove(entry.uid)
            except (OSError, CdiError) as exc:
                errors.append(f"deleting device metadata: {exc}")
        if errors:
            raise ClaimFailure("; ".join(errors))

    def remove_unknown(self, uid: str) -> list[str]:
        """Remove the files of a claim without an entry; what was removed, for the log."""
        removed = []
        try:
            if self.cdi.delete_claim_spec(uid):
                removed.append("removed a leftover CDI spec of an unknown claim")
            if self.metadata is not None and self.metadata.remove(uid):
                removed.append("removed leftover device metadata of an unknown claim")
        except CdiError:
            pass  # not a UUID: we never wrote anything for it
        return removed

    def remove_temp_files(self) -> list[str]:
        """Temporary files of writes interrupted by a crash (start-up only)."""
        leftovers = self.cdi.remove_stale_temp_files()
        if self.metadata is not None:
            leftovers += self.metadata.remove_stale_temp_files()
        return leftovers

    def orphans(self, known: Collection[str]) -> list[str]:
        """Claims with files but no entry among ``known``."""
        try:
            return sorted(set(self.cdi.list_claim_specs()).union(
                self.metadata.claims() if self.metadata is not None else ()) - set(known))
        except OSError:
            return []
