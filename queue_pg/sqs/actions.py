"""The SQS actions, each a translation onto one or a few :class:`queue_pg.AsyncClient` calls.

No queue rule lives here: limits, leases, dead-lettering, FIFO order and dedup are the SQL's.
What is here is SQS's shape of things: names, units (seconds as strings), attribute names, the
digests, SQS's own stricter limits (10 entries a batch), and per-entry batch results.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from psycopg.types.json import Jsonb

from queue_pg import errors
from queue_pg._ops import Call
from queue_pg.aio import AsyncClient
from queue_pg.errors import InvalidParameter, QueueError
from queue_pg.sqs import attributes, names, tags
from queue_pg.sqs.errors import (
    BatchError,
    MissingParameter,
    QueueNameExists,
    SqsError,
    describe,
    message,
)
from queue_pg.types import Message, MessageDetails, QueueConfig, RedriveAllow

MAX_BATCH = 10
T = TypeVar("T")


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


# --- parameter types ------------------------------------------------------------------------

_STR, _INT, _STRS, _STR_MAP, _OBJ_MAP, _ENTRIES = "a string", "an integer", "a list of strings", \
    "a map of strings", "a map of objects", "a list of entries"
#: Every parameter the actions read, by name (SQS's names have one type in every action).
_TYPES: dict[str, str] = {
    **dict.fromkeys(["QueueUrl", "QueueName", "QueueNamePrefix", "NextToken", "MessageBody",
                     "ReceiptHandle", "Id", "MessageGroupId", "MessageDeduplicationId",
                     "ReceiveRequestAttemptId", "Label", "SourceArn", "DestinationArn",
                     "TaskHandle"], _STR),
    **dict.fromkeys(["DelaySeconds", "MaxNumberOfMessages", "VisibilityTimeout",
                     "WaitTimeSeconds", "MaxResults", "MaxNumberOfMessagesPerSecond"], _INT),
    **dict.fromkeys(["AttributeNames", "MessageAttributeNames", "MessageSystemAttributeNames",
                     "TagKeys", "AWSAccountIds", "Actions"], _STRS),
    **dict.fromkeys(["Attributes", "tags", "Tags"], _STR_MAP),
    **dict.fromkeys(["MessageAttributes", "MessageSystemAttributes"], _OBJ_MAP),
    "Entries": _ENTRIES,
}


def _fits(kind: str, value: Any) -> bool:
    if kind == _STR:
        return isinstance(value, str)
    if kind == _INT:
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    if kind == _STRS:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == _STR_MAP:
        return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
    if kind == _OBJ_MAP:
        return isinstance(value, dict) and all(isinstance(v, dict) for v in value.values())
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


def check_types(params: dict[str, Any]) -> None:
    """InvalidParameterValue for a known parameter of the wrong JSON type (and in each batch
    entry): the actions below may then read each as its type. Unknown names are ignored, as SQS
    ignores them."""
    for key, value in params.items():
        kind = _TYPES.get(key)
        if kind is None or value is None:
            continue
        if not _fits(kind, value):
            raise InvalidParameter(f"Value for parameter {key} is invalid. Reason: must be {kind}.")
        if kind == _ENTRIES:
            for entry in value:
                check_types(entry)


# --- queue attributes -----------------------------------------------------------------------

_SETTINGS = {  # SQS attribute -> queue_pg setting, both in seconds or bytes
    "VisibilityTimeout": "visibility_timeout",
    "MessageRetentionPeriod": "message_ttl",
    "DelaySeconds": "delay",
    "ReceiveMessageWaitTimeSeconds": "receive_wait",
    "MaximumMessageSize": "max_message_size",
}
#: SQS's ranges of its integer attributes (queue_pg's own are broader).
#: (SQS documents 60 s at least for MessageRetentionPeriod, and accepts less.)
_RANGES = {"VisibilityTimeout": (0, 43200), "MessageRetentionPeriod": (1, 1209600),
           "DelaySeconds": (0, 900), "ReceiveMessageWaitTimeSeconds": (0, 20),
           "MaximumMessageSize": (1024, 1048576), "KmsDataKeyReusePeriodSeconds": (60, 86400)}
#: SQS's default retention (4 days), which CreateQueue gives a queue that names none.
DEFAULT_RETENTION = 345600
#: Attributes kept as given (queue_pg.sqs_set_queue_attributes), their allowed values (None: any).
_KEPT: dict[str, tuple[str, ...] | None] = {
    "Policy": None, "KmsMasterKeyId": None, "KmsDataKeyReusePeriodSeconds": None,
    "SqsManagedSseEnabled": ("true", "false"), "DeduplicationScope": ("messageGroup", "queue"),
    "FifoThroughputLimit": ("perQueue", "perMessageGroupId")}
#: What a FIFO queue shows for its kept attributes before any is set.
_FIFO_DEFAULTS = {"DeduplicationScope": "queue", "FifoThroughputLimit": "perQueue"}
_PERMISSIONS = {"allowAll": "allow_all", "denyAll": "deny_all", "byQueue": "by_queue"}
_READ_ONLY = {"QueueArn", "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
              "ApproximateNumberOfMessagesDelayed", "CreatedTimestamp", "LastModifiedTimestamp"}
#: Every attribute GetQueueAttributes knows.
ATTRIBUTE_NAMES = frozenset({"All", *_SETTINGS, *_KEPT, *_READ_ONLY, "RedrivePolicy",
                             "RedriveAllowPolicy", "FifoQueue", "ContentBasedDeduplication"})


def _bad_name(key: str) -> SqsError:
    return SqsError("InvalidAttributeName", f"Unknown Attribute {key}.")


def _bad_value(key: str, reason: str) -> SqsError:
    return SqsError("InvalidAttributeValue", f"Invalid value for the parameter {key}. Reason:"
                                             f" {reason}")


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
        raise _bad_value("RedriveAllowPolicy", "a JSON object with redrivePermission (allowAll,"
                         " denyAll or byQueue) and, for byQueue, sourceQueueArns") from None
    return permission, sources


def _attrs(r: Request) -> dict[str, str]:
    """The request's Attributes, names stripped of surrounding blanks (as SQS reads them)."""
    return {str(k).strip(): v for k, v in (r.params.get("Attributes") or {}).items()}


