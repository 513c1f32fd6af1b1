"""PNG charts of the results (matplotlib, the ``[bench]`` extra; without it no PNG is written).

One chart per scenario: grouped bars per cell for the throughput scenarios (log scale, the
pgbench ceiling as a bar of its own), p50 / p99 / max bars per system for the latency ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import peers

__all__ = ["latency_chart", "throughput_chart"]

_COLORS = {
    "ceiling": "#999999",
    "queue_pg": "#1f77b4",
    "pgmq": "#ff7f0e",
    "pgqueuer": "#2ca02c",
    "procrastinate": "#d62728",
}


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label(name: str) -> str:
    return "pgbench ceiling" if name == "ceiling" else peers.get(name).label


def throughput_chart(result: dict[str, Any], path: Path) -> Path | None:
    plt = _pyplot()
    if plt is None:
        return None
    grid = [tuple(g) for g in result["parameters"]["grid"]]
    series: dict[str, list[float]] = {}
    if result["ceiling"]:
        by = {(c["batch"], c["procs"]): c.get("rate") or 0.0 for c in result["ceiling"]}
        series["ceiling"] = [by.get(g, 0.0) for g in grid]
    for name in peers.SYSTEMS:
        if name not in result["systems"]:
            continue
        by = {(c["batch"], c["procs"]): c.get("rate") or 0.0 for c in result["cells"]
              if c["system"] == name}
        series[name] = [by.get(g, 0.0) for g in grid]
    fig, ax = plt.subplots(figsize=(max(8, len(grid) * 1.1), 4.8))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(grid))]
        ax.bar(xs, [v if v > 0 else float("nan") for v in values], width,
               label=_label(name), color=_COLORS.get(name))
    who = "producers" if result["parameters"]["op"] == "send" else "consumers"
    ax.set_xticks(range(len(grid)))
    ax.set_xticklabels([f"batch {b}\n{p} {who}" for b, p in grid], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("messages / s (log)")
    ax.set_title(f"{result['scenario']}: messages per second (higher is better)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def latency_chart(
    title: str, rows: dict[str, dict[str, float | None]], path: Path, unit: str = "ms"
) -> Path | None:
    """Bars of p50 / p99 / max per label (``rows``: label -> {"p50": …, "p99": …, "max": …})."""
    plt = _pyplot()
    if plt is None or not rows:
        return None
    stats = ("p50", "p99", "max")
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 1.8), 4.2))
    width = 0.8 / len(stats)
    labels = list(rows)
    for i, stat in enumerate(stats):
        xs = [j + (i - 1) * width for j in range(len(labels))]
        vals = [rows[k].get(stat) or float("nan") for k in labels]
        ax.bar(xs, vals, width, label=stat)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel(f"{unit} (log)")
    ax.set_title(title + " (lower is better)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
