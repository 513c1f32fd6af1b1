"""The ``queue-pg`` command line, through click's CliRunner, on the test database."""

from __future__ import annotations

import json
import re
import uuid

import psycopg
import pytest
from click.testing import CliRunner, Result
from psycopg import conninfo

from queue_pg.client import Client
from queue_pg.ops import cli
from queue_pg.ops.cli import queues as queue_commands


def run(dsn: str, *args: str, input: str | None = None, code: int = 0) -> Result:
    result = CliRunner().invoke(cli.main, ["--dsn", dsn, *args], input=input)
    assert result.exit_code == code, (result.output, result.exception)
    return result


def receive_json(dsn: str, queue: str, *args: str) -> list[dict]:  # type: ignore[type-arg]
    out = run(dsn, "receive", queue, "--json", *args).stdout
    return [json.loads(line) for line in out.splitlines()]


def test_says_which_database(clean: str) -> None:
    result = run(clean, "list")
    assert "(--dsn)" in result.stderr
    assert "no queues yet" in result.stderr


def test_dsn_from_environment(clean: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEUE_PG_DSN", clean)
    result = CliRunner().invoke(cli.main, ["list"])
    assert result.exit_code == 0, result.output
    assert "(QUEUE_PG_DSN)" in result.stderr


def test_migrate_and_sql(clean: str) -> None:
    assert "up to date" in run(clean, "migrate").stdout
    script = CliRunner().invoke(cli.main, ["sql"]).stdout
    assert script.startswith("-- queue_pg install script")
    assert "CREATE OR REPLACE FUNCTION queue_pg.receive" in script
    assert script.rstrip().endswith("COMMIT;")


def test_create_alter_list_drop(clean: str) -> None:
    run(clean, "create", "dlq")
    out = run(clean, "create", "jobs", "--visibility-timeout", "90", "--message-ttl", "never",
              "--delay", "0", "--max-message-size", "2048", "--receive-wait", "2",
              "--max-lease", "1h", "--dead-letter-queue", "dlq", "--max-receive-count", "5",
              "--in-flight-limit", "100", "--no-history", "--history-retention", "2h").stdout
    assert re.search(r"visibility_timeout\s+│ 1m30s", out)
    assert re.search(r"message_ttl\s+│ never", out)
    assert re.search(r"history\s+│ off", out)

    out = run(clean, "alter", "jobs", "--message-ttl", "4d", "--clear", "in_flight_limit",
              "--clear", "dead_letter_queue", "--clear", "max_receive_count", "--history").stdout
    assert re.search(r"message_ttl\s+│ 4d", out)
    assert re.search(r"in_flight_limit\s+│ -", out)
    assert re.search(r"dead_letter_queue\s+│ -", out)
    out = run(clean, "alter", "jobs", "--message-ttl", "never").stdout
    assert re.search(r"message_ttl\s+│ never", out)

    listing = run(clean, "list").stdout
    assert "jobs" in listing and "dlq" in listing and "1m30s" in listing and "2048" in listing

    assert "dropped queue jobs" in run(clean, "drop", "jobs").stdout
    assert "no queue jobs" in run(clean, "drop", "jobs", "--if-exists").stdout
    assert "jobs" not in run(clean, "list").stdout


def test_send_receive_delete(clean: str) -> None:
    run(clean, "create", "q")
    ids = run(clean, "send", "q", '{"n": 1}', "--attr", "type=greeting", "--ttl", "60").stdout
    assert ids.split() == ["1"] or len(ids.split()) == 1
    batch = run(clean, "send", "q", "-", input='{"n": 2}\n\n[3]\n"four"\n').stdout
    assert len(batch.split()) == 3

    table = run(clean, "receive", "q").stdout
    assert '{"n": 1}' in table and '{"type": "greeting"}' in table
    got = receive_json(clean, "q", "-n", "5", "--visibility-timeout", "30")
    assert [m["body"] for m in got] == [{"n": 2}, [3], "four"]
    assert all(m["receive_count"] == 1 for m in got)

    receipts = [m["receipt"] for m in got]
    assert "deleted" in run(clean, "delete", "q", receipts[0]).stdout
    assert "already gone" in run(clean, "delete", "q", receipts[0]).stdout
    out = run(clean, "delete", "q", *receipts[1:]).stdout
    assert out.count("deleted") == 2


def test_stale_receipt_is_one_red_line(clean: str) -> None:
    run(clean, "create", "q")
    run(clean, "send", "q", "1")
    [first] = receive_json(clean, "q", "--visibility-timeout", "0")
    [second] = receive_json(clean, "q")
    assert second["receive_count"] == 2
    result = run(clean, "delete", "q", first["receipt"], code=1)
    assert result.stderr.splitlines()[-1].startswith("error: ")
    assert "Traceback" not in result.output
    run(clean, "send", "q", "2")
    [other] = receive_json(clean, "q")
    result = run(clean, "delete", "q", first["receipt"], other["receipt"], code=1)
    assert f"refused (StaleReceipt) {first['receipt']}" in result.stderr
    assert f"deleted {other['receipt']}" in result.stdout
    assert "error: 1 of 2 receipts refused" in result.stderr
    with Client(clean) as client:
        assert client.stats("q").stale_receipts == 2


@pytest.mark.parametrize(
    "args",
    [
        ("create", "bad name!"),
        ("create", "q", "--visibility-timeout", "-1"),
        ("send", "missing", "{}"),
        ("receive", "missing"),
        ("delete", "missing", "x"),
        ("peek", "missing"),
        ("purge", "missing", "--yes"),
        ("stats", "missing"),
        ("redrive", "missing"),
        ("drop", "missing"),
        ("alter", "missing", "--delay", "1"),
    ],
)
def test_queue_errors_exit_1_without_traceback(clean: str, args: tuple[str, ...]) -> None:
    result = run(clean, *args, code=1)
    last = result.stderr.splitlines()[-1]
    assert last.startswith("error: ") and "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize(
    ("args", "stdin"),
    [
        (("send", "q", "{bad"), None),
        (("send", "q", "-"), '{"ok": 1}\n{"not": json\n'),
        (("send", "q", "[1, 2"), None),
        (("send", "q", ""), None),
        (("send", "q", "1", "--attr", "novalue"), None),
        (("create", "q", "--message-ttl", "soon"), None),
    ],
)
def test_bad_input_is_a_usage_error(clean: str, args: tuple[str, ...], stdin: str | None) -> None:
    run(clean, "create", "q")
    result = run(clean, *args, input=stdin, code=2)
    assert "Usage:" in result.stderr
    with Client(clean) as client:
        assert client.peek("q") == []  # nothing was sent


