"""The queue's own figures and advice, and the settings that act on them: typed rows and the
statements that read them (``Call`` builders, run by both clients like those of ``_ops``).

The figures and the advice are computed in SQL (sql/api/55_monitoring.sql and 56_tuning.sql);
this module only names them and decodes their rows, by column name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, TypeVar

from queue_pg._ops import Call, Columns, Rows
from queue_pg.types import QueueStats

__all__ = [
    "DeadLetter",
    "HungLimit",
    "InFlight",
    "LeaseAdvice",
    "ProcessingTimes",
    "QueueHealth",
    "QueueOverview",
    "QueueSample",
    "ReplicaStatus",
    "Route",
    "SplitPart",
    "StuckCount",
    "StuckJob",
    "TimeoutAdvice",
    "TuningChange",
    "TuningSettings",
    "TuningStep",
    "add_route",
    "alter_tuning",
    "dead_letters",
    "drop_route",
    "hung_limits",
    "in_flight",
    "lease_advice",
    "list_routes",
    "processing_times",
    "queue_health",
    "queue_history",
    "queue_overview",
    "split",
    "stuck_counts",
    "stuck_jobs",
    "timeout_advice",
    "tune",
    "tuning_log",
]

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class QueueHealth(QueueStats):
    """A whole row of ``queue_pg.queue_stats``: the counts of :class:`QueueStats` (exact up to
    1,000 per state, else estimates: ``approximate``), flow counters since the queue
    was made, and the flows over the last minute and hour (None until sweep has taken a sample
    that old). Flow counters are approximate: an operation that is rolled back stays counted."""

    sent: int
    received: int
    deleted: int
    sent_1m: int | None
    received_1m: int | None
    deleted_1m: int | None
    lease_expiries_1m: int | None
    stale_receipts_1m: int | None
    sent_1h: int | None
    received_1h: int | None
    deleted_1h: int | None
    lease_expiries_1h: int | None
    stale_receipts_1h: int | None
    sampled_at: datetime | None


@dataclass(frozen=True, slots=True)
class QueueOverview(QueueHealth):
    """A row of ``queue_pg.queue_overview``: :class:`QueueHealth` taken at ``at`` (the database's
    clock), the queue's visibility timeout, and the figures of the messages finished in the
    window read: the queue-wide timeout advice, processing times (final receive to delete) and
    waiting times (send to first receive). Those are None when nothing finished in the window."""

    at: datetime
    visibility_timeout: float
    recommended_timeout: float | None
    heartbeat_interval: float | None
    confidence: str
    messages_finished: int | None
    samples: int | None
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None
    wait_samples: int | None
    wait_p50: float | None
    wait_p95: float | None
    wait_p99: float | None
    wait_max: float | None
    expiry_rate: float | None
    dead_letter_rate: float | None


@dataclass(frozen=True)
class QueueSample:
    """A sample of a queue (``queue_pg.queue_history``, taken by sweep at most every 15 s): its
    counts then, and the flows since the sample before as rates per second (None for the
    first sample kept)."""

    queue: str
    at: datetime
    visible: int
    in_flight: int
    delayed: int
    dead_lettered: int
    sent_per_s: float | None
    received_per_s: float | None
    deleted_per_s: float | None
    lease_expiries_per_s: float | None
    stale_receipts_per_s: float | None


@dataclass(frozen=True)
class ReplicaStatus:
    """``queue_pg.replica_status()``: whether the server is a hot standby, and how old what it
    shows is (the commit time of the last transaction it replayed, and its age in seconds)."""

    standby: bool
    replayed_at: datetime | None
    replay_age: float | None
    replay_pending: bool | None

    def line(self) -> str | None:
        """One line for a surface; None on a primary."""
        if not self.standby:
            return None
        if self.replay_age is None:
            return "hot standby (read-only): nothing replayed yet"
        pending = ", WAL waiting to be replayed" if self.replay_pending else ""
        return (f"hot standby (read-only): as of the last replayed commit,"
                f" {self.replay_age:.1f}s ago{pending}")


@dataclass(frozen=True)
class InFlight:
    """A leased message (``queue_pg.in_flight_messages``): no body."""

    queue: str
    id: int
    type: str | None
    receive_count: int
    leased_at: datetime
    visible_until: datetime
    lease_expiries: int
    enqueued_at: datetime


@dataclass(frozen=True)
class StuckJob:
    """A row of ``queue_pg.stuck_jobs``: a leased message of a 'per_type' queue whose run has
    lasted past ``stuck_after`` (twice its type's lease); past ``stopped_after`` its heartbeats
    are refused and it is delivered again (docs/timeouts.md, "Hung work"). No body."""

    queue: str
    id: int
    type: str
    consumer: str | None
    leased_at: datetime
    running_for: float
    type_lease: float
    stuck_after: float
    stopped_after: float
    visible_until: datetime


@dataclass(frozen=True)
class HungLimit:
    """A row of ``queue_pg.hung_limits(queue)``: when, in seconds after its receive, a run of
    ``type`` is stuck (``stuck_after``) and when its heartbeats are refused (``stopped_after``)."""

    type: str
    type_lease: float
    stuck_after: float
    stopped_after: float


@dataclass(frozen=True)
class StuckCount:
    """How many jobs of a queue and type ``queue_pg.stuck_jobs`` lists now, and the longest
    run among them (seconds)."""

    queue: str
    type: str
    stuck: int
    longest: float


@dataclass(frozen=True)
class DeadLetter:
    """A message of a dead-letter queue (``queue_pg.dead_letters``): no body."""

    dead_letter_queue: str
    id: int
    source_queue: str | None
    type: str | None
    receive_count: int
    lease_expiries: int
    reason: str | None
    last_error: str | None
    enqueued_at: datetime


@dataclass(frozen=True)
class ProcessingTimes:
    """Seconds from the final receive to the delete (``samples``, p50...max) and from the send
    to the first receive (``wait_*``) of the messages finished in a window; ``scope`` 'queue'
    (every type) or 'type'."""

    queue: str
    scope: str
    type: str | None
    messages: int
    samples: int
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None
    wait_samples: int
    wait_p50: float | None
    wait_p95: float | None
    wait_p99: float | None
    wait_max: float | None


@dataclass(frozen=True)
class TimeoutAdvice:
    """A row of ``queue_pg.timeout_advice``: the current timeout beside the recommended one and
    the evidence (see docs/timeouts.md for the exact definition)."""

    queue: str
    scope: str
    type: str | None
    current_timeout: float
    recommended_timeout: float | None
    heartbeat_interval: float | None
    samples: int
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None
    expiry_rate: float | None
    dead_letter_rate: float
    redeliveries: int
    stale_receipts: int
    confidence: str
    split_advised: bool
    p99_spread: float | None


@dataclass(frozen=True)
class LeaseAdvice:
    """A row of ``queue_pg.lease_advice``: the lease a queue's duplicate budget calls for, per
    queue and type. ``fit`` 'lognormal' (at least 100 samples: a lognormal fitted to the upper
    part, widened when samples are few; the queue's named types share the budget so that hung
    work waits the least on average, a lone type takes the quantile 1 - budget; within the
    tuning bounds) or '6 x p99' (thin history: the rule); the expected duplicates per million
    deliveries at ``lease`` and at the rule's timeout, and the recovery time of hung work
    (docs/timeouts.md, "Leases from a duplicate budget")."""

    queue: str
    scope: str
    type: str | None
    duplicate_budget: float
    samples: int
    confidence: str
    fit: str | None
    quantile: float | None
    lease: float | None
    duplicates_per_million: float | None
    recovery_time: float | None
    rule_timeout: float | None
    rule_duplicates_per_million: float | None


@dataclass(frozen=True)
class TuningSettings:
    """A queue's tuning settings (the queue row's columns of that name)."""

    name: str
    visibility_timeout: float
    max_lease: float
    lease_policy: str
    auto_tune: bool
    tune_min: float
    tune_max: float | None
    duplicate_budget: float


@dataclass(frozen=True)
class TuningStep:
    """What one tuning step saw and did on a queue."""

    queue: str
    old_timeout: float
    new_timeout: float
    advice: float | None
    samples: int
    changed: bool
    why: str


@dataclass(frozen=True)
class TuningChange:
    """A row of ``queue_pg.tuning_log``: a change the tuner made."""

    at: datetime
    queue: str
    old_timeout: float
    new_timeout: float
    advice: float
    samples: int
    why: str


@dataclass(frozen=True)
class Route:
    """Sends to ``queue`` whose attribute ``type`` is ``type`` land in ``target``."""

    queue: str
    type: str
    target: str
    created_at: datetime


@dataclass(frozen=True)
class SplitPart:
    """A type a split gives a queue of its own: ``target``, with the type's timeout."""

    type: str
    target: str
    visibility_timeout: float
    advised: bool
    routed: bool


