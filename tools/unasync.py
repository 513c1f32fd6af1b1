"""Write the synchronous Client (queue_pg/client*.py) from the AsyncClient (aio*.py).

    python tools/unasync.py          # write it
    python tools/unasync.py --check  # exit 1 when the checked-in file differs

The async module is the one written by hand; this keeps the two from drifting apart. Line by line:

- a line ending in ``# async-only`` is left out;
- a comment line ``# sync: CODE`` becomes ``CODE`` at the comment's indentation;
- ``await`` goes, ``async def`` / ``async with`` / ``async for`` lose their ``async``;
- the names in :data:`NAMES` become their sync twins (whole words, in code and docstrings),
  and an import line that then names one twice names it once.

The module docstring is replaced by the one in :data:`FILES`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "queue_pg"

#: Async name -> sync name.
NAMES = {
    "AsyncClientBase": "ClientBase",
    "AsyncClient": "Client",
    "aio_base": "client_base",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncConnection": "Connection",
    "AsyncIterator": "Iterator",
    "AsyncSessionLike": "SessionLike",
    "asynccontextmanager": "contextmanager",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "acheck": "check",
    "ajoin": "join",
}

_GENERATED = "GENERATED from queue_pg/{source} by tools/unasync.py: edit that, then run the tool."

#: (async source, sync module, the sync module's docstring)
FILES = [
    ("aio_base.py", "client_base.py", '''\
"""The synchronous client's connections: its pool, transactions, LISTEN and the long poll,
sweeps.

{generated}
"""
'''),
    ("aio.py", "client.py", '''\
"""The synchronous client: a thin typed layer over the SQL functions of schema ``queue_pg``.

{generated}

Every method runs one statement built by :mod:`queue_pg._ops`. The only logic of its own is what
cannot live in SQL: borrowing connections, waiting for a message on LISTEN instead of letting the
server sleep-poll (the decisions in :mod:`queue_pg.longpoll`), and sweeping expired messages now
and then.
"""
'''),
]

_WORDS = re.compile(r"\b(" + "|".join(sorted(NAMES, key=len, reverse=True)) + r")\b")
_SYNC_LINE = re.compile(r"^(\s*)# sync: ?(.*)$")
_ASYNC_ONLY = re.compile(r"\s*# async-only$")
_FROM_IMPORT = re.compile(r"^(from \S+ import )(.+)$")


def _import_order(name: str) -> tuple[int, str]:
    """isort's order of imported names: CONSTANTS, Classes, functions."""
    kind = 0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2
    return kind, name


def _dedupe_import(line: str) -> str:
    """``from x import Iterator, Iterable, Iterator`` (two names mapped to one) made whole."""
    m = _FROM_IMPORT.match(line)
    if m is None or "(" in line:
        return line
    names = sorted(set(m.group(2).split(", ")), key=_import_order)
    return m.group(1) + ", ".join(names)


def rename(text: str) -> str:
    """``text`` with the async names of :data:`NAMES` turned into their sync twins."""
    return _WORDS.sub(lambda w: NAMES[w.group(1)], text)


def unasync(source: str, docstring: str) -> str:
    """The sync module for the text of the async one."""
    body = source.split('"""', 2)[2].lstrip("\n")  # after the module docstring
    out: list[str] = []
    for line in body.splitlines():
        if _ASYNC_ONLY.search(line):
            continue
        m = _SYNC_LINE.match(line)
        if m:
            line = m.group(1) + m.group(2)
        line = re.sub(r"\bawait\s+", "", line)
        line = re.sub(r"\basync\s+(def|with|for)\b", r"\1", line)
        line = _dedupe_import(rename(line))
        out.append(line.rstrip())
    text = "\n".join(out)
    # a dropped import line may leave two blank lines inside the import block
    text = re.sub(r"\n\n\n+(?=(from|import) )", "\n\n", text)
    return docstring + "\n" + text + "\n"


def generated() -> dict[Path, str]:
    """Each sync module's path and the text the tool makes for it."""
    return {
        PKG / target: unasync((PKG / source).read_text(),
                              doc.format(generated=_GENERATED.format(source=source)))
        for source, target, doc in FILES
    }


def main(argv: list[str]) -> int:
    stale = [p for p, text in generated().items() if not p.exists() or p.read_text() != text]
    if "--check" in argv:
        for path in stale:
            print(f"{path} is not what tools/unasync.py makes: run it", file=sys.stderr)
        return 1 if stale else 0
    for path, text in generated().items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
