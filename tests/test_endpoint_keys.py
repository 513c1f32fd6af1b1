"""The endpoints keep the keys they looked up (queue_pg/endpoint_keys.py) and check, in each
transaction a request runs, that its key is still live (``queue_pg._enter_key``): a key revoked
while the endpoint runs, or whose role was dropped, or an Azure account whose key was replaced,
is refused on its very next request, and that request does nothing. Real servers, real SDK
clients (boto3, azure-storage-queue), keys of roles with grants on one queue only.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql as psql

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
boto3 = pytest.importorskip("boto3")
azq = pytest.importorskip("azure.storage.queue")

from azure.core.exceptions import HttpResponseError  # noqa: E402
from azure.storage.queue import QueueServiceClient  # noqa: E402
from botocore.config import Config  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402

from bench.sqs_suite import serve  # noqa: E402
from queue_pg.azure import create_app as azure_app  # noqa: E402
from queue_pg.errors import AccessDenied, translate  # noqa: E402
from queue_pg.sealing import create_azure_key, create_sqs_key  # noqa: E402
from queue_pg.sqs import create_app as sqs_app  # noqa: E402
from tests.test_access import CONSUMER, PRODUCER, MakeRole, make_role  # noqa: E402, F401


@pytest.fixture(scope="module")
def servers(dsn: str) -> Iterator[tuple[str, str]]:
    """(SQS endpoint URL, Azure endpoint URL), served by uvicorn in threads for the module."""
    with serve(sqs_app(dsn)) as sqs_url, serve(azure_app(dsn)) as azure_url:
        yield sqs_url, azure_url


def _sqs(url: str, access: str, secret: str) -> Any:
    return boto3.client("sqs", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id=access, aws_secret_access_key=secret,
                        config=Config(retries={"max_attempts": 1}))


def _azure(url: str, account: str, key: str) -> Any:
    return QueueServiceClient.from_connection_string(
        f"DefaultEndpointsProtocol=http;AccountName={account};AccountKey={key};"
        f"QueueEndpoint={url}/{account};", retry_total=0)


def _one_queue_role(make_role: MakeRole, clean: str, queue: str, label: str,  # noqa: F811
                    others: tuple[str, ...] = ()) -> str:
    """``queue`` (and ``others``, queues it gets no grant on) made, and a role that may send to
    and receive from ``queue`` only."""
    role = make_role(label, PRODUCER, CONSUMER)
    with psycopg.connect(clean, autocommit=True) as c:
        for name in (queue, *others):
            c.execute("SELECT queue_pg.create_queue(%s)", [name])
        for privilege in ("send", "receive"):
            c.execute("SELECT queue_pg.grant(%s, %s, %s)", [queue, role.name, privilege])
    return role.name


def _bodies(clean: str, queue: str) -> list[str]:
    with psycopg.connect(clean, autocommit=True) as c:
        rows = c.execute("SELECT m.body #>> '{}' FROM queue_pg.messages m JOIN queue_pg.queues q"
                         " ON q.id = m.queue_id WHERE q.name = %s ORDER BY m.id", [queue])
        return [str(r[0]) for r in rows]


def test_an_sqs_key_revoked_while_kept_is_refused_on_its_next_request(
    servers: tuple[str, str], make_role: MakeRole, clean: str  # noqa: F811
) -> None:
    url = servers[0]
    role = _one_queue_role(make_role, clean, "kept", "sqskept", ("other",))
    with psycopg.connect(clean, autocommit=True) as c:
        access, secret = create_sqs_key(c, role)
        spare = create_sqs_key(c, role)
    w = _sqs(url, access, secret)
    queue = f"{url}/000000000000/kept"
    w.send_message(QueueUrl=queue, MessageBody="one")
    got = w.receive_message(QueueUrl=queue, WaitTimeSeconds=0)["Messages"]  # the key is kept
    forged = _sqs(url, access, "x" * 40)  # its id with a wrong secret: refused, the key kept
    with pytest.raises(ClientError) as err:
        forged.list_queues()
    assert err.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert w.list_queues()["QueueUrls"] == [queue]
    with psycopg.connect(clean, autocommit=True) as c:
        assert c.execute("SELECT queue_pg.sqs_revoke_key(%s)", [access]).fetchone() == (True,)
    for call in (lambda: w.send_message(QueueUrl=queue, MessageBody="two"),
                 lambda: w.send_message_batch(QueueUrl=queue, Entries=[
                     {"Id": "a", "MessageBody": "three"}]),
                 lambda: w.receive_message(QueueUrl=queue, WaitTimeSeconds=0),
                 lambda: w.delete_message(QueueUrl=queue,
                                          ReceiptHandle=got[0]["ReceiptHandle"]),
                 lambda: w.list_queues(), lambda: forged.list_queues()):
        with pytest.raises(ClientError) as err:
            call()
        assert err.value.response["Error"]["Code"] == "InvalidClientTokenId"
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert _bodies(clean, "kept") == ["one"]  # nothing sent, nothing deleted
    # the role's other key works on, with the role's grants only
    other = _sqs(url, *spare)
    other.delete_message(QueueUrl=queue, ReceiptHandle=got[0]["ReceiptHandle"])
    with pytest.raises(ClientError) as err:
        other.send_message(QueueUrl=f"{url}/000000000000/other", MessageBody="no")
    assert err.value.response["Error"]["Code"] == "AccessDenied"
    assert _bodies(clean, "kept") == [] and _bodies(clean, "other") == []


def test_a_kept_sqs_key_whose_role_is_dropped_is_refused(
    servers: tuple[str, str], make_role: MakeRole, clean: str  # noqa: F811
) -> None:
    url = servers[0]
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute("SELECT queue_pg.create_queue('dropped')")
        gone = f"qp_keygone_{uuid.uuid4().hex[:8]}"  # roles are the cluster's: a name of its own
        c.execute(psql.SQL("CREATE ROLE {}").format(psql.Identifier(gone)))
        c.execute(psql.SQL("GRANT queue_pg_producer TO {}").format(psql.Identifier(gone)))
        c.execute("SELECT queue_pg.grant('dropped', %s, 'send')", [gone])
        access, secret = create_sqs_key(c, gone)
    w = _sqs(url, access, secret)
    queue = f"{url}/000000000000/dropped"
    w.send_message(QueueUrl=queue, MessageBody="before")
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute(psql.SQL("DROP ROLE {}").format(psql.Identifier(gone)))
    with pytest.raises(ClientError) as err:
        w.send_message(QueueUrl=queue, MessageBody="after")
    assert err.value.response["Error"]["Code"] == "InvalidClientTokenId"
    assert _bodies(clean, "dropped") == ["before"]


def test_an_azure_key_revoked_or_replaced_while_kept(
    servers: tuple[str, str], make_role: MakeRole, clean: str  # noqa: F811
) -> None:
    url = servers[1]
    role = _one_queue_role(make_role, clean, "kept-az", "azkept")
    with psycopg.connect(clean, autocommit=True) as c:
        account, key = create_azure_key(c, role)
    q = _azure(url, account, key).get_queue_client("kept-az")
    q.send_message("one")
    got = next(iter(q.receive_messages()))  # the key is kept
    with psycopg.connect(clean, autocommit=True) as c:
        assert c.execute("SELECT queue_pg.azure_revoke_key(%s)", [account]).fetchone() == (True,)
    for call in (lambda: q.send_message("two"), lambda: list(q.receive_messages()),
                 lambda: q.delete_message(got), q.peek_messages):
        with pytest.raises(HttpResponseError) as err:
            call()
        assert err.value.status_code == 403
        assert err.value.response.headers.get("x-ms-error-code") == "AuthenticationFailed"
    assert _bodies(clean, "kept-az") == ["one"]
    # the account gets a new key: its requests work at once, the old key's stay refused
    with psycopg.connect(clean, autocommit=True) as c:
        _, new_key = create_azure_key(c, role, account)
    fresh = _azure(url, account, new_key).get_queue_client("kept-az")
    fresh.send_message("three")
    with pytest.raises(HttpResponseError) as err:
        q.send_message("four")
    assert err.value.status_code == 403
    assert _bodies(clean, "kept-az") == ["one", "three"]


def test_only_the_owner_may_check_keys_or_take_their_roles(
    make_role: MakeRole, clean: str  # noqa: F811
) -> None:
    """A role with a grant on one queue cannot read a key, nor take a key's role with the
    endpoints' own statement (it would run as that role)."""
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute("SELECT queue_pg.create_queue('hostile-one')")
        owner = str(c.execute("SELECT current_user").fetchone()[0])  # type: ignore[index]
        access, _ = create_sqs_key(c, owner)
        account, _ = create_azure_key(c, owner)
        azure_id = str(c.execute("SELECT id FROM queue_pg.endpoint_key('azure', %s)",
                                 [account]).fetchone()[0])  # type: ignore[index]
    hostile = make_role("keythief", PRODUCER, CONSUMER)
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute("SELECT queue_pg.grant('hostile-one', %s, 'send')", [hostile.name])
    with psycopg.connect(hostile.dsn, autocommit=True) as h:
        for query, params in (
                ("SELECT * FROM queue_pg.endpoint_key('sqs', %s)", [access]),
                ("SELECT * FROM queue_pg.endpoint_key('azure', %s)", [account]),
                ("SELECT queue_pg._enter_key('sqs', %s, %s)", [access, owner]),
                ("SELECT queue_pg._enter_key('azure', %s, %s)", [azure_id, owner])):
            with pytest.raises(AccessDenied), translate(), h.transaction():
                h.execute(query, params)
            assert h.execute("SELECT current_user::text").fetchone() == (hostile.name,)


