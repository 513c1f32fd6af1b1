"""The dashboard as a WSGI app, an ASGI app, and a small threaded server of its own.

Each adapter only turns its protocol's request into a :class:`Request` and a
:class:`Response` back. The ASGI one runs :meth:`Dashboard.handle` (the sync client) in a
worker thread, so an event loop never waits on the database.
"""

from __future__ import annotations

import asyncio
import socketserver
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from queue_pg.ops.dashboard.http import MAX_BODY, Handler, Request, Response

__all__ = ["AsgiApp", "WsgiApp", "make_http_server", "serve"]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def _redirect(location: str) -> Response:
    return Response(308, "text/plain; charset=utf-8", b"", (("Location", location),))


class WsgiApp:
    """WSGI: the mount point is SCRIPT_NAME; its root without the slash redirects to it with one,
    so the pages' relative links resolve under any prefix."""

    def __init__(self, dashboard: Handler) -> None:
        self.dashboard = dashboard

    def __call__(self, environ: dict[str, Any],
                 start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "":
            response = _redirect(environ.get("SCRIPT_NAME", "") + "/")
        else:
            headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items()
                       if k.startswith("HTTP_")}
            if "CONTENT_TYPE" in environ:
                headers["content-type"] = environ["CONTENT_TYPE"]
            try:
                length = min(int(environ.get("CONTENT_LENGTH") or 0), MAX_BODY + 1)
            except ValueError:
                length = 0
            body = environ["wsgi.input"].read(length) if length > 0 else b""
            response = self.dashboard.handle(Request(
                environ.get("REQUEST_METHOD", "GET"), path.lstrip("/"),
                dict(parse_qsl(environ.get("QUERY_STRING", ""))), headers, body,
                address=environ.get("REMOTE_ADDR", ""), root=environ.get("SCRIPT_NAME", ""),
                https=environ.get("wsgi.url_scheme") == "https"))
        reason = {200: "OK", 308: "Permanent Redirect"}.get(response.status, "Error")
        start_response(f"{response.status} {reason}", response.all_headers())
        return [b""] if environ.get("REQUEST_METHOD") == "HEAD" else [response.body]


class AsgiApp:
    """ASGI (HTTP only): the mount point is ``root_path``; the same redirect as WsgiApp."""

    def __init__(self, dashboard: Handler) -> None:
        self.dashboard = dashboard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # served on its own: nothing to start, nothing to stop
            while True:
                kind = (await receive())["type"]
                if kind == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif kind == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        root = scope.get("root_path", "")
        path = scope["path"]
        # Starlette's Mount leaves the prefix in path; a plain ASGI server gives root_path ""
        if root and (path == root or path.startswith(root + "/")):
            path = path[len(root):]
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False) and len(body) <= MAX_BODY
        if path == "":
            response = _redirect(root + "/")
        else:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                       for k, v in scope.get("headers", [])}
            request = Request(scope["method"], path.lstrip("/"),
                              dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"))),
                              headers, body[: MAX_BODY + 1],
                              address=(scope.get("client") or ("",))[0], root=root,
                              https=scope.get("scheme") == "https")
            response = await asyncio.to_thread(self.dashboard.handle, request)
        await send({"type": "http.response.start", "status": response.status,
                    "headers": [(k.encode("latin-1"), v.encode("latin-1"))
                                for k, v in response.all_headers()]})
        await send({"type": "http.response.body", "body": response.body})


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


def make_http_server(dashboard: Handler, host: str = "127.0.0.1",
                     port: int = 8080) -> WSGIServer:
    """A server bound to host:port (0: any free port), one thread per request; the caller runs
    ``serve_forever()`` and, from another thread, ``shutdown()``."""
    return make_server(host, port, WsgiApp(dashboard), server_class=_ThreadingServer,
                       handler_class=_Quiet)


def serve(dashboard: Handler, host: str = "127.0.0.1", port: int = 8080,
          ready: Callable[[str], None] | None = None) -> None:
    """Serves the dashboard until interrupted; ``ready`` is told the URL once it listens."""
    with make_http_server(dashboard, host, port) as server:
        if ready is not None:
            ready(f"http://{host}:{server.server_port}/")
        server.serve_forever()
