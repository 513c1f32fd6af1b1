"""A running load for the dashboard tests: ``python -m tests.dashboard_load DSN`` until killed.

Queues ``orders`` and ``emails`` (with dead-letter queues): a producer sends a few messages of
two types every 0.5 s; consumers delete most, fail some (the error recorded in the attributes,
as the worker does) until they are dead-lettered, dead-letter a few with a reason, and keep a
few leased for long; a sweep every 5 s takes the samples the charts read. Prints ``ready`` once
the queues exist.
"""

from __future__ import annotations

import random
import sys
import threading
import time

import psycopg

from queue_pg import Client, QueueError

QUEUES = {"orders": ("invoice", "refund"), "emails": ("welcome", "digest")}


def setup(client: Client) -> None:
    for queue in QUEUES:
        client.create_queue(f"{queue}-dlq")
        client.create_queue(queue, visibility_timeout=30, dead_letter_queue=f"{queue}-dlq",
                            max_receive_count=2)


def produce(client: Client, stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        for queue, types in QUEUES.items():
            for kind in types:
                client.send_batch(queue, [{"n": n + i} for i in range(3)], attributes={"type": kind})
        n += 3
        stop.wait(0.5)


def consume(client: Client, queue: str, stop: threading.Event, rng: random.Random) -> None:
    while not stop.is_set():
        try:
            batch = client.receive(queue, max_messages=5, wait=1)
            for m in batch:
                time.sleep(rng.uniform(0.005, 0.03) * (3 if m.attributes.get("type") == "refund" else 1))
                roll = rng.random()
                if roll < 0.05:
                    client.update(queue, m.receipt, visibility_timeout=0, attributes={
                        "error": {"type": "ValueError", "message": f"order {m.body['n']} has no lines"}})
                elif roll < 0.06:
                    client.dead_letter(queue, m.receipt, reason="malformed: missing customer")
                elif roll < 0.07:
                    # a slow consumer holding its lease a long time: what "in flight" shows
                    client.change_visibility(queue, m.receipt, 600)
                else:
                    client.delete(queue, m.receipt)
        except QueueError:  # a purge or a redrive from the test took the message meanwhile
            continue
        except psycopg.Error as exc:  # say it, and go on: the load must outlive one bad call
            print(f"consumer of {queue}: {exc!r}", file=sys.stderr, flush=True)
            stop.wait(0.5)


def main(dsn: str) -> None:
    stop = threading.Event()
    with Client(dsn, sweep_interval=None, max_size=8) as client:
        setup(client)
        # the owner's first sweep makes today's history partition before any row needs it
        client.sweep()
        threads = [threading.Thread(target=produce, args=(client, stop), daemon=True)]
        for i, queue in enumerate([*QUEUES, *QUEUES]):
            threads.append(threading.Thread(target=consume, daemon=True,
                                            args=(client, queue, stop, random.Random(i))))
        for t in threads:
            t.start()
        print("ready", flush=True)
        try:
            while True:
                client.sweep()
                time.sleep(5)
        except KeyboardInterrupt:
            stop.set()


if __name__ == "__main__":
    main(sys.argv[1])
