"""The SQS endpoint through boto3 (botocore signs; our server verifies), against real PostgreSQL.

A real uvicorn server in a thread on a free port, per module; boto3 clients with endpoint_url
and access keys made by ``queue_pg.sqs_create_key``.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

pytest.importorskip("starlette")
uvicorn = pytest.importorskip("uvicorn")
boto3 = pytest.importorskip("boto3")

from botocore.config import Config  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402

from bench.sqs_suite import free_port as _free_port  # noqa: E402
from bench.sqs_suite import serve  # noqa: E402
from queue_pg.endpoint_keys import EndpointKey  # noqa: E402
from queue_pg.sealing import Keyring, create_sqs_key  # noqa: E402
from queue_pg.sqs import create_app  # noqa: E402
from tests.procs import ended  # noqa: E402
from tests.test_access import CONSUMER, PRODUCER, MakeRole, make_role  # noqa: E402, F401

Sqs = Any


@pytest.fixture(scope="module")
def endpoint(dsn: str) -> Iterator[str]:
    """The endpoint's URL, served by uvicorn in a thread for the module."""
    with serve(create_app(dsn)) as url:
        yield url


def _key(dsn: str, role: str) -> tuple[str, str]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return create_sqs_key(c, role)


def loan_key(dsn: str, role: str | None) -> EndpointKey | None:
    """A new SQS key of ``role`` as an endpoint keeps it, for a RolePool loan (None: none)."""
    if role is None:
        return None
    access, secret = _key(dsn, role)
    return EndpointKey("sqs", access, access, role, secret)


MakeSqs = Callable[..., Sqs]


@pytest.fixture
def make_sqs(clean: str, endpoint: str) -> MakeSqs:
    """``make_sqs(role=None, secret=None)``: a boto3 SQS client with a new key of ``role``
    (None: the test database's owner), signed with ``secret`` instead of the key's if given."""

    def make(role: str | None = None, secret: str | None = None) -> Sqs:
        if role is None:
            with psycopg.connect(clean) as c:
                role = str(c.execute("SELECT current_user").fetchone()[0])  # type: ignore[index]
        access, real = _key(clean, role)
        return boto3.client(
            "sqs", endpoint_url=endpoint, region_name="us-east-1",
            aws_access_key_id=access, aws_secret_access_key=secret or real,
            config=Config(retries={"max_attempts": 1}, read_timeout=60),
        )

    return make


@pytest.fixture
def sqs(make_sqs: MakeSqs) -> Sqs:
    return make_sqs()


def code(err: pytest.ExceptionInfo[ClientError]) -> str:
    return str(err.value.response["Error"]["Code"])


def status(err: pytest.ExceptionInfo[ClientError]) -> int:
    return int(err.value.response["ResponseMetadata"]["HTTPStatusCode"])


# --- queues -------------------------------------------------------------------------------------

def test_queue_lifecycle(sqs: Sqs, endpoint: str) -> None:
    url = sqs.create_queue(QueueName="jobs", Attributes={"VisibilityTimeout": "45",
                                                          "DelaySeconds": "0"})["QueueUrl"]
    assert url == f"{endpoint}/000000000000/jobs"
    assert sqs.create_queue(QueueName="jobs", Attributes={"VisibilityTimeout": "45"})["QueueUrl"] == url
    assert sqs.get_queue_url(QueueName="jobs")["QueueUrl"] == url
    sqs.create_queue(QueueName="jobs-b")
    sqs.create_queue(QueueName="other")
    assert sqs.list_queues(QueueNamePrefix="jobs")["QueueUrls"] == [url, url + "-b"]
    page = sqs.list_queues(MaxResults=2)
    assert len(page["QueueUrls"]) == 2 and "NextToken" in page
    rest = sqs.list_queues(MaxResults=2, NextToken=page["NextToken"])
    assert rest["QueueUrls"] == [f"{endpoint}/000000000000/other"]

    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["VisibilityTimeout"] == "45"
    assert attrs["QueueArn"] == "arn:aws:sqs:us-east-1:000000000000:jobs"
    sqs.set_queue_attributes(QueueUrl=url, Attributes={
        "VisibilityTimeout": "12", "MessageRetentionPeriod": "600", "DelaySeconds": "1",
        "ReceiveMessageWaitTimeSeconds": "2", "MaximumMessageSize": "2048"})
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "VisibilityTimeout", "MessageRetentionPeriod", "DelaySeconds",
        "ReceiveMessageWaitTimeSeconds", "MaximumMessageSize"])["Attributes"]
    assert attrs == {"VisibilityTimeout": "12", "MessageRetentionPeriod": "600",
                     "DelaySeconds": "1", "ReceiveMessageWaitTimeSeconds": "2",
                     "MaximumMessageSize": "2048"}

    with pytest.raises(ClientError) as err:
        sqs.create_queue(QueueName="jobs", Attributes={"VisibilityTimeout": "99"})
    assert code(err) == "QueueAlreadyExists"
    with pytest.raises(ClientError) as err:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "-1"})
    assert code(err) == "InvalidAttributeValue" and status(err) == 400

    # tags: at creation, added, replaced, removed; SQS's limits
    tagged = sqs.create_queue(QueueName="tagged", tags={"team": "mail"})["QueueUrl"]
    assert sqs.list_queue_tags(QueueUrl=tagged)["Tags"] == {"team": "mail"}
    sqs.tag_queue(QueueUrl=tagged, Tags={"team": "billing", "env": "ci"})
    assert sqs.list_queue_tags(QueueUrl=tagged)["Tags"] == {"team": "billing", "env": "ci"}
    sqs.untag_queue(QueueUrl=tagged, TagKeys=["team", "absent"])
    assert sqs.list_queue_tags(QueueUrl=tagged)["Tags"] == {"env": "ci"}
    with pytest.raises(ClientError) as err:
        sqs.tag_queue(QueueUrl=tagged, Tags={f"k{i}": "v" for i in range(50)})
    assert code(err) == "InvalidParameterValue"
    with pytest.raises(ClientError) as err:
        sqs.tag_queue(QueueUrl=tagged, Tags={"long": "v" * 257})
    assert code(err) == "InvalidParameterValue"
    assert sqs.list_queue_tags(QueueUrl=tagged)["Tags"] == {"env": "ci"}

    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist) as gone:
        sqs.get_queue_url(QueueName="jobs")
    assert status(gone) == 400  # type: ignore[arg-type]


# --- messages -----------------------------------------------------------------------------------

def test_send_receive_delete_with_attributes_and_digests(sqs: Sqs) -> None:
    url = sqs.create_queue(QueueName="mail")["QueueUrl"]
    attrs = {"kind": {"DataType": "String", "StringValue": "welcome"},
             "n": {"DataType": "Number", "StringValue": "42"},
             "raw": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"}}
    body = 'hello "world" ✓'
    sent = sqs.send_message(QueueUrl=url, MessageBody=body, MessageAttributes=attrs)
    # boto3 itself checks both digests on send and on receive and raises when one differs
    assert sent["MD5OfMessageBody"] == hashlib.md5(body.encode()).hexdigest()
    assert "MD5OfMessageAttributes" in sent
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"],
                              AttributeNames=["All"])["Messages"]
    assert len(got) == 1 and got[0]["Body"] == body
    assert got[0]["MessageAttributes"] == attrs
    assert got[0]["Attributes"]["ApproximateReceiveCount"] == "1"
    assert int(got[0]["Attributes"]["SentTimestamp"]) > 0
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])  # a retry: fine
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0) or \
        sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)["Messages"] == []
    with pytest.raises(ClientError) as err:
        sqs.delete_message(QueueUrl=url, ReceiptHandle="not-a-receipt")
    assert code(err) == "ReceiptHandleIsInvalid"


def _receive(sqs: Sqs, url: str, **kw: Any) -> list[dict[str, Any]]:
    return list(sqs.receive_message(QueueUrl=url, **kw).get("Messages", []))


def test_visibility_delay_and_stale_receipts(sqs: Sqs) -> None:
    url = sqs.create_queue(QueueName="work", Attributes={"VisibilityTimeout": "30"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="a")
    sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=600)
    first = _receive(sqs, url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
    assert [m["Body"] for m in first] == ["a"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (attrs["ApproximateNumberOfMessages"], attrs["ApproximateNumberOfMessagesNotVisible"],
            attrs["ApproximateNumberOfMessagesDelayed"]) == ("0", "1", "1")
    # release the lease: visible again at once, and received with a new receipt
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first[0]["ReceiptHandle"],
                                  VisibilityTimeout=0)
    again = _receive(sqs, url, WaitTimeSeconds=0, AttributeNames=["ApproximateReceiveCount"])
    assert again[0]["Attributes"]["ApproximateReceiveCount"] == "2"
    # the first receipt is stale: its delete succeeds as in SQS but deletes nothing
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first[0]["ReceiptHandle"])
    attrs = sqs.get_queue_attributes(QueueUrl=url,
                                     AttributeNames=["ApproximateNumberOfMessagesNotVisible"])
    assert attrs["Attributes"]["ApproximateNumberOfMessagesNotVisible"] == "1"
    with pytest.raises(ClientError) as err:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first[0]["ReceiptHandle"],
                                      VisibilityTimeout=5)
    assert code(err) == "ReceiptHandleIsInvalid"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again[0]["ReceiptHandle"])
    assert sqs.purge_queue(QueueUrl=url)["ResponseMetadata"]["HTTPStatusCode"] == 200
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessagesDelayed"] == "0"


def test_long_poll_returns_when_a_message_arrives(sqs: Sqs, make_sqs: MakeSqs) -> None:
    url = sqs.create_queue(QueueName="poll")["QueueUrl"]
    other = make_sqs()
    got: list[list[dict[str, Any]]] = []
    waiter = threading.Thread(target=lambda: got.append(_receive(sqs, url, WaitTimeSeconds=20)))
    waiter.start()
    time.sleep(0.5)
    other.send_message(QueueUrl=url, MessageBody="wake up")
    waiter.join(30)
    assert [m["Body"] for m in got[0]] == ["wake up"]
    # an empty long poll returns empty (its length is not asserted: the machine is shared)
    assert _receive(sqs, url, WaitTimeSeconds=1) == []
    # without WaitTimeSeconds the queue's ReceiveMessageWaitTimeSeconds applies
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"ReceiveMessageWaitTimeSeconds": "20"})
    got.clear()
    waiter = threading.Thread(target=lambda: got.append(_receive(sqs, url)))
    waiter.start()
    time.sleep(0.5)
    other.send_message(QueueUrl=url, MessageBody="by default")
    waiter.join(30)
    assert [m["Body"] for m in got[0]] == ["by default"]


