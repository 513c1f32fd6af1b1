"""The server side of a benchmark: a scratch database, the install, fast fills, EXPLAIN.

Every scenario runs in a database of its own that it creates and drops, so a run never touches
the data of the database the DSN names and two scenarios never see each other's rows.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench.report import cpu_seconds

__all__ = [
    "SCRATCH_COMMENT",
    "ExplainRun",
    "NestedPlan",
    "backend_cpu",
    "connect",
    "database_dsn",
    "explain_analyze",
    "fill",
    "install",
    "lease",
    "nested_plans",
    "relation_sizes",
    "scratch_database",
    "vacuum_analyze",
]

#: Marks a database as ours: only a database carrying it is dropped when found left over.
SCRATCH_COMMENT = "queue_pg bench scratch database (safe to drop)"

Connection = psycopg.Connection[Any]


def database_dsn(dsn: str, dbname: str) -> str:
    """``dsn`` pointed at another database of the same server."""
    return make_conninfo(dsn, dbname=dbname)


def connect(dsn: str, *, autocommit: bool = True) -> Connection:
    return psycopg.connect(dsn, autocommit=autocommit)


@contextmanager
def scratch_database(dsn: str, name: str, *, keep: bool = False) -> Iterator[str]:
    """Create database ``name`` on the server of ``dsn``, yield its DSN, drop it afterwards.

    A database of that name left by an interrupted run (it carries :data:`SCRATCH_COMMENT`) is
    dropped first; any other database of that name is an error, never dropped.
    ``keep``: leave it in place at the end (to look at it with psql).
    """
    ident = sql.Identifier(name)
    with connect(dsn) as admin:
        row = admin.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
            [name],
        ).fetchone()
        if row is not None:
            if row[0] != SCRATCH_COMMENT:
                raise RuntimeError(
                    f"database {name!r} exists and is not a bench scratch database;"
                    " choose another with --database"
                )
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(ident))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(ident))
        admin.execute(
            sql.SQL("COMMENT ON DATABASE {} IS {}").format(ident, sql.Literal(SCRATCH_COMMENT))
        )
    try:
        yield database_dsn(dsn, name)
    finally:
        if not keep:
            with connect(dsn) as admin:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


def install(dsn: str) -> str:
    """Install queue_pg in the database of ``dsn`` the way users do: ``queue_pg.install``.

    Falls back to running ``sql/schema/*.sql`` then ``sql/api/*.sql`` of the checkout when the
    install module is not importable. Returns which of the two it used.
    """
    try:
        from queue_pg.install import migrate
    except ImportError:
        pass
    else:
        migrate(dsn)
        return "queue_pg.install.migrate"
    from queue_pg import _resources

    with connect(dsn, autocommit=False) as conn:
        for path in [*_resources.schema_files(), *_resources.api_files()]:
            conn.execute(_resources.read(path).encode())
        conn.commit()
    return "sql/schema + sql/api files"


def fill(
    conn: Connection,
    queue: str,
    count: int,
    *,
    batch_size: int = 10_000,
    payload_bytes: int = 64,
    start: int = 0,
) -> float:
    """Send ``count`` messages to ``queue`` through the SQL ``queue_pg.send_batch``.

    The bodies are built in the server (``generate_series``) so a call ships no data: each call
    is one ``send_batch`` of up to ``batch_size`` bodies ``{"n": i, "payload": "xx…"}``, committed
    on its own. Returns the seconds it took.
    """
    query = (
        "SELECT count(*) FROM queue_pg.send_batch(%(queue)s, ARRAY("
        " SELECT jsonb_build_object('n', g, 'payload', repeat('x', %(pad)s))"
        " FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g ORDER BY g))"
    )
    began = time.perf_counter()
    done = 0
    while done < count:
        size = min(batch_size, count - done)
        lo = start + done
        params = {"queue": queue, "pad": payload_bytes, "lo": lo, "hi": lo + size - 1}
        with conn.transaction():
            conn.execute(query, params)
        done += size
    return time.perf_counter() - began


def lease(conn: Connection, queue: str, count: int, *, visibility_timeout: float) -> int:
    """Receive ``count`` messages of ``queue`` (1,000 a call) with a long lease, so they stay
    in flight; returns how many were leased (fewer only if the queue ran out)."""
    got = 0
    while got < count:
        with conn.transaction():
            row = conn.execute(
                "SELECT count(*) FROM queue_pg.receive(%s, %s, visibility_timeout => %s)",
                [queue, min(1000, count - got), visibility_timeout],
            ).fetchone()
        n = int(row[0]) if row else 0
        if n == 0:
            break
        got += n
    return got


def count(conn: Connection, query: str, params: Sequence[Any] | None = None) -> int:
    """The one number a ``SELECT count(*) …`` answers (0 for no row)."""
    row = conn.execute(query, params).fetchone()
    return int(row[0]) if row else 0


def backend_cpu(dsn: str) -> float | None:
    """CPU seconds of the server processes serving the DSN's database (this session's
    excepted); None when the server is not on this host (its pids are not ours to read)."""
    with connect(dsn) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid()").fetchall()
        local = conn.execute("SELECT inet_server_addr() IS NULL"
                             " OR host(inet_server_addr()) IN ('127.0.0.1', '::1')").fetchone()
    if not local or not local[0]:
        return None
    try:
        return sum(cpu_seconds(pid) for (pid,) in rows)
    except (OSError, ValueError):  # one went away meanwhile, and its time with it
        return None


def checkpoints(conn: Connection) -> int:
    """Checkpoints the server has run (timed + requested) since its statistics were reset."""
    for query in (
        "SELECT num_timed + num_requested FROM pg_stat_checkpointer",  # 17+
        "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter",
    ):
        try:
            with conn.transaction():
                return count(conn, query)
        except psycopg.Error:
            continue
    return 0


def server_activity(conn: Connection, tables: Sequence[str]) -> dict[str, int]:
    """Counters to diff around a run: checkpoints, WAL position, vacuums and dead tuples of
    ``tables`` (schema-qualified names)."""
    row = conn.execute(
        "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn,"
        " (SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_all_tables"
        "   WHERE schemaname || '.' || relname = ANY(%(t)s)),"
        " (SELECT coalesce(sum(autovacuum_count + vacuum_count), 0) FROM pg_stat_all_tables"
        "   WHERE schemaname || '.' || relname = ANY(%(t)s))",
        {"t": list(tables)},
    ).fetchone()
    assert row is not None
    return {"checkpoints": checkpoints(conn), "wal_bytes": int(row[0]),
            "dead_tuples": int(row[1]), "vacuums": int(row[2])}


def activity_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What happened between two :func:`server_activity` readings (dead tuples: at the end)."""
    return {
        "checkpoints": after["checkpoints"] - before["checkpoints"],
        "wal_bytes": after["wal_bytes"] - before["wal_bytes"],
        "vacuums": after["vacuums"] - before["vacuums"],
        "dead_tuples_end": after["dead_tuples"],
    }


def vacuum_analyze(conn: Connection, table: str = "queue_pg.messages") -> float:
    """``VACUUM ANALYZE`` a table (needs an autocommit connection); returns the seconds."""
    began = time.perf_counter()
    conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.SQL(table)))
    return time.perf_counter() - began


def relation_sizes(conn: Connection, table: str = "queue_pg.messages") -> dict[str, int]:
    """Bytes of the table (heap) and of each of its indexes."""
    rows = conn.execute(
        "SELECT %s, pg_relation_size(%s::regclass)"
        " UNION ALL SELECT indexrelid::regclass::text, pg_relation_size(indexrelid)"
        " FROM pg_index WHERE indrelid = %s::regclass",
        [table, table, table],
    ).fetchall()
    return {str(name): int(size) for name, size in rows}


_EXEC_TIME = re.compile(r"Execution Time: ([0-9.]+) ms")
_PLAN_TIME = re.compile(r"Planning Time: ([0-9.]+) ms")
_BUFFERS = re.compile(r"Buffers: shared((?: \w+=\d+)+)")
_DURATION = re.compile(r"duration: ([0-9.]+) ms")


def _buffers(plan: str) -> dict[str, int]:
    """The first ``Buffers:`` line of a text plan (the top node's: it includes its children)."""
    m = _BUFFERS.search(plan)
    if not m:
        return {}
    return {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


@dataclass(frozen=True)
class ExplainRun:
    """One ``EXPLAIN (ANALYZE, BUFFERS)``: the times the server reports and the plan text."""

    execution_ms: float
    planning_ms: float
    buffers: dict[str, int]
    plan: str


def explain_analyze(conn: Connection, query: sql.Composable | str) -> ExplainRun:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of ``query`` (parameters inlined by the caller).

    Run it inside a transaction the caller rolls back when the statement writes (a receive
    really leases what it claims).
    """
    stmt = sql.SQL("EXPLAIN (ANALYZE, BUFFERS) {}").format(
        sql.SQL(query) if isinstance(query, str) else query
    )
    plan = "\n".join(str(r[0]) for r in conn.execute(stmt).fetchall())
    exec_m = _EXEC_TIME.search(plan)
    plan_m = _PLAN_TIME.search(plan)
    return ExplainRun(
        execution_ms=float(exec_m.group(1)) if exec_m else float("nan"),
        planning_ms=float(plan_m.group(1)) if plan_m else float("nan"),
        buffers=_buffers(plan),
        plan=plan,
    )


@dataclass(frozen=True)
class NestedPlan:
    """A statement run inside a function, as ``auto_explain`` logged it (ANALYZE, BUFFERS)."""

    duration_ms: float
    buffers: dict[str, int]
    text: str  #: "Query Text: …" then the plan


@contextmanager
def nested_plans(conn: Connection) -> Iterator[list[NestedPlan] | None]:
    """Collect the plans of the statements that functions run on ``conn``, with the server's
    ``auto_explain`` (ANALYZE, BUFFERS, nested statements), sent to the client as notices.

    Yields the list the plans are appended to, or None when ``auto_explain`` cannot be loaded
    (it needs a superuser, or the module in ``$libdir/plugins``). Settings are reset at exit.
    """
    try:
        with conn.transaction():
            conn.execute("LOAD 'auto_explain'")
    except psycopg.Error:
        yield None
        return
    found: list[NestedPlan] = []

    def on_notice(diag: psycopg.errors.Diagnostic) -> None:
        text = diag.message_primary or ""
        m = _DURATION.match(text)
        if m:
            body = text.split("plan:", 1)[-1].strip()
            found.append(NestedPlan(float(m.group(1)), _buffers(body), body))

    settings = {
        "auto_explain.log_min_duration": "0",
        "auto_explain.log_analyze": "on",
        "auto_explain.log_buffers": "on",
        "auto_explain.log_timing": "on",
        "auto_explain.log_nested_statements": "on",
        "auto_explain.log_format": "text",
        "client_min_messages": "log",
    }
    with conn.transaction():  # a SET rolled back with its transaction would be undone
        for name, value in settings.items():
            conn.execute("SELECT set_config(%s, %s, false)", [name, value])
    conn.add_notice_handler(on_notice)
    try:
        yield found
    finally:
        conn.remove_notice_handler(on_notice)
        if not conn.closed:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.rollback()
            with conn.transaction():
                for name in settings:
                    conn.execute(sql.SQL("RESET {}").format(sql.SQL(name)))
