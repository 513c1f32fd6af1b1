"""The ASGI app: Azure Queue Storage's REST API (path-style URLs, XML bodies) over queue_pg.

Each request is checked against its Shared Key signature or SAS token with the account's key from
``queue_pg.azure_keys`` and then runs as the key's PostgreSQL role, on the SQS endpoint's
:class:`~queue_pg.sqs.app.RolePool` (one pool for every role, ``SET ROLE`` per loan), so
queue_pg's own grants decide what the request may do. ``auth=False`` runs every request as the
DSN's user, for local development.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from email.utils import format_datetime
from typing import Any
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from psycopg.types.json import Jsonb
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from queue_pg import errors
from queue_pg.azure import auth as azauth
from queue_pg.azure import cors
from queue_pg.endpoint_keys import EndpointKey
from queue_pg.errors import KeyRevoked, translate
from queue_pg.sealing import Keyring
from queue_pg.sqs.app import REQUEST_KEY, Endpoint, RequestTooLarge, _body
from queue_pg.types import Message

logger = logging.getLogger("queue_pg.azure")
#: The version answered when the request names none.
VERSION = "2019-02-02"
#: Azure's largest message: 64 KiB of message text.
MAX_MESSAGE_BYTES = 64 * 1024
#: The longest visibility timeout and delay: 7 days.
MAX_VISIBILITY = 7 * 24 * 3600
#: The time-to-live of a message sent without messagettl: Azure's 7 days.
DEFAULT_TTL = 7 * 24 * 3600
#: queue_pg's longest time-to-live (queue_pg._max_ttl: 100 years); a longer messagettl is cut to it.
MAX_TTL = 3_153_600_000
#: Azure's ExpirationTime of a message that never expires.
NEVER = "Fri, 31 Dec 9999 23:59:59 GMT"
#: Settings of a queue this endpoint creates: Azure's 30 s default lease, leases up to 7 days,
#: messages kept until their own ttl (each message carries one).
QUEUE_SETTINGS: dict[str, Any] = {"visibility_timeout": 30, "max_lease": MAX_VISIBILITY,
                                  "message_ttl": None}
#: The suffix of an account's secondary endpoint (``ACCOUNT-secondary``): read-only, as Azure's
#: read-access geo-redundant secondary; here it reads the primary itself.
SECONDARY = "-secondary"
#: What the secondary endpoint serves.
READ_ONLY = frozenset({"list_queues", "get_service_properties", "get_service_stats",
                       "get_metadata", "get_acl", "peek_messages"})
_QUEUE_NAME = re.compile(r"^(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")
_ACCOUNT_NAME = re.compile(r"[a-z0-9]{3,24}")
_META = "x-ms-meta-"


class AzureError(Exception):
    """An error answered as Azure words it: HTTP status, code, message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _bad_query(name: str, value: str, why: str, out_of_range: bool = False) -> AzureError:
    if out_of_range:
        return AzureError(400, "OutOfRangeQueryParameterValue",
                          "One of the query parameters specified in the request URI is outside"
                          f" the permissible range. {name}={value!r}: {why}.")
    return AzureError(400, "InvalidQueryParameterValue", "Value for one of the query parameters"
                      f" specified in the request URI is invalid. {name}={value!r}: {why}.")


#: Azure's words for a request body over its limit.
TOO_LARGE = "The request body is too large and exceeds the maximum permissible limit."


#: queue_pg's exceptions as Azure errors (the first match wins).
_TABLE: list[tuple[type[Exception], int, str, str | None]] = [
    (errors.QueueNotFound, 404, "QueueNotFound", "The specified queue does not exist."),
    (errors.QueueAlreadyExists, 409, "QueueAlreadyExists",
     "The specified queue already exists."),
    (errors.MessageNotFound, 404, "MessageNotFound", "The specified message does not exist."),
    (errors.StaleReceipt, 400, "PopReceiptMismatch",
     "The specified pop receipt did not match the pop receipt for a dequeued message."),
    (errors.InvalidReceipt, 400, "PopReceiptMismatch",
     "The specified pop receipt did not match the pop receipt for a dequeued message."),
    (errors.MessageTooLarge, 413, "RequestBodyTooLarge", TOO_LARGE),
    (errors.LeaseLimitExceeded, 400, "OutOfRangeQueryParameterValue", None),
    (errors.InvalidParameter, 400, "InvalidInput", None),
    (errors.AccessDenied, 403, "AuthorizationPermissionMismatch",
     "This request is not authorized to perform this operation using this permission."),
    (errors.OverLimit, 503, "ServerBusy", None),
    (RequestTooLarge, 413, "RequestBodyTooLarge", TOO_LARGE),
]


