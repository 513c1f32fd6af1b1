"""Scenario "latency": send-to-receive time for an idle long-polling consumer at a fixed rate.

One consumer process long-polls (queue_pg: ``receive(…, wait=…)``, woken by LISTEN/NOTIFY;
PGMQ: ``read_with_poll``, which re-reads in the server every 10 ms) and deletes what it gets;
the parent sends single messages at a fixed rate, each carrying the ``time.monotonic()`` of the
moment before its send call (the clock is system-wide, so two processes share it). Latency is
the consumer's clock when its receive returns minus that stamp: commit, wake-up and receive.

Two floors run beside the systems, the latency counterpart of the throughput ceiling:
``ceiling`` sends queue_pg's own statements from bare psycopg (one connection each side, the
consumer LISTENs once), so the difference to queue_pg is the Python client; ``postgres`` is the
least any durable SKIP LOCKED queue does on the machine (an INSERT with a NOTIFY, then one
UPDATE … SKIP LOCKED on a table with one index, each committed).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from psycopg import sql
from psycopg.types.json import Jsonb

from bench import Scenario, db, peers
from bench.report import (
    DEFAULT_OUT,
    LatencySummary,
    machine_info,
    machine_line,
    markdown_table,
    redact_dsn,
    write_results,
)
from bench.throughput import add_common_arguments, logger, select_systems

RESULT_NAME = "latency"
TARGET_P50_MS = 2.0
TARGET_P99_MS = 10.0
POLL_WAIT = 5.0  #: seconds each long poll may wait
CEILING = "ceiling"  #: queue_pg's statements from bare psycopg
POSTGRES = "postgres"  #: a minimal durable SKIP LOCKED queue


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, seconds=10.0)
    parser.add_argument(
        "--rate", type=float, default=50.0, help="messages sent per second (default 50)"
    )


class _SqlCeiling(peers.Driver):
    """queue_pg's statements (those of Client.send / receive / delete_batch), bare psycopg."""

    name: ClassVar[str] = CEILING
    label: ClassVar[str] = "ceiling: queue_pg's SQL, bare psycopg"

    @classmethod
    def install(cls, dsn: str) -> dict[str, Any]:
        return peers.get("queue_pg").install(dsn)

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.conn = db.connect(dsn)
        self.listening = False

    def send(self, bodies: Sequence[dict[str, Any]]) -> None:
        self.conn.execute("select queue_pg.send(%s, %s::jsonb, debounce => true)",
                          [peers.QUEUE, Jsonb(bodies[0])])

    def receive_wait(self, n: int, wait: float) -> list[tuple[Any, dict[str, Any]]]:
        """LISTEN once; then claim, and wait for a NOTIFY (or a second) while nothing comes."""
        if not self.listening:
            self.conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel())))
            self.listening = True
        deadline = time.monotonic() + wait
        while True:
            rows = self._claim(n, wait)
            left = deadline - time.monotonic()
            if rows or left <= 0:
                return rows
            for _ in self.conn.notifies(timeout=min(left, 1.0), stop_after=1):
                pass

    def _channel(self) -> str:
        row = self.conn.execute("select queue_pg.channel(%s)", [peers.QUEUE]).fetchone()
        assert row is not None
        return str(row[0])

    def _claim(self, n: int, wait: float) -> list[tuple[Any, dict[str, Any]]]:
        rows = self.conn.execute(
            "select receipt, body from queue_pg._receive(%s, %s, null, %s, false)",
            [peers.QUEUE, n, wait]).fetchall()
        return [(r, b) for r, b in rows]

    def delete(self, handles: Sequence[Any]) -> None:
        self.conn.execute("select * from queue_pg.delete_batch(%s, %s::text[])",
                          [peers.QUEUE, list(handles)])

    def close(self) -> None:
        self.conn.close()