def test_a_kept_sqs_key_given_a_stronger_role_is_refused(
    servers: tuple[str, str], make_role: MakeRole, clean: str  # noqa: F811
) -> None:
    """One who can write the key table gives a kept key of a weak role the owner's role: the
    endpoint's next request with it is refused, not run as the owner (the seal, and so the kept
    secret, is of the weak role)."""
    url = servers[0]
    role = _one_queue_role(make_role, clean, "weak", "sqsweak")
    with psycopg.connect(clean, autocommit=True) as c:
        access, secret = create_sqs_key(c, role)
    w = _sqs(url, access, secret)
    w.send_message(QueueUrl=f"{url}/000000000000/weak", MessageBody="as the weak role")
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute("UPDATE queue_pg.sqs_keys SET role = current_user WHERE access_key = %s",
                  [access])
    with pytest.raises(ClientError) as err:
        w.create_queue(QueueName="as-owner")
    assert err.value.response["Error"]["Code"] == "InvalidClientTokenId"
    with psycopg.connect(clean, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM queue_pg.queues WHERE name = 'as-owner'"
                         ).fetchone() == (0,)


@pytest.mark.parametrize("prepare", [False, True])
def test_a_failed_key_check_leaves_the_connection_usable(clean: str, prepare: bool) -> None:
    """A request whose key check fails stops its statement in the pipeline behind the check.
    psycopg counts that statement prepared if that run was the one to prepare it at its
    threshold, though the server never parsed it; the role pool prepares nothing (or, asked
    to, on first use), so every later request on the connection still runs, whichever run of
    the statement the failed check fell on."""
    import asyncio

    from queue_pg import sealing
    from queue_pg.endpoint_keys import EndpointKey
    from queue_pg.sqs.app import REQUEST_KEY, RolePool

    ring = sealing.Keyring.required({sealing.ENV: sealing.generate_key()})
    with psycopg.connect(clean, autocommit=True) as c:
        role = str(c.info.user)
        access, _ = create_sqs_key(c, role, ring)
    live = EndpointKey("sqs", access, access, role, "")
    gone = EndpointKey("sqs", "AKIAGONE", "AKIAGONE", role, "")

    async def one_connection(fails_at: int) -> list[str]:
        pool = RolePool(clean, max_size=1, prepare=prepare)
        await pool.open()
        try:
            seen = []
            for i in range(8):
                REQUEST_KEY.set(gone if i == fails_at else live)
                try:
                    async with pool.connection() as conn:
                        await conn.execute("SELECT count(*) FROM queue_pg.list_queues()")
                    seen.append("ok")
                except psycopg.Error as e:
                    seen.append(str(e.sqlstate))
            return seen
        finally:
            await pool.close()

    for fails_at in range(8):
        seen = asyncio.run(one_connection(fails_at))
        assert seen == ["ok"] * fails_at + ["QP040"] + ["ok"] * (7 - fails_at), (fails_at, seen)