def test_batches_with_partial_failures(sqs: Sqs) -> None:
    url = sqs.create_queue(QueueName="bulk", Attributes={"MaximumMessageSize": "1024"})["QueueUrl"]
    out = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "a", "MessageBody": "one",
         "MessageAttributes": {"k": {"DataType": "String", "StringValue": "v"}}},
        {"Id": "big", "MessageBody": "x" * 5000},
        {"Id": "b", "MessageBody": "two", "DelaySeconds": 0},
    ])
    assert sorted(e["Id"] for e in out["Successful"]) == ["a", "b"]
    assert [(f["Id"], f["Code"], f["SenderFault"]) for f in out["Failed"]] == [
        ("big", "InvalidParameterValue", True)]
    got = _receive(sqs, url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
    assert sorted(m["Body"] for m in got) == ["one", "two"]
    changed = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": "x", "ReceiptHandle": got[0]["ReceiptHandle"], "VisibilityTimeout": 60},
        {"Id": "y", "ReceiptHandle": "garbage", "VisibilityTimeout": 60},
    ])
    assert [e["Id"] for e in changed["Successful"]] == ["x"]
    assert [(f["Id"], f["Code"]) for f in changed["Failed"]] == [("y", "ReceiptHandleIsInvalid")]
    deleted = sqs.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": "1", "ReceiptHandle": got[0]["ReceiptHandle"]},
        {"Id": "2", "ReceiptHandle": got[1]["ReceiptHandle"]},
        {"Id": "3", "ReceiptHandle": "garbage"},
    ])
    assert sorted(e["Id"] for e in deleted["Successful"]) == ["1", "2"]
    assert [f["Id"] for f in deleted["Failed"]] == ["3"]
    # a batch that is all good is one statement; one with a bad entry goes entry by entry
    good = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": str(i), "MessageBody": f"m{i}",
         "MessageAttributes": {"i": {"DataType": "Number", "StringValue": str(i)}}}
        for i in range(10)])
    assert len(good["Successful"]) == 10 and good.get("Failed", []) == []
    got = _receive(sqs, url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                   MessageAttributeNames=["All"])
    assert len(got) == 10
    assert {m["Body"]: m["MessageAttributes"]["i"]["StringValue"] for m in got} == {
        f"m{i}": str(i) for i in range(10)}
    twice = sqs.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": "a", "ReceiptHandle": got[0]["ReceiptHandle"]},
        {"Id": "b", "ReceiptHandle": got[0]["ReceiptHandle"]}])
    assert sorted(e["Id"] for e in twice["Successful"]) == ["a", "b"]
    with pytest.raises(ClientError) as err:
        sqs.send_message_batch(QueueUrl=url, Entries=[
            {"Id": str(i), "MessageBody": "m"} for i in range(11)])
    assert code(err) == "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
    with pytest.raises(ClientError) as err:
        sqs.delete_message_batch(QueueUrl=url, Entries=[
            {"Id": "same", "ReceiptHandle": "r"}, {"Id": "same", "ReceiptHandle": "r"}])
    assert code(err) == "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"


def test_dead_letter_after_max_receive_count(sqs: Sqs) -> None:
    dlq = sqs.create_queue(QueueName="orders-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2})
    url = sqs.create_queue(QueueName="orders", Attributes={"RedrivePolicy": policy})["QueueUrl"]
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])
    assert json.loads(got["Attributes"]["RedrivePolicy"]) == json.loads(policy)
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [url]
    sqs.send_message(QueueUrl=url, MessageBody="poison")
    for _ in range(2):
        (m,) = _receive(sqs, url, WaitTimeSeconds=0)
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"],
                                      VisibilityTimeout=0)
    assert _receive(sqs, url, WaitTimeSeconds=0) == []
    assert [m["Body"] for m in _receive(sqs, dlq, WaitTimeSeconds=0)] == ["poison"]
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": ""})
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == []


def test_redrive_allow_policy_decides_who_may_dead_letter_into_a_queue(sqs: Sqs) -> None:
    dlq = sqs.create_queue(QueueName="allow-dlq")["QueueUrl"]
    arn_of = lambda url: sqs.get_queue_attributes(  # noqa: E731
        QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    dlq_arn = arn_of(dlq)
    assert "RedriveAllowPolicy" not in sqs.get_queue_attributes(
        QueueUrl=dlq, AttributeNames=["All"])["Attributes"]  # allowAll: not shown, as in SQS
    allowed = json.dumps({"redrivePermission": "byQueue",
                          "sourceQueueArns": [dlq_arn.replace("allow-dlq", "allow-a")]})
    sqs.set_queue_attributes(QueueUrl=dlq, Attributes={"RedriveAllowPolicy": allowed})
    got = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["RedriveAllowPolicy"])
    assert json.loads(got["Attributes"]["RedriveAllowPolicy"]) == json.loads(allowed)
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 3})
    sqs.create_queue(QueueName="allow-a", Attributes={"RedrivePolicy": policy})
    with pytest.raises(ClientError) as refused:
        sqs.create_queue(QueueName="allow-b", Attributes={"RedrivePolicy": policy})
    assert code(refused) == "InvalidParameterValue" and status(refused) == 400
    b = sqs.create_queue(QueueName="allow-b")["QueueUrl"]
    with pytest.raises(ClientError) as refused:
        sqs.set_queue_attributes(QueueUrl=b, Attributes={"RedrivePolicy": policy})
    assert code(refused) == "InvalidParameterValue"
    sqs.set_queue_attributes(QueueUrl=dlq, Attributes={
        "RedriveAllowPolicy": json.dumps({"redrivePermission": "denyAll"})})
    with pytest.raises(ClientError):
        sqs.set_queue_attributes(QueueUrl=b, Attributes={"RedrivePolicy": policy})
    sqs.set_queue_attributes(QueueUrl=dlq, Attributes={
        "RedriveAllowPolicy": json.dumps({"redrivePermission": "allowAll"})})
    sqs.set_queue_attributes(QueueUrl=b, Attributes={"RedrivePolicy": policy})
    sources = sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"]
    assert [u.rsplit("/", 1)[1] for u in sources] == ["allow-a", "allow-b"]
    for bad in ("{}", '{"redrivePermission": "byQueue"}', "[1]",
                '{"redrivePermission": "byQueue", "sourceQueueArns": ["nope"]}'):
        with pytest.raises(ClientError) as refused:
            sqs.set_queue_attributes(QueueUrl=dlq, Attributes={"RedriveAllowPolicy": bad})
        assert code(refused) in ("InvalidAttributeValue", "InvalidParameterValue"), bad


def test_fifo_groups_and_dedup(sqs: Sqs, endpoint: str) -> None:
    url = sqs.create_queue(QueueName="seq.fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "false"})["QueueUrl"]
    assert url == f"{endpoint}/000000000000/seq.fifo"
    assert sqs.get_queue_url(QueueName="seq.fifo")["QueueUrl"] == url
    first = sqs.send_message(QueueUrl=url, MessageBody="1", MessageGroupId="g",
                             MessageDeduplicationId="d1")
    dup = sqs.send_message(QueueUrl=url, MessageBody="1 again", MessageGroupId="g",
                           MessageDeduplicationId="d1")
    assert dup["MessageId"] == first["MessageId"]
    sqs.send_message(QueueUrl=url, MessageBody="2", MessageGroupId="g",
                     MessageDeduplicationId="d2")
    with pytest.raises(ClientError) as err:
        sqs.send_message(QueueUrl=url, MessageBody="no group", MessageDeduplicationId="d3")
    assert code(err) == "MissingParameter"
    # a group in send order (several in one receive: test_a_fifo_receive_takes_a_group_together)
    (m,) = _receive(sqs, url, MaxNumberOfMessages=1, WaitTimeSeconds=0)
    assert m["Body"] == "1"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    (m2,) = _receive(sqs, url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                     MessageSystemAttributeNames=["MessageGroupId", "ApproximateReceiveCount"])
    assert m2["Body"] == "2"
    assert m2["Attributes"] == {"MessageGroupId": "g", "ApproximateReceiveCount": "1"}
    with pytest.raises(ClientError) as err:
        sqs.create_queue(QueueName="plain.fifo")
    assert code(err) == "InvalidParameterValue"
    # a FIFO dead-letter queue's ARN keeps its .fifo
    dlq = sqs.create_queue(QueueName="seq-dlq.fifo", Attributes={"FifoQueue": "true"})
    arn = sqs.get_queue_attributes(QueueUrl=dlq["QueueUrl"], AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    assert arn.endswith(":seq-dlq.fifo")
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": json.dumps(
        {"deadLetterTargetArn": arn, "maxReceiveCount": 3})})
    policy = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])
    assert json.loads(policy["Attributes"]["RedrivePolicy"])["deadLetterTargetArn"] == arn



def _dead_lettered(sqs: Sqs, prefix: str, bodies: list[str]) -> tuple[str, str, str]:
    """(source URL, dead-letter queue URL, its ARN) with ``bodies`` dead-lettered."""
    dlq = sqs.create_queue(QueueName=f"{prefix}-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1})
    url = sqs.create_queue(QueueName=prefix, Attributes={"RedrivePolicy": policy})["QueueUrl"]
    for body in bodies:
        sqs.send_message(QueueUrl=url, MessageBody=body)
    receipts: dict[str, str] = {}
    while len(receipts) < len(bodies):  # each received once, on a lease long enough
        receipts |= {m["Body"]: m["ReceiptHandle"] for m in _receive(
            sqs, url, MaxNumberOfMessages=10, WaitTimeSeconds=0, VisibilityTimeout=60)}
    for receipt in receipts.values():  # released: the next receive dead-letters them
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=receipt, VisibilityTimeout=0)
    assert _receive(sqs, url, MaxNumberOfMessages=10, WaitTimeSeconds=0) == []
    return url, dlq, dlq_arn


def test_message_move_task_back_to_the_source(sqs: Sqs) -> None:
    url, dlq, dlq_arn = _dead_lettered(sqs, "jobs", ["a", "b", "c"])
    handle = sqs.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    assert isinstance(handle, str) and handle
    # no rate: the first step, inside the start, moves them all
    (task,) = sqs.list_message_move_tasks(SourceArn=dlq_arn, MaxResults=10)["Results"]
    assert task["Status"] == "COMPLETED"
    assert task["SourceArn"] == dlq_arn
    assert task["ApproximateNumberOfMessagesMoved"] == 3
    assert task["ApproximateNumberOfMessagesToMove"] == 3
    assert "TaskHandle" not in task and "DestinationArn" not in task
    bodies = sorted(m["Body"] for m in _receive(sqs, url, MaxNumberOfMessages=10,
                                                 WaitTimeSeconds=0))
    assert bodies == ["a", "b", "c"]
    assert _receive(sqs, dlq, WaitTimeSeconds=0) == []


