"""The keys of the HTTP endpoints (SQS, Azure), kept in memory between requests.

A request is signed with a key's secret, which the endpoint reads from the database
(``queue_pg.endpoint_key``: sealed, opened here with the :class:`~queue_pg.sealing.Keyring`).
Reading it for every request would cost a round trip each; so the opened key is kept, and whether
it is still live is checked where it cannot be stale: every transaction the request runs starts
with ``queue_pg._enter_key(kind, id, role)`` (:meth:`EndpointKey.enter`), in the same round trip
as the statement, which raises :class:`~queue_pg.errors.KeyRevoked` when the key was revoked, its
role dropped, or its row given another role than the one its secret was opened for (the seal binds
the two), and else takes that role for the transaction. So a revoked key fails on its very
next request, with nothing done; the endpoint then forgets it (:meth:`KeyCache.forget`).

A secret never changes under its id (re-sealing keeps the secret), so an entry needs no expiry;
a signature that does not check out with a kept secret is checked once more against the
database's key (:meth:`KeyCache.kept`, then :meth:`KeyCache.look_up`): an Azure account whose key
was replaced signs with the new one.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from queue_pg.errors import translate
from queue_pg.sealing import Keyring, SealError, is_sealed

__all__ = ["ENTER", "EndpointKey", "KeyCache"]

logger = logging.getLogger("queue_pg.endpoint_keys")

#: The statement that checks a kept key and takes its role (sql/api/58_endpoint_keys.sql).
ENTER = "SELECT queue_pg._enter_key(%s, %s, %s)"


@dataclass(frozen=True)
class EndpointKey:
    """A live key as the endpoint keeps it: kind ('sqs', 'azure'), the name requests give (the
    access key, the account), id (the access key, the Azure key's row id), the role its
    requests run as, and the secret that signs them."""

    kind: str
    name: str
    id: str
    role: str
    secret: str = field(repr=False)

    async def enter(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Check the key is still live and of its role, and take the role, for the current
        transaction."""
        await psycopg.AsyncCursor(conn).execute(ENTER, [self.kind, self.id, self.role])


class KeyCache:
    """The live keys of one kind, by name (the access key, the account), opened. Holds at most
    ``size`` (the least recently used go first); only keys found in the database enter, so a
    caller cannot fill it with names it makes up."""

    def __init__(self, kind: str, keyring: Keyring, *, size: int = 10_000) -> None:
        self.kind = kind
        self.keyring = keyring
        self.size = size
        self._keys: OrderedDict[str, EndpointKey] = OrderedDict()
        self._plain_warned: set[str] = set()

    def forget(self, key: EndpointKey | str) -> None:
        """Drop a key that :class:`~queue_pg.errors.KeyRevoked` said is revoked (unless its
        name holds another key by now), or whatever a name holds (it has no live key)."""
        if isinstance(key, str):
            self._keys.pop(key, None)
        elif self._keys.get(key.name) == key:
            del self._keys[key.name]

    def kept(self, name: str, check: Callable[[EndpointKey], None]) -> EndpointKey | None:
        """The kept key of ``name`` when there is one and its secret passes ``check`` (which
        raises when the request's signature does not check out), else None: the caller then
        looks the key up (:meth:`look_up`), as the one in the database may be another by now
        (an Azure account's new key). A key that fails stays kept: a caller who signs badly
        does not evict it."""
        key = self._keys.get(name)
        if key is None:
            return None
        try:
            check(key)
        except Exception:
            return None
        self._keys.move_to_end(name)
        return key

    def keep(self, key: EndpointKey) -> None:
        """Keep a key just looked up, once a request's signature checked out with it."""
        self._keys[key.name] = key
        self._keys.move_to_end(key.name)
        while len(self._keys) > self.size:
            self._keys.popitem(last=False)

    async def look_up(self, pool: AsyncConnectionPool[Any], name: str) -> EndpointKey | None:
        """The live key of ``name`` in the database, opened; None when there is none (or it
        does not open). ``pool``: connections of the owner, autocommit."""
        async with pool.connection() as conn:
            with translate():
                cur = await conn.execute(
                    "SELECT id, secret_key, role FROM queue_pg.endpoint_key(%s, %s)",
                    [self.kind, name])
                row = await cur.fetchone()
        if row is None:
            return None
        ident, stored, role = str(row[0]), str(row[1]), str(row[2])
        secret = self._open(stored, role, name)
        return None if secret is None else EndpointKey(self.kind, name, ident, role, secret)

    def _open(self, stored: str, role: str, name: str) -> str | None:
        """The plain secret of a stored key, or None when it does not open: the key is then
        refused as unknown, and the reason logged."""
        if not is_sealed(stored) and name not in self._plain_warned:
            self._plain_warned.add(name)
            logger.warning("queue_pg.%s: key %s is stored in plain (made before revision 0029):"
                           " run `queue-pg secret-key seal`", self.kind, name)
        try:
            return self.keyring.reveal(stored, self.kind, role)
        except SealError as exc:
            logger.error("queue_pg.%s: key %s refused: %s", self.kind, name, exc)
            return None
