"""The SQL API as psql users call it: every operation, by position and by name.

Time passes through the session setting ``queue_pg.time_offset``, which the functions honour for
their notion of now; it moves only this connection's clock.
"""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest

from queue_pg import errors


def advance(conn: psycopg.Connection, seconds: float) -> None:
    cur = conn.execute("SELECT coalesce(nullif(current_setting('queue_pg.time_offset', true), ''), '0')")
    row = cur.fetchone()
    assert row is not None
    conn.execute(
        "SELECT set_config('queue_pg.time_offset', (%s::interval + make_interval(secs => %s))::text, false)",
        (row[0], seconds),
    )


def test_call_forms(sql) -> None:
    sql("SELECT queue_pg.create_queue('jobs')")
    sql("SELECT queue_pg.send_batch('jobs', array['1','2','3','4']::jsonb[])")
    assert len(sql("SELECT * FROM queue_pg.receive('jobs')")) == 1
    assert len(sql("SELECT * FROM queue_pg.receive('jobs', 2)")) == 2
    rows = sql("SELECT visible_until - enqueued_at FROM queue_pg.receive('jobs', visibility_timeout => 5)")
    assert len(rows) == 1


def test_create_is_idempotent_and_conflicts_are_named(sql) -> None:
    sql("SELECT queue_pg.create_queue('jobs', visibility_timeout => 10)")
    sql("SELECT queue_pg.create_queue('jobs', visibility_timeout => 10)")
    with pytest.raises(errors.QueueAlreadyExists, match="visibility_timeout = 10 \\(asked 11\\)"):
        sql("SELECT queue_pg.create_queue('jobs', visibility_timeout => 11)")
    assert sql("SELECT count(*) FROM queue_pg.queues") == [(1,)]


@pytest.mark.parametrize(
    ("call", "param"),
    [
        ("create_queue('q', visibility_timeout => -1)", "visibility_timeout"),
        ("create_queue('q', visibility_timeout => 604801)", "visibility_timeout"),
        ("create_queue('q', visibility_timeout => 'NaN')", "visibility_timeout"),
        ("create_queue('q', message_ttl => 0)", "message_ttl"),
        ("create_queue('q', delay => 604801)", "delay"),
        ("create_queue('q', max_message_size => 1023)", "max_message_size"),
        ("create_queue('q', max_message_size => 16777217)", "max_message_size"),
        ("create_queue('q', receive_wait => 21)", "receive_wait"),
        ("create_queue('q', max_lease => 0)", "max_lease"),
        ("create_queue('q', max_lease => 10, visibility_timeout => 11)", "visibility_timeout"),
        ("create_queue('q', max_receive_count => 3)", "dead_letter_queue"),
        ("create_queue('q', dead_letter_queue => 'nope', max_receive_count => 3)", "dead_letter_queue"),
        ("create_queue('q', dead_letter_queue => 'q', max_receive_count => 3)", "dead_letter_queue"),
        ("create_queue('q', in_flight_limit => 0)", "in_flight_limit"),
        ("create_queue('q', in_flight_limit => 10000001)", "in_flight_limit"),
        ("create_queue('q', history_retention => 3599)", "history_retention"),
        ("create_queue('bad name')", "name"),
        ("create_queue(repeat('a', 81))", "name"),
        ("create_queue('q''; drop table x; --')", "name"),
    ],
)
def test_bad_settings_are_named_and_change_nothing(sql, call: str, param: str) -> None:
    with pytest.raises(errors.InvalidParameter, match=param):
        sql(f"SELECT queue_pg.{call}")
    assert sql("SELECT count(*) FROM queue_pg.queues") == [(0,)]


def test_max_receive_count_range(sql) -> None:
    sql("SELECT queue_pg.create_queue('dlq')")
    with pytest.raises(errors.InvalidParameter, match="max_receive_count = 1001"):
        sql("SELECT queue_pg.create_queue('q', dead_letter_queue => 'dlq', max_receive_count => 1001)")


