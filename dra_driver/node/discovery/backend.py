"""The interface every discovery backend implements."""

from __future__ import annotations

from typing import Protocol

from dra_driver.node.discovery.model import Gpu, MigDevice, MigPlacement, MigProfile


class Backend(Protocol):
    name: str
    """``nvml`` or ``simulated``."""

    def discover(self) -> list[Gpu]:
        """The node's GPUs, ordered by index."""
        ...

    def create_mig_instance(self, gpu: Gpu, profile: MigProfile, placement: MigPlacement) -> MigDevice:
        """Create a MIG instance for dynamic MIG; idempotent for an instance that already exists there."""
        ...

    def destroy_mig_instance(self, mig: MigDevice) -> None:
        """Destroy a MIG instance created by create_mig_instance; a missing one is not an error."""
        ...