def test_message_move_task_rate_destination_and_cancel(sqs: Sqs) -> None:
    _url, _dlq, dlq_arn = _dead_lettered(sqs, "mails", [str(i) for i in range(20)])
    other = sqs.create_queue(QueueName="mails-retry")["QueueUrl"]
    other_arn = sqs.get_queue_attributes(QueueUrl=other, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    handle = sqs.start_message_move_task(SourceArn=dlq_arn, DestinationArn=other_arn,
                                         MaxNumberOfMessagesPerSecond=1)["TaskHandle"]
    (task,) = sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
    assert task["Status"] == "RUNNING"
    assert task["TaskHandle"] == handle
    assert task["DestinationArn"] == other_arn
    assert task["MaxNumberOfMessagesPerSecond"] == 1
    assert task["ApproximateNumberOfMessagesToMove"] == 20
    assert task["ApproximateNumberOfMessagesMoved"] < 20
    with pytest.raises(ClientError) as err:  # one running task per source
        sqs.start_message_move_task(SourceArn=dlq_arn)
    assert code(err) == "AWS.SimpleQueueService.UnsupportedOperation"
    with pytest.raises(ClientError) as err:
        sqs.start_message_move_task(SourceArn=dlq_arn, MaxNumberOfMessagesPerSecond=501)
    assert code(err) == "InvalidParameterValue"
    moved = sqs.cancel_message_move_task(TaskHandle=handle)["ApproximateNumberOfMessagesMoved"]
    assert 0 <= moved < 20
    (task,) = sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
    assert task["Status"] == "CANCELLED" and "TaskHandle" not in task
    with pytest.raises(ClientError) as err:
        sqs.cancel_message_move_task(TaskHandle="bm90IGEgdGFzaw==")
    assert code(err) == "ResourceNotFoundException" and status(err) == 404
    with pytest.raises(ClientError) as err:
        sqs.list_message_move_tasks(SourceArn=dlq_arn.replace("mails-dlq", "nope"))
    assert code(err) == "AWS.SimpleQueueService.NonExistentQueue"


def test_message_move_task_moves_at_its_rate(sqs: Sqs) -> None:
    """The endpoint steps running move tasks about once a second: a task of rate 5 moves about
    5 a second until done, never ahead of its rate, instead of a sweep's worth at a time."""
    _url, _dlq, dlq_arn = _dead_lettered(sqs, "paced", [str(i) for i in range(30)])
    start = time.monotonic()
    sqs.start_message_move_task(SourceArn=dlq_arn, MaxNumberOfMessagesPerSecond=5)
    seen: list[tuple[float, int]] = []  # (seconds since the start, moved)
    while True:
        (task,) = sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
        seen.append((time.monotonic() - start, task["ApproximateNumberOfMessagesMoved"]))
        if task["Status"] != "RUNNING":
            break
        assert seen[-1][0] < 30, f"no longer moving: {seen[-3:]}"  # a sweep's step is 60 s away
        time.sleep(0.2)
    assert task["Status"] == "COMPLETED" and seen[-1][1] == 30, seen
    # never ahead of the rate (the SQL's bound: rate x (seconds since its start + 1)) ...
    assert all(moved <= 5 * (t + 1) for t, moved in seen), seen
    # ... and in steps of about a second's worth, not in one burst
    counts = sorted({moved for _, moved in seen})
    assert len(counts) >= 4, seen
    assert max(b - a for a, b in itertools.pairwise(counts)) <= 15, seen


# --- authentication and grants ------------------------------------------------------------------

def test_unsigned_and_wrongly_signed_requests_are_refused(
    make_sqs: MakeSqs, endpoint: str, clean: str
) -> None:
    from botocore import UNSIGNED

    unsigned = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1",
                            config=Config(signature_version=UNSIGNED, retries={"max_attempts": 1}))
    with pytest.raises(ClientError) as err:
        unsigned.list_queues()
    assert code(err) == "MissingAuthenticationToken" and status(err) == 403
    wrong = make_sqs(secret="x" * 40)
    with pytest.raises(ClientError) as err:
        wrong.list_queues()
    assert code(err) == "SignatureDoesNotMatch" and status(err) == 403
    unknown = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1",
                           aws_access_key_id="AKQPUNKNOWNKEY00000", aws_secret_access_key="s" * 40,
                           config=Config(retries={"max_attempts": 1}))
    with pytest.raises(ClientError) as err:
        unknown.list_queues()
    assert code(err) == "InvalidClientTokenId"
    # a revoked key is refused from its next request on
    good = make_sqs()
    good.list_queues()
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute("SELECT queue_pg.sqs_revoke_key(%s)",
                  [good._request_signer._credentials.access_key])
    with pytest.raises(ClientError) as err:
        good.list_queues()
    assert code(err) == "InvalidClientTokenId"


MINE_ARN = "arn:aws:sqs:us-east-1:000000000000:mine"


def test_a_keys_role_gets_its_grants_only(
    sqs: Sqs, make_sqs: MakeSqs, make_role: MakeRole, clean: str  # noqa: F811
) -> None:
    mine = sqs.create_queue(QueueName="mine")["QueueUrl"]
    theirs = sqs.create_queue(QueueName="theirs")["QueueUrl"]
    worker = make_role("sqsworker", PRODUCER, CONSUMER)
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute("SELECT queue_pg.grant('mine', %s, 'send')", [worker.name])
        c.execute("SELECT queue_pg.grant('mine', %s, 'receive')", [worker.name])
    w = make_sqs(worker.name)
    w.send_message(QueueUrl=mine, MessageBody="ok")
    assert [m["Body"] for m in _receive(w, mine, WaitTimeSeconds=0)] == ["ok"]
    assert _receive(w, mine, WaitTimeSeconds=1) == []  # a long poll as the role: LISTEN too
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute("SELECT queue_pg.grant('mine', %s, 'manage')", [worker.name])
    w.tag_queue(QueueUrl=mine, Tags={"owner": "worker"})  # a manage grant lets it tag
    assert w.list_queue_tags(QueueUrl=mine)["Tags"] == {"owner": "worker"}
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute("SELECT queue_pg.revoke('mine', %s, 'manage')", [worker.name])
    # a role lists the queues it has a grant on (list_queues), not the others
    assert w.list_queues()["QueueUrls"] == [mine]
    for call in (lambda: w.send_message(QueueUrl=theirs, MessageBody="no"),
                 lambda: w.receive_message(QueueUrl=theirs, WaitTimeSeconds=0),
                 lambda: w.purge_queue(QueueUrl=mine),
                 lambda: w.tag_queue(QueueUrl=mine, Tags={"mine": "now"}),
                 lambda: w.list_queue_tags(QueueUrl=mine),
                 lambda: w.create_queue(QueueName="new"),
                 lambda: w.start_message_move_task(SourceArn=MINE_ARN),
                 lambda: w.list_message_move_tasks(SourceArn=MINE_ARN)):
        with pytest.raises(ClientError) as err:
            call()
        assert code(err) == "AccessDenied" and status(err) == 403
    with pytest.raises(ClientError) as err:  # the whole batch, as SQS does
        w.send_message_batch(QueueUrl=theirs, Entries=[{"Id": "1", "MessageBody": "no"}])
    assert code(err) == "AccessDenied"
    assert _receive(sqs, theirs, WaitTimeSeconds=0) == []
    # a key whose role was dropped is refused like an unknown one
    import uuid

    gone = f"qp_sqsgone_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute(f'CREATE ROLE "{gone}"')
    g = make_sqs(gone)
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute(f'DROP ROLE "{gone}"')
    with pytest.raises(ClientError) as err:
        g.list_queues()
    assert code(err) == "InvalidClientTokenId"


# --- the command line ---------------------------------------------------------------------------

