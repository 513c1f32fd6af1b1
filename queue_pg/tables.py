"""SQLAlchemy Core metadata of the queue_pg tables, for joins and for Alembic in *your* project.

This mirrors ``sql/schema/*.sql`` (the source of truth: the tables are created by
``queue_pg.install.migrate``, never by ``metadata.create_all``). Use it to join messages or history
to your own tables, e.g. ``select(messages.c.id).where(messages.c.body["order"].astext == ...)``.

Alembic autogenerate in your project must not try to create, alter or drop these tables. In your
``env.py`` pass the filters to ``context.configure``::

    import queue_pg.tables
    context.configure(..., include_object=queue_pg.tables.include_object,
                      include_name=queue_pg.tables.include_name)

``include_object`` keeps autogenerate from touching our tables even when your ``target_metadata``
includes ours; ``include_name`` stops it from reflecting schema ``queue_pg`` at all (with
``include_schemas=True``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import (
    TIMESTAMP,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, BYTEA, DOUBLE_PRECISION, JSONB, OID

__all__ = [
    "SCHEMA",
    "consumers",
    "grants",
    "in_flight",
    "include_name",
    "include_object",
    "message_history",
    "messages",
    "metadata",
    "queue_counters",
    "queues",
    "secret",
]

SCHEMA = "queue_pg"

metadata = MetaData(schema=SCHEMA)


def _queue_ref(table: str) -> Column[int]:
    """A ``queue_id`` that goes with its queue (the constraint named as the SQL names it)."""
    return Column(
        "queue_id",
        Integer,
        ForeignKey("queue_pg.queues.id", ondelete="CASCADE", name=f"{table}_queue_id_fkey"),
        nullable=False,
    )

TIMESTAMPTZ = TIMESTAMP(timezone=True)

secret = Table(
    "secret",
    metadata,
    Column("singleton", Boolean, nullable=False, server_default=text("true")),
    Column(
        "key",
        BYTEA,
        nullable=False,
        server_default=text(
            "decode(replace(((gen_random_uuid())::text || (gen_random_uuid())::text),"
            " '-'::text, ''::text), 'hex'::text)"
        ),
    ),
    PrimaryKeyConstraint("singleton", name="secret_pkey"),
    CheckConstraint("singleton", name="secret_singleton_check"),
)

queues = Table(
    "queues",
    metadata,
    Column("id", Integer, Identity(always=True), nullable=False),
    Column("name", Text, nullable=False),
    Column("visibility_timeout", DOUBLE_PRECISION, nullable=False, server_default=text("30")),
    Column("message_ttl", DOUBLE_PRECISION, nullable=True, server_default=text("345600")),
    Column("delay", DOUBLE_PRECISION, nullable=False, server_default=text("0")),
    Column("max_message_size", Integer, nullable=False, server_default=text("1048576")),
    Column("receive_wait", DOUBLE_PRECISION, nullable=False, server_default=text("0")),
    Column("max_lease", DOUBLE_PRECISION, nullable=False, server_default=text("43200")),
    Column(
        "dead_letter_queue",
        Text,
        ForeignKey("queue_pg.queues.name", name="queues_dead_letter_queue_fkey"),
        nullable=True,
    ),
    Column("max_receive_count", Integer, nullable=True),
    Column("in_flight_limit", Integer, nullable=True),
    Column("history", Boolean, nullable=False, server_default=text("true")),
    Column("history_retention", DOUBLE_PRECISION, nullable=False, server_default=text("604800")),
    Column("options", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("created_at", TIMESTAMPTZ, nullable=False, server_default=text("statement_timestamp()")),
    Column("lease_policy", Text, nullable=False, server_default=text("'fixed'::text")),
    Column("auto_tune", Boolean, nullable=False, server_default=text("false")),
    Column("tune_min", DOUBLE_PRECISION, nullable=False, server_default=text("1")),
    Column("tune_max", DOUBLE_PRECISION, nullable=True),
    Column("has_routes", Boolean, nullable=False, server_default=text("false")),
    Column("fifo", Boolean, nullable=False, server_default=text("false")),
    Column("fair", Boolean, nullable=False, server_default=text("false")),
    Column("content_dedup", Boolean, nullable=False, server_default=text("false")),
    Column("dedup_window", DOUBLE_PRECISION, nullable=False, server_default=text("300")),
    Column("lease_durability", Text, nullable=False, server_default=text("'durable'::text")),
    Column("duplicate_budget", DOUBLE_PRECISION, nullable=False, server_default=text("1e-06")),
    PrimaryKeyConstraint("id", name="queues_pkey"),
    UniqueConstraint("name", name="queues_name_key"),
    CheckConstraint("name ~ '^[A-Za-z0-9_-]{1,80}$'", name="queues_name_check"),
    CheckConstraint(
        "(dead_letter_queue IS NULL) = (max_receive_count IS NULL)", name="queues_check"
    ),
    CheckConstraint(
        "lease_policy IN ('fixed', 'per_type')", name="queues_lease_policy_check"
    ),
    CheckConstraint("NOT (fifo AND fair)", name="queues_fifo_fair_check"),
    CheckConstraint(
        "duplicate_budget >= 1e-9 AND duplicate_budget <= 0.01",
        name="queues_duplicate_budget_check",
    ),
)

in_flight = Table(
    "in_flight",
    metadata,
    _queue_ref("in_flight"),
    Column("n", BigInteger, nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("queue_id", name="in_flight_pkey"),
)

queue_counters = Table(
    "queue_counters",
    metadata,
    _queue_ref("queue_counters"),
    Column("lease_expiries", BigInteger, nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("queue_id", name="queue_counters_pkey"),
)

messages = Table(
    "messages",
    metadata,
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("queue_id", Integer, nullable=False),
    Column("visible_at", TIMESTAMPTZ, nullable=False),
    Column("expires_at", TIMESTAMPTZ, nullable=True),
    Column("enqueued_at", TIMESTAMPTZ, nullable=False),
    Column("receive_count", Integer, nullable=False, server_default=text("0")),
    Column("lease_no", Integer, nullable=False, server_default=text("0")),
    Column("lease_expiries", Integer, nullable=False, server_default=text("0")),
    Column("released", Boolean, nullable=False, server_default=text("false")),
    Column("first_received_at", TIMESTAMPTZ, nullable=True),
    Column("last_received_at", TIMESTAMPTZ, nullable=True),
    Column("source_queue_id", Integer, nullable=True),
    Column("group_id", Text, nullable=True),
    Column("dedup_id", Text, nullable=True),
    Column("body", JSONB, nullable=False),
    Column("attributes", JSONB, nullable=True),
    Column("consumer_id", Integer, nullable=True),
    PrimaryKeyConstraint("id", name="messages_pkey"),
    Index("messages_claim", "queue_id", "visible_at"),
    Index("messages_expiry", "expires_at", postgresql_where=text("expires_at IS NOT NULL")),
    Index(
        "messages_source", "source_queue_id", postgresql_where=text("source_queue_id IS NOT NULL")
    ),
    Index(
        "messages_group", "queue_id", "group_id", "visible_at", "id",
        postgresql_where=text("group_id IS NOT NULL"),
    ),
    postgresql_with={
        "fillfactor": "80",
        "autovacuum_vacuum_scale_factor": "0",
        "autovacuum_vacuum_threshold": "5000",
        "autovacuum_vacuum_insert_scale_factor": "0",
        "autovacuum_vacuum_insert_threshold": "20000",
        "autovacuum_analyze_scale_factor": "0",
        "autovacuum_analyze_threshold": "20000",
        "autovacuum_vacuum_cost_delay": "0",
    },
)

consumers = Table(
    "consumers",
    metadata,
    Column("id", Integer, Identity(always=True), nullable=False),
    Column("role", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("name", Text, nullable=True),
    Column("registered_at", TIMESTAMPTZ, nullable=False),
    Column("lost_at", TIMESTAMPTZ, nullable=True),
    Column("queue_ids", ARRAY(Integer), nullable=False, server_default=text("'{}'::integer[]")),
    Column("backend_start", TIMESTAMPTZ, nullable=True),
    Column("last_seen", TIMESTAMPTZ, nullable=True),
    Column("seen_on", Text, nullable=True),
    Column("session", Boolean, nullable=False, server_default=text("true")),
    Column("lost_on", Text, nullable=True),
    PrimaryKeyConstraint("id", name="consumers_pkey"),
    schema=SCHEMA,
)

message_history = Table(
    "message_history",
    metadata,
    Column("queue_id", Integer, nullable=False),
    Column("queue", Text, nullable=False),
    Column("message_id", BigInteger, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("enqueued_at", TIMESTAMPTZ, nullable=False),
    Column("first_received_at", TIMESTAMPTZ, nullable=True),
    Column("last_received_at", TIMESTAMPTZ, nullable=True),
    Column("finished_at", TIMESTAMPTZ, nullable=False),
    Column("receive_count", Integer, nullable=False),
    Column("lease_expiries", Integer, nullable=False),
    Column("type", Text, nullable=True),
    Column("weight", Integer, nullable=False, server_default=text("1")),
    CheckConstraint(
        "outcome IN ('deleted', 'dead_lettered', 'expired', 'purged')",
        name="message_history_outcome_check",
    ),
    Index("message_history_queue", "queue_id", "finished_at"),
    postgresql_partition_by="RANGE (finished_at)",
)


grants = Table(
    "grants",
    metadata,
    _queue_ref("grants"),
    Column("role", OID, nullable=False),  # pg_roles.oid
    Column("privilege", Text, nullable=False),
    Column(
        "granted_at", TIMESTAMPTZ, nullable=False, server_default=text("statement_timestamp()")
    ),
    PrimaryKeyConstraint("queue_id", "role", "privilege", name="grants_pkey"),
    CheckConstraint(
        "privilege IN ('send', 'receive', 'manage')", name="grants_privilege_check"
    ),
)


def _schema_of(obj: Any) -> str | None:
    schema = getattr(obj, "schema", None)
    if schema is None:
        table = getattr(obj, "table", None)  # columns, indexes, constraints
        schema = getattr(table, "schema", None)
    return schema if isinstance(schema, str) else None


def include_object(
    object: Any,  # Alembic's parameter names
    name: str | None,
    type_: str,
    reflected: bool,
    compare_to: Any,
) -> bool:
    """Alembic ``include_object`` hook: leave everything in schema ``queue_pg`` alone.

    queue_pg's own migrations (with their own version table) own those tables; your
    autogenerate must neither create them from this metadata nor drop them when reflected.
    """
    return _schema_of(object) != SCHEMA


def include_name(name: str | None, type_: str, parent_names: Mapping[str, Any]) -> bool:
    """Alembic ``include_name`` hook: do not reflect schema ``queue_pg`` (cheaper, and quiet)."""
    if type_ == "schema":
        return name != SCHEMA
    return parent_names.get("schema_name") != SCHEMA
