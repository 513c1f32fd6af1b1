"""Periodic tasks against a real server: cron evaluated in SQL, ticks fired once however many
worker processes race for them, missed ticks skipped or caught up, the schedules view."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest

import queue_pg
from queue_pg.errors import InvalidSchedule
from queue_pg.jobs.periodic import periodic
from queue_pg.jobs.tasks import Registry, Task
from tests.procs import stop

ROOT = Path(__file__).resolve().parents[1]
UTC = timezone.utc


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


@pytest.mark.parametrize(("cron", "tz", "after", "expected"), [
    ("*/5 * * * *", "UTC", "2026-01-01 10:03:00+00", "2026-01-01 10:05:00+00"),
    ("* * * * * *", "UTC", "2026-01-01 10:03:00.5+00", "2026-01-01 10:03:01+00"),
    ("*/15 * * * * *", "UTC", "2026-01-01 10:03:59+00", "2026-01-01 10:04:00+00"),
    # 09:00 in Paris on weekdays: Saturday 3 January -> Monday 5 January, 08:00 UTC (winter)
    ("0 9 * * mon-fri", "Europe/Paris", "2026-01-03 10:03:00+00", "2026-01-05 08:00:00+00"),
    ("0 9 * * 1-5", "Europe/Paris", "2026-07-03 10:03:00+00", "2026-07-06 07:00:00+00"),
    # 02:30 does not exist on 29 March 2026 in Paris: PostgreSQL's reading, 03:30 CEST
    ("30 2 * * *", "Europe/Paris", "2026-03-28 12:00:00+00", "2026-03-29 01:30:00+00"),
    # day-of-month and day-of-week both restricted: either matches (Vixie cron)
    ("0 0 1,15 * wed", "UTC", "2026-03-29 12:00:00+00", "2026-04-01 00:00:00+00"),
    ("0 0 1 1 *", "UTC", "2026-03-29 12:00:00+00", "2027-01-01 00:00:00+00"),
    ("@hourly", "UTC", "2026-03-29 12:00:00+00", "2026-03-29 13:00:00+00"),
    ("0 12 * jan,jul sun", "UTC", "2026-01-31 00:00:00+00", "2026-07-05 12:00:00+00"),
    ("0 0 * * 7", "UTC", "2026-03-29 12:00:00+00", "2026-04-05 00:00:00+00"),
])
def test_cron_next_in_sql(conn: psycopg.Connection, cron: str, tz: str, after: str,
                          expected: str) -> None:
    got = conn.execute("SELECT queue_pg._cron_next(%s, %s, %s)", [cron, tz, at(after)]).fetchone()
    assert got is not None and got[0] == at(expected)


@pytest.mark.parametrize(("cron", "tz", "what"), [
    ("61 * * * *", "UTC", "schedule = '61 * * * *' is invalid"),
    ("* * * *", "UTC", "schedule = '* * * *' is invalid"),
    ("0 0 30 2 *", "UTC", "one that fires"),
    ("*/0 * * * *", "UTC", "is invalid"),
    ("* * * * *", "Mars/Olympus", "tz = 'Mars/Olympus' is invalid"),
])
def test_invalid_schedules_are_refused(client: queue_pg.Client, cron: str, tz: str,
                                       what: str) -> None:
    client.create_queue("q")
    with pytest.raises(InvalidSchedule, match=what.replace("*", r"\*")):
        client.set_schedule("s", "q", cron, {}, tz=tz)
    with pytest.raises(InvalidSchedule, match="missed = 'later'"):
        client.set_schedule("s", "q", "* * * * *", {}, missed="later")
    assert client.schedules() == []


def test_registering_again_keeps_the_next_run_and_a_new_cron_restarts_it(
    client: queue_pg.Client, conn: psycopg.Connection
) -> None:
    client.create_queue("q")
    first = client.set_schedule("s", "q", "0 3 * * *", {"a": 1})
    assert first.created
    conn.execute("UPDATE queue_pg.periodic SET next_run = '2020-01-01'")
    again = client.set_schedule("s", "q", "0 3 * * *", {"a": 2})
    assert not again.created and again.next_run == at("2020-01-01 00:00:00+00")
    moved = client.set_schedule("s", "q", "0 4 * * *", {"a": 2})
    assert moved.next_run > datetime.now(UTC) and moved.next_run.minute == 0
    assert client.drop_schedule("s", "q") and not client.drop_schedule("s", "q")


def _late(conn: psycopg.Connection, name: str, ticks_ago: int) -> None:
    """Move a minutely schedule's next run back in SQL, as if no worker ran for a while."""
    conn.execute("UPDATE queue_pg.periodic SET next_run = date_trunc('minute', now())"
                 " - make_interval(mins => %s) WHERE name = %s", [ticks_ago, name])


def test_missed_ticks_are_skipped_or_caught_up_to_the_bound(
    client: queue_pg.Client, conn: psycopg.Connection
) -> None:
    client.create_queue("q")
    client.set_schedule("skip", "q", "* * * * *", {"s": 1})
    client.set_schedule("catch", "q", "* * * * *", {"c": 1}, missed="catch_up", catch_up=3)
    _late(conn, "skip", 10)
    _late(conn, "catch", 10)
    fired = client.fire_schedules(["q"])
    by = Counter(f.schedule for f in fired)
    # the current minute's tick is within the 60 s grace: sent by both; of the 10 late ones
    # skip sends none, catch_up the latest 3
    assert by == {"skip": 1, "catch": 4}, fired
    catch = sorted(f.tick for f in fired if f.schedule == "catch")
    assert [t.minute for t in catch] == [
        (catch[-1] - timedelta(minutes=k)).minute for k in (3, 2, 1, 0)]
    rows = {s.schedule: s for s in client.schedules()}
    assert rows["skip"].skipped == 10 and rows["catch"].skipped == 7
    assert rows["catch"].last_message_id == max(f.message_id for f in fired
                                                 if f.schedule == "catch")
    assert rows["catch"].next_run > datetime.now(UTC) and rows["catch"].type is None
    assert client.fire_schedules() == []  # nothing due until the next minute
    msgs = client.receive("q", 10)
    ticks = {m.attributes["tick"] for m in msgs if m.body == {"c": 1}}
    assert len(ticks) == 4 and all(m.attributes["schedule"] in ("skip", "catch") for m in msgs)


