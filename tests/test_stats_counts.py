"""Counts users can trust (queue_stats, sql/api/55_monitoring.sql): past 1,000 per state the
counts are estimates from the latest sample and the flow counters (approximate), never the
cap; ``exact`` counts them all."""

from __future__ import annotations

import re
from typing import Any

import psycopg
from click.testing import CliRunner

from queue_pg import Client
from queue_pg.ops import cli
from tests.test_bulk import send_chunk

N = 20_000


def load(conn: psycopg.Connection[Any], n: int = N) -> None:
    """A bulk load of n messages (stage, COPY, send_staged: one transaction)."""
    assert send_chunk(conn, [(str(i),) for i in range(n)], ("bulk", "w", 0, 0)) == n


def within(estimate: int, truth: int, error: float = 0.10) -> bool:
    return abs(estimate - truth) <= error * truth


def test_a_bulk_load_is_estimated_not_capped_and_exact_counts_it(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    client.create_queue("bulk")
    load(conn)
    s = client.stats("bulk")  # no sample yet: the estimate starts at the queue's creation
    assert s.approximate is True and within(s.visible, N), s
    assert (s.in_flight, s.delayed) == (0, 0)
    e = client.stats("bulk", exact=True)
    assert (e.visible, e.in_flight, e.approximate) == (N, 0, False)
    # the same through SQL
    row = conn.execute("SELECT visible, approximate FROM queue_pg.stats('bulk', exact => true)").fetchone()
    assert row == (N, False)
    assert client.queue_health("bulk", exact=True)[0].visible == N
    assert client.queue_health(exact=True)[0].visible == N


def test_the_estimate_follows_receives_and_deletes_since_the_sample(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    client.create_queue("bulk")
    load(conn)
    client.sweep()  # a sample: the base of the estimates
    taken = [m for _ in range(5) for m in client.receive("bulk", 1000)]
    for part in (taken[:1000], taken[1000:2000]):
        client.delete_batch("bulk", [m.receipt for m in part])
    s = client.stats("bulk")
    assert s.approximate is True, s
    assert within(s.visible, N - 5000) and within(s.in_flight, 3000), s
    e = client.stats("bulk", exact=True)
    assert (e.visible, e.in_flight) == (N - 5000, 3000)


def test_the_cli_marks_estimates(client: Client, conn: psycopg.Connection[Any], clean: str) -> None:
    client.create_queue("bulk")
    client.create_queue("small")
    load(conn)
    client.send("small", 1)
    out = CliRunner().invoke(cli.main, ["--dsn", clean, "stats"]).stdout
    assert re.search(r"^bulk\s+~20\.0k\s+0\s+0\s", out, re.M), out
    assert re.search(r"^small\s+1\s+0\s", out, re.M), out
    out = CliRunner().invoke(cli.main, ["--dsn", clean, "stats", "--exact", "bulk"]).stdout
    assert re.search(r"^bulk\s+20\.0k\s+0\s+0\s", out, re.M), out
