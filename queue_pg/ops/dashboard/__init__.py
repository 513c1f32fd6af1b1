"""A web dashboard of the queues: live charts of the last hour, the timeout advice, the messages
in flight, the dead letters, and (when allowed) purge and redrive. See docs/dashboard.md.

``queue-pg dashboard --port 8080`` serves it; ``Dashboard(dsn).wsgi`` and ``.asgi`` mount it in
an application of your own. It needs nothing beyond queue_pg itself: the charts (uPlot, MIT)
are shipped in ``static/``, so nothing is downloaded when a page loads.
"""

from __future__ import annotations

from queue_pg.ops.dashboard.adapters import AsgiApp, WsgiApp, make_http_server, serve
from queue_pg.ops.dashboard.core import Dashboard
from queue_pg.ops.dashboard.http import Request, Response

__all__ = ["AsgiApp", "Dashboard", "Request", "Response", "WsgiApp", "make_http_server", "serve"]