def _settings(attrs: dict[str, str], creating: bool) -> tuple[dict[str, Any], dict[str, str]]:
    """SQS queue attributes as (queue_pg settings, attributes kept as given), checked against
    SQS's ranges: InvalidAttributeName for an unknown one, InvalidAttributeValue for a value."""
    out: dict[str, Any] = {}
    kept: dict[str, str] = {}
    for key, value in attrs.items():
        if key not in ATTRIBUTE_NAMES or key in _READ_ONLY or key == "All":
            raise _bad_name(key)
        if not isinstance(value, str):
            raise _bad_value(key, "must be a string.")
        if key in _RANGES:
            lo, hi = _RANGES[key]
            number = value.strip()
            if not (number.lstrip("-").isdigit() and number.isascii()) or not (
                    lo <= int(number) <= hi):
                raise _bad_value(key, f"must be an integer from {lo} to {hi}.")
        if key in _SETTINGS:
            out[_SETTINGS[key]] = int(value)
        elif key in _KEPT:
            allowed = _KEPT[key]
            if allowed is not None and value not in allowed and value != "":
                raise _bad_value(key, f"must be one of {', '.join(allowed)}.")
            if key == "Policy" and value != "":
                try:
                    json.loads(value)
                except ValueError:
                    raise _bad_value(key, "must be a JSON policy document.") from None
            kept[key] = value
        elif key == "RedrivePolicy":
            if value == "":
                out["dead_letter_queue"] = None
                continue
            try:
                policy = json.loads(value)
                out["dead_letter_queue"] = names.from_arn(policy["deadLetterTargetArn"])
                out["max_receive_count"] = int(policy["maxReceiveCount"])
            except (ValueError, KeyError, TypeError, AttributeError, errors.QueueNotFound):
                raise _bad_value("RedrivePolicy", "a JSON object with deadLetterTargetArn and"
                                 " maxReceiveCount.") from None
        elif key == "RedriveAllowPolicy":
            out["redrive_allow"] = _redrive_allow(value)
        elif key == "FifoQueue":
            if not creating:
                raise SqsError("InvalidAttributeName", "Attribute FifoQueue can only be set at"
                               " creation.")
            out["fifo"] = value.lower() == "true"
        elif key == "ContentBasedDeduplication":
            out["content_dedup"] = value.lower() == "true"
    return out, kept


