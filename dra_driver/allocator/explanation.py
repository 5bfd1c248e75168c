"""Why a claim was (not) allocated: data model plus renderers.

Kept separate from the search so the allocator only records facts; how they
are shown (Event message, annotation JSON, text for people) lives here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from dra_driver.k8s.fields import cut

__all__ = [
    "MAX_SUMMARY_BYTES",
    "CandidateNote",
    "CelIssue",
    "Explanation",
    "RequestExplanation",
    "ResultNote",
    "StageCount",
    "device_range",
    "plain_words",
]

# Kubernetes Event messages are truncated at 1 kB by many tools; stay below.
MAX_SUMMARY_BYTES = 1024


@dataclass
class StageCount:
    """How many devices were still candidates after ``stage``."""

    stage: str
    kept: int


TAINT_STAGE = "taints tolerated"
"""The funnel's stage that removes devices whose taints a request does not tolerate."""


@dataclass
class CandidateNote:
    """Devices that got far and failed the same first condition in the same way.

    ``device`` is the first of them, ``devices`` the first few (all when ``count`` is small)."""

    device: str
    failed: str
    count: int = 1
    devices: list[str] = field(default_factory=list)

    def label(self) -> str:
        return device_range(self.devices or [self.device], self.count)


@dataclass
class ResultNote:
    """One result of an allocation, for people: a share says what it consumes and why."""

    request: str
    device: str
    share: bool = False
    consumption: list[str] = field(default_factory=list)


@dataclass
class CelIssue:
    source: str
    expression: str
    message: str
    device: str | None = None


@dataclass
class RequestExplanation:
    """The funnel for one request (or one firstAvailable subrequest)."""

    request: str
    device_class: str
    mode: str
    needed: int | None
    stages: list[StageCount] = field(default_factory=list)
    closest: list[CandidateNote] = field(default_factory=list)
    cel_errors: list[CelIssue] = field(default_factory=list)
    error: str | None = None
    chosen: bool = False
    # Selector label -> expression, for the selectors that removed a device.
    selectors: dict[str, str] = field(default_factory=dict)

    @property
    def candidates(self) -> int:
        return self.stages[-1].kept if self.stages else 0

    def short(self) -> str:
        need = "all" if self.mode == "All" else str(self.needed)
        if self.error:
            return f"request {self.request}: {self.error}"
        tail = f"{self.candidates} candidates, need {need}"
        losses = [s for s, prev in zip(self.stages[1:], self.stages, strict=False) if s.kept < prev.kept]
        if losses:
            worst = min(losses, key=lambda s: s.kept)
            tail += f" ({worst.stage} left {worst.kept})"
            # Whose taint it is (a DeviceTaintRule's names the rule): the one-line verdict says
            # what an admin has to change.
            tainted = next((n for n in self.closest if n.failed.startswith("taint ")), None)
            if worst.stage == TAINT_STAGE and tainted is not None:
                tail += f"; {tainted.label()}: {tainted.failed}"
        if self.cel_errors:
            issue = self.cel_errors[0]
            tail += f"; CEL error in {issue.source}: {issue.message}"
        return f"request {self.request}: {tail}"


