"""Install and upgrade: migrate(), the DBA's install script, the wheel, and queue_pg.tables.

Each test that installs gets a scratch database of its own on the test server.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import CheckConstraint, Column, Integer, MetaData, Table, inspect, text
from sqlalchemy.engine import Connection as SAConnection

import queue_pg
from queue_pg import tables
from queue_pg.install import (
    MigrationResult,
    alembic_config,
    current_revision,
    head_revision,
    install_script,
    make_engine,
    migrate,
)

ROOT = Path(__file__).resolve().parents[1]


def roundtrip(dsn: str, queue: str = "jobs") -> None:
    """The install works: a message goes through create, send, receive, delete."""
    with queue_pg.Client(dsn, sweep_interval=None) as client:
        client.create_queue(queue)
        mid = client.send(queue, {"hello": "install"})
        [m] = client.receive(queue)
        assert (m.id, m.body) == (mid, {"hello": "install"})
        assert client.delete(queue, m.receipt or "") is True


def test_migrate_installs_then_is_a_no_op_that_keeps_data(scratch: str) -> None:
    assert current_revision(scratch) is None
    first = migrate(scratch)
    head = head_revision()
    assert first == MigrationResult(before=None, after=head, api_applied=True)
    assert first.upgraded
    assert current_revision(scratch) == head

    with queue_pg.Client(scratch, sweep_interval=None) as client:
        client.create_queue("jobs", visibility_timeout=60)
        mid = client.send("jobs", {"keep": "me"})
        again = client.migrate()
        assert again == MigrationResult(before=head, after=head, api_applied=False)
        assert not again.upgraded
        forced = migrate(scratch, reapply_api=True)  # functions and views re-created
        assert forced == MigrationResult(before=head, after=head, api_applied=True)
        assert client.get_queue("jobs").visibility_timeout == 60
        [m] = client.receive("jobs")
        assert (m.id, m.body) == (mid, {"keep": "me"})
        assert client.delete("jobs", m.receipt or "") is True


def test_migrate_reapplies_changed_api_and_keeps_data(scratch: str) -> None:
    migrate(scratch)
    with queue_pg.Client(scratch, sweep_interval=None) as client:
        client.create_queue("jobs")
        mid = client.send("jobs", "still here")
        # an older api in the database: a function that differs, and its checksum
        with psycopg.connect(scratch, autocommit=True) as c:
            c.execute(
                "CREATE OR REPLACE FUNCTION queue_pg.purge(queue text) RETURNS bigint"
                " LANGUAGE sql AS $$ SELECT -1::bigint $$"
            )
            c.execute("COMMENT ON TABLE queue_pg.alembic_version IS 'queue_pg api sha256:old'")
        assert client.purge("nope") == -1
        result = migrate(scratch)
        assert result.api_applied and not result.upgraded
        assert [m.id for m in client.peek("jobs")] == [mid]
        assert client.purge("jobs") == 1  # the current function again
        assert migrate(scratch).api_applied is False


def test_concurrent_migrations_of_a_fresh_database(scratch: str) -> None:
    results: list[MigrationResult] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(migrate(scratch))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    head = head_revision()
    assert sorted(r.before or "" for r in results) == ["", head, head, head]
    assert all(r.after == head for r in results)
    roundtrip(scratch)


@pytest.mark.slow
def test_concurrent_migrations_from_processes(scratch: str) -> None:
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        results = pool.map(migrate, [scratch] * 3)
    head = head_revision()
    assert sorted(r.before or "" for r in results) == ["", head, head]
    roundtrip(scratch)


def test_migrate_through_a_psycopg_connection_hands_it_back(scratch: str) -> None:
    with psycopg.connect(scratch, autocommit=True) as c:
        assert migrate(c).before is None
        assert c.autocommit and not c.closed
        assert c.execute("SELECT count(*) FROM queue_pg.queues").fetchone() == (0,)
    roundtrip(scratch)


def downgrade(dsn: str, revision: str) -> None:
    engine = make_engine(dsn)
    try:
        with engine.connect() as conn:
            command.downgrade(alembic_config(connection=conn), revision)
    finally:
        engine.dispose()


@pytest.mark.slow
def test_downgrade_of_access_control_and_up_again(scratch: str) -> None:
    migrate(scratch)
    with queue_pg.Client(scratch, sweep_interval=None) as client:
        client.create_queue("jobs")
        mid = client.send("jobs", "kept")
        client.grant("jobs", "queue_pg_consumer", "receive")
    downgrade(scratch, "0001")
    assert current_revision(scratch) == "0001"
    with psycopg.connect(scratch, autocommit=True) as c:
        assert c.execute("SELECT to_regclass('queue_pg.grants')").fetchone() == (None,)
        # 0001's access again: functions run as their caller, PUBLIC may call them, and the
        # group roles (which stay: they are the cluster's) hold nothing here
        assert c.execute(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'queue_pg'::regnamespace"
            " AND (prosecdef OR EXISTS (SELECT 1 FROM unnest(proconfig) c"
            "                           WHERE c ~ '^(search_path|plan_cache_mode)='))"
        ).fetchone() == (0,)
        assert c.execute(
            "SELECT has_function_privilege('queue_pg_producer', 'queue_pg.peek(text, int)',"
            " 'EXECUTE'), has_schema_privilege('queue_pg_producer', 'queue_pg', 'USAGE')"
        ).fetchone() == (True, False)
        assert c.execute(
            "SELECT count(*) FROM pg_roles WHERE rolname ~ '^queue_pg_(admin|producer|consumer)$'"
        ).fetchone() == (3,)
        assert c.execute("SELECT id, body FROM queue_pg.messages").fetchall() == [(mid, "kept")]
    again = migrate(scratch)
    assert (again.before, again.after, again.api_applied) == ("0001", head_revision(), True)
    with queue_pg.Client(scratch, sweep_interval=None) as client:
        assert client.list_grants() == []
        assert [m.id for m in client.peek("jobs")] == [mid]
    roundtrip(scratch, "jobs2")
    downgrade(scratch, "base")
    assert current_revision(scratch) is None


def test_downgrade_below_per_queue_schedule_names_refuses_a_name_two_queues_use(
    scratch: str,
) -> None:
    """Revision 0014 keys schedules by (queue, name); going back below it needs names unique
    again: the downgrade stops, naming the schedule and its queues, and changes nothing."""
    migrate(scratch)
    with queue_pg.Client(scratch, sweep_interval=None) as client:
        for q in ("a", "b"):
            client.create_queue(q)
            client.set_schedule("nightly", q, "0 3 * * *", {"q": q})
    with pytest.raises(Exception, match=r"nightly \(queues a, b\)"):
        downgrade(scratch, "0013")
    assert current_revision(scratch) == head_revision()
    with queue_pg.Client(scratch, sweep_interval=None) as client:
        assert client.drop_schedule("nightly", "b")
    downgrade(scratch, "0013")
    with psycopg.connect(scratch, autocommit=True) as c:
        assert c.execute("SELECT name FROM queue_pg.periodic").fetchall() == [("nightly",)]
    assert migrate(scratch).after == head_revision()
    with queue_pg.Client(scratch, sweep_interval=None) as client:
        assert [(s.schedule, s.queue) for s in client.schedules()] == [("nightly", "a")]
        assert client.set_schedule("nightly", "b", "0 3 * * *", {}).created


def test_install_script_gives_a_working_install_that_migrate_leaves_alone(scratch: str) -> None:
    script = install_script()
    assert script.count("BEGIN;") == 1 and script.rstrip().endswith("COMMIT;")
    with psycopg.connect(scratch, autocommit=True) as c:
        c.execute(script)
    head = head_revision()
    assert current_revision(scratch) == head
    roundtrip(scratch)
    assert migrate(scratch) == MigrationResult(before=head, after=head, api_applied=False)


def test_install_script_is_all_or_nothing(scratch: str) -> None:
    with psycopg.connect(scratch, autocommit=True) as c:
        c.execute("CREATE SCHEMA queue_pg; CREATE TABLE queue_pg.queues (x int)")  # in the way
        with pytest.raises(psycopg.errors.DuplicateTable):
            c.execute(install_script())
        c.execute("ROLLBACK")  # the script's own transaction, failed
        rows = c.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'queue_pg' ORDER BY 1"
        ).fetchall()
    assert rows == [("queues",)]  # nothing of the failed script stayed behind


# --- the wheel --------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_wheel_ships_sql_and_migrations_and_installs_from_them(
    tmp_path: Path, scratch: str
) -> None:
    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [wheel] = out.glob("queue_pg-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "queue_pg/sql/schema/0001_init.sql" in names
    assert "queue_pg/migrations/env.py" in names
    assert "queue_pg/migrations/versions/0001_init.py" in names
    assert {f"queue_pg/sql/api/{p.name}" for p in (ROOT / "sql" / "api").glob("*.sql")} <= names
    assert "queue_pg/py.typed" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]

    # installed alone (no checkout on the path), it finds its SQL and migrates a database
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    code = (
        "import json, sys, queue_pg, queue_pg._resources as r, queue_pg.install as m\n"
        "res = m.migrate(sys.argv[1])\n"
        "print(json.dumps({'file': queue_pg.__file__, 'sql': str(r.sql_dir()),"
        " 'migrations': str(r.migrations_dir()), 'after': res.after, 'api': res.api_applied,"
        " 'script': m.install_script()}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", code, scratch],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    info = json.loads(done.stdout)
    for key in ("file", "sql", "migrations"):
        assert Path(info[key]).is_relative_to(site), (key, info[key])
    assert (info["after"], info["api"]) == (head_revision(), True)
    assert info["script"] == install_script()  # the same SQL as the checkout's
    roundtrip(scratch)


# --- queue_pg.tables --------------------------------------------------------------------------


def _ours(name: str | None, type_: str, parent_names: Any) -> bool:
    """Reflect schema queue_pg, and in it only the tables the metadata describes (not the
    history partitions, the version table or the per-queue counters)."""
    if type_ == "schema":
        return name == tables.SCHEMA
    if type_ == "table":
        return f"{tables.SCHEMA}.{name}" in tables.metadata.tables
    return True


def _diff(conn: SAConnection, metadata: MetaData) -> list[Any]:
    mc = MigrationContext.configure(
        conn,
        opts={
            "include_schemas": True,
            "include_name": _ours,
            "compare_type": True,
            "compare_server_default": True,
        },
    )
    return list(compare_metadata(mc, metadata))


def test_schema_metadata_matches_the_database(dsn: str) -> None:
    engine = make_engine(dsn)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT queue_pg.sweep()"))  # history partitions exist
            conn.commit()
            assert _diff(conn, tables.metadata) == []

            # what alembic does not compare: check constraints, storage options, partitioning
            insp = inspect(conn)
            for table in tables.metadata.tables.values():
                pg = table.dialect_options["postgresql"]
                checks = {c.name for c in table.constraints if isinstance(c, CheckConstraint)}
                found = {
                    c["name"] for c in insp.get_check_constraints(table.name, schema=tables.SCHEMA)
                }
                assert found == checks, table.name
                options = insp.get_table_options(table.name, schema=tables.SCHEMA)
                assert options.get("postgresql_with", {}) == dict(pg["with"] or {}), table.name
                partkey = conn.execute(
                    text("SELECT pg_get_partkeydef(to_regclass(:t))"), {"t": table.fullname}
                ).scalar()
                assert partkey == pg["partition_by"], table.name
            conn.rollback()

            # the comparison is live: drift on the database's side shows up
            conn.execute(text("ALTER TABLE queue_pg.messages ADD COLUMN drift int"))
            conn.execute(text("ALTER TABLE queue_pg.queues ALTER COLUMN delay SET DEFAULT 1"))
            kinds = sorted(
                d[0][0] if isinstance(d, list) else d[0] for d in _diff(conn, tables.metadata)
            )
            conn.rollback()
            assert kinds == ["modify_default", "remove_column"]
    finally:
        engine.dispose()


def test_include_object_keeps_the_users_autogenerate_away_from_our_tables(dsn: str) -> None:
    app = MetaData()
    Table("app_orders", app, Column("id", Integer, primary_key=True))
    engine = make_engine(dsn)
    try:
        with engine.connect() as conn:

            def diff(metadata: Any, **opts: Any) -> list[tuple[str, str]]:
                mc = MigrationContext.configure(conn, opts={"include_schemas": True, **opts})
                return sorted(
                    (d[0], d[1].name if hasattr(d[1], "name") else str(d[1]))
                    for d in compare_metadata(mc, metadata)
                    if not isinstance(d, list)
                )

            # without the hooks, the user's autogenerate would drop our tables
            unfiltered = diff(app)
            assert ("remove_table", "messages") in unfiltered
            hooks = {"include_object": tables.include_object, "include_name": tables.include_name}
            assert diff(app, **hooks) == [("add_table", "app_orders")]
            # even when the user's target metadata includes ours, nothing of ours is touched
            both = [app, tables.metadata]
            assert diff(both, include_object=tables.include_object) == [("add_table", "app_orders")]
    finally:
        engine.dispose()


def _reloptions(dsn: str) -> dict[str, list[str]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        rows = c.execute(
            "SELECT c.relname, coalesce(c.reloptions, '{}'), coalesce(t.reloptions, '{}')"
            " FROM pg_class c LEFT JOIN pg_class t ON t.oid = c.reltoastrelid"
            " WHERE c.oid IN ('queue_pg.messages'::regclass, 'queue_pg.dedup'::regclass)"
        ).fetchall()
    return {name: sorted([*heap, *(f"toast.{o}" for o in toast)]) for name, heap, toast in rows}


def test_autovacuum_settings_of_revision_0021_and_its_downgrade(scratch: str) -> None:
    """messages' TOAST table is vacuumed by row count like its heap, dedup without cost delay;
    the downgrade puts back what 0001 and 0009 set, and nothing else."""
    migrate(scratch)
    now = _reloptions(scratch)
    assert {"toast.autovacuum_vacuum_scale_factor=0", "toast.autovacuum_vacuum_threshold=5000",
            "toast.autovacuum_vacuum_cost_delay=0", "autovacuum_vacuum_threshold=5000",
            "fillfactor=80"} <= set(now["messages"])
    assert {"autovacuum_vacuum_cost_delay=0", "autovacuum_vacuum_threshold=5000",
            "autovacuum_analyze_threshold=20000"} <= set(now["dedup"])
    downgrade(scratch, "0015")
    before = _reloptions(scratch)
    assert not [o for o in before["messages"] if o.startswith("toast.")]
    assert "autovacuum_vacuum_threshold=5000" in before["messages"]
    assert before["dedup"] == ["autovacuum_vacuum_scale_factor=0",
                               "autovacuum_vacuum_threshold=5000"]
    migrate(scratch)
    assert _reloptions(scratch) == now
