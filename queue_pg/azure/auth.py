"""Azure Storage request signatures: Shared Key, Shared Key Lite and SAS tokens (account and
queue), checked against an account key. Pure functions of the request, so they load without
Starlette; the key and the role it runs as come from ``queue_pg.azure_key`` (the endpoint)."""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import Any

#: How far a Shared Key request's date may be from the server's clock (Azure's 15 minutes).
MAX_SKEW = timedelta(minutes=15)

#: The standard headers of a Shared Key string to sign, in their order.
_STANDARD = ("content-encoding", "content-language", "content-length", "content-md5",
             "content-type", "date", "if-modified-since", "if-match", "if-none-match",
             "if-unmodified-since", "range")

#: Query parameters of a SAS token (not part of the operation's parameters).
SAS_PARAMS = frozenset({"sv", "ss", "srt", "sp", "st", "se", "sip", "spr", "sig", "si", "ses"})


class AuthError(Exception):
    """A request that is not signed by a live key, or whose signature does not allow it."""

    def __init__(self, message: str, code: str = "AuthenticationFailed") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Request:
    """What a signature covers: method, raw path (``/account/queue/...``), query pairs as sent
    (decoded), headers (lower-case names), the client's address and the scheme."""

    method: str
    raw_path: str
    query: Sequence[tuple[str, str]]
    headers: Mapping[str, str]
    client_ip: str
    scheme: str


def _sign(key: str, text: str) -> bytes:
    try:
        raw = base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AuthError("The account key is not valid base64.") from exc
    return hmac.digest(raw, text.encode("utf-8"), "sha256")


def _same(key: str, text: str, signature: str) -> bool:
    try:
        given = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(_sign(key, text), given)


def scheme_of(authorization: str | None) -> tuple[str, str, str] | None:
    """(scheme, account, signature) of a ``SharedKey`` / ``SharedKeyLite`` header, else None."""
    if not authorization:
        return None
    scheme, _, rest = authorization.strip().partition(" ")
    account, sep, signature = rest.strip().rpartition(":")
    if scheme not in ("SharedKey", "SharedKeyLite") or not sep or not account:
        raise AuthError("The Authorization header is not a SharedKey or SharedKeyLite header.")
    return scheme, account, signature


def _header_orders(headers: Mapping[str, str]) -> list[str]:
    """The canonical x-ms-* header block, in the orders SDKs sort by: byte order, and the
    culture-aware order some SDKs use (dashes weigh nothing at first), when that differs."""
    items = [(k, v) for k, v in headers.items() if k.startswith("x-ms-")]
    blocks = []
    for key in (lambda kv: kv[0], lambda kv: (kv[0].replace("-", ""), kv[0])):
        block = "".join(f"{k}:{v}\n" for k, v in sorted(items, key=key))
        if block not in blocks:
            blocks.append(block)
    return blocks


def _canonical_query(query: Sequence[tuple[str, str]]) -> str:
    by_name: dict[str, list[str]] = {}
    for name, value in query:
        by_name.setdefault(name.lower(), []).append(value)
    return "".join(f"\n{name}:{','.join(sorted(values))}"
                   for name, values in sorted(by_name.items()))


