"""Prometheus metrics of every queue (``pip install 'queue-pg[dashboard]'``).

A custom collector: each scrape runs two queries whatever the number of queues
(``queue_pg.queue_overview`` with ``queue_pg.replica_status``: on a hot standby, how stale the
figures are; and ``queue_pg.stuck_jobs`` counted by queue and type) and turns their columns into
metric families named by Prometheus conventions. Figures are
SQL's; this module only names them. Serve them with
``queue-pg metrics --port 9464``, or mount :func:`wsgi_app` / :func:`asgi_app` in a server of
your own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import make_asgi_app, make_wsgi_app, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from queue_pg.advice import QueueOverview, StuckCount
from queue_pg.client import Client
from queue_pg.plain import plain

__all__ = ["QUANTILES", "QueueCollector", "asgi_app", "registry", "serve", "stuck_families",
           "wsgi_app"]

log = logging.getLogger("queue_pg.metrics")

#: The quantiles of the processing and waiting summaries, and the column each is read from.
QUANTILES = (("0.5", "50"), ("0.95", "95"), ("0.99", "99"))

#: state label -> the queue_stats column of queue_pg_messages.
_STATES = (("visible", "visible"), ("in_flight", "in_flight"), ("delayed", "delayed"),
           ("dead_lettered", "dead_lettered"))

#: counter name (without _total) -> column, help.
_COUNTERS = (
    ("queue_pg_messages_sent", "sent",
     "Messages sent (approximate: a rolled-back send stays counted)."),
    ("queue_pg_messages_received", "received", "Receives of a message (each redelivery counts)."),
    ("queue_pg_messages_deleted", "deleted", "Messages deleted after their work was done."),
    ("queue_pg_lease_expiries", "lease_expiries", "Leases that lapsed and led to a redelivery."),
    ("queue_pg_stale_receipts", "stale_receipts",
     "Refusals of a stale receipt (the lease had lapsed: the timeout may be too short)."),
)

#: gauge name -> column, help (a NULL column leaves the queue's sample out).
_GAUGES = (
    ("queue_pg_oldest_visible_age_seconds", "oldest_visible_age",
     "Age of the oldest visible message (absent when none is visible)."),
    ("queue_pg_visibility_timeout_seconds", "visibility_timeout",
     "The queue's visibility timeout."),
    ("queue_pg_recommended_timeout_seconds", "recommended_timeout",
     "The visibility timeout advised by the messages finished in the window."),
    ("queue_pg_heartbeat_interval_seconds", "heartbeat_interval",
     "The heartbeat interval advised with it."),
    ("queue_pg_processing_max_seconds", "max", "Longest processing time in the window."),
    ("queue_pg_wait_max_seconds", "wait_max",
     "Longest wait from send to first receive in the window."),
    ("queue_pg_lease_expiry_ratio", "expiry_rate",
     "Lease expiries per receive of the messages finished in the window."),
    ("queue_pg_dead_letter_ratio", "dead_letter_rate",
     "Share of the messages finished in the window that were dead-lettered."),
    ("queue_pg_messages_finished", "messages_finished",
     "Messages finished (deleted, dead-lettered, expired, purged) in the window."),
)

#: summary name -> column prefix ('' or 'wait_'), help.
_SUMMARIES = (
    ("queue_pg_processing_seconds", "",
     "Final receive to delete, of the messages deleted in the window."),
    ("queue_pg_wait_seconds", "wait_",
     "Send to first receive, of the messages finished in the window."),
)


class QueueCollector(Collector):
    """Reads ``queue_overview`` once per collect. ``window``: seconds of finished messages the
    summaries, the advice and the ratios describe (a Prometheus summary's sliding window)."""

    def __init__(self, client: Client, window: float = 600) -> None:
        self.client = client
        self.window = window

    def describe(self) -> list[Metric]:
        """Nothing up front: registering must not query the database."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The families of one read; queue_pg_up 0 (and nothing else) when the read fails."""
        try:
            rows, replica = self.client.queue_overview_replica(self.window)
        except Exception:
            log.exception("queue_pg metrics: reading queue_overview failed")
            yield GaugeMetricFamily("queue_pg_up", "Whether the last scrape read the database.", 0)
            return
        yield GaugeMetricFamily("queue_pg_up", "Whether the last scrape read the database.", 1)
        yield from families(rows, self.window)
        try:
            stuck = self.client.stuck_counts()
        except Exception:  # the rest of the scrape stands; the family is absent
            log.exception("queue_pg metrics: reading stuck_jobs failed")
        else:
            yield from stuck_families(stuck)
        if replica.standby and replica.replay_age is not None:
            yield GaugeMetricFamily(
                "queue_pg_replica_replay_age_seconds",
                "On a hot standby: age of the last replayed commit (how stale the figures are).",
                replica.replay_age)


def families(rows: Sequence[QueueOverview], window: float) -> Iterator[Metric]:
    """The metric families of a read of ``queue_overview``."""
    messages = GaugeMetricFamily("queue_pg_messages", "Messages of the queue by state.",
                                 labels=["queue", "state"])
    approximate = GaugeMetricFamily(
        "queue_pg_messages_approximate",
        "1 when a state holds more than 1,000 messages and its count is the latest sample's.",
        labels=["queue"])
    for r in rows:
        for state, column in _STATES:
            messages.add_metric([r.queue, state], getattr(r, column))
        approximate.add_metric([r.queue], float(r.approximate))
    yield messages
    yield approximate
    for name, column, doc in _COUNTERS:
        counter = CounterMetricFamily(name, doc, labels=["queue"])
        for r in rows:
            counter.add_metric([r.queue], getattr(r, column))
        yield counter
    for name, column, doc in _GAUGES:
        gauge = GaugeMetricFamily(name, doc, labels=["queue"])
        for r in rows:
            value = getattr(r, column)
            if value is not None:
                gauge.add_metric([r.queue], value)
        yield gauge
    for name, prefix, doc in _SUMMARIES:
        summary = Metric(name, f"{doc} Quantiles over the last {window:g} s.", "summary")
        for r in rows:
            for quantile, column in QUANTILES:
                value = getattr(r, f"{prefix}p{column}")
                if value is not None:
                    summary.add_sample(name, {"queue": r.queue, "quantile": quantile}, value)
        yield summary


def stuck_families(rows: Sequence[StuckCount]) -> Iterator[Metric]:
    """The hung-work families of a read of ``stuck_jobs`` counted by queue and type: only the
    queue-types that have stuck jobs now (a series that vanishes is 0)."""
    count = GaugeMetricFamily(
        "queue_pg_stuck_jobs",
        "Jobs running past twice their type's lease on a 'per_type' queue (queue_pg.stuck_jobs);"
        " past four times their heartbeats are refused.", labels=["queue", "type"])
    longest = GaugeMetricFamily(
        "queue_pg_stuck_job_longest_seconds",
        "The longest run among the queue-type's stuck jobs.", labels=["queue", "type"])
    for r in rows:  # a type is the producer's string: plain text (queue_pg.plain)
        count.add_metric([r.queue, plain(r.type)], r.stuck)
        longest.add_metric([r.queue, plain(r.type)], r.longest)
    yield count
    yield longest


def registry(client: Client, window: float = 600) -> CollectorRegistry:
    """A registry holding only the queue collector (no process or platform metrics)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(QueueCollector(client, window))
    return reg


def wsgi_app(client: Client, window: float = 600) -> Callable[..., Any]:
    """A WSGI app serving the metrics at any path: mount it (at /metrics) in Flask, Django..."""
    return make_wsgi_app(registry(client, window))


def asgi_app(client: Client, window: float = 600) -> Callable[..., Any]:
    """An ASGI app serving the metrics. A scrape runs its one query on a pool connection,
    blocking (as prometheus_client's ASGI app collects synchronously)."""
    return make_asgi_app(registry(client, window))


def serve(client: Client, port: int = 9464, addr: str = "127.0.0.1", window: float = 600) -> Any:
    """Serve the metrics over HTTP in a background thread; returns (server, thread).

    ``addr`` is loopback by default: the metrics name every queue the role sees and ask for no
    credentials, so another address is a choice to make (docs/monitoring.md)."""
    return start_http_server(port, addr=addr, registry=registry(client, window))
