"""A running load for the surface tests (top, metrics): real threads on a real database.

Per queue, a producer sends small batches and a consumer receives, deletes most messages,
dead-letters every seventh with a reason and keeps every fifth leased (in flight), until stopped.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from queue_pg import Client

TYPES = ("email", "resize")


def _produce(client: Client, queue: str, stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        client.send_batch(queue, [{"n": n + i} for i in range(5)],
                          attributes=[{"type": TYPES[(n + i) % 2]} for i in range(5)])
        n += 5
        stop.wait(0.05)


def _consume(client: Client, queue: str, stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        for m in client.receive(queue, 5, visibility_timeout=120, wait=0.2):
            n += 1
            if n % 5 == 0:
                continue  # stays in flight
            if n % 7 == 0:
                client.dead_letter(queue, m.receipt, "bad input")
            else:
                client.delete(queue, m.receipt)


@contextmanager
def running_load(dsn: str, queues: Sequence[str], dlq: str = "dlq") -> Iterator[Client]:
    """Creates ``dlq`` and ``queues`` (dead-lettering into it), runs the load while the block
    runs, and yields the owner's client; waits until every queue has finished a few messages."""
    stop = threading.Event()
    errors: list[BaseException] = []
    with Client(dsn, sweep_interval=None, max_size=2 * len(queues) + 2) as client:
        client.create_queue(dlq)
        for q in queues:
            client.create_queue(q, dead_letter_queue=dlq, max_receive_count=5)

        def guarded(target, *args):  # type: ignore[no-untyped-def]
            try:
                target(*args)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=guarded, args=(work, client, q, stop), daemon=True)
                   for q in queues for work in (_produce, _consume)]
        for t in threads:
            t.start()
        try:
            done = threading.Event()
            for _ in range(200):  # until every queue has finished, leased and dead-lettered some
                rows = {r.queue: r for r in client.queue_overview(600)}
                if all((rows[q].samples or 0) >= 5 and rows[q].in_flight > 0
                       and rows[q].dead_lettered > 0 for q in queues):
                    done.set()
                    break
                stop.wait(0.1)
            assert done.is_set(), "the load did not get going"
            yield client
        finally:
            stop.set()
            for t in threads:
                t.join(10)
        assert not errors, errors
