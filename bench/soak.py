"""Scenario "soak": a steady send + receive + delete load, with a long transaction in the middle,
or (``--minutes``) the bloat soak: the same load for that long with no long transaction, sampled
every minute.

Producer processes keep a backlog of about ``--backlog`` messages (they send batches while the
queue holds fewer); consumer processes receive a batch, then delete it (in one round trip with
``receive(delete=…)``). Every ``--sample`` seconds the main process records throughput (deletes
per second), the queue table's heap and index sizes, its live and dead tuples, autovacuum runs,
checkpoints and WAL written.

From ``--hold-at`` seconds on, another connection holds a REPEATABLE READ snapshot open for
``--hold`` seconds, reading an application table of the same database (an analytics query, a
forgotten ``BEGIN`` in psql): vacuum may then remove no row version deleted after that snapshot,
the classic cause of queue bloat. The report says how throughput and size behave during the
hold and how fast they recover after it.

Every sample also records each table group's size (table + indexes) and dead tuples: the queue
(``messages``), the history (``message_history`` and its day partitions, how many), the counters
(``queue_counters`` and the other small tables updated in place). The bloat soak judges whether
sizes plateau (the last :data:`PLATEAU` seconds grow less than 5%) and throughput holds (the last
:data:`PLATEAU` seconds at least 90% of the first), and charts both (``--chart``).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import Scenario, db
from bench.report import (
    cpu_seconds,
    machine_info,
    machine_line,
    markdown_table,
    redact_dsn,
    write_results,
)

__all__ = ["SCENARIO", "run"]

RESULT_NAME = "soak"
QUEUE = "soak"

#: Each queue_pg table's group: the queue, the history (its day partitions too), or the rest
#: (counters and the small tables updated in place).
_GROUPS_SQL = """
SELECT CASE WHEN c.relname = 'messages' THEN 'messages'
            WHEN c.relname ~ '^message_history' THEN 'history'
            ELSE 'counters' END AS grp,
       sum(pg_table_size(c.oid) + pg_indexes_size(c.oid))::bigint,
       sum(coalesce(s.n_dead_tup, 0))::bigint,
       sum(coalesce(s.autovacuum_count + s.vacuum_count, 0))::bigint,
       count(*) FILTER (WHERE c.relname ~ '^message_history_[0-9]{8}$')
FROM pg_class c
LEFT JOIN pg_stat_all_tables s ON s.relid = c.oid
WHERE c.relnamespace = 'queue_pg'::regnamespace AND c.relkind = 'r'
GROUP BY 1
"""

GROUPS = ("messages", "history", "counters")


def _groups(conn: Any) -> dict[str, dict[str, int]]:
    """Size (table + indexes, bytes), dead tuples, vacuums and day partitions of each group."""
    out = {g: {"bytes": 0, "dead": 0, "vacuums": 0, "partitions": 0} for g in GROUPS}
    for grp, size, dead, vacuums, parts in conn.execute(_GROUPS_SQL).fetchall():
        out[grp] = {"bytes": int(size), "dead": int(dead), "vacuums": int(vacuums),
                    "partitions": int(parts)}
    return out


_SIZES_SQL = """
SELECT pg_relation_size('queue_pg.messages'), pg_indexes_size('queue_pg.messages'),
       coalesce((SELECT n_live_tup FROM pg_stat_user_tables
                 WHERE relid = 'queue_pg.messages'::regclass), 0)
