"""The app config: hooks enqueue and jobs into Django when Django starts (``ready``)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class QueuePGConfig(AppConfig):
    name = "queue_pg.contrib.django"
    label = "queue_pg"
    verbose_name = "Queues"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from queue_pg.contrib.django import conf, connection
        from queue_pg.jobs.tasks import registry

        settings = conf.get()
        if settings.atomic:
            registry.connection = connection
        else:  # still the app's database: a client of its own on Django's DATABASE
            registry.client_for = _own_client
        registry.set_job_context("django", _job_context, _async_job_context)
        post_migrate.connect(_sync_queues, sender=self, dispatch_uid="queue_pg.sync_queues")


_client: list[Any] = []
_client_lock = threading.Lock()


def _own_client() -> Any:
    """ATOMIC False: a client (made once) on the database Django's DATABASE alias names."""
    from queue_pg.client import Client
    from queue_pg.contrib.django import dsn

    with _client_lock:
        if not _client:
            _client.append(Client(dsn()))
        return _client[0]


@contextmanager
def _job_context() -> Iterator[None]:
    """What Django's request cycle does around a request, around each job: close connections
    that are broken or past CONN_MAX_AGE, so a long-running worker never keeps a dead one."""
    from django.db import close_old_connections

    close_old_connections()
    try:
        yield
    finally:
        close_old_connections()


def _sync_queues(sender: AppConfig, using: str = "default", **kwargs: Any) -> None:
    """After ``migrate``: create the queues of QUEUE_PG["QUEUES"] (unless our migration was
    reversed and the schema is gone)."""
    from queue_pg.contrib._common import ensure_queues, installed
    from queue_pg.contrib.django import conf, connection

    settings = conf.get()
    if using != settings.database or not settings.queues:
        return
    conn = connection(using)
    if installed(conn):
        ensure_queues(conn, settings.queues)


@asynccontextmanager
async def _async_job_context() -> AsyncIterator[None]:
    """The same around an ``async def`` task, as Django's ASGI handler does it: in its thread
    for sync code (``sync_to_async``), not in the event loop."""
    from asgiref.sync import sync_to_async
    from django.db import close_old_connections

    await sync_to_async(close_old_connections)()
    try:
        yield
    finally:
        await sync_to_async(close_old_connections)()