async def _check_dead_letter_kind(r: Request, settings: dict[str, Any], fifo: bool) -> None:
    """SQS's rule: a FIFO queue's dead-letter queue is FIFO, a standard queue's standard."""
    dlq = settings.get("dead_letter_queue")
    if dlq is None:
        return
    try:
        target = await r.client.get_queue(dlq)
    except errors.QueueNotFound:
        return  # queue_pg's own check names it
    if target.fifo != fifo:
        kind = "FIFO" if fifo else "standard"
        raise _bad_value("RedrivePolicy", f"Dead-letter target must also be a {kind} queue.")


async def _kept(r: Request, queue: str) -> tuple[dict[str, str], dict[str, Any]]:
    """A queue's kept attributes and its permissions (queue_pg.sqs_queue_attributes)."""
    call = Call("select * from queue_pg.sqs_queue_attributes(%(queue)s)", {"queue": queue},
                lambda _c, rows: (dict(rows[0][0] or {}), dict(rows[0][1] or {})))
    return await r.client._run(call, None)


async def _keep(r: Request, queue: str, kept: dict[str, str]) -> None:
    if kept:
        call: Call[None] = Call(
            "select queue_pg.sqs_set_queue_attributes(%(queue)s, %(attrs)s::jsonb)",
            {"queue": queue, "attrs": Jsonb(kept)}, lambda _c, _r: None)
        await r.client._run(call, None)


def _policy(sqs_name: str, kept: dict[str, str], permissions: dict[str, Any]) -> str | None:
    """The Policy attribute: the one set, with AddPermission's statements added."""
    if not permissions:
        return kept.get("Policy")
    try:
        policy = json.loads(kept.get("Policy") or "{}")
    except ValueError:
        policy = {}
    if not isinstance(policy, dict):
        policy = {}
    policy.setdefault("Version", "2012-10-17")
    policy.setdefault("Id", f"{names.arn(sqs_name)}/SQSDefaultPolicy")
    statements = policy.get("Statement")
    statements = list(statements) if isinstance(statements, list) else []
    for label, p in sorted(permissions.items()):
        principals = [f"arn:aws:iam::{x}:root" for x in p["principals"]]
        actions = [f"SQS:{a}" for a in p["actions"]]
        statements.append({
            "Sid": label, "Effect": "Allow",
            "Principal": {"AWS": principals[0] if len(principals) == 1 else principals},
            "Action": actions[0] if len(actions) == 1 else actions,
            "Resource": names.arn(sqs_name)})
    policy["Statement"] = statements
    return json.dumps(policy)


def _attributes(config: QueueConfig, stats: Any, wanted: set[str],
                allow: RedriveAllow | None, kept: dict[str, str],
                permissions: dict[str, Any]) -> dict[str, str]:
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
    }
    if stats is not None:
        out.update({"ApproximateNumberOfMessages": str(stats.visible),
                    "ApproximateNumberOfMessagesNotVisible": str(stats.in_flight),
                    "ApproximateNumberOfMessagesDelayed": str(stats.delayed)})
    if config.dead_letter_queue is not None:
        dlq = names.sqs_name(config.dead_letter_queue, config.fifo)  # SQS: the same kind
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
        out.update(_FIFO_DEFAULTS)
    out.update({k: v for k, v in kept.items() if k != "Policy"})
    policy_text = _policy(sqs_name, kept, permissions)
    if policy_text is not None:
        out["Policy"] = policy_text
    if "All" in wanted:
        return out
    return {k: v for k, v in out.items() if k in wanted}


_QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")