def test_alter_and_clear(sql) -> None:
    sql("SELECT queue_pg.create_queue('jobs')")
    row = sql("SELECT visibility_timeout, message_ttl FROM queue_pg.alter_queue('jobs', visibility_timeout => 5)")
    assert row == [(5.0, 345600.0)]
    row = sql("SELECT message_ttl FROM queue_pg.alter_queue('jobs', clear => array['message_ttl'])")
    assert row == [(None,)]
    with pytest.raises(errors.InvalidParameter, match="clear"):
        sql("SELECT queue_pg.alter_queue('jobs', clear => array['visibility_timeout'])")
    with pytest.raises(errors.QueueNotFound):
        sql("SELECT queue_pg.alter_queue('nope', delay => 1)")


def test_receipts_fence_and_count(sql, conn) -> None:
    sql("SELECT queue_pg.create_queue('jobs', visibility_timeout => 10)")
    sql("SELECT queue_pg.send('jobs', '{\"a\": 1}')")
    [(r1,)] = sql("SELECT receipt FROM queue_pg.receive('jobs')")
    advance(conn, 11)
    [(r2,)] = sql("SELECT receipt FROM queue_pg.receive('jobs')")
    assert r1 != r2
    with pytest.raises(errors.StaleReceipt):
        sql("SELECT queue_pg.delete_message('jobs', %s)", r1)
    with pytest.raises(errors.StaleReceipt):
        sql("SELECT queue_pg.change_visibility('jobs', %s, 5)", r1)
    with pytest.raises(errors.StaleReceipt):
        sql("SELECT queue_pg.update_message('jobs', %s, '2', 0)", r1)
    # refusals are counted although each one rolled its statement back
    assert sql("SELECT stale_receipts, lease_expiries FROM queue_pg.stats('jobs')") == [(3, 1)]
    assert sql("SELECT queue_pg.delete_message('jobs', %s)", r2) == [(True,)]
    assert sql("SELECT queue_pg.delete_message('jobs', %s)", r2) == [(False,)]


def test_lapsed_lease_not_received_again_can_still_be_deleted(sql, conn) -> None:
    sql("SELECT queue_pg.create_queue('jobs', visibility_timeout => 1)")
    sql("SELECT queue_pg.send('jobs', '1')")
    [(r,)] = sql("SELECT receipt FROM queue_pg.receive('jobs')")
    advance(conn, 5)
    assert sql("SELECT queue_pg.delete_message('jobs', %s)", r) == [(True,)]


@pytest.mark.parametrize(
    "receipt",
    ["", "garbage", "1.2.3", "1.1.1.0000000000000000", "x" * 10000, "1.1.1.0000000000000000; drop"],
)
def test_malformed_and_forged_receipts(sql, receipt: str) -> None:
    sql("SELECT queue_pg.create_queue('jobs')")
    sql("SELECT queue_pg.send('jobs', '1')")
    sql("SELECT * FROM queue_pg.receive('jobs')")
    with pytest.raises(errors.InvalidReceipt):
        sql("SELECT queue_pg.delete_message('jobs', %s)", receipt)
    assert sql("SELECT count(*) FROM queue_pg.messages") == [(1,)]


def test_receipt_of_another_queue_and_tampered_receipt(sql) -> None:
    sql("SELECT queue_pg.create_queue('a')")
    sql("SELECT queue_pg.create_queue('b')")
    sql("SELECT queue_pg.send('a', '1')")
    [(r,)] = sql("SELECT receipt FROM queue_pg.receive('a')")
    with pytest.raises(errors.InvalidReceipt):
        sql("SELECT queue_pg.delete_message('b', %s)", r)
    qid, mid, lease, mac = r.split(".")
    with pytest.raises(errors.InvalidReceipt):  # a later lease number with the old MAC
        sql("SELECT queue_pg.delete_message('a', %s)", f"{qid}.{mid}.{int(lease) + 1}.{mac}")
    assert sql("SELECT queue_pg.delete_message('a', %s)", r) == [(True,)]


