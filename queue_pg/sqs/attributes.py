"""SQS message attributes <-> queue_pg message attributes, and the MD5 digests SDKs verify.

An SQS attribute ``{"DataType": "String", "StringValue": "x"}`` is kept under its name in the
message's queue_pg attributes as that same object (binary values base64, as on the wire), so a
queue_pg consumer sees it and a queue_pg producer's plain values (``{"type": "welcome"}``) reach
SQS clients as String attributes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from collections.abc import Mapping
from typing import Any

from queue_pg.errors import InvalidParameter

MAX_ATTRIBUTES = 10


def _invalid(message: str) -> InvalidParameter:
    return InvalidParameter(message)


def to_queue_pg(attrs: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Validate SQS MessageAttributes (what SQS itself refuses) and return them to store."""
    if not attrs:
        return None
    if len(attrs) > MAX_ATTRIBUTES:
        raise _invalid(f"Number of message attributes [{len(attrs)}] exceeds the allowed maximum"
                       f" [{MAX_ATTRIBUTES}].")
    out: dict[str, Any] = {}
    for name, value in attrs.items():
        if not isinstance(value, Mapping) or not isinstance(value.get("DataType"), str):
            raise _invalid(f"The message attribute '{name}' must contain a DataType.")
        kind = value["DataType"].split(".", 1)[0]
        if kind in ("String", "Number"):
            if not isinstance(value.get("StringValue"), str):
                raise _invalid(f"The message attribute '{name}' with type '{kind}' must use"
                               " field 'String'.")
            out[name] = {"DataType": value["DataType"], "StringValue": value["StringValue"]}
        elif kind == "Binary":
            if not isinstance(value.get("BinaryValue"), str):
                raise _invalid(f"The message attribute '{name}' with type 'Binary' must use"
                               " field 'Binary'.")
            out[name] = {"DataType": value["DataType"], "BinaryValue": value["BinaryValue"]}
        else:
            raise _invalid(f"The type of message attribute '{name}' is invalid: allowed String,"
                           " Number, Binary.")
    return out


def to_sqs(attrs: Mapping[str, Any] | None) -> dict[str, Any]:
    """A stored message's attributes as SQS MessageAttributes (plain values become Strings)."""
    out: dict[str, Any] = {}
    for name, value in (attrs or {}).items():
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
            put(base64.b64decode(value["BinaryValue"]))
        else:
            digest.update(b"\x01")
            put(value["StringValue"].encode())
    return digest.hexdigest()