def _check_name(sqs_name: str) -> None:
    base = sqs_name.removesuffix(".fifo")
    if not _QUEUE_NAME.fullmatch(base) or len(sqs_name) > 80:
        raise InvalidParameter("Can only include alphanumeric characters, hyphens, or"
                               " underscores. 1 to 80 in length")


async def create_queue(r: Request) -> dict[str, Any]:
    sqs_name = r.params.get("QueueName")
    if not isinstance(sqs_name, str):
        raise MissingParameter("The request must contain the parameter QueueName.")
    _check_name(sqs_name)
    given = _attrs(r)
    settings, kept = _settings(given, creating=True)
    fifo = bool(settings.get("fifo"))
    if sqs_name.endswith(".fifo") != fifo:
        raise InvalidParameter("The name of a FIFO queue can only include alphanumeric"
                               " characters, hyphens, or underscores, must end with .fifo"
                               " suffix, and FifoQueue=true is required for it.")
    queue = names.to_queue_pg(sqs_name)
    url = {"QueueUrl": names.url(r.base_url, sqs_name)}
    for _ in range(2):  # a create that races another create compares with it
        with contextlib.suppress(errors.QueueNotFound):
            config = await r.client.get_queue(queue)
            await _same_attributes(r, config, given)
            return url
        await _check_dead_letter_kind(r, settings, fifo)
        settings.setdefault("message_ttl", DEFAULT_RETENTION)
        allow = settings.pop("redrive_allow", None)
        try:
            await r.client.create_queue(queue, **settings)
        except errors.QueueAlreadyExists:
            settings["redrive_allow"] = allow
            continue
        if allow is not None:
            await r.client.set_redrive_allow(queue, *allow)
        await _keep(r, queue, {k: v for k, v in kept.items() if v != ""})
        if r.params.get("tags"):
            await tags.tag(r.client, queue, _tag_map(r.params["tags"]))
        return url
    raise QueueNameExists(f"A queue named {sqs_name} is being created with other attributes.")


async def _same_attributes(r: Request, config: QueueConfig, given: dict[str, str]) -> None:
    """QueueAlreadyExists unless each attribute given has the value the queue has (SQS compares
    only those given)."""
    kept, permissions = await _kept(r, config.name) if set(given) & set(_KEPT) else ({}, {})
    allow = await r.client.redrive_allow(config.name) if "RedriveAllowPolicy" in given else None
    have = _attributes(config, None, {"All"}, allow, kept, permissions)
    have.setdefault("FifoQueue", "false")
    have.setdefault("ContentBasedDeduplication", "false")
    for key, value in given.items():
        now = have.get(key, "")
        same = now == value or (key in ("FifoQueue", "ContentBasedDeduplication")
                                and (now == "true") == (value.lower() == "true"))
        if key in ("RedrivePolicy", "RedriveAllowPolicy", "Policy") and not same:
            with contextlib.suppress(ValueError, TypeError):
                same = json.loads(now or "null") == json.loads(value or "null")
        if not same:
            raise QueueNameExists(f"A queue already exists with the same name and a different"
                                  f" value for attribute {key}")


