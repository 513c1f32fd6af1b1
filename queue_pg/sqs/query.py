"""SQS's query protocol (older SDKs): form parameters in, XML out, around the same actions.

Parameters such as ``Attribute.1.Name`` / ``Attribute.1.Value`` or
``SendMessageBatchRequestEntry.2.MessageAttribute.1.Value.StringValue`` are nested first (a
number is a list position), then renamed to the JSON protocol's shapes, so the actions of
:mod:`queue_pg.sqs.actions` serve both protocols. Results go back the other way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from xml.sax.saxutils import escape

from queue_pg.errors import InvalidParameter

NAMESPACE = "http://queue.amazonaws.com/doc/2012-11-05/"

# query list name -> (JSON name, how its items become the JSON value)
_LISTS: dict[str, str] = {
    "AttributeName": "AttributeNames",
    "MessageAttributeName": "MessageAttributeNames",
    "MessageSystemAttributeName": "MessageSystemAttributeNames",
    "TagKey": "TagKeys",
    "AWSAccountId": "AWSAccountIds",
    "ActionName": "Actions",
    "SendMessageBatchRequestEntry": "Entries",
    "DeleteMessageBatchRequestEntry": "Entries",
    "ChangeMessageVisibilityBatchRequestEntry": "Entries",
}
# query name of a list of Name/Value (or Key/Value) pairs -> JSON map name
_MAPS: dict[str, tuple[str, str, str]] = {
    "Attribute": ("Attributes", "Name", "Value"),
    "MessageAttribute": ("MessageAttributes", "Name", "Value"),
    "MessageSystemAttribute": ("MessageSystemAttributes", "Name", "Value"),
    "Tag": ("Tags", "Key", "Value"),
}


#: The most parts a parameter name has (SQS's deepest is
#: ``SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue``: 6).
MAX_DEPTH = 8


def _nest(pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """``a.1.b=x`` -> ``{"a": {"1": {"b": "x"}}}``; a name deeper than MAX_DEPTH is refused
    (the shaping below recurses once per level)."""
    root: dict[str, Any] = {}
    for key, value in pairs:
        node = root
        parts = key.split(".", MAX_DEPTH)
        if len(parts) > MAX_DEPTH:
            raise InvalidParameter(f"Parameter {key[:80]!r}... is invalid: a name of at most"
                                   f" {MAX_DEPTH} dotted parts.")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[parts[-1]] = value
    return root


def _items(node: Any) -> list[Any]:
    """A nested ``{"1": a, "2": b}`` as ``[a, b]`` (in number order)."""
    if not isinstance(node, dict):
        return []
    numbered = sorted((int(k), v) for k, v in node.items() if k.isascii() and k.isdigit())
    return [v for _, v in numbered]


def _shape(node: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _MAPS:
            name, k, v = _MAPS[key]
            pairs = [item for item in _items(value) if isinstance(item, dict)]
            if any(isinstance(item.get(k), dict) for item in pairs):  # Attribute.1.Name.x=...
                raise InvalidParameter(f"Parameter {key}.N.{k} is invalid: a value, not a name"
                                       " of more dotted parts.")
            out[name] = {item.get(k): _shape(item[v]) if isinstance(item.get(v), dict)
                         else item.get(v) for item in pairs}
        elif key in _LISTS:
            items = [value] if isinstance(value, str) else _items(value)  # AttributeName=All
            out[_LISTS[key]] = [_shape(i) if isinstance(i, dict) else i for i in items]
        elif isinstance(value, dict):
            out[key] = _shape(value)
        else:
            out[key] = value
    if "Tags" in out and "QueueName" in out:  # CreateQueue's tags are "tags" in JSON
        out["tags"] = out.pop("Tags")
    return out


def params(pairs: Iterable[tuple[str, str]]) -> tuple[str, dict[str, Any]]:
    """(Action, the JSON protocol's parameters) of a query request's form / query pairs."""
    nested = _nest(pairs)
    action = str(nested.pop("Action", ""))
    nested.pop("Version", None)
    return action, _shape(nested)


# --- results --------------------------------------------------------------------------------

# JSON list name -> element name of each item in XML
_ITEMS = {"QueueUrls": "QueueUrl", "queueUrls": "QueueUrl", "Messages": "Message"}
_ENTRY = {"SendMessageBatch": "SendMessageBatchResultEntry",
          "DeleteMessageBatch": "DeleteMessageBatchResultEntry",
          "ChangeMessageVisibilityBatch": "ChangeMessageVisibilityBatchResultEntry"}


def _xml(name: str, value: Any, action: str) -> str:
    if isinstance(value, bool):
        return f"<{name}>{'true' if value else 'false'}</{name}>"
    if name in ("Attributes", "Tags", "MessageAttributes"):
        tag, key = {"Attributes": ("Attribute", "Name"), "Tags": ("Tag", "Key"),
                    "MessageAttributes": ("MessageAttribute", "Name")}[name]
        return "".join(
            f"<{tag}><{key}>{escape(str(k))}</{key}>{_xml('Value', v, action)}</{tag}>"
            for k, v in value.items())
    if isinstance(value, dict):
        inner = "".join(_xml(k, v, action) for k, v in value.items())
        return f"<{name}>{inner}</{name}>"
    if isinstance(value, list):
        item = _ITEMS.get(name) or (
            _ENTRY.get(action, name) if name == "Successful" else
            "BatchResultErrorEntry" if name == "Failed" else name)
        return "".join(_xml(item, v, action) for v in value)
    return f"<{name}>{escape(str(value))}</{name}>"


def response(action: str, result: dict[str, Any], request_id: str) -> str:
    body = "".join(_xml(k, v, action) for k, v in result.items())
    return (f'<?xml version="1.0"?><{action}Response xmlns="{NAMESPACE}">'
            f"<{action}Result>{body}</{action}Result>"
            f"<ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata>"
            f"</{action}Response>")


def error(code: str, message: str, sender: bool, request_id: str) -> str:
    return (f'<?xml version="1.0"?><ErrorResponse xmlns="{NAMESPACE}"><Error>'
            f"<Type>{'Sender' if sender else 'Receiver'}</Type><Code>{escape(code)}</Code>"
            f"<Message>{escape(message)}</Message></Error>"
            f"<RequestId>{request_id}</RequestId></ErrorResponse>")
