"""The shared half of the ``send`` and ``cycle`` scenarios: a grid of (batch, processes) cells
run for every system and for the pgbench ceiling, interleaved, on one server.

Each system gets a scratch database of its own (``<database>_<system>``), all created up front so
the cells can take turns: for each (batch, processes) the ceiling and every system run one after
the other, so drift on a shared machine hits them alike. Between cells each system's tables are
emptied (send) or topped up (cycle) and ``VACUUM ANALYZE``d, outside the measured time.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

from psycopg import sql

from bench import ceiling, db, peers
from bench.report import (
    DEFAULT_OUT,
    machine_info,
    machine_line,
    markdown_table,
    redact_dsn,
    write_results,
)
from bench.runner import Cell, run_cell

__all__ = ["add_common_arguments", "cell_seconds", "logger", "run_grid", "select_systems"]

CEILING = "ceiling"
#: Guess of a system's rate before any cell measured it (sizes the first cycle fill): high
#: rather than low, since a cell that runs its queue empty is run again on a fuller one.
_FIRST_GUESS = 20_000.0
#: Most messages a fill may hold per second of the cell: above the fastest system here (the
#: floor, about 70,000 a second at batch 100), so a 5 s cell does not run its queue empty.
_MAX_FILL_RATE = 100_000
#: Most messages a fill may hold in all (about 3 GB): the cap of long cells.
_MAX_FILL = 12_000_000
_REFILLS = 2  #: re-runs of a cycle cell whose queue ran empty


def logger(quiet: bool) -> Callable[[str], None]:
    def log(msg: str) -> None:
        if not quiet:
            print(msg, flush=True)

    return log


def add_common_arguments(parser: argparse.ArgumentParser, seconds: float) -> None:
    parser.add_argument(
        "--seconds",
        type=float,
        default=seconds,
        help=f"measured seconds per cell at --scale 1 (default {seconds:g}; times --scale,"
        " at least 0.5)",
    )
    parser.add_argument(
        "--systems",
        default=",".join(peers.DEFAULT_SYSTEMS),
        help="comma-separated systems to run (default: all installed of "
        + ", ".join(peers.DEFAULT_SYSTEMS)
        + "; also " + ", ".join(s for s in peers.SYSTEMS if s not in peers.DEFAULT_SYSTEMS)
        + ")",
    )
    parser.add_argument(
        "--no-ceiling", action="store_true", help="skip the pgbench ceiling cells"
    )
    parser.add_argument(
        "--max-batch", type=int, default=None, help="leave out cells with larger batches"
    )
    parser.add_argument(
        "--max-procs", type=int, default=None, help="leave out cells with more processes"
    )
    parser.add_argument(
        "--cells",
        default=None,
        help="only these cells, as BATCHxPROCESSES, comma-separated (e.g. 10x4 for a long run"
        " of the headline cell)",
    )


def cell_seconds(args: argparse.Namespace) -> float:
    return max(0.5, float(args.seconds) * float(args.scale))


def select_systems(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    wanted = [s.strip() for s in str(args.systems).split(",") if s.strip()]
    unknown = [s for s in wanted if s not in peers.SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown system(s): {', '.join(unknown)}; known: {peers.SYSTEMS}")
    return peers.installed_systems(wanted)


def vacuum(dsn: str, tables: Sequence[str]) -> None:
    with db.connect(dsn) as conn:
        for t in tables:
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.SQL(t)))


def run_grid(
    args: argparse.Namespace,
    *,
    op: str,
    grid: Sequence[tuple[int, int]],
    result_name: str,
    title: str,
    describe: str,
    with_ceiling: bool = True,
) -> dict[str, Any]:
    """Run every cell of ``grid`` ((batch, processes) pairs) for op "send" or "cycle"; write
    ``<out>/<result_name>.json`` / ``.md`` / ``.png``; return the result."""
    log = logger(args.quiet)
    out = Path(args.out) if args.out else DEFAULT_OUT
    grid = [
        (b, p) for b, p in grid
        if (args.max_batch is None or b <= args.max_batch)
        and (args.max_procs is None or p <= args.max_procs)
        and (not args.cells or f"{b}x{p}" in args.cells.replace(" ", "").split(","))
    ]
    seconds = cell_seconds(args)
    systems, skipped = select_systems(args)
    pgbench = ceiling.find_pgbench() if with_ceiling and not args.no_ceiling else None
    if with_ceiling and not args.no_ceiling and pgbench is None:
        skipped[CEILING] = "pgbench not found"
    began = time.perf_counter()
    for name, why in skipped.items():
        log(f"{result_name}: skipping {name}: {why}")
    log(f"{result_name}: {len(grid)} cells x {len(systems)} systems, {seconds:g} s each")

    cells: list[Cell] = []
    ceilings: list[dict[str, Any]] = []
    info: dict[str, Any] = {}
    with ExitStack() as stack:
        dsns: dict[str, str] = {}
        for name in systems + ([CEILING] if pgbench else []):
            dsns[name] = stack.enter_context(
                db.scratch_database(args.dsn, f"{args.database}_{name}", keep=args.keep)
            )
            driver = peers.get("queue_pg" if name == CEILING else name)
            info[name] = {"version": driver.version(), **driver.install(dsns[name])}
            log(f"  installed {name} {info[name].get('version') or ''}")
        with db.connect(args.dsn) as conn:
            machine = machine_info(conn)
        best: dict[str, dict[int, float]] = {}
        for batch, procs in grid:
            for name in ([CEILING] if pgbench else []) + systems:
                driver = peers.get("queue_pg" if name == CEILING else name)
                dsn = dsns[name]
                seen = best.setdefault(name, {})
                unsupported = None if name == CEILING else driver.unsupported(op, batch)
                if unsupported:
                    cells.append(Cell(name, op, batch, procs, seconds, note=f"n/a ({unsupported})"))
                    continue
                # A cycle cell whose queue ran empty is run again on a fuller queue (up to
                # _REFILLS times): the pgbench ceiling cannot tell when it drained, and a
                # drained cell measured fewer seconds than it should.
                for attempt in range(_REFILLS + 1):
                    if op == "send":
                        with db.connect(dsn) as conn:
                            driver.purge(conn)
                    else:
                        _top_up(driver, dsn, seen, batch, procs, seconds, best)
                    vacuum(dsn, driver.tables())
                    with db.connect(dsn) as conn:
                        before = db.server_activity(conn, driver.tables())
                    if name == CEILING:
                        assert pgbench is not None
                        r = ceiling.run_pgbench(
                            pgbench, dsn, op, batch, procs, max(1, round(seconds))
                        )
                        r.update(batch=batch, procs=procs, attempt=attempt + 1)
                        rate, drained = r.get("rate"), bool(r.get("drained"))
                        shown = f"{rate:,.0f} msg/s" if rate else f"failed {r.get('error')}"
                        label = "pgbench"
                    else:
                        cell = run_cell(name, dsn, op, batch, procs, seconds)
                        rate, drained = cell.rate, cell.drained
                        shown = f"{rate:,.0f} msg/s" if rate else str(cell.note)
                        label = name
                    with db.connect(dsn) as conn:
                        activity = db.activity_delta(
                            before, db.server_activity(conn, driver.tables())
                        )
                    if name == CEILING:
                        r["server"] = activity
                    else:
                        cell.extra["server"] = activity
                    if rate:
                        # a drained queue held less than the rate: ask for 3 x more next time
                        seen[batch] = max(seen.get(batch, 0.0), rate * (3 if drained else 1))
                    log(f"  {op} batch {batch:>4} x {procs:>2}  {label:<14} {shown}"
                        + ("  (drained)" if drained else "")
                        + f"  [{activity_text(activity)}]")
                    if not drained or not rate:
                        break
                if name == CEILING:
                    ceilings.append(r)
                else:
                    cells.append(cell)

    result: dict[str, Any] = {
        "scenario": result_name,
        "command": args.command_line,
        "dsn": redact_dsn(args.dsn),
        "machine": machine,
        "parameters": {
            "op": op,
            "grid": [list(g) for g in grid],
            "seconds_per_cell": seconds,
            "scale": args.scale,
            "payload_bytes": peers.PAYLOAD_BYTES,
        },
        "systems": info,
        "skipped": skipped,
        "cells": [asdict(c) for c in cells],
        "ceiling": ceilings,
        "elapsed_s": round(time.perf_counter() - began, 1),
    }
    table = grid_table(result)
    md = "\n".join(
        [
            f"### {title}",
            "",
            describe.format(seconds=seconds),
            "",
            table,
            "",
            *notes(result),
            f"Machine: {machine_line(machine)}.",
            "",
            f"Reproduce: `{args.command_line}`",
        ]
    )
    paths = write_results(out, result_name, result, md)
    from bench import chart

    png = chart.throughput_chart(result, out / f"{result_name}.png")
    if png:
        paths.append(png)
    log(table)
    for p in paths:
        log(f"wrote {p}")
    return result


def _top_up(
    driver: type[peers.Driver],
    dsn: str,
    best: dict[int, float],
    batch: int,
    procs: int,
    seconds: float,
    every: dict[str, dict[int, float]],
) -> None:
    """Fill the queue to what the next cell should not run through: 1.5 x the best rate this
    system showed at this batch size (else the best any system showed at it, else its own best
    at any size, else a first guess) x the cell's seconds."""
    others = [r[batch] for r in every.values() if batch in r]
    guess = (best.get(batch) or (max(others) if others else 0.0)
             or (max(best.values()) if best else _FIRST_GUESS))
    want = min(int(min(guess, _MAX_FILL_RATE) * seconds * 1.5), _MAX_FILL) + batch * procs * 4
    with db.connect(dsn) as conn:
        have = driver.depth(conn)
    if want > have:
        driver.fill(dsn, want - have, start=int(time.time() * 1000) % 1_000_000_000)


