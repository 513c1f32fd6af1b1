"""Producer and consumer processes for the fault suite, and their event logs.

Each process appends one JSON line per event to its own log file with ``os.write`` on an
``O_APPEND`` descriptor: the line is in the kernel once the call returns, so it survives a
SIGKILL one instruction later. An event is written only after the server acknowledged the call
it reports ("sent", "deleted", ...), and "begin" lines mark calls that a kill may interrupt, so
the checks can tell an acknowledged operation from one whose outcome is unknown.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from queue_pg import Client, Message, StaleReceipt


class EventLog:
    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def __call__(self, event: str, **data: Any) -> None:
        line = {"e": event, "pid": os.getpid(), "t": time.time(), **data}
        os.write(self.fd, (json.dumps(line) + "\n").encode())


def read_events(folder: Path, pattern: str = "*.jsonl") -> Iterator[dict[str, Any]]:
    for path in sorted(folder.glob(pattern)):
        for line in path.read_text().splitlines():
            if line.endswith("}"):  # a line cut by a kill mid-write is not an event
                yield json.loads(line)


def log_to(path: Path) -> None:
    """Send the queue_pg loggers of this process to a file (the checks read it)."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    for name in ("queue_pg", "psycopg.pool"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO if name == "queue_pg" else logging.WARNING)
        logging.getLogger(name).propagate = False


def _suicide_after(delay: float) -> None:
    """SIGKILL this process ``delay`` seconds from now, from another thread: the main thread is
    then somewhere inside the call it is making (or just after it)."""
    timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL))
    timer.daemon = True
    timer.start()


def _die_in_call(log: EventLog, point: str, **data: Any) -> None:
    log("kill", point=point, **data)
    _suicide_after(random.uniform(0.0, 0.004))


MAX_BATCH = 6  # the most messages one receive of killable_consumer takes


def killable_consumer(dsn: str, queue: str, lease: float, seed: int, folder: str,
                      kill_rate: float) -> None:
    """Receives and deletes until killed; now and then kills itself at a chosen point:
    between a receive and its delete, inside a heartbeat, inside a batch delete."""
    rng = random.Random(seed)
    log = EventLog(Path(folder) / f"consumer-{os.getpid()}.jsonl")
    log("start", seed=seed)
    with Client(dsn, max_size=2, sweep_interval=None) as client:
        while True:
            got = client.receive(queue, rng.randint(1, MAX_BATCH), visibility_timeout=lease)
            for m in got:
                log("received", id=m.id, receipt=m.receipt, n=m.receive_count,
                    until=m.visible_until.isoformat())
            if not got:
                time.sleep(0.01)
                continue
            roll = rng.random()
            if roll < kill_rate:
                log("kill", point="between receive and delete", ids=[m.id for m in got])
                os.kill(os.getpid(), signal.SIGKILL)
            heartbeat = rng.random() < 0.3
            if heartbeat:
                m = got[0]
                kill = rng.random() < kill_rate * 3
                if kill:
                    _die_in_call(log, "inside a heartbeat", id=m.id)
                log("begin", op="heartbeat", id=m.id)
                until = client.change_visibility(queue, m.receipt or "", lease)
                log("heartbeat", id=m.id, receipt=m.receipt, until=until.isoformat())
                if kill:
                    time.sleep(1)
            if len(got) > 1 and rng.random() < 0.5:
                kill = rng.random() < kill_rate * 2
                if kill:
                    _die_in_call(log, "inside a batch delete", ids=[m.id for m in got])
                log("begin", op="delete_batch", ids=[m.id for m in got])
                results = client.delete_batch(queue, [m.receipt or "" for m in got])
                for m, r in zip(got, results, strict=True):
                    log("deleted" if r.deleted else f"refused:{r.error}", id=m.id,
                        receipt=m.receipt)
                if kill:
                    time.sleep(1)
            else:
                for m in got:
                    log("begin", op="delete", id=m.id)
                    try:
                        ok = client.delete(queue, m.receipt or "")
                    except StaleReceipt:
                        log("refused:StaleReceipt", id=m.id, receipt=m.receipt)
                        continue
                    log("deleted" if ok else "gone", id=m.id, receipt=m.receipt)