def check_shared_key(req: Request, scheme: str, account: str, signature: str, key: str,
                     now: datetime) -> None:
    """AuthError unless ``signature`` is the request's Shared Key (or Lite) signature with
    ``key`` and its date is within MAX_SKEW of ``now``."""
    h = req.headers
    stamp = h.get("x-ms-date") or h.get("date")
    try:
        when = parsedate_to_datetime(stamp) if stamp else None
    except (TypeError, ValueError):
        when = None
    if when is None or when.tzinfo is None:
        raise AuthError("The request has no valid x-ms-date or Date header.")
    if abs(now - when) > MAX_SKEW:
        raise AuthError("Request date header too old or too far in the future: "
                        f"{stamp} is more than 15 minutes from the server's clock.")
    resource = f"/{account}{req.raw_path}"
    if scheme == "SharedKeyLite":
        comp = [v for k, v in req.query if k.lower() == "comp"]
        lite_resource = resource + (f"?comp={comp[0]}" if comp else "")
        texts = [f"{req.method}\n{h.get('content-md5', '')}\n{h.get('content-type', '')}\n"
                 f"{'' if 'x-ms-date' in h else h.get('date', '')}\n{block}{lite_resource}"
                 for block in _header_orders(h)]
    else:
        standard = [h.get(name, "") for name in _STANDARD]
        if standard[2] == "0":
            standard[2] = ""  # a zero Content-Length is signed as empty (2015-02-21 on)
        head = req.method + "\n" + "".join(v + "\n" for v in standard)
        texts = [head + block + resource + _canonical_query(req.query)
                 for block in _header_orders(h)]
    if not any(_same(key, text, signature) for text in texts):
        raise AuthError("Server failed to authenticate the request. Make sure the value of the"
                        " Authorization header is formed correctly including the signature.")


@dataclass(frozen=True)
class Sas:
    """A SAS token's fields (query parameters, decoded)."""

    params: Mapping[str, str]
    #: the stored access policy its ``si`` names (st, se, sp as set), once looked up
    policy: Mapping[str, str] | None = None

    @property
    def is_account(self) -> bool:
        return "ss" in self.params or "srt" in self.params

    @property
    def effective(self) -> Mapping[str, str]:
        """The token's fields with its stored access policy's (the policy's own fields)."""
        return {**self.params, **(self.policy or {})}

    @property
    def permissions(self) -> str:
        return self.effective.get("sp", "")


def with_policy(sas: Sas, row: Sequence[Any] | None) -> Sas:
    """``sas`` with the stored access policy ``row`` (start, expiry, permission) it names;
    AuthError when there is none (never made, or removed: its tokens are revoked)."""
    if row is None:
        raise AuthError("The stored access policy named by si does not exist on this queue.")
    start, expiry, perm = row
    policy = {k: v for k, v in (("st", start and _z(start)), ("se", expiry and _z(expiry)),
                                ("sp", perm)) if v}
    both = sorted(k for k in policy if k in sas.params)
    if both:
        raise AuthError(f"The SAS token and its stored access policy both set {', '.join(both)}:"
                        " set each in one place only.")
    return Sas(sas.params, policy)


def _z(when: datetime) -> str:
    return when.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def parse_sas(query: Sequence[tuple[str, str]]) -> Sas | None:
    """The SAS token in a query string, or None when it has no ``sig``."""
    params = {k: v for k, v in query if k in SAS_PARAMS}
    return Sas(params) if "sig" in params else None


def _time(value: str, name: str) -> datetime:
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise AuthError(f"Signed {name} {value!r} is not an ISO 8601 UTC time.") from exc
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _ip_allowed(sip: str, client: str) -> bool:
    try:
        ip = ipaddress.ip_address(client)
        lo_text, _, hi_text = sip.partition("-")
        lo, hi = ipaddress.ip_address(lo_text), ipaddress.ip_address(hi_text or lo_text)
        if not lo.version == hi.version == ip.version:
            return False
        return int(lo) <= int(ip) <= int(hi)
    except ValueError:
        return False


