"""The Azure Queue endpoint through the Azure SDK (azure-storage-queue signs; our server
verifies), against real PostgreSQL: a real uvicorn server in a thread on a free port per
module, clients from connection strings with account keys made by ``queue_pg.azure_create_key``.
"""

from __future__ import annotations

import asyncio
import base64
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
azq = pytest.importorskip("azure.storage.queue")

from azure.core.exceptions import HttpResponseError, ResourceExistsError  # noqa: E402
from azure.storage.queue import (  # noqa: E402
    AccountSasPermissions,
    QueueSasPermissions,
    QueueServiceClient,
    ResourceTypes,
    TextBase64DecodePolicy,
    TextBase64EncodePolicy,
    generate_account_sas,
    generate_queue_sas,
)

from bench.sqs_suite import serve  # noqa: E402
from queue_pg.azure import create_app  # noqa: E402
from queue_pg.sealing import create_azure_key  # noqa: E402
from tests.test_access import CONSUMER, PRODUCER, MakeRole, make_role  # noqa: E402, F401

Service = Any


@pytest.fixture(scope="module")
def endpoint(dsn: str) -> Iterator[str]:
    """The endpoint's base URL, served by uvicorn in a thread for the module."""
    with serve(create_app(dsn)) as url:
        yield url


def _key(dsn: str, role: str, account: str | None = None) -> tuple[str, str]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return create_azure_key(c, role, account)


def _conn_str(endpoint: str, account: str, key: str) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={account};AccountKey={key};"
            f"QueueEndpoint={endpoint}/{account};")


MakeService = Callable[..., tuple[Service, str, str]]


@pytest.fixture
def make_service(clean: str, endpoint: str) -> MakeService:
    """``make_service(role=None)``: (QueueServiceClient, account, key) with a new account key
    of ``role`` (None: the test database's owner)."""

    def make(role: str | None = None, **kw: Any) -> tuple[Service, str, str]:
        if role is None:
            with psycopg.connect(clean) as c:
                role = str(c.execute("SELECT current_user").fetchone()[0])  # type: ignore[index]
        account, key = _key(clean, role)
        svc = QueueServiceClient.from_connection_string(_conn_str(endpoint, account, key),
                                                        retry_total=0, **kw)
        return svc, account, key

    return make


@pytest.fixture
def service(make_service: MakeService) -> Service:
    return make_service()[0]


def code(err: pytest.ExceptionInfo[HttpResponseError]) -> str:
    """The x-ms-error-code the server answered (the SDK's error_code is its own enum)."""
    assert err.value.response is not None
    return str(err.value.response.headers.get("x-ms-error-code"))


# --- queues -------------------------------------------------------------------------------------

def test_queue_lifecycle_metadata_and_listing(service: Service) -> None:
    q = service.create_queue("orders-1", metadata={"team": "shop", "Tier": "gold"})
    with pytest.raises(ResourceExistsError):  # the same: Azure's 204, which the SDK raises on
        service.create_queue("orders-1", metadata={"team": "shop", "Tier": "gold"})
    with pytest.raises(ResourceExistsError) as err:
        service.create_queue("orders-1", metadata={"team": "other"})
    assert code(err) == "QueueAlreadyExists"
    props = q.get_queue_properties()
    assert props.metadata == {"team": "shop", "tier": "gold"} or props.metadata == {"team": "shop", "Tier": "gold"}
    assert props.approximate_message_count == 0
    q.set_queue_metadata({"team": "warehouse"})
    q.send_message("one")
    q.send_message("two", visibility_timeout=60)  # delayed messages are counted too
    props = q.get_queue_properties()
    assert props.metadata == {"team": "warehouse"} and props.approximate_message_count == 2
    for name in ("orders-2", "orders-3", "other-1"):
        service.create_queue(name)
    assert [x.name for x in service.list_queues()] == ["orders-1", "orders-2", "orders-3", "other-1"]
    listed = list(service.list_queues(name_starts_with="orders", include_metadata=True))
    assert [(x.name, x.metadata) for x in listed] == [
        ("orders-1", {"team": "warehouse"}), ("orders-2", {}), ("orders-3", {})]
    pages = [[x.name for x in page] for page in service.list_queues(results_per_page=2).by_page()]
    assert pages == [["orders-1", "orders-2"], ["orders-3", "other-1"]]
    assert service.get_service_properties()["cors"] == []  # Azure's defaults, fixed
    service.delete_queue("orders-1")
    with pytest.raises(HttpResponseError) as err:
        q.get_queue_properties()
    assert code(err) == "QueueNotFound" and err.value.status_code == 404
    with pytest.raises(HttpResponseError) as err:
        service.create_queue("Bad_Name")
    assert code(err) == "InvalidResourceName"
    for bad in ("ab", "a" * 64):
        with pytest.raises(HttpResponseError) as err:
            service.create_queue(bad)
        assert code(err) == "OutOfRangeInput"