# --- a server that restarts under load -----------------------------------------------------------


def steady_producer(dsn: str, queue: str, seed: int, folder: str, seconds: float) -> None:
    """Sends one message at a time for ``seconds``; logs each acknowledged send. Errors (the
    server is away) are logged and the next send is tried after a short pause."""
    log = EventLog(Path(folder) / f"producer-{seed}.jsonl")
    log_to(Path(folder) / f"producer-{seed}.log")
    end = time.monotonic() + seconds
    n = 0
    with Client(dsn, max_size=2, sweep_interval=None) as client:
        while time.monotonic() < end:
            key = f"{seed}-{n}"
            n += 1
            try:
                mid = client.send(queue, {"key": key})
            except Exception as exc:
                log("error", op="send", key=key, error=type(exc).__name__)
                time.sleep(0.05)
                continue
            log("sent", id=mid, key=key)
            time.sleep(0.002)
    log("done")


def steady_consumer(dsn: str, queue: str, seed: int, folder: str, seconds: float) -> None:
    """Receives and deletes for ``seconds``; logs each acknowledged delete."""
    log = EventLog(Path(folder) / f"consumer-{seed}.jsonl")
    log_to(Path(folder) / f"consumer-{seed}.log")
    end = time.monotonic() + seconds
    with Client(dsn, max_size=2, sweep_interval=None) as client:
        while time.monotonic() < end:
            try:
                got = client.receive(queue, 5, visibility_timeout=2, wait=0.5)
                for m in got:
                    if client.delete(queue, m.receipt or ""):
                        log("deleted", id=m.id)
            except Exception as exc:
                log("error", op="consume", error=type(exc).__name__)
                time.sleep(0.05)
    log("done")


def worker_consumer(dsn: str, queue: str, folder: str) -> None:
    """A queue_pg.Worker whose handler logs each message; runs until SIGTERM."""
    from queue_pg import Worker
    from queue_pg.jobs.worker import Job

    log = EventLog(Path(folder) / "worker.jsonl")
    log_to(Path(folder) / "worker.log")

    def handle(job: Job) -> None:
        log("handled", id=job.id)

    with Client(dsn, max_size=6, sweep_interval=None) as client:
        Worker(client, queue, handle, concurrency=2, visibility_timeout=2, wait=0.5).run()
    log("done")


# --- the 8 + 8 load run --------------------------------------------------------------------------


def load_producer(dsn: str, queue: str, seed: int, folder: str, seconds: float) -> None:
    log = EventLog(Path(folder) / f"producer-{seed}.jsonl")
    rng = random.Random(seed)
    end = time.monotonic() + seconds
    sent = errors = 0
    with Client(dsn, max_size=1, sweep_interval=None) as client:
        while time.monotonic() < end:
            try:
                if rng.random() < 0.5:
                    ids = client.send_batch(queue, [{"p": seed, "i": i} for i in range(10)])
                else:
                    ids = [client.send(queue, {"p": seed})]
            except Exception as exc:
                errors += 1
                log("error", error=repr(exc))
                continue
            sent += len(ids)
            time.sleep(0.003)
    log("done", sent=sent, errors=errors)


def load_consumer(dsn: str, queue: str, seed: int, folder: str, seconds: float) -> None:
    """Deletes most messages; "fails" some (releases them), so the queue dead-letters those
    that fail max_receive_count times."""
    log = EventLog(Path(folder) / f"consumer-{seed}.jsonl")
    rng = random.Random(seed)
    end = time.monotonic() + seconds
    deleted = released = errors = 0
    with Client(dsn, max_size=1, sweep_interval=None) as client:
        while time.monotonic() < end:
            try:
                got: list[Message] = client.receive(queue, 10, visibility_timeout=5)
                keep = [m for m in got if rng.random() >= 0.1]
                for m in got:
                    if m not in keep:
                        client.change_visibility(queue, m.receipt or "", 0, release=True)
                        released += 1
                if keep:
                    results = client.delete_batch(queue, [m.receipt or "" for m in keep])
                    deleted += sum(r.deleted for r in results)
                if not got:
                    time.sleep(0.005)
            except Exception as exc:
                errors += 1
                log("error", error=repr(exc))
    log("done", deleted=deleted, released=released, errors=errors)