def _tag_map(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidParameter("Tags must be a map of tag keys to values.")
    return value


async def tag_queue(r: Request) -> dict[str, Any]:
    queue = r.queue()
    given = r.params.get("Tags")
    if not given:
        raise MissingParameter("The request must contain the parameter Tags.")
    try:
        await tags.tag(r.client, queue, _tag_map(given))
    except InvalidParameter as err:
        if "at most 50" in str(err):
            name = names.url_name(str(r.params["QueueUrl"]))
            raise InvalidParameter(f"Too many tags added for queue {name}.") from None
        raise
    return {}


async def untag_queue(r: Request) -> dict[str, Any]:
    keys = r.params.get("TagKeys")
    if not isinstance(keys, list):
        raise MissingParameter("The request must contain the parameter TagKeys.")
    if not keys or not all(1 <= len(k) <= 128 for k in keys):
        raise InvalidParameter("Tag keys must be between 1 and 128 characters in length.")
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
    if not 1 <= limit <= 1000:
        raise InvalidParameter(f"Value {limit} for parameter MaxResults is invalid. Reason: must"
                               " be between 1 and 1000.")
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
    wanted = {str(n).strip() for n in r.params.get("AttributeNames") or []}
    unknown = sorted(wanted - ATTRIBUTE_NAMES)
    if unknown:
        raise _bad_name(unknown[0])
    config = await r.client.get_queue(queue)
    if not wanted:  # SQS: no names, no attributes
        return {}
    stats = None
    if "All" in wanted or wanted & {"ApproximateNumberOfMessages",
                                    "ApproximateNumberOfMessagesNotVisible",
                                    "ApproximateNumberOfMessagesDelayed"}:
        stats = await r.client.stats(queue)
    allow = None
    if wanted & {"All", "RedriveAllowPolicy"}:
        allow = await r.client.redrive_allow(queue)
    kept: dict[str, str] = {}
    permissions: dict[str, Any] = {}
    if wanted & {"All", *_KEPT}:
        kept, permissions = await _kept(r, queue)
    found = _attributes(config, stats, wanted, allow, kept, permissions)
    return {"Attributes": found} if found else {}


async def set_queue_attributes(r: Request) -> dict[str, Any]:
    queue = r.queue()
    settings, kept = _settings(_attrs(r), creating=False)
    if settings.get("dead_letter_queue") is not None:
        await _check_dead_letter_kind(r, settings, (await r.client.get_queue(queue)).fifo)
    allow = settings.pop("redrive_allow", None)
    if allow is not None:
        await r.client.set_redrive_allow(queue, *allow)
    clear = [k for k, v in settings.items() if v is None and k == "dead_letter_queue"]
    if clear:
        del settings["dead_letter_queue"]
        clear.append("max_receive_count")
    if settings or clear:
        await r.client.alter_queue(queue, clear=clear or None, **settings)
    await _keep(r, queue, kept)
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


#: The actions AddPermission may name (SQS's list), and how many at most.
PERMISSION_ACTIONS = frozenset({"*", "SendMessage", "ReceiveMessage", "DeleteMessage",
                                "ChangeMessageVisibility", "GetQueueAttributes", "GetQueueUrl",
                                "ListDeadLetterSourceQueues", "PurgeQueue"})
MAX_PERMISSION_ACTIONS = 7


async def add_permission(r: Request) -> dict[str, Any]:
    """A label granting principals actions: a principal that names a PostgreSQL role gets the
    queue_pg grants the actions need (queue_pg.sqs_add_permission); every one shows in Policy."""
    queue = r.queue()
    label = r.params.get("Label")
    if not isinstance(label, str) or not label:
        raise MissingParameter("The request must contain the parameter Label.")
    principals = r.params.get("AWSAccountIds")
    acts = r.params.get("Actions")
    if not acts:
        raise MissingParameter("The request must contain the parameter Actions.")
    if not principals:
        raise InvalidParameter("Value [] for parameter PrincipalId is invalid. Reason: Unable to"
                               " verify.")
    if len(acts) > MAX_PERMISSION_ACTIONS:
        raise SqsError("OverLimit", f"{len(acts)} Actions were found, maximum allowed is"
                                    f" {MAX_PERMISSION_ACTIONS}.")
    for act in acts:
        if act not in PERMISSION_ACTIONS:
            reason = ("Only the queue owner is allowed to invoke this action."
                      if act in ACTIONS else "Unknown action.")
            raise InvalidParameter(f"Value SQS:{act} for parameter ActionName is invalid."
                                   f" Reason: {reason}")
    if label in (await _kept(r, queue))[1]:
        raise InvalidParameter(f"Value {label} for parameter Label is invalid. Reason: Already"
                               " exists.")
    call: Call[None] = Call(
        "select queue_pg.sqs_add_permission(%(queue)s, %(label)s, %(principals)s::text[],"
        " %(actions)s::text[])",
        {"queue": queue, "label": label, "principals": list(principals), "actions": list(acts)},
        lambda _c, _r: None)
    await r.client._run(call, None)
    return {}


async def remove_permission(r: Request) -> dict[str, Any]:
    queue = r.queue()
    label = r.params.get("Label")
    if not isinstance(label, str) or not label:
        raise MissingParameter("The request must contain the parameter Label.")
    call = Call("select queue_pg.sqs_remove_permission(%(queue)s, %(label)s)",
                {"queue": queue, "label": label}, lambda _c, rows: bool(rows[0][0]))
    if not await r.client._run(call, None):
        raise InvalidParameter(f"Value {label} for parameter Label is invalid. Reason: can't find"
                               " label on existing policy.")
    return {}


# --- messages -----------------------------------------------------------------------------------

#: SQS's largest message, and largest batch request (bodies and attributes together), in bytes.
MAX_MESSAGE_BYTES = 1048576
MAX_DELAY = 900
#: The characters SQS allows in a body: #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD |
#: #x10000 to #x10FFFF.
_BAD_CHARACTER = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_ENTRY_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")


def _body(entry: dict[str, Any]) -> str:
    body = entry.get("MessageBody")
    if not isinstance(body, str) or body == "":
        raise MissingParameter("The request must contain the parameter MessageBody.")
    bad = _BAD_CHARACTER.search(body)
    if bad is not None:
        raise SqsError("InvalidMessageContents",
                       f"Invalid binary character '#x{ord(bad.group()):X}' was found in the"
                       " message body, the set of allowed characters is #x9 | #xA | #xD | #x20 to"
                       " #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF")
    return body


def _sent(body: str, attrs: dict[str, Any] | None, msg_id: int, fifo: bool) -> dict[str, Any]:
    out = {"MessageId": names.message_id(msg_id), "MD5OfMessageBody": attributes.md5_body(body)}
    digest = attributes.md5_attributes(attributes.to_sqs(attrs))
    if digest is not None:
        out["MD5OfMessageAttributes"] = digest
    if fifo:
        out["SequenceNumber"] = names.sequence_number(msg_id)
    return out


@dataclass
class _Send:
    """One message to send, checked against SQS's rules: its body, the attributes to store
    (MessageAttributes, and the trace header of MessageSystemAttributes), its delay, group,
    dedup id, and its size as SQS counts it."""

    body: str
    attrs: dict[str, Any] | None
    delay: int | None
    group: str | None
    dedup_id: str | None
    size: int


def _prepare(entry: dict[str, Any], fifo: bool) -> _Send:
    body = _body(entry)
    attrs = attributes.to_queue_pg(entry.get("MessageAttributes"),
                                   entry.get("MessageSystemAttributes"))
    delay = _int(entry.get("DelaySeconds"), "DelaySeconds")
    group = entry.get("MessageGroupId")
    if fifo:
        if delay:  # SQS refuses a per-message delay on a FIFO queue, but not 0
            raise InvalidParameter(f"Value {delay} for parameter DelaySeconds is invalid. Reason:"
                                   " The request include parameter that is not valid for this"
                                   " queue type.")
        delay = None
        if group is None:
            raise MissingParameter("The request must contain the parameter MessageGroupId.")
    elif delay is not None and not 0 <= delay <= MAX_DELAY:
        raise InvalidParameter(f"Value {delay} for parameter DelaySeconds is invalid. Reason:"
                               f" DelaySeconds must be >= 0 and <= {MAX_DELAY}.")
    size = len(body.encode()) + attributes.size(attrs)
    return _Send(body, attrs, delay, group, entry.get("MessageDeduplicationId"), size)


async def _needs_dedup(r: Request, queue: str, fifo: bool, sends: list[_Send]) -> bool:
    """True when a FIFO send has no dedup id and the queue no content-based dedup (SQS refuses
    it); one look at the queue, only when an id is missing."""
    if not fifo or all(m.dedup_id is not None for m in sends):
        return False
    return not (await r.client.get_queue(queue)).content_dedup


_NO_DEDUP = ("The queue should either have ContentBasedDeduplication enabled or"
             " MessageDeduplicationId provided explicitly")


async def _send_one(r: Request, queue: str, m: _Send) -> dict[str, Any]:
    if m.size > MAX_MESSAGE_BYTES:
        raise InvalidParameter(f"One or more parameters are invalid. Reason: Message must be"
                               f" shorter than {MAX_MESSAGE_BYTES} bytes.")
    msg_id = await r.client.send(queue, m.body, delay=m.delay, attributes=m.attrs, group=m.group,
                                 dedup_id=m.dedup_id)
    return _sent(m.body, m.attrs, msg_id, names.is_fifo_url(r.params.get("QueueUrl")))


async def send_message(r: Request) -> dict[str, Any]:
    queue = r.queue()
    fifo = names.is_fifo_url(r.params.get("QueueUrl"))
    m = _prepare(r.params, fifo)
    if await _needs_dedup(r, queue, fifo, [m]):
        raise InvalidParameter(_NO_DEDUP)
    return await _send_one(r, queue, m)


_ENTRY_NAMES = {"SendMessageBatch": "SendMessageBatchRequestEntry",
                "DeleteMessageBatch": "DeleteMessageBatchRequestEntry",
                "ChangeMessageVisibilityBatch": "ChangeMessageVisibilityBatchRequestEntry"}


def _entries(r: Request, action: str) -> list[dict[str, Any]]:
    entries = r.params.get("Entries")
    if not entries:
        raise BatchError("AWS.SimpleQueueService.EmptyBatchRequest",
                         f"There should be at least one {_ENTRY_NAMES[action]} in the request.")
    if len(entries) > MAX_BATCH:
        raise BatchError("AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
                         f"Maximum number of entries per request are {MAX_BATCH}."
                         f" You have sent {len(entries)}.")
    seen: set[str] = set()
    for e in entries:
        entry_id = e.get("Id")
        if not isinstance(entry_id, str) or not _ENTRY_ID.fullmatch(entry_id):
            raise BatchError("AWS.SimpleQueueService.InvalidBatchEntryId",
                             "A batch entry id can only contain alphanumeric characters, hyphens"
                             " and underscores. It can be at most 80 letters long.")
        if entry_id in seen:
            raise BatchError("AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
                             f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return list(entries)


def _failure(entry_id: Any, err: QueueError) -> dict[str, Any]:
    code, _status, _query, sender = describe(err)
    return {"Id": entry_id, "Code": code, "Message": message(err), "SenderFault": sender}


async def _each(
    r: Request, entries: list[dict[str, Any]],
    run: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]],
) -> dict[str, Any]:
    """Run ``run`` per entry: SQS batches succeed or fail per entry, not as a whole; a missing
    queue or a missing grant fails the whole request, as in SQS."""
    ok, failed = [], []
    for entry in entries:
        try:
            ok.append({"Id": entry.get("Id"), **await run(entry)})
        except (errors.QueueNotFound, errors.AccessDenied):
            raise
        except QueueError as err:
            failed.append(_failure(entry.get("Id"), err))
    return {"Successful": ok, "Failed": failed}


