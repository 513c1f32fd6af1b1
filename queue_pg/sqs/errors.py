"""queue_pg's exceptions as SQS errors: code, HTTP status, the query-compatible code SDKs read
from ``x-amzn-query-error``, and whose fault it is (sender or receiver)."""

from __future__ import annotations

from queue_pg import errors
from queue_pg.errors import InvalidParameter, QueueError
from queue_pg.sqs.sigv4 import SignatureError


class MissingParameter(InvalidParameter):
    """A required parameter is absent (SQS's MissingParameter)."""


class SqsError(QueueError):
    """An error of SQS's own rules (not queue_pg's): its SQS code and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


#: A batch request SQS refuses whole: empty, too long, or with repeated ids.
BatchError = SqsError


class QueueNameExists(QueueError):
    """CreateQueue of an existing queue with other attributes (SQS's QueueAlreadyExists)."""


# class -> (JSON __type code, HTTP status, query-protocol code); the first match wins
_TABLE: list[tuple[type[Exception], str, int, str]] = [
    (MissingParameter, "MissingParameter", 400, "MissingParameter"),
    (QueueNameExists, "QueueNameExists", 400, "QueueAlreadyExists"),
    (errors.QueueNotFound, "QueueDoesNotExist", 400, "AWS.SimpleQueueService.NonExistentQueue"),
    (errors.QueueAlreadyExists, "QueueNameExists", 400, "QueueAlreadyExists"),
    (errors.GroupRequired, "MissingParameter", 400, "MissingParameter"),
    (errors.InvalidParameter, "InvalidParameterValue", 400, "InvalidParameterValue"),
    (errors.StaleReceipt, "ReceiptHandleIsInvalid", 400, "ReceiptHandleIsInvalid"),
    (errors.InvalidReceipt, "ReceiptHandleIsInvalid", 400, "ReceiptHandleIsInvalid"),
    (errors.MessageNotFound, "MessageNotInflight", 400,
     "AWS.SimpleQueueService.MessageNotInflight"),
    (errors.LeaseLimitExceeded, "InvalidParameterValue", 400, "InvalidParameterValue"),
    (errors.OverLimit, "OverLimit", 403, "OverLimit"),
    (errors.QueueInUse, "ResourceInUse", 400, "ResourceInUse"),
    (errors.AccessDenied, "AccessDenied", 403, "AccessDenied"),
    (errors.RedriveTaskNotFound, "ResourceNotFoundException", 404, "ResourceNotFoundException"),
    (errors.RedriveInProgress, "UnsupportedOperation", 400,
     "AWS.SimpleQueueService.UnsupportedOperation"),
]


class RequestTooLarge(Exception):
    """A request body over the endpoint's limit: refused before it is read whole, signed or not."""


#: SQS's own words for queue_pg's errors whose message SDKs and applications compare.
_MESSAGES: list[tuple[type[Exception], str]] = [
    (errors.QueueNotFound, "The specified queue does not exist."),
    (errors.InvalidReceipt, "The input receipt handle is invalid."),
    (errors.GroupRequired, "The request must contain the parameter MessageGroupId."),
]


def message(err: Exception) -> str:
    """The message of an error as SQS words it; queue_pg's own where SQS has none."""
    for cls, text in _MESSAGES:
        if isinstance(err, cls):
            return text
    if isinstance(err, errors.MessageTooLarge):
        return f"One or more parameters are invalid. Reason: {err}"
    return getattr(err, "message", None) or str(err)


def describe(err: Exception) -> tuple[str, int, str, bool]:
    """(code, status, query code, sender's fault) of an error; InternalError if unknown."""
    if isinstance(err, BatchError):
        short = err.code.rsplit(".", 1)[-1]
        return short, 403 if short == "OverLimit" else 400, err.code, True
    if isinstance(err, SignatureError):
        return err.code, 403, err.code, True
    if isinstance(err, RequestTooLarge):
        return "RequestEntityTooLarge", 413, "RequestEntityTooLarge", True
    for cls, code, status, query in _TABLE:
        if isinstance(err, cls):
            return code, status, query, status < 500
    return "InternalError", 500, "InternalError", False
