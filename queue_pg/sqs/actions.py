"""The SQS actions, each a translation onto one or a few :class:`queue_pg.AsyncClient` calls.

No queue rule lives here: limits, leases, dead-lettering, FIFO order and dedup are the SQL's.
What is here is SQS's shape of things: names, units (seconds as strings), attribute names, the
digests, SQS's own stricter limits (10 entries a batch), and per-entry batch results.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from queue_pg import errors
from queue_pg.aio import AsyncClient
from queue_pg.errors import InvalidParameter, QueueError
from queue_pg.sqs import attributes, names, tags
from queue_pg.sqs.errors import BatchError, MissingParameter, QueueNameExists, describe
from queue_pg.types import Message, MessageDetails, QueueConfig, RedriveAllow

MAX_BATCH = 10


@dataclass
class Request:
    """One call: the role's client, the parameters, and the base URL queue URLs start with."""

    client: AsyncClient
    params: dict[str, Any]
    base_url: str

    def queue(self) -> str:
        url = self.params.get("QueueUrl")
        if not isinstance(url, str):
            raise MissingParameter("The request must contain the parameter QueueUrl.")
        return names.from_url(url)

    def int_param(self, key: str, default: int | None = None) -> int | None:
        return _int(self.params.get(key, default), key)


def _int(value: Any, key: str) -> int | None:
    """An SQS integer (a JSON number or its string), None when absent; else InvalidParameter."""
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InvalidParameter(f"Value {value!r} for parameter {key} is invalid.") from None


# --- queue attributes -----------------------------------------------------------------------

_SETTINGS = {  # SQS attribute -> queue_pg setting, both in seconds or bytes
    "VisibilityTimeout": "visibility_timeout",
    "MessageRetentionPeriod": "message_ttl",
    "DelaySeconds": "delay",
    "ReceiveMessageWaitTimeSeconds": "receive_wait",
    "MaximumMessageSize": "max_message_size",
}
_IGNORED = {"KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds", "SqsManagedSseEnabled", "Policy",
            "DeduplicationScope", "FifoThroughputLimit"}
_PERMISSIONS = {"allowAll": "allow_all", "denyAll": "deny_all", "byQueue": "by_queue"}


def _redrive_allow(value: str) -> tuple[str, list[str] | None]:
    """SQS's RedriveAllowPolicy as queue_pg's (permission, sources); SQL checks the rest."""
    if value == "":
        return "allow_all", None
    try:
        policy = json.loads(value)
        permission = _PERMISSIONS[policy["redrivePermission"]]
        arns = policy.get("sourceQueueArns")
        sources = None if arns is None else [names.from_arn(a) for a in arns]
    except (ValueError, KeyError, TypeError, AttributeError, errors.QueueNotFound):
        raise InvalidParameter(
            "Value for parameter RedriveAllowPolicy is invalid: a JSON object with"
            " redrivePermission (allowAll, denyAll or byQueue) and, for byQueue,"
            " sourceQueueArns") from None
    return permission, sources


def _settings(attrs: dict[str, str], creating: bool) -> dict[str, Any]:
    """SQS queue attributes as queue_pg settings (the SQL checks the ranges)."""
    out: dict[str, Any] = {}
    for key, value in attrs.items():
        if not isinstance(value, str):
            raise InvalidParameter(f"Value {value!r} for attribute {key} is invalid: a string.")
        if key in _SETTINGS:
            out[_SETTINGS[key]] = _int(value, key)
        elif key == "RedrivePolicy":
            if value == "":
                out["dead_letter_queue"] = None
                continue
            try:
                policy = json.loads(value)
                out["dead_letter_queue"] = names.from_arn(policy["deadLetterTargetArn"])
                out["max_receive_count"] = int(policy["maxReceiveCount"])
            except (ValueError, KeyError, TypeError):
                raise InvalidParameter(
                    "Value for parameter RedrivePolicy is invalid: a JSON object with"
                    " deadLetterTargetArn and maxReceiveCount") from None
        elif key == "RedriveAllowPolicy":
            out["redrive_allow"] = _redrive_allow(value)
        elif key == "FifoQueue":
            if not creating:
                raise InvalidParameter("Attribute FifoQueue can only be set at creation.")
            out["fifo"] = value.lower() == "true"
        elif key == "ContentBasedDeduplication":
            out["content_dedup"] = value.lower() == "true"
        elif key not in _IGNORED:
            raise InvalidParameter(f"Unknown Attribute {key}.")
    return out


