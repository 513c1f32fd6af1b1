"""Endpoint secrets sealed at rest (queue_pg/sealing.py, revision 0029): what a role that reads
the key tables (or a dump of them) learns, what the database refuses to store, keys of before
the revision, rotation, and what happens without a sealing key. Real endpoints, real SDKs."""

from __future__ import annotations

import base64
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

pytest.importorskip("cryptography")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("azure.storage.queue")
boto3 = pytest.importorskip("boto3")

from azure.core.exceptions import HttpResponseError  # noqa: E402
from azure.storage.queue import QueueServiceClient  # noqa: E402

from bench.sqs_suite import serve  # noqa: E402
from queue_pg import InvalidParameter  # noqa: E402
from queue_pg.azure import create_app as azure_app  # noqa: E402
from queue_pg.errors import translate  # noqa: E402
from queue_pg.install import migrate  # noqa: E402
from queue_pg.ops import cli  # noqa: E402
from queue_pg.sealing import (  # noqa: E402
    ENV,
    Keyring,
    SealError,
    SecretKeyMissing,
    create_azure_key,
    create_sqs_key,
    generate_key,
    new_azure_key,
    new_sqs_secret,
)
from queue_pg.sqs import create_app as sqs_app  # noqa: E402
from tests.test_access import PRODUCER, MakeRole, make_role  # noqa: E402, F401
from tests.test_migrations import downgrade  # noqa: E402


def _azure(url: str, account: str, key: str) -> Any:
    return QueueServiceClient.from_connection_string(
        f"DefaultEndpointsProtocol=http;AccountName={account};AccountKey={key};"
        f"QueueEndpoint={url}/{account};", retry_total=0)


def _sqs(url: str, access: str, secret: str) -> Any:
    return boto3.client("sqs", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id=access, aws_secret_access_key=secret)


def _me(dsn: str) -> str:
    with psycopg.connect(dsn) as c:
        return str(c.execute("SELECT current_user").fetchone()[0])  # type: ignore[index]


def test_a_reader_of_the_key_tables_learns_no_secret(clean: str,
                                                      make_role: MakeRole) -> None:  # noqa: F811
    """A role given SELECT on both key tables (a leaked grant, or a dump) reads every row and
    finds neither secret in any form; the keys still sign requests that the endpoints take."""
    owner = _me(clean)
    with psycopg.connect(clean, autocommit=True) as c:
        access, secret = create_sqs_key(c, owner)
        account, account_key = create_azure_key(c, owner)
    reader = make_role("keyreader")
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute(f'GRANT USAGE ON SCHEMA queue_pg TO "{reader.name}"')
        c.execute(f'GRANT SELECT ON queue_pg.sqs_keys, queue_pg.azure_keys TO "{reader.name}"')
    dump = []
    with reader.connect() as c:
        for table in ("sqs_keys", "azure_keys"):
            with c.cursor().copy(f"COPY queue_pg.{table} TO STDOUT") as copy:
                dump.append(b"".join(bytes(block) for block in copy).decode())
        stored = dict(c.execute("SELECT access_key, secret_key FROM queue_pg.sqs_keys").fetchall())
    text = "\n".join(dump)
    assert access in text and account in text  # the rows are all there ...
    raw_key = base64.b64decode(account_key)
    for needle in (secret, account_key, raw_key.hex(), base64.urlsafe_b64encode(raw_key).decode(),
                   secret[:16], account_key[:16]):
        assert needle not in text  # ... and no secret, whole or in part, in any spelling
    assert stored[access].startswith("qps1.")
    with serve(sqs_app(clean)) as url:
        assert "QueueUrl" in _sqs(url, access, secret).create_queue(QueueName="sealed-q")
    with serve(azure_app(clean)) as url:
        _azure(url, account, account_key).create_queue("sealed-a")


