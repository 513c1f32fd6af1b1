"""Scenario "soak": a steady send + receive + delete load, with a long transaction in the middle.

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
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from dataclasses import dataclass
from typing import Any

from bench import Scenario, db
from bench.report import machine_info, machine_line, markdown_table, redact_dsn, write_results

__all__ = ["SCENARIO", "run"]

RESULT_NAME = "soak"
QUEUE = "soak"

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

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Params:
        seconds = args.seconds * args.scale
        hold = min(args.hold, seconds / 2) if args.scale < 1 else args.hold
        hold_at = args.hold_at if args.hold_at is not None else max(0.0, (seconds - hold) / 2)
        return cls(
            seconds=seconds,
            hold_at=hold_at,
            hold=hold,
            producers=args.producers,
            consumers=args.consumers,
            batch=args.batch,
            backlog=args.backlog,
            sample=args.sample,
            visibility_timeout=args.visibility_timeout,
            payload_bytes=args.payload_bytes,
            database=args.database,
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=120.0,
                        help="length of the run (default 120; 1800 for a release)")
    parser.add_argument("--hold", type=float, default=60.0,
                        help="seconds the long transaction stays open (default 60)")
    parser.add_argument("--hold-at", type=float, default=None,
                        help="when it opens (default: so that it sits in the middle)")
    parser.add_argument("--producers", type=int, default=1)
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=10, help="send and receive batch size")
    parser.add_argument("--backlog", type=int, default=2000,
                        help="producers keep about this many messages queued (default 2000)")
    parser.add_argument("--sample", type=float, default=2.0, help="seconds between samples")
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

    with queue_pg.Client(dsn, sweep_interval=None) as client:
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
        conn.execute("CREATE TABLE app_report AS SELECT g AS id FROM generate_series(1, 1000) g")
        db.fill(conn, QUEUE, p.backlog, batch_size=1000, payload_bytes=p.payload_bytes)
        db.vacuum_analyze(conn)


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
    with db.connect(dsn) as conn:
        for proc in procs:
            proc.start()
        began = time.monotonic()
        last_t, last_deleted = began, deleted.value
        hold_started: float | None = None
        next_at = began + p.sample
        while True:
            now = time.monotonic()
            if hold_started is None and now - began >= p.hold_at:
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
                dead = server["dead_tuples"]
                t = now - began
                holding = hold_started is not None and t - hold_started < p.hold + p.sample / 2
                rate = (d - last_deleted) / (now - last_t)
                samples.append({
                    "t": round(t, 2), "msgs_per_s": round(rate, 1), "deleted": d,
                    "queued": sent.value - d, "heap_bytes": heap, "index_bytes": index,
                    "live_tuples": live, "dead_tuples": dead, "vacuums": server["vacuums"],
                    "checkpoints": server["checkpoints"], "wal_bytes": server["wal_bytes"],
                    "holding": bool(holding and hold_started is not None and t >= hold_started),
                })
                mark = "  HOLD" if samples[-1]["holding"] else ""
                log(f"  {t:6.1f} s  {rate:8.0f} msg/s  heap {heap / 2**20:7.1f} MiB  index "
                    f"{index / 2**20:7.1f} MiB  dead {dead:>9}{mark}")
                last_t, last_deleted = now, d
                next_at += p.sample
            if now - began >= p.seconds:
                break
            time.sleep(min(0.05, max(0.0, next_at - time.monotonic())))
        stop.set()
        hold_stop.set()
        for proc in [*procs, holder]:
            if proc.pid is not None:
                proc.join(30)
    return samples


#: Seconds averaged for the start and end figures and for "recovered": vacuum runs every few
#: seconds on a busy queue and each run dips throughput, so single samples are read over
#: windows that span several vacuum cycles.
WINDOW = 60.0
RECOVERY_WINDOW = 20.0


def _mean(samples: list[dict[str, Any]]) -> float:
    return statistics.fmean(s["msgs_per_s"] for s in samples) if samples else float("nan")


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


SCENARIO = Scenario(
    name="soak",
    help="steady load with a 60 s open transaction in the middle: throughput, bloat, recovery",
    add_arguments=add_arguments,
    run=run,
)
