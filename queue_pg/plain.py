"""Strings producers and consumers chose, made safe to show an operator.

A queue name, a message type, a dead-letter reason, an error or a body can hold terminal escapes
(ESC sequences set a window title, clear the screen, rewrite what was shown), other control
characters, or Unicode's bidirectional overrides (text that reads differently from what it is).
:func:`plain` writes each of them as a visible escape, so every terminal, log line and table
shows the string as the characters it holds. Rich and Textual also read ``[...]`` as markup:
:func:`queue_pg.ops.display.text` wraps the result in a ``Text``, which is never parsed.

:class:`PlainLogs` is the same rule for log records: ``queue_pg``'s loggers carry it, so a task
name, reason or error a message brought is logged escaped.
"""

from __future__ import annotations

import logging
import re
import traceback

__all__ = ["PlainLogs", "json_text", "plain"]

# C0 (but tab), DEL, C1, line and paragraph separators, bidirectional marks and overrides
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_UNSAFE_KEEP_LINES = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def plain(value: object, *, lines: bool = False) -> str:
    """``str(value)`` with every control character written as an escape (``\\x1b``, ``\\n``,
    ``\\u202e``); ``lines=True`` keeps line breaks (a traceback). Tabs are kept."""
    text = value if isinstance(value, str) else str(value)
    return (_UNSAFE_KEEP_LINES if lines else _UNSAFE).sub(_escape, text)


def json_text(encoded: str) -> str:
    """JSON text (``json.dumps(..., ensure_ascii=False)``) with the control characters json
    leaves raw (DEL, C1, separators, bidirectional marks) as ``\\uXXXX``: the same JSON value,
    safe on a terminal. They can only stand inside strings, where the escape is valid."""
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", encoded)


class PlainLogs(logging.Filter):
    """Escapes a record's message and exception text (see :func:`plain`): a hostile string
    in a log line reaches the log as visible characters, never as a terminal escape, and a
    line break in it cannot forge a second line."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        safe = plain(message)
        if safe != message or record.args:
            record.msg, record.args = safe, None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            exc = traceback.TracebackException.from_exception(record.exc_info[1])
            record.exc_text = _traceback(exc).rstrip("\n")
        return True


def _traceback(exc: traceback.TracebackException) -> str:
    """A traceback as logging writes it, but each exception's message on one escaped line (its
    frames are the program's own, so they keep their lines)."""
    text = ""
    if exc.__cause__ is not None:
        text = (_traceback(exc.__cause__) + "\nThe above exception was the direct cause of the"
                " following exception:\n\n")
    elif exc.__context__ is not None and not exc.__suppress_context__:
        text = (_traceback(exc.__context__) + "\nDuring handling of the above exception, another"
                " exception occurred:\n\n")
    if exc.stack:
        text += "Traceback (most recent call last):\n"
        text += plain("".join(exc.stack.format()), lines=True)
    return text + plain("".join(exc.format_exception_only()).rstrip("\n")) + "\n"


#: The loggers queue_pg writes to (a filter on a logger sees only its own records).
LOGGERS = ("queue_pg", "queue_pg.worker", "queue_pg.client", "queue_pg.sqs", "queue_pg.metrics",
           "queue_pg.dashboard")


def install() -> None:
    """Puts :class:`PlainLogs` on every queue_pg logger (once)."""
    for name in LOGGERS:
        log = logging.getLogger(name)
        if not any(isinstance(f, PlainLogs) for f in log.filters):
            log.addFilter(PlainLogs())