def test_task_schedules_and_periodic_registrations() -> None:
    reg = Registry()
    t = Task(lambda: None, queue="q", name="t", registry=reg, schedule="*/5 * * * *",
             tz="Europe/Paris")
    u = Task(lambda days: None, queue="q", name="u", registry=reg)
    periodic(u, "0 3 * * *", name="u-nightly", args=(30,))
    assert reg.schedules["t"].cron == "*/5 * * * *" and reg.schedules["t"].tz == "Europe/Paris"
    assert reg.schedules["u-nightly"].task is u and t.schedule == "*/5 * * * *"
    with pytest.raises(TypeError):
        periodic(u, "0 3 * * *", name="u-bad")  # the arguments do not fit
    with pytest.raises(ValueError, match="missed"):
        periodic(u, "0 3 * * *", name="u-2", args=(1,), missed="sometimes")


@pytest.mark.slow
def test_four_worker_processes_fire_each_tick_once(clean: str,
                                                   request: pytest.FixtureRequest) -> None:
    """4 worker processes race for an every-second schedule for several seconds; each tick's
    run is recorded by the task itself and counted: exactly one per tick, none missing."""
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS periodic_runs")
        c.execute("CREATE TABLE periodic_runs (tick timestamptz, pid integer)")

    def drop() -> None:  # the run's database is shared by later tests
        with psycopg.connect(clean, autocommit=True) as c:
            c.execute("DROP TABLE IF EXISTS periodic_runs")

    request.addfinalizer(drop)
    env = {**os.environ, "QUEUE_PG_DSN": clean,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    log = (Path(os.environ.get("TMPDIR", "/tmp")) / f"periodic_{os.getpid()}.log").open("w+b")
    sup = subprocess.Popen(
        [sys.executable, "-m", "queue_pg.jobs.worker_cli", "periodic_app.ticks", "--processes", "4",
         "--concurrency", "2", "--wait", "1", "--grace-period", "10"],
        env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        with psycopg.connect(clean, autocommit=True) as c:
            while time.monotonic() < deadline:  # 8 ticks run after all 4 processes started
                row = c.execute("SELECT count(DISTINCT pid), count(*) FROM periodic_runs").fetchone()
                assert row is not None
                if row[1] >= 8 and sup.poll() is None:
                    break
                time.sleep(0.5)
            started = time.monotonic()
            while time.monotonic() - started < 5:
                time.sleep(0.5)
    finally:
        stop(sup)  # SIGTERM: the supervisor stops its processes (it is killed after 30 s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sup.pid, signal.SIGKILL)  # whatever a hung supervisor left behind
    log.seek(0)
    output = log.read().decode(errors="replace")
    assert sup.returncode == 0, output
    with psycopg.connect(clean, autocommit=True) as c:
        runs = [r[0] for r in c.execute("SELECT tick FROM periodic_runs")]
        left = [r[0] for r in c.execute(
            "SELECT (attributes ->> 'tick')::timestamptz FROM queue_pg.messages")]
        procs = c.execute("SELECT count(DISTINCT pid) FROM periodic_runs").fetchone()
    per_tick = Counter(runs + left)
    assert len(per_tick) >= 10, output
    assert set(per_tick.values()) == {1}, [t for t, n in per_tick.items() if n > 1]
    ticks = sorted(per_tick)
    assert ticks[-1] - ticks[0] == timedelta(seconds=len(ticks) - 1)  # none missing
    assert procs is not None and procs[0] >= 2, "the runs went to more than one process"


def test_the_async_worker_fires_schedules_too(clean: str) -> None:
    import asyncio

    reg = Registry()
    runs: list[str] = []

    async def beat() -> None:
        runs.append(queue_pg.current_job().message.attributes["tick"])

    Task(beat, queue="aticks", name="beat", registry=reg, schedule="* * * * * *", create=True)

    async def main() -> None:
        async with queue_pg.AsyncClient(clean, sweep_interval=None) as ac:
            worker = queue_pg.AsyncWorker(ac, "aticks", reg, wait=1)
            run = asyncio.create_task(worker.run(signals=()))
            for _ in range(200):
                if len(runs) >= 2:
                    break
                await asyncio.sleep(0.05)
            worker.stop()
            await run
            assert [s.schedule for s in await ac.schedules()] == ["beat"]

    asyncio.run(main())
    assert len(runs) >= 2 and len(set(runs)) == len(runs)


def test_schedule_bounds_name_the_parameter_and_range(client: queue_pg.Client) -> None:
    client.create_queue("q")
    with pytest.raises(queue_pg.InvalidParameter, match="catch_up = 1001 is out of range: allowed 0 to 1000 ticks"):
        client.set_schedule("s", "q", "* * * * *", {}, catch_up=1001)
    with pytest.raises(queue_pg.InvalidParameter, match="grace = 7200 is out of range: allowed 0 to 3600"):
        client.set_schedule("s", "q", "* * * * *", {}, grace=7200)
    with pytest.raises(InvalidSchedule, match="name = 'a b' is invalid"):
        client.set_schedule("a b", "q", "* * * * *", {})
