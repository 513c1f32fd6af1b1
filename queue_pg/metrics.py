"""Moved to :mod:`queue_pg.ops.metrics` (the operator's layer, docs/architecture.md).

This module only hands that one's names on, so code written for the old path
(``from queue_pg.metrics import wsgi_app``) keeps working. Nothing in queue_pg imports it.
"""

from queue_pg.ops.metrics import *  # noqa: F403
from queue_pg.ops.metrics import __all__ as __all__