class _BarePostgres(_SqlCeiling):
    """The least a durable SKIP LOCKED queue does: no ttl, receipts, counters or checks."""

    name: ClassVar[str] = POSTGRES
    label: ClassVar[str] = "postgres: INSERT + NOTIFY, UPDATE … SKIP LOCKED"

    @classmethod
    def install(cls, dsn: str) -> dict[str, Any]:
        with db.connect(dsn) as conn:
            conn.execute("CREATE TABLE floor_q (id bigserial PRIMARY KEY,"
                         " visible_at timestamptz NOT NULL DEFAULT now(), body jsonb NOT NULL)")
            conn.execute("CREATE INDEX ON floor_q (visible_at)")
        return {"install": "one table, one index"}

    def send(self, bodies: Sequence[dict[str, Any]]) -> None:
        self.conn.execute("WITH i AS (INSERT INTO floor_q (body) VALUES (%s) RETURNING id)"
                          " SELECT pg_notify('floor_q', ''), (SELECT id FROM i)",
                          [Jsonb(bodies[0])])

    def _channel(self) -> str:
        return "floor_q"

    def _claim(self, n: int, wait: float) -> list[tuple[Any, dict[str, Any]]]:
        rows = self.conn.execute(
            "UPDATE floor_q SET visible_at = now() + interval '30 seconds' WHERE id IN"
            " (SELECT id FROM floor_q WHERE visible_at <= now() ORDER BY visible_at"
            "  LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING id, body", [n]).fetchall()
        return [(i, b) for i, b in rows]

    def delete(self, handles: Sequence[Any]) -> None:
        self.conn.execute("DELETE FROM floor_q WHERE id = ANY(%s)", [list(handles)])


_FLOORS: dict[str, type[peers.Driver]] = {CEILING: _SqlCeiling, POSTGRES: _BarePostgres}


def _driver(system: str) -> type[peers.Driver]:
    return _FLOORS.get(system) or peers.get(system)


def _consumer(system: str, dsn: str, count: int, ready: Any, results: Any) -> None:
    try:
        driver = _driver(system)(dsn)
        driver.receive_wait(1, 0.5)  # warm the connection (and the LISTEN path)
    except BaseException:
        ready.put(traceback.format_exc())
        return
    ready.put(None)
    latencies: list[float] = []
    try:
        deadline = time.monotonic() + 120 + count
        while len(latencies) < count and time.monotonic() < deadline:
            got = driver.receive_wait(10, POLL_WAIT)
            now = time.monotonic()
            latencies += [now - float(b["t"]) for _, b in got]
            if got:
                driver.delete([h for h, _ in got])
        driver.close()
    except BaseException:
        results.put({"error": traceback.format_exc()})
        return
    results.put({"latencies": latencies})


def measure(system: str, dsn: str, rate: float, count: int) -> dict[str, Any]:
    """Send ``count`` messages at ``rate`` per second to an idle consumer; its latencies."""
    ctx = mp.get_context("fork")
    ready, results = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_consumer, args=(system, dsn, count, ready, results), daemon=True)
    proc.start()
    try:
        err = ready.get(timeout=60)
        if err:
            return {"error": err.strip().splitlines()[-1], "traceback": err}
        time.sleep(0.5)  # the consumer is now idle in its long poll
        producer = _driver(system)(dsn)
        t0 = time.monotonic()
        send_s: list[float] = []
        for i in range(count):
            due = t0 + i / rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            stamp = time.monotonic()
            producer.send([peers.body(i, t=stamp)])
            send_s.append(time.monotonic() - stamp)
        producer.close()
        out = results.get(timeout=POLL_WAIT + 60)
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
    if "error" in out:
        return {"error": out["error"].strip().splitlines()[-1], "traceback": out["error"]}
    lat = out["latencies"]
    return {
        "latency": LatencySummary.of(lat),
        "received": len(lat),
        "sent": count,
        "send_call": LatencySummary.of(send_s),
    }