"""


@dataclass(frozen=True)
class Params:
    seconds: float
    hold_at: float
    hold: float
    producers: int
    consumers: int
    batch: int
    backlog: int
    sample: float
    visibility_timeout: float
    payload_bytes: int
    database: str
    history_retention: float | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Params:
        minutes = getattr(args, "minutes", None)
        seconds = (minutes * 60 if minutes is not None else args.seconds) * args.scale
        # the bloat soak (--minutes): no long transaction unless asked, a sample a minute
        hold = args.hold if args.hold is not None else (0.0 if minutes is not None else 60.0)
        hold = min(hold, seconds / 2) if args.scale < 1 else hold
        sample = args.sample if args.sample is not None else (60.0 if minutes is not None
                                                              else 2.0)
        hold_at = args.hold_at if args.hold_at is not None else max(0.0, (seconds - hold) / 2)
        return cls(
            seconds=seconds,
            hold_at=hold_at,
            hold=hold,
            producers=args.producers,
            consumers=args.consumers,
            batch=args.batch,
            backlog=args.backlog,
            sample=sample,
            visibility_timeout=args.visibility_timeout,
            payload_bytes=args.payload_bytes,
            database=args.database,
            history_retention=args.history_retention,
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=120.0,
                        help="length of the run (default 120; 1800 for a release)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="the bloat soak: this long (30 for a release), no long transaction,"
                             " a sample a minute; judged on size plateau and throughput")
    parser.add_argument("--hold", type=float, default=None,
                        help="seconds the long transaction stays open (default 60; 0 with"
                             " --minutes)")
    parser.add_argument("--hold-at", type=float, default=None,
                        help="when it opens (default: so that it sits in the middle)")
    parser.add_argument("--producers", type=int, default=1)
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=10, help="send and receive batch size")
    parser.add_argument("--backlog", type=int, default=2000,
                        help="producers keep about this many messages queued (default 2000)")
    parser.add_argument("--sample", type=float, default=None,
                        help="seconds between samples (default 2; 60 with --minutes)")
    parser.add_argument("--history-retention", type=float, default=None,
                        help="the queue's history_retention in seconds (default: the queue's)")
    parser.add_argument("--chart", type=Path, default=None,
                        help="also write the sizes and throughput chart to this PNG")
    parser.add_argument("--visibility-timeout", type=float, default=30.0)
    parser.add_argument("--payload-bytes", type=int, default=64)


def _producer(dsn: str, p: Params, sent: Any, deleted: Any, stop: Any) -> None:
    import queue_pg

    body = {"payload": "x" * p.payload_bytes}
    with queue_pg.Client(dsn, sweep_interval=None) as client:
        while not stop.is_set():
            if sent.value - deleted.value >= p.backlog:
                time.sleep(0.002)
                continue
            client.send_batch(QUEUE, [body] * p.batch)
            with sent.get_lock():
                sent.value += p.batch


def _consumer(dsn: str, p: Params, deleted: Any, stop: Any) -> None:
    import queue_pg

    # the bloat soak sweeps as a deployment does (each client once a minute: expired messages,
    # history retention and partitions, samples); the hold scenario keeps sweeps out
    sweep = None if p.hold > 0 else 60.0
    with queue_pg.Client(dsn, sweep_interval=sweep) as client:
        done: list[str] = []
        while not stop.is_set():
            got = client.receive(QUEUE, p.batch, visibility_timeout=p.visibility_timeout,
                                 wait=1, delete=done)
            if done:
                with deleted.get_lock():
                    deleted.value += len(done)
            done = [m.receipt for m in got if m.receipt is not None]
        if done:
            client.delete_batch(QUEUE, done)
            with deleted.get_lock():
                deleted.value += len(done)


def _holder(dsn: str, p: Params, ready: Any, stop: Any) -> None:
    """Holds one REPEATABLE READ snapshot for p.hold seconds, like an analytics query would."""
    with db.connect(dsn, autocommit=False) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT count(*) FROM app_report")
        ready.set()
        end = time.monotonic() + p.hold
        while time.monotonic() < end and not stop.is_set():
            time.sleep(0.2)
        conn.rollback()


def _prepare(dsn: str, p: Params) -> None:
    db.install(dsn)
    with db.connect(dsn) as conn:
        conn.execute("SELECT queue_pg.create_queue(%s, visibility_timeout => %s)",
                     [QUEUE, p.visibility_timeout])
        if p.history_retention is not None:
            conn.execute("SELECT queue_pg.alter_queue(%s, history_retention => %s)",
                         [QUEUE, p.history_retention])
        conn.execute("CREATE TABLE app_report AS SELECT g AS id FROM generate_series(1, 1000) g")
        db.fill(conn, QUEUE, p.backlog, batch_size=1000, payload_bytes=p.payload_bytes)
        db.vacuum_analyze(conn)


class _CpuMeter:
    """CPU seconds the load has used: its client processes, and the server processes of its
    database (backends, autovacuum workers), read from /proc every 0.25 s so that short-lived
    ones count too (Linux; elsewhere it stays at 0). Per message it does not move with the
    machine's other load, where messages per second do: the way to tell a slower queue from a
    busier machine."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.clients: set[int] = set()
        self._kind: dict[int, str | None] = {}
        self._last: dict[int, float] = {}
        self.used = {"clients": 0.0, "server": 0.0}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _classify(self, pid: int) -> str | None:
        if pid in self.clients:
            return "clients"
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return None
        return "server" if cmd.startswith("postgres: ") and self.database in cmd.split() else None

    def scan(self) -> None:
        if not os.path.isdir("/proc/self"):
            return
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            if pid not in self._kind:
                self._kind[pid] = self._classify(pid)
            kind = self._kind[pid]
            if kind is None:
                continue
            try:
                now = cpu_seconds(pid)
            except OSError:
                continue
            with self._lock:
                self.used[kind] += now - self._last.get(pid, 0.0)
                self._last[pid] = now

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            self.scan()

    def start(self, clients: list[int]) -> None:
        self.clients = set(clients)
        self._kind.clear()
        self.scan()
        self.used = {"clients": 0.0, "server": 0.0}  # from here on
        self._thread.start()

    def read(self) -> dict[str, float]:
        self.scan()
        with self._lock:
            return dict(self.used)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _run_load(dsn: str, p: Params, log: Any) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    sent = ctx.Value("q", p.backlog)
    deleted = ctx.Value("q", 0)
    stop = ctx.Event()
    hold_ready = ctx.Event()
    hold_stop = ctx.Event()
    procs = [ctx.Process(target=_producer, args=(dsn, p, sent, deleted, stop))
             for _ in range(p.producers)]
    procs += [ctx.Process(target=_consumer, args=(dsn, p, deleted, stop))
              for _ in range(p.consumers)]
    holder = ctx.Process(target=_holder, args=(dsn, p, hold_ready, hold_stop))
    samples: list[dict[str, Any]] = []
    meter = _CpuMeter(p.database)
    with db.connect(dsn) as conn:
        for proc in procs:
            proc.start()
        meter.start([proc.pid for proc in procs if proc.pid is not None])
        began = time.monotonic()
        last_t, last_deleted = began, deleted.value
        last_cpu = meter.read()
        hold_started: float | None = None
        next_at = began + p.sample
        while True:
            now = time.monotonic()
            if hold_started is None and p.hold > 0 and now - began >= p.hold_at:
                holder.start()
                hold_ready.wait(30)
                hold_started = time.monotonic() - began
                log(f"  {hold_started:6.1f} s: long transaction opened for {p.hold:.0f} s")
            if now >= next_at:
                d = deleted.value
                row = conn.execute(_SIZES_SQL).fetchone()
                assert row is not None
                heap, index, live = row
                server = db.server_activity(conn, ["queue_pg.messages"])
                groups = _groups(conn)
                dead = server["dead_tuples"]
                t = now - began
                holding = hold_started is not None and t - hold_started < p.hold + p.sample / 2
                rate = (d - last_deleted) / (now - last_t)
                load1 = os.getloadavg()[0]  # other work on the machine, to judge the rate by
                cpu = meter.read()
                used = {k: cpu[k] - last_cpu[k] for k in cpu}
                cpu_per_k = (sum(used.values()) * 1000 / ((d - last_deleted) / 1000)
                             if d > last_deleted else None)  # CPU ms per 1,000 messages
                samples.append({
                    "t": round(t, 2), "msgs_per_s": round(rate, 1), "deleted": d,
                    "messages": d - last_deleted,
                    "queued": sent.value - d, "heap_bytes": heap, "index_bytes": index,
                    "live_tuples": live, "dead_tuples": dead, "vacuums": server["vacuums"],
                    "checkpoints": server["checkpoints"], "wal_bytes": server["wal_bytes"],
                    "holding": bool(holding and hold_started is not None and t >= hold_started),
                    "groups": groups, "load1": round(load1, 2),
                    "cpu_seconds": {k: round(v, 3) for k, v in used.items()},
                    "cpu_ms_per_1000": None if cpu_per_k is None else round(cpu_per_k, 1),
                })
                mark = "  HOLD" if samples[-1]["holding"] else ""
                log(f"  {t:6.1f} s  {rate:8.0f} msg/s  heap {heap / 2**20:7.1f} MiB  index "
                    f"{index / 2**20:7.1f} MiB  dead {dead:>9}  load {load1:5.2f}  CPU "
                    f"{cpu_per_k or 0:6.1f} ms/1k msgs{mark}")
                last_t, last_deleted, last_cpu = now, d, cpu
                next_at += p.sample
            if now - began >= p.seconds:
                break
            time.sleep(min(0.05, max(0.0, next_at - time.monotonic())))
        stop.set()
        hold_stop.set()
        meter.stop()
        for proc in [*procs, holder]:
            if proc.pid is not None:
                proc.join(30)
    return samples


