"""Strings a producer or consumer chose reach an operator's terminal only as visible characters.

A type, a dead-letter reason, a body, a task name can hold terminal escapes (ESC sequences that
set a window title or clear the screen; C1 controls that some terminals obey as ESC) and
bidirectional overrides. Real ``queue-pg`` processes and a real worker process show them to an
operator: their output must hold no raw control character, and say the string escaped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from queue_pg import Client, InvalidParameter
from queue_pg.plain import plain

ROOT = Path(__file__).resolve().parents[1]

#: markup, OSC (window title), CSI (clear screen), C1 CSI, a bidirectional override, a line break
HOSTILE = "[/] [bold]t\x1b]0;pwned\x07\x1b[2J\x9b31m\u202eevil\nFAKE LINE"
ESCAPED = plain(HOSTILE)
#: what no operator output may hold raw (newline and tab are the output's own)
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def env() -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TERM")}
    return {**keep, "PYTHONPATH": str(ROOT), "COLUMNS": "400", "NO_COLOR": "1"}


def cli(dsn: str, *args: str) -> str:
    """stdout and stderr of a real ``queue-pg`` process."""
    done = subprocess.run(
        [sys.executable, "-c", "from queue_pg.ops.cli import main; main()", "--dsn", dsn, *args],
        env=env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def assert_safe(output: str) -> None:
    raw = RAW.findall(output)
    assert not raw, f"raw control characters {raw!r} in {output!r}"


def test_the_cli_shows_hostile_strings_escaped(client: Client, clean: str) -> None:
    client.create_queue("hx-dlq")
    client.create_queue("hx", dead_letter_queue="hx-dlq", max_receive_count=5)
    for n in range(3):  # finished messages of the hostile type: advise lists the type
        client.send("hx", {"n": n}, attributes={"type": HOSTILE})
    for m in client.receive("hx", max_messages=3):
        client.delete("hx", m.receipt or "")
    client.send("hx", {"text": HOSTILE}, attributes={"type": HOSTILE})
    client.send("hx", {"n": "dead"}, attributes={"type": HOSTILE})

    advised = cli(clean, "advise", "hx")
    assert_safe(advised)
    assert "pwned" in advised and "\\x1b]0;pwned\\x07" in advised

    peeked = cli(clean, "peek", "hx", "-n", "10")
    assert_safe(peeked)
    assert "pwned" in peeked
    as_json = cli(clean, "peek", "hx", "-n", "10", "--json")
    assert_safe(as_json)
    assert "\\u009b" in as_json and "\\u202e" in as_json  # still JSON: the same strings

    received = client.receive("hx", max_messages=10, visibility_timeout=600)
    dead = next(m for m in received if m.body == {"n": "dead"})
    assert client.dead_letter("hx", dead.receipt or "", reason=HOSTILE)
    shown = cli(clean, "peek", "hx-dlq")
    assert_safe(shown)
    assert "dead_letter_reason" in shown and "pwned" in shown
    for args in (("stats",), ("stats", "hx"), ("list",)):
        assert_safe(cli(clean, *args))


def test_an_error_quoting_a_hostile_value_is_escaped(clean: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "from queue_pg.ops.cli import main; main()", "--dsn", clean,
         "peek", "no\x1b]0;pwned\x07queue"],
        env=env(), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert_safe(done.stdout + done.stderr)


def test_worker_logs_show_hostile_task_names_and_reasons_escaped(
    client: Client, clean: str, tmp_path: Path
) -> None:
    """A message naming a task that does not exist is rejected and dead-lettered, and a task
    fails with an error quoting its argument; the worker's log lines name the task and the
    reason or error: escaped, each on one line."""
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS worker_runs (n bigserial PRIMARY KEY, task text,"
                  " key text, msg_id bigint, attempt int, pid int, event text,"
                  " at timestamptz DEFAULT clock_timestamp(), data jsonb)")
    client.create_queue("wq-dlq")
    client.create_queue("wq", dead_letter_queue="wq-dlq", max_receive_count=1)
    client.send("wq", {"task": HOSTILE, "args": [], "kwargs": {}},
                attributes={"type": HOSTILE})
    client.send("wq", {"task": "fail", "args": [], "kwargs": {"key": HOSTILE}})
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "queue_pg.jobs.worker_cli", "worker_app", "--queue", "wq"],
            env={**env(), "QUEUE_PG_DSN": clean,
                 "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])},
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120  # a liveness bound for a loaded machine
        while client.stats("wq-dlq").visible < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert client.stats("wq-dlq").visible == 2
        time.sleep(0.5)  # the log lines follow the moves
    finally:
        worker.terminate()
        worker.wait(60)
        with psycopg.connect(clean, autocommit=True) as c:  # the run's database: leave no table
            c.execute("DROP TABLE IF EXISTS worker_runs")
    text = log.read_text()
    assert_safe(text)
    assert "boom [/] [bold]t\\x1b]0;pwned" in text and "FAKE LINE" in text
    assert not any(line.startswith("FAKE LINE") for line in text.splitlines())


def test_queue_names_cannot_carry_control_characters(client: Client) -> None:
    """Queue names reach every surface unescaped by design of SQL's rule: letters, digits,
    '_' and '-' only; a name with an escape is refused and nothing is made."""
    for name in ("a\x1b]0;x\x07", "a\x9bb", "a\u202eb", "a b", "a[/]"):
        with pytest.raises(InvalidParameter, match="name"):
            client.create_queue(name)
    assert client.list_queues() == []
