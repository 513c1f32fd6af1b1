"""Access control: limited roles log in and meet the group roles and per-queue grants.

Roles are cluster-wide, so each test makes LOGIN roles with names of its own (uuid) and drops
them (with what they own in the test database) afterwards. Every refusal is checked to change
nothing: the whole state of the queue tables is compared before and after.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result
from psycopg import conninfo
from psycopg import sql as psql

from queue_pg import (
    AccessDenied,
    AsyncClient,
    Client,
    InvalidParameter,
    InvalidReceipt,
    QueueNotFound,
)
from queue_pg.errors import translate
from queue_pg.install import head_revision, migrate
from queue_pg.ops import cli

GROUPS = ("queue_pg_admin", "queue_pg_producer", "queue_pg_consumer")
ADMIN, PRODUCER, CONSUMER = GROUPS


@dataclass(frozen=True)
class Role:
    name: str
    dsn: str

    def client(self) -> Client:
        return Client(self.dsn, sweep_interval=None, max_size=2)

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn, autocommit=True, **kwargs)


MakeRole = Callable[..., Role]


def with_params(dsn: str, **changes: str) -> str:
    params = conninfo.conninfo_to_dict(dsn)
    params.update(changes)
    return conninfo.make_conninfo(**params)  # type: ignore[arg-type]


def as_user(dsn: str, user: str, **extra: str) -> str:
    """The same database as another role (trust authentication: no password)."""
    params = conninfo.conninfo_to_dict(dsn)
    params.pop("password", None)
    return with_params(conninfo.make_conninfo(**params), user=user, **extra)  # type: ignore[arg-type]


@pytest.fixture
def make_role(clean: str) -> Iterator[MakeRole]:
    """``make_role("label", *groups, login=True)``: a new role in the given group roles."""
    made: list[str] = []

    def make(label: str, *groups: str, login: bool = True) -> Role:
        name = f"qp_{label}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(clean, autocommit=True) as c:
            c.execute(
                psql.SQL("CREATE ROLE {} " + ("LOGIN" if login else "NOLOGIN")).format(
                    psql.Identifier(name)
                )
            )
            made.append(name)
            for g in groups:
                c.execute(psql.SQL("GRANT {} TO {}").format(*map(psql.Identifier, (g, name))))
        return Role(name, as_user(clean, name))

    yield make
    with psycopg.connect(clean, autocommit=True) as c:
        for name in reversed(made):
            c.execute(psql.SQL("DROP OWNED BY {}").format(psql.Identifier(name)))
            c.execute(psql.SQL("DROP ROLE {}").format(psql.Identifier(name)))


def state(conn: psycopg.Connection[Any]) -> dict[str, list[str]]:
    """Every row of every queue_pg table plus the refusal counters."""
    tables = ("queues", "messages", "in_flight", "message_history", "grants")
    snap = {
        t: [r[0] for r in conn.execute(f"SELECT x::text FROM queue_pg.{t} x ORDER BY 1")]
        for t in tables
    }
    snap["stats"] = [
        r[0]
        for r in conn.execute(
            "SELECT (queue, stale_receipts, lease_expiries)::text FROM queue_pg.queue_stats"
            " ORDER BY 1"
        )
    ]
    return snap


def denied(snapshot: Callable[[], Any], call: Callable[[], object], match: str = "") -> None:
    """``call`` raises AccessDenied (message matching ``match``) and changes nothing."""
    before = snapshot()
    with pytest.raises(AccessDenied, match=match):
        call()
    assert snapshot() == before


@pytest.fixture
def snapshot(conn: psycopg.Connection[Any]) -> Callable[[], dict[str, list[str]]]:
    return lambda: state(conn)


@pytest.fixture
def admin(clean: str) -> Iterator[Client]:
    """The owner's client (superuser on the test server): sets queues and grants up."""
    with Client(clean, sweep_interval=None) as c:
        yield c


# --- the layout -------------------------------------------------------------------------------


