"""AWS Signature Version 4, checked on the server side (stdlib hmac / hashlib only).

The client signs a canonical form of the request with a key derived from its secret, the day,
the region and the service; the server rebuilds that form from what arrived and compares in
constant time. Two forms, as AWS: the ``Authorization`` header (what the SDKs send; the request
time must be within 15 minutes of ours, a replay window, not a fence), and the query string of a
presigned URL (``X-Amz-Algorithm``, ``X-Amz-Credential``, ``X-Amz-Date``, ``X-Amz-Expires``,
``X-Amz-SignedHeaders``, ``X-Amz-Signature``), good from its time for ``X-Amz-Expires`` seconds
(at most 7 days). A presigned request must have no body: its signature covers the query only.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from urllib.parse import quote

ALGORITHM = "AWS4-HMAC-SHA256"
#: The region signatures are scoped to unless the endpoint is given another.
DEFAULT_REGION = "us-east-1"
MAX_SKEW = timedelta(minutes=15)
#: The longest X-Amz-Expires AWS accepts (7 days).
MAX_EXPIRES = 7 * 24 * 3600
#: The query parameters of a presigned URL (X-Amz-Security-Token: temporary credentials, which
#: this endpoint's keys are not, but a client may send one).
PRESIGN_PARAMS = frozenset({"X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires",
                            "X-Amz-SignedHeaders", "X-Amz-Signature", "X-Amz-Security-Token"})
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
_CREDENTIAL = re.compile(r"^([^/\s]+)/(\d{8})/([^/\s]+)/([^/\s]+)/aws4_request$")

_STAMP = re.compile(r"[0-9]{8}T[0-9]{6}Z", re.ASCII)
_AUTH = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=([^/,\s]+)/(\d{8})/([^/,\s]+)/([^/,\s]+)/aws4_request\s*,"
    r"\s*SignedHeaders=([a-z0-9;_.-]+)\s*,\s*Signature=([0-9a-f]{64})\s*$"
)


class SignatureError(Exception):
    """Why a request's signature is refused; ``code`` is SQS's error code for it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Credential:
    """What the Authorization header claims: whose key, and the signature to check."""

    access_key: str
    day: str
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str


def parse(authorization: str | None) -> Credential:
    """The Authorization header's parts; MissingAuthenticationToken / IncompleteSignature."""
    if not authorization:
        raise SignatureError("MissingAuthenticationToken",
                             "Request must contain a signature (AWS SigV4 Authorization header)")
    m = _AUTH.match(authorization.strip())
    if m is None:
        raise SignatureError("IncompleteSignature",
                             f"Authorization header is not {ALGORITHM} Credential=...,"
                             " SignedHeaders=..., Signature=...")
    key, day, region, service, signed, signature = m.groups()
    names = tuple(signed.split(";"))
    if "host" not in names:
        raise SignatureError("IncompleteSignature", "SignedHeaders must include host")
    return Credential(key, day, region, service, names, signature)


#: The service a signature must be scoped to.
SERVICE = "sqs"


def check_scope(cred: Credential, region: str, headers: Mapping[str, str], *,
                presigned: bool = False) -> None:
    """Refuse a signature made for another region or service, or one that leaves unsigned a
    header that decides what the request does: ``host``, ``x-amz-date`` (of a signed header; a
    presigned URL has it in its signed query), ``x-amz-target`` (the action of the JSON
    protocol) and, on a JSON request, ``content-type``. A query-protocol request is read as a
    form whatever its content type and its body is signed by its hash, so its content type may go
    unsigned (boto 2 signs only host and the x-amz-* headers). ``headers``: lower-case names."""
    if cred.service != SERVICE:
        raise SignatureError("SignatureDoesNotMatch",
                             f"Credential should be scoped to correct service: '{SERVICE}'.")
    if cred.region != region:
        raise SignatureError("SignatureDoesNotMatch",
                             f"Credential should be scoped to a valid region, not"
                             f" '{cred.region[:64]}'.")
    needed = ["host"]
    if not presigned:
        needed.append("x-amz-date")
    if "x-amz-target" in headers:
        needed.append("x-amz-target")
        if "content-type" in headers:
            needed.append("content-type")
    missing = [h for h in needed if h not in cred.signed_headers]
    if missing:
        raise SignatureError("IncompleteSignature",
                             f"The request must sign the headers {', '.join(missing)}"
                             " (SignedHeaders).")