def _rows(cls: type[R]) -> Callable[[Columns, Rows], list[R]]:
    """Rows to ``cls`` by column name (a newer schema may add columns: they are ignored)."""
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]

    def decode(columns: Columns, rows: Rows) -> list[R]:
        index = [columns.index(n) for n in names]
        return [cls(*[row[i] for i in index]) for row in rows]

    return decode


def _first(cls: type[R]) -> Callable[[Columns, Rows], R]:
    many = _rows(cls)
    return lambda columns, rows: many(columns, rows)[0]


def _bool(columns: Columns, rows: Rows) -> bool:
    return bool(rows[0][0])


def _where_queue(queue: str | None, column: str = "queue") -> str:
    return "" if queue is None else f" where {column} = %(queue)s"


def queue_health(queue: str | None = None, exact: bool = False) -> Call[list[QueueHealth]]:
    """``queue_stats`` of one queue (raises QueueNotFound) or of every queue the caller sees;
    ``exact``: every count counted, O(messages) (else estimates past 1,000 per state)."""
    if queue is None:
        if exact:
            return Call("select * from queue_pg._queue_stats(null, true)", {}, _rows(QueueHealth))
        return Call("select * from queue_pg.queue_stats", {}, _rows(QueueHealth))
    return Call("select * from queue_pg.stats(%(queue)s, exact => %(exact)s)",
                {"queue": queue, "exact": bool(exact)}, _rows(QueueHealth))


