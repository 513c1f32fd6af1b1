"""Moved to :mod:`queue_pg.ops.dashboard` (the operator's layer, docs/architecture.md).

This module only hands that one's names on, so code written for the old path
(``from queue_pg.dashboard import Dashboard``) keeps working. Nothing in queue_pg imports it.
"""

from queue_pg.ops.dashboard import *  # noqa: F403
from queue_pg.ops.dashboard import __all__ as __all__