# --- messages -----------------------------------------------------------------------------------

@pytest.mark.parametrize("encoded", [False, True], ids=["text", "base64"])
def test_send_receive_peek_update_delete_clear(make_service: MakeService, encoded: bool) -> None:
    kw = ({"message_encode_policy": TextBase64EncodePolicy(),
           "message_decode_policy": TextBase64DecodePolicy()} if encoded else {})
    service = make_service(**kw)[0]
    q = service.get_queue_client("work-items")
    q.create_queue()
    text = "héllo <&> \"quoted\" ünïcode"
    sent = q.send_message(text, time_to_live=-1)
    assert sent.id and sent.expires_on.year == 9999
    q.send_message("later", visibility_timeout=3600)
    peeked = q.peek_messages(max_messages=32)
    assert [(m.content, m.dequeue_count) for m in peeked] == [(text, 0)]
    got = list(q.receive_messages(max_messages=32, visibility_timeout=60))
    assert [(m.id, m.content, m.dequeue_count) for m in got] == [(sent.id, text, 1)]
    assert got[0].pop_receipt and got[0].next_visible_on > datetime.now(timezone.utc)
    assert list(q.receive_messages(visibility_timeout=60)) == []  # leased
    upd = q.update_message(got[0], content="changed", visibility_timeout=0)
    again = list(q.receive_messages(visibility_timeout=60))
    assert [(m.content, m.dequeue_count) for m in again] == [("changed", 2)]
    assert upd.pop_receipt
    q.delete_message(again[0])
    with pytest.raises(HttpResponseError) as err:
        q.delete_message(again[0])
    assert code(err) == "MessageNotFound"
    assert q.get_queue_properties().approximate_message_count == 1
    q.clear_messages()
    assert q.get_queue_properties().approximate_message_count == 0


def test_parameters_out_of_range(service: Service) -> None:
    q = service.create_queue("ranges")
    with pytest.raises(HttpResponseError) as err:
        list(q.receive_messages(messages_per_page=33))
    assert code(err) == "OutOfRangeQueryParameterValue" and err.value.status_code == 400
    # Azure's sentence first, whole (clients match on it), then what was wrong
    assert "is outside the permissible range. numofmessages='33'" in str(err.value)
    with pytest.raises(HttpResponseError) as err:
        q.send_message("x", visibility_timeout=7 * 24 * 3600 + 1)
    assert code(err) == "OutOfRangeQueryParameterValue"
    with pytest.raises(HttpResponseError) as err:
        q.send_message("x" * (64 * 1024 + 1))
    assert code(err) == "RequestBodyTooLarge" and err.value.status_code == 413
    q.send_message("x" * (64 * 1024))  # Azure's limit itself
    far = q.send_message("y", time_to_live=2**53 - 1)  # any positive ttl, as Azure: 100 years
    assert far.expires_on.year - datetime.now(timezone.utc).year == 100
    q.delete_message(far)
    with pytest.raises(HttpResponseError) as err:
        list(q.receive_messages(visibility_timeout=0))
    assert code(err) == "OutOfRangeQueryParameterValue"
    assert q.get_queue_properties().approximate_message_count == 1  # bad input changed nothing


def test_async_client(make_service: MakeService, endpoint: str) -> None:
    from azure.storage.queue.aio import QueueServiceClient as AsyncService

    _, account, key = make_service()

    async def run() -> list[str]:
        async with AsyncService.from_connection_string(_conn_str(endpoint, account, key)) as svc:
            q = await svc.create_queue("async-q")
            await q.send_message("a")
            await q.send_message("b")
            out = []
            async for m in q.receive_messages(max_messages=2):
                out.append(m.content)
                await q.delete_message(m)
            return out

    assert sorted(asyncio.run(run())) == ["a", "b"]