def _error(err: Exception, request_id: str) -> Response:
    if isinstance(err, AzureError):
        status, code, text = err.status, err.code, err.message
    elif isinstance(err, azauth.AuthError):
        status, code, text = 403, err.code, err.message
    else:
        found = next((row for row in _TABLE if isinstance(err, row[0])), None)
        if found is None:
            logger.exception("queue_pg.azure: internal error", exc_info=err)
            status, code, text = 500, "InternalError", "The server encountered an internal error."
        else:
            status, code = found[1], found[2]
            text = found[3] or getattr(err, "message", None) or str(err)
    now = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
    body = ('<?xml version="1.0" encoding="utf-8"?><Error><Code>' + code + "</Code><Message>"
            + escape(f"{text}\nRequestId:{request_id}\nTime:{now}") + "</Message></Error>")
    return Response(body, status_code=status, media_type="application/xml",
                    headers={"x-ms-error-code": code})


def _http_date(when: datetime | None) -> str:
    return NEVER if when is None else format_datetime(when.astimezone(timezone.utc), usegmt=True)


def _text_of(body: Any) -> str:
    """A message's text: its JSON string body, or the JSON text of a body sent otherwise."""
    return body if isinstance(body, str) else json.dumps(body)


def _int_param(params: dict[str, str], name: str, lo: int, hi: int, default: int | None
               ) -> int | None:
    value = params.get(name)
    if value is None or value == "":
        return default
    try:
        n = int(value)
    except ValueError:
        raise _bad_query(name, value, "not an integer") from None
    if not lo <= n <= hi:
        raise _bad_query(name, value, f"allowed {lo} to {hi}", out_of_range=True)
    return n


def _message_text(body: bytes) -> str:
    """The MessageText of a ``<QueueMessage>`` body; InvalidXmlDocument when malformed."""
    _refuse_doctype(body)
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as exc:
        raise AzureError(400, "InvalidXmlDocument",
                         f"XML specified is not syntactically valid: {exc}") from None
    node = root.find("MessageText")
    if root.tag != "QueueMessage" or node is None:
        raise AzureError(400, "InvalidXmlDocument", "The body must be <QueueMessage> with a"
                         " <MessageText>.")
    text = node.text or ""
    if len(text.encode("utf-8")) > MAX_MESSAGE_BYTES:
        raise AzureError(413, "RequestBodyTooLarge", f"{TOO_LARGE} The message text is over"
                         f" {MAX_MESSAGE_BYTES} bytes.")
    return text


def _iso(when: datetime) -> str:
    """Azure's time format in ACLs: ISO 8601, UTC, seven fractional digits."""
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f0Z")


def _policies(body: bytes) -> list[dict[str, str | None]]:
    """The stored access policies of a Set Queue ACL body (``<SignedIdentifiers>``), as
    queue_pg.azure_set_acl takes them; InvalidXmlDocument when malformed."""
    try:
        root = ElementTree.fromstring(body) if body.strip() else None
    except ElementTree.ParseError:
        root = None
        if body.strip():
            raise AzureError(400, "InvalidXmlDocument", "XML specified is not syntactically"
                             " valid.") from None
    if root is None:
        return []
    if root.tag != "SignedIdentifiers":
        raise AzureError(400, "InvalidXmlDocument", "XML specified is not syntactically valid."
                         " The root element must be SignedIdentifiers.")
    out: list[dict[str, str | None]] = []
    for si in root.findall("SignedIdentifier"):
        pol = si.find("AccessPolicy")
        out.append({"id": si.findtext("Id") or "",
                    "start": None if pol is None else pol.findtext("Start") or None,
                    "expiry": None if pol is None else pol.findtext("Expiry") or None,
                    "permission": None if pol is None else pol.findtext("Permission")})
    return out


