"""What our Django migrations run: ``queue_pg.install.migrate()`` on Django's own connection.

Every queue_pg release that adds a schema revision ships a Django migration calling
:func:`install` again (it upgrades to head, and does nothing on a database already there, such
as one installed with ``queue-pg migrate``). Reversing the first one drops schema ``queue_pg``
with every queue and message in it.
"""

from __future__ import annotations

from typing import Any

from queue_pg.install import SCHEMA


def install(apps: Any, schema_editor: Any) -> None:
    """Upgrade schema queue_pg to head in one transaction of its own (the migration is
    non-atomic: ``migrate()`` needs an idle connection, and serialises on an advisory lock)."""
    from queue_pg.install import migrate

    wrapper = schema_editor.connection
    if wrapper.vendor != "postgresql":
        raise TypeError(f"queue_pg needs a PostgreSQL database, not {wrapper.vendor}")
    wrapper.ensure_connection()
    migrate(wrapper.connection)


def uninstall(apps: Any, schema_editor: Any) -> None:
    schema_editor.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