def test_not_migrated_database(server_dsn: str) -> None:
    name = f"queue_pg_empty_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_dsn, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    params = conninfo.conninfo_to_dict(server_dsn) | {"dbname": name}
    try:
        result = run(conninfo.make_conninfo(**params), "list", code=1)  # type: ignore[arg-type]
        assert "run `queue-pg migrate`" in result.stderr
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as c:
            c.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_peek_purge_sweep_redrive(clean: str) -> None:
    run(clean, "create", "dlq")
    run(clean, "create", "q", "--dead-letter-queue", "dlq", "--max-receive-count", "1")
    run(clean, "send", "q", '{"poison": true}')
    receive_json(clean, "q", "--visibility-timeout", "0")
    assert receive_json(clean, "q") == []  # the second receive dead-letters it
    assert '{"poison": true}' in run(clean, "peek", "dlq").stdout
    [peeked] = map(json.loads, run(clean, "peek", "dlq", "-n", "5", "--json").stdout.splitlines())
    assert peeked["receipt"] is None

    assert "moved 1 message out of dlq" in run(clean, "redrive", "dlq", "--to", "q",
                                              "--limit", "5").stdout
    assert "no messages" in run(clean, "peek", "dlq").stderr

    assert "swept 0 expired messages" in run(clean, "sweep").stdout
    run(clean, "purge", "q", input="n\n", code=1)  # declined
    assert "purged 1 message from q" in run(clean, "purge", "q", input="y\n").stdout
    assert "purged 0 messages" in run(clean, "purge", "q", "--yes").stdout


def test_stats_all_and_watch(clean: str, monkeypatch: pytest.MonkeyPatch) -> None:
    run(clean, "create", "a")
    run(clean, "create", "b")
    run(clean, "send", "a", "1")
    out = run(clean, "stats").stdout
    assert re.search(r"^a\s+1\s+0\s+0\s+0\s", out, re.M) and re.search(r"^b\s+0\s", out, re.M)

    ticks = iter([None, None])

    def sleep(_: float) -> None:
        if next(ticks, KeyboardInterrupt) is KeyboardInterrupt:
            raise KeyboardInterrupt

    monkeypatch.setattr(queue_commands, "pause", sleep)
    out = run(clean, "stats", "--watch", "a").stdout
    assert re.search(r"^a\s+1\s", out, re.M)


