"""Describe: turn discovered GPUs into the node's allocatable devices.

Every device the plugin publishes in a ResourceSlice has one ``AllocatableDevice`` here, under the
same name; prepare looks devices up by that name.
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_driver.discovery.model import Gpu, MigDevice, MigPlacement, MigProfile


@dataclass(frozen=True)
class AllocatableDevice:
    name: str
    """DNS label, unique within the node's pool."""
    gpu: Gpu
    """The full GPU, or the parent of a MIG device."""
    mig: MigDevice | None = None
    """A static MIG instance that exists."""
    mig_profile: MigProfile | None = None
    """Dynamic MIG: the profile whose instance is created at prepare time."""
    placement: MigPlacement | None = None
    """Dynamic MIG: where on the parent the instance goes."""

    @property
    def kind(self) -> str:
        return "gpu" if self.mig is None and self.mig_profile is None else "mig"