def test_the_database_refuses_a_plain_secret(clean: str) -> None:
    """The tables' checks (revision 0029) and the key functions take only sealed secrets, from
    any caller, the owner included: nothing stores a secret in plain by mistake."""
    owner = _me(clean)
    with psycopg.connect(clean, autocommit=True) as c:
        for call, args in (("queue_pg.sqs_create_key(%s, %s)", [owner, new_sqs_secret() * 2]),
                           ("queue_pg.azure_create_key(%s, %s)", [owner, new_azure_key()])):
            with pytest.raises(InvalidParameter, match="sealed_secret"), translate():
                c.execute(f"SELECT {call}", args)
        with pytest.raises(psycopg.errors.CheckViolation):
            c.execute("INSERT INTO queue_pg.sqs_keys (access_key, secret_key, role)"
                      " VALUES ('AKQPPLAINPLAINPLAIN1', %s, %s)", [new_sqs_secret(), owner])
        with pytest.raises(psycopg.errors.CheckViolation):
            c.execute("INSERT INTO queue_pg.azure_keys (account, secret_key, role)"
                      " VALUES ('plainacct', %s, %s)", [new_azure_key(), owner])
        assert c.execute("SELECT count(*) FROM queue_pg.sqs_keys").fetchone() == (0,)
        assert c.execute("SELECT count(*) FROM queue_pg.azure_keys").fetchone() == (0,)


def test_a_sealed_secret_opens_with_its_key_and_role_only() -> None:
    ring, other = Keyring.parse(generate_key()), Keyring.parse(generate_key())
    sealed = ring.seal("s3cret" * 8, "azure", "alice")
    assert ring.open(sealed, "azure", "alice") == "s3cret" * 8
    assert ring.seal("s3cret" * 8, "azure", "alice") != sealed  # a fresh nonce each time
    for bad in (lambda: other.open(sealed, "azure", "alice"),  # another key
                lambda: ring.open(sealed, "azure", "mallory"),  # moved to another role's row
                lambda: ring.open(sealed, "sqs", "alice"),  # moved to the other table
                lambda: ring.open(sealed[:-4] + ("AAAA" if sealed[-4:] != "AAAA" else "BBBB"),
                                  "azure", "alice")):  # changed
        with pytest.raises(SealError):
            bad()
    with pytest.raises(SecretKeyMissing, match="32 bytes"):
        Keyring.parse(base64.b64encode(b"short").decode())


def test_a_sealed_key_moved_to_a_stronger_role_is_refused(clean: str,
                                                          make_role: MakeRole) -> None:  # noqa: F811
    """One who can write the key table but holds no sealing key gives a weak role's key (whose
    secret it knows) the owner's role: the endpoint refuses it rather than run as the owner."""
    weak = make_role("weakkey", PRODUCER)
    with psycopg.connect(clean, autocommit=True) as c:
        account, key = create_azure_key(c, weak.name)
    with serve(azure_app(clean)) as url:
        svc = _azure(url, account, key)
        list(svc.list_queues())  # the weak role's key works as itself
        with psycopg.connect(clean, autocommit=True) as c:
            c.execute("UPDATE queue_pg.azure_keys SET role = current_user WHERE account = %s",
                      [account])
        with pytest.raises(HttpResponseError) as err:
            svc.create_queue("as-owner")
        assert err.value.error_code == "AuthenticationFailed"


def _plain_rows(dsn: str, owner: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """An SQS and an Azure key stored as revisions 0011 and 0024 stored them: in plain."""
    sqs = ("AKQP" + "0123456789ABCDEF", new_sqs_secret())
    azure = ("legacyacct", new_azure_key())
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO queue_pg.sqs_keys (access_key, secret_key, role) VALUES (%s, %s, %s)",
                  [*sqs, owner])
        c.execute("INSERT INTO queue_pg.azure_keys (account, secret_key, role) VALUES (%s, %s, %s)",
                  [*azure, owner])
    return sqs, azure


