"""Scenario "leased head": receive time with many in-flight messages ahead of the visible ones.

Two queues in one scratch database:

- ``leased_head``: 1,100,000 messages sent, then the first 100,000 received with a long lease, so
  100,000 in-flight messages sit ahead of 1,000,000 visible ones (a read walking the id order
  would pass all of them before the first message it may take);
- ``empty_head``: the same 1,000,000 visible messages, none in flight.

The scenario measures ``receive(max_messages=10)`` through the Python client
(``queue_pg.Client``) after ``VACUUM ANALYZE``, each receive followed by ``delete_batch`` of what
it got, in alternating blocks on the two queues so drift (autovacuum, checkpoints, the other
core's load) hits both alike. The server side, ``EXPLAIN (ANALYZE, BUFFERS)`` of the whole
``queue_pg.receive`` call and (through ``auto_explain``) of the claim query inside it, all rolled
back, is taken three times: before the vacuum (dead index entries of the leased rows' old
versions still in place), after it, and after the client loop. As a control it also EXPLAINs an
id-ordered claim (what a naive queue runs) to show that the scenario does put work in the way of
such a read. The figure of merit is leased / empty head: the target is within 2x.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from psycopg import sql

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

__all__ = ["SCENARIO", "Params", "run"]

RESULT_NAME = "leased_head"
LEASED = "leased_head"
EMPTY = "empty_head"
WARMUP = "warmup"  #: a small third queue that warms each measuring session
TARGET_RATIO = 2.0

#: The read a naive queue runs (oldest id first, visibility as a filter), for the control. The
#: ``id >= first id of the queue`` bound makes it read as if the queue had a table of its own
#: (as PGMQ's do), so the other queue's rows are not counted against it.
NAIVE_CLAIM = (
    "SELECT m.id FROM queue_pg.messages m"
    " WHERE m.queue_id = {qid} AND m.id >= {first_id} AND m.visible_at <= now()"
    " ORDER BY m.id LIMIT {n} FOR UPDATE SKIP LOCKED"
)


@dataclass(frozen=True)
class Params:
    scale: float
    visible: int  #: visible messages in each queue
    in_flight: int  #: leased messages ahead of them in the leased-head queue
    receives: int  #: measured receives per queue
    max_messages: int
    warmup: int  #: unmeasured receives per queue first
    block: int  #: receives in a row on one queue before switching to the other
    explain_runs: int  #: EXPLAIN ANALYZE runs per queue and measurement
    lease_seconds: float  #: visibility timeout of the in-flight messages
    payload_bytes: int
    fill_batch: int
    database: str

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Params:
        visible = max(1000, round(1_000_000 * args.scale))
        max_messages = args.max_messages
        # never drain more than half of a queue: the head must stay as the scenario describes
        receives = max(1, min(args.receives, visible // (2 * max_messages)))
        return cls(
            scale=args.scale,
            visible=visible,
            in_flight=max(100, round(100_000 * args.scale)),
            receives=receives,
            max_messages=max_messages,
            warmup=args.warmup,
            block=args.block,
            explain_runs=args.explain_runs,
            lease_seconds=43_200.0,
            payload_bytes=args.payload_bytes,
            fill_batch=10_000,
            database=args.database,
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--receives",
        type=int,
        default=2000,
        help="measured receives per queue (default 2000; capped at half the visible messages)",
    )
    parser.add_argument(
        "--max-messages", type=int, default=10, help="max_messages of each receive (default 10)"
    )
    parser.add_argument(
        "--warmup", type=int, default=100, help="unmeasured receives per queue (default 100)"
    )
    parser.add_argument(
        "--block", type=int, default=50, help="receives per turn on one queue (default 50)"
    )
    parser.add_argument(
        "--explain-runs",
        type=int,
        default=30,
        help="EXPLAIN ANALYZE runs per queue and measurement (default 30)",
    )
    parser.add_argument(
        "--payload-bytes", type=int, default=64, help="size of each body's padding (default 64)"
    )
    parser.add_argument(
        "--no-peers", action="store_true", help="leave out the peers (PGMQ) measured alike"
    )


# --- measurements -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientFigures:
    """The client-side loop on one queue."""

    receive: LatencySummary  #: latency of receive(max_messages) alone
    delete: LatencySummary  #: latency of the delete_batch after it
    messages: int  #: messages received (and deleted)
    short_receives: int  #: receives that got fewer than max_messages (should be 0)
    receive_msgs_per_s: float  #: messages / total receive time
    cycle_msgs_per_s: float  #: messages / total receive + delete time


@dataclass(frozen=True)
class ServerFigures:
    """Server-side times of one queue, from EXPLAIN ANALYZE, in milliseconds."""

    receive_first_ms: float  #: the session's first receive (cold caches, hint bits, dead entries)
    receive_p50_ms: float  #: Execution Time of ``SELECT * FROM queue_pg.receive(q, n)``
    receive_mean_ms: float
    receive_max_ms: float
    receive_buffers: dict[str, int]  #: of the median run
    claim_p50_ms: float | None  #: the claim SELECT inside _claim, via auto_explain
    claim_mean_ms: float | None
    claim_buffers: dict[str, int] | None
    claim_plan: str | None  #: auto_explain's text of the median run
    receive_plan: str


def _client_loop(dsn: str, p: Params) -> dict[str, ClientFigures]:
    from queue_pg import Client

    queues = (LEASED, EMPTY)
    recv: dict[str, list[float]] = {q: [] for q in queues}
    dele: dict[str, list[float]] = {q: [] for q in queues}
    got = dict.fromkeys(queues, 0)
    short = dict.fromkeys(queues, 0)

    # One connection, no periodic sweep: the figures are receive's alone.
    with Client(dsn, min_size=1, max_size=1, sweep_interval=None) as client:

        def once(queue: str, record: bool) -> None:
            t0 = time.perf_counter()
            msgs = client.receive(queue, p.max_messages)
            t1 = time.perf_counter()
            receipts = [m.receipt for m in msgs if m.receipt is not None]
            if receipts:
                client.delete_batch(queue, receipts)
            t2 = time.perf_counter()
            if record:
                recv[queue].append(t1 - t0)
                dele[queue].append(t2 - t1)
                got[queue] += len(msgs)
                short[queue] += len(msgs) < p.max_messages

        for queue in queues:
            for _ in range(p.warmup):
                once(queue, record=False)
        done = 0
        turn = 0
        while done < p.receives:
            n = min(p.block, p.receives - done)
            order = queues if turn % 2 == 0 else queues[::-1]
            for queue in order:
                for _ in range(n):
                    once(queue, record=True)
            done += n
            turn += 1

    out = {}
    for q in queues:
        r, d = sum(recv[q]), sum(dele[q])
        out[q] = ClientFigures(
            receive=LatencySummary.of(recv[q]),
            delete=LatencySummary.of(dele[q]),
            messages=got[q],
            short_receives=short[q],
            receive_msgs_per_s=got[q] / r if r else 0.0,
            cycle_msgs_per_s=got[q] / (r + d) if r + d else 0.0,
        )
    return out


def _median_index(values: Sequence[float]) -> int:
    order = sorted(range(len(values)), key=lambda i: values[i])
    return order[len(order) // 2]


def _receive_sql(queue: str, max_messages: int) -> sql.Composed:
    return sql.SQL("SELECT * FROM queue_pg.receive({}, {})").format(
        sql.Literal(queue), sql.Literal(max_messages)
    )


def _server_side(dsn: str, p: Params) -> dict[str, ServerFigures]:
    """EXPLAIN ANALYZE of receive on each queue (rolled back), then of the claim inside it
    through auto_explain.

    Each queue gets a session of its own, first warmed on a third queue so that its first
    measured call pays for the data only, not for compiling the functions. The two sessions
    take turns, so drift (checkpoints, the other core's load) hits both queues alike. The
    first ``warm`` runs fill the plan cache (PL/pgSQL may switch to a generic plan after five
    executions): the figures are the steady state a long-lived client connection gets.
    """
    queues = (LEASED, EMPTY)
    warm = 8
    first: dict[str, float] = {}
    runs: dict[str, list[db.ExplainRun]] = {q: [] for q in queues}
    claims: dict[str, list[db.NestedPlan]] = {q: [] for q in queues}
    with ExitStack() as stack:
        conns = {q: stack.enter_context(db.connect(dsn, autocommit=False)) for q in queues}
        calls = {q: _receive_sql(q, p.max_messages) for q in queues}
        for conn in conns.values():
            for _ in range(3):
                conn.execute(_receive_sql(WARMUP, p.max_messages)).fetchall()
                conn.rollback()
        for i in range(warm + p.explain_runs):
            for q in queues if i % 2 == 0 else queues[::-1]:
                run = db.explain_analyze(conns[q], calls[q])
                conns[q].rollback()
                if i == 0:
                    first[q] = run.execution_ms
                if i >= warm:
                    runs[q].append(run)
        nested = {q: stack.enter_context(db.nested_plans(conns[q])) for q in queues}
        for i in range(warm + p.explain_runs):
            for q in queues if i % 2 == 0 else queues[::-1]:
                plans = nested[q]
                if plans is None:
                    continue  # auto_explain not loadable: no claim figures
                plans.clear()
                conns[q].execute(calls[q]).fetchall()
                conns[q].rollback()
                claim = next((x for x in plans if "SKIP LOCKED" in x.text), None)
                if i >= warm and claim is not None:
                    claims[q].append(claim)
    return {q: _server_figures(first[q], runs[q], claims[q]) for q in queues}


def _server_figures(
    first: float, runs: list[db.ExplainRun], claims: list[db.NestedPlan]
) -> ServerFigures:
    times = [r.execution_ms for r in runs]
    mid = runs[_median_index(times)]
    claim_mid = claims[_median_index([c.duration_ms for c in claims])] if claims else None
    return ServerFigures(
        receive_first_ms=first,
        receive_p50_ms=statistics.median(times),
        receive_mean_ms=statistics.fmean(times),
        receive_max_ms=max(times),
        receive_buffers=mid.buffers,
        claim_p50_ms=statistics.median(c.duration_ms for c in claims) if claims else None,
        claim_mean_ms=statistics.fmean(c.duration_ms for c in claims) if claims else None,
        claim_buffers=claim_mid.buffers if claim_mid else None,
        claim_plan=claim_mid.text if claim_mid else None,
        receive_plan=mid.plan,
    )


_REMOVED = re.compile(r"Rows Removed by Filter: (\d+)")


def _naive_control(conn: db.Connection, queue_id: int, first_id: int, p: Params) -> dict[str, Any]:
    """EXPLAIN ANALYZE of an id-ordered claim (rolled back): what the leased head costs a read
    that does not skip it. Not queue_pg's query; it shows the scenario is a real obstacle."""
    query = sql.SQL(NAIVE_CLAIM).format(
        qid=sql.Literal(queue_id), first_id=sql.Literal(first_id), n=sql.Literal(p.max_messages)
    )
    runs = []
    for _ in range(5):
        runs.append(db.explain_analyze(conn, query))
        conn.rollback()
    mid = runs[_median_index([r.execution_ms for r in runs])]
    removed = _REMOVED.search(mid.plan)
    return {
        "execution_p50_ms": statistics.median(r.execution_ms for r in runs),
        "rows_removed_by_filter": int(removed.group(1)) if removed else 0,
        "buffers": mid.buffers,
        "plan": mid.plan,
    }


def _queue_state(conn: db.Connection) -> dict[str, dict[str, Any]]:
    rows = conn.execute(
        "SELECT queue, visible, in_flight, delayed FROM queue_pg.queue_stats"
        " WHERE queue = ANY (%s)",
        [[LEASED, EMPTY]],
    ).fetchall()
    return {str(r[0]): {"visible": r[1], "in_flight": r[2], "delayed": r[3]} for r in rows}


# --- the run ------------------------------------------------------------------------------------


@dataclass
class _Setup:
    """What the preparation did and found."""

    timings: dict[str, float]
    install: str
    queue_ids: dict[str, int]
    first_ids: dict[str, int]  #: lowest message id of each queue
    leased_ids: dict[str, int | None]
    unvacuumed: dict[str, ServerFigures]  #: server side before VACUUM


def _prepare(dsn: str, p: Params, log: Callable[[str], None]) -> _Setup:
    """Install, create and fill the queues, lease the head, measure once, then VACUUM ANALYZE."""
    timings: dict[str, float] = {}
    how = db.install(dsn)
    log(f"installed queue_pg ({how})")
    with db.connect(dsn) as conn:
        for q in (LEASED, EMPTY, WARMUP):
            conn.execute("SELECT queue_pg.create_queue(%s)", [q])
        qids = dict(conn.execute("SELECT name, id FROM queue_pg.queues").fetchall())
        # the leased queue first: its in-flight messages hold the lowest ids of the table
        total = p.visible + p.in_flight
        timings["fill_leased_s"] = db.fill(
            conn, LEASED, total, batch_size=p.fill_batch, payload_bytes=p.payload_bytes
        )
        log(f"filled {LEASED}: {total:,} in {timings['fill_leased_s']:.1f} s")
        t = time.perf_counter()
        leased = db.lease(conn, LEASED, p.in_flight, visibility_timeout=p.lease_seconds)
        timings["lease_s"] = time.perf_counter() - t
        log(f"leased {leased:,} at the head of {LEASED} in {timings['lease_s']:.1f} s")
        timings["fill_empty_s"] = db.fill(
            conn, EMPTY, p.visible, batch_size=p.fill_batch, payload_bytes=p.payload_bytes
        )
        log(f"filled {EMPTY}: {p.visible:,} in {timings['fill_empty_s']:.1f} s")
        db.fill(conn, WARMUP, 1000, payload_bytes=p.payload_bytes)
        first_ids = dict(
            conn.execute(
                "SELECT q.name, min(m.id) FROM queue_pg.queues q"
                " JOIN queue_pg.messages m ON m.queue_id = q.id GROUP BY q.name"
            ).fetchall()
        )
        head = conn.execute(
            "SELECT min(id) FILTER (WHERE visible_at > now()),"
            " max(id) FILTER (WHERE visible_at > now()),"
            " min(id) FILTER (WHERE visible_at <= now())"
            " FROM queue_pg.messages WHERE queue_id = %s",
            [qids[LEASED]],
        ).fetchone()
        assert head is not None
        # Before any vacuum the old versions of the leased rows are dead entries at the head of
        # the claim index: what a receive pays until (auto)vacuum has passed.
        log("server side before VACUUM (EXPLAIN ANALYZE, rolled back)...")
        unvacuumed = _server_side(dsn, p)
        timings["vacuum_s"] = db.vacuum_analyze(conn)
        log(f"VACUUM ANALYZE in {timings['vacuum_s']:.1f} s")
    return _Setup(
        timings={k: round(v, 2) for k, v in timings.items()},
        install=how,
        queue_ids=qids,
        first_ids=first_ids,
        leased_ids={"first": head[0], "last": head[1], "first_visible": head[2]},
        unvacuumed=unvacuumed,
    )


def run(args: argparse.Namespace) -> int:
    p = Params.from_args(args)
    out = Path(args.out) if args.out else DEFAULT_OUT
    log = _logger(args.quiet)
    began = time.perf_counter()
    log(
        f"leased-head: {p.visible:,} visible + {p.in_flight:,} in flight vs {p.visible:,} visible;"
        f" scratch database {p.database!r}"
    )
    with db.scratch_database(args.dsn, p.database, keep=args.keep) as dsn:
        setup = _prepare(dsn, p, log)
        with db.connect(dsn) as conn:
            machine = machine_info(conn)
            if machine["server_settings"].get("autovacuum") == "off":
                log("note: the server runs with autovacuum = off (recorded in the results)")
            state_before = _queue_state(conn)
            sizes = db.relation_sizes(conn)
        log("server side (EXPLAIN ANALYZE, rolled back)...")
        server_before = _server_side(dsn, p)
        with db.connect(dsn, autocommit=False) as conn:
            control = {
                q: _naive_control(conn, setup.queue_ids[q], setup.first_ids[q], p)
                for q in (LEASED, EMPTY)
            }
        log(f"client: {p.receives:,} receives per queue...")
        client = _client_loop(dsn, p)
        server_after = _server_side(dsn, p)
        with db.connect(dsn) as conn:
            state_after = _queue_state(conn)

    ratios = _ratios(client, setup.unvacuumed, server_before, server_after)
    peer_results = {} if args.no_peers else _peers(args, p, log)
    result: dict[str, Any] = {
        "scenario": "leased-head",
        "command": args.command_line,
        "dsn": redact_dsn(args.dsn),
        "machine": machine,
        "parameters": asdict(p),
        "setup": {
            **setup.timings,
            "install": setup.install,
            "leased_ids": setup.leased_ids,
            "relation_bytes": sizes,
            "queues_before": state_before,
            "queues_after": state_after,
        },
        "client": client,
        "server_before_vacuum": setup.unvacuumed,
        "server_before_run": server_before,
        "server_after_run": server_after,
        "naive_id_order_control": control,
        "ratios_leased_over_empty": ratios,
        "peers": peer_results,
        "target": {
            "ratio": TARGET_RATIO,
            "met": all((ratios[k] or 0.0) <= TARGET_RATIO for k in ("client_p50", "client_mean")),
        },
        "elapsed_s": round(time.perf_counter() - began, 1),
    }
    paths = write_results(out, RESULT_NAME, result, _markdown(result, p, client, server_before))
    log(_summary(p, client, server_before, ratios))
    for path in paths:
        log(f"wrote {path}")
    return 0


def _ratios(
    client: dict[str, ClientFigures],
    unvacuumed: dict[str, ServerFigures],
    before: dict[str, ServerFigures],
    after: dict[str, ServerFigures],
) -> dict[str, float | None]:
    def r(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    lc, ec = client[LEASED].receive, client[EMPTY].receive
    out = {
        "client_p50": r(lc.p50_ms, ec.p50_ms),
        "client_p99": r(lc.p99_ms, ec.p99_ms),
        "client_mean": r(lc.mean_ms, ec.mean_ms),
        "server_receive_p50": r(before[LEASED].receive_p50_ms, before[EMPTY].receive_p50_ms),
        "server_claim_p50": r(before[LEASED].claim_p50_ms, before[EMPTY].claim_p50_ms),
        "server_receive_p50_before_vacuum": r(
            unvacuumed[LEASED].receive_p50_ms, unvacuumed[EMPTY].receive_p50_ms
        ),
        "server_receive_first_before_vacuum": r(
            unvacuumed[LEASED].receive_first_ms, unvacuumed[EMPTY].receive_first_ms
        ),
        "server_receive_p50_after_run": r(
            after[LEASED].receive_p50_ms, after[EMPTY].receive_p50_ms
        ),
    }
    return out


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _x(v: float | None) -> str:
    return "n/a" if v is None else f"**{v:.2f}x**"


def _buf(b: dict[str, int] | None) -> str:
    if not b:
        return "n/a"
    return " ".join(f"{k} {v}" for k, v in b.items())


def _nbuf(b: dict[str, int] | None) -> str:
    """Buffers a plan touched (shared hit + read)."""
    return "n/a" if not b else str(b.get("hit", 0) + b.get("read", 0))


def _markdown(
    result: dict[str, Any],
    p: Params,
    client: dict[str, ClientFigures],
    server: dict[str, ServerFigures],
) -> str:
    ratios = result["ratios_leased_over_empty"]
    control = result["naive_id_order_control"]
    headers = [
        "queue",
        "visible",
        "in flight, ahead",
        "receive p50 ms",
        "p99 ms",
        "mean ms",
        "msgs/s (receive)",
        "server: receive ms",
        "server: claim query ms",
        "claim buffers",
    ]
    rows: list[list[object]] = []
    for q, label, ahead in ((LEASED, "leased head", p.in_flight), (EMPTY, "empty head", 0)):
        c, s = client[q], server[q]
        rows.append(
            [
                label,
                f"{p.visible:,}",
                f"{ahead:,}",
                f"{c.receive.p50_ms:.3f}",
                f"{c.receive.p99_ms:.3f}",
                f"{c.receive.mean_ms:.3f}",
                f"{c.receive_msgs_per_s:,.0f}",
                _ms(s.receive_p50_ms),
                _ms(s.claim_p50_ms),
                _buf(s.claim_buffers),
            ]
        )
    rows.append(
        [
            "**leased / empty**",
            "",
            "",
            _x(ratios["client_p50"]),
            _x(ratios["client_p99"]),
            _x(ratios["client_mean"]),
            "",
            _x(ratios["server_receive_p50"]),
            _x(ratios["server_claim_p50"]),
            "",
        ]
    )
    met = "met" if result["target"]["met"] else "**missed**"
    lc, ec = control[LEASED], control[EMPTY]
    uv: dict[str, ServerFigures] = result["server_before_vacuum"]
    lines = [
        f"### Receive with {p.in_flight:,} leased messages at the head of the queue",
        "",
        f"`receive(max_messages={p.max_messages})` through `queue_pg.Client` on one connection,"
        f" {p.receives:,} calls per queue (after {p.warmup} warm-up calls), each followed by"
        f" `delete_batch` of what it got; the two queues alternate in blocks of {p.block}."
        " Server columns: median `EXPLAIN (ANALYZE, BUFFERS)` Execution Time of the whole"
        " `queue_pg.receive` call and of the claim query inside it (auto_explain), over"
        f" {p.explain_runs} rolled-back runs after `VACUUM ANALYZE`.",
        "",
        markdown_table(headers, rows, "lrrrrrrrrl"),
        "",
        f"Target (issue 2): leased head within {TARGET_RATIO:g}x of the empty head — {met}"
        f" (p50 {ratios['client_p50']:.2f}x, mean {ratios['client_mean']:.2f}x).",
        "",
        "Control, not queue_pg's query: an id-ordered claim (`ORDER BY id … FOR UPDATE SKIP"
        f" LOCKED`, as a naive queue reads) takes {lc['execution_p50_ms']:.3f} ms on the leased"
        f" head ({lc['rows_removed_by_filter']:,} rows filtered out) against"
        f" {ec['execution_p50_ms']:.3f} ms on the empty head.",
        "",
        "Before `VACUUM`, the old versions of the leased rows are dead entries at the head of"
        f" the claim index: the claim query touches {_nbuf(uv[LEASED].claim_buffers)} buffers on"
        f" the leased head against {_nbuf(uv[EMPTY].claim_buffers)}"
        f" ({_ms(uv[LEASED].claim_p50_ms)} ms against {_ms(uv[EMPTY].claim_p50_ms)} ms); the whole"
        f" receive takes {uv[LEASED].receive_p50_ms:.3f} ms against"
        f" {uv[EMPTY].receive_p50_ms:.3f} ms ({ratios['server_receive_p50_before_vacuum']:.2f}x).",
        "",
        *(
            [
                "Note: the server ran with `autovacuum = off`, so nothing but the explicit"
                " `VACUUM` removed dead entries during this run.",
                "",
            ]
            if result["machine"]["server_settings"].get("autovacuum") == "off"
            else []
        ),
        *_peer_lines(result["peers"], client),
        f"Machine: {machine_line(result['machine'])}.",
        "",
        f"Reproduce: `{result['command']}`",
    ]
    return "\n".join(lines)


def _summary(
    p: Params,
    client: dict[str, ClientFigures],
    server: dict[str, ServerFigures],
    ratios: dict[str, float | None],
) -> str:
    lines = []
    for q in (LEASED, EMPTY):
        c, s = client[q].receive, server[q]
        lines.append(
            f"{q:12s} receive p50 {c.p50_ms:.3f} ms  p99 {c.p99_ms:.3f} ms  mean {c.mean_ms:.3f} ms"
            f"  {client[q].receive_msgs_per_s:,.0f} msg/s  | server receive {s.receive_p50_ms:.3f}"
            f" ms  claim {_ms(s.claim_p50_ms)} ms"
        )
    lines.append(
        "leased/empty: " + "  ".join(f"{k} {v:.2f}x" for k, v in ratios.items() if v is not None)
    )
    return "\n".join(lines)


def _peers(args: argparse.Namespace, p: Params, log: Callable[[str], None]) -> dict[str, Any]:
    """The same leased head in each peer that has leases, through its own client."""
    from bench import peers

    out: dict[str, Any] = {
        "pgqueuer": {"note": "n/a (no lease to hold: a picked job is re-picked only after its"
                             " heartbeat times out)"},
        "procrastinate": {"note": "n/a (no lease: a fetched job stays 'doing' until finished)"},
    }
    ok, missing = peers.installed_systems(["pgmq"])
    if not ok:
        out["pgmq"] = {"note": f"not run: {missing['pgmq']}"}
        return out
    from bench.peers.pgmq_driver import leased_head

    log("PGMQ: the same leased head through its Python client...")
    with db.scratch_database(args.dsn, f"{p.database}_pgmq", keep=args.keep) as dsn:
        r = leased_head(dsn, p.visible, p.in_flight, p.receives, p.max_messages, p.block)
    log(f"PGMQ leased head read p50 {r['leased_p50_ms']:.3f} ms (leased / empty"
        f" {r['ratio']:.2f}x)")
    out["pgmq"] = r
    return out


def _peer_lines(peer_results: dict[str, Any], client: dict[str, ClientFigures]) -> list[str]:
    r = peer_results.get("pgmq")
    if not r or "leased" not in r:
        return []
    lp, ep = r["leased"], r["empty"]
    ours = client[LEASED].receive.p50_ms
    return [
        "PGMQ (`read(qty=10)` + `delete` through its Python client, same counts, after `VACUUM"
        f" ANALYZE`): leased head p50 {lp.p50_ms:.3f} ms, p99 {lp.p99_ms:.3f} ms; empty head"
        f" p50 {ep.p50_ms:.3f} ms ({r['ratio']:.2f}x). queue_pg's leased-head receive is"
        f" **{lp.p50_ms / ours:.1f}x** faster than PGMQ's.",
        "",
    ]


def _logger(quiet: bool) -> Callable[[str], None]:
    def log(msg: str) -> None:
        if not quiet:
            print(msg, flush=True)

    return log


SCENARIO = Scenario(
    name="leased-head",
    help="receive time with 100,000 leased messages ahead of 1,000,000 visible ones",
    add_arguments=add_arguments,
    run=run,
)