def test_worker_loop_and_a_stale_pop_receipt(service: Service) -> None:
    q = service.create_queue("jobs")
    for i in range(5):
        q.send_message(f"job {i}")
    done = []
    while True:  # receive, extend the lease while working, delete
        batch = list(q.receive_messages(max_messages=2, visibility_timeout=5))
        if not batch:
            break
        for m in batch:
            m = q.update_message(m, visibility_timeout=30)  # still working: extend
            q.delete_message(m)
            done.append(m.content)
    assert sorted(done) == [f"job {i}" for i in range(5)]
    q.send_message("slow")
    first = next(iter(q.receive_messages(visibility_timeout=1)))
    deadline = time.monotonic() + 30
    while True:  # the lease lapses; another consumer takes the message
        again = list(q.receive_messages(visibility_timeout=60))
        if again:
            break
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert again[0].id == first.id and again[0].dequeue_count == 2
    for stale in (lambda: q.delete_message(first),
                  lambda: q.update_message(first, visibility_timeout=10)):
        with pytest.raises(HttpResponseError) as err:
            stale()
        assert code(err) == "PopReceiptMismatch" and err.value.status_code == 400
    with pytest.raises(HttpResponseError) as err:  # a receipt of another message
        q.delete_message(str(int(again[0].id) + 1), again[0].pop_receipt)
    assert code(err) == "PopReceiptMismatch"
    q.delete_message(again[0])


def test_put_message_pop_receipt_settles_until_a_receive(service: Service) -> None:
    """Put Message answers a pop receipt that updates or deletes the message before any
    receive (Azure's rule); a receive's receipt supersedes it, an update answers a new one."""
    q = service.create_queue("put-receipts")
    before = datetime.now(timezone.utc) - timedelta(seconds=5)
    hidden = q.send_message("hidden", visibility_timeout=3600)
    assert hidden.pop_receipt and hidden.next_visible_on > before + timedelta(seconds=3000)
    assert list(q.receive_messages(visibility_timeout=60)) == []
    shown = q.update_message(hidden, content="shown", visibility_timeout=0)  # visible now
    assert shown.pop_receipt and shown.pop_receipt != hidden.pop_receipt
    with pytest.raises(HttpResponseError) as err:  # the update's receipt replaces the put's
        q.delete_message(hidden)
    assert code(err) == "PopReceiptMismatch"
    got = list(q.receive_messages(visibility_timeout=60))
    assert [(m.id, m.content, m.dequeue_count) for m in got] == [(hidden.id, "shown", 1)]
    for stale in (lambda: q.delete_message(hidden.id, shown.pop_receipt),
                  lambda: q.update_message(hidden.id, shown.pop_receipt, visibility_timeout=0)):
        with pytest.raises(HttpResponseError) as err:  # the receive's receipt supersedes it
            stale()
        assert code(err) == "PopReceiptMismatch"
    q.delete_message(got[0])
    sent = q.send_message("gone before a receive")
    assert sent.next_visible_on <= datetime.now(timezone.utc) + timedelta(seconds=5)
    q.delete_message(sent)
    assert q.get_queue_properties().approximate_message_count == 0


def test_update_message_answers_a_new_pop_receipt(service: Service) -> None:
    q = service.create_queue("new-receipts")
    q.send_message("work")
    m = next(iter(q.receive_messages(visibility_timeout=60)))
    first = q.update_message(m, visibility_timeout=60)
    second = q.update_message(m.id, first.pop_receipt, content="more", visibility_timeout=60)
    assert len({m.pop_receipt, first.pop_receipt, second.pop_receipt}) == 3
    for old in (m.pop_receipt, first.pop_receipt):
        with pytest.raises(HttpResponseError) as err:
            q.update_message(m.id, old, visibility_timeout=60)
        assert code(err) == "PopReceiptMismatch"
    assert list(q.receive_messages(visibility_timeout=60)) == []  # still leased
    q.delete_message(m.id, second.pop_receipt)
    assert q.get_queue_properties().approximate_message_count == 0


