"""Every CDI spec the driver writes during a unit-test session, checked with the reference CDI library.

:func:`install` wraps the function the driver writes its files with (the one ``dra_driver.node.prepare.cdi``
writes claim specs with; ``dra_driver.node.prepare.metadata`` writes its specs with the same one), wherever it
has been imported. A file written through it whose content is a CDI spec (a JSON object with a
``cdiVersion``) is kept, with the test that wrote it, as it was written: a later unprepare may delete
it. At the end of the session :func:`check` puts each distinct spec in a directory of its own and
checks them all in one ``cdi-validate`` run (:mod:`e2e.testbed.cdicheck`): the library must load the
spec, resolve and inject each of its devices, and agree that its ``cdiVersion`` is the lowest its
content needs (what ``dra_driver.node.prepare.cdi`` promises). conftest.py fails the run otherwise.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from e2e.testbed import cdicheck
from e2e.tooling import gotools

PROJECT_MODULES = ("dra_driver", "e2e", "unit_tests")


@dataclass
class Written:
    path: Path
    data: bytes
    tests: list[str] = field(default_factory=list)


@dataclass
class Outcome:
    problems: list[str]
    written: int
    distinct: int
    devices: int = 0
    injected: int = 0
    needs_host_devices: int = 0
    kept: Path | None = None
    """Where the specs that failed stay for a second look (with the command that checks them)."""

    def summary(self) -> str:
        if self.problems:
            return f"{len(self.problems)} problem(s) in {self.distinct} distinct CDI spec(s) the driver wrote"
        return (f"CDI specs: {self.written} written by the driver, {self.distinct} distinct, all valid by "
                f"{cdicheck.TOOL} ({gotools.TOOLS[cdicheck.TOOL].module} {gotools.TOOLS[cdicheck.TOOL].version()}); "
                f"{self.devices} devices resolve: {self.injected} injected, {self.needs_host_devices} need device "
                f"nodes this machine lacks")


class Session:
    def __init__(self) -> None:
        self.written: dict[tuple[str, str], Written] = {}
        self.writes = 0

    def offer(self, path: Path, data: bytes) -> None:
        """Keep ``data`` if it is a CDI spec."""
        if b'"cdiVersion"' not in data:
            return
        try:
            doc = json.loads(data)
        except ValueError:
            return
        if not isinstance(doc, dict) or "cdiVersion" not in doc:
            return
        self.writes += 1
        key = (path.name, hashlib.sha256(data).hexdigest())
        entry = self.written.setdefault(key, Written(path, data))
        entry.tests.append(os.environ.get("PYTEST_CURRENT_TEST", "(outside a test)").rsplit(" (", 1)[0])

    def check(self) -> Outcome | None:
        """Check every spec kept; None when the session wrote none."""
        if not self.written:
            return None
        entries = list(self.written.values())
        outcome = Outcome(problems=[], written=self.writes, distinct=len(entries))
        scratch = Path(tempfile.mkdtemp(prefix="cdi-specs-"))
        dirs = []
        for i, entry in enumerate(entries):
            folder = scratch / f"{i:05d}"
            folder.mkdir()
            (folder / entry.path.name).write_bytes(entry.data)
            dirs.append(folder)
        try:
            verdicts = cdicheck.check(dirs)
        except (gotools.ToolError, cdicheck.CdiCheckError) as e:
            shutil.rmtree(scratch, ignore_errors=True)
            outcome.problems.append(f"the {outcome.distinct} CDI spec(s) the driver wrote could not be checked with "
                                    f"the reference CDI library: {e}")
            return outcome
        failed = set()
        for v in verdicts:
            index = int(Path(v.spec).parent.name)
            entry = entries[index]
            problem = verdict_problem(v)
            if problem:
                failed.add(index)
                others = f" (and {len(entry.tests) - 1} more writes of the same content)" if len(entry.tests) > 1 else ""
                outcome.problems.append(f"{entry.path} written by {entry.tests[0]}{others}: {problem} [copy: {v.spec}]")
            elif v.device:
                outcome.devices += 1
                outcome.injected += v.injected == cdicheck.INJECTED
                outcome.needs_host_devices += v.injected == cdicheck.NEEDS_HOST_DEVICES
        if failed:
            for index in set(range(len(entries))) - failed:
                shutil.rmtree(dirs[index])
            outcome.kept = scratch
        else:
            shutil.rmtree(scratch, ignore_errors=True)
        return outcome


def verdict_problem(v: cdicheck.Verdict) -> str:
    """What is wrong with a spec the driver wrote, by the library's word; empty when nothing is."""
    if not v.ok:
        return f"device {v.device}: {v.error}" if v.device else v.error
    if not v.device and v.cdi_version.lstrip("v") != v.minimum_version:
        return (f"cdiVersion {v.cdi_version} is not the lowest its content needs: the library says "
                f"{v.minimum_version}")
    return ""


def stand_in_device_nodes(cdi_dir: Path, dev_root: Path) -> list[Path]:
    """A FIFO at the host path of each device node that the specs in ``cdi_dir`` place under ``dev_root``
    (a simulated node's fake dev root), so that injection finds a device node there as on a GPU node.
    FIFOs, because making character devices needs root; the library takes a FIFO's type from the host."""
    made = []
    for spec in sorted(cdi_dir.glob("*.json")):
        doc = json.loads(spec.read_text())
        edits = [doc.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in doc["devices"]]
        for node in (n for e in edits for n in e.get("deviceNodes", [])):
            host = Path(node.get("hostPath") or node["path"])
            if host.is_relative_to(dev_root) and not host.exists():
                host.parent.mkdir(parents=True, exist_ok=True)
                os.mkfifo(host)
                made.append(host)
    return made


SESSION = Session()

_Writer = Callable[..., None]


def install() -> None:
    """Record every CDI spec the driver writes from now on into :data:`SESSION`."""
    from dra_driver.node.prepare import cdi, metadata

    original: _Writer = cdi.atomic_write
    if getattr(original, "records_cdi_specs", False):
        return

    @functools.wraps(original)
    def recording(path: Path, data: bytes, *args: object, **kwargs: object) -> None:
        original(path, data, *args, **kwargs)
        SESSION.offer(Path(path), data)

    recording.records_cdi_specs = True  # type: ignore[attr-defined]
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith(PROJECT_MODULES):
            for name, value in list(vars(module).items()):
                if value is original:
                    setattr(module, name, recording)
    # A third way of writing specs would escape the check: fail loudly instead.
    assert metadata.atomic_write is recording, "dra_driver.node.prepare.metadata no longer writes specs as cdi does"