def test_change_visibility_counts_from_now_and_respects_max_lease(sql, conn) -> None:
    sql("SELECT queue_pg.create_queue('jobs', visibility_timeout => 10, max_lease => 60)")
    sql("SELECT queue_pg.send('jobs', '1')")
    [(r,)] = sql("SELECT receipt FROM queue_pg.receive('jobs')")
    advance(conn, 50)
    [(until,)] = sql("SELECT queue_pg.change_visibility('jobs', %s, 9) - queue_pg.now()", r)
    assert 8.5 < until.total_seconds() <= 9
    with pytest.raises(errors.LeaseLimitExceeded, match="max_lease = 60"):
        sql("SELECT queue_pg.change_visibility('jobs', %s, 11)", r)
    with pytest.raises(errors.InvalidParameter, match="timeout = -1"):
        sql("SELECT queue_pg.change_visibility('jobs', %s, -1)", r)
    # 0 releases at once; the receipt stays valid
    sql("SELECT queue_pg.change_visibility('jobs', %s, 0)", r)
    assert len(sql("SELECT * FROM queue_pg.peek('jobs')")) == 1
    assert sql("SELECT queue_pg.delete_message('jobs', %s)", r) == [(True,)]


def test_update_message_replaces_body_and_visibility(sql) -> None:
    sql("SELECT queue_pg.create_queue('jobs')")
    sql("SELECT queue_pg.send('jobs', '{\"step\": 0}')")
    [(r,)] = sql("SELECT receipt FROM queue_pg.receive('jobs')")
    rows = sql("SELECT body, receipt FROM queue_pg.update_message('jobs', %s, '{\"step\": 1}', 30)", r)
    assert rows == [({"step": 1}, r)]
    assert sql("SELECT * FROM queue_pg.peek('jobs')") == []
    sql("SELECT queue_pg.update_message('jobs', %s)", r)  # default: visible again, body kept
    assert sql("SELECT body FROM queue_pg.peek('jobs')") == [({"step": 1},)]


def test_expiry_wins_over_a_lease(sql, conn) -> None:
    sql("SELECT queue_pg.create_queue('jobs', message_ttl => 100, visibility_timeout => 50)")
    sql("SELECT queue_pg.send('jobs', '1')")
    [(r,)] = sql("SELECT receipt FROM queue_pg.receive('jobs')")
    advance(conn, 40)
    sql("SELECT queue_pg.change_visibility('jobs', %s, 600)", r)  # past the expiry: allowed
    advance(conn, 61)
    assert sql("SELECT queue_pg.delete_message('jobs', %s)", r) == [(False,)]
    with pytest.raises(errors.MessageNotFound):
        sql("SELECT queue_pg.change_visibility('jobs', %s, 5)", r)
    assert sql("SELECT queue_pg.sweep()") == [(1,)]
    assert sql("SELECT outcome FROM queue_pg.message_history") == [("expired",)]


def test_expired_messages_are_never_received(sql, conn) -> None:
    sql("SELECT queue_pg.create_queue('jobs')")
    sql("SELECT queue_pg.send('jobs', '1', ttl => 5)")
    sql("SELECT queue_pg.send('jobs', '2')")
    advance(conn, 6)
    assert sql("SELECT body FROM queue_pg.receive('jobs', 10)") == [(2,)]


def test_delay_per_queue_and_per_message(sql, conn) -> None:
    sql("SELECT queue_pg.create_queue('jobs', delay => 10)")
    sql("SELECT queue_pg.send('jobs', '1')")
    sql("SELECT queue_pg.send('jobs', '2', delay => 0)")
    assert sql("SELECT body FROM queue_pg.receive('jobs', 10)") == [(2,)]
    assert sql("SELECT delayed FROM queue_pg.stats('jobs')") == [(1,)]
    advance(conn, 10.5)
    assert sql("SELECT body FROM queue_pg.receive('jobs', 10)") == [(1,)]


