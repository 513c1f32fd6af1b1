"""Scenario "sqs": the SQS endpoint's cost per message, boto3 through the endpoint beside the same
work through ``queue_pg.Client`` directly.

One producer, then one consumer, in this process: ``send`` (one message a call), ``send batch``
(10 a call: SendMessageBatch / ``send_batch``), and ``receive + delete`` (up to 10 a receive, then
one DeleteMessageBatch / ``delete_batch``) until the queue is empty. The endpoint runs as
``queue-pg sqs`` in a process of its own (uvicorn, one worker) with a key of the database owner,
so its figures include SigV4 on both sides, HTTP and JSON. Beside them, the same boto3 work
against moto's server (``pip install 'moto[server]'``), a local SQS emulator that keeps its
queues in memory, also in a process of its own; "n/a (why)" when it is not installed.

Then, in rounds that take turns (endpoint, floor, moto's server, endpoint, ...):

- **boto3 loop**: SendMessageBatch(10) + ReceiveMessage(10) + DeleteMessageBatch, repeated, one
  client thread: messages a second;
- **Celery**: the same Celery app on its ``sqs://`` transport (``bench/worker_apps/celery_sqs.py``,
  same transport options, ``--pool solo``, prefetch 10) against each server: a warmed-up worker,
  then ``--tasks`` no-op tasks published from here; tasks a second from the first publish to the
  last task run.

The **floor** (:mod:`bench.sqs_floor`) is the least an SQS endpoint of this design does per
request: the same server, SigV4 check and JSON, then one prepared statement on a plain table, and
nothing else. What it reaches beside moto's server bounds the ratio any such endpoint reaches on
the machine; what the endpoint reaches beside it is what its features cost.

Before each of the endpoint's and the floor's rounds their tables are vacuumed (not timed), as
autovacuum would: a server run without it (this machine's) would leave each round's dead rows to
the next.

The endpoint runs with :class:`queue_pg.sqs.app.Timed`, which clocks each request from its
arrival in the ASGI app to its answer, and the part spent awaiting PostgreSQL (statements,
commits, the loan of a connection, the key's look-up): the endpoint's own time per request is
the difference, reported as p50 / p99 per action.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench import Scenario, db, sqs_floor
from bench.peers.queue_pg_driver import QueuePg
from bench.report import (
    DEFAULT_OUT,
    cpu_seconds,
    machine_info,
    machine_line,
    markdown_table,
    redact_dsn,
    write_results,
)
from bench.throughput import vacuum
from queue_pg import sealing

__all__ = ["SCENARIO", "run"]

RESULT_NAME = "sqs"
BODY = '{"n": 0, "payload": "' + "x" * 64 + '"}'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=2000,
                        help="messages per phase at scale 1 (default 2000)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of the boto3 loop and of Celery per server (default 3)")
    parser.add_argument("--tasks", type=int, default=500,
                        help="Celery no-op tasks a round at scale 1 (default 500)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rate(n: int, work: Callable[[], int]) -> float:
    """Messages a second of ``work``, which returns how many it handled."""
    began = time.perf_counter()
    done = work()
    assert done == n, f"handled {done} of {n}"
    return n / (time.perf_counter() - began)


@contextlib.contextmanager
def _serve(argv: list[str]) -> Iterator[tuple[str, int]]:
    """Run ``python <argv> <free port>`` as a server process; its URL and pid once it listens.
    A server that exits meanwhile (its port taken by another process in between) starts again
    on another port: a port that answers must be this server's."""
    for _ in range(5):
        port = _free_port()
        server = subprocess.Popen([sys.executable, *argv, str(port)], env=os.environ.copy(),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while server.poll() is None and time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                except OSError:
                    time.sleep(0.1)
                    continue
                time.sleep(0.5)  # a server that lost its port exits soon after
                break
            if server.poll() is None:
                yield f"http://127.0.0.1:{port}", server.pid
                return
        finally:
            if server.poll() is None:
                server.terminate()
                server.wait(30)
    raise RuntimeError(f"server {argv[:2]} did not start")


def _sqs(url: str, key: tuple[str, str]) -> Any:
    import boto3

    return boto3.client("sqs", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id=key[0], aws_secret_access_key=key[1])


def _boto3(url: str, key: tuple[str, str], n: int) -> dict[str, float]:
    sqs = _sqs(url, key)
    q = sqs.create_queue(QueueName="bench")["QueueUrl"]

    def send() -> int:
        for _ in range(n):
            sqs.send_message(QueueUrl=q, MessageBody=BODY)
        return n

    def send_batch() -> int:
        for i in range(0, n, 10):
            sqs.send_message_batch(QueueUrl=q, Entries=[
                {"Id": str(j), "MessageBody": BODY} for j in range(min(10, n - i))])
        return n

    def drain() -> int:
        got = 0
        while True:
            ms = sqs.receive_message(QueueUrl=q, MaxNumberOfMessages=10,
                                     WaitTimeSeconds=0).get("Messages", [])
            if not ms:
                return got
            sqs.delete_message_batch(QueueUrl=q, Entries=[
                {"Id": str(j), "ReceiptHandle": m["ReceiptHandle"]} for j, m in enumerate(ms)])
            got += len(ms)

    return {"send": _rate(n, send), "drain_1": _rate(n, drain),
            "send_batch": _rate(n, send_batch), "drain_2": _rate(n, drain)}


def _loop(url: str, key: tuple[str, str], n: int) -> tuple[float, float]:
    """Messages a second of SendMessageBatch(10) + ReceiveMessage(10) + DeleteMessageBatch,
    repeated until ``n`` were sent, then the rest drained (timed too); and boto3's own CPU per
    message meanwhile, ms (no server can make the loop faster than that)."""
    sqs = _sqs(url, key)
    q = sqs.create_queue(QueueName="bench-loop")["QueueUrl"]
    entries = [{"Id": str(j), "MessageBody": BODY} for j in range(10)]

    def take() -> int:
        ms = sqs.receive_message(QueueUrl=q, MaxNumberOfMessages=10,
                                 WaitTimeSeconds=0).get("Messages", [])
        if ms:
            sqs.delete_message_batch(QueueUrl=q, Entries=[
                {"Id": str(j), "ReceiptHandle": m["ReceiptHandle"]} for j, m in enumerate(ms)])
        return len(ms)

    def work() -> int:
        done = 0
        for _ in range(n // 10):
            sqs.send_message_batch(QueueUrl=q, Entries=entries)
            done += take()
        while got := take():
            done += got
        return done

    cpu = time.process_time()
    rate = _rate(n // 10 * 10, work)
    return rate, (time.process_time() - cpu) * 1000 / (n // 10 * 10)


def _stamps(folder: str) -> int:
    total = 0
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as f:
            total += f.read().count(b"\n")
    return total


def _celery(url: str, key: tuple[str, str], n: int) -> tuple[float, float, float]:
    """Tasks a second of the Celery app on sqs:// at ``url``: a worker (``--pool solo``) warmed
    up by one task, then ``n`` no-op tasks published from here, timed to the last one run; the
    publisher's own CPU per task, ms (one thread: no server can make the run faster); and the
    worker's (one process, the same bound: it receives, runs and deletes every task)."""
    from urllib.parse import quote

    from bench.worker_apps import STAMPS_ENV
    from bench.worker_apps.celery_sqs import BROKER_ENV, QUEUE, app, noop

    broker = (f"sqs://{quote(key[0], safe='')}:{quote(key[1], safe='')}@"
              f"{url.removeprefix('http://')}")
    with tempfile.TemporaryDirectory(prefix="bench-sqs-celery-") as stamps:
        env = {**os.environ, BROKER_ENV: broker, STAMPS_ENV: stamps,
               "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(),
                                                           os.environ.get("PYTHONPATH")]))}
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "bench.worker_apps.celery_sqs", "worker",
             "--pool", "solo", "-Q", QUEUE, "--loglevel", "WARNING", "--without-heartbeat",
             "--without-gossip", "--without-mingle"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        try:
            with app.connection_for_write(broker) as conn:

                def wait_for(count: int) -> None:
                    deadline = time.monotonic() + 600
                    while _stamps(stamps) < count:
                        if worker.poll() is not None or time.monotonic() > deadline:
                            raise RuntimeError(f"the Celery worker ran {_stamps(stamps)} of"
                                               f" {count} tasks (exit {worker.poll()})")
                        time.sleep(0.01)

                noop.apply_async(kwargs={"n": -1}, connection=conn)
                wait_for(1)
                worker_cpu = cpu_seconds(worker.pid)
                began, cpu = time.perf_counter(), time.process_time()
                for i in range(n):
                    noop.apply_async(kwargs={"n": i}, connection=conn)
                published = (time.process_time() - cpu) * 1000 / n
                wait_for(n + 1)
                rate = n / (time.perf_counter() - began)
                return rate, published, (cpu_seconds(worker.pid) - worker_cpu) * 1000 / n
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                worker.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(30)


#: Runs the endpoint as ``queue-pg sqs`` does (uvicorn.run, one worker), clocked by Timed.
_ENDPOINT = ("import sys, uvicorn\n"
             "from queue_pg.sqs.app import Timed, create_app\n"
             "uvicorn.run(Timed(create_app(sys.argv[1]), sys.argv[2]), host='127.0.0.1',"
             " port=int(sys.argv[3]), log_level='warning')")


def _own_time(path: str) -> tuple[list[list[Any]], dict[str, Any]]:
    """Rows (action, requests, p50 / p99 of the endpoint's own time, of the time awaiting
    PostgreSQL, of the whole) from a Timed file, and the same as data."""
    import json

    by: dict[str, list[tuple[float, float]]] = {}
    cpu = 0.0
    with open(path) as f:
        for line in f:
            action, total, db_s = json.loads(line)
            if action == "(cpu)":  # the endpoint process's CPU seconds in all
                cpu = total
                continue
            by.setdefault(action or "(none)", []).append((total - db_s, db_s))
            by.setdefault("all", []).append((total - db_s, db_s))

    def q(xs: list[float], p: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000

    rows: list[list[Any]] = []
    data: dict[str, Any] = {"cpu_ms_per_request": cpu * 1000 / max(1, len(by.get("all", [])))}
    for action, xs in sorted(by.items(), key=lambda kv: (kv[0] == "all", -len(kv[1]))):
        own = [x[0] for x in xs]
        dbs = [x[1] for x in xs]
        whole = [x[0] + x[1] for x in xs]
        figures = {"requests": len(xs), "own_p50_ms": q(own, .5), "own_p99_ms": q(own, .99),
                   "db_p50_ms": q(dbs, .5), "whole_p50_ms": q(whole, .5)}
        data[action] = figures
        rows.append([action, f"{len(xs):,}", f"{figures['own_p50_ms']:.2f}",
                     f"{figures['own_p99_ms']:.2f}", f"{figures['db_p50_ms']:.2f}",
                     f"{figures['whole_p50_ms']:.2f}"])
    return rows, data


def _client(dsn: str, n: int) -> dict[str, float]:
    import queue_pg

    with queue_pg.Client(dsn, sweep_interval=None) as c:
        c.create_queue("direct")

        def send() -> int:
            for _ in range(n):
                c.send("direct", BODY)
            return n

        def send_batch() -> int:
            for i in range(0, n, 10):
                c.send_batch("direct", [BODY] * min(10, n - i))
            return n

        def drain() -> int:
            got = 0
            while True:
                ms = c.receive("direct", 10, wait=0)
                if not ms:
                    return got
                c.delete_batch("direct", [m.receipt for m in ms if m.receipt])
                got += len(ms)

        return {"send": _rate(n, send), "drain_1": _rate(n, drain),
                "send_batch": _rate(n, send_batch), "drain_2": _rate(n, drain)}


def run(args: argparse.Namespace) -> int:
    n = max(10, int(args.messages * args.scale))
    tasks = max(10, int(args.tasks * args.scale))
    out = Path(args.out) if args.out else DEFAULT_OUT
    log: Callable[[str], None] = (lambda _: None) if args.quiet else print
    moto = importlib.util.find_spec("moto.server") is not None and \
        importlib.util.find_spec("flask") is not None
    celery = importlib.util.find_spec("celery") is not None and \
        importlib.util.find_spec("pycurl") is not None
    systems = ("endpoint", "floor", "moto")
    loops: dict[str, list[float]] = {name: [] for name in systems}
    celery_rates: dict[str, list[float]] = {name: [] for name in systems}
    client_cpu: dict[str, list[float]] = {f"{what}_{where}": []
                                          for what in ("loop", "celery", "celery_worker")
                                          for where in systems}
    # the loop's CPU per message, µs: the server's process and PostgreSQL's backends
    server_cpu: dict[str, list[float]] = {name: [] for name in systems}
    backend_cpu: dict[str, list[float]] = {name: [] for name in systems}
    with db.scratch_database(args.dsn, args.database, keep=args.keep) as dsn, \
            tempfile.TemporaryDirectory(prefix="bench-sqs-") as tmp:
        db.install(dsn)
        with db.connect(dsn) as conn:
            machine = machine_info(conn)
            # the endpoint seals its secrets with QUEUE_PG_SECRET_KEY: one for this run
            os.environ.setdefault(sealing.ENV, sealing.generate_key())
            me = conn.execute("SELECT current_user").fetchone()
            assert me is not None
            row = sealing.create_sqs_key(conn, str(me[0]))
        key = (str(row[0]), str(row[1]))
        timings = os.path.join(tmp, "timings.jsonl")
        with contextlib.ExitStack() as servers:
            url, endpoint_pid = servers.enter_context(_serve(["-c", _ENDPOINT, dsn, timings]))
            os.environ[sqs_floor.KEY_ENV] = ":".join(key)  # the floor checks the same key
            floor_url, floor_pid = servers.enter_context(_serve(["-m", "bench.sqs_floor", dsn]))
            moto_url, moto_pid = servers.enter_context(
                _serve(["-m", "moto.server", "-H", "127.0.0.1", "-p"])) if moto else (None, 0)
            log(f"boto3 through the endpoint, {n} messages a phase...")
            through = _boto3(url, key, n)
            for r in range(args.rounds):
                for name, where, pid, creds in (
                    ("endpoint", url, endpoint_pid, key), ("floor", floor_url, floor_pid, key),
                    ("moto", moto_url, moto_pid, ("testing", "testing")),
                ):
                    if where is None:
                        continue
                    # as autovacuum would (the bench's server may run without it); moto keeps
                    # no dead rows
                    tables = {"endpoint": QueuePg.tables(), "floor": sqs_floor.tables()}
                    if name in tables:
                        vacuum(dsn, tables[name])
                    own0 = cpu_seconds(pid)
                    pg0 = db.backend_cpu(dsn) if name in tables else None
                    rate, cpu = _loop(where, creds, n)
                    server_cpu[name].append((cpu_seconds(pid) - own0) * 1e6 / n)
                    pg1 = db.backend_cpu(dsn) if name in tables else None
                    if pg0 is not None and pg1 is not None:
                        backend_cpu[name].append((pg1 - pg0) * 1e6 / n)
                    loops[name].append(rate)
                    client_cpu["loop_" + name].append(cpu)
                    log(f"round {r + 1}: boto3 loop on {name}: {loops[name][-1]:,.0f} msg/s")
                    if celery:
                        if name in tables:
                            vacuum(dsn, tables[name])
                        rate, cpu, worker_cpu = _celery(where, creds, tasks)
                        celery_rates[name].append(rate)
                        client_cpu["celery_" + name].append(cpu)
                        client_cpu["celery_worker_" + name].append(worker_cpu)
                        log(f"round {r + 1}: Celery on {name}: {celery_rates[name][-1]:,.1f}"
                            " tasks/s")
            emulator: dict[str, float] | str = "n/a (moto[server] not installed)"
            if moto_url is not None:
                log(f"boto3 against moto's server, {n} messages a phase...")
                emulator = _boto3(moto_url, ("testing", "testing"), n)
        # the endpoint has shut down: its clock is written
        own_rows, own = _own_time(timings)
        log(f"queue_pg.Client, {n} messages a phase...")
        direct = _client(dsn, n)
    load_after = [round(x, 2) for x in os.getloadavg()]
    phases = [("send, 1 a call", "send"), ("send, 10 a call", "send_batch"),
              ("receive 10 + delete batch (after single sends)", "drain_1"),
              ("receive 10 + delete batch (after batch sends)", "drain_2")]
    rows: list[list[Any]] = [
        [label, f"{through[k]:,.0f}", f"{direct[k]:,.0f}", f"{direct[k] / through[k]:.1f}x",
         emulator if isinstance(emulator, str) else f"{emulator[k]:,.0f}"]
        for label, k in phases
    ]

    def cell(xs: list[float], fmt: str) -> str:
        if not xs:
            return "n/a"
        return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"

    def ratio(a: list[float], b: list[float]) -> str:
        """a ÷ b of the medians; n/a without both (a CPU time of a short run may read 0 ticks)."""
        if not a or not b or not statistics.median(b):
            return "n/a"
        return f"{statistics.median(a) / statistics.median(b):.1f}x"

    def peer_row(label: str, rates: dict[str, list[float]], fmt: str) -> list[str]:
        return [label, *(cell(rates[name], fmt) for name in systems),
                ratio(rates["endpoint"], rates["moto"]), ratio(rates["floor"], rates["moto"]),
                ratio(rates["endpoint"], rates["floor"])]

    peers = [
        peer_row("boto3 loop: send batch 10 + receive 10 + delete batch (msg/s)", loops, ",.0f"),
        peer_row(f"Celery sqs://, {tasks} no-op tasks, --pool solo (tasks/s)", celery_rates,
                 ",.1f"),
    ]

    def bound(rates: list[float], cpu: list[float]) -> str:
        """The ratio a server answering in no time would reach: moto's time per message over
        the client's own CPU per message, which no server takes away."""
        return (f"≤ {1000 / statistics.median(rates) / statistics.median(cpu):.1f}x"
                if rates and cpu else "n/a")

    def client_row(label: str, what: str, rates: dict[str, list[float]]) -> list[str]:
        return [label, *(cell(client_cpu[f"{what}_{name}"], ".2f") for name in systems),
                bound(rates["moto"], client_cpu[f"{what}_endpoint"]), "", ""]

    def cpu_row(label: str, figures: dict[str, list[float]]) -> list[str]:
        return [label, *(cell(figures[name], ",.0f") if figures[name] else "n/a"
                         for name in systems), "", "",
                ratio(figures["endpoint"], figures["floor"])]

    peers += [
        cpu_row("the loop's server process, its CPU per message, µs", server_cpu),
        cpu_row("the loop's PostgreSQL backends, their CPU per message, µs", backend_cpu),
        client_row("boto3's own CPU per message of the loop, ms (bound: endpoint / moto with a"
                   " server taking no time)", "loop", loops),
        client_row("Celery's publisher, its own CPU per task, ms (one thread; bound as above)",
                   "celery", celery_rates),
        client_row("Celery's worker (--pool solo), its own CPU per task, ms (one process; bound"
                   " as above)", "celery_worker", celery_rates),
    ]
    markdown = "\n\n".join([
        "# SQS endpoint: boto3 and Celery beside moto's server, and where a request's time goes",
        f"`{args.command_line}` — {args.rounds} rounds taking turns, median (min-max);"
        f" {machine_line(machine)}; load average after: {load_after}",
        markdown_table(["", "queue-pg sqs", "floor", "moto server", "endpoint / moto",
                        "floor / moto", "endpoint / floor"], peers, "lrrrrrr"),
        "The endpoint's own time per request (arrival in the ASGI app to its answer, minus the"
        " time awaiting PostgreSQL), in ms, over every request of the rounds above:",
        markdown_table(["action", "requests", "own p50", "own p99", "PostgreSQL p50",
                        "whole p50"], own_rows, "lrrrrr"),
        f"The endpoint process's CPU time (user + system, everything it ran: HTTP, SigV4, JSON,"
        f" psycopg, the pools; from start to shutdown) per request:"
        f" {own['cpu_ms_per_request']:.2f} ms. On a loaded machine the wall-clock figures above"
        " include waiting for a CPU; this one does not.",
        f"One client thread, {n} messages a phase:",
        markdown_table(["phase", "boto3 → endpoint", "queue_pg.Client", "direct / endpoint",
                        "boto3 → moto server"], rows, "lrrrr"),
    ])
    data = {"scenario": "sqs", "command": args.command_line, "dsn": redact_dsn(args.dsn),
            "machine": machine, "load_after": load_after, "messages": n, "tasks": tasks,
            "rounds": args.rounds, "loop": loops, "celery": celery_rates, "own_time": own,
            "client_cpu_ms": client_cpu, "server_cpu_us_per_message": server_cpu,
            "backend_cpu_us_per_message": backend_cpu,
            "boto3_endpoint": through, "client": direct, "boto3_moto_server": emulator}
    for path in write_results(out, RESULT_NAME, data, markdown):
        log(f"wrote {path}")
    log(markdown)
    return 0


SCENARIO = Scenario(
    name="sqs",
    help="the SQS endpoint beside moto's server (boto3 loop, Celery sqs://) and its own time"
         " per request",
    add_arguments=add_arguments,
    run=run,
)
