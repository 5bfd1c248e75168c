"""Which drivers a claim is for, as far as its DeviceClasses or its allocation say: ``explain`` refuses a
claim of another driver, and leaves such claims out of its lists."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dra_driver.controller.verdicts import claim_class_names
from dra_driver.k8s.bodies import DeviceClasses, RawDeviceClass
from dra_driver.k8s.claims import device_ids, is_allocated, status_of

_DRIVER_EQUALS = re.compile(r"""device\.driver\s*==\s*(?:"([^"]+)"|'([^']+)')""")


def class_drivers(device_class: RawDeviceClass) -> set[str]:
    """The drivers a DeviceClass's CEL selectors compare ``device.driver`` with; empty when they say
    nothing about the driver (the class may then match any driver's devices)."""
    spec = device_class.get("spec")
    found: set[str] = set()
    for sel in (spec.get("selectors") if isinstance(spec, Mapping) else None) or []:
        cel = sel.get("cel") if isinstance(sel, Mapping) else None
        expression = cel.get("expression") if isinstance(cel, Mapping) else None
        if isinstance(expression, str):
            found |= {a or b for a, b in _DRIVER_EQUALS.findall(expression)}
    return found


def claim_drivers(claim: Mapping[str, Any], classes: DeviceClasses) -> set[str]:
    """The drivers of an allocated claim's devices; for a pending one, those its DeviceClasses name.
    Empty when that cannot be told (a class that names no driver, or is not there)."""
    if is_allocated(claim):
        return {d for d, _, _ in device_ids(status_of(claim).get("allocation"))}
    drivers: set[str] = set()
    for name in claim_class_names(claim):
        cls = classes.get(name)
        named = class_drivers(cls) if cls is not None else set()
        if not named:
            return set()
        drivers |= named
    return drivers