def test_dead_letter_after_max_receives_keeps_id_and_source(sql, conn) -> None:
    sql("SELECT queue_pg.create_queue('dlq')")
    sql("SELECT queue_pg.create_queue('jobs', visibility_timeout => 1, dead_letter_queue => 'dlq', max_receive_count => 2)")
    [(mid,)] = sql("SELECT queue_pg.send('jobs', '1', attributes => '{\"type\": \"email\"}')")
    for _ in range(2):
        assert len(sql("SELECT * FROM queue_pg.receive('jobs')")) == 1
        advance(conn, 2)
    assert sql("SELECT * FROM queue_pg.receive('jobs')") == []
    assert sql("SELECT id, receive_count FROM queue_pg.peek('dlq')") == [(mid, 2)]
    assert sql("SELECT dead_lettered FROM queue_pg.stats('jobs')") == [(1,)]
    assert sql("SELECT outcome, receive_count, lease_expiries, type FROM queue_pg.message_history") == [
        ("dead_lettered", 2, 2, "email")
    ]
    assert sql("SELECT queue_pg.redrive('dlq')") == [(1,)]
    assert sql("SELECT id, receive_count FROM queue_pg.peek('jobs')") == [(mid, 0)]


def test_redrive_to_and_limit(sql) -> None:
    sql("SELECT queue_pg.create_queue('dlq')")
    sql("SELECT queue_pg.create_queue('other')")
    sql("SELECT queue_pg.send_batch('dlq', array['1','2','3']::jsonb[])")
    assert sql("SELECT queue_pg.redrive('dlq')") == [(0,)]  # no source recorded, no `to`
    assert sql("SELECT queue_pg.redrive('dlq', \"to\" => 'other', \"limit\" => 2)") == [(2,)]
    assert sql("SELECT count(*) FROM queue_pg.peek('other', 10)") == [(2,)]


def test_in_flight_limit(sql, conn) -> None:
    sql("SELECT queue_pg.create_queue('jobs', in_flight_limit => 3, visibility_timeout => 10)")
    sql("SELECT queue_pg.send_batch('jobs', array['1','2','3','4','5']::jsonb[])")
    got = sql("SELECT receipt FROM queue_pg.receive('jobs', 10)")
    assert len(got) == 3
    with pytest.raises(errors.OverLimit, match="in_flight_limit = 3"):
        sql("SELECT * FROM queue_pg.receive('jobs')")
    assert sql("SELECT * FROM queue_pg.receive('jobs', wait => 0.1)") == []  # long poll: nothing
    sql("SELECT queue_pg.delete_message('jobs', %s)", got[0][0])
    assert len(sql("SELECT * FROM queue_pg.receive('jobs', 10)")) == 1
    advance(conn, 11)  # leases lapse: the counter is corrected by an exact recount
    assert len(sql("SELECT * FROM queue_pg.receive('jobs', 10)")) == 3


def test_send_rejects_bad_input_and_changes_nothing(sql) -> None:
    sql("SELECT queue_pg.create_queue('jobs', max_message_size => 1024)")
    with pytest.raises(errors.MessageTooLarge, match="max_message_size = 1024"):
        sql("SELECT queue_pg.send('jobs', to_jsonb(repeat('x', 2000)))")
    with pytest.raises(errors.MessageTooLarge, match=r"body\[1\]"):
        sql("SELECT queue_pg.send_batch('jobs', array['1', to_jsonb(repeat('x', 2000))])")
    with pytest.raises(errors.InvalidParameter, match="body = NULL"):
        sql("SELECT queue_pg.send('jobs', NULL)")
    with pytest.raises(errors.InvalidParameter, match="attributes is a JSON array"):
        sql("SELECT queue_pg.send('jobs', '1', attributes => '[1]')")
    with pytest.raises(errors.InvalidParameter, match="ttl"):
        sql("SELECT queue_pg.send('jobs', '1', ttl => 0)")
    with pytest.raises(errors.InvalidParameter, match="delay = Infinity"):
        sql("SELECT queue_pg.send('jobs', '1', delay => 'infinity')")
    with pytest.raises(errors.InvalidParameter, match="len\\(attributes\\)"):
        sql("SELECT queue_pg.send_batch('jobs', array['1','2']::jsonb[], attributes => array['{}']::jsonb[])")
    with pytest.raises(errors.InvalidParameter):
        sql("SELECT queue_pg.send('jobs', '\"\\u0000\"')")
    with pytest.raises(errors.QueueNotFound):
        sql("SELECT queue_pg.send('nope', '1')")
    assert sql("SELECT count(*) FROM queue_pg.messages") == [(0,)]


