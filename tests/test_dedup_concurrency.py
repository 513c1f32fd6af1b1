"""Deduplication under concurrency: producers in threads and processes send the same dedup ids
(single sends and batches that overlap in different orders) while consumers receive and delete;
exactly one message per id is delivered, and every producer got that message's id back. And what
a send of an id that an uncommitted send claimed does: it waits for that transaction, then
returns its id (committed) or sends itself (rolled back); sends of other ids do not wait."""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections import Counter, defaultdict
from typing import Any

import psycopg
import pytest

from queue_pg import Client

IDS = [f"order-{i}" for i in range(300)]


def produce(dsn: str, seed: int) -> dict[str, int]:
    """Sends every id once or more, in a random order, as single sends and batches of 1 - 20
    (some with an id twice); returns id -> the message id each send answered."""
    rng = random.Random(seed)
    order = IDS * 2
    rng.shuffle(order)
    got: dict[str, set[int]] = defaultdict(set)
    with Client(dsn, max_size=1, sweep_interval=None) as client:
        i = 0
        while i < len(order):
            if rng.random() < 0.3:
                key = order[i]
                got[key].add(client.send("work", {"key": key, "by": seed}, dedup_id=key))
                i += 1
                continue
            chunk = order[i:i + rng.randint(1, 20)]
            i += len(chunk)
            ids = client.send_batch("work", [{"key": k, "by": seed} for k in chunk],
                                    dedup_ids=chunk)
            for key, mid in zip(chunk, ids, strict=True):
                got[key].add(mid)
    assert all(len(v) == 1 for v in got.values()), got  # one answer per id in this producer
    return {k: v.pop() for k, v in got.items()}


def test_producers_in_threads_and_processes_send_each_id_once(clean: str) -> None:
    with Client(clean, sweep_interval=None) as admin:
        admin.create_queue("work")
    answers: list[dict[str, int]] = []
    errors: list[BaseException] = []
    delivered: list[tuple[int, str]] = []
    producing = threading.Event()
    producing.set()

    def thread_producer(seed: int) -> None:
        try:
            answers.append(produce(clean, seed))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    def consumer() -> None:
        try:
            with Client(clean, max_size=1, sweep_interval=None) as c:
                while True:
                    batch = c.receive("work", 25, visibility_timeout=60)
                    for m in batch:
                        delivered.append((m.id, m.body["key"]))
                    if batch:
                        c.delete_batch("work", [m.receipt for m in batch])  # type: ignore[misc]
                    elif not producing.is_set():
                        return
                    else:
                        time.sleep(0.02)
        except BaseException as exc:
            errors.append(exc)

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        in_processes = pool.starmap_async(produce, [(clean, 100), (clean, 101)])
        threads = [threading.Thread(target=thread_producer, args=(seed,)) for seed in range(4)]
        consumers = [threading.Thread(target=consumer) for _ in range(2)]
        for t in threads + consumers:
            t.start()
        for t in threads:
            t.join()
        answers.extend(in_processes.get(timeout=300))
    producing.clear()
    for t in consumers:
        t.join()
    if errors:
        raise errors[0]

    assert len(answers) == 6
    per_key = Counter(key for _, key in delivered)
    assert set(per_key) == set(IDS)
    assert set(per_key.values()) == {1}, [k for k, n in per_key.items() if n > 1]
    message_of = {key: mid for mid, key in delivered}
    for answer in answers:
        assert answer == message_of  # every send of an id answered the one delivered message
    with psycopg.connect(clean) as conn:
        assert conn.execute("SELECT count(*) FROM queue_pg.messages").fetchone() == (0,)
        assert conn.execute(
            "SELECT count(*) FROM queue_pg.message_history WHERE queue = 'work'"
        ).fetchone() == (len(IDS),)


def _send(dsn: str, key: str, out: list[Any], **conn_kwargs: Any) -> None:
    try:
        with psycopg.connect(dsn, autocommit=True, **conn_kwargs) as c:
            out.append(c.execute("SELECT queue_pg.send('work', '\"second\"', dedup_id => %s)",
                                 [key]).fetchone()[0])  # type: ignore[index]
    except BaseException as exc:
        out.append(exc)


