"""CORS as Azure Storage does it: preflights (``OPTIONS``) answered from the account's CORS rules
(Set Queue Service Properties), and the ``Access-Control-*`` headers of actual requests.

Preflights are not signed, so anyone may send them, naming any account and queue: they are
answered from :class:`RuleCache`, one read of every account's rules (``queue_pg.azure_cors_rules``)
shared by all requests and refreshed at most every ``ttl`` seconds, so a preflight costs no
read of its own and cannot tell whether a queue exists. Origins and header lists are hostile
strings: each is checked against a size and a character set before it is compared, and a
response header only ever carries a value that matched a stored rule item (themselves tokens:
``queue_pg._azure_cors_problem``) or that is made of such tokens. Pure functions of the rules and
the request, apart from the cache; no Starlette here.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("queue_pg.azure")

#: The longest Origin that can match: Azure's limit on an allowed origin.
MAX_ORIGIN = 256
#: The most header names a preflight may ask for, and their longest list.
MAX_REQUEST_HEADERS = 64
MAX_REQUEST_HEADERS_TEXT = 4096
#: Seconds between two reads of the rules (a change made through this process applies at once).
DEFAULT_TTL = 5.0
#: Seconds before a failed read is tried again; meanwhile the last rules read serve, if any.
RETRY_AFTER = 1.0

_ORIGIN = re.compile(r"[\x21-\x2b\x2d-\x7e]+")  # visible ASCII but the comma
_TOKEN = re.compile(r"[-!#$%&'*+.^_`|~0-9A-Za-z]+")  # an HTTP token (a header or method name)
_METHODS = frozenset({"DELETE", "GET", "HEAD", "MERGE", "POST", "OPTIONS", "PUT", "PATCH"})


@dataclass(frozen=True)
class Names:
    """A rule's AllowedHeaders or ExposedHeaders: literal names (as set) and prefixes (lower-case,
    of items ending in ``*``; ``""`` is the lone ``*``)."""

    literals: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()

    def has(self, name: str) -> bool:
        low = name.lower()
        return (any(low == n.lower() for n in self.literals)
                or any(low.startswith(p) for p in self.prefixes))


@dataclass(frozen=True)
class Rule:
    """One CORS rule, its items checked (an item that is not a token is dropped)."""

    origins: frozenset[str]  # as set: Azure compares origins with case
    any_origin: bool
    methods: frozenset[str]  # upper-case
    allowed: Names
    exposed: Names
    max_age: int

    def origin_match(self, origin: str) -> str | None:
        """``"exact"``, ``"any"`` or None: how the rule admits ``origin``."""
        if origin in self.origins:
            return "exact"
        return "any" if self.any_origin else None


def _items(value: Any) -> list[str]:
    return [t.strip() for t in value.split(",") if t.strip()] if isinstance(value, str) else []


def _names(value: Any) -> Names:
    items = [t for t in _items(value) if _TOKEN.fullmatch(t) and len(t) <= 256]
    return Names(tuple(t for t in items if not t.endswith("*")),
                 tuple(t[:-1].lower() for t in items if t.endswith("*")))


def parse_rules(stored: Any) -> tuple[Rule, ...]:
    """The rules of an account as stored (a list of objects of Azure's elements, string values),
    in order; a rule left with no origin or no method is dropped. Defensive: rows stored before
    queue_pg._azure_cors_problem checked them may hold anything."""
    rules = []
    for raw in stored if isinstance(stored, list) else []:
        if not isinstance(raw, Mapping):
            continue
        origins = [o for o in _items(raw.get("AllowedOrigins"))
                   if o == "*" or (_ORIGIN.fullmatch(o) and len(o) <= MAX_ORIGIN)]
        methods = frozenset(m.upper() for m in _items(raw.get("AllowedMethods"))
                            if m.upper() in _METHODS)
        try:
            max_age = max(0, int(str(raw.get("MaxAgeInSeconds", "0"))))
        except ValueError:
            max_age = 0
        if origins and methods:
            rules.append(Rule(frozenset(o for o in origins if o != "*"), "*" in origins,
                              methods, _names(raw.get("AllowedHeaders")),
                              _names(raw.get("ExposedHeaders")), max_age))
    return tuple(rules)


def valid_origin(origin: str) -> bool:
    """Whether an Origin header can match any rule: visible ASCII, no comma, MAX_ORIGIN at most."""
    return len(origin) <= MAX_ORIGIN and _ORIGIN.fullmatch(origin) is not None


def preflight(rules: Iterable[Rule], origin: str, method: str,
              request_headers: str | None) -> dict[str, str] | None:
    """The headers of a preflight's 200 under the first rule that admits its Origin,
    Access-Control-Request-Method and every header of its Access-Control-Request-Headers; None
    when no rule does (Azure's 403 CorsPreflightFailure)."""
    asked: list[str] = []
    if request_headers is not None:
        if len(request_headers) > MAX_REQUEST_HEADERS_TEXT:
            return None
        asked = _items(request_headers)
        if len(asked) > MAX_REQUEST_HEADERS or not all(
                _TOKEN.fullmatch(h) and len(h) <= 256 for h in asked):
            return None
    if not valid_origin(origin) or method.upper() not in _METHODS:
        return None
    for rule in rules:
        if (rule.origin_match(origin) is None or method.upper() not in rule.methods
                or not all(rule.allowed.has(h) for h in asked)):
            continue
        headers = {"Access-Control-Allow-Origin": origin,
                   "Access-Control-Allow-Methods": method.upper(),
                   "Access-Control-Max-Age": str(rule.max_age),
                   "Access-Control-Allow-Credentials": "true"}
        if asked:
            headers["Access-Control-Allow-Headers"] = ",".join(asked)
        return headers
    return None


def actual(rules: tuple[Rule, ...], origin: str, method: str,
           response_headers: Iterable[str]) -> dict[str, str]:
    """The CORS headers of an actual request's response (whatever its status), under the first
    rule that admits its origin and method: Access-Control-Allow-Origin (``*`` for a rule of any
    origin, else the origin, with Access-Control-Allow-Credentials), Access-Control-Expose-Headers
    (the response's headers the rule's prefixes match, and its literal names), and ``Vary:
    Origin`` on GET and HEAD responses that depend on the origin (an exact match, or no match
    while rules exist: Azure sets it for those two methods only, the ones user agents cache).
    Nothing without rules."""
    if not rules:
        return {}
    vary = {"Vary": "Origin"} if method in ("GET", "HEAD") else {}
    if not valid_origin(origin):
        return vary
    for rule in rules:
        how = rule.origin_match(origin)
        if how is None or method not in rule.methods:
            continue
        names = [n for n in response_headers if any(n.lower().startswith(p)
                                                    for p in rule.exposed.prefixes)]
        have = {n.lower() for n in names}
        names += [n for n in rule.exposed.literals if n.lower() not in have]
        out = {"Access-Control-Allow-Origin": "*" if how == "any" else origin}
        if names:
            out["Access-Control-Expose-Headers"] = ",".join(names)
        if how == "exact":
            out |= vary | {"Access-Control-Allow-Credentials": "true"}
        return out
    return vary


class RuleCache:
    """Every account's rules, read at once by ``load`` (account -> stored rules) and kept for
    ``ttl`` seconds; concurrent requests share one read (a flood of preflights makes one query),
    and a failed read is not retried for RETRY_AFTER seconds (the last rules serve meanwhile)."""

    def __init__(self, load: Callable[[], Awaitable[Mapping[str, Any]]],
                 ttl: float = DEFAULT_TTL) -> None:
        self._load, self.ttl = load, ttl
        self._rules: dict[str, tuple[Rule, ...]] | None = None
        self._fresh_until = float("-inf")
        self._generation = 0  # bumped by invalidate: a read begun before it is stale at once
        self._lock = asyncio.Lock()
        #: reads made, for tests and the bench
        self.reads = 0

    def invalidate(self) -> None:
        """The rules changed here (Set Queue Service Properties): read them on the next use."""
        self._generation += 1
        self._fresh_until = float("-inf")

    async def rules(self, account: str) -> tuple[Rule, ...]:
        """The account's rules, in order (empty: none, or an unknown account)."""
        if time.monotonic() >= self._fresh_until:
            async with self._lock:
                if time.monotonic() >= self._fresh_until:
                    await self._refresh()
        if self._rules is None:  # the first read failed just now
            raise RuntimeError("the CORS rules could not be read: see the log")
        return self._rules.get(account, ())

    async def _refresh(self) -> None:
        generation = self._generation
        self.reads += 1
        try:
            stored = await self._load()
        except Exception:
            self._fresh_until = time.monotonic() + RETRY_AFTER
            if self._rules is None:
                raise
            logger.warning("queue_pg.azure: reading the CORS rules failed; the last ones read"
                           " serve for %s s", RETRY_AFTER, exc_info=True)
            return
        self._rules = {str(a): parse_rules(r) for a, r in stored.items()}
        self._fresh_until = (time.monotonic() + self.ttl if generation == self._generation
                             else float("-inf"))


__all__ = ["MAX_ORIGIN", "Rule", "RuleCache", "actual", "parse_rules",
           "preflight", "valid_origin"]
