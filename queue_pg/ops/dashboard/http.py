"""The dashboard's request and response: the shapes the core answers and the adapters
(WSGI, ASGI, the threaded server) translate, and the one method the adapters call.

Below both: the core (:mod:`queue_pg.ops.dashboard.core`) builds its pages on them, the adapters
(:mod:`queue_pg.ops.dashboard.adapters`) take any :class:`Handler`, so neither imports the other
back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["MAX_BODY", "SECURITY_HEADERS", "Handler", "Request", "Response"]

#: The largest request body read (a POST's JSON); a longer one is refused.
MAX_BODY = 4096
# uPlot sizes its canvas through element.style; nothing is loaded from anywhere else.
SECURITY_HEADERS = (
    ("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self' "
     "'unsafe-inline'; img-src 'self' data:; connect-src 'self'; form-action 'none'; "
     "frame-ancestors 'none'; base-uri 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
)


@dataclass(frozen=True)
class Request:
    """What the dashboard reads of a request. ``path`` is relative to where it is mounted, with
    no leading slash; header names are lower case."""

    method: str
    path: str
    query: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    address: str = ""  # the client's IP address: failed logins are counted per address
    root: str = ""  # where the dashboard is mounted ("" at the root): the session cookie's path
    https: bool = False  # the session cookie is then Secure


@dataclass(frozen=True)
class Response:
    """What the dashboard answers; the adapters send it as their protocol wants."""

    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()

    def with_headers(self, headers: tuple[tuple[str, str], ...]) -> Response:
        """The same response with more headers."""
        return dataclasses.replace(self, headers=self.headers + headers)

    def all_headers(self) -> list[tuple[str, str]]:
        """Content type and length, the security headers every answer carries, then its own."""
        return [("Content-Type", self.content_type), ("Content-Length", str(len(self.body))),
                *SECURITY_HEADERS, *self.headers]


class Handler(Protocol):
    """What the adapters serve: a :class:`queue_pg.ops.dashboard.Dashboard`."""

    def handle(self, request: Request) -> Response: ...
