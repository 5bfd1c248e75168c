"""Pictures of benchmark results, for docs/benchmarks.md: the prepare-latency distribution.

matplotlib is a dev extra; without it the benchmark still runs and says the plot was skipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

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
