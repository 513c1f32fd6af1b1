"""Moved to :mod:`queue_pg.jobs.tasks` (the jobs layer, docs/architecture.md).

This module only hands that one's names on, so code written for the old path
(``from queue_pg.tasks import registry``) keeps working. Nothing in queue_pg imports it.
"""

from queue_pg.jobs.tasks import *  # noqa: F403
from queue_pg.jobs.tasks import __all__ as __all__