def queue_overview(window: float = 600) -> Call[list[QueueOverview]]:
    """``queue_overview`` of the last ``window`` seconds: every queue the caller sees, one query."""
    return Call(
        "select * from queue_pg.queue_overview("
        "queue_pg.now() - make_interval(secs => %(window)s::float8), queue_pg.now())",
        {"window": window},
        _rows(QueueOverview),
    )


def overview_and_replica(
    window: float = 600,
) -> Call[tuple[list[QueueOverview], ReplicaStatus]]:
    """:func:`queue_overview` and :func:`replica_status` in one statement: a surface's whole
    read (the replica's columns ride on every row; one row of NULL queue when none is seen)."""
    replica = [f.name for f in fields(ReplicaStatus)]
    overview = _rows(QueueOverview)

    def decode(columns: Columns, rows: Rows) -> tuple[list[QueueOverview], ReplicaStatus]:
        index = [columns.index(f"replica_{n}") for n in replica]
        status = ReplicaStatus(*[rows[0][i] for i in index]) if rows else ReplicaStatus(
            False, None, None, None)
        at = columns.index("queue")
        return overview(columns, [r for r in rows if r[at] is not None]), status

    return Call(
        "select o.*, " + ", ".join(f"r.{n} as replica_{n}" for n in replica)
        + " from queue_pg.replica_status() r left join lateral queue_pg.queue_overview("
        "queue_pg.now() - make_interval(secs => %(window)s::float8), queue_pg.now()) o on true",
        {"window": window},
        decode,
    )


def replica_status() -> Call[ReplicaStatus]:
    """Whether the server is a hot standby, and how stale it is."""
    return Call("select * from queue_pg.replica_status()", {}, _first(ReplicaStatus))


def queue_history(queue: str | None = None, seconds: float = 3600) -> Call[list[QueueSample]]:
    """The samples of the last ``seconds`` (at most 7200) of one queue or every queue seen."""
    return Call(
        "select * from queue_pg.queue_history(%(queue)s::text, %(seconds)s::float8)",
        {"queue": queue, "seconds": seconds},
        _rows(QueueSample),
    )


def _limit(limit: int | None) -> str:
    return "" if limit is None else " limit %(limit)s"


def in_flight(queue: str | None = None, limit: int | None = None) -> Call[list[InFlight]]:
    return Call(
        "select * from queue_pg.in_flight_messages" + _where_queue(queue) + _limit(limit),
        {"queue": queue, "limit": limit},
        _rows(InFlight),
    )


def stuck_jobs(queue: str | None = None) -> Call[list[StuckJob]]:
    return Call(
        "select * from queue_pg.stuck_jobs" + _where_queue(queue), {"queue": queue},
        _rows(StuckJob),
    )


def stuck_counts() -> Call[list[StuckCount]]:
    """``stuck_jobs`` counted by queue and type (the metric ``queue_pg_stuck_jobs``)."""
    return Call(
        "select queue, type, count(*)::int as stuck, max(running_for) as longest"
        " from queue_pg.stuck_jobs group by queue, type order by queue, type", {},
        _rows(StuckCount),
    )