def test_group_roles_exist_and_nothing_is_public(conn: psycopg.Connection[Any]) -> None:
    found = {r[0] for r in conn.execute("SELECT rolname FROM pg_roles WHERE rolname ~ '^queue_pg_'")}
    assert found >= set(GROUPS)
    assert conn.execute(
        "SELECT bool_and(NOT rolcanlogin) FROM pg_roles WHERE rolname = ANY(%s)", [list(GROUPS)]
    ).fetchone() == (True,)

    # PUBLIC (grantee 0) holds no privilege on any table, view, sequence or function of ours
    public_rel = conn.execute(
        "SELECT c.relname FROM pg_class c,"
        " aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a"
        " WHERE c.relnamespace = 'queue_pg'::regnamespace AND a.grantee = 0"
    ).fetchall()
    public_fn = conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p,"
        " aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a"
        " WHERE p.pronamespace = 'queue_pg'::regnamespace AND a.grantee = 0"
    ).fetchall()
    assert public_rel == [] and public_fn == []

    # the group roles: no table but message_history (admin) and the monitoring views
    rel_grants = conn.execute(
        "SELECT c.relname, r.rolname, a.privilege_type FROM pg_class c,"
        " aclexplode(c.relacl) a JOIN pg_roles r ON r.oid = a.grantee"
        " WHERE c.relnamespace = 'queue_pg'::regnamespace AND r.rolname = ANY(%s) ORDER BY 1, 2",
        [list(GROUPS)],
    ).fetchall()
    views = ["dead_letters", "in_flight_messages", "processing_times", "queue_stats",
             "schedules", "stuck_jobs", "timeout_advice", "tuning_log"]
    assert rel_grants == sorted(
        [("message_history", ADMIN, "SELECT")]
        + [(v, g, "SELECT") for v in views for g in (ADMIN, CONSUMER, PRODUCER)]
    )

    # every function another role may execute runs as the owner with a pinned search_path;
    # the helpers are the owner's only
    rows = conn.execute(
        "SELECT p.proname, p.prosecdef, p.proconfig,"
        " EXISTS (SELECT 1 FROM aclexplode(p.proacl) a WHERE a.grantee <> p.proowner)"
        " FROM pg_proc p WHERE p.pronamespace = 'queue_pg'::regnamespace"
    ).fetchall()
    callable_by_others = {name for name, _, _, others in rows if others}
    assert {"send", "_receive", "delete_message", "grant", "revoke", "now"} <= callable_by_others
    assert "_queue" not in callable_by_others and "_claim" not in callable_by_others
    for name, secdef, config, others in rows:
        if others:
            assert secdef and config == [
                "search_path=pg_catalog, pg_temp", "plan_cache_mode=force_generic_plan"
            ], name
        else:
            assert not secdef, name