def test_cli_serves_and_manages_keys(clean: str) -> None:
    """`queue-pg sqs key create`, `queue-pg sqs --port`, then `key revoke`: real processes."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    CLI = [sys.executable, "-c", "from queue_pg.ops.cli import main; main()"]

    def cli(*args: str) -> str:
        done = subprocess.run([*CLI, "--dsn", clean, "sqs", *args],
                              capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    with psycopg.connect(clean) as c:
        owner = str(c.execute("SELECT current_user").fetchone()[0])  # type: ignore[index]
    lines = dict(line.split() for line in cli("key", "create", owner).splitlines())
    port = _free_port()
    proc = subprocess.Popen(
        [*CLI, "--dsn", clean, "sqs", "--port", str(port), "--region", "eu-west-1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with ended(proc):
        sqs = boto3.client("sqs", endpoint_url=f"http://127.0.0.1:{port}", region_name="eu-west-1",
                           aws_access_key_id=lines["aws_access_key_id"],
                           aws_secret_access_key=lines["aws_secret_access_key"],
                           config=Config(retries={"max_attempts": 1}))
        deadline = time.monotonic() + 60
        while True:
            try:
                url = sqs.create_queue(QueueName="cli")["QueueUrl"]
                break
            except Exception:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the endpoint did not answer"
                time.sleep(0.2)
        sqs.send_message(QueueUrl=url, MessageBody="via cli")
        assert [m["Body"] for m in _receive(sqs, url, WaitTimeSeconds=1)] == ["via cli"]
        assert "revoked" in cli("key", "revoke", lines["aws_access_key_id"])
        with pytest.raises(ClientError) as err:
            sqs.list_queues()
        assert code(err) == "InvalidClientTokenId"


def test_oversized_requests_are_refused_before_reading(endpoint: str) -> None:
    """A declared length over the limit is answered before any of the body is read."""
    import http.client
    from urllib.parse import urlsplit

    from queue_pg.sqs.app import MAX_REQUEST_BYTES

    where = urlsplit(endpoint)
    conn = http.client.HTTPConnection(where.hostname or "", where.port, timeout=60)
    try:
        conn.putrequest("POST", "/")
        conn.putheader("X-Amz-Target", "AmazonSQS.ListQueues")
        conn.putheader("Content-Type", "application/x-amz-json-1.0")
        conn.putheader("Content-Length", str(MAX_REQUEST_BYTES + 1))
        conn.endheaders()
        response = conn.getresponse()
        assert response.status == 413
        assert json.loads(response.read())["__type"].endswith("#RequestEntityTooLarge")
    finally:
        conn.close()


def test_keys_an_admin_may_make_and_read(
    make_role: MakeRole, clean: str  # noqa: F811
) -> None:
    """A queue_pg_admin member makes keys for ordinary roles, not for the owner or a superuser,
    and reads no secret back (it could act as any key's role through the endpoint)."""
    from queue_pg import AccessDenied, InvalidParameter
    from queue_pg.errors import translate
    from tests.test_access import ADMIN

    admin = make_role("sqsadmin", ADMIN)
    worker = make_role("sqsplain", PRODUCER)
    with psycopg.connect(clean) as c:
        owner = str(c.execute("SELECT current_user").fetchone()[0])  # type: ignore[index]
    ring = Keyring.required()
    with admin.connect() as c:
        access, _secret = create_sqs_key(c, worker.name, ring)
        for role in (owner, "postgres"):
            with pytest.raises(AccessDenied), translate():
                create_sqs_key(c, role, ring)
        with pytest.raises(InvalidParameter), translate():
            create_sqs_key(c, "no_such_role_at_all", ring)
        with pytest.raises(AccessDenied), translate():
            c.execute("SELECT * FROM queue_pg.sqs_key(%s)", [access])
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("SELECT * FROM queue_pg.sqs_keys")
        assert c.execute("SELECT queue_pg.sqs_revoke_key(%s)", [access]).fetchone() == (True,)
    with worker.connect() as c, pytest.raises(psycopg.errors.InsufficientPrivilege):
        create_sqs_key(c, worker.name, ring)


@pytest.mark.slow
def test_the_aws_cli(make_sqs: MakeSqs, endpoint: str) -> None:
    """The AWS command line (its own botocore) against the endpoint, unchanged."""
    import os
    import shutil
    import subprocess

    aws = shutil.which("aws")
    if aws is None:
        pytest.skip("the AWS CLI (aws) is not installed")
    creds = make_sqs()._request_signer._credentials
    env = {**os.environ, "AWS_ACCESS_KEY_ID": creds.access_key,
           "AWS_SECRET_ACCESS_KEY": creds.secret_key, "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    env.pop("PYTHONPATH", None)

    def run(*args: str) -> Any:
        done = subprocess.run([aws, "--endpoint-url", endpoint, "--output", "json", "sqs", *args],
                              capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout) if done.stdout.strip() else None

    url = run("create-queue", "--queue-name", "cli-q")["QueueUrl"]
    run("send-message", "--queue-url", url, "--message-body", "from the cli",
        "--message-attributes", '{"k": {"DataType": "String", "StringValue": "v"}}')
    got = run("receive-message", "--queue-url", url, "--wait-time-seconds", "1",
              "--message-attribute-names", "All")
    (m,) = got["Messages"]
    assert m["Body"] == "from the cli" and m["MessageAttributes"]["k"]["StringValue"] == "v"
    run("delete-message", "--queue-url", url, "--receipt-handle", m["ReceiptHandle"])
    attrs = run("get-queue-attributes", "--queue-url", url, "--attribute-names", "All")
    assert attrs["Attributes"]["ApproximateNumberOfMessagesNotVisible"] == "0"
    run("delete-queue", "--queue-url", url)


@pytest.mark.slow
def test_celery_sqs_transport_end_to_end(make_sqs: MakeSqs, endpoint: str, tmp_path: Any) -> None:
    """An unchanged Celery app on its sqs:// transport: tasks run by a real worker process, and a
    killed worker's task runs again after the visibility timeout, in a new worker."""
    import os
    import signal
    import subprocess
    import sys
    from urllib.parse import quote

    pytest.importorskip("celery")
    pytest.importorskip("pycurl")  # kombu's SQS transport polls through it
    creds = make_sqs()._request_signer._credentials
    where = endpoint.removeprefix("http://")
    out = tmp_path / "runs.txt"
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "QP_SQS_OUT": str(out),
           "QP_SQS_BROKER": f"sqs://{quote(creds.access_key, safe='')}:"
                            f"{quote(creds.secret_key, safe='')}@{where}"}
    worker_cmd = [sys.executable, "-m", "celery", "-A", "tests.sqs_apps.celery_sqs", "worker",
                  "--pool", "solo", "--loglevel", "WARNING", "--without-heartbeat",
                  "--without-gossip", "--without-mingle"]

    def lines() -> list[str]:
        return out.read_text().splitlines() if out.exists() else []

    def wait_for(check: Callable[[], bool], what: str, seconds: float = 120) -> None:
        deadline = time.monotonic() + seconds
        while not check():
            assert time.monotonic() < deadline, f"{what}: {lines()}"
            time.sleep(0.2)

    send = subprocess.run(
        [sys.executable, "-c", "from tests.sqs_apps.celery_sqs import add, slow\n"
         "for i in range(5): add.delay(i, 100)\n" "slow.delay('x')"],
        env=env, capture_output=True, text=True, timeout=120)
    assert send.returncode == 0, send.stderr
    worker = subprocess.Popen(worker_cmd, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: "start x" in lines(), "the slow task never started")
        wait_for(lambda: sum(x.startswith("add") for x in lines()) == 5, "the adds never ran")
        assert sorted(x for x in lines() if x.startswith("add")) == [
            f"add {i + 100}" for i in range(5)]
        os.killpg(worker.pid, signal.SIGKILL)  # mid-task: the message stays leased
        worker.wait(30)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(30)
    again = subprocess.Popen(worker_cmd, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: "done x" in lines(), "the killed worker's task was not delivered again")
        assert lines().count("start x") == 2
    finally:
        os.killpg(again.pid, signal.SIGTERM)
        try:
            again.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(again.pid, signal.SIGKILL)
            again.wait(30)


def test_malformed_values_are_the_senders_fault(sqs: Sqs, endpoint: str) -> None:
    """Values boto3 would not send (it validates first), signed by botocore and sent raw."""
    import urllib.error
    import urllib.request

    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    url = sqs.create_queue(QueueName="raw")["QueueUrl"]
    creds = sqs._request_signer._credentials

    def call(action: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        req = AWSRequest("POST", endpoint + "/", data=json.dumps(params).encode(), headers={
            "X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"})
        SigV4Auth(creds, "sqs", "us-east-1").add_auth(req)
        prepared = req.prepare()
        raw = urllib.request.Request(prepared.url, data=prepared.body, method="POST",
                                     headers=dict(prepared.headers))
        try:
            with urllib.request.urlopen(raw, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    for action, params in [
        ("SendMessage", {"QueueUrl": url, "MessageBody": "x", "DelaySeconds": "soon"}),
        ("SetQueueAttributes", {"QueueUrl": url, "Attributes": {"VisibilityTimeout": 5}}),
        ("ReceiveMessage", {"QueueUrl": url, "MaxNumberOfMessages": 11}),
        ("ChangeMessageVisibility", {"QueueUrl": url, "ReceiptHandle": "r",
                                     "VisibilityTimeout": "x"}),
    ]:
        got = call(action, params)
        assert got[0] == 400 and got[1]["__type"].endswith("#InvalidParameterValue"), (action, got)
    assert call("NoSuchAction", {})[1]["__type"].endswith("#InvalidAction")
    assert call("ListQueues", {})[0] == 200


def test_query_protocol(sqs: Sqs, endpoint: str) -> None:
    """SQS's query protocol of older SDKs: form parameters signed by botocore, XML answers."""
    import urllib.error
    import urllib.request
    from urllib.parse import urlencode
    from xml.etree import ElementTree

    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    creds = sqs._request_signer._credentials
    ns = {"s": "http://queue.amazonaws.com/doc/2012-11-05/"}

    def call(params: dict[str, Any], path: str = "/") -> tuple[int, ElementTree.Element]:
        req = AWSRequest("POST", endpoint + path,
                         data=urlencode({"Version": "2012-11-05", **params}).encode(),
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        SigV4Auth(creds, "sqs", "us-east-1").add_auth(req)
        p = req.prepare()
        raw = urllib.request.Request(p.url, data=p.body, method="POST", headers=dict(p.headers))
        try:
            with urllib.request.urlopen(raw, timeout=60) as response:
                return response.status, ElementTree.fromstring(response.read())
        except urllib.error.HTTPError as err:
            return err.code, ElementTree.fromstring(err.read())

    status, x = call({"Action": "CreateQueue", "QueueName": "old-sdk",
                      "Attribute.1.Name": "VisibilityTimeout", "Attribute.1.Value": "40"})
    assert status == 200
    url = x.findtext("s:CreateQueueResult/s:QueueUrl", namespaces=ns)
    assert url == f"{endpoint}/000000000000/old-sdk"
    _, x = call({"Action": "GetQueueAttributes", "QueueUrl": url,
                 "AttributeName.1": "VisibilityTimeout"})
    assert [(a.findtext("s:Name", namespaces=ns), a.findtext("s:Value", namespaces=ns))
            for a in x.iterfind(".//s:Attribute", ns)] == [("VisibilityTimeout", "40")]
    _, x = call({"Action": "SendMessage", "MessageBody": "<b>&amp;</b>",
                 "MessageAttribute.1.Name": "k", "MessageAttribute.1.Value.DataType": "String",
                 "MessageAttribute.1.Value.StringValue": "v"}, path="/000000000000/old-sdk")
    assert x.findtext(".//s:MD5OfMessageBody", namespaces=ns) == hashlib.md5(
        b"<b>&amp;</b>").hexdigest()
    _, x = call({"Action": "SendMessageBatch", "QueueUrl": url,
                 "SendMessageBatchRequestEntry.1.Id": "a",
                 "SendMessageBatchRequestEntry.1.MessageBody": "second",
                 "SendMessageBatchRequestEntry.2.Id": "b",
                 "SendMessageBatchRequestEntry.2.MessageBody": "third"})
    assert [e.findtext("s:Id", namespaces=ns)
            for e in x.iterfind(".//s:SendMessageBatchResultEntry", ns)] == ["a", "b"]
    _, x = call({"Action": "ReceiveMessage", "QueueUrl": url, "MaxNumberOfMessages": "10",
                 "MessageAttributeName.1": "All", "AttributeName.1": "All"})
    messages = list(x.iterfind(".//s:Message", ns))
    assert sorted(m.findtext("s:Body", namespaces=ns) or "" for m in messages) == [
        "<b>&amp;</b>", "second", "third"]
    first = next(m for m in messages if m.findtext("s:Body", namespaces=ns) == "<b>&amp;</b>")
    assert first.findtext("s:MessageAttribute/s:Value/s:StringValue", namespaces=ns) == "v"
    handles = {f"DeleteMessageBatchRequestEntry.{i}.{k}": v for i, m in enumerate(messages, 1)
               for k, v in (("Id", f"e{i}"),
                            ("ReceiptHandle", m.findtext("s:ReceiptHandle", namespaces=ns)))}
    _, x = call({"Action": "DeleteMessageBatch", "QueueUrl": url, **handles})
    assert len(list(x.iterfind(".//s:DeleteMessageBatchResultEntry", ns))) == 3
    status, x = call({"Action": "GetQueueUrl", "QueueName": "absent"})
    assert status == 400
    assert x.findtext("s:Error/s:Code", namespaces=ns) == "AWS.SimpleQueueService.NonExistentQueue"
    _, x = call({"Action": "ListQueues", "QueueNamePrefix": "old"})
    assert [u.text for u in x.iterfind(".//s:QueueUrl", ns)] == [url]
    source = "arn:aws:sqs:us-east-1:000000000000:old-sdk"
    status, x = call({"Action": "StartMessageMoveTask", "SourceArn": source})
    assert status == 200 and x.findtext(".//s:TaskHandle", namespaces=ns)
    _, x = call({"Action": "ListMessageMoveTasks", "SourceArn": source})
    assert x.findtext(".//s:Status", namespaces=ns) == "COMPLETED"
    assert x.findtext(".//s:ApproximateNumberOfMessagesMoved", namespaces=ns) == "0"
    # AddPermission's lists and MessageSystemAttributes have query names of their own
    status, x = call({"Action": "AddPermission", "QueueUrl": url, "Label": "l",
                      "AWSAccountId.1": "111111111111", "ActionName.1": "SendMessage"})
    assert status == 200, ElementTree.tostring(x)
    _, x = call({"Action": "GetQueueAttributes", "QueueUrl": url, "AttributeName.1": "Policy"})
    policy = json.loads(x.findtext(".//s:Attribute/s:Value", namespaces=ns) or "{}")
    assert policy["Statement"][0]["Action"] == "SQS:SendMessage"
    _, x = call({"Action": "SendMessage", "QueueUrl": url, "MessageBody": "traced",
                 "MessageSystemAttribute.1.Name": "AWSTraceHeader",
                 "MessageSystemAttribute.1.Value.DataType": "String",
                 "MessageSystemAttribute.1.Value.StringValue": "Root=1-a"})
    _, x = call({"Action": "ReceiveMessage", "QueueUrl": url, "AttributeName.1": "All"})
    got = {a.findtext("s:Name", namespaces=ns): a.findtext("s:Value", namespaces=ns)
           for a in x.iterfind(".//s:Attribute", ns)}
    assert got["AWSTraceHeader"] == "Root=1-a"


def test_an_old_sdk_on_the_query_protocol(clean: str, endpoint: str) -> None:
    """boto 2, which speaks only the query protocol (form posts, XML answers) and signs with its
    own SigV4 code: the SDK an old application would still run."""
    connection = pytest.importorskip("boto.sqs.connection", reason="boto 2 (Python < 3.12)")
    regioninfo = pytest.importorskip("boto.sqs.regioninfo")
    with psycopg.connect(clean) as c:
        role = str(c.execute("SELECT current_user").fetchone()[0])  # type: ignore[index]
    access, secret = _key(clean, role)
    port = int(endpoint.rsplit(":", 1)[1])
    old = connection.SQSConnection(
        aws_access_key_id=access, aws_secret_access_key=secret, port=port, is_secure=False,
        region=regioninfo.SQSRegionInfo(name="us-east-1", endpoint="127.0.0.1"))
    q = old.create_queue("boto2", visibility_timeout=7)
    assert q.get_attributes()["VisibilityTimeout"] == "7"
    assert [x.name for x in old.get_all_queues(prefix="boto2")] == ["boto2"]
    q.write(q.new_message("hello"))
    [m] = q.get_messages(1, visibility_timeout=5, attributes="All", wait_time_seconds=1)
    assert (m.get_body(), m.attributes["ApproximateReceiveCount"]) == ("hello", "1")
    assert q.get_messages(1, wait_time_seconds=0) == []  # leased
    assert q.delete_message(m)
    assert q.count() == 0
    q.write_batch([("1", "one", 0), ("2", "two", 0)])
    got = q.get_messages(10, attributes="All", wait_time_seconds=1)
    assert sorted(x.get_body() for x in got) == ["one", "two"]
    result = q.delete_message_batch(got)
    assert len(result.results) == 2 and not result.errors
    bad = connection.SQSConnection(
        aws_access_key_id=access, aws_secret_access_key="wrong", port=port, is_secure=False,
        region=regioninfo.SQSRegionInfo(name="us-east-1", endpoint="127.0.0.1"))
    with pytest.raises(Exception, match="SignatureDoesNotMatch"):
        bad.get_all_queues()
    assert old.delete_queue(q)


def test_wait_time_out_of_range_is_refused_by_sql(sqs: Sqs) -> None:
    url = sqs.create_queue(QueueName="waits")["QueueUrl"]
    for wait in (21, -1):
        with pytest.raises(ClientError) as err:
            sqs.receive_message(QueueUrl=url, WaitTimeSeconds=wait)
        assert code(err) == "InvalidParameterValue" and status(err) == 400


def test_fifo_dedup_id_and_sequence_number(sqs: Sqs, clean: str) -> None:
    """Received FIFO messages carry MessageDeduplicationId (given, or the body's SHA-256) and a
    SequenceNumber that grows within a group and matches SendMessage's; asked for by name or All,
    absent when not asked for, and kept past the dedup window (it is the message's own)."""
    url = sqs.create_queue(QueueName="dd.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    cbd = sqs.create_queue(QueueName="cbd.fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]
    sent = [sqs.send_message(QueueUrl=url, MessageBody=f"m{i}", MessageGroupId="g",
                             MessageDeduplicationId=f"d{i}") for i in range(3)]
    batch = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "a", "MessageBody": "m3", "MessageGroupId": "g", "MessageDeduplicationId": "d3"},
        {"Id": "b", "MessageBody": "h0", "MessageGroupId": "h", "MessageDeduplicationId": "e0"},
    ])["Successful"]
    seqs = [s["SequenceNumber"] for s in sent] + [batch[0]["SequenceNumber"]]
    assert all(len(x) == 20 and x.isdigit() for x in seqs)
    assert seqs == sorted(seqs, key=int) and len(set(seqs)) == 4
    with psycopg.connect(clean, autocommit=True) as c:  # the window ends; the ids stay
        c.execute("UPDATE queue_pg.dedup SET expires_at = now() - interval '1 s'")
        c.execute("SELECT queue_pg.sweep()")
    by_body, asked_all = {}, set()
    for i in range(5):
        names_ = ["All"] if i % 2 else ["MessageDeduplicationId", "SequenceNumber"]
        (m,) = _receive(sqs, url, WaitTimeSeconds=0, MaxNumberOfMessages=1,
                        MessageSystemAttributeNames=names_)
        by_body[m["Body"]] = m
        if i % 2:
            asked_all.add(m["Body"])
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    for i in range(4):
        m = by_body[f"m{i}"]
        assert m["Attributes"]["MessageDeduplicationId"] == f"d{i}"
        assert m["Attributes"]["SequenceNumber"] == seqs[i]
        assert m["MessageId"] == [*sent, batch[0]][i]["MessageId"]
        # asked by name: only those; All: the group too
        assert ("MessageGroupId" in m["Attributes"]) == (m["Body"] in asked_all)
    assert by_body["h0"]["Attributes"]["MessageDeduplicationId"] == "e0"
    # content-based: the body's SHA-256, as the queue deduplicated it
    sqs.send_message(QueueUrl=cbd, MessageBody="same", MessageGroupId="g")
    (m,) = _receive(sqs, cbd, WaitTimeSeconds=0, AttributeNames=["All"])
    assert m["Attributes"]["MessageDeduplicationId"] == hashlib.sha256(b"same").hexdigest()
    # not asked: none of the three (and no extra statement)
    sqs.change_message_visibility(QueueUrl=cbd, ReceiptHandle=m["ReceiptHandle"],
                                  VisibilityTimeout=0)
    (m,) = _receive(sqs, cbd, WaitTimeSeconds=0, MessageSystemAttributeNames=["SenderId"])
    assert set(m["Attributes"]) == {"SenderId"}


def test_message_ids_are_uuids_of_the_message_id(sqs: Sqs, clean: str) -> None:
    """MessageId is UUID-shaped, the same on send, receive and a duplicate send, and reads back
    to queue_pg's message id (no table)."""
    import uuid

    from queue_pg.sqs import names

    url = sqs.create_queue(QueueName="ids")["QueueUrl"]
    sent = sqs.send_message(QueueUrl=url, MessageBody="x")["MessageId"]
    assert str(uuid.UUID(sent)) == sent and uuid.UUID(sent).version == 8
    (m,) = _receive(sqs, url, WaitTimeSeconds=0)
    assert m["MessageId"] == sent
    with psycopg.connect(clean, autocommit=True) as c:
        row = c.execute("SELECT id FROM queue_pg.messages WHERE body = '\"x\"'").fetchone()
    assert row is not None and names.message_id_of(sent) == row[0]
    assert "SequenceNumber" not in sqs.send_message(QueueUrl=url, MessageBody="y")
    assert names.message_id_of(str(uuid.uuid4())) is None


def _query_client(sqs: Sqs, endpoint: str, folder: Any) -> Any:
    """A botocore SQS client that speaks the query protocol (SQS's model, its protocol set to
    query, loaded from ``folder``): what older SDKs send, presigned by botocore itself."""
    import botocore.session

    session = botocore.session.get_session()
    loader = session.get_component("data_loader")
    model = loader.load_service_model("sqs", "service-2")
    model["metadata"] = {**model["metadata"], "protocol": "query", "protocols": ["query"]}
    target = folder / "sqs" / model["metadata"]["apiVersion"]
    target.mkdir(parents=True)
    (target / "service-2.json").write_text(json.dumps(model))
    loader.search_paths.insert(0, str(folder))
    creds = sqs._request_signer._credentials
    return session.create_client("sqs", endpoint_url=endpoint, region_name="us-east-1",
                                 aws_access_key_id=creds.access_key,
                                 aws_secret_access_key=creds.secret_key)


def test_presigned_urls(make_sqs: MakeSqs, endpoint: str, tmp_path: Any) -> None:
    """A GET presigned by botocore's generate_presigned_url runs as its key's role; expired,
    tampered, bodied or wrongly keyed URLs are refused."""
    import urllib.error
    import urllib.request
    from xml.etree import ElementTree

    ns = {"s": "http://queue.amazonaws.com/doc/2012-11-05/"}
    sqs = make_sqs()
    url = sqs.create_queue(QueueName="presigned")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="hello")
    old = _query_client(sqs, endpoint, tmp_path)

    def get(link: str, data: bytes | None = None) -> tuple[int, ElementTree.Element]:
        req = urllib.request.Request(link, data=data, method="POST" if data else "GET")
        try:
            with urllib.request.urlopen(req, timeout=60) as response:
                return response.status, ElementTree.fromstring(response.read())
        except urllib.error.HTTPError as err:
            return err.code, ElementTree.fromstring(err.read())

    def error(x: ElementTree.Element) -> str | None:
        return x.findtext("s:Error/s:Code", namespaces=ns)

    def presign(method: str, params: dict[str, Any], expires: int = 60, client: Any = old) -> str:
        return str(client.generate_presigned_url(method, Params=params, ExpiresIn=expires,
                                                 HttpMethod="GET"))

    link = presign("receive_message", {"QueueUrl": url, "MaxNumberOfMessages": 1})
    assert "X-Amz-Signature=" in link and "Action=ReceiveMessage" in link
    status_, x = get(link)
    assert status_ == 200, ElementTree.tostring(x)
    assert x.findtext(".//s:Message/s:Body", namespaces=ns) == "hello"

    # tampered: a parameter changed, added, or the expiry stretched
    status_, x = get(link.replace("MaxNumberOfMessages=1", "MaxNumberOfMessages=2"))
    assert (status_, error(x)) == (403, "SignatureDoesNotMatch")
    status_, x = get(link + "&VisibilityTimeout=0")
    assert (status_, error(x)) == (403, "SignatureDoesNotMatch")
    status_, x = get(link.replace("X-Amz-Expires=60", "X-Amz-Expires=600"))
    assert (status_, error(x)) == (403, "SignatureDoesNotMatch")
    # a body is not signed by the URL, so none is taken (it would add parameters)
    status_, x = get(link, data=b"Action=DeleteQueue")
    assert status_ == 403 and error(x) == "IncompleteSignature"
    # signed with a wrong secret; signed by a key that is then revoked
    wrong = _query_client(make_sqs(secret="x" * 40), endpoint, tmp_path / "w")
    status_, x = get(presign("get_queue_url", {"QueueName": "presigned"}, client=wrong))
    assert (status_, error(x)) == (403, "SignatureDoesNotMatch")
    # expired: good for 1 s
    short = presign("get_queue_url", {"QueueName": "presigned"}, expires=1)
    assert get(short)[0] == 200
    time.sleep(2.2)
    status_, x = get(short)
    assert (status_, error(x)) == (403, "RequestExpired")
    # the grants of the key's role decide, as with a signed header
    sqs.delete_queue(QueueUrl=url)
    status_, x = get(presign("get_queue_url", {"QueueName": "presigned"}))
    assert (status_, error(x)) == (400, "AWS.SimpleQueueService.NonExistentQueue")


