"""The ASGI app: SQS's JSON protocol (``X-Amz-Target: AmazonSQS.<Action>``) and its query
protocol (form parameters, XML answers; :mod:`queue_pg.sqs.query`) over queue_pg.

Each request is checked against its SigV4 signature with a key from ``queue_pg.sqs_keys``
(kept in memory: :mod:`queue_pg.endpoint_keys`) and then runs as the key's PostgreSQL role: one
pool serves every role, and each transaction on a connection it lends first checks the key of
the request that borrowed it is still live and takes its role (``queue_pg._enter_key``, a
``SET LOCAL ROLE``; :class:`RolePool`), so queue_pg's own grants decide what the request may do,
a revoked key does nothing more, and no role outlives its transaction (a transaction pooler may
give the server session to anyone next).
``auth=False`` runs every request as the DSN's user, for local development.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from queue_pg.aio import AsyncClient
from queue_pg.aio_base import _configure
from queue_pg.dsn import pooler_of
from queue_pg.endpoint_keys import EndpointKey, KeyCache
from queue_pg.errors import KeyRevoked
from queue_pg.sealing import Keyring
from queue_pg.sqs import actions, moves, query, sigv4
from queue_pg.sqs.errors import RequestTooLarge, describe, message

if TYPE_CHECKING:
    from typing_extensions import Self

logger = logging.getLogger("queue_pg.sqs")
CONTENT_TYPE = "application/x-amz-json-1.0"
TARGET_PREFIX = "AmazonSQS."
#: The largest request body read: SQS's 1 MiB of payload, JSON-escaped, and room for the rest.
MAX_REQUEST_BYTES = 4 * 1024 * 1024


async def _body(request: Request) -> bytes:
    """The body, read up to MAX_REQUEST_BYTES (an unauthenticated caller must not fill memory)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_REQUEST_BYTES:
        raise RequestTooLarge(f"Request body of {declared} bytes is over the"
                              f" {MAX_REQUEST_BYTES} allowed")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_REQUEST_BYTES:
            raise RequestTooLarge(f"Request body is over the {MAX_REQUEST_BYTES} bytes allowed")
        chunks.append(chunk)
    return b"".join(chunks)


#: The key of the request this task serves, whose role it runs as (None: the DSN's own user).
REQUEST_KEY: ContextVar[EndpointKey | None] = ContextVar("queue_pg_sqs_key", default=None)


class Spent:
    """One request's clock, kept only when the app records timings (:class:`Timed`):
    its action and the seconds it spent awaiting PostgreSQL (statements, commits, the loan and
    check of a connection, the key's look-up, a long poll's wait for NOTIFY)."""

    __slots__ = ("action", "db", "depth")

    def __init__(self) -> None:
        self.action = ""
        self.db = 0.0
        self.depth = 0  # awaits of PostgreSQL under way: a nested one (a check) counts once


#: The clock of the request this task serves; None when timings are not recorded.
SPENT: ContextVar[Spent | None] = ContextVar("queue_pg_sqs_spent", default=None)


async def _awaiting_db(work: Awaitable[Any]) -> Any:
    """``await work``, its time added to the request's :class:`Spent` (when one is kept)."""
    spent = SPENT.get()
    if spent is None or spent.depth:
        return await work
    spent.depth += 1
    began = time.perf_counter()
    try:
        return await work
    finally:
        spent.depth -= 1
        spent.db += time.perf_counter() - began


class RoleCursor(psycopg.AsyncCursor[Any]):
    """A cursor of a :class:`RolePool` connection: a statement outside a transaction block
    first takes the loan's key's role (:meth:`EndpointKey.enter`, which fails when the key was
    revoked), both in one pipeline: the statements up to the pipeline's Sync are one implicit
    transaction on an autocommit connection, so the role lasts for that statement, it commits
    at the Sync, and an error in either ends it; one round trip, and no BEGIN or COMMIT to send.
    Statements inside an explicit transaction block (:meth:`RoleConnection.transaction`) take
    the role at its start and commit at its end."""

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Self:
        conn = self.connection
        idle = conn.info.transaction_status == TransactionStatus.IDLE
        if idle and isinstance(conn, RoleConnection) and conn.key is not None:
            return await _awaiting_db(self._with_role(conn, query, params, **kwargs))  # type: ignore[no-any-return]
        return await _awaiting_db(super().execute(query, params, **kwargs))  # type: ignore[no-any-return]

    async def _with_role(self, conn: RoleConnection, query: Any, params: Any,
                         **kwargs: Any) -> Self:
        async with conn.pipeline():  # one implicit transaction, to the Sync at its end
            await conn.take_role()
            await super().execute(query, params, **kwargs)
        return self