def check_sas(req: Request, sas: Sas, account: str, queue: str | None, key: str,
              now: datetime) -> None:
    """AuthError unless the token is signed with ``key`` for this account (and, a queue SAS,
    for ``queue``), and its start, expiry, IP range and protocol admit the request."""
    if "si" in sas.params and (sas.is_account or sas.policy is None):
        raise AuthError("An account SAS names no stored access policy (si); a queue SAS's"
                        " policy is of its queue.")
    p = sas.effective
    if "se" not in p or "sp" not in p or "sv" not in p:
        raise AuthError("The SAS token must have sv, sp and se.")
    if "st" in p and now < _time(p["st"], "start"):
        raise AuthError("Signed start time is in the future: the SAS token is not valid yet.")
    if now >= _time(p["se"], "expiry"):
        raise AuthError("Signed expiry time has passed: the SAS token has expired.")
    if "sip" in p and not _ip_allowed(p["sip"], req.client_ip):
        raise AuthError("This request is not authorized to be made from this IP address.",
                        "AuthorizationSourceIPMismatch")
    if p.get("spr", "https,http") == "https" and req.scheme != "https":
        raise AuthError("This request is not authorized to be made over this protocol.",
                        "AuthorizationProtocolMismatch")
    # the signature covers the token's own fields (a policy's are the policy's)
    v = {k: sas.params.get(k, "")
         for k in ("sp", "ss", "srt", "st", "se", "si", "sip", "spr", "sv")}
    if sas.is_account:
        base = (f"{account}\n{v['sp']}\n{v['ss']}\n{v['srt']}\n{v['st']}\n{v['se']}\n"
                f"{v['sip']}\n{v['spr']}\n{v['sv']}\n")
        texts = [base + "\n", base]  # the encryption scope line is in the text from 2020-12-06
    else:
        if queue is None:
            raise AuthError("A queue SAS is valid for its queue's requests only.",
                            "AuthorizationResourceTypeMismatch")
        texts = [f"{v['sp']}\n{v['st']}\n{v['se']}\n/queue/{account}/{queue}\n{v['si']}\n"
                 f"{v['sip']}\n{v['spr']}\n{v['sv']}"]
    if not any(_same(key, text, p["sig"]) for text in texts):
        raise AuthError("Server failed to authenticate the request. Make sure the value of the"
                        " signature (sig) is formed correctly.")


#: For each operation: (account SAS resource type, account SAS permissions of which one is
#: needed ("": no account SAS may), queue SAS permission (None: no queue SAS may)).
NEEDS: dict[str, tuple[str, str, str | None]] = {
    "get_service_properties": ("s", "r", None),
    "set_service_properties": ("s", "w", None),
    "get_service_stats": ("s", "r", None),
    "list_queues": ("s", "l", None),
    "create_queue": ("c", "cw", None),
    "delete_queue": ("c", "d", None),
    "get_metadata": ("c", "r", "r"),
    "set_metadata": ("c", "w", None),
    "get_acl": ("c", "", None),  # Shared Key only, as Azure
    "set_acl": ("c", "", None),
    "put_message": ("o", "a", "a"),
    "get_messages": ("o", "p", "p"),
    "peek_messages": ("o", "r", "r"),
    "delete_message": ("o", "p", "p"),
    "update_message": ("o", "u", "u"),
    "clear_messages": ("o", "d", "p"),
}


def check_sas_allows(sas: Sas, operation: str) -> None:
    """AuthError (AuthorizationPermissionMismatch and kin) unless the token allows the
    operation: its services, resource types and permissions. The key's role's grants are
    checked after, by the database."""
    resource, account_perm, queue_perm = NEEDS[operation]
    if sas.is_account:
        if "q" not in sas.params.get("ss", ""):
            raise AuthError("This request is not authorized to perform this operation using"
                            " this service: the SAS has no q in ss.",
                            "AuthorizationServiceMismatch")
        if resource not in sas.params.get("srt", ""):
            raise AuthError("This request is not authorized to perform this operation using"
                            " this resource type.", "AuthorizationResourceTypeMismatch")
        need = account_perm
    else:
        if queue_perm is None:
            raise AuthError("This request is not authorized to perform this operation with a"
                            " queue SAS.", "AuthorizationResourceTypeMismatch")
        need = queue_perm
    if not any(p in sas.permissions for p in need):
        raise AuthError("This request is not authorized to perform this operation using this"
                        f" permission: it needs {need}.", "AuthorizationPermissionMismatch")