def _waiting_on_a_lock(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND datname = current_database()").fetchone()
        return bool(row and row[0] > 0)


@pytest.mark.parametrize("first_commits", [True, False])
def test_a_send_of_an_uncommitted_id_waits_and_then_follows_the_first(
    clean: str, first_commits: bool
) -> None:
    with Client(clean, sweep_interval=None) as admin:
        admin.create_queue("work")
        with psycopg.connect(clean) as first:
            first_id = first.execute("SELECT queue_pg.send('work', '\"first\"', dedup_id => 'k')"
                                     ).fetchone()[0]  # type: ignore[index]
            out: list[Any] = []
            second = threading.Thread(target=_send, args=(clean, "k", out))
            second.start()
            deadline = time.monotonic() + 60
            while not _waiting_on_a_lock(clean):  # it waits on the key, not an error
                assert time.monotonic() < deadline and not out, out
                time.sleep(0.02)
            assert not out
            if first_commits:
                first.commit()
            else:
                first.rollback()
            second.join()
        [answer] = out
        assert not isinstance(answer, BaseException), answer
        bodies = [m.body for m in admin.receive("work", 10)]
        if first_commits:
            assert (answer, bodies) == (first_id, ["first"])
        else:
            assert answer != first_id and bodies == ["second"]


def test_sends_of_other_ids_do_not_wait_for_an_uncommitted_one(clean: str) -> None:
    with Client(clean, sweep_interval=None) as admin:
        admin.create_queue("work")
        with psycopg.connect(clean) as first:
            first.execute("SELECT queue_pg.send('work', '1', dedup_id => 'k')")
            first.execute("SELECT queue_pg.send_batch('work', array['1', '2']::jsonb[],"
                          " dedup_ids => array['a', 'b'])")
            out: list[Any] = []
            # a wait on a lock would end in lock_timeout's error, not in an id
            _send(clean, "other", out, options="-c lock_timeout=20s")
            with psycopg.connect(clean, autocommit=True, options="-c lock_timeout=20s") as c:
                ids = c.execute("SELECT queue_pg.send_batch('work', array['3', '4']::jsonb[],"
                                " dedup_ids => array['c', 'd'])").fetchall()
            first.rollback()
        assert isinstance(out[0], int) and len(ids) == 2


# --- redrive tasks: several steppers at once ---------------------------------------------------


def _step_until_done(dsn: str, task: int, max_rows: int, errors: list[BaseException]) -> None:
    try:
        with Client(dsn, max_size=1, sweep_interval=None) as c:
            while next(t for t in c.list_redrives("dlq") if t.id == task).status == "running":
                c.redrive_step(max_rows)
    except BaseException as exc:  # surfaced by the test
        errors.append(exc)


@pytest.mark.parametrize("rate", [None, 200.0])
def test_concurrent_steppers_move_each_message_once_within_the_rate(
    clean: str, rate: float | None
) -> None:
    with Client(clean, sweep_interval=None) as admin:
        admin.create_queue("dlq")
        admin.create_queue("jobs", dead_letter_queue="dlq", max_receive_count=1)
        with psycopg.connect(clean, autocommit=True) as c:
            sent = [r[0] for r in c.execute(
                "INSERT INTO queue_pg.messages (queue_id, source_queue_id, visible_at,"
                " enqueued_at, body) SELECT d.id, s.id, now() - interval '1 s', now(), to_jsonb(i)"
                " FROM queue_pg.queues d, queue_pg.queues s, generate_series(1, 600) i"
                " WHERE d.name = 'dlq' AND s.name = 'jobs' RETURNING id").fetchall()]
        task = admin.start_redrive("dlq", rate=rate)
        errors: list[BaseException] = []
        threads = [threading.Thread(target=_step_until_done, args=(clean, task, 7, errors))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        [done] = admin.list_redrives("dlq")
        assert (done.status, done.moved, done.to_move) == ("completed", 600, 600)
        if rate is not None:  # the last step came no sooner than the rate allows
            assert done.finished_at is not None
            seconds = (done.finished_at - done.started_at).total_seconds()
            assert rate * (seconds + 1) >= 600
        back = [m.id for m in admin.receive("jobs", 1000)]
        assert sorted(back) == sorted(sent)