#: A connection given back to the pool less than this many seconds ago is lent again without a
#: check (a round trip): a server that went away in between fails that one request (a 500, which
#: SDKs retry), and the pool drops the connection when it comes back broken.
CHECK_AFTER_IDLE = 1.0


class RoleConnection(psycopg.AsyncConnection[Any]):
    """A pooled connection and the key of the request it is lent to (None: the DSN's user)."""

    key: EndpointKey | None = None
    returned_at = float("-inf")  #: when it was last given back (time.monotonic())

    async def take_role(self) -> None:
        """The loan's key's role for the current (or, when idle, a new) transaction;
        KeyRevoked (from the server) when the key is no longer live."""
        if self.key is not None:
            await self.key.enter(self)

    async def notifies(
        self, *, timeout: float | None = None, stop_after: int | None = None
    ) -> AsyncGenerator[psycopg.Notify, None]:
        """A long poll's wait for NOTIFY: counted as awaiting PostgreSQL (:class:`Spent`)."""
        spent = SPENT.get()
        if spent is None or spent.depth:
            async for notify in super().notifies(timeout=timeout, stop_after=stop_after):
                yield notify
            return
        spent.depth += 1
        began = time.perf_counter()
        try:
            async for notify in super().notifies(timeout=timeout, stop_after=stop_after):
                yield notify
        finally:
            spent.depth -= 1
            spent.db += time.perf_counter() - began

    @asynccontextmanager
    async def transaction(
        self, savepoint_name: str | None = None, force_rollback: bool = False
    ) -> AsyncIterator[psycopg.AsyncTransaction]:
        """A transaction (or savepoint) block: its BEGIN is followed by the loan's key's role."""
        async with super().transaction(savepoint_name, force_rollback) as tx:
            await self.take_role()
            yield tx


class RolePool(AsyncConnectionPool[RoleConnection]):
    """One pool for every key's role. Its connections are autocommit: each transaction on a
    lent connection (a lone statement's implicit one, or a transaction block) starts by
    checking the key of the request in :data:`REQUEST_KEY` and taking its role
    (``queue_pg._enter_key``: ``SET LOCAL ROLE``; :class:`RoleCursor`), and a connection given
    back commits what it left open or rolls back a failed transaction. So a role
    lasts one transaction of one loan, on the server session that ran it, and the next
    borrower (or, behind a transaction pooler, the next client of that server session) starts
    as the DSN's user whatever the last one did; nothing is set for the session (no
    ``SET ROLE``, no ``RESET ROLE``)."""

    def __init__(self, dsn: str, *, max_size: int, prepare: bool = False) -> None:
        kwargs: dict[str, Any] = {"autocommit": True, "cursor_factory": RoleCursor}
        # Each statement runs in a pipeline behind the key check (RoleCursor). psycopg (3.3)
        # counts a statement prepared when the execution that reaches prepare_threshold sits in
        # a pipeline an earlier statement failed (a revoked key), though the server skipped its
        # Parse: every later use of it on that connection then fails ("prepared statement
        # _pg3_N does not exist"; tests/test_endpoint_keys.py::
        # test_a_failed_key_check_leaves_the_connection_usable). Prepared on first use (0) it is
        # not: the endpoint prepares on first use (prepare=True) unless a transaction pooler
        # stands between it and the server (whose sessions do not keep them): the server then
        # plans each statement once a connection, not at every request.
        kwargs["prepare_threshold"] = 0 if prepare else None
        super().__init__(dsn, connection_class=RoleConnection, min_size=0, max_size=max_size,
                         open=False, name="queue_pg_sqs", kwargs=kwargs,
                         configure=_configure, check=self._check)

    @staticmethod
    async def _check(conn: RoleConnection) -> None:
        """The pool's check of a connection it lends, skipped when it was in use just now."""
        if time.monotonic() - conn.returned_at >= CHECK_AFTER_IDLE:
            await AsyncConnectionPool.check_connection(conn)

    async def getconn(self, timeout: float | None = None) -> RoleConnection:
        conn: RoleConnection = await _awaiting_db(super().getconn(timeout))
        conn.key = REQUEST_KEY.get()
        return conn

    async def putconn(self, conn: RoleConnection) -> None:
        conn.key = None
        status = conn.info.transaction_status
        with contextlib.suppress(psycopg.Error):  # the pool discards what it cannot reset
            if status == TransactionStatus.INTRANS:
                await _awaiting_db(conn.commit())
            elif status == TransactionStatus.INERROR:
                await _awaiting_db(conn.rollback())
        conn.returned_at = time.monotonic()
        await super().putconn(conn)