def test_a_puts_receipt_holds_no_in_flight_slot(service: Service, clean: str) -> None:
    """A message no receive has taken is not in flight, whatever its put's receipt does to
    its visibility: in_flight_limit still lets exactly its number of leases out."""
    q = service.create_queue("limited")
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute("SELECT queue_pg.alter_queue('limited', in_flight_limit => 1)")
    put = [q.send_message(f"m{i}", visibility_timeout=3600) for i in range(3)]
    for p in put:  # delayed -> visible -> hidden: never a lease
        receipt = p.pop_receipt
        for vt in (0, 3600):
            receipt = q.update_message(p.id, receipt, visibility_timeout=vt).pop_receipt
    with psycopg.connect(clean, autocommit=True) as c:  # the counter the receives trust
        row = c.execute("SELECT f.n FROM queue_pg.in_flight f JOIN queue_pg.queues q"
                        " ON q.id = f.queue_id WHERE q.name = 'limited'").fetchone()
    assert row == (0,)
    q.send_message("free")
    got = q.receive_message(visibility_timeout=60)
    assert got is not None and got.content == "free"
    with pytest.raises(HttpResponseError) as err:  # the one slot is the receive's
        q.receive_message(visibility_timeout=60)
    assert code(err) == "ServerBusy"


# --- authentication and authorization -----------------------------------------------------------

def test_sas_tokens(make_service: MakeService, endpoint: str) -> None:
    service, account, key = make_service()
    service.create_queue("sas-a").send_message("for a")
    service.create_queue("sas-b").send_message("for b")
    soon = datetime.now(timezone.utc) + timedelta(minutes=10)
    token = generate_queue_sas(account, "sas-a", key,
                               permission=QueueSasPermissions(read=True, process=True), expiry=soon)
    base = f"{endpoint}/{account}"
    a = azq.QueueClient(base, "sas-a", credential=token, retry_total=0)
    assert [m.content for m in a.peek_messages()] == ["for a"]
    got = next(iter(a.receive_messages()))
    a.delete_message(got)
    with pytest.raises(HttpResponseError) as err:  # the SAS allows no add
        a.send_message("no")
    assert code(err) == "AuthorizationPermissionMismatch" and err.value.status_code == 403
    b = azq.QueueClient(base, "sas-b", credential=token, retry_total=0)
    with pytest.raises(HttpResponseError) as err:  # one queue's SAS on another queue
        b.peek_messages()
    assert code(err) == "AuthenticationFailed" and err.value.status_code == 403
    expired = generate_queue_sas(account, "sas-a", key, permission=QueueSasPermissions(read=True),
                                 start=soon - timedelta(hours=2),
                                 expiry=datetime.now(timezone.utc) - timedelta(seconds=1))
    tampered = token.replace("sp=rp", "sp=raup")
    assert tampered != token
    wrong_ip = generate_queue_sas(account, "sas-a", key, permission=QueueSasPermissions(read=True),
                                  expiry=soon, ip="10.1.2.3")
    https_only = generate_queue_sas(account, "sas-a", key, permission=QueueSasPermissions(read=True),
                                    expiry=soon, protocol="https")
    for bad, want in ((expired, "AuthenticationFailed"), (tampered, "AuthenticationFailed"),
                      (wrong_ip, "AuthorizationSourceIPMismatch"),
                      (https_only, "AuthorizationProtocolMismatch")):
        c = azq.QueueClient(base, "sas-a", credential=bad, retry_total=0)
        with pytest.raises(HttpResponseError) as err:
            c.send_message("no") if bad is tampered else c.peek_messages()
        assert code(err) == want and err.value.status_code == 403
    assert service.get_queue_client("sas-b").get_queue_properties().approximate_message_count == 1
    assert service.get_queue_client("sas-a").get_queue_properties().approximate_message_count == 0
    in_range = generate_queue_sas(account, "sas-a", key, permission=QueueSasPermissions(add=True),
                                  expiry=soon, ip="127.0.0.0-127.0.0.255")
    azq.QueueClient(base, "sas-a", credential=in_range, retry_total=0).send_message("via ip")
    # an account SAS: list and create with l and c, no delete without d
    acct = generate_account_sas(account, key, ResourceTypes(service=True, container=True),
                                AccountSasPermissions(list=True, create=True), expiry=soon)
    svc = QueueServiceClient(base, credential=acct, retry_total=0)
    svc.create_queue("sas-c")
    assert [x.name for x in svc.list_queues()] == ["sas-a", "sas-b", "sas-c"]
    with pytest.raises(HttpResponseError) as err:
        svc.delete_queue("sas-c")
    assert code(err) == "AuthorizationPermissionMismatch"
    for acl in (svc.get_queue_client("sas-c").get_queue_access_policy,
                lambda: svc.get_queue_client("sas-c").set_queue_access_policy({})):
        with pytest.raises(HttpResponseError) as err:  # ACLs: Shared Key only, as Azure
            acl()
        assert code(err) == "AuthorizationPermissionMismatch"
    service.get_queue_client("sas-c").set_queue_access_policy({})  # with the key: served
    assert service.get_queue_client("sas-c").get_queue_access_policy() == {}
    no_service = generate_account_sas(account, key, ResourceTypes(container=True),
                                      AccountSasPermissions(read=True, list=True), expiry=soon)
    with pytest.raises(HttpResponseError) as err:  # srt without s: no service-level calls
        list(QueueServiceClient(base, credential=no_service, retry_total=0).list_queues())
    assert code(err) == "AuthorizationResourceTypeMismatch"