def _stored(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as c:
        return [r[0] for r in c.execute("SELECT secret_key FROM queue_pg.sqs_keys UNION ALL"
                                        " SELECT secret_key FROM queue_pg.azure_keys")]


def test_plain_keys_of_before_0029_work_until_sealed_and_rotation(
        scratch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys made before revision 0029 are in plain: the upgrade keeps them working (the
    migration has no key to seal them with), `queue-pg secret-key seal` seals them, and the
    tables' checks then hold for every row. Rotation: a new key first, the old after it, seal
    again; then the new key alone opens every secret."""
    migrate(scratch)
    owner = _me(scratch)
    downgrade(scratch, "0026")
    (access, secret), (account, account_key) = _plain_rows(scratch, owner)
    migrate(scratch)
    with psycopg.connect(scratch) as c:
        assert c.execute("SELECT bool_or(convalidated) FROM pg_constraint WHERE conname IN"
                         " ('sqs_keys_sealed', 'azure_keys_sealed')").fetchone() == (False,)
    old = generate_key()
    monkeypatch.setenv(ENV, old)

    def works() -> None:
        with serve(sqs_app(scratch)) as url:
            _sqs(url, access, secret).list_queues()
        with serve(azure_app(scratch)) as url:
            list(_azure(url, account, account_key).list_queues())

    works()  # in plain still: accepted (and logged) until sealed
    assert secret in _stored(scratch)
    result = CliRunner().invoke(cli.main, ["--dsn", scratch, "secret-key", "seal"])
    assert result.exit_code == 0, result.output
    assert f"sealed 2 secret(s) with key {Keyring.parse(old).key_id}" in result.output
    stored = _stored(scratch)
    assert all(s.startswith(f"qps1.{Keyring.parse(old).key_id}.") for s in stored)
    assert secret not in "".join(stored) and account_key not in "".join(stored)
    with psycopg.connect(scratch) as c:
        assert c.execute("SELECT bool_and(convalidated) FROM pg_constraint WHERE conname IN"
                         " ('sqs_keys_sealed', 'azure_keys_sealed')").fetchone() == (True,)
    works()

    new = generate_key()
    monkeypatch.setenv(ENV, f"{new}, {old}")
    result = CliRunner().invoke(cli.main, ["--dsn", scratch, "secret-key", "seal"])
    assert f"sealed 2 secret(s) with key {Keyring.parse(new).key_id}" in result.output
    monkeypatch.setenv(ENV, new)
    works()
    monkeypatch.setenv(ENV, old)  # the old key alone opens nothing any more
    with serve(azure_app(scratch)) as url, pytest.raises(HttpResponseError) as err:
        list(_azure(url, account, account_key).list_queues())
    assert err.value.error_code == "AuthenticationFailed"


def test_without_a_sealing_key_no_key_is_made_and_no_endpoint_starts(
        clean: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv("QUEUE_PG_SECRET_KEY_FILE", raising=False)
    owner = _me(clean)
    for args in (["sqs", "key", "create", owner], ["azure", "key", "create", owner],
                 ["azure", "--port", "1"], ["secret-key", "seal"]):
        result = CliRunner().invoke(cli.main, ["--dsn", clean, *args])
        assert result.exit_code == 1, (args, result.output)
        assert "QUEUE_PG_SECRET_KEY" in result.output
    with psycopg.connect(clean) as c:
        assert c.execute("SELECT (SELECT count(*) FROM queue_pg.sqs_keys)"
                         " + (SELECT count(*) FROM queue_pg.azure_keys)").fetchone() == (0,)
    for make in (sqs_app, azure_app):
        with pytest.raises(SecretKeyMissing):
            make(clean)
        make(clean, auth=False)  # no keys, no secrets: development only
    keyfile = tmp_path / "sealing.key"
    keyfile.write_text(f"# the endpoint's sealing key\n{generate_key()}\n")
    monkeypatch.setenv("QUEUE_PG_SECRET_KEY_FILE", str(keyfile))
    result = CliRunner().invoke(cli.main, ["--dsn", clean, "azure", "key", "create", owner])
    assert result.exit_code == 0 and "AccountKey" in result.output
