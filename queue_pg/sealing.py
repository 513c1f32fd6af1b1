"""Endpoint secrets sealed at rest (docs/access.md, "Endpoint keys at rest").

The SQS endpoint's secrets and the Azure endpoint's account keys sign requests with HMAC, so the
server must read them back in plain: they are stored sealed with AES-256-GCM under a key the
database never holds, given to the endpoints and to the key commands as ``QUEUE_PG_SECRET_KEY``
(or the path of a file holding it, ``QUEUE_PG_SECRET_KEY_FILE``). Several keys may be given
(comma or white space between them, one a line in the file): the first seals, every one opens,
so a key is rotated by putting a new one first and running ``queue-pg secret-key seal``.

A sealed secret reads ``qps1.<key id>.<base64url(nonce | ciphertext | tag)>``; its associated
data names the kind of key and its role (``queue_pg:sqs:ROLE``), so a sealed secret moved to
another role's row does not open. Needs ``cryptography`` (the ``sqs`` and ``azure`` extras).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

__all__ = ["ENV", "ENV_FILE", "PREFIX", "Keyring", "SealError", "SecretKeyMissing",
           "create_azure_key", "create_sqs_key", "generate_key", "is_sealed", "new_azure_key",
           "new_sqs_secret", "seal_all"]

#: The environment variable holding the sealing key(s), base64 (32 bytes each).
ENV = "QUEUE_PG_SECRET_KEY"
#: The environment variable naming a file that holds them (one a line, ``#`` comments).
ENV_FILE = "QUEUE_PG_SECRET_KEY_FILE"
#: How a sealed secret begins (format version 1).
PREFIX = "qps1."
_NONCE = 12


class SealError(Exception):
    """A sealed secret that does not open with the keys given (another key, or tampered)."""


class SecretKeyMissing(SealError):
    """No sealing key is configured, or the one given is not a key."""


def generate_key() -> str:
    """A new sealing key: 32 random bytes, base64url."""
    return base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()


def new_sqs_secret() -> str:
    """A new SQS secret access key: 40 characters, 240 random bits (base64url alphabet)."""
    return secrets.token_urlsafe(30)


def new_azure_key() -> str:
    """A new Azure account key: 64 random bytes, base64 (as Azure's own)."""
    return base64.b64encode(secrets.token_bytes(64)).decode()


def is_sealed(stored: str) -> bool:
    return stored.startswith(PREFIX)


def _b64(text: str) -> bytes:
    text = text.strip()
    pad = "=" * (-len(text) % 4)
    try:
        return base64.urlsafe_b64decode((text.replace("+", "-").replace("/", "_") + pad).encode())
    except (binascii.Error, ValueError) as exc:
        raise SecretKeyMissing(f"{ENV}: a key is not base64: {exc}") from None


def _key_id(key: bytes) -> str:
    return hashlib.sha256(b"queue_pg sealing key id\0" + key).hexdigest()[:8]


@dataclass(frozen=True)
class Keyring:
    """Sealing keys: ``keys[0]`` seals, each opens what it sealed (by key id)."""

    keys: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise SecretKeyMissing(f"{ENV} holds no key")
        for key in self.keys:
            if len(key) != 32:
                raise SecretKeyMissing(f"{ENV}: a key must be 32 bytes (base64: 43 or 44"
                                       f" characters), not {len(key)}: make one with"
                                       " `queue-pg secret-key generate`")

    @classmethod
    def parse(cls, text: str) -> Keyring:
        """Keys from text: base64, separated by commas, white space or lines (``#`` comments)."""
        words = [w for line in text.splitlines() for w in line.split("#", 1)[0]
                 .replace(",", " ").split()]
        return cls(tuple(_b64(w) for w in words))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Keyring | None:
        """The keys of ``QUEUE_PG_SECRET_KEY``, else of the file ``QUEUE_PG_SECRET_KEY_FILE``,
        else None; SecretKeyMissing when one is set but holds no good key."""
        env = os.environ if environ is None else environ
        if env.get(ENV, "").strip():
            return cls.parse(env[ENV])
        if env.get(ENV_FILE, "").strip():
            path = Path(env[ENV_FILE])
            try:
                return cls.parse(path.read_text())
            except OSError as exc:
                raise SecretKeyMissing(f"{ENV_FILE}: {exc}") from None
        return None

    @classmethod
    def required(cls, environ: Mapping[str, str] | None = None) -> Keyring:
        """:meth:`from_env`, or SecretKeyMissing naming what to set."""
        ring = cls.from_env(environ)
        if ring is None:
            raise SecretKeyMissing(
                f"no sealing key: set {ENV} (or {ENV_FILE}, a file holding it) to a key from"
                " `queue-pg secret-key generate`; endpoint secrets are stored sealed with it"
                " and the database never holds it")
        return ring

    @property
    def key_id(self) -> str:
        """The id of the key that seals (the first)."""
        return _key_id(self.keys[0])

    def _aead(self, key: bytes) -> object:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        return AESGCM(key)

    @staticmethod
    def _data(kind: str, role: str) -> bytes:
        return f"queue_pg:{kind}:{role}".encode()

    def seal(self, secret: str, kind: str, role: str) -> str:
        """``secret`` sealed under the first key, bound to ``kind`` ('sqs', 'azure') and role."""
        nonce = secrets.token_bytes(_NONCE)
        sealed = self._aead(self.keys[0]).encrypt(  # type: ignore[attr-defined]
            nonce, secret.encode(), self._data(kind, role))
        return (f"{PREFIX}{self.key_id}."
                + base64.urlsafe_b64encode(nonce + sealed).decode().rstrip("="))

    def open(self, stored: str, kind: str, role: str) -> str:
        """The secret a sealed value holds; SealError when no key given opens it (sealed under
        another key, moved to another role's row, or changed)."""
        from cryptography.exceptions import InvalidTag

        head, _, data = stored[len(PREFIX):].partition(".")
        key = next((k for k in self.keys if _key_id(k) == head), None)
        if not is_sealed(stored) or key is None:
            raise SealError(f"sealed under key {head[:8]!r}, which is not among the"
                            f" {len(self.keys)} key(s) of {ENV}")
        raw = base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))
        try:
            plain = self._aead(key).decrypt(  # type: ignore[attr-defined]
                raw[:_NONCE], raw[_NONCE:], self._data(kind, role))
        except InvalidTag:
            raise SealError("the sealed secret does not open: changed, or moved to another"
                            " role's key") from None
        return bytes(plain).decode()

    def reveal(self, stored: str, kind: str, role: str) -> str:
        """The secret of a stored value: opened when sealed; a plain one (made before revision
        0029, not yet sealed by ``queue-pg secret-key seal``) as it is."""
        return self.open(stored, kind, role) if is_sealed(stored) else stored