def test_one_pool_lends_each_connection_as_one_role(
    make_role: MakeRole, clean: str  # noqa: F811
) -> None:
    """RolePool: a loan runs as the request's role; the next one starts as the DSN's user,
    after an error in a transaction, a key refused, or a cancelled borrower alike."""
    import asyncio

    from queue_pg.sqs.app import REQUEST_KEY, RolePool

    a = make_role("poola", PRODUCER)
    with psycopg.connect(clean) as c:
        owner = str(c.execute("SELECT current_user").fetchone()[0])  # type: ignore[index]
    key_a = loan_key(clean, a.name)
    gone = EndpointKey("sqs", "AKQPNOSUCHKEY0000000", "AKQPNOSUCHKEY0000000", a.name, "")

    async def run() -> None:
        pool = RolePool(clean, max_size=1)  # one connection: every loan is the same one
        await pool.open()
        try:
            async def who(key: EndpointKey | None) -> tuple[str, int]:
                REQUEST_KEY.set(key)
                async with pool.connection() as conn:
                    row = await (await conn.execute(
                        "SELECT current_user::text, pg_backend_pid()")).fetchone()
                    assert row is not None
                    return str(row[0]), int(row[1])

            user, pid = await asyncio.create_task(who(key_a))
            assert user == a.name
            assert await asyncio.create_task(who(None)) == (owner, pid)

            async def session_role() -> tuple[str, str]:
                REQUEST_KEY.set(key_a)
                async with pool.connection() as conn:
                    await conn.execute("SELECT 1")
                REQUEST_KEY.set(None)
                async with pool.connection() as conn:  # no session state left: SHOW role
                    row = await (await conn.execute("SELECT current_setting('role'),"
                                                    " current_user::text")).fetchone()
                    assert row is not None
                    return str(row[0]), str(row[1])

            assert await asyncio.create_task(session_role()) == ("none", owner)

            async def in_block() -> str:  # a transaction block of the borrower's takes it too
                REQUEST_KEY.set(key_a)
                async with pool.connection() as conn, conn.transaction():
                    row = await (await conn.execute("SELECT current_user::text")).fetchone()
                    assert row is not None
                    return str(row[0])

            assert await asyncio.create_task(in_block()) == a.name
            assert (await asyncio.create_task(who(None)))[0] == owner

            async def fail_in_transaction() -> None:
                REQUEST_KEY.set(key_a)
                async with pool.connection() as conn, conn.transaction():
                    await conn.execute("SELECT 1/0")

            with pytest.raises(psycopg.errors.DivisionByZero):
                await asyncio.create_task(fail_in_transaction())
            assert await asyncio.create_task(who(None)) == (owner, pid)

            async def hold() -> None:
                REQUEST_KEY.set(key_a)
                async with pool.connection() as conn:
                    await conn.execute("SELECT pg_sleep(5)")

            task = asyncio.create_task(hold())
            await asyncio.sleep(0.5)
            task.cancel()  # mid-statement: the connection is closed or reset, never kept as a
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert (await asyncio.create_task(who(None)))[0] == owner

            with pytest.raises(psycopg.Error):  # no such key: refused, the loan given back
                await asyncio.create_task(who(gone))
            assert (await asyncio.create_task(who(None)))[0] == owner
        finally:
            await pool.close()

    asyncio.run(run())