#: Seconds between two steps of the running move tasks (their rate holds per step: see
#: queue_pg._redrive_advance), and between two looks for tasks started elsewhere when none runs.
STEP_EVERY = 1.0
IDLE_LOOK_EVERY = 30.0

_RUNNING = "SELECT EXISTS (SELECT 1 FROM queue_pg.redrive_tasks WHERE status = 'running')"


class Endpoint:
    """The app's state: the owner's connections for key look-ups and the keys it keeps, one
    pool and client for the requests of every role, and the stepper of move tasks."""

    #: the kind of the endpoint's keys (queue_pg.endpoint_key)
    kind = "sqs"

    def __init__(self, dsn: str, *, auth: bool = True, pool_size: int = 10,
                 region: str = sigv4.DEFAULT_REGION, keyring: Keyring | None = None) -> None:
        #: opens the stored secrets (queue_pg/sealing.py); with auth, one must be given or set
        #: in the environment (SecretKeyMissing)
        self.keyring = (keyring or Keyring.required()) if auth else None
        #: the live keys, opened (queue_pg/endpoint_keys.py)
        self.keys = None if self.keyring is None else KeyCache(self.kind, self.keyring)
        # the queue_pg_pooler option (or QUEUE_PG_POOLER) taken out of the DSN libpq sees
        stripped, self.pooler = pooler_of(None, dsn)
        self.dsn = stripped or dsn
        self.auth = auth
        self.region = region
        self.pool_size = pool_size
        self._pool: RolePool | None = None
        self._client: AsyncClient | None = None
        self._lookups: AsyncConnectionPool[Any] | None = None
        self._open_lock = asyncio.Lock()  # the first requests may come together
        self._stepper: asyncio.Task[None] | None = None
        self._moves_started = asyncio.Event()

    async def open(self) -> None:
        """Open the pools on first use (idempotent)."""
        if self._client is not None:
            return
        async with self._open_lock:
            if self._client is not None:
                return
            transaction = self.pooler == "transaction"
            pool = RolePool(self.dsn, max_size=self.pool_size, prepare=not transaction)
            await pool.open()
            if self.auth:
                keys: AsyncConnectionPool[Any] = AsyncConnectionPool(
                    self.dsn, min_size=1, max_size=2, open=False,
                    kwargs={"autocommit": True, **({"prepare_threshold": None} if transaction
                                                   else {})})
                try:
                    await keys.open()
                except BaseException:
                    await keys.close()
                    await pool.close()
                    raise
                self._lookups = keys
            self._pool = pool
            self._client = AsyncClient(pool, pooler=self.pooler)
            self._stepper = asyncio.create_task(self._step_moves(), name="queue_pg_sqs_moves")

    @property
    def client(self) -> AsyncClient:
        """The client of every request; it runs as the key's role in :data:`REQUEST_KEY`."""
        assert self._client is not None, "Endpoint.open() first"
        return self._client

    def moves_started(self) -> None:
        """A move task started here: step it from now on (see :meth:`_step_moves`)."""
        self._moves_started.set()

    async def _step_moves(self) -> None:
        """Step the running move tasks (``redrive_step``, as the DSN's user, who manages every
        queue) every STEP_EVERY seconds while any runs, so a task moves about its rate each
        second instead of a sweep's worth at a time; when none runs, wait for one started here
        or look again after IDLE_LOOK_EVERY (tasks started by the CLI or another endpoint)."""
        REQUEST_KEY.set(None)  # this task's own context: the DSN's user
        client, pool = self.client, self._pool
        assert pool is not None
        warned = False
        while True:
            running = False
            self._moves_started.clear()  # a start from now on wakes the wait below
            try:
                await client.redrive_step()
                async with pool.connection() as conn:
                    row = await (await conn.execute(_RUNNING)).fetchone()
                running = bool(row and row[0])
            except Exception:  # e.g. a DSN user who may not read the tasks: say so once
                logger.log(logging.DEBUG if warned else logging.WARNING,
                           "queue_pg.sqs: stepping move tasks failed", exc_info=True)
                warned = True
            if running:
                await asyncio.sleep(STEP_EVERY)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._moves_started.wait(), IDLE_LOOK_EVERY)

    async def close(self) -> None:
        if self._stepper is not None:
            self._stepper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._stepper
            self._stepper = None
        self._client = None
        for pool in (self._pool, self._lookups):
            if pool is not None:
                await pool.close()
        self._pool = self._lookups = None

    async def key_of(self, request: Request, body: bytes) -> EndpointKey | None:
        """The key the request runs as (its role); SignatureError when it is not signed by a
        live key (in its Authorization header, or in its query string: a presigned URL)."""
        if not self.auth:
            return None
        headers = {k.lower(): v for k, v in request.headers.items()}
        pairs = list(request.query_params.multi_items())
        presigned = None
        if sigv4.is_presigned(pairs) and "authorization" not in headers:
            presigned = sigv4.parse_presigned(pairs)
            cred = presigned.cred
        else:
            cred = sigv4.parse(headers.get("authorization"))
        sigv4.check_scope(cred, self.region, headers, presigned=presigned is not None)
        raw_path = (request.scope.get("raw_path") or request.url.path.encode()).decode("latin-1")

        def check(key: EndpointKey) -> None:
            if presigned is not None:
                sigv4.verify_presigned(presigned, key.secret, request.method, raw_path, pairs,
                                       headers, body)
            else:
                sigv4.verify(cred, key.secret, request.method, raw_path, pairs, headers, body)

        return await self.verified(cred.access_key, check, no_live_key)

    async def verified(self, name: str, check: Callable[[EndpointKey], None],
                       unknown: Callable[[], Exception]) -> EndpointKey:
        """The live key of ``name`` (kept, else looked up and kept) with which the request's
        signature passes ``check`` (which raises when it does not); ``unknown()`` is raised
        when ``name`` has no live key."""
        assert self.keys is not None
        key = self.keys.kept(name, check)
        if key is not None:
            return key
        await self.open()
        assert self._lookups is not None
        found: EndpointKey | None = await _awaiting_db(self.keys.look_up(self._lookups, name))
        if found is None:
            self.keys.forget(name)
            raise unknown()
        check(found)
        self.keys.keep(found)
        return found