def _unless_none(values: list[T]) -> list[T] | None:
    """None for a list of Nones: the statement then has no list to unpack, the common case of
    a batch of plain messages."""
    return None if all(v is None for v in values) else values


async def send_message_batch(r: Request) -> dict[str, Any]:
    """One ``send_batch`` statement when every entry is well formed and shares one delay;
    entry by entry when not, or when the statement is refused, so each failure stays its own."""
    queue = r.queue()
    fifo = names.is_fifo_url(r.params.get("QueueUrl"))
    entries = _entries(r, "SendMessageBatch")
    prepared: list[_Send | QueueError] = []
    for e in entries:
        try:
            prepared.append(_prepare(e, fifo))
        except errors.GroupRequired:
            raise
        except QueueError as err:
            if isinstance(err, MissingParameter) and "MessageGroupId" in str(err):
                raise  # SQS refuses the whole batch
            prepared.append(err)
    sends = [m for m in prepared if isinstance(m, _Send)]
    total = sum(m.size for m in sends)
    if total > MAX_MESSAGE_BYTES:
        raise BatchError("AWS.SimpleQueueService.BatchRequestTooLong",
                         f"Batch requests cannot be longer than {MAX_MESSAGE_BYTES} bytes."
                         f" You have sent {total} bytes.")
    if await _needs_dedup(r, queue, fifo, sends):
        raise InvalidParameter(_NO_DEDUP)  # the whole batch, as SQS
    if len(sends) == len(entries) and len({m.delay for m in sends}) == 1:
        try:
            ids = await r.client.send_batch(
                queue, [m.body for m in sends], delay=sends[0].delay,
                attributes=_unless_none([m.attrs for m in sends]),
                group=_unless_none([m.group for m in sends]),
                dedup_ids=_unless_none([m.dedup_id for m in sends]))
        except (errors.QueueNotFound, errors.AccessDenied):
            raise
        except QueueError:
            pass  # one entry spoils the statement: find which, entry by entry
        else:
            return {"Successful": [{"Id": e.get("Id"), **_sent(m.body, m.attrs, i, fifo)}
                                   for e, m, i in zip(entries, sends, ids, strict=True)],
                    "Failed": []}
    ok, failed = [], []
    for e, m in zip(entries, prepared, strict=True):
        if not isinstance(m, _Send):
            failed.append(_failure(e.get("Id"), m))
            continue
        try:
            ok.append({"Id": e.get("Id"), **await _send_one(r, queue, m)})
        except (errors.QueueNotFound, errors.AccessDenied):
            raise
        except QueueError as err:
            failed.append(_failure(e.get("Id"), err))
    return {"Successful": ok, "Failed": failed}