def test_receive_rejects_bad_input(sql) -> None:
    sql("SELECT queue_pg.create_queue('jobs', max_lease => 100)")
    for call, param in [
        ("receive('jobs', 0)", "max_messages"),
        ("receive('jobs', 1001)", "max_messages"),
        ("receive('jobs', visibility_timeout => 'NaN')", "visibility_timeout"),
        ("receive('jobs', visibility_timeout => 101)", "max_lease"),
        ("receive('jobs', wait => 21)", "wait"),
    ]:
        with pytest.raises(errors.InvalidParameter, match=param):
            sql(f"SELECT * FROM queue_pg.{call}")


def test_delete_batch_per_entry(sql, conn) -> None:
    sql("SELECT queue_pg.create_queue('jobs', visibility_timeout => 1)")
    sql("SELECT queue_pg.send_batch('jobs', array['1','2','3']::jsonb[])")
    receipts = [r for (r,) in sql("SELECT receipt FROM queue_pg.receive('jobs', 3)")]
    sql("SELECT queue_pg.delete_message('jobs', %s)", receipts[0])
    rows = sql("SELECT * FROM queue_pg.delete_batch('jobs', %s)", [*receipts, "junk"])
    assert rows == [(receipts[0], False, None), (receipts[1], True, None), (receipts[2], True, None),
                    ("junk", False, "InvalidReceipt")]
    with pytest.raises(errors.InvalidParameter, match="duplicate"):
        sql("SELECT * FROM queue_pg.delete_batch('jobs', array['a', 'a'])")


def test_purge_peek_stats_drop(sql, conn) -> None:
    sql("SELECT queue_pg.create_queue('jobs')")
    sql("SELECT queue_pg.send_batch('jobs', array['1','2','3']::jsonb[])")
    sql("SELECT queue_pg.send('jobs', '4', delay => 100)")
    sql("SELECT * FROM queue_pg.receive('jobs')")
    assert sql("SELECT visible, in_flight, delayed FROM queue_pg.queue_stats WHERE queue = 'jobs'") == [(2, 1, 1)]
    assert [b for (b,) in sql("SELECT body FROM queue_pg.peek('jobs', 10)")] == [2, 3]
    assert sql("SELECT visible FROM queue_pg.stats('jobs')") == [(2,)]  # peek changed nothing
    assert sql("SELECT queue_pg.purge('jobs')") == [(4,)]
    assert sql("SELECT queue_pg.drop_queue('jobs')") == [(True,)]
    assert sql("SELECT queue_pg.drop_queue('jobs', if_exists => true)") == [(False,)]
    with pytest.raises(errors.QueueNotFound):
        sql("SELECT queue_pg.drop_queue('jobs')")


def test_drop_of_a_dead_letter_queue_in_use_is_refused(sql) -> None:
    sql("SELECT queue_pg.create_queue('dlq')")
    sql("SELECT queue_pg.create_queue('jobs', dead_letter_queue => 'dlq', max_receive_count => 1)")
    with pytest.raises(errors.QueueInUse):
        sql("SELECT queue_pg.drop_queue('dlq')")


def test_history_rows_and_switch(sql) -> None:
    sql("SELECT queue_pg.create_queue('jobs')")
    sql("SELECT queue_pg.create_queue('quiet', history => false)")
    for q in ("jobs", "quiet"):
        sql("SELECT queue_pg.send(%s, '1', attributes => '{\"type\": \"t\"}')", q)
        [(r,)] = sql("SELECT receipt FROM queue_pg.receive(%s)", q)
        sql("SELECT queue_pg.delete_message(%s, %s)", q, r)
    rows = sql("SELECT queue, outcome, receive_count, type, first_received_at IS NOT NULL FROM queue_pg.message_history")
    assert rows == [("jobs", "deleted", 1, "t", True)]


def test_sweep_makes_history_partitions(sql) -> None:
    sql("SELECT queue_pg.sweep()")
    parts = sql(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'queue_pg.message_history'::regclass"
    )
    assert parts[0][0] >= 4  # default + today + two days ahead