@pytest.mark.slow
def test_roles_share_one_pool_without_leaking(make_role: MakeRole, dsn: str) -> None:  # noqa: F811
    """Two keys with different grants, interleaved on an endpoint of two connections: each
    request gets its own key's grants, before and after other requests' errors."""
    from concurrent.futures import ThreadPoolExecutor

    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT queue_pg.create_queue('share-a'), queue_pg.create_queue('share-b')")
    roles = {k: make_role(f"share{k}", PRODUCER, CONSUMER) for k in "ab"}
    with psycopg.connect(dsn, autocommit=True) as c:
        for k, role in roles.items():
            for privilege in ("send", "receive"):
                c.execute("SELECT queue_pg.grant(%s, %s, %s)", [f"share-{k}", role.name, privilege])
    with serve(create_app(dsn, pool_size=2)) as url:
        base = f"{url}/000000000000/share-"

        def client(k: str) -> Sqs:
            access, secret = _key(dsn, roles[k].name)
            return boto3.client("sqs", endpoint_url=url, region_name="us-east-1",
                                aws_access_key_id=access, aws_secret_access_key=secret,
                                config=Config(retries={"max_attempts": 1}, read_timeout=60))

        def work(k: str, n: int) -> list[str]:
            sqs, other = client(k), "b" if k == "a" else "a"
            problems = []
            for i in range(12):
                sqs.send_message(QueueUrl=base + k, MessageBody=f"{k}-{n}-{i}")
                for call in (lambda: sqs.send_message(QueueUrl=base + other, MessageBody="x"),
                             lambda: sqs.receive_message(QueueUrl=base + other)):
                    try:
                        call()
                        problems.append(f"{k} reached {other}")
                    except ClientError as err:
                        if err.response["Error"]["Code"] != "AccessDenied":
                            problems.append(str(err))
                # an SQL error inside the request (the batch's statement), then more statements
                batch = sqs.send_message_batch(QueueUrl=base + k, Entries=[
                    {"Id": "ok", "MessageBody": f"{k}-{n}-{i}-b"},
                    {"Id": "bad", "MessageBody": "x", "MessageDeduplicationId": "d" * 200}])
                if [e["Id"] for e in batch["Failed"]] != ["bad"]:
                    problems.append(f"batch {batch}")
                got = sqs.receive_message(QueueUrl=base + k, MaxNumberOfMessages=10,
                                          WaitTimeSeconds=1 if i % 4 == 0 else 0)
                for m in got.get("Messages", []):
                    if not m["Body"].startswith(f"{k}-"):
                        problems.append(f"{k} got {m['Body']}")
                    sqs.delete_message(QueueUrl=base + k, ReceiptHandle=m["ReceiptHandle"])
            return problems

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda x: work(*x), [(k, n) for k in "ab" for n in range(4)]))
    assert results == [[]] * 8
    with psycopg.connect(dsn, autocommit=True) as c:
        rows = c.execute("SELECT q.name, m.body #>> '{}' FROM queue_pg.messages m"
                         " JOIN queue_pg.queues q ON q.id = m.queue_id"
                         " WHERE q.name LIKE 'share-%'").fetchall()
    assert all(body.startswith(name[-1] + "-") for name, body in rows), rows


# --- hostile requests ---------------------------------------------------------------------------