#: System attributes that take one more statement (``message_details``), made only when asked for
DETAILS = {"All", "MessageGroupId", "MessageDeduplicationId", "SequenceNumber"}


def _wanted_attributes(attrs: dict[str, Any], want: list[str]) -> dict[str, Any]:
    """The MessageAttributes asked for: by name, ``All`` or ``.*``, or a prefix ``name.*``."""
    if "All" in want or ".*" in want:
        return attrs
    prefixes = tuple(p[:-2] for p in want if p.endswith(".*"))
    return {k: v for k, v in attrs.items() if k in want or (prefixes and k.startswith(prefixes))}


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
    trace = attributes.trace_header(m.attributes)
    if trace is not None:
        system["AWSTraceHeader"] = trace
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
    attrs = _wanted_attributes(attributes.to_sqs(m.attributes), want_attrs)
    if attrs:
        out["MessageAttributes"] = attrs
        out["MD5OfMessageAttributes"] = attributes.md5_attributes(attrs)
    return out


async def receive_message(r: Request) -> dict[str, Any]:
    queue = r.queue()
    n = r.int_param("MaxNumberOfMessages")
    n = 1 if n is None else n
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
    if not messages:
        return {}  # SQS answers no Messages at all
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
    entries = _entries(r, "DeleteMessageBatch")
    receipts = [e.get("ReceiptHandle") for e in entries]
    if not all(isinstance(x, str) and x for x in receipts):
        return await _each(r, entries, lambda e: _delete_one(r, queue, e))
    distinct = list(dict.fromkeys(str(x) for x in receipts))  # SQS allows repeats; queue_pg not
    results = {x.receipt: x for x in await r.client.delete_batch(queue, distinct)}
    ok, failed = [], []
    for entry, receipt in zip(entries, receipts, strict=True):
        result = results[str(receipt)]
        if result.error is None or result.error == "StaleReceipt":  # SQS: a stale one succeeds
            ok.append({"Id": entry.get("Id")})
        else:
            failed.append({"Id": entry.get("Id"), "Code": "ReceiptHandleIsInvalid",
                           "Message": f'The input receipt handle "{receipt}" is not a valid'
                                      " receipt handle.",
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
    entries = _entries(r, "ChangeMessageVisibilityBatch")
    return await _each(r, entries, lambda e: _change_one(r, queue, e))


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
    "AddPermission": add_permission,
    "RemovePermission": remove_permission,
    "TagQueue": tag_queue,
    "UntagQueue": untag_queue,
    "ListQueueTags": list_queue_tags,
}  # and moves.ACTIONS