#: Seconds averaged for the start and end figures and for "recovered": vacuum runs every few
#: seconds on a busy queue and each run dips throughput, so single samples are read over
#: windows that span several vacuum cycles.
WINDOW = 60.0
RECOVERY_WINDOW = 20.0
#: The bloat soak's windows: sizes must grow < 5% over the last PLATEAU seconds, and throughput
#: then be ≥ 90% of the first PLATEAU seconds' (a third of the run when it is shorter).
PLATEAU = 600.0


def bloat_summary(samples: list[dict[str, Any]], p: Params) -> dict[str, Any]:
    """Growth of each table group over the last window, and throughput last vs first window."""
    if not samples:
        return {}
    window = min(PLATEAU, p.seconds / 3)
    last = samples[-1]
    mark = min(samples, key=lambda s: abs(s["t"] - (last["t"] - window)))
    growth: dict[str, float | None] = {}
    for g in GROUPS:
        before = mark["groups"][g]["bytes"]
        growth[g] = (last["groups"][g]["bytes"] / before - 1) if before else None
    first = [s for s in samples if s["t"] <= samples[0]["t"] + window]
    final = [s for s in samples if s["t"] > last["t"] - window]
    start, end = _mean(first), _mean(final)
    cpu_start, cpu_end = _cpu_per_k(first), _cpu_per_k(final)
    plateau = all((grow := growth[g]) is not None and grow < 0.05 for g in ("messages", "counters"))
    return {
        "window_seconds": window,
        "growth": growth,
        "plateau": plateau,
        "start_msgs_per_s": start,
        "end_msgs_per_s": end,
        "end_vs_start": end / start if start else None,
        "throughput_held": bool(start and end / start >= 0.9),
        "load_start": _mean(first, "load1"),
        "load_end": _mean(final, "load1"),
        "cpu_ms_per_1000_start": cpu_start,
        "cpu_ms_per_1000_end": cpu_end,
        "cpu_end_vs_start": cpu_end / cpu_start if cpu_start and cpu_end else None,
        "sizes_end": {g: last["groups"][g]["bytes"] for g in GROUPS},
        "dead_end": {g: last["groups"][g]["dead"] for g in GROUPS},
        "vacuums": {g: last["groups"][g]["vacuums"] - samples[0]["groups"][g]["vacuums"]
                    for g in GROUPS},
        "partitions": [samples[0]["groups"]["history"]["partitions"],
                       last["groups"]["history"]["partitions"]],
        "messages_processed": last["deleted"],
    }