def _raw(endpoint: str, headers: dict[str, str], body: bytes, method: str = "POST",
         path: str = "/") -> tuple[int, bytes]:
    """Send a request as given (no SDK): status and body."""
    import urllib.error
    import urllib.request

    raw = urllib.request.Request(endpoint + path, data=body if method == "POST" else None,
                                 method=method, headers=headers)
    try:
        with urllib.request.urlopen(raw, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _signed(sqs: Sqs, endpoint: str, headers: dict[str, str], body: bytes,
            region: str = "us-east-1", service: str = "sqs") -> dict[str, str]:
    """``headers`` with botocore's SigV4 of them (every header given is signed)."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    req = AWSRequest("POST", endpoint + "/", data=body, headers=headers)
    SigV4Auth(sqs._request_signer._credentials, service, region).add_auth(req)
    return dict(req.prepare().headers)


def test_signatures_must_name_our_region_and_sqs_and_sign_what_decides_the_action(
    sqs: Sqs, endpoint: str
) -> None:
    """A signature for another region or service is refused, and so is one that leaves
    X-Amz-Target, X-Amz-Date or Content-Type unsigned: else a request signed as GetQueueUrl runs
    as PurgeQueue once its target is changed on the way."""
    url = sqs.create_queue(QueueName="victim")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="keep me")
    body = json.dumps({"QueueUrl": url, "QueueName": "victim"}).encode()
    json_headers = {"X-Amz-Target": "AmazonSQS.GetQueueUrl",
                    "Content-Type": "application/x-amz-json-1.0"}
    assert _raw(endpoint, _signed(sqs, endpoint, json_headers, body), body)[0] == 200
    for region, service in [("xx-made-up-1", "sqs"), ("us-east-1", "s3"), ("eu-west-1", "sqs")]:
        got = _raw(endpoint, _signed(sqs, endpoint, json_headers, body, region, service), body)
        assert got[0] == 403, (region, service, got)
        assert json.loads(got[1])["__type"].endswith("#SignatureDoesNotMatch")
    # signed without the target (host and date only), the target added afterwards
    headers = _signed(sqs, endpoint, {}, body)
    for target in ("AmazonSQS.GetQueueUrl", "AmazonSQS.PurgeQueue"):
        got = _raw(endpoint, {**headers, "X-Amz-Target": target,
                              "Content-Type": "application/x-amz-json-1.0"}, body)
        assert got[0] == 403 and b"x-amz-target" in got[1], got
    # the target signed, the content type not
    signed = _signed(sqs, endpoint, {"X-Amz-Target": "AmazonSQS.PurgeQueue"}, body)
    got = _raw(endpoint, {**signed, "Content-Type": "application/x-amz-json-1.0"}, body)
    assert got[0] == 403 and b"content-type" in got[1], got
    # X-Amz-Date unsigned: a date header the signature does not cover
    signed = _signed(sqs, endpoint, json_headers, body)
    auth = signed["Authorization"].replace("x-amz-date;", "").replace(";x-amz-date", "")
    got = _raw(endpoint, {**signed, "Authorization": auth}, body)
    assert got[0] == 403, got
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    assert attrs["Attributes"]["ApproximateNumberOfMessages"] == "1"  # nothing purged


def test_deeply_nested_query_parameters_are_a_400(sqs: Sqs, endpoint: str) -> None:
    """A parameter name nested 5,000 levels deep (or any other malformed input) is the sender's
    fault: 400 with SQS's error code, never a 500."""
    from urllib.parse import urlencode

    url = sqs.create_queue(QueueName="deep")["QueueUrl"]
    for pairs in ([("Action", "SendMessage"), ("QueueUrl", url), ("MessageBody", "x"),
                   ("MessageAttribute." + ".".join(["1"] * 5000), "v")],
                  [("Action", "ListQueues"), ("." * 3000, "x")],
                  [("Action", "SendMessage"), ("QueueUrl", url), ("MessageBody", "x"),
                   ("MessageAttribute.1.Name", "a"), ("MessageAttribute.1.Value", "flat")],
                  # a name of more parts, where a value is due (found by the fuzz test below)
                  [("Action", "AddPermission"), ("Attribute.0.Name.QueueUrl", "")]):
        body = urlencode(pairs).encode()
        headers = _signed(sqs, endpoint, {
            "Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}, body)
        got = _raw(endpoint, headers, body)
        assert got[0] == 400 and b"<Code>" in got[1], got[1][:300]


def test_fuzzed_requests_never_answer_500(sqs: Sqs, endpoint: str) -> None:
    """Whatever JSON body or form parameters a signed caller sends, the answer is SQS's 400 (or a
    success), never a 500: the endpoint's own parsing has no unhandled case."""
    from urllib.parse import urlencode

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from queue_pg.sqs.actions import ACTIONS

    url = sqs.create_queue(QueueName="fuzz")["QueueUrl"]
    fifo = sqs.create_queue(QueueName="fuzz.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    names = ["QueueUrl", "QueueName", "MessageBody", "Attributes", "Entries", "Id",
             "MessageAttributes", "DataType", "StringValue", "BinaryValue", "ReceiptHandle",
             "DelaySeconds", "MaxNumberOfMessages", "VisibilityTimeout", "WaitTimeSeconds",
             "AttributeNames", "MessageAttributeNames", "MessageSystemAttributes", "Tags",
             "TagKeys", "MessageGroupId", "MessageDeduplicationId", "Label", "Actions",
             "AWSAccountIds", "SourceArn", "TaskHandle", "MaxResults", "NextToken",
             "RedrivePolicy", "FifoQueue", "Policy", "tags", "AWSTraceHeader"]
    leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                     st.floats(allow_nan=False), st.text(max_size=20),
                     st.sampled_from([url, fifo, "All", "1", "-1", "900", "true", "String"]))
    value = st.recursive(leaf, lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(names), st.text(max_size=8)), inner,
                        max_size=5)), max_leaves=20)
    action = st.one_of(st.sampled_from(sorted(ACTIONS)),
                       st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12))

    def post(headers: dict[str, str], body: bytes) -> int:
        got = _raw(endpoint, _signed(sqs, endpoint, headers, body), body)
        assert got[0] < 500, got
        return got[0]

    @settings(max_examples=120, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(action, st.dictionaries(st.sampled_from(names), value, max_size=6))
    def json_protocol(name: str, params: dict[str, Any]) -> None:
        post({"X-Amz-Target": f"AmazonSQS.{name}",
              "Content-Type": "application/x-amz-json-1.0"}, json.dumps(params).encode())

    part = st.one_of(st.sampled_from([*names, "Attribute", "MessageAttribute", "Name", "Value", "SendMessageBatchRequestEntry", "Tag", "Key"]),
                     st.integers(0, 12).map(str), st.text(max_size=6))
    pairs = st.lists(st.tuples(st.lists(part, min_size=1, max_size=7).map(".".join),
                               st.one_of(st.text(max_size=20), st.sampled_from([url, fifo]))),
                     max_size=8)

    @settings(max_examples=120, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(action, pairs)
    def query_protocol(name: str, params: list[tuple[str, str]]) -> None:
        body = urlencode([("Action", name), *params]).encode()
        post({"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}, body)

    json_protocol()
    query_protocol()
    # values of the wrong type where the endpoint's own code reads them
    for name, params in [("SendMessageBatch", {"QueueUrl": url, "Entries": [1]}),
                         ("SendMessageBatch", {"QueueUrl": url, "Entries": {"a": 1}}),
                         ("CreateQueue", {"QueueName": "x", "Attributes": [1]}),
                         ("ListQueues", {"QueueNamePrefix": 5}),
                         ("ReceiveMessage", {"QueueUrl": url, "AttributeNames": "All"}),
                         ("ReceiveMessage", {"QueueUrl": url, "MessageAttributeNames": [1]}),
                         ("DeleteMessageBatch", {"QueueUrl": url, "Entries": [[1]]}),
                         ("SendMessage", {"QueueUrl": url, "MessageBody": "x",
                                          "MessageAttributes": {"a": {"DataType": 1}}}),
                         ("GetQueueAttributes", {"QueueUrl": url, "AttributeNames": [["All"]]}),
                         ("UntagQueue", {"QueueUrl": url, "TagKeys": "a"})]:
        status = post({"X-Amz-Target": f"AmazonSQS.{name}",
                       "Content-Type": "application/x-amz-json-1.0"}, json.dumps(params).encode())
        assert status == 400, (name, params, status)



# --- SQS's rules where queue_pg's are broader ---------------------------------------------------

def test_fifo_accepts_delay_zero_and_refuses_others(sqs: Sqs) -> None:
    url = sqs.create_queue(QueueName="d0.fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="a", MessageGroupId="g", DelaySeconds=0)
    got = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "b", "MessageBody": "b", "MessageGroupId": "g", "DelaySeconds": 0}])
    assert [e["Id"] for e in got["Successful"]] == ["b"]
    with pytest.raises(ClientError) as err:
        sqs.send_message(QueueUrl=url, MessageBody="c", MessageGroupId="g", DelaySeconds=5)
    assert code(err) == "InvalidParameterValue" and "DelaySeconds" in str(err.value)
    std = sqs.create_queue(QueueName="d900")["QueueUrl"]
    sqs.send_message(QueueUrl=std, MessageBody="x", DelaySeconds=900)
    with pytest.raises(ClientError) as err:
        sqs.send_message(QueueUrl=std, MessageBody="x", DelaySeconds=901)
    assert code(err) == "InvalidParameterValue"


def test_message_size_counts_the_bytes_sent(sqs: Sqs, client: Any) -> None:
    """SQS counts a body's UTF-8 bytes (and attribute names, types, values), not its JSON text:
    a 1 MiB body fits a default queue, an N-byte body fits MaximumMessageSize N, tabs count 1."""
    url = sqs.create_queue(QueueName="size")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="x" * 1048576)
    sqs.send_message(QueueUrl=url, MessageBody="\t" * (700 * 1024))
    with pytest.raises(ClientError) as err:
        sqs.send_message(QueueUrl=url, MessageBody="x" * 1048577)
    assert code(err) == "InvalidParameterValue"
    with pytest.raises(ClientError) as err:
        sqs.send_message(QueueUrl=url, MessageBody="x" * 1048570, MessageAttributes={
            "abc": {"DataType": "String", "StringValue": "1"}})
    assert code(err) == "InvalidParameterValue"
    small = sqs.create_queue(QueueName="size-2k", Attributes={
        "MaximumMessageSize": "2048"})["QueueUrl"]
    sqs.send_message(QueueUrl=small, MessageBody="é" * 1024)  # 2048 bytes
    with pytest.raises(ClientError) as err:
        sqs.send_message(QueueUrl=small, MessageBody="x" * 2049)
    assert code(err) == "InvalidParameterValue"
    # the Python API: a string body counts its UTF-8 bytes, a JSON body its JSON text
    import queue_pg.errors

    client.create_queue("py-size", max_message_size=1024)
    client.send("py-size", "\t" * 1024)
    client.send("py-size", ["x" * 1018])  # ["..."]: 1,022 bytes
    with pytest.raises(queue_pg.errors.MessageTooLarge):
        client.send("py-size", "x" * 1025)
    with pytest.raises(queue_pg.errors.MessageTooLarge):
        client.send("py-size", ["x" * 1021])


def test_create_queue_compares_only_the_attributes_given(sqs: Sqs) -> None:
    url = sqs.create_queue(QueueName="cmp", Attributes={"VisibilityTimeout": "45"})["QueueUrl"]
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "7"})
    assert sqs.create_queue(QueueName="cmp")["QueueUrl"] == url
    assert sqs.create_queue(QueueName="cmp", Attributes={"VisibilityTimeout": "45"})[
        "QueueUrl"] == url
    with pytest.raises(ClientError) as err:
        sqs.create_queue(QueueName="cmp", Attributes={"DelaySeconds": "0"})
    assert code(err) == "QueueAlreadyExists"


def test_fifo_sends_need_a_dedup_id_or_content_dedup(sqs: Sqs) -> None:
    url = sqs.create_queue(QueueName="nodedup.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    with pytest.raises(ClientError) as err:
        sqs.send_message(QueueUrl=url, MessageBody="a", MessageGroupId="g")
    assert code(err) == "InvalidParameterValue" and "ContentBasedDeduplication" in str(err.value)
    with pytest.raises(ClientError) as err:
        sqs.send_message_batch(QueueUrl=url, Entries=[
            {"Id": "a", "MessageBody": "a", "MessageGroupId": "g", "MessageDeduplicationId": "1"},
            {"Id": "b", "MessageBody": "b", "MessageGroupId": "g"}])
    assert code(err) == "InvalidParameterValue"
    with pytest.raises(ClientError) as err:
        sqs.send_message(QueueUrl=url, MessageBody="a", MessageDeduplicationId="1")
    assert code(err) == "MissingParameter"
    assert str(err.value).endswith("The request must contain the parameter MessageGroupId.")
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)


def test_content_dedup_is_the_sha256_of_the_body_bytes(sqs: Sqs) -> None:
    url = sqs.create_queue(QueueName="sha.fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]
    first = sqs.send_message(QueueUrl=url, MessageBody="héllo", MessageGroupId="g")
    digest = hashlib.sha256("héllo".encode()).hexdigest()
    again = sqs.send_message(QueueUrl=url, MessageBody="other", MessageGroupId="g",
                             MessageDeduplicationId=digest)
    assert again["MessageId"] == first["MessageId"]  # a duplicate of the first
    (m,) = _receive(sqs, url, WaitTimeSeconds=0, MaxNumberOfMessages=10)
    assert m["Body"] == "héllo"


def test_dead_letter_queue_of_the_same_kind(sqs: Sqs) -> None:
    std = sqs.create_queue(QueueName="kind-std")["QueueUrl"]
    fifo = sqs.create_queue(QueueName="kind.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    arn = {u: sqs.get_queue_attributes(QueueUrl=u, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"] for u in (std, fifo)}
    for name, attrs, target in [("src.fifo", {"FifoQueue": "true"}, std), ("src-std", {}, fifo)]:
        policy = json.dumps({"deadLetterTargetArn": arn[target], "maxReceiveCount": 2})
        with pytest.raises(ClientError) as err:
            sqs.create_queue(QueueName=name, Attributes={**attrs, "RedrivePolicy": policy})
        assert code(err) == "InvalidAttributeValue"
        url = sqs.create_queue(QueueName=name, Attributes=attrs)["QueueUrl"]
        with pytest.raises(ClientError) as err:
            sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": policy})
        assert code(err) == "InvalidAttributeValue"


def test_message_attribute_prefix_wildcards(sqs: Sqs) -> None:
    url = sqs.create_queue(QueueName="wild")["QueueUrl"]
    attrs = {n: {"DataType": "String", "StringValue": n} for n in ("Custom1", "Custom2", "Other")}
    sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes=attrs)
    (m,) = _receive(sqs, url, WaitTimeSeconds=0, MessageAttributeNames=["Custom.*"],
                    VisibilityTimeout=0)
    assert sorted(m["MessageAttributes"]) == ["Custom1", "Custom2"]
    (m,) = _receive(sqs, url, WaitTimeSeconds=0, MessageAttributeNames=[".*"])
    assert sorted(m["MessageAttributes"]) == ["Custom1", "Custom2", "Other"]