#: The order of Azure's service properties elements (others follow in their stored order).
_PROPERTY_ORDER = ["Logging", "HourMetrics", "MinuteMetrics", "Cors", "Version", "Delete", "Read",
                   "Write", "Enabled", "IncludeAPIs", "RetentionPolicy", "Days", "AllowedOrigins",
                   "AllowedMethods", "MaxAgeInSeconds", "ExposedHeaders", "AllowedHeaders"]


def _refuse_doctype(body: bytes) -> None:
    if b"<!DOCTYPE" in body.upper() or b"<!ENTITY" in body.upper():
        raise AzureError(400, "InvalidXmlDocument", "XML specified is not syntactically valid:"
                         " document type declarations are refused.")


def _element_dict(node: ElementTree.Element) -> Any:
    children = list(node)
    if not children:
        return (node.text or "").strip()
    return {child.tag: _element_dict(child) for child in children}


def _properties_of(body: bytes) -> dict[str, Any]:
    """The elements of a Set Queue Service Properties body (``<StorageServiceProperties>``),
    as queue_pg.azure_set_service_properties takes them (CORS rules as a list)."""
    _refuse_doctype(body)
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as exc:
        raise AzureError(400, "InvalidXmlDocument",
                         f"XML specified is not syntactically valid: {exc}") from None
    if root.tag != "StorageServiceProperties":
        raise AzureError(400, "InvalidXmlDocument", "XML specified is not syntactically valid."
                         " The root element must be StorageServiceProperties.")
    out: dict[str, Any] = {}
    for child in root:
        if child.tag == "Cors":
            out["Cors"] = [_element_dict(rule) for rule in child if rule.tag == "CorsRule"]
        else:
            value = _element_dict(child)
            out[child.tag] = value if isinstance(value, dict) else {}
    return out


def _ordered(items: dict[str, Any]) -> list[tuple[str, Any]]:
    rank = {name: i for i, name in enumerate(_PROPERTY_ORDER)}
    return sorted(items.items(), key=lambda kv: rank.get(kv[0], len(rank)))


def _element_xml(name: str, value: Any) -> str:
    if isinstance(value, dict):
        inner = "".join(_element_xml(k, v) for k, v in _ordered(value))
    elif isinstance(value, list):  # the CORS rules
        inner = "".join(_element_xml("CorsRule", rule) for rule in value)
    else:
        inner = escape(str(value))
    return f"<{name}>{inner}</{name}>"


def _properties_xml(properties: dict[str, Any]) -> str:
    return _element_xml("StorageServiceProperties", properties)


def _xml(body: str) -> Response:
    return Response('<?xml version="1.0" encoding="utf-8"?>' + body,
                    media_type="application/xml")


def _messages_xml(messages: list[Message], *, peek: bool) -> str:
    parts = ["<QueueMessagesList>"]
    for m in messages:
        parts.append(f"<QueueMessage><MessageId>{m.id}</MessageId>"
                     f"<InsertionTime>{_http_date(m.enqueued_at)}</InsertionTime>"
                     f"<ExpirationTime>{_http_date(m.expires_at)}</ExpirationTime>")
        if not peek:
            parts.append(f"<PopReceipt>{escape(m.receipt or '')}</PopReceipt>"
                         f"<TimeNextVisible>{_http_date(m.visible_until)}</TimeNextVisible>")
        parts.append(f"<DequeueCount>{m.receive_count}</DequeueCount>"
                     f"<MessageText>{escape(_text_of(m.body))}</MessageText></QueueMessage>")
    parts.append("</QueueMessagesList>")
    return "".join(parts)


def _metadata(request: Request) -> dict[str, str]:
    return {k[len(_META):]: v for k, v in request.headers.items()
            if k.lower().startswith(_META)}


def _meta_headers(meta: dict[str, Any]) -> dict[str, str]:
    return {_META + k: str(v) for k, v in meta.items()}