def _rate(v: float | None) -> str:
    return f"{v:,.0f}" if v else "—"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "—"


def lookup(result: dict[str, Any]) -> tuple[dict[tuple[str, int, int], dict[str, Any]],
                                              dict[tuple[int, int], dict[str, Any]]]:
    cells = {(c["system"], c["batch"], c["procs"]): c for c in result["cells"]}
    ceil = {(c["batch"], c["procs"]): c for c in result["ceiling"]}
    return cells, ceil


def grid_table(result: dict[str, Any]) -> str:
    """One row per (batch, processes): queue_pg, the ceiling and the ratio, then each peer's
    rate and queue_pg's multiple of it."""
    cells, ceil = lookup(result)
    systems = [s for s in peers.SYSTEMS if s in result["systems"]]
    peer_names = [s for s in systems if s != "queue_pg"]
    who = "producers" if result["parameters"]["op"] == "send" else "consumers"
    headers = ["batch", who, "queue_pg msg/s"]
    if ceil:
        headers += ["pgbench ceiling", "of ceiling"]
    for p in peer_names:
        label = peers.get(p).label
        headers += [f"{label} msg/s", f"queue_pg ÷ {label}"]
    rows: list[list[object]] = []
    for batch, procs in result["parameters"]["grid"]:
        ours = cells.get(("queue_pg", batch, procs), {})
        ours_rate = ours.get("rate")
        row: list[object] = [batch, procs, _cell_text(ours)]
        if ceil:
            c = ceil.get((batch, procs), {})
            row += [_rate(c.get("rate")), _ratio(ours_rate, c.get("rate"))]
        for p in peer_names:
            cell = cells.get((p, batch, procs), {})
            row += [_cell_text(cell), _ratio(ours_rate, cell.get("rate"))]
        rows.append(row)
    return markdown_table(headers, rows, "rr" + "r" * (len(headers) - 2))