def test_stats_shows_the_flows_within_80_columns(clean: str) -> None:
    with Client(clean, sweep_interval=None) as c:
        c.create_queue("dlq")
        c.create_queue("emails-outbound", dead_letter_queue="dlq", max_receive_count=1)
        for part in (range(10000), range(2345)):
            c.send_batch("emails-outbound", list(part))
        for m in c.receive("emails-outbound", 3):
            c.dead_letter("emails-outbound", m.receipt, "bad")
        c.receive("emails-outbound", 2)
        c.sweep()  # a sample: the flows "since created" exist at once, the last minute's not yet
    for flows in ("1m", "1h", "total"):
        result = CliRunner(env={"COLUMNS": "80"}).invoke(
            cli.main, ["--dsn", clean, "stats", "--flows", flows])
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        assert max(len(line) for line in lines) <= 80
        header = " ".join(lines[:4])
        for word in ("queue", "visible", "flight", "delayed", "DLQ", "oldest", "sent", "recv",
                     "del", "expiry", "stale"):
            assert re.search(rf"\b{word}\b", header), (word, result.stdout)
        row = next(line.split() for line in lines if line.startswith("emails-outbound"))
        # counts past 1,000 per state are estimates (marked ~), in top's short form
        assert row[:6] == ["emails-outbound", "~12.3k", "2", "0", "3", row[5]]
        assert row[6:8] == (["12.3k", "5"] if flows == "total" else ["-", "-"])


@pytest.mark.slow
def test_demo_quick(clean: str) -> None:
    result = run(clean, "demo", "--quick")
    out = result.stdout
    counts = {m[1]: int(m[2]) for m in re.finditer(r"^ {2}([a-z -]+?)\s+(\d+)\s", out, re.M)}
    assert counts["sent"] == counts["deleted"] + counts["dead-lettered"]
    assert counts["dead-lettered"] == 1
    assert counts["redelivered"] >= 1
    assert counts["still queued"] == 0
    assert "redelivered, receive_count=2" in out
    assert "heartbeat: lease extended" in out
    assert "every message accounted for" in out
    assert "select * from queue_pg.queue_stats;" in out


def test_alter_clear_of_a_setting_that_cannot_be_null_is_refused_by_sql(clean: str) -> None:
    run(clean, "create", "jobs")
    result = run(clean, "alter", "jobs", "--clear", "visibility_timeout", code=1)
    assert "clear = 'visibility_timeout' is invalid" in result.output


def test_version() -> None:
    result = CliRunner().invoke(cli.main, ["-V"])
    assert result.exit_code == 0
    assert re.fullmatch(r"queue-pg, version \S+\n", result.stdout)


def test_send_takes_json_or_a_word(clean: str) -> None:
    run(clean, "create", "q")
    run(clean, "send", "q", "hello")
    run(clean, "send", "q", '{"a":1}')
    run(clean, "send", "q", "42")
    run(clean, "send", "q", "42", "--string")
    run(clean, "send", "q", "-", input="hi there\n[1]\n")
    bodies = [json.loads(line)["body"]
              for line in run(clean, "peek", "q", "--json").stdout.splitlines()]
    assert bodies == ["hello", {"a": 1}, 42, "42", "hi there", [1]]


def test_wrong_dsn_is_one_red_line_with_the_hint() -> None:
    result = CliRunner().invoke(cli.main, ["--dsn", "host=127.0.0.1 port=1 connect_timeout=5",
                                           "list"])
    assert result.exit_code == 1, result.output
    assert result.stderr.count("error: ") == 1 and "Traceback" not in result.output
    assert "cannot reach the database" in result.stderr and "check the DSN" in result.stderr


def test_redrive_tasks_start_list_cancel_and_the_one_shot_form(clean: str) -> None:
    run(clean, "create", "dlq")
    run(clean, "create", "q", "--dead-letter-queue", "dlq", "--max-receive-count", "1")
    with psycopg.connect(clean, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO queue_pg.messages (queue_id, source_queue_id, visible_at, enqueued_at, body)"
            " SELECT d.id, s.id, now() - interval '1 s', now(), to_jsonb(i)"
            " FROM queue_pg.queues d, queue_pg.queues s, generate_series(1, 10) i"
            " WHERE d.name = 'dlq' AND s.name = 'q'")
    started = run(clean, "redrive", "start", "dlq", "--rate", "2").stdout
    task = int(started.split()[2])
    listed = run(clean, "redrive", "list", "dlq").stdout
    assert "running" in listed and "(source)" in listed
    assert "cancelled" in run(clean, "redrive", "cancel", str(task)).stdout
    assert "moved 8 messages out of dlq" in run(clean, "redrive", "dlq").stdout  # as before
    assert "completed" in run(clean, "redrive", "start", "dlq", "--follow").stdout
    assert "redrive task 999999 does not exist" in run(clean, "redrive", "cancel", "999999", code=1).stderr