def no_live_key() -> sigv4.SignatureError:
    """The answer to a request signed by no live key (unknown, revoked, its role dropped)."""
    return sigv4.SignatureError("InvalidClientTokenId",
                                "The security token included in the request is invalid.")


class Timed:
    """The app with each request's clock (:class:`Spent`): from its arrival to the last byte of
    its answer handed to the server, the action, and the part spent awaiting PostgreSQL. Kept in
    memory, written to ``path`` (one JSON array per request: action, seconds in the app, seconds
    awaiting PostgreSQL) when the app shuts down, then ``["(cpu)", s, 0]``: the CPU seconds
    (user and system) the process used in all. For ``python -m bench sqs``."""

    def __init__(self, app: Starlette, path: str) -> None:
        self.app = app
        self.state = app.state
        self.path = path
        self.samples: list[tuple[str, float, float]] = []

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            if scope["type"] == "lifespan":
                self.write()
            return
        spent = Spent()
        token = SPENT.set(spent)
        began = time.perf_counter()

        async def answer(msg: Any) -> None:
            await send(msg)
            if msg["type"] == "http.response.body" and not msg.get("more_body"):
                self.samples.append((spent.action, time.perf_counter() - began, spent.db))

        try:
            await self.app(scope, receive, answer)
        finally:
            SPENT.reset(token)

    def write(self) -> None:
        with open(self.path, "w") as f:
            for sample in self.samples:
                f.write(json.dumps(sample) + "\n")
            used = os.times()
            f.write(json.dumps(["(cpu)", used.user + used.system, 0]) + "\n")


