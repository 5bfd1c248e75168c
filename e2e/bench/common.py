"""What every benchmark shares: statistics, machine facts, the result files and the summary table.

A result file records enough to judge a number later: the machine (a 2-core box shared with other
test beds is noisy, so load averages before and after are kept), the date, the commit, the
parameters, every figure and the target with its verdict.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100): the value a fraction ``q`` of samples do not exceed."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def summarize_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/min/max in milliseconds, rounded to microseconds."""
    ms = [s * 1000 for s in seconds]
    return {
        "samples": len(ms),
        "p50_ms": round(percentile(ms, 50), 3),
        "p90_ms": round(percentile(ms, 90), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "min_ms": round(min(ms), 3) if ms else float("nan"),
        "max_ms": round(max(ms), 3) if ms else float("nan"),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_mib() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


def _filesystem(path: Path) -> str:
    """Device and type of the file system holding ``path`` (longest matching mount point)."""
    best = ("", "unknown", "unknown")
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fstype = line.split()[:3]
            if str(path).startswith(mnt) and len(mnt) >= len(best[0]):
                best = (mnt, dev, fstype)
    except OSError:
        pass
    return f"{best[1]} ({best[2]}, mounted on {best[0]})"


def _git_commit() -> str:
    proc = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return (proc.stdout.strip() or "unknown") + ("-dirty" if dirty else "")


def machine_facts(work_dir: Path | None = None) -> dict[str, Any]:
    """The facts a reader needs to compare numbers across machines."""
    work = work_dir or Path(os.environ.get("TMPDIR", "/tmp"))
    usage = shutil.disk_usage(work)
    return {
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory_mib": _mem_total_mib(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "work_dir": str(work),
        "work_dir_filesystem": _filesystem(work.resolve()),
        "work_dir_free_gib": round(usage.free / 2**30, 1),
        "loadavg": list(os.getloadavg()),
        "commit": _git_commit(),
    }


@dataclass
class Result:
    """One benchmark's outcome; :meth:`write` stores it as ``results/<name>.json``."""

    name: str
    title: str
    parameters: dict[str, Any]
    figures: dict[str, Any] = field(default_factory=dict)
    targets: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    files: dict[str, str] = field(default_factory=dict)
    """More output by file name (raw profiles), written next to ``<name>.json``."""

    def target(self, what: str, value: float, limit: float, unit: str, higher_is_better: bool = False) -> bool:
        """Record a target and whether ``value`` meets it."""
        ok = value >= limit if higher_is_better else value <= limit
        self.targets.append({
            "what": what, "value": round(value, 3), "limit": limit, "unit": unit,
            "comparison": ">=" if higher_is_better else "<=", "pass": ok,
        })
        return ok

    @property
    def passed(self) -> bool | None:
        return all(t["pass"] for t in self.targets) if self.targets else None

    def document(self, machine: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "duration_s": round(time.time() - self.started, 1),
            "machine": machine | {"loadavg_after": list(os.getloadavg())},
            "parameters": self.parameters,
            "figures": self.figures,
            "targets": self.targets,
            "pass": self.passed,
            "notes": self.notes,
        }

    def write(self, machine: dict[str, Any], directory: Path = RESULTS) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.name}.json"
        path.write_text(json.dumps(self.document(machine), indent=2, sort_keys=False) + "\n")
        for name, text in self.files.items():
            (directory / name).write_text(text)
        return path


def _fmt(value: float, unit: str) -> str:
    if unit in ("ms", "µs", "us"):
        text = f"{value:.2f}" if value < 100 else f"{value:.0f}"
    elif unit in ("s",):
        text = f"{value:.2f}"
    else:
        text = f"{value:g}" if value == int(value) else f"{value:.2f}"
    return f"{text} {unit}".strip()


def summary_markdown(directory: Path = RESULTS) -> str:
    """The table docs/benchmarks.md includes: one row per target (or per informational benchmark)."""
    docs = [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]
    order = {n: i for i, n in enumerate(BENCH_ORDER)}
    docs.sort(key=lambda d: order.get(d["name"], len(order)))
    lines = [
        "| Benchmark | Measure | Result | Target | Pass |",
        "|---|---|---|---|---|",
    ]
    for doc in docs:
        rows = doc.get("targets") or []
        if not rows:
            for key, text in (doc.get("figures", {}).get("headline") or {}).items():
                lines.append(f"| {doc['title']} | {key} | {text} | informational | — |")
            continue
        for t in rows:
            verdict = "yes" if t["pass"] else "**no**"
            lines.append(f"| {doc['title']} | {t['what']} | {_fmt(t['value'], t['unit'])} | "
                         f"{t['comparison']} {_fmt(t['limit'], t['unit'])} | {verdict} |")
    machines = {(d["machine"]["nproc"], d["machine"]["cpu"], d["machine"]["work_dir_filesystem"]) for d in docs}
    dates = sorted(d["date"] for d in docs)
    lines.append("")
    for nproc, cpu, fs in sorted(machines, key=str):
        lines.append(f"Machine: {nproc} CPUs ({cpu}), work directory on {fs}.")
    if dates:
        lines.append(f"Measured {dates[0][:10]}" + (f" to {dates[-1][:10]}" if dates[-1][:10] != dates[0][:10] else "")
                     + "; details and every figure in `e2e/bench/results/<name>.json`; re-run with `make bench`.")
    return "\n".join(lines) + "\n"


BENCH_ORDER = ("prepare", "mig_publish", "plugin_start", "resolution", "explain", "cel", "real_node", "grpc_floor",
               "scale", "scale-fleet")
