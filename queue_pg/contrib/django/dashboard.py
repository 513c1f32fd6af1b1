"""The web dashboard (queue_pg.ops.dashboard) in a Django project's URLs::

    from queue_pg.contrib.django.dashboard import dashboard_urls
    from queue_pg.ops.dashboard import Dashboard

    urlpatterns = [path("queues/", include(dashboard_urls(Dashboard(DSN))))]

Django's own login does not guard it: wrap the view
(``dashboard_urls(board, wrap=staff_member_required)``) to let only staff in. Actions keep
needing the dashboard's token (or, with ``login=True``, its session's CSRF token): a request
without it (a cross-site form among them) is refused, which is why the view is exempt from
Django's CSRF check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import re_path
from django.views.decorators.csrf import csrf_exempt

from queue_pg.ops.dashboard import Dashboard, Request

__all__ = ["dashboard_urls"]


View = Callable[..., Any]


def dashboard_urls(dashboard: Dashboard, wrap: Callable[[View], View] | None = None) -> list[Any]:
    """URL patterns serving ``dashboard`` under the prefix they are included at (include it
    with a trailing slash; Django's CommonMiddleware redirects the prefix without one)."""

    @csrf_exempt
    def view(request: HttpRequest, rest: str) -> HttpResponse:
        headers = {k.lower(): v for k, v in request.headers.items()}
        root = request.path[: len(request.path) - len(rest)].rstrip("/")
        answer = dashboard.handle(Request(request.method or "GET", rest, request.GET.dict(),
                                          headers, request.body,
                                          address=request.META.get("REMOTE_ADDR", ""),
                                          root=root, https=request.is_secure()))
        response = HttpResponse(answer.body, status=answer.status, content_type=answer.content_type)
        for name, value in answer.all_headers():
            if name not in ("Content-Type", "Content-Length"):
                response[name] = value
        return response

    return [re_path(r"^(?P<rest>.*)$", wrap(view) if wrap else view, name="queue_pg_dashboard")]
