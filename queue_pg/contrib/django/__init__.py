"""Django integration: add ``"queue_pg.contrib.django"`` to ``INSTALLED_APPS``.

- ``manage.py migrate`` installs (and later upgrades) schema ``queue_pg`` on Django's database
  and creates the queues of ``settings.QUEUE_PG["QUEUES"]``.
- ``task.enqueue(...)`` sends on Django's own connection: inside ``transaction.atomic()`` the
  message exists if and only if the block commits. :func:`connection` hands that psycopg
  connection to :class:`queue_pg.Client` methods (``client.send(..., conn=connection())``).
- ``manage.py queue_pg_worker`` runs the tasks (options of ``queue-pg worker``).
- The admin lists queues (their stats) and dead letters, read-only.

Needs Django's psycopg 3 backend (``django.db.backends.postgresql`` with psycopg installed).
Settings: :mod:`queue_pg.contrib.django.conf`.
"""

from __future__ import annotations

from typing import Any

import psycopg

__all__ = ["connection", "dsn"]


def connection(using: str | None = None) -> psycopg.Connection[Any]:
    """The psycopg connection under Django's connection ``using`` (default: QUEUE_PG's
    DATABASE), opened if need be; in ``atomic()`` it is in that transaction."""
    from django.db import connections

    from queue_pg.contrib.django import conf

    wrapper = connections[using or conf.get().database]
    wrapper.ensure_connection()
    # as Django's own cursors do: no statements after an error inside atomic()
    wrapper.validate_no_broken_transaction()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        raise TypeError(
            "queue_pg needs Django's PostgreSQL backend on psycopg 3, not "
            f"{type(raw).__name__} ({wrapper.vendor})"
        )
    return raw


def dsn(using: str | None = None) -> str:
    """A libpq DSN for Django's database ``using`` (its NAME, USER, HOST, PORT, OPTIONS ...)."""
    from django.db import connections

    from queue_pg.contrib._common import libpq_dsn_from_params
    from queue_pg.contrib.django import conf

    wrapper = connections[using or conf.get().database]
    if wrapper.vendor != "postgresql":
        raise TypeError(f"queue_pg needs a PostgreSQL database, not {wrapper.vendor}")
    return libpq_dsn_from_params(wrapper.get_connection_params())