def is_presigned(query: Sequence[tuple[str, str]]) -> bool:
    """Whether the request is signed in its query string (a presigned URL)."""
    return any(k == "X-Amz-Algorithm" for k, _ in query)


@dataclass(frozen=True, slots=True)
class Presigned:
    """What a presigned URL's query string claims: the credential, when it was signed, and for
    how many seconds it is good."""

    cred: Credential
    stamp: str
    expires: int


def parse_presigned(query: Sequence[tuple[str, str]]) -> Presigned:
    """The X-Amz-* parameters of a presigned URL; IncompleteSignature when one is missing,
    repeated or malformed."""
    found: dict[str, str] = {}
    for k, v in query:
        if k in PRESIGN_PARAMS:
            if k in found:
                raise SignatureError("IncompleteSignature", f"{k} is given twice")
            found[k] = v
    missing = sorted(PRESIGN_PARAMS - {"X-Amz-Security-Token"} - found.keys())
    if missing:
        raise SignatureError("IncompleteSignature",
                             f"A presigned URL needs {', '.join(missing)}")
    if found["X-Amz-Algorithm"] != ALGORITHM:
        raise SignatureError("IncompleteSignature", f"X-Amz-Algorithm must be {ALGORITHM}")
    m = _CREDENTIAL.match(found["X-Amz-Credential"])
    if m is None:
        raise SignatureError("IncompleteSignature",
                             "X-Amz-Credential is not KEY/YYYYMMDD/REGION/SERVICE/aws4_request")
    names = tuple(found["X-Amz-SignedHeaders"].split(";"))
    if "host" not in names or not re.fullmatch(r"[a-z0-9;_.-]+", found["X-Amz-SignedHeaders"]):
        raise SignatureError("IncompleteSignature", "X-Amz-SignedHeaders must include host")
    if not re.fullmatch(r"[0-9a-f]{64}", found["X-Amz-Signature"]):
        raise SignatureError("IncompleteSignature", "X-Amz-Signature is not 64 hex digits")
    expires = found["X-Amz-Expires"]
    if not expires.isdigit() or not 1 <= int(expires) <= MAX_EXPIRES:
        raise SignatureError("AuthorizationQueryParametersError",
                             f"X-Amz-Expires must be a number of seconds from 1 to {MAX_EXPIRES}")
    key, day, region, service = m.groups()
    cred = Credential(key, day, region, service, names, found["X-Amz-Signature"])
    return Presigned(cred, found["X-Amz-Date"], int(expires))


def _uri_encode(segment: str) -> str:
    return quote(segment, safe="-_.~")


def canonical_request(
    method: str,
    path: str,
    query: Sequence[tuple[str, str]],
    headers: Mapping[str, str],
    signed_headers: Sequence[str],
    body: bytes,
    payload_hash: str | None = None,
) -> str:
    """The canonical request of SigV4 for a service other than S3. ``path`` is the path as it
    came on the wire (still percent-encoded): non-S3 services encode it once more.
    ``payload_hash``: instead of the body's SHA-256 (UNSIGNED-PAYLOAD of a presigned URL)."""
    canonical_uri = quote(path, safe="/~") or "/"
    canonical_query = "&".join(
        f"{k}={v}" for k, v in sorted((_uri_encode(k), _uri_encode(v)) for k, v in query)
    )
    lines = []
    for name in signed_headers:
        if name not in headers:
            raise SignatureError("IncompleteSignature", f"signed header {name} is missing")
        lines.append(f"{name}:{' '.join(headers[name].split())}\n")
    return "\n".join([
        method.upper(), canonical_uri, canonical_query, "".join(lines), ";".join(signed_headers),
        payload_hash or hashlib.sha256(body).hexdigest(),
    ])


@functools.lru_cache(maxsize=1024)
def signing_key(secret: str, day: str, region: str, service: str) -> bytes:
    """The day's key: HMAC chain AWS4+secret -> day -> region -> service -> aws4_request.
    Kept per key and day (four HMACs a request otherwise); a key's secret is in memory anyway
    (:class:`queue_pg.endpoint_keys.KeyCache`), and a kept one signs nothing by itself: the
    request's key must still be live."""
    key = ("AWS4" + secret).encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.digest(key, part.encode(), "sha256")  # one C call (hmac.new: Python objects)
    return key