def _operation(method: str, parts: list[str], params: dict[str, str]) -> str:
    """The operation a request names: method, path depth and ``comp``."""
    comp = params.get("comp", "")
    depth = len(parts)
    table: dict[tuple[str, int, str], str] = {
        ("GET", 1, "list"): "list_queues",
        ("GET", 1, "properties"): "get_service_properties",
        ("PUT", 1, "properties"): "set_service_properties",
        ("GET", 1, "stats"): "get_service_stats",
        ("PUT", 2, ""): "create_queue",
        ("DELETE", 2, ""): "delete_queue",
        ("GET", 2, "metadata"): "get_metadata",
        ("HEAD", 2, "metadata"): "get_metadata",
        ("PUT", 2, "metadata"): "set_metadata",
        ("GET", 2, "acl"): "get_acl",
        ("HEAD", 2, "acl"): "get_acl",
        ("PUT", 2, "acl"): "set_acl",
        ("POST", 3, ""): "put_message",
        ("GET", 3, ""): "get_messages",
        ("DELETE", 3, ""): "clear_messages",
        ("DELETE", 4, ""): "delete_message",
        ("PUT", 4, ""): "update_message",
    }
    if depth >= 3 and parts[2] != "messages":
        depth = 0
    op = table.get((method, depth, comp))
    if op == "get_messages" and params.get("peekonly", "").lower() == "true":
        op = "peek_messages"
    if op is None:
        raise AzureError(400, "UnsupportedHttpVerb" if depth else "InvalidUri",
                         f"The resource doesn't support {method} with comp={comp!r} here.")
    return op


class AzureEndpoint(Endpoint):
    """The SQS endpoint's state (owner's key look-ups, one :class:`RolePool` and client for
    every role) with Azure's keys and signatures."""

    def __init__(self, dsn: str, *, auth: bool = True, pool_size: int = 10,
                 account: str | None = None, keyring: Keyring | None = None,
                 cors_ttl: float = cors.DEFAULT_TTL) -> None:
        super().__init__(dsn, auth=auth, pool_size=pool_size, keyring=keyring)
        self.account = account
        #: every account's CORS rules, for preflights and actual requests (queue_pg/azure/cors.py)
        self.cors = cors.RuleCache(self._cors_rules, cors_ttl)

    async def _cors_rules(self) -> dict[str, Any]:
        """Every account's stored CORS rules (queue_pg.azure_cors_rules), as the DSN's user."""
        await self.open()
        assert self._pool is not None
        token = REQUEST_KEY.set(None)
        try:
            async with self._pool.connection() as conn:
                with translate():
                    cur = await conn.execute(
                        "SELECT account, rules FROM queue_pg.azure_cors_rules()")
                    return {str(a): r for a, r in await cur.fetchall()}
        finally:
            REQUEST_KEY.reset(token)

    def cors_account(self, request: Request) -> str | None:
        """The account whose CORS rules apply to a request: its URL's, whatever the rest of the
        path (None: no account this endpoint serves)."""
        first = request.url.path.lstrip("/").split("/", 1)[0]
        account = first.removesuffix(SECONDARY)
        if not _ACCOUNT_NAME.fullmatch(account) or self.account not in (None, account):
            return None
        return account

    async def preflight(self, request: Request) -> Response:
        """A CORS preflight (OPTIONS), answered from the account's rules alone: not signed, and
        the same whether the queue it names exists or not (Azure's Preflight Queue Request)."""
        origin = request.headers.get("origin")
        method = request.headers.get("access-control-request-method")
        if origin is None or method is None:
            raise AzureError(400, "MissingRequiredHeader", "A required CORS header is not present."
                             f" {'Origin' if origin is None else 'Access-Control-Request-Method'}"
                             " is missing.")
        account = self.cors_account(request)
        rules = await self.cors.rules(account) if account else ()
        headers = cors.preflight(rules, origin, method,
                                 request.headers.get("access-control-request-headers"))
        if headers is None:
            raise AzureError(403, "CorsPreflightFailure", "CORS not enabled or no matching rule"
                             " found for this request.")
        return Response(status_code=200, headers=headers)

    async def add_cors(self, request: Request, response: Response) -> None:
        """The Access-Control headers of an actual request with an Origin (cors.actual)."""
        origin = request.headers.get("origin")
        account = None if origin is None else self.cors_account(request)
        if origin is None or account is None:
            return
        try:
            rules = await self.cors.rules(account)
        except Exception:  # the rules cannot be read: no CORS headers (the browser refuses)
            logger.warning("queue_pg.azure: no CORS headers: the rules could not be read",
                           exc_info=True)
            return
        response.headers.update(cors.actual(rules, origin, request.method,
                                            list(response.headers.keys())))

    kind = "azure"

    async def key_of(self, request: Request, body: bytes) -> EndpointKey | None:
        raise NotImplementedError  # Azure's check needs the operation: see authorize

    async def authorize(self, request: Request, account: str, queue: str | None,
                        operation: str) -> EndpointKey | None:
        """The key the request runs as (its role); AuthError when it is not signed by the
        account's live key, or its SAS token does not allow the operation."""
        if not self.auth:
            return None
        headers = {k.lower(): v for k, v in request.headers.items()}
        query = list(request.query_params.multi_items())
        raw_path = (request.scope.get("raw_path") or request.url.path.encode()).decode("latin-1")
        client = request.client.host if request.client else ""
        req = azauth.Request(request.method, raw_path, query, headers, client, request.url.scheme)
        shared = azauth.scheme_of(headers.get("authorization"))
        sas = None if shared is not None else azauth.parse_sas(query)
        if shared is None and sas is None:
            raise azauth.AuthError("The request is not signed: no Authorization header and no"
                                 " SAS token.", "NoAuthenticationInformation")
        if shared is not None and shared[1] != account:
            raise azauth.AuthError("The signing account is not the account of the URL.")
        await self.open()
        if sas is not None and "si" in sas.params and queue is not None:
            # a stored access policy's fields
            sas = azauth.with_policy(sas, await self._policy(queue, sas.params["si"]))
        now = datetime.now(timezone.utc)

        def check(key: EndpointKey) -> None:
            if shared is not None:
                azauth.check_shared_key(req, shared[0], account, shared[2], key.secret, now)
            else:
                assert sas is not None
                azauth.check_sas(req, sas, account, queue, key.secret, now)

        key = await self.verified(account, check, no_live_key)
        if sas is not None:
            azauth.check_sas_allows(sas, operation)
        return key

    async def _policy(self, queue: str, policy_id: str) -> tuple[Any, ...] | None:
        """The stored access policy a SAS names: (start, expiry, permission), or None."""
        assert self._lookups is not None
        async with self._lookups.connection() as conn:
            with translate():
                row = await (await conn.execute(
                    "SELECT start, expiry, permission FROM queue_pg.azure_access_policy(%s, %s)",
                    [queue, policy_id])).fetchone()
        return None if row is None else tuple(row)


