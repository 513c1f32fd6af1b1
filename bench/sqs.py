"""Scenario "sqs": the SQS endpoint's cost per message, boto3 through the endpoint beside the same
work through ``queue_pg.Client`` directly.

One producer, then one consumer, in this process: ``send`` (one message a call), ``send batch``
(10 a call: SendMessageBatch / ``send_batch``), and ``receive + delete`` (up to 10 a receive, then
one DeleteMessageBatch / ``delete_batch``) until the queue is empty. The endpoint runs as
``queue-pg sqs`` in a process of its own (uvicorn, one worker) with a key of the database owner,
so its figures include SigV4 on both sides, HTTP and JSON. Beside them, the same boto3 work
against moto's server (``pip install 'moto[server]'``), a local SQS emulator that keeps its
queues in memory, also in a process of its own; "n/a (why)" when it is not installed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench import Scenario, db
from bench.report import (
    DEFAULT_OUT,
    machine_info,
    machine_line,
    markdown_table,
    redact_dsn,
    write_results,
)
from queue_pg import sealing

__all__ = ["SCENARIO", "run"]

RESULT_NAME = "sqs"
BODY = '{"n": 0, "payload": "' + "x" * 64 + '"}'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=2000,
                        help="messages per phase at scale 1 (default 2000)")


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
def _serve(argv: list[str]) -> Iterator[str]:
    """Run ``python <argv> <free port>`` as a server process; its URL once it listens."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, *argv, str(port)], env=os.environ.copy(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(30)


def _boto3(url: str, key: tuple[str, str], n: int) -> dict[str, float]:
    import boto3

    sqs = boto3.client("sqs", endpoint_url=url, region_name="us-east-1",
                       aws_access_key_id=key[0], aws_secret_access_key=key[1])
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
    out = Path(args.out) if args.out else DEFAULT_OUT
    log: Callable[[str], None] = (lambda _: None) if args.quiet else print
    with db.scratch_database(args.dsn, args.database, keep=args.keep) as dsn:
        db.install(dsn)
        with db.connect(dsn) as conn:
            machine = machine_info(conn)
            # the endpoint seals its secrets with QUEUE_PG_SECRET_KEY: one for this run
            os.environ.setdefault(sealing.ENV, sealing.generate_key())
            me = conn.execute("SELECT current_user").fetchone()
            assert me is not None
            row = sealing.create_sqs_key(conn, str(me[0]))
        with _serve(["-c", "from queue_pg.ops.cli import main; main()", "--dsn", dsn, "sqs",
                     "--port"]) as url:
            log(f"boto3 through the endpoint, {n} messages a phase...")
            through = _boto3(url, (row[0], row[1]), n)
        log(f"queue_pg.Client, {n} messages a phase...")
        direct = _client(dsn, n)
    emulator: dict[str, float] | str
    if importlib.util.find_spec("moto.server") is None or importlib.util.find_spec("flask") is None:
        emulator = "n/a (moto[server] not installed)"
    else:
        with _serve(["-m", "moto.server", "-H", "127.0.0.1", "-p"]) as url:
            log(f"boto3 against moto's server, {n} messages a phase...")
            emulator = _boto3(url, ("testing", "testing"), n)
    phases = [("send, 1 a call", "send"), ("send, 10 a call", "send_batch"),
              ("receive 10 + delete batch (after single sends)", "drain_1"),
              ("receive 10 + delete batch (after batch sends)", "drain_2")]
    rows: list[list[Any]] = [
        [label, f"{through[k]:,.0f}", f"{direct[k]:,.0f}", f"{direct[k] / through[k]:.1f}x",
         emulator if isinstance(emulator, str) else f"{emulator[k]:,.0f}"]
        for label, k in phases
    ]
    markdown = "\n\n".join([
        "# SQS endpoint: messages per second, boto3 through the endpoint vs queue_pg.Client",
        f"`{args.command_line}` — {n} messages a phase, one client thread; {machine_line(machine)}",
        markdown_table(["phase", "boto3 → endpoint", "queue_pg.Client", "direct / endpoint",
                        "boto3 → moto server"], rows, "lrrrr"),
    ])
    data = {"scenario": "sqs", "command": args.command_line, "dsn": redact_dsn(args.dsn),
            "machine": machine, "messages": n, "boto3_endpoint": through, "client": direct,
            "boto3_moto_server": emulator}
    for path in write_results(out, RESULT_NAME, data, markdown):
        log(f"wrote {path}")
    log(markdown)
    return 0


SCENARIO = Scenario(
    name="sqs",
    help="the SQS endpoint's cost: boto3 through it vs queue_pg.Client, send and receive+delete",
    add_arguments=add_arguments,
    run=run,
)