def test_queue_acl_and_sas_naming_a_stored_policy(make_service: MakeService, endpoint: str,
                                                  clean: str) -> None:
    """Set / Get Queue ACL keep up to 5 stored access policies a queue; a SAS naming one (si)
    takes its start, expiry and permissions from it, so changing or removing the policy
    changes or revokes the token."""
    from azure.storage.queue import AccessPolicy

    service, account, key = make_service()
    q = service.create_queue("acl-q")
    q.send_message("m")
    now = datetime.now(timezone.utc).replace(microsecond=0)
    q.set_queue_access_policy({
        "readers": AccessPolicy(permission=QueueSasPermissions(read=True),
                                start=now - timedelta(minutes=5), expiry=now + timedelta(hours=1)),
        "open": AccessPolicy(permission=None, start=None, expiry=None)})
    got = q.get_queue_access_policy()
    assert set(got) == {"readers", "open"}
    assert got["readers"].permission == "r" and got["readers"].expiry == (
        now + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.0000000Z")  # Azure's format
    token = generate_queue_sas(account, "acl-q", key, policy_id="readers")
    reader = azq.QueueClient(f"{endpoint}/{account}", "acl-q", credential=token, retry_total=0)
    assert [m.content for m in reader.peek_messages()] == ["m"]
    with pytest.raises(HttpResponseError) as err:  # the policy allows read only
        reader.send_message("no")
    assert code(err) == "AuthorizationPermissionMismatch"
    both = generate_queue_sas(account, "acl-q", key, policy_id="readers",
                              permission=QueueSasPermissions(read=True))
    nothing = generate_queue_sas(account, "acl-q", key, policy_id="missing")
    for bad in (both, nothing):
        with pytest.raises(HttpResponseError) as err:
            azq.QueueClient(f"{endpoint}/{account}", "acl-q", credential=bad,
                            retry_total=0).peek_messages()
        assert code(err) == "AuthenticationFailed"
    too_many = {f"p{i}": AccessPolicy(permission="r", expiry=now + timedelta(hours=1))
                for i in range(6)}
    with pytest.raises(HttpResponseError) as err:
        q.set_queue_access_policy(too_many)
    assert err.value.status_code == 400
    with psycopg.connect(clean) as c, pytest.raises(psycopg.Error) as perr:
        c.execute("SELECT queue_pg.azure_set_acl('acl-q', '[{\"id\": \"x\","
                  " \"expiry\": \"2026-13-45T00:00:00Z\"}]')")
    assert perr.value.sqlstate == "QP003"
    assert set(q.get_queue_access_policy()) == {"readers", "open"}  # bad input changed nothing
    q.set_queue_access_policy({})  # removed: its tokens are revoked
    with pytest.raises(HttpResponseError) as err:
        reader.peek_messages()
    assert code(err) == "AuthenticationFailed"


def test_shared_key_headers_changed_in_transit_are_refused(service: Service) -> None:
    q = service.create_queue("signed", metadata={"owner": "alice"})
    seen: list[Any] = []
    q.set_queue_metadata({"owner": "alice"}, raw_response_hook=lambda r: seen.append(r.http_request))
    sent = seen[0]

    def replay(headers: dict[str, str]) -> int:
        req = urllib.request.Request(sent.url, method="PUT", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            assert exc.headers["x-ms-error-code"] == "AuthenticationFailed"
            return int(exc.code)

    headers = {k: v for k, v in sent.headers.items() if k.lower() != "content-length"}
    assert replay(headers) == 204  # the same request, as signed
    assert replay({**headers, "x-ms-meta-owner": "mallory"}) == 403
    assert replay({**headers, "x-ms-meta-extra": "1"}) == 403
    forged = {**headers, "Authorization": headers["Authorization"][:-4] + "AAA="}
    assert replay(forged) == 403
    old = (datetime.now(timezone.utc) - timedelta(minutes=20)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    assert replay({**headers, "x-ms-date": old}) == 403
    assert q.get_queue_properties().metadata == {"owner": "alice"}


def test_unsigned_and_unknown_accounts_are_refused(endpoint: str, clean: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as raw:
        urllib.request.urlopen(f"{endpoint}/nobody/q-1/messages?peekonly=true", timeout=30)
    assert raw.value.code == 403
    assert raw.value.headers["x-ms-error-code"] == "NoAuthenticationInformation"
    fake = base64.b64encode(b"k" * 64).decode()
    svc = QueueServiceClient.from_connection_string(_conn_str(endpoint, "nobody", fake), retry_total=0)
    with pytest.raises(HttpResponseError) as err:
        list(svc.list_queues())
    assert code(err) == "AuthenticationFailed"


def test_a_keys_role_gets_its_grants_only(
    service: Service, make_service: MakeService, make_role: MakeRole, clean: str  # noqa: F811
) -> None:
    service.create_queue("mine")
    service.create_queue("theirs").send_message("secret")
    worker = make_role("azworker", PRODUCER, CONSUMER)
    with psycopg.connect(clean, autocommit=True) as c:
        for p in ("send", "receive"):
            c.execute("SELECT queue_pg.grant('mine', %s, %s)", [worker.name, p])
    w = make_service(worker.name)[0]
    mine, theirs = w.get_queue_client("mine"), w.get_queue_client("theirs")
    mine.send_message("ok")
    got = next(iter(mine.receive_messages()))
    sender = make_role("azsender", PRODUCER)
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute("SELECT queue_pg.grant('mine', %s, 'send')", [sender.name])
    sent = make_service(sender.name)[0].get_queue_client("mine").send_message("put")
    assert sent.pop_receipt  # a put's receipt: settling with it needs 'receive' (as any receipt)
    for call in (lambda: make_service(sender.name)[0].get_queue_client("mine").delete_message(sent),
                 lambda: make_service(sender.name)[0].get_queue_client("mine").update_message(
                     sent, visibility_timeout=0)):
        with pytest.raises(HttpResponseError) as err:
            call()
        assert code(err) == "AuthorizationPermissionMismatch"
    mine.delete_message(sent)
    mine.delete_message(got)
    assert mine.get_queue_properties().approximate_message_count == 0
    for call in (lambda: theirs.send_message("no"), lambda: list(theirs.receive_messages()),
                 theirs.peek_messages, theirs.clear_messages, theirs.get_queue_properties,
                 lambda: mine.set_queue_metadata({"a": "b"}), mine.delete_queue,
                 lambda: w.create_queue("new-one"), lambda: w.delete_queue("theirs")):
        with pytest.raises(HttpResponseError) as err:
            call()
        assert code(err) == "AuthorizationPermissionMismatch" and err.value.status_code == 403
    # listing names is open (as queue_pg.list_queues); metadata only of queues it may see
    service.get_queue_client("theirs").set_queue_metadata({"private": "yes"})
    listed = {x.name: x.metadata for x in w.list_queues(include_metadata=True)}
    assert listed == {"mine": {}, "theirs": {}}
    assert service.get_queue_client("theirs").get_queue_properties().approximate_message_count == 1


def test_cli_serves_and_manages_keys(clean: str) -> None:
    """`queue-pg azure key create`, `queue-pg azure --port --account`, `key revoke`."""
    import os
    import subprocess
    import sys

    from bench.sqs_suite import free_port

    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    cli_cmd = [sys.executable, "-c", "from queue_pg.ops.cli import main; main()"]

    def cli(*args: str) -> str:
        done = subprocess.run([*cli_cmd, "--dsn", clean, "azure", *args],
                              capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    with psycopg.connect(clean) as c:
        owner = str(c.execute("SELECT current_user").fetchone()[0])  # type: ignore[index]
    account = f"cli{uuid.uuid4().hex[:8]}"
    lines = dict(line.split() for line in cli("key", "create", owner, "--account", account).splitlines())
    assert lines["AccountName"] == account and len(base64.b64decode(lines["AccountKey"])) == 64
    port = free_port()
    proc = subprocess.Popen([*cli_cmd, "--dsn", clean, "azure", "--port", str(port),
                             "--account", account], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        svc = QueueServiceClient.from_connection_string(
            _conn_str(f"http://127.0.0.1:{port}", account, lines["AccountKey"]), retry_total=0)
        deadline = time.monotonic() + 60
        while True:
            try:
                q = svc.create_queue("cli-queue")
                break
            except Exception:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the endpoint did not answer"
                time.sleep(0.2)
        q.send_message("via cli")
        assert [m.content for m in q.receive_messages()] == ["via cli"]
        assert "revoked" in cli("key", "revoke", account)
        with pytest.raises(HttpResponseError) as err:
            list(svc.list_queues())
        assert code(err) == "AuthenticationFailed"
    finally:
        proc.terminate()
        proc.wait(30)


def test_keys_are_the_owners_to_read(make_role: MakeRole, clean: str) -> None:  # noqa: F811
    admin = make_role("azadmin", "queue_pg_admin")
    with psycopg.connect(admin.dsn, autocommit=True) as c:
        with pytest.raises(psycopg.Error):
            c.execute("SELECT * FROM queue_pg.azure_key('anything')")
        with pytest.raises(psycopg.Error):
            c.execute("SELECT * FROM queue_pg.azure_keys")
        with pytest.raises(psycopg.Error):  # not for a role above its own
            create_azure_key(c, "postgres")


def test_shared_key_lite(make_service: MakeService, endpoint: str) -> None:
    """A Shared Key Lite request, signed here from Azure's documented string to sign."""
    import hashlib
    import hmac
    from email.utils import formatdate

    service, account, key = make_service()
    service.create_queue("lite-q")

    def get(path: str, query: str, sign_path: str, date: str | None = None) -> int:
        date = date or formatdate(usegmt=True)
        text = (f"GET\n\n\n\nx-ms-date:{date}\nx-ms-version:2019-02-02\n"
                f"/{account}{sign_path}")
        sig = base64.b64encode(hmac.new(base64.b64decode(key), text.encode(), hashlib.sha256).digest()).decode()
        req = urllib.request.Request(f"{endpoint}{path}?{query}", headers={
            "x-ms-date": date, "x-ms-version": "2019-02-02",
            "Authorization": f"SharedKeyLite {account}:{sig}"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                assert b"<Name>lite-q</Name>" in resp.read()
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    assert get(f"/{account}", "comp=list", f"/{account}?comp=list") == 200
    assert get(f"/{account}", "comp=list&prefix=lite", f"/{account}?comp=list") == 200  # Lite signs comp only
    assert get(f"/{account}", "comp=list", f"/{account}/other?comp=list") == 403


def test_no_auth_for_local_development(dsn: str, clean: str) -> None:
    with serve(create_app(clean, auth=False)) as url:
        fake = base64.b64encode(b"any key" * 8).decode()
        svc = QueueServiceClient.from_connection_string(_conn_str(url, "devstoreaccount1", fake),
                                                        retry_total=0)
        q = svc.create_queue("dev-q")
        q.send_message("unsigned is fine here")
        assert [m.content for m in q.peek_messages()] == ["unsigned is fine here"]
        with pytest.raises(urllib.error.HTTPError) as raw:  # the path still names an account
            urllib.request.urlopen(f"{url}/", timeout=30)
        assert raw.value.headers["x-ms-error-code"] == "InvalidUri"


def test_concurrent_consumers_take_each_message_once(service: Service) -> None:
    """Six SDK consumers on one queue through the endpoint: every message is received and
    deleted once (leases are long: no redelivery is expected)."""
    import threading

    q = service.create_queue("many")
    for i in range(60):
        q.send_message(f"m{i}")
    taken: list[str] = []
    lock = threading.Lock()
    failures: list[BaseException] = []

    def consume() -> None:
        try:
            while True:
                batch = list(q.receive_messages(max_messages=4, visibility_timeout=300))
                if not batch:
                    return
                for m in batch:
                    q.delete_message(m)
                    with lock:
                        taken.append(m.content)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=consume) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures
    assert sorted(taken) == sorted(f"m{i}" for i in range(60))


# --- service properties, statistics, the secondary endpoint -------------------------------------

def test_service_properties_are_kept_by_account(
    make_service: MakeService, make_role: MakeRole, endpoint: str, clean: str  # noqa: F811
) -> None:
    """Set Queue Service Properties keeps what the SDK sets, element by element (an element not
    given stays), for its account only; bad values are refused and change nothing."""
    from azure.storage.queue import CorsRule, Metrics, QueueAnalyticsLogging, RetentionPolicy

    service, account, _ = make_service()
    assert service.get_service_properties()["cors"] == []  # Azure's defaults
    rule = CorsRule(["example.com"], ["GET", "PUT"], max_age_in_seconds=600,
                    allowed_headers=["x-ms-meta-*"], exposed_headers=[])
    hour = Metrics(enabled=True, include_apis=True,
                   retention_policy=RetentionPolicy(enabled=True, days=3))
    service.set_service_properties(analytics_logging=QueueAnalyticsLogging(
        read=True, write=True, delete=False, retention_policy=RetentionPolicy(enabled=True, days=5)),
        hour_metrics=hour, cors=[rule])
    service.set_service_properties(minute_metrics=Metrics(enabled=False))  # the others stay
    got = service.get_service_properties()
    assert (got["hour_metrics"].enabled, got["hour_metrics"].retention_policy.days) == (True, 3)
    assert got["analytics_logging"].read and not got["analytics_logging"].delete
    assert got["analytics_logging"].retention_policy.days == 5
    assert [(c.allowed_origins, c.allowed_methods, c.max_age_in_seconds) for c in got["cors"]] == [
        ("example.com", "GET,PUT", 600)]
    with pytest.raises(HttpResponseError) as err:  # six CORS rules: Azure's limit is five
        service.set_service_properties(cors=[rule] * 6)
    assert err.value.status_code == 400
    with pytest.raises(HttpResponseError):  # retention of 400 days: 1 to 365
        service.set_service_properties(hour_metrics=Metrics(
            enabled=True, include_apis=True, retention_policy=RetentionPolicy(enabled=True, days=400)))
    assert len(service.get_service_properties()["cors"]) == 1
    other_role = make_role("azprops", PRODUCER)
    other = make_service(other_role.name)[0]
    assert other.get_service_properties()["cors"] == []  # another account: its own
    with other_role.connect() as c, pytest.raises(psycopg.Error, match="holds no live key"):
        c.execute("SELECT queue_pg.azure_set_service_properties(%s, '{}')", [account])


def test_statistics_and_the_read_only_secondary_endpoint(make_service: MakeService,
                                                         endpoint: str) -> None:
    """Get Queue Service Stats answers on the secondary endpoint only (a single-region service:
    replication live, in sync now); the secondary reads the primary and refuses writes."""
    # the Python SDK sends Get Service Stats to the secondary host: here, the same host, so
    # the path names the location (ACCOUNT or ACCOUNT-secondary)
    host = endpoint.removeprefix("http://")
    service, account, key = make_service(secondary_hostname=host)
    with pytest.raises(HttpResponseError) as err:
        service.get_service_stats()
    assert code(err) == "InvalidQueryParameterValue" and err.value.status_code == 400
    service.create_queue("prim-q").send_message("on the primary")
    secondary = QueueServiceClient(f"{endpoint}/{account}-secondary", secondary_hostname=host,
                                   credential={"account_name": account, "account_key": key},
                                   retry_total=0)
    stats = secondary.get_service_stats()
    assert stats["geo_replication"]["status"] == "live"
    assert [q.name for q in secondary.list_queues()] == ["prim-q"]
    q = secondary.get_queue_client("prim-q")
    assert [m.content for m in q.peek_messages()] == ["on the primary"]
    for write in (lambda: q.send_message("no"), lambda: secondary.create_queue("sec-q"),
                  q.clear_messages, lambda: list(q.receive_messages())):
        with pytest.raises(HttpResponseError) as err:
            write()
        assert code(err) == "InsufficientAccountPermissions" and err.value.status_code == 403
    assert [m.content for m in service.get_queue_client("prim-q").peek_messages()] == [
        "on the primary"]