def _attributes(config: QueueConfig, stats: Any, wanted: list[str],
                allow: RedriveAllow | None) -> dict[str, str]:
    sqs_name = names.to_sqs(config)
    ttl = config.message_ttl
    out = {
        "QueueArn": names.arn(sqs_name),
        "VisibilityTimeout": str(int(config.visibility_timeout)),
        "MessageRetentionPeriod": str(int(ttl)) if ttl is not None else "1209600",
        "DelaySeconds": str(int(config.delay)),
        "ReceiveMessageWaitTimeSeconds": str(int(config.receive_wait)),
        "MaximumMessageSize": str(config.max_message_size),
        "CreatedTimestamp": str(int(config.created_at.timestamp())),
        "LastModifiedTimestamp": str(int(config.created_at.timestamp())),
        "ApproximateNumberOfMessages": str(stats.visible),
        "ApproximateNumberOfMessagesNotVisible": str(stats.in_flight),
        "ApproximateNumberOfMessagesDelayed": str(stats.delayed),
    }
    if config.dead_letter_queue is not None:
        # SQS wants a FIFO queue's dead-letter queue FIFO too (queue_pg does not check it)
        dlq = names.sqs_name(config.dead_letter_queue, config.fifo)
        out["RedrivePolicy"] = json.dumps({
            "deadLetterTargetArn": names.arn(dlq),
            "maxReceiveCount": config.max_receive_count,
        })
    if allow is not None and allow.permission != "allow_all":  # SQS shows it once set
        policy: dict[str, Any] = {"redrivePermission": next(
            k for k, v in _PERMISSIONS.items() if v == allow.permission)}
        if allow.sources is not None:
            policy["sourceQueueArns"] = [names.arn(names.sqs_name(q, config.fifo))
                                         for q in allow.sources]
        out["RedriveAllowPolicy"] = json.dumps(policy)
    if config.fifo:
        out["FifoQueue"] = "true"
        out["ContentBasedDeduplication"] = "true" if config.content_dedup else "false"
    if "All" in wanted:
        return out
    return {k: v for k, v in out.items() if k in wanted}


async def create_queue(r: Request) -> dict[str, Any]:
    sqs_name = r.params.get("QueueName")
    if not isinstance(sqs_name, str):
        raise MissingParameter("The request must contain the parameter QueueName.")
    settings = _settings(dict(r.params.get("Attributes") or {}), creating=True)
    if sqs_name.endswith(".fifo") != bool(settings.get("fifo")):
        raise InvalidParameter("The name of a FIFO queue can only include alphanumeric"
                               " characters, hyphens, or underscores, must end with .fifo"
                               " suffix, and FifoQueue=true is required for it.")
    allow = settings.pop("redrive_allow", None)
    try:
        await r.client.create_queue(names.to_queue_pg(sqs_name), **settings)
    except errors.QueueAlreadyExists as err:
        raise QueueNameExists(str(err)) from None
    if allow is not None:
        await r.client.set_redrive_allow(names.to_queue_pg(sqs_name), *allow)
    if r.params.get("tags"):
        await tags.tag(r.client, names.to_queue_pg(sqs_name), _tag_map(r.params["tags"]))
    return {"QueueUrl": names.url(r.base_url, sqs_name)}


