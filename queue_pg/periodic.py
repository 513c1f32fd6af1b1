"""Moved: ``periodic`` and ``Periodic`` to :mod:`queue_pg.jobs.tasks` (also handed on by
:mod:`queue_pg.jobs.periodic`, the workers' Scheduler), the schedules' rows and statements to
:mod:`queue_pg.schedules` (docs/architecture.md).

This module only hands their names on, so code written for the old path
(``from queue_pg.periodic import periodic``) keeps working. Nothing in queue_pg imports it.
"""

from queue_pg.jobs.periodic import *  # noqa: F403
from queue_pg.jobs.periodic import __all__ as _periodic
from queue_pg.schedules import *  # noqa: F403
from queue_pg.schedules import __all__ as _schedules

__all__ = [*_periodic, *_schedules]