def seal_all(conn: psycopg.Connection[Any], ring: Keyring) -> tuple[int, int]:
    """Seal every stored endpoint secret that is plain or sealed under an older key with the
    first key (``queue-pg secret-key seal``): (sealed now, left as they were because a
    concurrent change won). Then validates the tables' checks. ``conn``: a psycopg connection
    of the owner, autocommit."""
    done = skipped = 0
    rows: Sequence[tuple[Any, ...]] = conn.execute(
        "SELECT kind, id, role, secret_key FROM queue_pg.endpoint_secrets(%s)",
        [ring.key_id]).fetchall()
    for kind, ident, role, stored in rows:
        sealed = ring.seal(ring.reveal(stored, kind, role), kind, role)
        row = conn.execute("SELECT queue_pg.endpoint_reseal(%s, %s, %s, %s)",
                           [kind, ident, stored, sealed]).fetchone()
        if row and row[0]:
            done += 1
        else:
            skipped += 1
    if not skipped:
        conn.execute("SELECT queue_pg.endpoint_secrets_sealed()")
    return done, skipped


def create_sqs_key(conn: psycopg.Connection[Any], role: str, ring: Keyring | None = None
                   ) -> tuple[str, str]:
    """A new SQS key for ``role`` (``queue-pg sqs key create``): (access key id, secret). The
    secret is made and sealed here; the database stores only its sealed form."""
    ring = ring or Keyring.required()
    secret = new_sqs_secret()
    row = conn.execute("SELECT queue_pg.sqs_create_key(%s, %s)",
                       [role, ring.seal(secret, "sqs", role)]).fetchone()
    assert row is not None
    return str(row[0]), secret


def create_azure_key(conn: psycopg.Connection[Any], role: str, account: str | None = None,
                     ring: Keyring | None = None, secret: str | None = None) -> tuple[str, str]:
    """A new Azure account key for ``role`` (``queue-pg azure key create``): (account name,
    base64 key). The key is made (or ``secret``, a known one such as an emulator's well-known
    key) and sealed here; the database stores only its sealed form."""
    ring = ring or Keyring.required()
    secret = secret or new_azure_key()
    row = conn.execute("SELECT queue_pg.azure_create_key(%s, %s, %s)",
                       [role, ring.seal(secret, "azure", role), account]).fetchone()
    assert row is not None
    return str(row[0]), secret
