"""``python -m bench all``: every scenario in one session on one server, then one summary.

Runs send, cycle, latency, worker, leased-head, client-cpu (and soak, when :mod:`bench.soak`
exists and defines ``SCENARIO``), each with its own defaults and the shared options given here,
then writes ``<out>/summary.md``: one table, each scenario's cells x systems, with queue_pg's
fraction of the pgbench ceiling and its multiple of each peer.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import Scenario, peers
from bench.report import DEFAULT_OUT, machine_line, markdown_table
from bench.throughput import lookup

__all__ = ["scenario", "summary_markdown"]

#: Scenario names in the order ``all`` runs them (soak added when present).
ORDER = ("send", "cycle", "latency", "worker", "worker-cpu", "leased-head", "client-cpu")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="measured seconds per cell for every scenario that has cells (default: each"
        " scenario's own)",
    )
    parser.add_argument(
        "--systems",
        default=None,
        help="comma-separated systems for the scenarios with peers (default: all installed)",
    )
    parser.add_argument("--no-ceiling", action="store_true", help="skip the pgbench cells")
    parser.add_argument("--max-batch", type=int, default=None, help="for send and cycle")
    parser.add_argument("--max-procs", type=int, default=None, help="for send and cycle")
    parser.add_argument(
        "--skip", default="", help="comma-separated scenarios to leave out (e.g. leased-head)"
    )


def _soak() -> Scenario | None:
    try:
        module = importlib.import_module("bench.soak")
    except ImportError:
        return None
    scenario = getattr(module, "SCENARIO", None)
    return scenario if isinstance(scenario, Scenario) else None


def run(args: argparse.Namespace, main: Callable[[Sequence[str]], int],
        scenario_names: Callable[[], list[str]]) -> int:
    """Every scenario of ``scenario_names`` in ORDER, each run by ``main`` (the command line)."""
    out = Path(args.out) if args.out else DEFAULT_OUT
    skip = {s.strip() for s in str(args.skip).split(",") if s.strip()}
    names = [n for n in ORDER if n in scenario_names()]
    soak = _soak()
    if soak is not None and soak.name not in names:
        names.append(soak.name)
    began = time.perf_counter()
    status = 0
    ran: list[str] = []
    for name in names:
        if name in skip:
            continue
        argv = [name, "--dsn", args.dsn, "--scale", repr(args.scale), "--out", str(out),
                "--database", args.database]
        if args.keep:
            argv.append("--keep")
        if args.quiet:
            argv.append("--quiet")
        if name in ("send", "cycle", "latency") and args.seconds is not None:
            argv += ["--seconds", repr(args.seconds)]
        if name in ("send", "cycle", "latency", "worker") and args.systems:
            argv += ["--systems", args.systems]
        if name in ("send", "cycle"):
            if args.no_ceiling:
                argv.append("--no-ceiling")
            for opt in ("max_batch", "max_procs"):
                if getattr(args, opt) is not None:
                    argv += ["--" + opt.replace("_", "-"), str(getattr(args, opt))]
        if not args.quiet:
            print(f"=== {name} ===", flush=True)
        try:
            rc = main(argv)
        except Exception as exc:  # one scenario failing still leaves the others' results
            print(f"{name} failed: {exc!r}", flush=True)
            rc = 1
        status = status or rc
        ran.append(name)
    md = summary_markdown(out, args.command_line, time.perf_counter() - began)
    path = out / "summary.md"
    path.write_text(md, encoding="utf-8")
    if not args.quiet:
        print(md)
        print(f"wrote {path}")
    return status


# --- the summary ----------------------------------------------------------------------------------


def _load(out: Path, name: str) -> dict[str, Any] | None:
    path = out / f"{name}.json"
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _num(v: float | None, unit: str = "") -> str:
    if v is None:
        return "—"
    return f"{v:,.0f}{unit}" if v >= 100 else f"{v:.2f}{unit}"


def _with_ratio(value: float | None, ratio: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    return _num(value, unit) + (f" ({ratio:.2f}x)" if ratio else "")


def summary_markdown(out: Path, command: str, elapsed: float) -> str:
    peer_names = [s for s in peers.DEFAULT_SYSTEMS if s != "queue_pg"]
    headers = ["scenario", "cell", "queue_pg", "pgbench ceiling (queue_pg ÷)"]
    headers += [f"{peers.get(p).label} (queue_pg better by)" for p in peer_names]
    rows: list[list[object]] = []
    machine: dict[str, Any] | None = None

    for name, unit_label in (("send", "producers"), ("cycle", "consumers")):
        r = _load(out, name)
        if r is None:
            continue
        machine = machine or r["machine"]
        cells, ceil = lookup(r)
        for batch, procs in r["parameters"]["grid"]:
            ours = cells.get(("queue_pg", batch, procs), {}).get("rate")
            c = ceil.get((batch, procs), {}).get("rate")
            row: list[object] = [
                f"{name} msg/s",
                f"batch {batch}, {procs} {unit_label}",
                _num(ours),
                _with_ratio(c, ours / c if ours and c else None) if ceil else "not run",
            ]
            for p in peer_names:
                if p not in r["systems"]:
                    row.append(r["skipped"].get(p, "not run"))
                    continue
                cell = cells.get((p, batch, procs), {})
                theirs = cell.get("rate")
                row.append(
                    _with_ratio(theirs, ours / theirs if ours and theirs else None)
                    if theirs else str(cell.get("note") or "—")
                )
            rows.append(row)

    lat = _load(out, "latency")
    if lat is not None:
        machine = machine or lat["machine"]
        res = lat["results"]
        ours_l = res.get("queue_pg", {}).get("latency")
        for stat in ("p50_ms", "p99_ms", "max_ms"):
            mine = ours_l[stat] if ours_l else None
            floor = res.get("ceiling", {}).get("latency")
            row = ["latency, send → receive (ceiling: its SQL from bare psycopg)",
                   stat.replace("_ms", "") + " ms", _num(mine),
                   _with_ratio(floor[stat], mine / floor[stat]) if floor and mine else "—"]
            for p in peer_names:
                r_p = res.get(p)
                if r_p is None:
                    row.append(lat["skipped"].get(p, "not run"))
                elif "latency" in r_p:
                    theirs = r_p["latency"][stat]
                    row.append(_with_ratio(theirs, theirs / mine if mine else None))
                else:
                    row.append(str(r_p.get("note") or r_p.get("error")))
            rows.append(row)

    wk = _load(out, "worker")
    if wk is not None and "queue_pg" in wk.get("results", {}):
        machine = machine or wk["machine"]
        ours_w = wk["results"]["queue_pg"]
        rest = ["see worker.md"] * len(peer_names)
        lw = ours_w["latency"]["latency"]
        rows.append(["worker", "send → handler start p50 / p99 ms",
                     f"{lw['p50_ms']:.2f} / {lw['p99_ms']:.2f}", "—", *rest])
        for t in ours_w["throughput"]:
            rows.append(["worker jobs/s",
                         f"no-op tasks, {t['processes']} process(es) x {t['concurrency']}",
                         _num(t["jobs_per_s"]), "—", *rest])

    lh = _load(out, "leased_head")
    if lh is not None:
        machine = machine or lh["machine"]
        ratios = lh["ratios_leased_over_empty"]
        client = lh["client"]
        row = ["leased head", "receive(10) p50 ms, leased ÷ empty head",
               f"{client['leased_head']['receive']['p50_ms']:.3f} ({ratios['client_p50']:.2f}x)",
               "—"]
        peers_lh = lh.get("peers", {})
        for p in peer_names:
            pr = peers_lh.get(p)
            if not pr:
                row.append("not run")
            elif "note" in pr:
                row.append(str(pr["note"]))
            else:
                theirs = pr["leased_p50_ms"]
                mine = client["leased_head"]["receive"]["p50_ms"]
                row.append(f"{theirs:.3f} ({theirs / mine:.2f}x)")
        rows.append(row)

    cc = _load(out, "client_cpu")
    if cc is not None:
        machine = machine or cc["machine"]
        for r in cc["results"]:
            ours, base = r["queue_pg"]["cpu_us"], r["psycopg"]["cpu_us"]
            rows.append(["client CPU µs per receive", f"batch {r['batch']} (ceiling: bare psycopg)",
                         f"{ours:,.1f}", f"{base:,.1f} ({ours / base:.2f}x)",
                         *["not measured"] * len(peer_names)])

    lines = [
        "## Benchmark summary",
        "",
        "Ratios: against the ceiling, queue_pg's fraction of pgbench running the same"
        " statements; against a peer, how many times better queue_pg is (throughput: ours ÷"
        " theirs, latency: theirs ÷ ours; above 1 means queue_pg is ahead). Details, per-call"
        " times and the exact commands: the scenario files beside this one.",
        "",
        markdown_table(headers, rows, "ll" + "r" * (len(headers) - 2)),
        "",
    ]
    if machine is not None:
        settings = machine.get("server_settings", {})
        lines += [
            f"Machine: {machine_line(machine)}.",
            "",
            "Server settings: " + ", ".join(f"{k} {v}" for k, v in settings.items()) + ".",
            "",
        ]
    lines += [f"Reproduce ({elapsed / 60:.0f} minutes): `{command}`", ""]
    return "\n".join(lines)


def scenario(main: Callable[[Sequence[str]], int],
             scenario_names: Callable[[], list[str]]) -> Scenario:
    """``all``, running the other scenarios through ``main``: the command line that lists them
    hands itself in, so this module needs no import of it."""
    return Scenario(
        name="all",
        help="every scenario in one session, then summary.md (one table) and the PNG charts",
        add_arguments=add_arguments,
        run=lambda args: run(args, main, scenario_names),
    )
