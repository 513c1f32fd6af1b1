"""SQS message attributes <-> queue_pg message attributes, and the MD5 digests SDKs verify.

An SQS attribute ``{"DataType": "String", "StringValue": "x"}`` is kept under its name in the
message's queue_pg attributes as that same object (binary values base64, as on the wire), so a
queue_pg consumer sees it and a queue_pg producer's plain values (``{"type": "welcome"}``) reach
SQS clients as String attributes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import struct
from collections.abc import Mapping
from typing import Any

from queue_pg.errors import InvalidParameter

MAX_ATTRIBUTES = 10


def _invalid(message: str) -> InvalidParameter:
    return InvalidParameter(message)


#: Where a message keeps SQS's AWSTraceHeader system attribute among its attributes: a name
#: SQS reserves (no MessageAttribute may start with "AWS."), so it never shows as one.
TRACE_KEY = "AWS.TraceHeader"
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}")


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _invalid(f"The message attribute name '{name}' is invalid. Attribute name can"
                       " contain A-Z, a-z, 0-9, underscore (_), hyphen (-), and period (.)"
                       " characters.")
    if name.lower().startswith(("aws.", "amazon.")):
        raise _invalid(f"The message attribute name '{name}' is invalid. You can't use message"
                       " attribute names beginning with 'AWS.' or 'Amazon.'. These strings are"
                       " reserved for internal use.")
    if name.startswith(".") or name.endswith(".") or ".." in name:
        raise _invalid(f"The message attribute name '{name}' is invalid. Attribute name can"
                       " not start or end with a period (.), or have consecutive periods.")
    return name


def _value(name: str, value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping) or not isinstance(value.get("DataType"), str):
        raise _invalid(f"The message attribute '{name}' must contain a DataType.")
    kind = value["DataType"].split(".", 1)[0]
    if kind in ("String", "Number"):
        if not isinstance(value.get("StringValue"), str):
            raise _invalid(f"The message attribute '{name}' with type '{kind}' must use"
                           " field 'String'.")
        return {"DataType": value["DataType"], "StringValue": value["StringValue"]}
    if kind == "Binary":
        binary = value.get("BinaryValue")
        if not isinstance(binary, str):
            raise _invalid(f"The message attribute '{name}' with type 'Binary' must use"
                           " field 'Binary'.")
        try:
            base64.b64decode(binary, validate=True)
        except (ValueError, binascii.Error):
            raise _invalid(f"The message attribute '{name}' has a BinaryValue that is not"
                           " base64.") from None
        return {"DataType": value["DataType"], "BinaryValue": binary}
    raise _invalid(f"The message attribute '{name}' has an invalid message attribute type, the"
                   " set of supported type prefixes is Binary, Number, and String.")


def to_queue_pg(attrs: Mapping[str, Any] | None,
                system: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Validate SQS MessageAttributes (what SQS itself refuses) and MessageSystemAttributes (only
    AWSTraceHeader, a String) and return them to store."""
    out: dict[str, Any] = {}
    if attrs:
        if len(attrs) > MAX_ATTRIBUTES:
            raise _invalid(f"Number of message attributes [{len(attrs)}] exceeds the allowed"
                           f" maximum [{MAX_ATTRIBUTES}].")
        for name, value in attrs.items():
            out[_check_name(name)] = _value(name, value)
    for name, value in (system or {}).items():
        if name != "AWSTraceHeader":
            raise _invalid(f"Message system attribute name '{name}' is invalid.")
        checked = _value(name, value)
        if checked["DataType"] != "String" or "StringValue" not in checked:
            raise _invalid("The message system attribute 'AWSTraceHeader' must be a String.")
        out[TRACE_KEY] = checked
    return out or None


def size(attrs: Mapping[str, Any] | None) -> int:
    """The bytes SQS counts of stored attributes: each name, data type and value."""
    total = 0
    for name, value in (attrs or {}).items():
        if not isinstance(value, Mapping):
            continue
        total += len(name.encode()) + len(str(value.get("DataType", "")).encode())
        if "BinaryValue" in value:
            total += len(base64.b64decode(value["BinaryValue"]))  # checked by _value
        else:
            total += len(str(value.get("StringValue", "")).encode())
    return total


def trace_header(attrs: Mapping[str, Any] | None) -> str | None:
    """The AWSTraceHeader a message was sent with, if any."""
    value = (attrs or {}).get(TRACE_KEY)
    if isinstance(value, Mapping) and isinstance(value.get("StringValue"), str):
        return str(value["StringValue"])
    return None


def to_sqs(attrs: Mapping[str, Any] | None) -> dict[str, Any]:
    """A stored message's attributes as SQS MessageAttributes (plain values become Strings;
    the names SQS reserves, where system attributes are kept, are left out)."""
    out: dict[str, Any] = {}
    for name, value in (attrs or {}).items():
        if name.startswith("AWS."):
            continue
        if isinstance(value, Mapping) and isinstance(value.get("DataType"), str) and (
            "StringValue" in value or "BinaryValue" in value
        ):
            out[name] = dict(value)
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            out[name] = {"DataType": "String", "StringValue": text}
    return out


def md5_body(body: str) -> str:
    return hashlib.md5(body.encode()).hexdigest()


def md5_attributes(attrs: Mapping[str, Any]) -> str | None:
    """SQS's MD5OfMessageAttributes: per attribute sorted by name, length-prefixed name, type,
    a transport byte (1 string, 2 binary) and length-prefixed value."""
    if not attrs:
        return None
    digest = hashlib.md5()

    def put(data: bytes) -> None:
        digest.update(struct.pack(">I", len(data)) + data)

    for name in sorted(attrs):
        value = attrs[name]
        put(name.encode())
        put(value["DataType"].encode())
        if "BinaryValue" in value:
            digest.update(b"\x02")
            try:
                put(base64.b64decode(value["BinaryValue"]))
            except (ValueError, binascii.Error):  # set by a producer of the Python API
                put(str(value["BinaryValue"]).encode())
        else:
            digest.update(b"\x01")
            put(value["StringValue"].encode())
    return digest.hexdigest()