def test_a_day_partition_is_dropped_once_the_longest_retention_has_passed_its_end(sql) -> None:
    """The owner's sweep drops a day's partition whole once its end is older than the longest
    history_retention (here an hour), and makes the days ahead of the time it runs at."""
    sql("SELECT queue_pg.create_queue('jobs', history_retention => 3600)")
    sql("SELECT queue_pg.sweep()")
    [(today,)] = sql("SELECT (now() AT TIME ZONE 'UTC')::date")

    def days() -> set[str]:
        return {r[0] for r in sql(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'queue_pg.message_history'::regclass"
            " AND c.relname ~ '^message_history_[0-9]{8}$'")}

    def name(offset: int) -> str:
        return "message_history_" + (today + timedelta(days=offset)).strftime("%Y%m%d")

    def sweep_at(after_today_ends: str) -> None:  # the partition step of a sweep at that time
        sql("SELECT queue_pg._history_partitions(((%s::date + 1)::timestamp AT TIME ZONE 'UTC')"
            " + %s::interval, 3600)", today, after_today_ends)

    assert {name(0), name(1), name(2)} <= days()
    try:
        sweep_at("59 minutes")  # today ended 59 minutes ago: within the retention, kept
        assert name(0) in days()
        sweep_at("61 minutes")
        assert name(0) not in days() and {name(1), name(2), name(3)} <= days()
    finally:  # the partitions are the database's, not the test's: today's back, tomorrow's+2 gone
        sql(f"DROP TABLE IF EXISTS queue_pg.{name(3)}")
        sql("SELECT queue_pg._history_partitions(now(), 3600, 0)")
        assert {name(0), name(1), name(2)} <= days() and name(3) not in days()


def test_time_offset_moves_only_this_session(sql, conn, clean) -> None:
    advance(conn, 3600)
    with psycopg.connect(clean) as other:
        row = other.execute("SELECT extract(epoch FROM queue_pg.now() - clock_timestamp())").fetchone()
        assert row is not None and abs(float(row[0])) < 5
    row2 = sql("SELECT extract(epoch FROM queue_pg.now() - clock_timestamp())")
    assert float(row2[0][0]) > 3590


def test_delete_batch_with_a_stale_and_the_current_receipt_of_one_message(sql) -> None:
    sql("SELECT queue_pg.create_queue('jobs')")
    sql("SELECT queue_pg.send('jobs', '1')")
    [(old,)] = sql("SELECT receipt FROM queue_pg.receive('jobs', visibility_timeout => 0)")
    [(cur,)] = sql("SELECT receipt FROM queue_pg.receive('jobs')")
    rows = sql("SELECT receipt, deleted FROM queue_pg.delete_batch('jobs', %s)", [old, cur])
    assert rows == [(old, False), (cur, True)]


def test_dead_letter_now_with_reason(sql) -> None:
    sql("SELECT queue_pg.create_queue('dlq')")
    sql("SELECT queue_pg.create_queue('plain')")
    sql("SELECT queue_pg.create_queue('jobs', dead_letter_queue => 'dlq', max_receive_count => 5)")
    [(mid,)] = sql("SELECT queue_pg.send('jobs', '1', attributes => '{\"type\": \"t\"}')")
    [(r,)] = sql("SELECT receipt FROM queue_pg.receive('jobs')")
    assert sql("SELECT queue_pg.dead_letter('jobs', %s, 'unknown task')", r) == [(True,)]
    assert sql("SELECT id, attributes FROM queue_pg.peek('dlq')") == [
        (mid, {"type": "t", "dead_letter_reason": "unknown task"})
    ]
    assert sql("SELECT outcome, lease_expiries FROM queue_pg.message_history") == [("dead_lettered", 0)]
    assert sql("SELECT queue_pg.dead_letter('jobs', %s)", r) == [(False,)]  # gone from jobs
    sql("SELECT queue_pg.send('plain', '1')")
    [(r2,)] = sql("SELECT receipt FROM queue_pg.receive('plain')")
    with pytest.raises(errors.InvalidParameter, match="no dead_letter_queue"):
        sql("SELECT queue_pg.dead_letter('plain', %s)", r2)