def no_live_key() -> azauth.AuthError:
    """The answer to a request signed by no live key (unknown, revoked, its role dropped)."""
    return azauth.AuthError("Server failed to authenticate the request: the account has no"
                            " live key.")


class Call:
    """One request's operation, run as its role on the endpoint's client."""

    def __init__(self, endpoint: AzureEndpoint, request: Request, body: bytes,
                 queue: str | None, message_id: str | None, params: dict[str, str],
                 account: str = "", secondary: bool = False) -> None:
        self.client = endpoint.client
        self.cors = endpoint.cors
        self.account, self.secondary = account, secondary
        self.request, self.body, self.params = request, body, params
        self.queue = queue or ""
        self.message_id = message_id

    async def _sql(self, query: str, params: list[Any]) -> list[tuple[Any, ...]]:
        """Rows of one statement of sql/api/59_azure.sql, run as the request's role."""
        async with self.client._borrow() as conn:
            with translate():
                cur = await conn.execute(query, params)
                return await cur.fetchall() if cur.description else []

    async def get_service_properties(self) -> Response:
        """Azure's defaults, with what Set Queue Service Properties stored for the account."""
        rows = await self._sql("SELECT queue_pg.azure_service_properties(%s)", [self.account])
        return _xml(_properties_xml(rows[0][0]))

    async def set_service_properties(self) -> Response:
        await self._sql("SELECT queue_pg.azure_set_service_properties(%s, %s)",
                        [self.account, Jsonb(_properties_of(self.body))])
        self.cors.invalidate()  # committed: the next request reads the new rules
        return Response(status_code=202)

    async def get_service_stats(self) -> Response:
        """Replication of a single-region service: the secondary is the primary itself, so it
        is live and in sync as of now. Served on the secondary endpoint only, as Azure."""
        if not self.secondary:
            raise _bad_query("comp", "stats", "Get Queue Service Stats is served on the"
                             " secondary endpoint (ACCOUNT-secondary) only")
        return _xml("<StorageServiceStats><GeoReplication><Status>live</Status><LastSyncTime>"
                    f"{_http_date(datetime.now(timezone.utc))}</LastSyncTime></GeoReplication>"
                    "</StorageServiceStats>")

    async def list_queues(self) -> Response:
        n = _int_param(self.params, "maxresults", 1, 5000, 5000)
        assert n is not None
        prefix, marker = self.params.get("prefix", ""), self.params.get("marker") or None
        with_meta = "metadata" in self.params.get("include", "").split(",")
        rows = await self._sql("SELECT name, metadata FROM queue_pg.azure_list_queues(%s, %s, %s)",
                               [prefix, marker, n])
        base = f"{self.request.url.scheme}://{self.request.headers.get('host', '')}"
        account = self.request.url.path.strip("/").split("/")[0]
        parts = [f'<EnumerationResults ServiceEndpoint="{escape(base)}/{escape(account)}/">'
                 f"<Prefix>{escape(prefix)}</Prefix>"]
        if marker:
            parts.append(f"<Marker>{escape(marker)}</Marker>")
        parts.append(f"<MaxResults>{n}</MaxResults><Queues>")
        for name, meta in rows[:n]:
            parts.append(f"<Queue><Name>{escape(name)}</Name>")
            if with_meta:
                parts.append("<Metadata>" + "".join(
                    f"<{k}>{escape(str(v))}</{k}>" for k, v in meta.items()) + "</Metadata>")
            parts.append("</Queue>")
        parts.append("</Queues>")
        parts.append(f"<NextMarker>{escape(rows[n][0])}</NextMarker>" if len(rows) > n
                     else "<NextMarker />")
        parts.append("</EnumerationResults>")
        return _xml("".join(parts))

    async def _get_metadata(self) -> dict[str, Any]:
        rows = await self._sql("SELECT queue_pg.azure_metadata(%s)", [self.queue])
        return dict(rows[0][0]) if rows else {}

    async def _set_metadata(self, meta: dict[str, str]) -> None:
        await self._sql("SELECT queue_pg.azure_set_metadata(%s, %s::jsonb)",
                        [self.queue, json.dumps(meta)])

    async def create_queue(self) -> Response:
        meta = _metadata(self.request)
        try:
            await self.client.get_queue(self.queue)
        except errors.QueueNotFound:
            await self.client.create_queue(self.queue, **QUEUE_SETTINGS)
            if meta:
                await self._set_metadata(meta)
            return Response(status_code=201)
        have = await self._get_metadata()
        if {k.lower(): v for k, v in have.items()} != {k.lower(): v for k, v in meta.items()}:
            raise AzureError(409, "QueueAlreadyExists", "The specified queue already exists"
                             " with different metadata.")
        return Response(status_code=204)

    async def delete_queue(self) -> Response:
        await self.client.drop_queue(self.queue)
        return Response(status_code=204)

    async def get_metadata(self) -> Response:
        meta = await self._get_metadata()
        stats = await self.client.stats(self.queue)
        count = stats.visible + stats.in_flight + stats.delayed
        headers = _meta_headers(meta) | {"x-ms-approximate-messages-count": str(count)}
        return Response(status_code=200, headers=headers)

    async def set_metadata(self) -> Response:
        await self._set_metadata(_metadata(self.request))
        return Response(status_code=204)

    async def get_acl(self) -> Response:
        rows = await self._sql("SELECT * FROM queue_pg.azure_acl(%s)", [self.queue])
        parts = []
        for pid, start, expiry, perm in rows:
            parts.append(f"<SignedIdentifier><Id>{escape(pid)}</Id><AccessPolicy>"
                         + (f"<Start>{_iso(start)}</Start>" if start else "")
                         + (f"<Expiry>{_iso(expiry)}</Expiry>" if expiry else "")
                         + (f"<Permission>{perm}</Permission>" if perm is not None else "")
                         + "</AccessPolicy></SignedIdentifier>")
        return _xml(f"<SignedIdentifiers>{''.join(parts)}</SignedIdentifiers>")

    async def set_acl(self) -> Response:
        await self._sql("SELECT queue_pg.azure_set_acl(%s, %s)",
                        [self.queue, Jsonb(_policies(self.body))])
        return Response(status_code=204)

    async def put_message(self) -> Response:
        text = _message_text(self.body)
        delay = _int_param(self.params, "visibilitytimeout", 0, MAX_VISIBILITY, 0)
        ttl_param = self.params.get("messagettl")
        ttl: int | None = DEFAULT_TTL
        if ttl_param == "-1":
            ttl = None
        elif ttl_param:
            # Azure takes any positive number; past queue_pg's longest ttl (100 years) the
            # message outlives any reader as surely as one of -1, but keeps a true expiry
            ttl = min(_int_param(self.params, "messagettl", 1, 2**63 - 1, DEFAULT_TTL)
                      or DEFAULT_TTL, MAX_TTL)
        if ttl is not None and delay is not None and delay >= ttl:
            raise _bad_query("visibilitytimeout", str(delay), "must be less than messagettl")
        rows = await self._sql("SELECT * FROM queue_pg.azure_put(%s, %s, %s, %s)",
                               [self.queue, Jsonb(text), delay, ttl])
        message_id, receipt, enqueued, visible, expires = rows[0]
        # -1 (never expires) keeps the queue's message_ttl: that is the message's true end
        return Response('<?xml version="1.0" encoding="utf-8"?>'
                        "<QueueMessagesList><QueueMessage>"
                        f"<MessageId>{message_id}</MessageId>"
                        f"<InsertionTime>{_http_date(enqueued)}</InsertionTime>"
                        f"<ExpirationTime>{_http_date(expires)}</ExpirationTime>"
                        f"<PopReceipt>{escape(receipt or '')}</PopReceipt>"
                        f"<TimeNextVisible>{_http_date(visible)}</TimeNextVisible>"
                        "</QueueMessage></QueueMessagesList>", status_code=201,
                        media_type="application/xml")

    async def get_messages(self) -> Response:
        n = _int_param(self.params, "numofmessages", 1, 32, 1)
        vt = _int_param(self.params, "visibilitytimeout", 1, MAX_VISIBILITY, 30)
        assert n is not None
        got = await self.client.receive(self.queue, n, visibility_timeout=vt, wait=0)
        return _xml(_messages_xml(got, peek=False))

    async def peek_messages(self) -> Response:
        n = _int_param(self.params, "numofmessages", 1, 32, 1)
        assert n is not None
        return _xml(_messages_xml(await self.client.peek(self.queue, n), peek=True))

    async def clear_messages(self) -> Response:
        await self.client.purge(self.queue)
        return Response(status_code=204)

    def _receipt(self) -> str:
        receipt = self.params.get("popreceipt")
        if not receipt:
            raise AzureError(400, "MissingRequiredQueryParameter",
                             "A query parameter that's mandatory for this request is not"
                             " specified: popreceipt.")
        parts = receipt.split(".")
        if len(parts) not in (4, 5) or parts[1] != self.message_id:  # 5: a relaxed queue's
            raise AzureError(400, "PopReceiptMismatch", "The specified pop receipt did not"
                             " match the pop receipt for a dequeued message.")
        return receipt

    async def delete_message(self) -> Response:
        if not await self.client.delete(self.queue, self._receipt()):
            raise AzureError(404, "MessageNotFound", "The specified message does not exist.")
        return Response(status_code=204)

    async def update_message(self) -> Response:
        receipt = self._receipt()
        vt = _int_param(self.params, "visibilitytimeout", 0, MAX_VISIBILITY, None)
        if vt is None:
            raise AzureError(400, "MissingRequiredQueryParameter",
                             "A query parameter that's mandatory for this request is not"
                             " specified: visibilitytimeout.")
        text = _message_text(self.body) if self.body.strip() else None
        rows = await self._sql(
            "SELECT receipt, visible_until FROM queue_pg.azure_update(%s, %s, %s, %s)",
            [self.queue, receipt, None if text is None else Jsonb(text), vt])
        new_receipt, visible = rows[0]
        return Response(status_code=204, headers={
            "x-ms-popreceipt": new_receipt, "x-ms-time-next-visible": _http_date(visible)})


