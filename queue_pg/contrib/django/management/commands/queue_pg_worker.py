"""``manage.py queue_pg_worker``: ``queue-pg worker`` on Django's database and tasks.

Its options are those of ``queue-pg worker`` (same defaults and ranges), without MODULES (from
QUEUE_PG["TASKS"]) and --dsn (from Django's DATABASES). Each worker process sets Django up
first, so tasks may use the ORM.
"""

from __future__ import annotations

import argparse
from typing import Any

import click
from django.core.management.base import BaseCommand, CommandError, CommandParser

from queue_pg.contrib._common import (
    run_worker_from_options,
    worker_defaults,
    worker_options,
)
from queue_pg.errors import QueueError


def _converter(param: click.Parameter) -> Any:
    def convert(value: str) -> Any:
        try:
            return param.type.convert(value, param, None)
        except click.BadParameter as exc:
            raise argparse.ArgumentTypeError(exc.message) from exc

    convert.__name__ = param.type.name  # argparse names the type in its error
    return convert


class Command(BaseCommand):
    help = "Run queue_pg tasks (of QUEUE_PG['TASKS']) until SIGTERM / Ctrl-C."

    def add_arguments(self, parser: CommandParser) -> None:
        defaults = worker_defaults()
        for param in worker_options():
            assert isinstance(param, click.Option) and param.name is not None
            parser.add_argument(
                *param.opts,
                dest=param.name,
                action="append" if param.multiple else "store",
                default=defaults[param.name],
                type=_converter(param),
                help=param.help,
            )

    def handle(self, *args: Any, **options: Any) -> None:
        from queue_pg.contrib.django import conf, dsn

        settings = conf.get()
        names = {p.name for p in worker_options()}
        chosen = {k: v for k, v in options.items() if k in names}
        modules = ("queue_pg.contrib.django.worker_setup", *settings.tasks)
        try:
            run_worker_from_options(
                modules, dsn(settings.database), chosen, source=f"Django {settings.database!r}"
            )
        except (QueueError, click.UsageError) as exc:
            raise CommandError(str(exc)) from exc
