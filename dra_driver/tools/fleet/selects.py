"""A CEL selector's outcome on each device of an inventory, evaluated as the engine evaluates a
request's selector (:func:`dra_driver.allocator.groups.outcome`, under the cluster scheduler's
rules), once per group of devices that agree on what the selector reads
(:func:`dra_driver.allocator.groups.partition`): 40,000 GPUs that differ only in UUIDs and PCI
addresses are a handful of groups to a selector on ``productName``. Pure."""

from __future__ import annotations

from collections.abc import Callable

from dra_driver.allocator.cel.compile import CompiledSelector
from dra_driver.allocator.groups import Outcome, Projection, outcome, partition
from dra_driver.allocator.inventory import Device, Inventory
from dra_driver.allocator.rules import SchedulerRules


def outcomes(selector: CompiledSelector, inventory: Inventory, rules: SchedulerRules) -> Callable[[Device], Outcome]:
    """``selector``'s outcome on a device of ``inventory``: True, False or the runtime error.

    A grouped device's outcome is its group's first member's: the engine caches outcomes by the
    values a selector reads, which the group's members share. A device looked at alone (an unclean
    CEL input, a pool that cannot be allocated from), a selector that reads the device as a whole
    and a poisoned one are evaluated device by device, as the engine does."""
    qualified, on_read = rules.qualified_names, rules.cel_converts_on_read

    def alone(dev: Device) -> Outcome:
        return outcome(selector, dev, qualified, on_read)

    if selector.reads.whole or selector.poisoned is not None:
        return alone
    part = partition(inventory, Projection(selector.reads))
    devices = inventory.devices
    by_group: dict[int, Outcome] = {}

    def grouped(dev: Device) -> Outcome:
        g = part.group_of[dev.index] if dev.index < len(devices) and devices[dev.index] is dev else -1
        if g < 0:
            return alone(dev)
        found = by_group.get(g)
        if found is None:
            found = by_group[g] = alone(part.groups[g].rep)
        return found

    return grouped