@dataclass
class Explanation:
    claim: str
    allocated: bool = False
    node: str | None = None
    requests: list[RequestExplanation] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    pools: list[str] = field(default_factory=list)
    nodes: dict[str, Any] = field(default_factory=dict)
    devices: list[str] = field(default_factory=list)  # one entry per result: a device with two shares twice
    results: list[ResultNote] = field(default_factory=list)
    # Per shareable device the claim's requests could use together: what each would consume.
    consumption: list[str] = field(default_factory=list)
    # What the scheduler's error would name: request, device, selector (see context.Abort).
    failure: dict[str, str] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        """One line for a Kubernetes Event (at most :data:`MAX_SUMMARY_BYTES` bytes)."""
        if self.allocated:
            where = f" on node {self.node}" if self.node else ""
            text = f"allocated {self.device_count()}{where}: " + ", ".join(self._device_list())
        else:
            parts = list(self.errors[:2])
            parts += [r.short() for r in self.requests if not r.chosen][:3]
            parts += self.consumption[:1]
            parts += self.constraints[:1]
            if self.nodes.get("tried"):
                parts.append(self._node_line())
            text = "cannot allocate: " + "; ".join(p for p in parts if p)
        return cut(text, MAX_SUMMARY_BYTES)

    def _shares(self) -> Counter[str]:
        return Counter(r.device for r in self.results if r.share)

    def device_count(self) -> str:
        """``3 device(s)``, and the shares apart when there are some: ``3 device(s) (4 shares on 2 of them)``."""
        text = f"{len(dict.fromkeys(self.devices))} device(s)"
        shares = self._shares()
        if shares:
            text += f" ({sum(shares.values())} share(s) on {len(shares)} of them)"
        return text

    def _device_list(self) -> list[str]:
        shares = self._shares()
        return [f"{d} ({shares[d]} shares)" if shares[d] > 1 else d for d in dict.fromkeys(self.devices)]

    def _node_line(self) -> str:
        reasons = self.nodes.get("reasons", {})
        detail = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:3])
        best = self.nodes.get("best")
        if best and best.get("node"):
            detail += f"; best node {best['node']} has {best['selector_matches']} matching devices"
        return f"0/{self.nodes.get('tried', 0)} nodes fit" + (f" ({detail})" if detail else "")

    def render(self) -> str:
        """Multi-line text for people (kubectl describe, CLI)."""
        lines = [f"Claim {self.claim}: {'allocated' if self.allocated else 'NOT allocated'}"]
        if self.node:
            lines.append(f"  node: {self.node}")
        if self.results:
            lines.append(f"  devices: {self.device_count()}")
        for r in self.results:
            detail = "; ".join((["share"] if r.share else []) + r.consumption)
            lines.append(f"    {r.request}: {r.device}" + (f" ({detail})" if detail else ""))
        for e in self.errors:
            lines.append(f"  error: {e}")
            plain = plain_words(e)
            if plain:
                lines.append(f"    in plain words: {plain}")
        lines += [f"  pool: {p}" for p in self.pools]
        for req in self.requests:
            need = "all" if req.mode == "All" else str(req.needed)
            mark = " (chosen)" if req.chosen else ""
            lines.append(f"  request {req.request}{mark}: class {req.device_class}, need {need}")
            if req.error:
                lines.append(f"    error: {req.error}")
            lines += [f"    {s.kept:6d}  {s.stage}" for s in req.stages]
            lines += [f"    {label}: {expr}" for label, expr in req.selectors.items()]
            lines += [f"    CEL error ({i.source}, device {i.device}): {i.message}" for i in req.cel_errors]
            lines += [f"    closest {c.label()}: {c.failed}" for c in req.closest]
        lines += [f"  shared device: {c}" for c in self.consumption]
        lines += [f"  constraint: {c}" for c in self.constraints]
        if self.nodes:
            lines.append(f"  nodes tried: {self.nodes.get('tried', 0)}")
            lines += [f"    {n:6d}  {r}" for r, n in sorted(self.nodes.get("reasons", {}).items())]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (for an annotation)."""
        data = asdict(self)
        data["summary"] = self.summary
        return data


_LARGEST = "18446744073709551615"
# Scheduler errors whose wording says little to someone who did not read the scheduler's source.
_PLAIN_WORDS = (
    ("parse semantic version: strconv.ParseUint", "value out of range",
     f"the device publishes a version with a number larger than {_LARGEST}, which the API server accepted but "
     "kube-scheduler's semver cannot hold; kube-scheduler 1.36 and 1.37 then fail every CEL selector on that "
     "device, the class's too, so the driver must publish a smaller version"),
    ("value is invalid or its type is not supported by this version", "",
     f"the selector reads an attribute kube-scheduler 1.38 could not read from the device (a version with a number "
     f"larger than {_LARGEST}, say); selectors that do not read it are unaffected"),
    ("unsupported attribute value for", "",
     f"a matchAttribute or distinctAttribute constraint met a device whose value it cannot compare (a list, or a "
     f"version with a number larger than {_LARGEST}); kube-scheduler 1.38 stops there instead of skipping the "
     "device: fix the driver's value or constrain another attribute"),
)


def plain_words(error: str) -> str | None:
    """What a scheduler error means, for the errors that need saying (None for the others)."""
    return next((text for first, second, text in _PLAIN_WORDS if first in error and second in error), None)


def device_range(devices: list[str], count: int) -> str:
    """Devices for one line: up to three by name, more as ``first … last (N devices)``, the
    shared ``driver/pool/`` prefix written once (``gpu.dra-driver.io/node-1/gpu-0 … gpu-4``)."""
    if count <= 3 and len(devices) == count:
        return ", ".join(devices)
    first, last = devices[0], devices[-1]
    prefix = first.rpartition("/")[0] + "/"
    if last.startswith(prefix):
        last = last[len(prefix):]
    return f"{first} … {last} ({count} devices)"