def _cell_text(cell: dict[str, Any]) -> str:
    if not cell:
        return "—"
    if cell.get("rate"):
        return _rate(cell["rate"]) + (" (drained)" if cell.get("drained") else "")
    return str(cell.get("note") or "—")


def activity_text(a: dict[str, int]) -> str:
    return (f"{a['checkpoints']} checkpoints, {a['wal_bytes'] / 2**20:,.0f} MiB WAL,"
            f" {a['vacuums']} vacuums, {a['dead_tuples_end']:,} dead tuples at the end")


def notes(result: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    long_cells = result["parameters"]["seconds_per_cell"] >= 60
    if long_cells:  # the server's side of a long run, beside its throughput
        lines += ["Server activity during each cell:", ""]
        for c in result["ceiling"]:
            if c.get("server"):
                lines += [f"- pgbench ceiling, batch {c['batch']} x {c['procs']}:"
                          f" {activity_text(c['server'])}"]
        for c in result["cells"]:
            if c["extra"].get("server"):
                lines += [f"- {peers.get(c['system']).label}, batch {c['batch']} x {c['procs']}:"
                          f" {activity_text(c['extra']['server'])}"]
        lines.append("")
    for name, why in result["skipped"].items():
        lines += [f"Not run: {name}: {why}.", ""]
    if any(c.get("drained") for c in result["cells"]):
        lines += [
            "(drained): the pre-filled queue ran empty before the deadline; the rate is the"
            " messages over the time until then.",
            "",
        ]
    if result["machine"]["server_settings"].get("autovacuum") == "off":
        lines += [
            "The server ran with `autovacuum = off`; every system's tables were `VACUUM"
            " ANALYZE`d between cells (not timed).",
            "",
        ]
    versions = ", ".join(
        f"{peers.get(s).label} {v['version']}" for s, v in result["systems"].items()
        if s != CEILING and v.get("version")
    )
    if versions:
        lines += [f"Versions: {versions}.", ""]
    return lines