def _tag_map(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidParameter("Tags must be a map of tag keys to values.")
    return value


async def tag_queue(r: Request) -> dict[str, Any]:
    await tags.tag(r.client, r.queue(), _tag_map(r.params.get("Tags")))
    return {}


async def untag_queue(r: Request) -> dict[str, Any]:
    keys = r.params.get("TagKeys")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise MissingParameter("The request must contain the parameter TagKeys.")
    await tags.untag(r.client, r.queue(), keys)
    return {}


async def list_queue_tags(r: Request) -> dict[str, Any]:
    found = await tags.tags(r.client, r.queue())
    return {"Tags": found} if found else {}


async def get_queue_url(r: Request) -> dict[str, Any]:
    sqs_name = r.params.get("QueueName")
    if not isinstance(sqs_name, str):
        raise MissingParameter("The request must contain the parameter QueueName.")
    config = await r.client.get_queue(names.to_queue_pg(sqs_name))
    return {"QueueUrl": names.url(r.base_url, names.to_sqs(config))}


async def list_queues(r: Request) -> dict[str, Any]:
    prefix = r.params.get("QueueNamePrefix") or ""
    limit = r.int_param("MaxResults", 1000) or 1000
    start = r.params.get("NextToken") or ""
    found = sorted(names.to_sqs(c) for c in await r.client.list_queues())
    found = [n for n in found if n.startswith(prefix) and n > start]
    out: dict[str, Any] = {"QueueUrls": [names.url(r.base_url, n) for n in found[:limit]]}
    if len(found) > limit and "MaxResults" in r.params:
        out["NextToken"] = found[limit - 1]
    return out


async def delete_queue(r: Request) -> dict[str, Any]:
    await r.client.drop_queue(r.queue())
    return {}


async def get_queue_attributes(r: Request) -> dict[str, Any]:
    queue = r.queue()
    wanted = list(r.params.get("AttributeNames") or ["All"])
    config = await r.client.get_queue(queue)
    stats = await r.client.stats(queue)
    allow = None
    if "All" in wanted or "RedriveAllowPolicy" in wanted:
        allow = await r.client.redrive_allow(queue)
    return {"Attributes": _attributes(config, stats, wanted, allow)}


async def set_queue_attributes(r: Request) -> dict[str, Any]:
    queue = r.queue()
    settings = _settings(dict(r.params.get("Attributes") or {}), creating=False)
    allow = settings.pop("redrive_allow", None)
    if allow is not None:
        await r.client.set_redrive_allow(queue, *allow)
    clear = [k for k, v in settings.items() if v is None and k == "dead_letter_queue"]
    if clear:
        del settings["dead_letter_queue"]
        clear.append("max_receive_count")
    await r.client.alter_queue(queue, clear=clear or None, **settings)
    return {}


async def purge_queue(r: Request) -> dict[str, Any]:
    await r.client.purge(r.queue())
    return {}


async def list_dead_letter_source_queues(r: Request) -> dict[str, Any]:
    queue = r.queue()
    await r.client.get_queue(queue)  # QueueDoesNotExist when it does not
    sources = [names.to_sqs(c) for c in await r.client.list_queues()
               if c.dead_letter_queue == queue]
    return {"queueUrls": [names.url(r.base_url, n) for n in sorted(sources)]}


# --- messages -----------------------------------------------------------------------------------

def _body(entry: dict[str, Any]) -> str:
    body = entry.get("MessageBody")
    if not isinstance(body, str) or body == "":
        raise MissingParameter("The request must contain the parameter MessageBody.")
    return body


def _sent(body: str, attrs: dict[str, Any] | None, msg_id: int, fifo: bool) -> dict[str, Any]:
    out = {"MessageId": names.message_id(msg_id), "MD5OfMessageBody": attributes.md5_body(body)}
    digest = attributes.md5_attributes(attrs or {})
    if digest is not None:
        out["MD5OfMessageAttributes"] = digest
    if fifo:
        out["SequenceNumber"] = names.sequence_number(msg_id)
    return out


async def _send_one(r: Request, queue: str, entry: dict[str, Any]) -> dict[str, Any]:
    body = _body(entry)
    attrs = attributes.to_queue_pg(entry.get("MessageAttributes"))
    msg_id = await r.client.send(
        queue, body, delay=_int(entry.get("DelaySeconds"), "DelaySeconds"), attributes=attrs,
        group=entry.get("MessageGroupId"), dedup_id=entry.get("MessageDeduplicationId"),
    )
    return _sent(body, attrs, msg_id, names.is_fifo_url(r.params.get("QueueUrl")))


async def send_message(r: Request) -> dict[str, Any]:
    return await _send_one(r, r.queue(), r.params)


def _entries(r: Request) -> list[dict[str, Any]]:
    entries = r.params.get("Entries")
    if not entries:
        raise BatchError("AWS.SimpleQueueService.EmptyBatchRequest",
                         "There should be at least one entry in the request.")
    if len(entries) > MAX_BATCH:
        raise BatchError("AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
                         f"Maximum number of entries per request are {MAX_BATCH}."
                         f" You have sent {len(entries)}.")
    ids = [e.get("Id") for e in entries]
    if len(set(ids)) != len(ids):
        raise BatchError("AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
                         "Two or more batch entries in the request have the same Id.")
    return list(entries)


async def _each(
    r: Request, run: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    """Run ``run`` per entry: SQS batches succeed or fail per entry, not as a whole; a missing
    queue or a missing grant fails the whole request, as in SQS."""
    ok, failed = [], []
    for entry in _entries(r):
        try:
            ok.append({"Id": entry.get("Id"), **await run(entry)})
        except (errors.QueueNotFound, errors.AccessDenied):
            raise
        except QueueError as err:
            code, _status, _query, sender = describe(err)
            failed.append({"Id": entry.get("Id"), "Code": code, "Message": str(err),
                           "SenderFault": sender})
    return {"Successful": ok, "Failed": failed}


async def send_message_batch(r: Request) -> dict[str, Any]:
    """One ``send_batch`` statement when every entry is well formed and shares one delay;
    entry by entry when not, or when the statement is refused, so each failure stays its own."""
    queue = r.queue()
    entries = _entries(r)
    try:
        prepared = [(_body(e), attributes.to_queue_pg(e.get("MessageAttributes"))) for e in entries]
        delays = {e.get("DelaySeconds") for e in entries}
    except QueueError:
        prepared, delays = [], set()
    if prepared and len(delays) == 1:
        (delay,) = delays
        try:
            ids = await r.client.send_batch(
                queue, [b for b, _ in prepared], delay=_int(delay, "DelaySeconds"),
                attributes=[a for _, a in prepared],
                group=[e.get("MessageGroupId") for e in entries],
                dedup_ids=[e.get("MessageDeduplicationId") for e in entries])
        except (errors.QueueNotFound, errors.AccessDenied):
            raise
        except QueueError:
            pass  # one entry spoils the statement: find which, entry by entry
        else:
            fifo = names.is_fifo_url(r.params.get("QueueUrl"))
            return {"Successful": [{"Id": e.get("Id"), **_sent(b, a, i, fifo)}
                                   for e, (b, a), i in zip(entries, prepared, ids, strict=True)],
                    "Failed": []}
    return await _each(r, lambda e: _send_one(r, queue, e))


#: System attributes that take one more statement (``message_details``), made only when asked for
DETAILS = {"All", "MessageGroupId", "MessageDeduplicationId", "SequenceNumber"}


def _message(m: Message, wanted: set[str], want_attrs: list[str],
             details: MessageDetails | None = None) -> dict[str, Any]:
    body = m.body if isinstance(m.body, str) else json.dumps(m.body)
    out: dict[str, Any] = {"MessageId": names.message_id(m.id), "ReceiptHandle": m.receipt,
                           "MD5OfBody": attributes.md5_body(body), "Body": body}
    system = {
        "ApproximateReceiveCount": str(m.receive_count),
        "SentTimestamp": str(int(m.enqueued_at.timestamp() * 1000)),
        "SenderId": names.ACCOUNT,
    }
    if m.first_received_at is not None:
        first = int(m.first_received_at.timestamp() * 1000)
        system["ApproximateFirstReceiveTimestamp"] = str(first)
    if details is not None:
        if details.group is not None:
            system["MessageGroupId"] = details.group
        if details.dedup_id is not None:
            system["MessageDeduplicationId"] = details.dedup_id
        if details.sequence is not None:
            system["SequenceNumber"] = names.sequence_number(details.sequence)
    chosen = system if "All" in wanted else {k: v for k, v in system.items() if k in wanted}
    if chosen:
        out["Attributes"] = chosen
    attrs = attributes.to_sqs(m.attributes)
    if "All" not in want_attrs and ".*" not in want_attrs:
        attrs = {k: v for k, v in attrs.items()
                 if k in want_attrs or any(p.endswith(".*") and k.startswith(p[:-1])
                                           for p in want_attrs)}
    if attrs:
        out["MessageAttributes"] = attrs
        out["MD5OfMessageAttributes"] = attributes.md5_attributes(attrs)
    return out


async def receive_message(r: Request) -> dict[str, Any]:
    queue = r.queue()
    n = r.int_param("MaxNumberOfMessages", 1) or 1
    if not 1 <= n <= MAX_BATCH:
        raise InvalidParameter(f"Value {n} for parameter MaxNumberOfMessages is invalid."
                               f" Reason: Must be between 1 and {MAX_BATCH}, if provided.")
    # WaitTimeSeconds' range (0-20) is SQL's rule: receive refuses it (InvalidParameterValue)
    messages = await r.client.receive(queue, n, visibility_timeout=r.int_param("VisibilityTimeout"),
                                      wait=r.int_param("WaitTimeSeconds"))
    wanted = set(r.params.get("AttributeNames") or [])
    wanted |= set(r.params.get("MessageSystemAttributeNames") or [])
    want_attrs = list(r.params.get("MessageAttributeNames") or [])
    details: dict[str, MessageDetails] = {}
    if messages and wanted & DETAILS:
        # one more statement, only when asked: group, dedup id, sequence number by receipt
        # (SQL checks the grant)
        details = await r.client.message_details(queue, [m.receipt for m in messages if m.receipt])
    return {"Messages": [_message(m, wanted, want_attrs, details.get(m.receipt or ""))
                         for m in messages]}


def _receipt(entry: dict[str, Any]) -> str:
    receipt = entry.get("ReceiptHandle")
    if not isinstance(receipt, str):
        raise MissingParameter("The request must contain the parameter ReceiptHandle.")
    return receipt


async def _delete_one(r: Request, queue: str, entry: dict[str, Any]) -> dict[str, Any]:
    # SQS: an older receipt's delete succeeds (and may delete nothing)
    with contextlib.suppress(errors.StaleReceipt):
        await r.client.delete(queue, _receipt(entry))
    return {}


async def delete_message(r: Request) -> dict[str, Any]:
    return await _delete_one(r, r.queue(), r.params)


async def delete_message_batch(r: Request) -> dict[str, Any]:
    """One ``delete_batch`` statement; its per-receipt results become SQS's per-entry ones."""
    queue = r.queue()
    entries = _entries(r)
    receipts = [e.get("ReceiptHandle") for e in entries]
    if not all(isinstance(x, str) and x for x in receipts):
        return await _each(r, lambda e: _delete_one(r, queue, e))
    distinct = list(dict.fromkeys(str(x) for x in receipts))  # SQS allows repeats; queue_pg not
    results = {x.receipt: x for x in await r.client.delete_batch(queue, distinct)}
    ok, failed = [], []
    for entry, receipt in zip(entries, receipts, strict=True):
        result = results[str(receipt)]
        if result.error is None or result.error == "StaleReceipt":  # SQS: a stale one succeeds
            ok.append({"Id": entry.get("Id")})
        else:
            failed.append({"Id": entry.get("Id"), "Code": "ReceiptHandleIsInvalid",
                           "Message": f"The receipt handle is invalid ({result.error}).",
                           "SenderFault": True})
    return {"Successful": ok, "Failed": failed}


async def _change_one(r: Request, queue: str, entry: dict[str, Any]) -> dict[str, Any]:
    timeout = _int(entry.get("VisibilityTimeout"), "VisibilityTimeout")
    if timeout is None:
        raise MissingParameter("The request must contain the parameter VisibilityTimeout.")
    await r.client.change_visibility(queue, _receipt(entry), timeout)
    return {}


async def change_message_visibility(r: Request) -> dict[str, Any]:
    return await _change_one(r, r.queue(), r.params)


async def change_message_visibility_batch(r: Request) -> dict[str, Any]:
    queue = r.queue()
    return await _each(r, lambda e: _change_one(r, queue, e))


ACTIONS: dict[str, Callable[[Request], Awaitable[dict[str, Any]]]] = {
    "CreateQueue": create_queue,
    "GetQueueUrl": get_queue_url,
    "ListQueues": list_queues,
    "DeleteQueue": delete_queue,
    "GetQueueAttributes": get_queue_attributes,
    "SetQueueAttributes": set_queue_attributes,
    "PurgeQueue": purge_queue,
    "ListDeadLetterSourceQueues": list_dead_letter_source_queues,
    "SendMessage": send_message,
    "SendMessageBatch": send_message_batch,
    "ReceiveMessage": receive_message,
    "DeleteMessage": delete_message,
    "DeleteMessageBatch": delete_message_batch,
    "ChangeMessageVisibility": change_message_visibility,
    "ChangeMessageVisibilityBatch": change_message_visibility_batch,
    "TagQueue": tag_queue,
    "UntagQueue": untag_queue,
    "ListQueueTags": list_queue_tags,
}  # and moves.ACTIONS
