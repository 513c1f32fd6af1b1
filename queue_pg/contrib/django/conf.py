"""``settings.QUEUE_PG``: the Django app's settings, every key optional.

``DATABASE`` (``"default"``)
    The alias whose connection enqueues, installs the schema and whose settings the worker
    connects with.
``TASKS`` (every installed app's ``tasks`` module)
    Modules the worker imports to register its tasks.
``QUEUES`` (``{}``)
    ``{name: {setting: value}}``, created (or brought to these settings) after every
    ``migrate``; name a dead-letter queue before the queues that use it.
``ATOMIC`` (``True``)
    ``task.enqueue(...)`` without ``conn=`` sends on Django's connection, so inside
    ``transaction.atomic()`` the message commits or rolls back with it (and outside, commits at
    once, like any autocommit write). False: enqueue commits by itself, with a client of its own
    on the same database.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import module_has_submodule

__all__ = ["QueuePGSettings", "get"]

KEYS = frozenset({"DATABASE", "TASKS", "QUEUES", "ATOMIC"})


@dataclass(frozen=True)
class QueuePGSettings:
    database: str
    tasks: tuple[str, ...]
    queues: Mapping[str, Mapping[str, Any]]
    atomic: bool


def _task_modules() -> tuple[str, ...]:
    """``<app>.tasks`` of every installed app that has one (what Celery users expect)."""
    return tuple(
        f"{config.name}.tasks"
        for config in apps.get_app_configs()
        if config.module is not None and module_has_submodule(config.module, "tasks")
    )


def get() -> QueuePGSettings:
    """The settings, read now (tests may override ``settings.QUEUE_PG``)."""
    raw: Mapping[str, Any] = getattr(django_settings, "QUEUE_PG", {}) or {}
    unknown = set(raw) - KEYS
    if unknown:
        raise ImproperlyConfigured(
            f"QUEUE_PG: unknown key(s) {', '.join(sorted(unknown))};"
            f" known: {', '.join(sorted(KEYS))}"
        )
    tasks = raw.get("TASKS")
    return QueuePGSettings(
        database=str(raw.get("DATABASE", "default")),
        tasks=tuple(tasks) if tasks is not None else _task_modules(),
        queues=dict(raw.get("QUEUES", {})),
        atomic=bool(raw.get("ATOMIC", True)),
    )
