"""The SQS floor: the least an SQS endpoint of this design can do per request, in Python, on
PostgreSQL, on this machine. Not a product: a yardstick for ``python -m bench sqs``.

It is what ``queue-pg sqs`` is made of with everything else taken away. The same server
(uvicorn, one worker, httptools and uvloop as installed), the same SigV4 check of every request
(:mod:`queue_pg.sqs.sigv4`, one key held in memory), JSON in and out; then one statement per
request, prepared on the server, on a handful of plain autocommit connections, against one
table shaped like the floor of ``bench cycle`` (a primary key, an index on the queue and the
lease end). No framework, no roles, no key look-up or check in the database, no plpgsql, no
history, no counters, no attribute rules; a long poll waits on an event of this process (every
send comes through it), not on NOTIFY. Receipts are the id and receive count (a stale one
deletes nothing). Only what boto3's loop and Celery's ``sqs://`` transport call is answered.

What the endpoint reaches beside the floor is what its features cost; what the floor reaches
beside moto's server bounds the ratio any endpoint of this design can reach here.

Run: ``python -m bench.sqs_floor DSN PORT`` with ``BENCH_SQS_FLOOR_KEY=access:secret``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl

import psycopg

from queue_pg.sqs import attributes, names, sigv4

KEY_ENV = "BENCH_SQS_FLOOR_KEY"
CONNECTIONS = 4
VISIBILITY_TIMEOUT = 30

SCHEMA = """
CREATE SCHEMA IF NOT EXISTS floor_sqs;
CREATE TABLE IF NOT EXISTS floor_sqs.queues (name text PRIMARY KEY, vt integer NOT NULL);
CREATE TABLE IF NOT EXISTS floor_sqs.messages (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    vt timestamptz NOT NULL,
    read_ct integer NOT NULL DEFAULT 0,
    sent_at timestamptz NOT NULL DEFAULT now(),
    first_at timestamptz,
    body text NOT NULL,
    attrs jsonb
);
CREATE INDEX IF NOT EXISTS messages_queue_vt ON floor_sqs.messages (queue, vt);
"""
_SEND = ("INSERT INTO floor_sqs.messages (queue, vt, body, attrs)"
         " VALUES (%s, now() + make_interval(secs => %s), %s, %s) RETURNING id")
_SEND_BATCH = ("INSERT INTO floor_sqs.messages (queue, vt, body, attrs)"
               " SELECT %s, now() + make_interval(secs => d), b, a"
               " FROM unnest(%s::int[], %s::text[], %s::jsonb[]) AS x(d, b, a) RETURNING id")
_RECEIVE = ("UPDATE floor_sqs.messages t SET vt = clock_timestamp() + make_interval(secs => %s),"
            " read_ct = t.read_ct + 1, first_at = coalesce(t.first_at, clock_timestamp())"
            " WHERE t.id = ANY (ARRAY(SELECT id FROM floor_sqs.messages WHERE queue = %s"
            " AND vt <= now() ORDER BY vt LIMIT %s FOR UPDATE SKIP LOCKED))"
            " RETURNING t.id, t.read_ct, t.sent_at, t.first_at, t.body, t.attrs")
_DELETE = ("DELETE FROM floor_sqs.messages m USING unnest(%s::bigint[], %s::int[]) AS r(id, ct)"
           " WHERE m.id = r.id AND m.read_ct = r.ct")
_CHANGE = ("UPDATE floor_sqs.messages SET vt = clock_timestamp() + make_interval(secs => %s)"
           " WHERE id = %s AND read_ct = %s")


def install(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)


def tables() -> list[str]:
    return ["floor_sqs.messages", "floor_sqs.queues"]


class Fault(Exception):
    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code, self.status = code, status


def _receipt(value: Any) -> tuple[int, int]:
    try:
        msg_id, count = str(value).split(".")
        return int(msg_id), int(count)
    except ValueError:
        raise Fault("ReceiptHandleIsInvalid", "The receipt handle is not valid.") from None


def _ms(when: datetime | None) -> str:
    return str(int(when.timestamp() * 1000)) if when is not None else "0"


class Floor:
    def __init__(self, dsn: str, access_key: str, secret: str) -> None:
        self.dsn, self.access_key, self.secret = dsn, access_key, secret
        self.idle: asyncio.Queue[psycopg.AsyncConnection[Any]] = asyncio.Queue()
        self.queues: dict[str, int] = {}
        self.sent: dict[str, asyncio.Event] = {}
        self.actions: dict[str, Callable[[dict[str, Any], str], Awaitable[dict[str, Any]]]] = {
            "CreateQueue": self.create_queue, "GetQueueUrl": self.get_queue_url,
            "ListQueues": self.list_queues, "GetQueueAttributes": self.get_queue_attributes,
            "SendMessage": self.send_message, "SendMessageBatch": self.send_message_batch,
            "ReceiveMessage": self.receive_message, "DeleteMessage": self.delete_message,
            "DeleteMessageBatch": self.delete_message_batch,
            "ChangeMessageVisibility": self.change_message_visibility,
        }

    async def open(self) -> None:
        for _ in range(CONNECTIONS):
            self.idle.put_nowait(await psycopg.AsyncConnection.connect(
                self.dsn, autocommit=True, prepare_threshold=0))
        async with await psycopg.AsyncConnection.connect(self.dsn) as conn:
            rows = await (await conn.execute("SELECT name, vt FROM floor_sqs.queues")).fetchall()
        self.queues = {name: vt for name, vt in rows}

    async def close(self) -> None:
        while not self.idle.empty():
            await self.idle.get_nowait().close()

    async def run(self, query: str, params: Any) -> list[tuple[Any, ...]]:
        conn = await self.idle.get()
        try:
            cur = await conn.execute(query, params)
            return await cur.fetchall() if cur.description is not None else []
        finally:
            self.idle.put_nowait(conn)

    def queue(self, params: dict[str, Any]) -> str:
        name = str(params.get("QueueUrl", "")).rstrip("/").rsplit("/", 1)[-1]
        if name not in self.queues:
            raise Fault("AWS.SimpleQueueService.NonExistentQueue",
                        "The specified queue does not exist.")
        return name

    # --- the actions ---------------------------------------------------------------------------

    async def create_queue(self, params: dict[str, Any], base: str) -> dict[str, Any]:
        name = str(params.get("QueueName", ""))
        vt = int((params.get("Attributes") or {}).get("VisibilityTimeout", VISIBILITY_TIMEOUT))
        if name not in self.queues:
            await self.run("INSERT INTO floor_sqs.queues VALUES (%s, %s) ON CONFLICT DO NOTHING",
                           (name, vt))
            self.queues[name] = vt
        return {"QueueUrl": names.url(base, name)}

    async def get_queue_url(self, params: dict[str, Any], base: str) -> dict[str, Any]:
        name = self.queue({"QueueUrl": params.get("QueueName", "")})
        return {"QueueUrl": names.url(base, name)}

    async def list_queues(self, params: dict[str, Any], base: str) -> dict[str, Any]:
        prefix = str(params.get("QueueNamePrefix", ""))
        return {"QueueUrls": [names.url(base, q) for q in self.queues if q.startswith(prefix)]}

    async def get_queue_attributes(self, params: dict[str, Any], base: str) -> dict[str, Any]:
        name = self.queue(params)
        rows = await self.run("SELECT count(*) FILTER (WHERE vt <= now()), count(*)"
                              " FROM floor_sqs.messages WHERE queue = %s", (name,))
        visible, total = rows[0]
        return {"Attributes": {"ApproximateNumberOfMessages": str(visible),
                               "ApproximateNumberOfMessagesNotVisible": str(total - visible),
                               "VisibilityTimeout": str(self.queues[name]),
                               "QueueArn": names.arn(name)}}

    def _woken(self, name: str) -> None:
        event = self.sent.pop(name, None)
        if event is not None:
            event.set()

    async def send_message(self, params: dict[str, Any], base: str) -> dict[str, Any]:
        name = self.queue(params)
        body = str(params["MessageBody"])
        attrs = params.get("MessageAttributes") or None
        rows = await self.run(_SEND, (name, int(params.get("DelaySeconds") or 0), body,
                                      None if attrs is None else json.dumps(attrs)))
        self._woken(name)
        out: dict[str, Any] = {"MessageId": names.message_id(rows[0][0]),
                               "MD5OfMessageBody": attributes.md5_body(body)}
        if attrs:
            out["MD5OfMessageAttributes"] = attributes.md5_attributes(attrs)
        return out

    async def send_message_batch(self, params: dict[str, Any], base: str) -> dict[str, Any]:
        name = self.queue(params)
        entries = params["Entries"]
        bodies = [str(e["MessageBody"]) for e in entries]
        attrs = [e.get("MessageAttributes") or None for e in entries]
        rows = await self.run(_SEND_BATCH, (
            name, [int(e.get("DelaySeconds") or 0) for e in entries], bodies,
            [None if a is None else json.dumps(a) for a in attrs]))
        self._woken(name)
        ok = []
        for e, body, a, (msg_id,) in zip(entries, bodies, attrs, rows, strict=True):
            sent: dict[str, Any] = {"Id": e["Id"], "MessageId": names.message_id(msg_id),
                    "MD5OfMessageBody": attributes.md5_body(body)}
            if a:
                sent["MD5OfMessageAttributes"] = attributes.md5_attributes(a)
            ok.append(sent)
        return {"Successful": ok, "Failed": []}

    async def receive_message(self, params: dict[str, Any], base: str) -> dict[str, Any]:
        name = self.queue(params)
        n = int(params.get("MaxNumberOfMessages") or 1)
        vt = int(params.get("VisibilityTimeout") or self.queues[name])
        deadline = time.monotonic() + int(params.get("WaitTimeSeconds") or 0)
        while True:
            rows = await self.run(_RECEIVE, (vt, name, n))
            left = deadline - time.monotonic()
            if rows or left <= 0:
                break
            event = self.sent.setdefault(name, asyncio.Event())
            # a send of this process wakes it; a lapsed lease within the second
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), min(left, 1.0))
        if not rows:
            return {}
        wanted = set(params.get("AttributeNames") or [])
        wanted |= set(params.get("MessageSystemAttributeNames") or [])
        messages = []
        for msg_id, count, sent_at, first_at, body, attrs in rows:
            m: dict[str, Any] = {"MessageId": names.message_id(msg_id),
                                 "ReceiptHandle": f"{msg_id}.{count}",
                                 "MD5OfBody": attributes.md5_body(body), "Body": body}
            system = {"ApproximateReceiveCount": str(count), "SentTimestamp": _ms(sent_at),
                      "ApproximateFirstReceiveTimestamp": _ms(first_at),
                      "SenderId": names.ACCOUNT}
            chosen = system if "All" in wanted else {k: v for k, v in system.items()
                                                     if k in wanted}
            if chosen:
                m["Attributes"] = chosen
            if attrs and params.get("MessageAttributeNames"):
                m["MessageAttributes"] = attrs
                m["MD5OfMessageAttributes"] = attributes.md5_attributes(attrs)
            messages.append(m)
        return {"Messages": messages}

    async def delete_message(self, params: dict[str, Any], base: str) -> dict[str, Any]:
        self.queue(params)
        msg_id, count = _receipt(params.get("ReceiptHandle"))
        await self.run(_DELETE, ([msg_id], [count]))
        return {}

    async def delete_message_batch(self, params: dict[str, Any], base: str) -> dict[str, Any]:
        self.queue(params)
        entries = params["Entries"]
        held = [_receipt(e.get("ReceiptHandle")) for e in entries]
        await self.run(_DELETE, ([i for i, _ in held], [c for _, c in held]))
        return {"Successful": [{"Id": e["Id"]} for e in entries], "Failed": []}

    async def change_message_visibility(self, params: dict[str, Any],
                                        base: str) -> dict[str, Any]:
        self.queue(params)
        msg_id, count = _receipt(params.get("ReceiptHandle"))
        await self.run(_CHANGE, (int(params["VisibilityTimeout"]), msg_id, count))
        return {}

    # --- the ASGI app --------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] == "lifespan":
            while True:
                event = await receive()
                if event["type"] == "lifespan.startup":
                    await self.open()
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await self.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        chunks = []
        while True:
            event = await receive()
            chunks.append(event.get("body", b""))
            if not event.get("more_body"):
                break
        body = b"".join(chunks)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        status, answer = 200, ""
        try:
            cred = sigv4.parse(headers.get("authorization"))
            sigv4.check_scope(cred, sigv4.DEFAULT_REGION, headers, presigned=False)
            if cred.access_key != self.access_key:
                raise Fault("InvalidClientTokenId", "The security token included in the request"
                            " is invalid.", 403)
            pairs = parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)
            sigv4.verify(cred, self.secret, scope["method"], scope["raw_path"].decode("latin-1"),
                         pairs, headers, body)
            action = self.actions.get(headers.get("x-amz-target", "").removeprefix("AmazonSQS."))
            if action is None:
                raise Fault("InvalidAction", "The action is not valid for this endpoint.")
            answer = json.dumps(await action(json.loads(body), f"http://{headers['host']}"))
        except sigv4.SignatureError as err:
            status, answer = 403, json.dumps({"__type": f"com.amazonaws.sqs#{err.code}",
                                              "message": err.message})
        except Fault as err:
            status, answer = err.status, json.dumps({"__type": f"com.amazonaws.sqs#{err.code}",
                                                     "message": str(err)})
        data = answer.encode()
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/x-amz-json-1.0"),
            (b"content-length", str(len(data)).encode()),
            (b"x-amzn-requestid", str(uuid.uuid4()).encode())]})
        await send({"type": "http.response.body", "body": data})


def main(argv: list[str]) -> None:
    import uvicorn

    dsn, port = argv[0], int(argv[1])
    access_key, secret = os.environ[KEY_ENV].split(":", 1)
    install(dsn)
    uvicorn.run(Floor(dsn, access_key, secret), host="127.0.0.1", port=port,
                log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])
