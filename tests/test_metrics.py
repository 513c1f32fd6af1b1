"""The Prometheus surface: scraped over HTTP from a real server under a running load, parsed with
prometheus_client's own parser; one query per scrape; the Grafana dashboard queries only what
is exported; a role sees only its queues."""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

pytest.importorskip("prometheus_client")
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import conninfo

from queue_pg import Client
from queue_pg.ops.metrics import QueueCollector, asgi_app, registry, serve, wsgi_app
from tests.procs import ended
from tests.surface_load import running_load
from tests.test_access import CONSUMER, MakeRole, make_role  # noqa: F401

GRAFANA = Path(__file__).parent.parent / "queue_pg" / "contrib" / "grafana" / "queue_pg.json"
QUEUES = ("orders", "emails")
Families = dict[str, Any]


def scrape(url: str) -> Families:
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def values(families: Families, name: str, sample: str | None = None) -> dict[tuple[str, ...], float]:
    """{label values (sorted by label name, queue first) -> value} of the samples named ``sample``."""
    out = {}
    for s in families[name].samples:
        if s.name == (sample or name):
            out[tuple(v for _, v in sorted(s.labels.items(), key=lambda kv: (kv[0] != "queue", kv[0])))] = s.value
    return out


@pytest.fixture
def served(clean: str) -> Iterator[tuple[str, Client]]:
    """The metrics of ``clean`` served over HTTP on a free port, by a client of their own."""
    with Client(clean, sweep_interval=None, max_size=2) as reader:
        server, thread = serve(reader, port=0, addr="127.0.0.1", window=600)
        try:
            yield f"http://127.0.0.1:{server.server_port}/metrics", reader
        finally:
            server.shutdown()
            thread.join(10)


def test_scrape_under_load_follows_prometheus_conventions(served: tuple[str, Client], clean: str) -> None:
    url, reader = served
    with running_load(clean, QUEUES):
        first = scrape(url)
        second = scrape(url)
    assert values(first, "queue_pg_up") == {(): 1.0}
    kinds = {name: f.type for name, f in first.items()}
    assert kinds["queue_pg_messages"] == "gauge"
    # the parser strips _total from a counter family's name; its samples keep it
    for counter in ("messages_sent", "messages_received", "messages_deleted", "lease_expiries",
                    "stale_receipts"):
        assert kinds[f"queue_pg_{counter}"] == "counter"
        assert set(values(first, f"queue_pg_{counter}", f"queue_pg_{counter}_total")) == {
            (q,) for q in (*QUEUES, "dlq")}
    assert kinds["queue_pg_processing_seconds"] == kinds["queue_pg_wait_seconds"] == "summary"

    states = values(first, "queue_pg_messages")
    assert {s for _, s in states} == {"visible", "in_flight", "delayed", "dead_lettered"}
    for q in QUEUES:
        # the load keeps leases and dead-letters: both show, from the one query
        assert states[(q, "in_flight")] > 0 and states[(q, "dead_lettered")] > 0
        assert states[("dlq", "visible")] > 0
        sent = "queue_pg_messages_sent_total"
        assert values(second, "queue_pg_messages_sent", sent)[(q,)] >= values(
            first, "queue_pg_messages_sent", sent)[(q,)] > 0
        p = {quantile: v for (queue, quantile), v in values(first, "queue_pg_processing_seconds").items()
             if queue == q}
        assert set(p) == {"0.5", "0.95", "0.99"} and 0 <= p["0.5"] <= p["0.95"] <= p["0.99"]
        assert values(first, "queue_pg_visibility_timeout_seconds")[(q,)] == 30
        assert values(first, "queue_pg_recommended_timeout_seconds")[(q,)] >= 1

    # at rest, the scrape says exactly what SQL says
    at_rest = scrape(url)
    for h in reader.queue_health():
        assert values(at_rest, "queue_pg_messages")[(h.queue, "in_flight")] == h.in_flight
        assert values(at_rest, "queue_pg_messages")[(h.queue, "dead_lettered")] == h.dead_lettered
        assert values(at_rest, "queue_pg_messages_deleted", "queue_pg_messages_deleted_total")[
            (h.queue,)] == h.deleted
        assert values(at_rest, "queue_pg_stale_receipts", "queue_pg_stale_receipts_total")[
            (h.queue,)] == h.stale_receipts


class Counting(psycopg.Cursor[Any]):
    """A real cursor that counts the statements it sends."""

    statements = 0

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        Counting.statements += 1
        return super().execute(*args, **kwargs)


def _counting(conn: psycopg.Connection[Any]) -> None:
    conn.cursor_factory = Counting


@pytest.mark.parametrize("n_queues", [1, 40])
def test_two_queries_per_scrape_whatever_the_number_of_queues(client: Client, clean: str, n_queues: int) -> None:
    for i in range(n_queues):
        client.create_queue(f"q{i}")
        client.send(f"q{i}", i)
    with ConnectionPool(clean, min_size=1, max_size=1, kwargs={"autocommit": True},
                        configure=_counting) as pool, Client(pool, sweep_interval=None) as reader:
        reg = registry(reader)
        before = Counting.statements
        text = generate_latest(reg).decode()
        # queue_overview with replica_status, and stuck_jobs counted by queue and type
        assert Counting.statements - before == 2
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert len(values(families, "queue_pg_messages")) == 4 * n_queues


def test_database_down_scrapes_as_up_zero(clean: str) -> None:
    """A scrape while the database refuses answers queue_pg_up 0 (HTTP 200), not an error page."""
    dsn = conninfo.make_conninfo(clean, dbname="queue_pg_no_such_db")
    with ConnectionPool(dsn, min_size=0, max_size=1, kwargs={"autocommit": True}, timeout=2,
                        open=True) as pool, Client(pool, sweep_interval=None) as reader:
        text = generate_latest(registry(reader)).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert values(families, "queue_pg_up") == {(): 0.0}
    assert set(families) == {"queue_pg_up"}


