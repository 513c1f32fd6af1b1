"""The advisor's files: Parquet of every table, a Markdown summary, a PNG of the
processing-time distributions per queue; and ``apply``, which sets the advised timeouts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from queue_pg.spark.advice import CHART_QUANTILES, Advice


@dataclass(frozen=True)
class Written:
    parquet: list[Path]
    summary: Path
    chart: Path


def write(advice: Advice, out: Path) -> Written:
    """Write advice.parquet, receive_counts.parquet, quantiles.parquet, summary.md and
    processing_times.png into ``out`` (made if missing; the Parquet folders are replaced)."""
    out.mkdir(parents=True, exist_ok=True)
    tables = {
        "advice": advice.advice,
        "receive_counts": advice.receive_counts,
        "quantiles": advice.quantiles,
    }
    parquet = []
    for name, df in tables.items():
        path = out / f"{name}.parquet"
        df.coalesce(1).write.mode("overwrite").parquet(str(path))
        parquet.append(path)
    rows = [r.asDict() for r in advice.advice.collect()]
    counts = [r.asDict() for r in advice.receive_counts.collect()]
    summary = out / "summary.md"
    summary.write_text(summary_text(advice, rows, counts), encoding="utf-8")
    chart = out / "processing_times.png"
    draw(chart, {r["queue"]: r["quantiles"] for r in advice.quantiles.collect()})
    return Written(parquet, summary, chart)


def _num(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1e6 else f"{v:.0f}"
    return str(v)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def summary_text(advice: Advice, rows: list[dict[str, Any]], counts: list[dict[str, Any]]) -> str:
    """The advice as Markdown: a table per queue, the split advice, receive counts."""
    lines = [
        "# Visibility timeout advice",
        "",
        f"History finished from {advice.since.isoformat()} to {advice.until.isoformat()}.",
        "Times in seconds; processing = the final lease's work of deleted messages,"
        " waiting = enqueue to first receive.",
        "",
    ]
    head = (
        "| type | messages | samples | p50 | p95 | p99 | max | wait p50 | wait p99 | expiry rate"
        " | dead-letter rate | redeliveries | timeout now | advised | heartbeat | confidence |"
    )
    queues: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        queues.setdefault(r["queue"], []).append(r)
    for queue, group in queues.items():
        lines += [f"## {queue}", "", head, "|" + "---|" * (head.count("|") - 1)]
        for r in group:
            label = "(all types)" if r["scope"] == "queue" else (r["type"] or "(no type)")
            lines.append(
                "| "
                + " | ".join(
                    [
                        label,
                        _num(r["messages"]),
                        _num(r["samples"]),
                        _num(r["p50"]),
                        _num(r["p95"]),
                        _num(r["p99"]),
                        _num(r["max"]),
                        _num(r["wait_p50"]),
                        _num(r["wait_p99"]),
                        _pct(r["expiry_rate"]),
                        _pct(r["dead_letter_rate"]),
                        _num(r["redeliveries"]),
                        _num(r["visibility_timeout"]),
                        _num(r["recommended_timeout"]),
                        _num(r["heartbeat_interval"]),
                        r["confidence"],
                    ]
                )
                + " |"
            )
        top = group[0]
        lines.append("")
        if top["split_advised"]:
            lines.append(
                f"Split advised: the slowest type's p99 is {top['spread_ratio']:.1f}x the"
                " fastest's; give the slow types a queue (and a timeout) of their own."
            )
        elif top["spread_ratio"] is not None:
            lines.append(f"No split: the types' p99 spread is {top['spread_ratio']:.1f}x.")
        dist = [c for c in counts if c["queue"] == queue]
        if dist:
            lines.append("")
            lines.append(
                "Receive counts: "
                + ", ".join(f"{c['receive_count']}x: {c['messages']}" for c in dist)
            )
        lines.append("")
    if not queues:
        lines.append("No history in this window.")
    return "\n".join(lines) + "\n"


def draw(path: Path, quantiles: dict[str, list[float]]) -> None:
    """Each queue's processing time by quantile (log scale), one line per queue."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for queue, values in quantiles.items():
        ax.plot([max(v, 1e-3) for v in values], [100 * q for q in CHART_QUANTILES], label=queue)
    ax.set_xscale("log")
    ax.set_xlabel("processing time (s, log scale)")
    ax.set_ylabel("percent of messages done within")
    ax.set_title("Processing time per queue")
    ax.grid(True, which="both", alpha=0.3)
    if quantiles:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def apply(advice: Advice, dsn: str) -> list[tuple[str, float, float]]:
    """Set each queue's visibility_timeout to its advice (queue rows with one that differs);
    returns (queue, old, new) for each change."""
    from queue_pg import Client

    changes = [
        (r["queue"], r["visibility_timeout"], r["recommended_timeout"])
        for r in advice.advice.where("scope = 'queue'").collect()
        if r["recommended_timeout"] is not None
        and r["visibility_timeout"] is not None
        and not math.isclose(r["recommended_timeout"], r["visibility_timeout"])
    ]
    with Client(dsn, sweep_interval=None, min_size=1, max_size=1) as client:
        for queue, _, new in changes:
            client.alter_queue(queue, visibility_timeout=new)
    return changes