def _error(err: Exception, request_id: str, query_protocol: bool = False) -> Response:
    code, status, query_code, sender = describe(err)
    if status >= 500:
        logger.exception("queue_pg.sqs: internal error", exc_info=err)
    text = message(err)
    if query_protocol:
        return Response(query.error(query_code, text, sender, request_id),
                        status_code=status, media_type="text/xml",
                        headers={"x-amzn-RequestId": request_id})
    body = {"__type": f"com.amazonaws.sqs#{code}", "message": text}
    fault = "Sender" if sender else "Receiver"
    return Response(json.dumps(body), status_code=status, media_type=CONTENT_TYPE,
                    headers={"x-amzn-query-error": f"{query_code};{fault}",
                             "x-amzn-RequestId": request_id})


def _json_call(request: Request, body: bytes) -> tuple[str, dict[str, Any]]:
    """(action, parameters) of a JSON protocol request."""
    target = request.headers.get("x-amz-target", "")
    try:
        params = json.loads(body or b"{}")
    except ValueError:
        params = None
    if not isinstance(params, dict):
        raise actions.MissingParameter("The request body must be a JSON object.")
    return target.removeprefix(TARGET_PREFIX), params


def _query_call(request: Request, body: bytes, base: str) -> tuple[str, dict[str, Any]]:
    """(action, parameters) of a query protocol request: query string and form body; the queue
    is the request's path when no QueueUrl is given, as older SDKs send it."""
    pairs = [(k, v) for k, v in request.query_params.multi_items()
             if k not in sigv4.PRESIGN_PARAMS]  # a presigned URL's signature is no parameter
    pairs += parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
    action, params = query.params(pairs)
    if "QueueUrl" not in params and request.url.path.strip("/"):
        params["QueueUrl"] = base + request.url.path
    return action, params


def create_app(dsn: str, *, auth: bool = True, pool_size: int = 10,
               region: str = sigv4.DEFAULT_REGION, keyring: Keyring | None = None) -> Starlette:
    """The endpoint as an ASGI app, to run with uvicorn or mount in another app.

    ``keyring`` opens the stored secrets (default: ``QUEUE_PG_SECRET_KEY``); with ``auth``,
    :class:`~queue_pg.sealing.SecretKeyMissing` when there is none.
    JSON protocol when the request has ``X-Amz-Target``, else the query protocol. ``region``:
    the one region signatures must be scoped to. ``Timed(create_app(...), path)`` records
    where each request's time goes."""
    endpoint = Endpoint(dsn, auth=auth, pool_size=pool_size, region=region, keyring=keyring)

    async def handle(request: Request) -> Response:
        is_query = "x-amz-target" not in request.headers
        request_id = str(uuid.uuid4())
        try:
            body = await _body(request)
            await endpoint.open()
            key = await endpoint.key_of(request, body)
            base = f"{request.url.scheme}://{request.headers.get('host', request.url.netloc)}"
            name, params = (_query_call(request, body, base) if is_query
                            else _json_call(request, body))
            spent = SPENT.get()
            if spent is not None:
                spent.action = name
            action = actions.ACTIONS.get(name) or moves.ACTIONS.get(name)
            if action is None:
                raise actions.BatchError("InvalidAction", f"The action {name or '(none)'} is not"
                                         " valid for this endpoint.")
            actions.check_types(params)
            token = REQUEST_KEY.set(key)  # every connection the action borrows takes its role
            try:
                result = await action(actions.Request(endpoint.client, params, base))
            except KeyRevoked:  # since it was kept: the transaction that found it did nothing
                if endpoint.keys is not None and key is not None:
                    endpoint.keys.forget(key)
                raise no_live_key() from None
            finally:
                REQUEST_KEY.reset(token)
            if name == "StartMessageMoveTask":
                endpoint.moves_started()
        except Exception as err:  # every failure answers as SQS does
            return _error(err, request_id, is_query)
        headers = {"x-amzn-RequestId": request_id}
        if is_query:
            return Response(query.response(name, result, request_id), media_type="text/xml",
                            headers=headers)
        return Response(json.dumps(result), media_type=CONTENT_TYPE, headers=headers)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:  # at start, so move tasks already running are stepped before any request
            await endpoint.open()
        except Exception:  # the server starts anyway; the first request tries again
            logger.warning("queue_pg.sqs: cannot open the pools yet", exc_info=True)
        yield
        await endpoint.close()

    routes = [Route("/{path:path}", handle, methods=["GET", "POST"])]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.endpoint = endpoint
    return app


__all__ = ["REQUEST_KEY", "SPENT", "Endpoint", "RolePool", "Spent", "Timed", "create_app"]
