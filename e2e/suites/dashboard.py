"""The Grafana dashboard in deploy/grafana and the metric families its panels query."""

from __future__ import annotations

import json
import re
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dra-driver.json"
_NAME = re.compile(r"\bdra_driver_[a-z0-9_]+")
_SAMPLE_SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def queried_metrics(path: Path = DASHBOARD) -> set[str]:
    """Every ``dra_driver_*`` series name in a panel target or a template query."""
    doc = json.loads(path.read_text())
    exprs = [t.get("expr", "") for p in doc.get("panels", []) for t in p.get("targets", [])]
    exprs += [str(v.get("definition", "")) for v in doc.get("templating", {}).get("list", [])]
    return {m for e in exprs for m in _NAME.findall(e)}


def family(sample_name: str, families: set[str]) -> str | None:
    """The exported family a queried name belongs to (``x_bucket`` → histogram ``x``), None if none."""
    if sample_name in families:
        return sample_name
    for suffix in _SAMPLE_SUFFIXES:
        if sample_name.endswith(suffix) and sample_name[: -len(suffix)] in families:
            return sample_name[: -len(suffix)]
    return None


def exported_families(page: str) -> set[str]:
    """Metric families a /metrics page declares (``# TYPE`` lines; counters without ``_total``)."""
    return {line.split()[2] for line in page.splitlines() if line.startswith("# TYPE ")}
