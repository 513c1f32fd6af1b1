"""Scenario "worker": job runners side by side, each through its own worker entry point with
its default settings, running the same no-op job (:mod:`bench.worker_apps`).

Systems (:mod:`bench.worker_systems`): queue_pg's ``queue-pg worker``, PgQueuer's ``pgq run``,
``procrastinate worker``, Celery's ``celery worker --pool threads`` on Redis and ``rq worker``
on Redis (Celery and RQ are "n/a (why)" where Redis does not answer). For each:

- idle latency: the workers (1 process x 16) wait on an empty queue; the parent sends one job at
  a time at ``--rate``, each stamped with ``time.time()`` just before its send; latency is the
  handler's start minus that stamp;
- throughput at 1 process x 16 and 2 processes x 8: ``--jobs`` jobs (times the system's share:
  the slow ones need fewer for a rate) are filled first, then the workers start; jobs per second
  over the time from the first handler start to the last. For the PostgreSQL systems, the
  transactions (``pg_stat_database.xact_commit`` of the system's own scratch database) and the
  WAL bytes (``pg_current_wal_lsn``: the whole server's, so other work on it counts too) from
  the workers' start to their exit, per job. With ``--runs`` > 1 the runs go in rounds, every
  system once a round, so a drift of the host falls on all of them alike; the table shows each
  cell's median, and a line per system the range of its runs.
- CPU per job, where the server runs on this host: the worker processes' own CPU (their process
  group's, from ``/proc``) and the server backends' serving the system's database, from the
  moment a tenth of the jobs has run to the last (start-up and imports left out). Unlike jobs/s,
  CPU seconds barely move when other work shares the host, so a change of a few microseconds
  per job shows through the noise of the rates.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench import Scenario, db
from bench.report import (
    DEFAULT_OUT,
    LatencySummary,
    machine_info,
    machine_line,
    markdown_table,
    redact_dsn,
    write_results,
)
from bench.throughput import logger
from bench.worker_apps import STAMPS_ENV
from bench.worker_systems import DEFAULT_REDIS, SYSTEMS, System

RESULT_NAME = "worker"
#: (processes, handlers per process) of the throughput runs; the latency run uses the first.
CONFIGS = ((1, 16), (2, 8))
ROOT = Path(__file__).resolve().parents[1]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=20_000,
                        help="no-op jobs of a throughput run at --scale 1 (default 20000)")
    parser.add_argument("--rate", type=float, default=20.0,
                        help="jobs sent per second for the idle latency (default 20)")
    parser.add_argument("--latency-jobs", type=int, default=200,
                        help="jobs of a latency run at --scale 1 (default 200)")
    parser.add_argument("--runs", type=int, default=1,
                        help="throughput runs per cell; the table shows the median (default 1)")
    parser.add_argument("--systems", default=",".join(s.name for s in SYSTEMS),
                        help="comma-separated systems (default all: "
                             + ", ".join(s.name for s in SYSTEMS) + ")")
    parser.add_argument("--redis", default=os.environ.get("QUEUE_PG_BENCH_REDIS", DEFAULT_REDIS),
                        help=f"Redis of Celery and RQ (default $QUEUE_PG_BENCH_REDIS or"
                             f" {DEFAULT_REDIS})")
    parser.add_argument("--seconds", type=float, default=None, help=argparse.SUPPRESS)


def _stamps(folder: Path) -> list[tuple[float, float | None]]:
    out: list[tuple[float, float | None]] = []
    for path in folder.glob("*.txt"):
        for line in path.read_text().split("\n"):
            parts = line.split()
            if parts:
                out.append((float(parts[0]), float(parts[1]) if len(parts) > 1 else None))
    return out


def _count(folder: Path) -> int:
    return sum(p.read_bytes().count(b"\n") for p in folder.glob("*.txt"))


TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_cpu(stat: str) -> float:
    """utime + stime of a /proc/<pid>/stat line, in seconds (the fields after the command)."""
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _group_cpu(groups: set[int]) -> float:
    """CPU seconds of the live processes in these process groups (the workers and the children
    they fork); 0.0 where /proc is not there."""
    total = 0.0
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else []:
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[2]) in groups:
            total += _proc_cpu(stat)
    return total


@contextmanager
def _workers(system: System, processes: int, concurrency: int, stamps: Path
             ) -> Iterator[set[int]]:
    """The system's worker processes, each in a process group of its own; SIGTERM at the end
    (SIGKILL to what is left after 20 s)."""
    env = {**os.environ, **system.env(), STAMPS_ENV: str(stamps),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log = stamps / "workers.log"
    procs = []
    with log.open("ab") as out:
        for argv in system.commands(processes, concurrency):
            procs.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=out,
                                          start_new_session=True))
    try:
        yield {p.pid for p in procs}
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _wait_for(stamps: Path, n: int, timeout: float, procs_log: Path) -> None:
    deadline = time.monotonic() + timeout
    while _count(stamps) < n:
        if time.monotonic() > deadline:
            tail = procs_log.read_text(errors="replace")[-2000:] if procs_log.exists() else ""
            raise RuntimeError(f"{_count(stamps)} of {n} jobs ran in {timeout:.0f}s; log:\n{tail}")
        time.sleep(0.05)


def _pg_counters(dsn: str) -> tuple[int, str]:
    with db.connect(dsn) as conn:
        row = conn.execute(
            "SELECT xact_commit, pg_current_wal_lsn()::text FROM pg_stat_database"
            " WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


def _wal_bytes(dsn: str, start: str, end: str) -> int:
    with db.connect(dsn) as conn:
        row = conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", [end, start]).fetchone()
    assert row is not None
    return int(row[0])


def _cpu_now(system: System, groups: set[int], stamps: Path
             ) -> tuple[int, float, float | None]:
    """(jobs run so far, the workers' CPU seconds, the server's for the system's database)."""
    server = db.backend_cpu(system.target) if system.postgres else None
    return _count(stamps), _group_cpu(groups), server


def measure_latency(system: System, count: int, rate: float, tmp: Path) -> dict[str, Any]:
    stamps = tmp / f"{system.name}-latency"
    stamps.mkdir()
    send, close = system.sender()
    processes, concurrency = CONFIGS[0]
    try:
        with _workers(system, processes, concurrency, stamps):
            send(time.time())  # warm-up: the workers are up once it ran
            _wait_for(stamps, 1, 120, stamps / "workers.log")
            time.sleep(1.0)  # idle: waiting on an empty queue
            began = time.time()
            t0 = time.monotonic()
            for i in range(count):
                pause = t0 + i / rate - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                send(time.time())
            _wait_for(stamps, count + 1, 60, stamps / "workers.log")
    finally:
        close()
    lat = [lat for start, lat in _stamps(stamps) if lat is not None and start - lat >= began]
    return {"latency": LatencySummary.of(lat), "sent": count, "started": len(lat),
            "processes": processes, "concurrency": concurrency}


def measure_throughput(system: System, processes: int, concurrency: int, jobs: int,
                       tmp: Path, run: int) -> dict[str, Any]:
    stamps = tmp / f"{system.name}-{processes}x{concurrency}-{run}"
    stamps.mkdir()
    system.fill(jobs)
    before = _pg_counters(system.target) if system.postgres else None
    with _workers(system, processes, concurrency, stamps) as groups:
        _wait_for(stamps, max(1, jobs // 10), 600 + jobs / 20, stamps / "workers.log")
        cpu0 = _cpu_now(system, groups, stamps)
        _wait_for(stamps, jobs, 600 + jobs / 20, stamps / "workers.log")
        cpu1 = _cpu_now(system, groups, stamps)
    starts = sorted(start for start, _ in _stamps(stamps))
    span = starts[-1] - starts[0] if len(starts) > 1 else 0.0
    out: dict[str, Any] = {
        "processes": processes, "concurrency": concurrency, "jobs": len(starts),
        "seconds": round(span, 3), "jobs_per_s": (len(starts) - 1) / span if span else None,
    }
    done = cpu1[0] - cpu0[0]  # 0 when every job ran before the first sample (a tiny run)
    out["worker_cpu_us_per_job"] = round((cpu1[1] - cpu0[1]) / done * 1e6, 1) if done else None
    out["server_cpu_us_per_job"] = (round((cpu1[2] - cpu0[2]) / done * 1e6, 1)
                                    if done and cpu0[2] is not None and cpu1[2] is not None
                                    else None)
    if before is not None:
        time.sleep(0.5)  # the exited backends' counters reach pg_stat_database
        after = _pg_counters(system.target)
        out["xact_per_job"] = round((after[0] - before[0]) / len(starts), 3)
        out["wal_bytes_per_job"] = round(_wal_bytes(system.target, before[1], after[1])
                                         / len(starts))
    return out


@contextmanager
def _target(system: type[System], args: argparse.Namespace) -> Iterator[str]:
    if system.postgres:
        with db.scratch_database(args.dsn, f"{args.database}_worker_{system.name}",
                                 keep=args.keep) as dsn:
            yield dsn
    else:
        yield args.redis


def prepare(cls: type[System], args: argparse.Namespace, stack: ExitStack, tmp: Path,
            log: Any) -> tuple[System | None, dict[str, Any]]:
    """The system installed in its scratch database (kept open on ``stack``) and its idle
    latency measured; (None, its "n/a" result) when it cannot run here."""
    missing = cls.missing(args.redis)
    if missing:
        log(f"{cls.label}: n/a ({missing})")
        return None, {"missing": missing}
    system = cls(stack.enter_context(_target(cls, args)))
    system.install()
    count = max(10, round(args.latency_jobs * args.scale))
    latency = measure_latency(system, count, args.rate, tmp)
    s: LatencySummary = latency["latency"]
    log(f"{cls.label}: idle latency p50 {s.p50_ms:.2f} ms p99 {s.p99_ms:.2f} ms")
    return system, {"latency": latency, "throughput": []}


def throughput_rounds(systems: dict[str, System], args: argparse.Namespace, tmp: Path,
                      log: Any) -> dict[str, list[dict[str, Any]]]:
    """Each system's cells, its runs interleaved with the other systems' (run 1 of every
    system, then run 2, ...): a drift of the host during the bench falls on all of them alike,
    not on whichever system ran at that moment. A cell is the median run, with every run's
    rate and their range."""
    cells: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    for processes, concurrency in CONFIGS:
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
        for i in range(args.runs):
            for name, system in systems.items():
                jobs = max(20, round(args.jobs * args.scale * system.share))
                runs[name].append(measure_throughput(system, processes, concurrency, jobs, tmp, i))
        for name, system in systems.items():
            rates = [r["jobs_per_s"] or 0.0 for r in runs[name]]
            cell = {**runs[name][0], "jobs_per_s": statistics.median(rates), "runs": rates,
                    "range": [min(rates), max(rates)]}
            for key in ("worker_cpu_us_per_job", "server_cpu_us_per_job"):
                got = [r[key] for r in runs[name] if r.get(key) is not None]
                cell[key] = statistics.median(got) if got else None
            cells[name].append(cell)
            log(f"{system.label}: {processes} x {concurrency}: {cell['jobs_per_s']:,.0f} jobs/s"
                f" ({cell['jobs']:,} jobs"
                + (f", {cell['xact_per_job']} xact/job" if "xact_per_job" in cell else "")
                + (f", CPU µs/job: worker {cell['worker_cpu_us_per_job']:.0f}"
                   if cell.get("worker_cpu_us_per_job") is not None else "")
                + (f", server {cell['server_cpu_us_per_job']:.0f}"
                   if cell.get("server_cpu_us_per_job") is not None else "") + ")")
    return cells


def table(results: dict[str, dict[str, Any]]) -> str:
    """The Markdown table the README shows: one row per system, ratios to queue_pg."""
    best = {c: max((r["throughput"][i]["jobs_per_s"] or 0 for n, r in results.items()
                    if n != "queue_pg" and "throughput" in r), default=0)
            for i, c in enumerate(CONFIGS)}
    rows: list[list[object]] = []
    for cls in SYSTEMS:
        r = results.get(cls.name)
        if r is None:
            continue
        if "missing" in r:
            rows.append([cls.label, *[f"n/a ({r['missing']})"] * 4])
            continue
        cells = []
        for i, c in enumerate(CONFIGS):
            rate = r["throughput"][i]["jobs_per_s"] or 0
            ratio = f" ({rate / best[c]:.2f}x best peer)" if cls.name == "queue_pg" and best[c] \
                else ""
            cells.append(f"{rate:,.0f}{ratio}")
        pg = [t for t in r["throughput"] if "xact_per_job" in t]
        per_job = (" / ".join(f"{t['xact_per_job']:.2f}" for t in pg) + " xact, "
                   + " / ".join(f"{t['wal_bytes_per_job']:,}" for t in pg) + " B WAL"
                   ) if pg else "— (Redis)"
        s = r["latency"]["latency"]
        rows.append([cls.label, *cells, per_job, f"{s.p50_ms:.1f} / {s.p99_ms:.1f} ms"])
    heads = ["system", "1 process x 16 jobs/s", "2 processes x 8 jobs/s",
             "per job (1x16 / 2x8)", "idle latency p50 / p99"]
    return markdown_table(heads, rows, "lrrrr")


def spread(results: dict[str, dict[str, Any]], runs: int) -> list[str]:
    """One line per system: the range of its runs in each configuration (the host's noise)."""
    if runs < 2:
        return []
    lines = []
    for cls in SYSTEMS:
        cells = results.get(cls.name, {}).get("throughput") or []
        if cells:
            ranges = ", ".join(f"{c['processes']} x {c['concurrency']} {c['range'][0]:,.0f} to"
                               f" {c['range'][1]:,.0f}" for c in cells)
            lines.append(f"- {cls.label}: runs ranged {ranges} jobs/s.")
    return [*lines, ""] if lines else []


def run(args: argparse.Namespace) -> int:
    log = logger(args.quiet)
    out_dir = Path(args.out) if args.out else DEFAULT_OUT
    wanted = {s.strip() for s in args.systems.split(",") if s.strip()}
    systems = [s for s in SYSTEMS if s.name in wanted]
    if not systems:
        raise SystemExit(f"--systems {args.systems!r}: none of " + ", ".join(
            s.name for s in SYSTEMS))
    began = time.perf_counter()
    with db.connect(args.dsn) as conn:
        machine = machine_info(conn)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-worker-") as tmp, ExitStack() as stack:
        live: dict[str, System] = {}
        for cls in systems:
            system, results[cls.name] = prepare(cls, args, stack, Path(tmp), log)
            if system is not None:
                live[cls.name] = system
        for name, cells in throughput_rounds(live, args, Path(tmp), log).items():
            results[name]["throughput"] = cells
    versions: dict[str, dict[str, Any]] = {}
    for cls in systems:
        try:
            versions[cls.name] = {"label": cls.label, "version": cls.version(), "note": cls.note}
        except Exception:
            versions[cls.name] = {"label": cls.label, "version": None, "note": cls.note}
    result: dict[str, Any] = {
        "scenario": RESULT_NAME, "command": args.command_line, "dsn": redact_dsn(args.dsn),
        "redis": args.redis, "machine": machine,
        "parameters": {"jobs": args.jobs, "scale": args.scale, "rate": args.rate,
                       "latency_jobs": args.latency_jobs, "runs": args.runs,
                       "configs": [list(c) for c in CONFIGS],
                       "shares": {c.name: c.share for c in systems}},
        "systems": versions, "results": results,
        "elapsed_s": round(time.perf_counter() - began, 1),
    }
    notes = [f"- {c.label}: {c.note}." for c in systems if c.note]
    md = "\n".join([
        "### Worker: job runners side by side, no-op jobs",
        "",
        "Each system through its own worker entry point with default settings but the"
        " concurrency, running the same no-op job. Throughput: jobs filled first, then the"
        " workers start; jobs over the time from the first handler start to the last"
        f" ({args.jobs * args.scale:,.0f} jobs, fewer for the slow systems: "
        + ", ".join(f"{c.label} x{c.share:g}" for c in systems if c.share != 1)
        + f"; median of {args.runs} run(s), each round running every system once, so the"
        " host's drift falls on all alike). Per job: PostgreSQL transactions committed in the"
        " system's database and WAL bytes written by the whole server, from the workers' start"
        f" to their exit. Idle latency: {args.latency_jobs * args.scale:,.0f} jobs sent one at"
        f" a time at {args.rate:g}/s to idle workers (1 x 16), send to handler start.",
        "",
        table(results),
        "",
        *spread(results, args.runs),
        *notes,
        "",
        f"Machine: {machine_line(machine)}.",
        "",
        f"Reproduce: `{args.command_line}`",
    ])
    for path in write_results(out_dir, RESULT_NAME, result, md):
        log(f"wrote {path}")
    return 0


SCENARIO = Scenario(
    name="worker",
    help="job runners (queue_pg, PgQueuer, Procrastinate, Celery, RQ): no-op jobs/s at"
         " 1 x 16 and 2 x 8, transactions and WAL per job, idle latency",
    add_arguments=add_arguments,
    run=run,
)