def test_wsgi_app_serves_the_same(client: Client) -> None:
    client.create_queue("jobs")
    client.send("jobs", 1)
    app = wsgi_app(client)
    status: list[str] = []
    body = b"".join(app({"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": ""},
                        lambda s, headers: status.append(s)))
    assert status == ["200 OK"]
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert values(families, "queue_pg_messages")[("jobs", "visible")] == 1


async def test_asgi_app_serves_the_same(client: Client) -> None:
    client.create_queue("jobs")
    client.send("jobs", 1)
    app = asgi_app(client)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "http", "method": "GET", "path": "/metrics", "headers": [],
               "query_string": b""}, receive, send)
    assert sent[0]["status"] == 200
    body = b"".join(m.get("body", b"") for m in sent[1:]).decode()
    families = {f.name: f for f in text_string_to_metric_families(body)}
    assert values(families, "queue_pg_messages")[("jobs", "visible")] == 1


def test_a_role_scrapes_only_the_queues_it_has_a_grant_on(
    client: Client, make_role: MakeRole  # noqa: F811
) -> None:
    client.create_queue("mine")
    client.create_queue("theirs")
    client.send("theirs", "secret")
    reader = make_role("reader", CONSUMER)
    client.grant("mine", reader.name, "receive")
    with reader.client() as c:
        text = generate_latest(registry(c)).decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert {q for q, _ in values(families, "queue_pg_messages")} == {"mine"}
        with pytest.raises(Exception, match="window"):
            c.queue_overview(-5)


def test_collector_describes_nothing_so_registering_reads_nothing(client: Client) -> None:
    assert QueueCollector(client).describe() == []


def _grafana_metrics(panel_json: Any) -> set[str]:
    """Every queue_pg_* metric name in the dashboard's queries."""
    exprs = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                exprs.append(node["expr"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(panel_json)
    assert exprs, "the dashboard queries nothing"
    return {m for e in exprs for m in re.findall(r"\bqueue_pg_[a-z0-9_]+", e)}


def test_grafana_dashboard_queries_only_exported_metrics(served: tuple[str, Client], clean: str) -> None:
    url, _ = served
    dashboard = json.loads(GRAFANA.read_text())
    assert dashboard["title"] and dashboard["panels"]
    with running_load(clean, QUEUES):
        families = scrape(url)
    exported = {s.name for f in families.values() for s in f.samples}
    used = _grafana_metrics(dashboard)
    assert used - exported == set()
    # and it shows the figures a user asks about first
    assert {"queue_pg_messages", "queue_pg_visibility_timeout_seconds",
            "queue_pg_recommended_timeout_seconds", "queue_pg_messages_sent_total"} <= used


def listening_on(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) of the TCP sockets listening
    on ``port`` on this machine."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, _, hex_port = local.partition(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.add(address)
    return found


def test_metrics_listen_on_loopback_unless_told(client: Client) -> None:
    """The metrics name every queue and need no credentials: by default only this machine
    reaches them, as for the dashboard."""
    server, _ = serve(client, port=0)
    try:
        assert server.server_address[0] == "127.0.0.1"
        assert listening_on(server.server_port) == {"0100007F"}  # 127.0.0.1, no other address
    finally:
        server.shutdown()
        server.server_close()


def ctrl_c(proc: subprocess.Popen[str], to_a_thread: bool) -> None:
    """SIGINT to the process (the kernel picks the thread, mostly the main one) or to one of its
    other threads (tgkill), as the kernel may pick when the main one is busy."""
    if not to_a_thread:
        proc.send_signal(signal.SIGINT)
        return
    tid = next(int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid)
    assert ctypes.CDLL(None, use_errno=True).tgkill(proc.pid, tid, signal.SIGINT) == 0


@pytest.mark.parametrize("to_a_thread", [False, True], ids=["to_the_process", "to_a_thread"])
def test_metrics_command_serves_until_interrupted(
    client: Client, clean: str, to_a_thread: bool
) -> None:
    """`queue-pg metrics` as a real process: scraped over HTTP, then stopped with Ctrl-C, whichever
    of its threads the signal reaches; it listens on 127.0.0.1 when no --addr is given."""
    client.create_queue("jobs")
    client.send_batch("jobs", [1, 2, 3])
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent), "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from queue_pg.ops.cli import main; main()", "--dsn", clean,
         "metrics", "--port", str(port)],
        env=env, stderr=subprocess.PIPE, text=True,
        # Ctrl-C as in a terminal: a run started in the background of a shell (nohup, `&`)
        # ignores SIGINT, which the command would inherit and never see
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    with ended(proc, signal.SIGINT):  # Ctrl-C; killed if that does not end it
        assert proc.stderr is not None
        line = ""
        while "serving metrics" not in line:  # it says where once it listens
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "the command ended before serving"
        assert f"http://127.0.0.1:{port}/metrics" in line
        assert listening_on(port) == {"0100007F"}
        families = scrape(f"http://127.0.0.1:{port}/metrics")
        assert values(families, "queue_pg_messages")[("jobs", "visible")] == 3
        ctrl_c(proc, to_a_thread)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:  # say where it hung
            proc.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER: each thread's stack
            proc.wait(10)
            pytest.fail(f"Ctrl-C did not stop it within 30 s:\n{proc.stderr.read()}")
    assert proc.returncode == 0, proc.stderr.read()