def test_queue_attribute_names_and_values_as_sqs_checks_them(sqs: Sqs) -> None:
    url = sqs.create_queue(QueueName="names")["QueueUrl"]
    assert "Attributes" not in sqs.get_queue_attributes(QueueUrl=url)  # no names: none
    with pytest.raises(ClientError) as err:
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn", "Nope"])
    assert code(err) == "InvalidAttributeName" and "Unknown Attribute Nope." in str(err.value)
    for call in (lambda a: sqs.create_queue(QueueName="names2", Attributes=a),
                 lambda a: sqs.set_queue_attributes(QueueUrl=url, Attributes=a)):
        with pytest.raises(ClientError) as err:
            call({"Nope": "1"})
        assert code(err) == "InvalidAttributeName"
        for bad in ({"VisibilityTimeout": "43201"}, {"DelaySeconds": "901"},
                    {"MaximumMessageSize": "1023"}, {"ReceiveMessageWaitTimeSeconds": "x"}):
            with pytest.raises(ClientError) as err:
                call(bad)
            assert code(err) == "InvalidAttributeValue", bad


def test_policy_kms_and_fifo_attributes_are_kept(sqs: Sqs) -> None:
    policy = json.dumps({"Version": "2012-10-17", "Statement": []})
    url = sqs.create_queue(QueueName="kept.fifo", Attributes={
        "FifoQueue": "true", "Policy": policy, "KmsMasterKeyId": "alias/k",
        "KmsDataKeyReusePeriodSeconds": "600", "DeduplicationScope": "messageGroup",
        "FifoThroughputLimit": "perMessageGroupId"})["QueueUrl"]
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (json.loads(got["Policy"]), got["KmsMasterKeyId"], got["KmsDataKeyReusePeriodSeconds"],
            got["DeduplicationScope"], got["FifoThroughputLimit"]) == (
        json.loads(policy), "alias/k", "600", "messageGroup", "perMessageGroupId")
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"KmsMasterKeyId": "",
                                                       "DeduplicationScope": "queue"})
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert "KmsMasterKeyId" not in got and got["DeduplicationScope"] == "queue"
    with pytest.raises(ClientError) as err:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"FifoThroughputLimit": "fast"})
    assert code(err) == "InvalidAttributeValue"


def test_add_and_remove_permission_map_to_grants(
    make_sqs: MakeSqs, clean: str, make_role: MakeRole  # noqa: F811
) -> None:
    """AddPermission naming a role grants it what the actions need on the queue; RemovePermission
    takes back what the label granted; a principal that names no role is only shown."""
    owner = make_sqs()
    url = owner.create_queue(QueueName="shared")["QueueUrl"]
    role = make_role("sqsperm", PRODUCER, CONSUMER).name
    other = make_sqs(role)
    with pytest.raises(ClientError) as err:
        other.send_message(QueueUrl=url, MessageBody="x")
    assert code(err) == "AccessDenied"
    owner.add_permission(QueueUrl=url, Label="writers", AWSAccountIds=[role, "111111111111"],
                         Actions=["SendMessage"])
    other.send_message(QueueUrl=url, MessageBody="x")
    with pytest.raises(ClientError) as err:
        other.receive_message(QueueUrl=url)
    assert code(err) == "AccessDenied"
    policy = json.loads(owner.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])[
        "Attributes"]["Policy"])
    assert [s["Sid"] for s in policy["Statement"]] == ["writers"]
    with pytest.raises(ClientError) as err:
        owner.add_permission(QueueUrl=url, Label="writers", AWSAccountIds=[role],
                             Actions=["ReceiveMessage"])
    assert code(err) == "InvalidParameterValue"
    with pytest.raises(ClientError) as err:
        other.add_permission(QueueUrl=url, Label="mine", AWSAccountIds=[role], Actions=["*"])
    assert code(err) == "AccessDenied"  # needs manage
    owner.remove_permission(QueueUrl=url, Label="writers")
    with pytest.raises(ClientError) as err:
        other.send_message(QueueUrl=url, MessageBody="x")
    assert code(err) == "AccessDenied"
    assert "Attributes" not in owner.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])


def test_trace_header_is_kept_and_returned(sqs: Sqs) -> None:
    url = sqs.create_queue(QueueName="trace")["QueueUrl"]
    header = "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1"
    sqs.send_message(QueueUrl=url, MessageBody="x", MessageSystemAttributes={
        "AWSTraceHeader": {"DataType": "String", "StringValue": header}})
    (m,) = _receive(sqs, url, WaitTimeSeconds=0, MessageSystemAttributeNames=["AWSTraceHeader"],
                    MessageAttributeNames=["All"])
    assert m["Attributes"] == {"AWSTraceHeader": header} and "MessageAttributes" not in m


def test_what_sqs_refuses_in_requests(sqs: Sqs) -> None:
    url = sqs.create_queue(QueueName="refuse")["QueueUrl"]
    for entries in ([{"Id": "", "MessageBody": "x"}], [{"Id": "a.b", "MessageBody": "x"}],
                    [{"Id": "i" * 81, "MessageBody": "x"}],
                    [{"Id": f"e{i}", "MessageBody": "x" * 200_000} for i in range(6)]):
        with pytest.raises(ClientError):
            sqs.send_message_batch(QueueUrl=url, Entries=entries)
    for name in ("öther", "AWS.x", "Amazon.y", "a..b", ".a"):
        with pytest.raises(ClientError) as err:
            sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes={
                name: {"DataType": "String", "StringValue": "v"}})
        assert code(err) == "InvalidParameterValue", name
    with pytest.raises(ClientError) as err:
        sqs.send_message(QueueUrl=url, MessageBody="bad \x01 char")
    assert code(err) == "InvalidMessageContents"
    with pytest.raises(ClientError) as err:
        sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=0)
    assert code(err) == "InvalidParameterValue"
    with pytest.raises(ClientError) as err:
        sqs.tag_queue(QueueUrl=url, Tags={})
    assert code(err) == "MissingParameter"
    with pytest.raises(ClientError) as err:
        sqs.untag_queue(QueueUrl=url, TagKeys=[])
    assert code(err) == "InvalidParameterValue"
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)


def test_one_receive_keeps_claim_order(sqs: Sqs, client: Any) -> None:
    """The messages of one receive come back oldest first (by when they became visible): through
    the endpoint, the Python API and SQL, whose UPDATE ... RETURNING keeps no order of its own.
    A message sent first with a delay is claimed after those sent later without one."""
    url = sqs.create_queue(QueueName="order")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="late", DelaySeconds=2)
    sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": str(i), "MessageBody": str(i)} for i in range(5)])
    client.create_queue("py-order")
    client.send("py-order", "late", delay=2)
    client.send_batch("py-order", [str(i) for i in range(5)])
    time.sleep(3)
    expected = [*map(str, range(5)), "late"]
    got = _receive(sqs, url, WaitTimeSeconds=0, MaxNumberOfMessages=10)
    assert [m["Body"] for m in got] == expected
    assert [m.body for m in client.receive("py-order", 10, wait=0)] == expected


def test_permissions_and_kept_attributes_in_sql_are_bounded(
    conn: psycopg.Connection[Any], make_role: MakeRole  # noqa: F811
) -> None:
    """The SQL behind AddPermission and the kept attributes, called directly by a role that
    manages one queue: actions and principals checked, at most 100 labels and 6 attributes of
    bounded size a queue, nothing on another queue; refusals change nothing."""
    from queue_pg.errors import AccessDenied, InvalidParameter, translate

    conn.execute("SELECT queue_pg.create_queue('mine'), queue_pg.create_queue('theirs')")
    role = make_role("sqsmgr", PRODUCER)
    conn.execute("SELECT queue_pg.grant('mine', %s, 'manage')", [role.name])
    with role.connect() as c:
        def run(query: str, *params: Any) -> None:
            with translate():
                c.execute(query, params)

        for query, params, error in [
            ("SELECT queue_pg.sqs_add_permission('mine', 'l', %s, %s)", (["x"], ["DeleteQueue"]),
             InvalidParameter),
            ("SELECT queue_pg.sqs_add_permission('mine', 'l', %s, %s)", (["x" * 257], ["*"]),
             InvalidParameter),
            ("SELECT queue_pg.sqs_add_permission('mine', 'l', %s, %s)", ([None], ["*"]),
             InvalidParameter),
            ("SELECT queue_pg.sqs_add_permission('theirs', 'l', %s, %s)", ([role.name], ["*"]),
             AccessDenied),
            ("SELECT queue_pg.sqs_set_queue_attributes('mine', %s::jsonb)",
             (json.dumps({"Policy": "x" * 20481}),), InvalidParameter),
            ("SELECT queue_pg.sqs_set_queue_attributes('mine', %s::jsonb)",
             (json.dumps({"Anything": "x"}),), InvalidParameter),
            ("SELECT queue_pg.sqs_set_queue_attributes('theirs', %s::jsonb)",
             (json.dumps({"Policy": "{}"}),), AccessDenied),
        ]:
            with pytest.raises(error):
                run(query, *params)
        for i in range(100):
            run("SELECT queue_pg.sqs_add_permission('mine', %s, %s, %s)", f"l{i}", ["111"],
                ["SendMessage"])
        with pytest.raises(InvalidParameter, match="100 permissions"):
            run("SELECT queue_pg.sqs_add_permission('mine', 'one-more', %s, %s)", ["111"], ["*"])
    counts = conn.execute("SELECT (SELECT count(*) FROM queue_pg.sqs_permissions),"
                          " (SELECT count(*) FROM queue_pg.sqs_queue_attributes)").fetchone()
    assert counts == (100, 0)


def test_a_fifo_receive_takes_a_group_together(sqs: Sqs) -> None:
    """SQS returns several messages of one group in one receive, oldest first, and may fill from
    several groups; while any of a group's messages is out, no other receive gets that group."""
    url = sqs.create_queue(QueueName="together.fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]
    order = ["a0", "b0", "a1", "a2", "b1", "a3"]
    sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": body, "MessageBody": body, "MessageGroupId": body[0]} for body in order])

    def receive(n: int) -> list[dict[str, Any]]:
        return _receive(sqs, url, MaxNumberOfMessages=n, WaitTimeSeconds=0,
                        MessageSystemAttributeNames=["MessageGroupId"])

    first = receive(3)
    assert [m["Body"] for m in first] == ["a0", "a1", "a2"]
    assert {m["Attributes"]["MessageGroupId"] for m in first} == {"a"}
    assert [m["Body"] for m in receive(10)] == ["b0", "b1"]  # not a3: group a is out
    assert receive(10) == []
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first[1]["ReceiptHandle"])
    assert receive(10) == []  # a0 and a2 still hold group a
    sqs.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(first)])
    assert [m["Body"] for m in receive(10)] == ["a3"]
    # one receive filling from two groups, each in order
    sqs.purge_queue(QueueUrl=url)
    sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": body, "MessageBody": body + "x", "MessageGroupId": body[0]} for body in order])
    assert [m["Body"] for m in receive(10)] == ["a0x", "a1x", "a2x", "a3x", "b0x", "b1x"]
