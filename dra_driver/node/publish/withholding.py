"""The devices left out of the node's ResourceSlices because the API server would refuse them.

A device is withheld, never the node: every device passes :mod:`~dra_driver.node.publish.checker`
first, and when a write is refused anyway (422 Invalid) the device to blame is found
(:func:`blame`: the refusal's ``causes`` name ``spec.devices[i]``; otherwise the slice's devices
are bisected with server-side dry runs) and withheld too, until its content changes.
:class:`Withholding` keeps what is withheld and why, tells each newly withheld device once (a log
line and ``on_withheld``, which the plugin turns into the Node's ``DeviceWithheld`` Event), counts
them in ``dra_driver_plugin_devices_withheld{reason}`` and sums them up for ``/readyz``
(:func:`withheld_summary`). :class:`~dra_driver.node.publish.publisher.SlicePublisher` does the
writes and the dry runs.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver import logs
from dra_driver.allocator.devicestates import raw_device_model
from dra_driver.k8s.objects import Obj
from dra_driver.node.metrics import METRICS
from dra_driver.node.publish.checker import RULES, Violation, partition

REFUSED = "api-server-refused"
"""The rule of a device the API server refused although the checker passed it."""
_DEVICE_FIELD = re.compile(r"^spec\.devices\[(\d+)\](?:\.(.*))?$")


def refused_devices(devices: Sequence[Mapping[str, Any]], details: Mapping[str, Any]) -> dict[str, Violation]:
    """The devices a 422's ``details.causes`` blame, by name: each cause whose ``field`` is
    ``spec.devices[i]…``. Empty when no cause names a device."""
    blamed: dict[str, Violation] = {}
    causes = details.get("causes") if isinstance(details, Mapping) else None
    for cause in causes if isinstance(causes, list) else []:
        match = _DEVICE_FIELD.match(str(cause.get("field", ""))) if isinstance(cause, Mapping) else None
        if match is None or int(match.group(1)) >= len(devices):
            continue
        name = str(devices[int(match.group(1))].get("name", ""))
        blamed.setdefault(name, Violation(name, REFUSED, match.group(2) or "",
                                          str(cause.get("message", "")) or "refused by the API server"))
    return blamed


def bisect_refused(devices: Sequence[Obj], accepts: Callable[[list[Obj]], bool]) -> list[Obj]:
    """The devices that the API server refuses, each alone or in any company, found by asking
    ``accepts`` (a server-side dry run of a slice with just those devices) about halves: a few
    dry runs per bad device instead of one per device."""
    if not devices or accepts(list(devices)):
        return []
    if len(devices) == 1:
        return list(devices)
    middle = len(devices) // 2
    return bisect_refused(devices[:middle], accepts) + bisect_refused(devices[middle:], accepts)


def blame(devices: Sequence[Obj], details: Mapping[str, Any], message: str,
          refusal: Callable[[list[Obj]], str | None]) -> dict[str, Violation]:
    """The devices of a refused slice to blame, by name: those its causes name, else those a
    dry run refuses (``refusal``: what the API server says of the slice holding just these
    devices, None when it accepts it), each with its own refusal, or ``message`` (the write's).
    Bisected only when the slice without devices is accepted: otherwise the devices are not what
    the API server refuses."""
    blamed = refused_devices(devices, details)
    if blamed or not devices or refusal([]) is not None:
        return blamed
    alone: dict[str, str] = {}

    def accepts(subset: list[Obj]) -> bool:
        why = refusal(subset)
        if why is not None and len(subset) == 1:
            alone[str(subset[0].get("name", ""))] = why
        return why is None

    for d in bisect_refused(devices, accepts):
        name = str(d.get("name", ""))
        blamed[name] = Violation(name, REFUSED, "", alone.get(name, message))
    return blamed


def fingerprint(device: Mapping[str, Any]) -> str:
    """The device's content, to tell whether it changed since the API server refused it."""
    return json.dumps(device, sort_keys=True, default=str)


def withheld_summary(withheld: Mapping[str, Sequence[Violation]]) -> str | None:
    """One line for ``/readyz``: which devices are withheld and why; None when none is."""
    if not withheld:
        return None
    parts = [f"{name} ({', '.join(sorted({v.rule for v in problems}))})" for name, problems in withheld.items()]
    return (f"publishing degraded: {len(parts)} device(s) withheld from the ResourceSlices because the API "
            f"server would refuse them: {'; '.join(parts)}")


@dataclass(frozen=True)
class Decision:
    """The devices to publish, those withheld (by name, with why), and the API server's refusals
    that still hold."""

    publish: list[Obj]
    withheld: dict[str, list[Violation]]
    refused: dict[str, tuple[str, list[Violation]]]
    models: dict[str, str]
    """The withheld devices' models (:func:`~dra_driver.allocator.devicestates.raw_device_model`)."""


class Withholding:
    """What is withheld now (:attr:`withheld`), what the API server refused, and who was told.

    Not locked: the publisher calls :meth:`decide`, :meth:`adopt` and :meth:`refuse` under its own lock, and
    :meth:`tell` from its one sync thread with a copy of :attr:`withheld` taken under that lock."""

    def __init__(self, driver: str, log: logs.Logger,
                 on_withheld: Callable[[str, str, list[Violation]], None] | None = None) -> None:
        self.driver = driver
        self.on_withheld = on_withheld
        self._log = log
        self.withheld: dict[str, list[Violation]] = {}
        """The devices left out of the slices now, by name, with what they break."""
        self.models: dict[str, str] = {}
        """Their models, by name."""
        self._refused: dict[str, tuple[str, list[Violation]]] = {}
        """Devices the API server refused although the checker passed them: name -> (content, why)."""
        self._told: dict[str, frozenset[str]] = {}

    def decide(self, devices: Sequence[Obj]) -> Decision:
        """Which of ``devices`` to publish and which to withhold; nothing changes until
        :meth:`adopt`. A refusal holds until the device changes."""
        current = {str(d.get("name", "")): fingerprint(d) for d in devices if isinstance(d, Mapping)}
        refused = {name: (content, why) for name, (content, why) in self._refused.items()
                   if current.get(name) == content}
        split = partition(devices, self.driver, {name: why for name, (_, why) in refused.items()})
        models = {name: raw_device_model(d, self.driver) for d in devices
                  if isinstance(d, Mapping) and (name := str(d.get("name", ""))) in split.withheld}
        return Decision(split.publish, split.withheld, refused, models)

    def adopt(self, decision: Decision) -> None:
        """Make ``decision`` what is withheld now, and count it by reason."""
        self.withheld, self._refused, self.models = decision.withheld, decision.refused, decision.models
        reasons = Counter(problems[0].rule for problems in decision.withheld.values())
        for rule in RULES:
            METRICS.devices_withheld.labels(reason=rule).set(reasons.get(rule, 0))

    def refuse(self, devices: Sequence[Obj], blamed: Mapping[str, Violation]) -> None:
        """Remember what the API server refused of ``devices`` (the desired ones), for the next
        :meth:`decide`."""
        for name, why in blamed.items():
            device = next((d for d in devices if d.get("name") == name), None)
            if device is not None:
                self._refused[name] = (fingerprint(device), [why])

    def tell(self, withheld: Mapping[str, Sequence[Violation]], models: Mapping[str, str]) -> None:
        """Log, and tell ``on_withheld`` (with its model), each device newly withheld (or withheld
        for new reasons)."""
        told: dict[str, frozenset[str]] = {}
        for name, problems in withheld.items():
            told[name] = frozenset(v.describe() for v in problems)
            if self._told.get(name) == told[name]:
                continue
            self._log.warning("a device is withheld from the ResourceSlices: the API server would refuse it",
                              device=name, rules=sorted({v.rule for v in problems}),
                              problems=[f"{v.field}: {v.message}" for v in problems])
            if self.on_withheld is not None:
                self.on_withheld(name, models.get(name, "unknown"), list(problems))
        for name in sorted(set(self._told) - set(told)):
            self._log.info("a device withheld before is published again", device=name)
        self._told = told