def bloat_chart(samples: list[dict[str, Any]], path: Path) -> Path | None:
    """Sizes of each group and throughput over time, as a PNG (needs matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [s["t"] / 60 for s in samples]
    fig, (sizes, rate, cost) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for g in GROUPS:
        sizes.plot(minutes, [s["groups"][g]["bytes"] / 2**20 for s in samples], label=g,
                   marker=".")
    sizes.set_ylabel("table + indexes (MiB)")
    sizes.legend()
    sizes.grid(alpha=0.3)
    rate.plot(minutes, [s["msgs_per_s"] for s in samples], color="black", marker=".")
    rate.set_ylabel("messages deleted / s")
    rate.set_ylim(bottom=0)
    rate.grid(alpha=0.3)
    load = rate.twinx()  # the machine's other work: what the rate moves with on a shared host
    load.plot(minutes, [s.get("load1") for s in samples], color="tab:red", linestyle="--",
              label="load average (1 min)")
    load.set_ylabel("load average", color="tab:red")
    load.set_ylim(bottom=0)
    cost.plot(minutes, [s.get("cpu_ms_per_1000") for s in samples], color="tab:purple",
              marker=".")
    cost.set_ylabel("CPU ms / 1,000 msgs")
    cost.set_xlabel("minutes")
    cost.set_ylim(bottom=0)
    cost.grid(alpha=0.3)
    fig.suptitle("soak: send + receive + delete, batch 10, autovacuum as shipped")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _mean(samples: list[dict[str, Any]], key: str = "msgs_per_s") -> float:
    values = [s[key] for s in samples if s.get(key) is not None]
    return statistics.fmean(values) if values else float("nan")


def _cpu_per_k(samples: list[dict[str, Any]]) -> float | None:
    """CPU ms per 1,000 messages over these samples (their CPU over their messages)."""
    cpu = sum(sum(s.get("cpu_seconds", {}).values()) for s in samples)
    messages = sum(s.get("messages", 0) for s in samples)
    return float(cpu * 1000 / (messages / 1000)) if cpu and messages else None


def summarize(samples: list[dict[str, Any]], p: Params) -> dict[str, Any]:
    """Steady = mean before the hold; start / end = means over the first / last ``WINDOW``
    seconds (a fifth of the run if shorter); recovered = first moment after the hold from which
    the next ``RECOVERY_WINDOW`` seconds average ≥ 90% of steady."""
    warm = p.sample * 2
    window = min(WINDOW, p.seconds / 5)
    before = [s for s in samples if warm < s["t"] < p.hold_at]
    during = [s for s in samples if s["holding"]]
    hold_end = p.hold_at + p.hold
    after = [s for s in samples if s["t"] > hold_end + p.sample]
    steady = _mean(before)
    start = _mean([s for s in samples if warm < s["t"] <= warm + window])
    last = samples[-1]["t"] if samples else 0.0
    end = _mean([s for s in samples if s["t"] > last - window])
    recovery = None
    for i, s in enumerate(after):
        ahead = [x for x in after[i:] if x["t"] < s["t"] + RECOVERY_WINDOW]
        if ahead[-1]["t"] - s["t"] < RECOVERY_WINDOW - p.sample:
            break  # too close to the end of the run to tell
        if _mean(ahead) >= 0.9 * steady:
            recovery = round(s["t"] - p.sample - hold_end, 1)
            break

    def size(s: dict[str, Any]) -> int:
        return int(s["heap_bytes"] + s["index_bytes"])

    return {
        "steady_msgs_per_s": steady,
        "start_msgs_per_s": start,
        "end_msgs_per_s": end,
        "end_vs_start": end / start if start else None,
        "hold_min_msgs_per_s": min((s["msgs_per_s"] for s in during), default=None),
        "hold_median_msgs_per_s": (
            statistics.median(s["msgs_per_s"] for s in during) if during else None
        ),
        "hold_min_vs_steady": (
            min(s["msgs_per_s"] for s in during) / steady if during and steady else None
        ),
        "recovery_seconds": recovery,
        "size_before_hold": max((size(s) for s in before), default=None),
        "size_peak": max((size(s) for s in samples), default=None),
        "size_end": size(samples[-1]) if samples else None,
        "messages_processed": samples[-1]["deleted"] if samples else 0,
    }


def run(args: argparse.Namespace) -> int:
    p = Params.from_args(args)

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, flush=True)

    with db.scratch_database(args.dsn, p.database, keep=args.keep) as dsn:
        _prepare(dsn, p)
        with db.connect(dsn) as conn:
            machine = machine_info(conn)
        log(f"soak: {p.seconds:.0f} s, {p.producers} producer(s), {p.consumers} consumer(s), "
            f"batch {p.batch}, hold {p.hold:.0f} s at {p.hold_at:.0f} s")
        samples = _run_load(dsn, p, log)
    if p.hold <= 0:
        return _report_bloat(args, p, machine, samples, log)
    summary = summarize(samples, p)
    mib = 2**20

    def fmt(v: Any, unit: str = "") -> str:
        if v is None:
            return "n/a"
        return f"{v:,.0f}{unit}" if isinstance(v, (int, float)) else str(v)

    rows = [
        ("steady throughput before the hold (mean)", fmt(summary["steady_msgs_per_s"], " msg/s")),
        ("lowest during the 60 s snapshot", fmt(summary["hold_min_msgs_per_s"], " msg/s")
         + (f" ({summary['hold_min_vs_steady']:.0%} of steady; target ≥ 25%)"
            if summary["hold_min_vs_steady"] is not None else "")),
        ("median during the hold", fmt(summary["hold_median_msgs_per_s"], " msg/s")),
        ("recovery after it ends (next 20 s average ≥ 90% of steady)",
         fmt(summary["recovery_seconds"], " s")),
        ("end vs start throughput (means of the last and first minute)",
         f"{summary['end_vs_start']:.0%} (target ≥ 90%)"
         if summary["end_vs_start"] else "n/a"),
        ("table + index size before hold / peak / end",
         " / ".join(fmt((summary[k] or 0) / mib, " MiB")
                    for k in ("size_before_hold", "size_peak", "size_end"))),
        ("messages processed", fmt(summary["messages_processed"])),
    ]
    markdown = "\n\n".join([
        "# Soak",
        f"Machine: {machine_line(machine)}",
        f"Command: `{args.command_line}`",
        markdown_table(["figure", "value"], rows, "lr"),
    ])
    data = {"scenario": RESULT_NAME, "params": p.__dict__, "dsn": redact_dsn(args.dsn),
            "machine": machine, "summary": summary, "samples": samples}
    for path in write_results(args.out, RESULT_NAME, data, markdown):
        log(f"wrote {path}")
    log(markdown)
    return 0


def _cpu_pair(summary: dict[str, Any]) -> str:
    start, end = summary["cpu_ms_per_1000_start"], summary["cpu_ms_per_1000_end"]
    if start is None or end is None:
        return "n/a (no /proc)"
    return f"{start:,.0f} / {end:,.0f} ms ({end / start:.0%} of the first)"


def _report_bloat(args: argparse.Namespace, p: Params, machine: dict[str, Any],
                  samples: list[dict[str, Any]], log: Any) -> int:
    summary = bloat_summary(samples, p)
    mib = 2**20
    window = f"{summary['window_seconds'] / 60:.0f} min"
    server = machine.get("server_settings", {})
    rows: list[tuple[str, str]] = [
        ("server autovacuum, naptime",
         f"{server.get('autovacuum', '?')}, {server.get('autovacuum_naptime', '?')}"),
        (f"throughput, first / last {window} (mean)",
         f"{summary['start_msgs_per_s']:,.0f} / {summary['end_msgs_per_s']:,.0f} msg/s"
         + (f" ({summary['end_vs_start']:.0%}; target ≥ 90%)"
            if summary["end_vs_start"] is not None else " (no messages in the first window)")),
        (f"load average (1 min), first / last {window} (mean; 2 cores)",
         f"{summary['load_start']:.1f} / {summary['load_end']:.1f}"),
        (f"CPU per 1,000 messages (clients + their server processes), first / last {window}",
         _cpu_pair(summary)),
    ]
    for g in GROUPS:
        grow = summary["growth"][g]
        rows.append((f"{g}: size at the end, growth over the last {window}",
                     f"{summary['sizes_end'][g] / mib:,.1f} MiB, "
                     + (f"{grow:+.1%}" if grow is not None else "n/a")
                     + (" (target < 5%)" if g != "history" else " (grows until retention)")))
        rows.append((f"{g}: dead tuples at the end, vacuums during the run",
                     f"{summary['dead_end'][g]:,} / {summary['vacuums'][g]}"))
    rows.append(("history day partitions, start / end",
                 " / ".join(str(n) for n in summary["partitions"])))
    rows.append(("messages processed", f"{summary['messages_processed']:,}"))
    table = markdown_table(
        ["minute", "msg/s", *[f"{g} MiB" for g in GROUPS], "messages dead", "load (1 min)",
         "CPU ms / 1k msgs"],
        [(f"{s['t'] / 60:.1f}", f"{s['msgs_per_s']:,.0f}",
          *[f"{s['groups'][g]['bytes'] / mib:,.1f}" for g in GROUPS],
          f"{s['groups']['messages']['dead']:,}", f"{s.get('load1', float('nan')):.1f}",
          "-" if s.get("cpu_ms_per_1000") is None else f"{s['cpu_ms_per_1000']:,.0f}")
         for s in samples],
        "rrrrrrrr")
    markdown = "\n\n".join([
        "# Soak (bloat)",
        f"Machine: {machine_line(machine)}",
        f"Command: `{args.command_line}`",
        markdown_table(["figure", "value"], rows, "lr"),
        table,
    ])
    data = {"scenario": RESULT_NAME, "params": p.__dict__, "dsn": redact_dsn(args.dsn),
            "machine": machine, "summary": summary, "samples": samples}
    for path in write_results(args.out, RESULT_NAME, data, markdown):
        log(f"wrote {path}")
    if args.chart is not None and bloat_chart(samples, args.chart) is not None:
        log(f"wrote {args.chart}")
    log(markdown)
    return 0


SCENARIO = Scenario(
    name="soak",
    help="steady load with a 60 s open transaction in the middle (or --minutes N: the bloat"
         " soak): throughput, bloat, recovery",
    add_arguments=add_arguments,
    run=run,
)
