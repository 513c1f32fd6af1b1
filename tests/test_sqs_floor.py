"""The SQS floor of ``python -m bench sqs`` (bench/sqs_floor.py) is a yardstick, and its figure
bounds what the endpoint can reach only if it does the work a real endpoint must: every request
checked against its SigV4 signature, messages leased and deleted durably, a receipt that no
longer holds the lease deleting nothing, a long poll woken by a send. Real server, real boto3.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

pytest.importorskip("uvicorn")
boto3 = pytest.importorskip("boto3")

from botocore.config import Config  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402

from bench import sqs_floor  # noqa: E402
from bench.sqs_suite import serve  # noqa: E402

KEY = ("AKIAFLOORTEST", "floor-test-secret")


def _sqs(url: str, key: tuple[str, str] = KEY) -> Any:
    return boto3.client("sqs", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id=key[0], aws_secret_access_key=key[1],
                        config=Config(retries={"max_attempts": 1}))


@pytest.fixture
def floor(scratch: str) -> Iterator[tuple[str, str]]:
    sqs_floor.install(scratch)
    with serve(sqs_floor.Floor(scratch, *KEY)) as url:
        yield url, scratch


def test_the_floor_refuses_a_request_its_key_did_not_sign(floor: tuple[str, str]) -> None:
    url, _ = floor
    for key in (("AKIAFLOORTEST", "another-secret"), ("AKIAOTHER", KEY[1])):
        with pytest.raises(ClientError) as err:
            _sqs(url, key).create_queue(QueueName="q")
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_the_floor_leases_deletes_and_fences_durably(floor: tuple[str, str]) -> None:
    url, dsn = floor
    sqs = _sqs(url)
    q = sqs.create_queue(QueueName="q", Attributes={"VisibilityTimeout": "30"})["QueueUrl"]
    sent = sqs.send_message_batch(QueueUrl=q, Entries=[
        {"Id": str(i), "MessageBody": f"m{i}"} for i in range(10)])
    assert len(sent["Successful"]) == 10  # boto3 checks each MD5OfMessageBody
    got = sqs.receive_message(QueueUrl=q, MaxNumberOfMessages=10,
                              AttributeNames=["ApproximateReceiveCount"])["Messages"]
    assert sorted(m["Body"] for m in got) == [f"m{i}" for i in range(10)]
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in got} == {"1"}
    # leased: nothing visible
    assert "Messages" not in sqs.receive_message(QueueUrl=q, MaxNumberOfMessages=10)
    # the lease given back, one message is received again: its first receipt is stale
    first = got[0]
    sqs.change_message_visibility(QueueUrl=q, ReceiptHandle=first["ReceiptHandle"],
                                  VisibilityTimeout=0)
    again = sqs.receive_message(QueueUrl=q)["Messages"]
    assert [m["Body"] for m in again] == [first["Body"]]
    sqs.delete_message(QueueUrl=q, ReceiptHandle=first["ReceiptHandle"])  # stale: nothing
    sqs.delete_message_batch(QueueUrl=q, Entries=[
        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got[1:])])
    with psycopg.connect(dsn) as conn:
        left = conn.execute("SELECT body, read_ct FROM floor_sqs.messages").fetchall()
    assert left == [(first["Body"], 2)]
    sqs.delete_message(QueueUrl=q, ReceiptHandle=again[0]["ReceiptHandle"])
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM floor_sqs.messages").fetchone() == (0,)


def test_a_long_poll_on_the_floor_wakes_on_a_send(floor: tuple[str, str]) -> None:
    url, _ = floor
    sqs = _sqs(url)
    q = sqs.create_queue(QueueName="q")["QueueUrl"]
    got: list[Any] = []

    def poll() -> None:
        got.append(sqs.receive_message(QueueUrl=q, WaitTimeSeconds=10))

    began = time.monotonic()
    waiter = threading.Thread(target=poll)
    waiter.start()
    time.sleep(0.5)
    _sqs(url).send_message(QueueUrl=q, MessageBody="wake")
    waiter.join(15)
    assert [m["Body"] for m in got[0]["Messages"]] == ["wake"]
    assert time.monotonic() - began < 5
