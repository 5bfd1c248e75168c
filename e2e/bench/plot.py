"""Pictures of benchmark results, for docs/benchmarks.md and docs/scale.md: the prepare-latency distribution, the scale curve.

matplotlib is a dev extra; without it the benchmark still runs and says the plot was skipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from e2e.bench.common import percentile


def plot_latency(series: Mapping[str, Sequence[float]], path: Path, title: str) -> Path:
    """Histograms (log-spaced bins, ms) of each named sample set, p50 and p99 marked; a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    import numpy as np

    values = [v for s in series.values() for v in s if v > 0]
    bins = np.geomspace(min(values) * 0.9, max(values) * 1.1, 60)
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=100)
    for (label, samples), colour in zip(series.items(), ("#1f77b4", "#ff7f0e", "#2ca02c"), strict=False):
        p50, p99 = percentile(list(samples), 50), percentile(list(samples), 99)
        ax.hist(samples, bins=bins, alpha=0.6, color=colour,
                label=f"{label} (n={len(samples)}, p50 {p50:.2f} ms, p99 {p99:.2f} ms)")
        for q, style in ((p50, "-"), (p99, "--")):
            ax.axvline(q, color=colour, linestyle=style, linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("milliseconds (log scale); solid line p50, dashed p99")
    ax.set_ylabel("claims")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_scale_curve(runs: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """The scale bench's curve against GPU nodes: start-up and first claim, controller RSS, per-claim
    latencies, and throughput beside the kube-scheduler's; a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = [r["nodes"] for r in runs]

    def series(get: Any) -> tuple[list[float], list[float]]:
        xs, ys = [], []
        for n, r in zip(nodes, runs, strict=True):
            try:
                value = get(r)
            except (KeyError, IndexError, TypeError):
                continue
            if value is not None:
                xs.append(n)
                ys.append(float(value))
        return xs, ys

    def p50(probes: Sequence[Mapping[str, Any]]) -> float | None:
        vals = [p["latency_s"] * 1000 for p in probes if p.get("latency_s") is not None]
        return percentile(vals, 50) if vals else None

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), dpi=100)
    panels: list[tuple[Any, str, list[tuple[str, Any]]]] = [
        (axes[0][0], "seconds", [
            ("startup: spawn -> first pending claim explained", lambda r: r["startup"]["explained_s"]),
            ("spawn -> informers synced", lambda r: r["startup"]["synced_s"]),
            ("first claim after start", lambda r: r["first_claim"]["latency_s"])]),
        (axes[0][1], "MiB", [
            ("controller RSS, synced (all objects)", lambda r: r["rss_samples"][-1]["rss_mib"]),
            ("first claim: caches built", lambda r: r["first_claim"]["cache_mib"])]),
        (axes[1][0], "ms (p50)", [
            ("resolve one fitting claim", lambda r: p50(r["fit_probes"])),
            ("explain one unsatisfiable claim", lambda r: p50(r["explain_probes"]))]),
        (axes[1][1], "per second", [
            ("kube-scheduler: pods bound/s", lambda r: r["fill"]["pods_per_s"]),
            ("our controller: backlog claims explained/s", lambda r: r["backlog"]["claims_per_s"])]),
    ]
    for ax, unit, lines in panels:
        for label, get in lines:
            xs, ys = series(get)
            if xs:
                ax.plot(xs, ys, marker="o", label=label)
        ax.set_xlabel("GPU nodes (plus one dynamic-MIG node per ten)")
        ax.set_ylabel(unit)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Scale bench: our controller on the real control plane with kwok nodes")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
