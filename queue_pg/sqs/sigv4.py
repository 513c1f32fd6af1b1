"""AWS Signature Version 4, checked on the server side (stdlib hmac / hashlib only).

The client signs a canonical form of the request with a key derived from its secret, the day,
the region and the service; the server rebuilds that form from what arrived and compares in
constant time. Only the ``Authorization`` header form is accepted (what the SDKs send); the
request time must be within 15 minutes of ours, like AWS (a replay window, not a fence).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from urllib.parse import quote

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW = timedelta(minutes=15)

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


def _uri_encode(segment: str) -> str:
    return quote(segment, safe="-_.~")


def canonical_request(
    method: str,
    path: str,
    query: Sequence[tuple[str, str]],
    headers: Mapping[str, str],
    signed_headers: Sequence[str],
    body: bytes,
) -> str:
    """The canonical request of SigV4 for a service other than S3. ``path`` is the path as it
    came on the wire (still percent-encoded): non-S3 services encode it once more."""
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
        hashlib.sha256(body).hexdigest(),
    ])


def signing_key(secret: str, day: str, region: str, service: str) -> bytes:
    """The day's key: HMAC chain AWS4+secret -> day -> region -> service -> aws4_request."""
    key = ("AWS4" + secret).encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def request_time(headers: Mapping[str, str], now: datetime) -> str:
    """The X-Amz-Date the request was signed at; RequestExpired when too far from ``now``."""
    stamp = headers.get("x-amz-date")
    if stamp is None:
        raise SignatureError("IncompleteSignature", "X-Amz-Date header is missing")
    try:
        at = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        raise SignatureError("IncompleteSignature", f"X-Amz-Date {stamp!r} is malformed") from None
    if abs(now - at) > MAX_SKEW:
        raise SignatureError("RequestExpired",
                             f"Request has expired: X-Amz-Date {stamp} is more than 15 minutes"
                             " from the server's time")
    return stamp


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
    if stamp[:8] != cred.day:
        raise SignatureError("SignatureDoesNotMatch", "Credential scope date is not X-Amz-Date's")
    canonical = canonical_request(method, path, query, headers, cred.signed_headers, body)
    scope = f"{cred.day}/{cred.region}/{cred.service}/aws4_request"
    to_sign = "\n".join([ALGORITHM, stamp, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = signing_key(secret, cred.day, cred.region, cred.service)
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, cred.signature):
        raise SignatureError("SignatureDoesNotMatch",
                             "The request signature we calculated does not match the signature"
                             " you provided. Check your AWS Secret Access Key and signing method.")