def test_a_role_in_no_group_cannot_reach_anything(
    admin: Client, make_role: MakeRole, snapshot: Callable[[], Any]
) -> None:
    admin.create_queue("jobs")
    admin.send("jobs", {"secret": 1})
    nobody = make_role("nobody")
    with nobody.client() as c:
        for call in (
            lambda: c.send("jobs", 1),
            lambda: c.receive("jobs"),
            lambda: c.peek("jobs"),
            lambda: c.list_queues(),
            lambda: c.stats("jobs"),
            lambda: c.create_queue("mine"),
        ):
            denied(snapshot, call, "permission denied")
    with nobody.connect() as c:
        for table in ("messages", "queues", "secret", "grants", "message_history", "queue_stats"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(f"SELECT * FROM queue_pg.{table}")


# --- producers and consumers --------------------------------------------------------------------


def test_a_producer_can_send_but_not_receive_peek_or_purge(
    admin: Client, make_role: MakeRole, snapshot: Callable[[], Any]
) -> None:
    admin.create_queue("jobs")
    admin.send("jobs", {"n": 1})
    producer = make_role("producer", PRODUCER)
    assert admin.grant("jobs", producer.name, "send") is True
    with producer.client() as c:
        mid = c.send("jobs", {"n": 2})
        assert c.send_batch("jobs", [3, 4]) == [mid + 1, mid + 2]
        denied(snapshot, lambda: c.receive("jobs"), "permission denied for function _receive")
        denied(snapshot, lambda: c.peek("jobs"), "permission denied for function peek")
        denied(
            snapshot,
            lambda: c.purge("jobs"),
            f"role '{producer.name}' needs privilege manage on queue 'jobs'",
        )
        denied(snapshot, lambda: c.drop_queue("jobs"), "needs privilege manage")
        denied(snapshot, lambda: c.alter_queue("jobs", delay=5), "needs privilege manage")
        [stats] = [c.stats("jobs")]  # counts are for every group member; bodies are not
        assert stats.visible == 4
    assert [m.body for m in admin.peek("jobs", 10)] == [{"n": 1}, {"n": 2}, 3, 4]


def test_stats_of_a_queue_without_a_grant_is_access_denied_not_an_empty_answer(
    admin: Client, make_role: MakeRole, snapshot: Callable[[], Any]
) -> None:
    """queue_stats hides the queues a role has no grant on; asked for one by name, stats()
    says so (QP011, naming role and queue) instead of answering with no row."""
    admin.create_queue("mine")
    admin.create_queue("theirs")
    admin.send("theirs", {"n": 1})
    consumer = make_role("consumer", CONSUMER)
    admin.grant("mine", consumer.name, "receive")
    with consumer.client() as c:
        assert c.stats("mine").queue == "mine"
        denied(snapshot, lambda: c.stats("theirs"),
               f"role '{consumer.name}' needs a grant on queue 'theirs' to read its figures")
        with pytest.raises(QueueNotFound):
            c.stats("nowhere")
    with consumer.connect() as conn:
        with pytest.raises(psycopg.Error) as err:
            conn.execute("SELECT * FROM queue_pg.stats('theirs')")
        assert err.value.sqlstate == "QP011"
        assert err.value.diag.message_hint == (
            f"a manager of the queue runs queue_pg.grant('theirs', '{consumer.name}', 'send' or 'receive')"
        )
        assert conn.execute("SELECT count(*) FROM queue_pg.queue_stats").fetchone() == (1,)


def test_a_grant_is_needed_besides_the_group(
    admin: Client, make_role: MakeRole, snapshot: Callable[[], Any], clean: str
) -> None:
    """A member of both groups with a send grant only: QP011 naming role, queue, privilege."""
    admin.create_queue("jobs")
    both = make_role("both", PRODUCER, CONSUMER)
    admin.grant("jobs", both.name, "send")
    with both.client() as c:
        c.send("jobs", "hello")
        before = snapshot()
        with pytest.raises(AccessDenied) as err:
            c.receive("jobs")
        assert snapshot() == before
    assert err.value.sqlstate == "QP011"
    assert str(err.value) == f"permission denied: role '{both.name}' needs privilege receive on queue 'jobs'"
    assert err.value.diag is not None
    assert err.value.diag.message_detail == (
        "no receive grant on the queue for the role or a role it belongs to"
    )
    assert err.value.diag.message_hint == (
        f"a manager of the queue runs queue_pg.grant('jobs', '{both.name}', 'receive')"
    )

    # and a grant without the group is no use either
    admin.grant("jobs", both.name, "receive")
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute(psql.SQL("REVOKE {} FROM {}").format(*map(psql.Identifier, (CONSUMER, both.name))))
    with both.client() as c:
        denied(snapshot, lambda: c.receive("jobs"), "permission denied for function _receive")


def test_a_consumer_of_one_queue_cannot_touch_another(
    admin: Client, make_role: MakeRole, snapshot: Callable[[], Any]
) -> None:
    admin.create_queue("b-dlq")
    for q in ("a", "b"):
        admin.create_queue(q, dead_letter_queue="b-dlq", max_receive_count=3)
        admin.send_batch(q, [{q: 1}, {q: 2}])
    [held] = admin.receive("b", visibility_timeout=300)  # a live receipt of queue b
    consumer = make_role("consumer", CONSUMER)
    admin.grant("a", consumer.name, "receive")
    receipt = held.receipt or ""
    need = f"role '{consumer.name}' needs privilege %s on queue 'b'"
    with consumer.client() as c:
        for call in (
            lambda: c.receive("b"),
            lambda: c.peek("b"),
            lambda: c.delete("b", receipt),
            lambda: c.delete_batch("b", [receipt]),
            lambda: c.change_visibility("b", receipt, 0),
            lambda: c.update("b", receipt, body={"stolen": True}),
            lambda: c.dead_letter("b", receipt, "sabotage"),
        ):
            denied(snapshot, call, need % "receive")
        denied(snapshot, lambda: c.purge("b"), need % "manage")
        denied(snapshot, lambda: c.redrive("b-dlq"), "needs privilege manage on queue 'b-dlq'")
        denied(snapshot, lambda: c.send("b", 1), "permission denied for function send")
        denied(snapshot, lambda: c.grant("b", consumer.name, "receive"), need % "manage")

        # its own queue works end to end
        [m] = c.receive("a", visibility_timeout=60)
        assert m.body == {"a": 1}
        c.change_visibility("a", m.receipt or "", 120)
        assert c.delete("a", m.receipt or "") is True
        assert [x.body for x in c.peek("a")] == [{"a": 2}]
    # queue b as it was: the held receipt still works for its holder
    assert admin.delete("b", receipt) is True


def test_no_grant_no_bodies_through_tables_or_views(
    admin: Client, make_role: MakeRole, conn: psycopg.Connection[Any]
) -> None:
    admin.create_queue("jobs")
    admin.send("jobs", {"card": "4111"})
    admin.receive("jobs", visibility_timeout=60)
    admin.send("jobs", {"card": "5500"})
    views = [
        r[0] for r in conn.execute("SELECT viewname FROM pg_views WHERE schemaname = 'queue_pg'")
    ]
    assert "queue_stats" in views
    # no view of ours has a column that could carry a body or attributes: its text columns are
    # names, the type (history keeps it too), figures' labels, and a dead letter's reason and
    # error (bounded excerpts a consumer wrote for whoever reads the dead-letter queue), and a
    # schedule's name, cron expression, time zone and missed-ticks policy, a consumer's name
    # (bounded, of a queue the reader sees) and the name of a fitted distribution
    named = {"queue", "source_queue", "dead_letter_queue", "type", "scope", "confidence", "why",
             "reason", "last_error", "schedule", "cron", "tz", "missed", "consumer", "fit"}
    json_columns = conn.execute(
        "SELECT c.relname, a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
        " WHERE c.relnamespace = 'queue_pg'::regnamespace AND c.relkind IN ('v', 'm')"
        " AND a.attnum > 0 AND a.atttypid IN ('json'::regtype, 'jsonb'::regtype, 'text'::regtype)"
        " AND a.attname <> ALL(%s)",
        [list(named)],
    ).fetchall()
    assert json_columns == []

    for role in (make_role("ungranted", PRODUCER, CONSUMER), make_role("bare")):
        with role.connect() as c:
            for table in ("messages", "message_history", "queues", "secret", "grants", "in_flight"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    c.execute(f"SELECT * FROM queue_pg.{table}")
            for view in views:
                try:
                    rows = c.execute(f"SELECT x::text FROM queue_pg.{view} x").fetchall()
                except psycopg.errors.InsufficientPrivilege:
                    continue
                # a role with no grant on the queue sees none of its rows, and never a body
                assert rows == [], (view, rows)
            for fn in ("peek", "receive"):
                with pytest.raises(AccessDenied), translate():
                    c.execute(f"SELECT * FROM queue_pg.{fn}('jobs')")


# --- grants -----------------------------------------------------------------------------------


def test_grant_and_revoke_round_trip(
    admin: Client, make_role: MakeRole, snapshot: Callable[[], Any]
) -> None:
    admin.create_queue("jobs")
    admin.send_batch("jobs", [1, 2, 3])
    manager = make_role("admin", ADMIN)  # not a superuser: the group role makes it admin
    consumer = make_role("consumer", CONSUMER)
    with manager.client() as m, consumer.client() as c:
        denied(snapshot, lambda: c.receive("jobs"), "needs privilege receive")
        assert m.grant("jobs", consumer.name, "receive") is True
        assert m.grant("jobs", consumer.name, "receive") is False  # already
        [g] = m.list_grants("jobs")
        assert (g.queue, g.role, g.privilege) == ("jobs", consumer.name, "receive")
        assert m.list_grants() == [g]
        [msg] = c.receive("jobs")
        assert c.delete("jobs", msg.receipt or "") is True

        assert m.revoke("jobs", consumer.name, "receive") is True
        assert m.revoke("jobs", consumer.name, "receive") is False
        assert m.list_grants("jobs") == []
        denied(snapshot, lambda: c.receive("jobs"), "needs privilege receive")

        # bad input names the parameter, the value and what is allowed, and changes nothing
        for call, match, cls in (
            (
                lambda: m.grant("jobs", consumer.name, "read"),
                "privilege = 'read' is invalid: allowed send, receive, manage",
                InvalidParameter,
            ),
            (
                lambda: m.grant("jobs", "no_such_role_" + uuid.uuid4().hex, "send"),
                "role = 'no_such_role_.*' is invalid: allowed the name of an existing role",
                InvalidParameter,
            ),
            (lambda: m.grant("nope", consumer.name, "send"), "queue 'nope' does not exist",
             QueueNotFound),
            (lambda: m.revoke("jobs", consumer.name, None),  # type: ignore[arg-type]
             "privilege = NULL is invalid", InvalidParameter),
        ):
            before = snapshot()
            with pytest.raises(cls, match=match):
                call()
            assert snapshot() == before


def test_grants_follow_role_membership_and_die_with_the_queue(
    admin: Client, make_role: MakeRole
) -> None:
    admin.create_queue("jobs")
    admin.send("jobs", "x")
    team = make_role("team", login=False)
    member = make_role("member", CONSUMER, team.name)
    admin.grant("jobs", team.name, "receive")  # to the team: its members may
    with member.client() as c:
        assert [m.body for m in c.peek("jobs")] == ["x"]
    admin.drop_queue("jobs")
    admin.create_queue("jobs")  # same name, new queue: no grants
    assert admin.list_grants("jobs") == []
    admin.send("jobs", "y")
    with member.client() as c, pytest.raises(AccessDenied):
        c.peek("jobs")


def test_a_manage_grant_manages_that_queue_only(
    admin: Client, make_role: MakeRole, snapshot: Callable[[], Any]
) -> None:
    admin.create_queue("jobs")
    admin.create_queue("other")
    admin.create_queue("jobs-dlq")
    admin.send("jobs", "x")
    lead = make_role("lead", PRODUCER)
    worker = make_role("worker", CONSUMER)
    admin.grant("jobs", lead.name, "manage")
    with lead.client() as c:
        assert c.grant("jobs", worker.name, "receive") is True
        assert c.alter_queue("jobs", visibility_timeout=5).visibility_timeout == 5
        assert c.purge("jobs") == 1
        assert [g.queue for g in c.list_grants()] == ["jobs", "jobs"]  # only what it manages
        denied(snapshot, lambda: c.grant("other", worker.name, "receive"), "on queue 'other'")
        denied(snapshot, lambda: c.list_grants("other"), "on queue 'other'")
        denied(snapshot, lambda: c.purge("other"), "on queue 'other'")
        # linking a dead-letter queue changes it too: manage both
        denied(
            snapshot,
            lambda: c.alter_queue("jobs", dead_letter_queue="jobs-dlq", max_receive_count=3),
            "on queue 'jobs-dlq'",
        )
        denied(snapshot, lambda: c.create_queue("new"), "permission denied for function")
        denied(snapshot, lambda: c.drop_queue("other"), "on queue 'other'")
    admin.grant("jobs-dlq", lead.name, "manage")
    with lead.client() as c:
        c.alter_queue("jobs", dead_letter_queue="jobs-dlq", max_receive_count=3)
        assert c.drop_queue("jobs") is True


def test_an_admin_role_does_everything_but_read_the_tables(
    make_role: MakeRole, snapshot: Callable[[], Any]
) -> None:
    boss = make_role("boss", ADMIN)
    with boss.client() as c:
        c.create_queue("dlq")
        c.create_queue("jobs", dead_letter_queue="dlq", max_receive_count=1)
        c.send("jobs", {"n": 1})
        [m] = c.receive("jobs", visibility_timeout=0)
        assert c.receive("jobs") == []  # the second receive dead-lettered it
        assert c.redrive("dlq") == 1
        [m] = c.receive("jobs")
        assert c.delete("jobs", m.receipt or "") is True
        assert c.sweep() == 0
        assert [s.queue for s in (c.stats("jobs"), c.stats("dlq"))] == ["jobs", "dlq"]
    with boss.connect() as conn:
        assert conn.execute("SELECT count(*) FROM queue_pg.message_history").fetchone() == (2,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM queue_pg.messages")


# --- who the caller is ------------------------------------------------------------------------


def test_the_caller_is_the_set_role_or_the_session_user(
    admin: Client, make_role: MakeRole, clean: str, snapshot: Callable[[], Any]
) -> None:
    admin.create_queue("jobs")
    producer = make_role("producer", PRODUCER)
    admin.grant("jobs", producer.name, "send")
    # a superuser session that SET ROLEs to the producer is the producer
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute(psql.SQL("SET ROLE {}").format(psql.Identifier(producer.name)))
        c.execute("SELECT queue_pg.send('jobs', '1')")
        before = snapshot()
        with (
            pytest.raises(AccessDenied, match=f"role '{producer.name}' needs privilege manage"),
            translate(),
        ):
            c.execute("SELECT queue_pg.purge('jobs')")
        assert snapshot() == before
    # a SECURITY DEFINER function of the caller's own is seen as its caller's session, not as
    # its owner: the owner's grants do not lend themselves through it
    consumer = make_role("consumer", CONSUMER)
    admin.grant("jobs", consumer.name, "receive")
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute(
            psql.SQL(
                "CREATE FUNCTION public.{}() RETURNS bigint LANGUAGE sql SECURITY DEFINER"
                " AS $$ SELECT count(*) FROM queue_pg.peek('jobs', 10) $$"
            ).format(psql.Identifier(f"peek_{consumer.name}"))
        )
        c.execute(
            psql.SQL("ALTER FUNCTION public.{}() OWNER TO {}").format(
                psql.Identifier(f"peek_{consumer.name}"), psql.Identifier(consumer.name)
            )
        )
    with (
        producer.connect() as c,
        pytest.raises(AccessDenied, match=f"role '{producer.name}' needs privilege receive"),
        translate(),
    ):
        c.execute(psql.SQL("SELECT public.{}()").format(psql.Identifier(f"peek_{consumer.name}")))
    with consumer.connect() as c:
        assert c.execute(psql.SQL("SELECT public.{}()").format(
            psql.Identifier(f"peek_{consumer.name}"))).fetchone() == (1,)


# --- search_path ------------------------------------------------------------------------------

#: Look-alikes of what our functions call, each counting its calls in a sequence (which no
#: rollback undoes) and otherwise doing what the real one does.
PLANTED = [
    ("clock_timestamp()", "timestamptz", "pg_catalog.clock_timestamp()"),
    ("now()", "timestamptz", "pg_catalog.now()"),
    ("current_setting(text, boolean)", "text", "pg_catalog.current_setting($1, $2)"),
    ("jsonb_build_object(text, text)", "jsonb", "pg_catalog.jsonb_build_object($1, $2)"),
    ("format(text, text)", "text", "pg_catalog.format($1, $2)"),
    ("format(text, text, text)", "text", "pg_catalog.format($1, $2, $3)"),
    ("sha256(bytea)", "bytea", "pg_catalog.sha256($1)"),
    ("encode(bytea, text)", "text", "pg_catalog.encode($1, $2)"),
    ("left(text, integer)", "text", "pg_catalog.left($1, $2)"),
    ("textsend(text)", "bytea", "pg_catalog.textsend($1)"),
    ("regexp_match(text, text)", "text[]", "pg_catalog.regexp_match($1, $2)"),
    ("make_interval(secs double precision)", "interval", "pg_catalog.make_interval(secs => $1)"),
    ("pg_notify(text, text)", "void", "pg_catalog.pg_notify($1, $2)"),
    ("pg_sleep(double precision)", "void", "pg_catalog.pg_sleep($1)"),
    ("jsonb_typeof(jsonb)", "text", "pg_catalog.jsonb_typeof($1)"),
    ("pg_column_size(jsonb)", "integer", "pg_catalog.pg_column_size($1)"),
    ("pg_has_role(name, name, text)", "boolean", "pg_catalog.pg_has_role($1, $2, $3)"),
    ("pg_sequence_last_value(regclass)", "bigint", "pg_catalog.pg_sequence_last_value($1)"),
    ("pg_try_advisory_xact_lock(bigint)", "boolean", "pg_catalog.pg_try_advisory_xact_lock($1)"),
    ("hashtext(text)", "integer", "pg_catalog.hashtext($1)"),
    ("quote_literal(text)", "text", "pg_catalog.quote_literal($1)"),
]


def plant(c: psycopg.Connection[Any]) -> None:
    c.execute("CREATE SCHEMA evil")
    c.execute("CREATE SEQUENCE evil.calls")
    c.execute("GRANT USAGE ON SCHEMA evil TO PUBLIC")
    c.execute("GRANT USAGE, UPDATE ON SEQUENCE evil.calls TO PUBLIC")
    for signature, returns, real in PLANTED:
        c.execute(
            f"CREATE FUNCTION evil.{signature} RETURNS {returns} LANGUAGE plpgsql AS $$"
            f" BEGIN PERFORM pg_catalog.nextval('evil.calls');"
            f" {'RETURN' if returns == 'void' else 'RETURN ' + real}; END $$"
        )
    # an operator too: timestamptz <= timestamptz, the claim's comparison
    c.execute(
        "CREATE FUNCTION evil.ts_le(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql"
        " AS $$ BEGIN PERFORM pg_catalog.nextval('evil.calls'); RETURN $1 OPERATOR(pg_catalog.<=) $2;"
        " END $$"
    )
    c.execute(
        "CREATE OPERATOR evil.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz,"
        " FUNCTION = evil.ts_le)"
    )
    c.execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA evil TO PUBLIC")


def calls(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM evil.calls")
    value = row.fetchone()
    assert value is not None
    return int(value[0])


def exercise(c: Client, q: str, dlq: str) -> None:
    """Every operation, as the caller's search_path has it."""
    c.send(q, {"n": 1}, attributes={"type": "t"})
    c.send_batch(q, [2, 3, 4], ttl=60)
    got = c.receive(q, 3, visibility_timeout=30)
    assert len(got) == 3
    c.change_visibility(q, got[0].receipt or "", 60)
    c.update(q, got[0].receipt or "", body={"n": 10}, attributes={"x": "y"})
    assert c.delete(q, got[0].receipt or "") is True
    assert [r.deleted for r in c.delete_batch(q, [got[1].receipt or ""])] == [True]
    assert c.dead_letter(q, got[2].receipt or "", "planted?") is True
    with pytest.raises(InvalidReceipt):
        c.delete(q, "1.2.3.0123456789abcdef")
    assert len(c.peek(q)) == 1
    assert c.redrive(dlq) == 1
    assert c.receive(q, 10, wait=0.2)
    c.stats(q)
    c.list_queues()
    c.get_queue(q)
    c.channel(q)
    c.alter_queue(q, delay=0)
    c.sweep()
    assert c.purge(q) >= 0


def test_a_function_planted_on_the_callers_search_path_is_never_called(
    admin: Client, make_role: MakeRole, clean: str
) -> None:
    admin.create_queue("dlq")
    admin.create_queue("jobs", dead_letter_queue="dlq", max_receive_count=5)
    mallory = make_role("mallory", PRODUCER, CONSUMER)
    for privilege in ("send", "receive", "manage"):
        admin.grant("jobs", mallory.name, privilege)
    admin.grant("dlq", mallory.name, "manage")
    admin.grant("dlq", mallory.name, "receive")
    dbname = conninfo.conninfo_to_dict(clean)["dbname"]
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute(
            psql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                psql.Identifier(str(dbname)), psql.Identifier(mallory.name)
            )
        )
    path = "-c search_path=evil,pg_catalog,public"
    with mallory.connect() as m:
        plant(m)
        # the trap is live: with this search_path, plain calls land in evil's functions
        m.execute("SET search_path = evil, pg_catalog, public")
        for expr in (
            "clock_timestamp()",
            "left('abc', 2)",
            "sha256('\\x00'::bytea)",
            "jsonb_build_object('a', 'b'::text)",
            "format('%s', 'x'::text)",
            "pg_catalog.clock_timestamp() <= pg_catalog.clock_timestamp()",
        ):
            before = calls(m)
            m.execute(f"SELECT {expr}")
            assert calls(m) == before + 1, expr

        start = calls(m)
        # mallory herself, through the client, with evil first on her search_path
        with Client(as_user(clean, mallory.name, options=path), sweep_interval=None) as c:
            exercise(c, "jobs", "dlq")
        # a superuser with that search_path (the classic victim) runs everything too
        with Client(with_params(clean, options=path), sweep_interval=None) as c:
            exercise(c, "jobs", "dlq")
        # and the view, read with that search_path
        m.execute("SELECT * FROM queue_pg.queue_stats").fetchall()
        assert calls(m) == start


# --- a non-superuser owner, and the CLI -----------------------------------------------------------


def test_a_non_superuser_owner_installs_and_runs_it(make_role: MakeRole, scratch: str) -> None:
    """An application role that owns queue_pg (no superuser, no CREATEROLE) does everything,
    and its grants work for others."""
    owner = make_role("owner")
    dbname = str(conninfo.conninfo_to_dict(scratch)["dbname"])
    with psycopg.connect(scratch, autocommit=True) as c:
        c.execute(
            psql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                psql.Identifier(dbname), psql.Identifier(owner.name)
            )
        )
    own_dsn = as_user(scratch, owner.name)
    assert migrate(own_dsn).after == head_revision()
    name = make_role("consumer", CONSUMER).name
    consumer = Role(name, as_user(scratch, name))
    with Client(own_dsn, sweep_interval=None) as c:
        c.create_queue("jobs")
        c.send("jobs", {"n": 1})
        assert c.grant("jobs", consumer.name, "receive") is True
        with consumer.client() as cc:
            [m] = cc.receive("jobs")
            assert cc.delete("jobs", m.receipt or "") is True
            with pytest.raises(AccessDenied, match="needs privilege manage"):
                cc.purge("jobs")
        assert c.purge("jobs") == 0


def test_cli_grant_revoke_and_grants(clean: str, admin: Client, make_role: MakeRole) -> None:
    admin.create_queue("jobs")
    admin.send("jobs", "x")
    consumer = make_role("consumer", CONSUMER)

    def run(dsn: str, *args: str, code: int = 0) -> Result:
        result = CliRunner().invoke(cli.main, ["--dsn", dsn, *args])
        assert result.exit_code == code, (result.output, result.exception)
        return result

    denied = run(consumer.dsn, "receive", "jobs", code=1)
    assert f"error: permission denied: role '{consumer.name}' needs privilege receive" in (
        denied.stderr.replace("\n", "")
    )
    out = run(clean, "grant", "jobs", consumer.name, "receive").stdout
    assert out.strip() == f"granted receive on jobs to {consumer.name}"
    assert "already granted" in run(clean, "grant", "jobs", consumer.name, "receive").stdout
    listing = run(clean, "grants", "jobs").stdout
    assert consumer.name in listing and "receive" in listing
    assert '"x"' in run(consumer.dsn, "receive", "jobs", "--json").stdout

    bad = run(clean, "grant", "jobs", consumer.name, "write", code=1)
    assert "privilege = 'write' is invalid: allowed send, receive, manage" in bad.stderr
    out = run(clean, "revoke", "jobs", consumer.name, "receive").stdout
    assert out.strip() == f"revoked receive on jobs from {consumer.name}"
    assert "not granted" in run(clean, "revoke", "jobs", consumer.name, "receive").stdout
    assert "no grants" in run(clean, "grants").stderr
    run(consumer.dsn, "peek", "jobs", code=1)
    # after a DBA made missing roles: re-apply the functions and their grants
    assert "(functions re-applied)" in run(clean, "migrate", "--reapply-api").stdout
    assert "(functions re-applied)" not in run(clean, "migrate").stdout


async def test_async_client_grants_and_long_polls_as_a_consumer(
    admin: Client, make_role: MakeRole, snapshot: Callable[[], Any], clean: str
) -> None:
    admin.create_queue("jobs")
    consumer = make_role("consumer", CONSUMER)
    async with AsyncClient(clean, sweep_interval=None) as a:
        assert await a.grant("jobs", consumer.name, "receive") is True
        [g] = await a.list_grants()
        assert (g.role, g.privilege) == (consumer.name, "receive")
        async with AsyncClient(consumer.dsn, sweep_interval=None) as c:
            assert await c.receive("jobs", wait=0.2) == []  # long poll: channel, LISTEN
            admin.send("jobs", "late")
            [m] = await c.receive("jobs", wait=2)
            assert await c.delete("jobs", m.receipt or "") is True
            assert await a.revoke("jobs", consumer.name, "receive") is True
            before = snapshot()
            with pytest.raises(AccessDenied, match="needs privilege receive"):
                await c.receive("jobs", wait=0.2)
            assert snapshot() == before