def _parse_time(stamp: str) -> datetime:
    """X-Amz-Date (``YYYYMMDDTHHMMSSZ``) as a UTC time, read by position (strptime costs more
    than the rest of the check)."""
    try:
        if _STAMP.fullmatch(stamp) is None:
            raise ValueError(stamp)
        return datetime(int(stamp[:4]), int(stamp[4:6]), int(stamp[6:8]), int(stamp[9:11]),
                        int(stamp[11:13]), int(stamp[13:15]), tzinfo=timezone.utc)
    except ValueError:
        raise SignatureError("IncompleteSignature", f"X-Amz-Date {stamp!r} is malformed") from None


def request_time(headers: Mapping[str, str], now: datetime) -> str:
    """The X-Amz-Date the request was signed at; RequestExpired when too far from ``now``."""
    stamp = headers.get("x-amz-date")
    if stamp is None:
        raise SignatureError("IncompleteSignature", "X-Amz-Date header is missing")
    at = _parse_time(stamp)
    if abs(now - at) > MAX_SKEW:
        raise SignatureError("RequestExpired",
                             f"Request has expired: X-Amz-Date {stamp} is more than 15 minutes"
                             " from the server's time")
    return stamp


def _check(cred: Credential, secret: str, stamp: str, canonicals: Sequence[str]) -> None:
    """SignatureDoesNotMatch unless ``cred.signature`` signs one of ``canonicals`` at ``stamp``."""
    if stamp[:8] != cred.day:
        raise SignatureError("SignatureDoesNotMatch", "Credential scope date is not X-Amz-Date's")
    scope = f"{cred.day}/{cred.region}/{cred.service}/aws4_request"
    key = signing_key(secret, cred.day, cred.region, cred.service)
    ok = False
    for canonical in canonicals:  # every candidate is computed: no early exit to time
        to_sign = "\n".join([ALGORITHM, stamp, scope,
                             hashlib.sha256(canonical.encode()).hexdigest()])
        expected = hmac.digest(key, to_sign.encode(), "sha256").hex()
        ok |= hmac.compare_digest(expected, cred.signature)
    if not ok:
        raise SignatureError("SignatureDoesNotMatch",
                             "The request signature we calculated does not match the signature"
                             " you provided. Check your AWS Secret Access Key and signing method.")


def verify(
    cred: Credential,
    secret: str,
    method: str,
    path: str,
    query: Sequence[tuple[str, str]],
    headers: Mapping[str, str],
    body: bytes,
    now: datetime | None = None,
) -> None:
    """Raise SignatureError unless ``cred.signature`` signs this request with ``secret``.

    ``headers``: lower-case names. The scope's day must be the day of X-Amz-Date."""
    stamp = request_time(headers, now or datetime.now(timezone.utc))
    _check(cred, secret, stamp,
           [canonical_request(method, path, query, headers, cred.signed_headers, body)])


def verify_presigned(
    signed: Presigned,
    secret: str,
    method: str,
    path: str,
    query: Sequence[tuple[str, str]],
    headers: Mapping[str, str],
    body: bytes,
    now: datetime | None = None,
) -> None:
    """Raise SignatureError unless the presigned URL's signature signs this request with
    ``secret`` and is still good: RequestExpired past X-Amz-Date + X-Amz-Expires (or when
    X-Amz-Date is more than 15 minutes ahead of ours).

    ``query``: the whole query string; its X-Amz-Signature is left out of what is signed. The
    payload is signed as the empty body's hash or UNSIGNED-PAYLOAD (botocore's choice depends
    on the scheme); either way no body is allowed, so none can be added to a URL."""
    if body:
        raise SignatureError("IncompleteSignature",
                             "A presigned request must have no body: its signature covers the"
                             " query string only")
    now = now or datetime.now(timezone.utc)
    at = _parse_time(signed.stamp)
    if at - now > MAX_SKEW:
        raise SignatureError("RequestExpired",
                             f"Request is not yet valid: X-Amz-Date {signed.stamp} is more than"
                             " 15 minutes ahead of the server's time")
    if now > at + timedelta(seconds=signed.expires):
        raise SignatureError("RequestExpired",
                             f"Request has expired: signed at {signed.stamp}, good for"
                             f" {signed.expires} s")
    rest = [(k, v) for k, v in query if k != "X-Amz-Signature"]
    names = signed.cred.signed_headers
    _check(signed.cred, secret, signed.stamp, [
        canonical_request(method, path, rest, headers, names, b""),
        canonical_request(method, path, rest, headers, names, b"", UNSIGNED_PAYLOAD),
    ])
