"""SQS's message move tasks as queue_pg's redrive tasks (``start_redrive`` and its kin).

A move task's source is a dead-letter queue; without a destination each message goes back to
the queue it came from, as in SQS. The task, its rate and its progress are the SQL's
(``queue_pg.redrive_tasks``); here are SQS's names for them and its opaque task handle.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from queue_pg import errors
from queue_pg.errors import InvalidParameter
from queue_pg.sqs import names
from queue_pg.sqs.errors import MissingParameter
from queue_pg.types import RedriveTask

if TYPE_CHECKING:
    from queue_pg.sqs.actions import Request

#: SQS's bounds of MaxNumberOfMessagesPerSecond and ListMessageMoveTasks' MaxResults
MAX_RATE = 500
MAX_RESULTS = 10


def handle(task: int, source_arn: str) -> str:
    """An opaque TaskHandle (SQS's are base64 too): the task id and the source it moves from."""
    return base64.urlsafe_b64encode(f"{task} {source_arn}".encode()).decode()


def task_id(value: Any) -> int:
    """The task id of a TaskHandle; ResourceNotFoundException for anything else."""
    try:
        return int(base64.urlsafe_b64decode(str(value).encode()).decode().split(" ", 1)[0])
    except (ValueError, UnicodeDecodeError):
        raise errors.RedriveTaskNotFound(f"TaskHandle {value!r:.80} names no task") from None


def _arn(r: Request, key: str, required: bool) -> str | None:
    value = r.params.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise MissingParameter(f"The request must contain the parameter {key}.")
    return names.from_arn(value)


async def start_message_move_task(r: Request) -> dict[str, Any]:
    dlq = _arn(r, "SourceArn", required=True)
    assert dlq is not None
    to = _arn(r, "DestinationArn", required=False)
    rate = r.int_param("MaxNumberOfMessagesPerSecond")
    if rate is not None and not 1 <= rate <= MAX_RATE:
        raise InvalidParameter(f"Value {rate} for parameter MaxNumberOfMessagesPerSecond is"
                               f" invalid. Reason: Must be between 1 and {MAX_RATE}.")
    task = await r.client.start_redrive(dlq, to=to, rate=rate)
    return {"TaskHandle": handle(task, str(r.params["SourceArn"]))}


async def _sqs_name(r: Request, queue: str, fifo: dict[str, bool]) -> str:
    """SQS name of ``queue`` (cached per request; a queue gone since shows as named)."""
    if queue not in fifo:
        try:
            fifo[queue] = (await r.client.get_queue(queue)).fifo
        except errors.QueueNotFound:
            fifo[queue] = False
    return names.sqs_name(queue, fifo[queue])


async def _result(r: Request, t: RedriveTask, fifo: dict[str, bool]) -> dict[str, Any]:
    source = names.arn(await _sqs_name(r, t.dlq, fifo))
    out: dict[str, Any] = {
        "Status": t.status.upper(),
        "SourceArn": source,
        "ApproximateNumberOfMessagesMoved": t.moved,
        "ApproximateNumberOfMessagesToMove": t.to_move,
        "StartedTimestamp": int(t.started_at.timestamp() * 1000),
    }
    if t.status == "running":  # SQS gives a handle to running tasks only
        out["TaskHandle"] = handle(t.id, source)
    if t.target is not None:
        out["DestinationArn"] = names.arn(await _sqs_name(r, t.target, fifo))
    if t.rate is not None:
        out["MaxNumberOfMessagesPerSecond"] = int(t.rate)
    if t.error is not None:
        out["FailureReason"] = t.error
    return out


async def list_message_move_tasks(r: Request) -> dict[str, Any]:
    dlq = _arn(r, "SourceArn", required=True)
    limit = r.int_param("MaxResults", 1) or 1
    if not 1 <= limit <= MAX_RESULTS:
        raise InvalidParameter(f"Value {limit} for parameter MaxResults is invalid."
                               f" Reason: Must be between 1 and {MAX_RESULTS}.")
    await r.client.get_queue(str(dlq))  # QueueDoesNotExist when it does not
    tasks = await r.client.list_redrives(dlq)
    fifo: dict[str, bool] = {}
    return {"Results": [await _result(r, t, fifo) for t in tasks[:limit]]}


async def cancel_message_move_task(r: Request) -> dict[str, Any]:
    value = r.params.get("TaskHandle")
    if not isinstance(value, str):
        raise MissingParameter("The request must contain the parameter TaskHandle.")
    task = await r.client.cancel_redrive(task_id(value))
    return {"ApproximateNumberOfMessagesMoved": task.moved}


# the actions of this module, beside actions.ACTIONS (app.py looks in both)
ACTIONS = {
    "StartMessageMoveTask": start_message_move_task,
    "ListMessageMoveTasks": list_message_move_tasks,
    "CancelMessageMoveTask": cancel_message_move_task,
}