def _split(request: Request, account: str | None) -> tuple[str, list[str], bool]:
    """(account, path parts, whether the URL is the account's secondary endpoint)."""
    parts = [p for p in request.url.path.split("/") if p]
    if not parts:
        raise AzureError(400, "InvalidUri", "The URL names no account: use"
                         " http://HOST:PORT/ACCOUNT/QUEUE.")
    secondary = parts[0].endswith(SECONDARY)
    if secondary:
        parts[0] = parts[0][:-len(SECONDARY)]
    if account is not None and parts[0] != account:
        raise AzureError(400, "InvalidUri", f"This endpoint serves account {account} only.")
    if len(parts) >= 2 and not 3 <= len(parts[1]) <= 63:
        raise AzureError(400, "OutOfRangeInput", "The specified resource name length is not"
                         " within the permissible limits. Queue names are 3 to 63 characters.")
    if len(parts) >= 2 and not _QUEUE_NAME.match(parts[1]):
        raise AzureError(400, "InvalidResourceName", "The specified resource name contains"
                         " invalid characters. Queue names are lower-case letters, digits and"
                         " single dashes, starting and ending with a letter or digit.")
    if len(parts) == 4 and not (parts[3].isdigit() and parts[3][0] != "0"):
        raise AzureError(404, "MessageNotFound", "The specified message does not exist.")
    return parts[0], parts, secondary