def run(args: argparse.Namespace) -> int:
    log = logger(args.quiet)
    out_dir = Path(args.out) if args.out else DEFAULT_OUT
    seconds = float(args.seconds) * float(args.scale)
    count = max(20, math.ceil(seconds * args.rate))
    systems, skipped = select_systems(args)
    began = time.perf_counter()
    results: dict[str, Any] = {}
    info: dict[str, Any] = {}
    for name in [*systems, CEILING, POSTGRES]:
        driver = _driver(name)
        why = driver.unsupported("latency", 1)
        if why:
            results[name] = {"note": f"n/a ({why})"}
            continue
        with db.scratch_database(args.dsn, f"{args.database}_{name}", keep=args.keep) as dsn:
            info[name] = {"version": driver.version(), **driver.install(dsn)}
            r = measure(name, dsn, args.rate, count)
        results[name] = r
        if "latency" in r:
            s: LatencySummary = r["latency"]
            log(f"latency {name:<14} p50 {s.p50_ms:.2f} ms  p99 {s.p99_ms:.2f} ms"
                f"  max {s.max_ms:.2f} ms  ({r['received']}/{count})")
        else:
            log(f"latency {name:<14} {r.get('error')}")
    with db.connect(args.dsn) as conn:
        machine = machine_info(conn)
    ours = results.get("queue_pg", {}).get("latency")
    result: dict[str, Any] = {
        "scenario": RESULT_NAME,
        "command": args.command_line,
        "dsn": redact_dsn(args.dsn),
        "machine": machine,
        "parameters": {"rate": args.rate, "messages": count, "seconds": seconds,
                       "poll_wait_s": POLL_WAIT, "scale": args.scale},
        "systems": info,
        "skipped": skipped,
        "results": results,
        "target": {
            "p50_ms": TARGET_P50_MS,
            "p99_ms": TARGET_P99_MS,
            "met": bool(ours and ours.p50_ms < TARGET_P50_MS and ours.p99_ms < TARGET_P99_MS),
        },
        "elapsed_s": round(time.perf_counter() - began, 1),
    }
    headers = ["system", "received", "p50 ms", "p99 ms", "max ms", "send call p50 ms",
               "how it waits"]
    waits = {
        "queue_pg": "LISTEN/NOTIFY, `receive(wait=…)`",
        "pgmq": "`read_with_poll`, 10 ms server-side poll",
        CEILING: "LISTEN once, `queue_pg._receive` on NOTIFY",
        POSTGRES: "LISTEN once, `UPDATE … SKIP LOCKED` on NOTIFY",
    }
    rows: list[list[object]] = []
    for name, r in results.items():
        label = _driver(name).label
        if "latency" in r:
            s = r["latency"]
            rows.append([label, f"{r['received']}/{r['sent']}", f"{s.p50_ms:.2f}",
                         f"{s.p99_ms:.2f}", f"{s.max_ms:.2f}", f"{r['send_call'].p50_ms:.2f}",
                         waits.get(name, "")])
        else:
            rows.append([label, r.get("note") or r.get("error"), "", "", "", "", ""])
    met = "met" if result["target"]["met"] else "**missed**"
    md = "\n".join([
        "### Latency: send to receive, idle long-polling consumer",
        "",
        f"{count} single messages sent at {args.rate:g}/s by one process to one idle consumer"
        " process; time from just before the send call to the consumer's receive returning"
        " (so it includes the send's commit: the send call column).",
        "",
        markdown_table(headers, rows, "lrrrrrl"),
        "",
        "The two last rows are floors, not peers: queue_pg's own statements from bare psycopg"
        " (what the Python client adds is the difference), and the least any durable SKIP"
        " LOCKED queue does (two commits, a NOTIFY, two wake-ups).",
        "",
        f"Target (issue 3): p50 < {TARGET_P50_MS:g} ms, p99 < {TARGET_P99_MS:g} ms — {met}.",
        "",
        *[f"Not run: {k}: {v}.\n" for k, v in skipped.items()],
        f"Machine: {machine_line(machine)}.",
        "",
        f"Reproduce: `{args.command_line}`",
    ])
    paths = write_results(out_dir, RESULT_NAME, result, md)
    from bench import chart

    png = chart.latency_chart(
        "send to receive latency",
        {_driver(k).label: {"p50": v["latency"].p50_ms, "p99": v["latency"].p99_ms,
                              "max": v["latency"].max_ms}
         for k, v in results.items() if "latency" in v},
        out_dir / f"{RESULT_NAME}.png",
    )
    if png:
        paths.append(png)
    for p in paths:
        log(f"wrote {p}")
    return 0


SCENARIO = Scenario(
    name="latency",
    help="send-to-receive latency (p50/p99/max) of an idle long-polling consumer",
    add_arguments=add_arguments,
    run=run,
)