def hung_limits(queue: str) -> Call[list[HungLimit]]:
    return Call("select * from queue_pg.hung_limits(%(queue)s)", {"queue": queue},
                _rows(HungLimit))


def dead_letters(dlq: str | None = None, limit: int | None = None) -> Call[list[DeadLetter]]:
    return Call(
        "select * from queue_pg.dead_letters" + _where_queue(dlq, "dead_letter_queue")
        + _limit(limit),
        {"queue": dlq, "limit": limit},
        _rows(DeadLetter),
    )


def _window(
    name: str, queue: str | None, since: datetime | None, until: datetime | None
) -> tuple[str, dict[str, Any]]:
    """The view (the last 24 hours) or the function over [since, until)."""
    if since is None and until is None:
        source = f"queue_pg.{name}"
    else:
        source = (
            f"queue_pg.{name}("
            "coalesce(%(since)s::timestamptz, queue_pg.now() - interval '24 hours'),"
            " coalesce(%(until)s::timestamptz, queue_pg.now()))"
        )
    return f"select * from {source}" + _where_queue(queue), {
        "queue": queue, "since": since, "until": until
    }


def processing_times(
    queue: str | None = None, since: datetime | None = None, until: datetime | None = None
) -> Call[list[ProcessingTimes]]:
    query, params = _window("processing_times", queue, since, until)
    return Call(query, params, _rows(ProcessingTimes))


def timeout_advice(
    queue: str | None = None, since: datetime | None = None, until: datetime | None = None
) -> Call[list[TimeoutAdvice]]:
    query, params = _window("timeout_advice", queue, since, until)
    return Call(query, params, _rows(TimeoutAdvice))


def lease_advice(
    queue: str | None = None, since: datetime | None = None, until: datetime | None = None
) -> Call[list[LeaseAdvice]]:
    query, params = _window("lease_advice", queue, since, until)
    return Call(query, params, _rows(LeaseAdvice))


def alter_tuning(
    queue: str,
    *,
    lease_policy: str | None = None,
    auto_tune: bool | None = None,
    tune_min: float | None = None,
    tune_max: float | None = None,
    clear: Sequence[str] = (),
    duplicate_budget: float | None = None,
) -> Call[TuningSettings]:
    return Call(
        "select * from queue_pg.alter_tuning(%(queue)s, lease_policy => %(lease_policy)s::text,"
        " auto_tune => %(auto_tune)s::boolean, tune_min => %(tune_min)s::float8,"
        " tune_max => %(tune_max)s::float8, clear => %(clear)s::text[],"
        " duplicate_budget => %(duplicate_budget)s::float8)",
        {
            "queue": queue, "lease_policy": lease_policy, "auto_tune": auto_tune,
            "tune_min": tune_min, "tune_max": tune_max, "clear": list(clear) or None,
            "duplicate_budget": duplicate_budget,
        },
        _first(TuningSettings),
    )


def tune(queue: str | None = None, *, apply: bool = True) -> Call[list[TuningStep]]:
    """One tuning step of ``queue`` (None: of each auto_tune queue the caller manages)."""
    return Call(
        "select * from queue_pg.tune(%(queue)s::text, apply => %(apply)s::boolean)",
        {"queue": queue, "apply": apply},
        _rows(TuningStep),
    )


def tuning_log(queue: str | None = None) -> Call[list[TuningChange]]:
    return Call(
        "select * from queue_pg.tuning_log" + _where_queue(queue), {"queue": queue},
        _rows(TuningChange),
    )


def add_route(queue: str, type: str, target: str) -> Call[bool]:
    return Call(
        "select queue_pg.add_route(%(queue)s, %(type)s, %(target)s) as result",
        {"queue": queue, "type": type, "target": target},
        _bool,
    )


def drop_route(queue: str, type: str) -> Call[bool]:
    return Call(
        "select queue_pg.drop_route(%(queue)s, %(type)s) as result",
        {"queue": queue, "type": type},
        _bool,
    )


def list_routes(queue: str | None = None) -> Call[list[Route]]:
    return Call(
        "select * from queue_pg.list_routes(%(queue)s::text)", {"queue": queue}, _rows(Route)
    )


def split(queue: str, *, apply: bool = False) -> Call[list[SplitPart]]:
    """The split of ``queue`` by type the advice calls for; ``apply`` creates queues and routes."""
    return Call(
        "select * from queue_pg.split(%(queue)s, apply => %(apply)s::boolean)",
        {"queue": queue, "apply": apply},
        _rows(SplitPart),
    )