def create_app(dsn: str, *, auth: bool = True, pool_size: int = 10,
               account: str | None = None, keyring: Keyring | None = None,
               cors_ttl: float = cors.DEFAULT_TTL) -> Starlette:
    """The endpoint as an ASGI app, to run with uvicorn or mount in another app.

    ``account``: the one account name served (None: any account with a live key; without
    auth, any name). ``keyring`` opens the stored account keys (default:
    ``QUEUE_PG_SECRET_KEY``); with ``auth``, :class:`~queue_pg.sealing.SecretKeyMissing` when
    there is none. ``cors_ttl``: seconds a change of CORS rules made elsewhere (another
    process, SQL) may take to apply here; one made through this app applies at once."""
    endpoint = AzureEndpoint(dsn, auth=auth, pool_size=pool_size, account=account,
                             keyring=keyring, cors_ttl=cors_ttl)

    def stamped(request: Request, response: Response, request_id: str) -> Response:
        response.headers["x-ms-request-id"] = request_id
        response.headers["x-ms-version"] = request.headers.get("x-ms-version", VERSION)
        if "x-ms-client-request-id" in request.headers:
            response.headers["x-ms-client-request-id"] = request.headers["x-ms-client-request-id"]
        return response

    async def handle(request: Request) -> Response:
        request_id = str(uuid.uuid4())
        try:
            body = await _body(request)
            acct, parts, secondary = _split(request, endpoint.account)
            params = {k.lower(): v for k, v in request.query_params.items()
                      if k not in azauth.SAS_PARAMS}
            operation = _operation(request.method, parts, params)
            if secondary and operation not in READ_ONLY:
                raise AzureError(403, "InsufficientAccountPermissions", "The secondary endpoint"
                                 " is read-only: write operations go to the primary.")
            await endpoint.open()
            queue = parts[1] if len(parts) >= 2 else None
            key = await endpoint.authorize(request, acct, queue, operation)
            call = Call(endpoint, request, body, queue, parts[3] if len(parts) == 4 else None,
                        params, acct, secondary)
            run: Callable[[], Any] = getattr(call, operation)
            token = REQUEST_KEY.set(key)  # every connection the call borrows takes its role
            try:
                response: Response = await run()
            except KeyRevoked:  # since it was kept: the transaction that found it did nothing
                if endpoint.keys is not None and key is not None:
                    endpoint.keys.forget(key)
                raise no_live_key() from None
            finally:
                REQUEST_KEY.reset(token)
        except Exception as err:  # every failure answers as Azure does
            response = _error(err, request_id)
        stamped(request, response, request_id)
        await endpoint.add_cors(request, response)  # errors too: a page reads only what CORS allows
        return response

    async def preflight(request: Request) -> Response:
        """OPTIONS: a CORS preflight, never signed (AzureEndpoint.preflight)."""
        request_id = str(uuid.uuid4())
        try:
            response = await endpoint.preflight(request)
        except Exception as err:
            response = _error(err, request_id)
        return stamped(request, response, request_id)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        await endpoint.close()

    routes = [Route("/{path:path}", handle, methods=["GET", "HEAD", "PUT", "POST", "DELETE"]),
              Route("/{path:path}", preflight, methods=["OPTIONS"])]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.endpoint = endpoint
    return app


__all__ = ["AzureEndpoint", "create_app"]