def test_planned_retry_is_not_a_lease_expiry(sql, conn) -> None:
    sql("SELECT queue_pg.create_queue('jobs', visibility_timeout => 10)")
    sql("SELECT queue_pg.send_batch('jobs', array['1', '2']::jsonb[])")
    (r1,), (r2,) = sql("SELECT receipt FROM queue_pg.receive('jobs', 2)")
    sql("SELECT queue_pg.change_visibility('jobs', %s, 5, release => true)", r1)  # backoff
    sql("SELECT queue_pg.change_visibility('jobs', %s, 5)", r2)  # a heartbeat, then a crash
    advance(conn, 6)
    assert len(sql("SELECT * FROM queue_pg.receive('jobs', 2)")) == 2
    assert sql("SELECT lease_expiries FROM queue_pg.stats('jobs')") == [(1,)]


def test_update_keeps_lease_with_null_timeout_and_merges_attributes(sql, conn) -> None:
    sql("SELECT queue_pg.create_queue('jobs', visibility_timeout => 10, max_lease => 20)")
    sql("SELECT queue_pg.send('jobs', '{\"step\": 0}', attributes => '{\"type\": \"t\"}')")
    [(r, until)] = sql("SELECT receipt, visible_until FROM queue_pg.receive('jobs')")
    advance(conn, 15)  # a visibility change would pass max_lease from here, a checkpoint does not
    rows = sql(
        "SELECT body, attributes, visible_until FROM queue_pg.update_message('jobs', %s, '{\"step\": 1}', NULL, '{\"error\": \"x\"}')",
        r,
    )
    assert rows == [({"step": 1}, {"type": "t", "error": "x"}, until)]
    with pytest.raises(errors.InvalidParameter, match="attributes is a JSON array"):
        sql("SELECT queue_pg.update_message('jobs', %s, NULL, NULL, '[1]')", r)


@pytest.mark.parametrize(("call", "message", "error"), [
    ("SELECT queue_pg.alter_queue('jobs', clear => ARRAY['colour'])",
     "clear = 'colour' is invalid: allowed message_ttl, dead_letter_queue, max_receive_count,"
     " in_flight_limit", errors.InvalidParameter),
    ("SELECT queue_pg.alter_queue('jobs', clear => ARRAY[NULL])",
     "clear = NULL is invalid: allowed message_ttl", errors.InvalidParameter),
    ("SELECT queue_pg.alter_tuning('jobs', clear => ARRAY['tune_min'])",
     "clear = 'tune_min' is invalid: allowed tune_max", errors.InvalidParameter),
    ("SELECT queue_pg.alter_tuning('jobs', lease_policy => 'smart')",
     "lease_policy = 'smart' is invalid: allowed fixed, per_type", errors.InvalidParameter),
    ("SELECT queue_pg.set_redrive_allow('jobs', 'some')",
     "permission = 'some' is invalid: allowed allow_all, deny_all, by_queue",
     errors.InvalidParameter),
    ("SELECT queue_pg.grant('jobs', 'postgres', 'read')",
     "privilege = 'read' is invalid: allowed send, receive, manage", errors.InvalidParameter),
    ("SELECT queue_pg.set_schedule('s', 'jobs', '* * * * *', '{}', missed => 'later')",
     "missed = 'later' is invalid: allowed skip, catch_up", errors.InvalidSchedule),
])
def test_a_word_outside_its_set_is_named_with_the_set_and_changes_nothing(
    sql, call: str, message: str, error: type[errors.QueueError]
) -> None:
    """Every check of a value against a fixed set of words: one wording, the parameter, the
    value (or NULL) and the words allowed; the queue as it was."""
    sql("SELECT queue_pg.create_queue('jobs', message_ttl => 600)")
    before = sql("SELECT * FROM queue_pg.queues")
    with pytest.raises(error) as raised:
        sql(call)
    assert str(raised.value).startswith(message), str(raised.value)
    assert sql("SELECT * FROM queue_pg.queues") == before
    assert sql("SELECT count(*) FROM queue_pg.periodic") == [(0,)]
