"""The partition writer: JSON rows into a queue once per key, at COPY speed (psycopg and Arrow).

A partition arrives as Arrow arrays of JSON text (body, attributes) and, when given, of dedup ids
and groups. They become COPY text lines
with vectorised Arrow string kernels, and the lines' data buffer is what COPY sends: no Python
work per row. Each chunk (a fixed number of rows, whatever the batch sizes) is one transaction:
``queue_pg.stage`` readies the session's staging table (and says whether the key was written
already, so a re-run skips the COPY), COPY fills it, and ``queue_pg.send_staged`` records the
key and sends the rows. Which attempt wins a key is the database's decision (the ledger's
primary key), so retried tasks, speculative copies and re-run jobs may all run this freely.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from queue_pg.dsn import libpq_dsn
from queue_pg.errors import translate

#: Rows per transaction: bounds the staging table and the time a chunk holds its locks.
DEFAULT_CHUNK_ROWS = 100_000

_COPY = "COPY pg_temp.queue_pg_staging (body, attributes, dedup_id, group_id) FROM STDIN"
#: COPY text format: these characters are escaped with a backslash; NULL is \N.
_ESCAPES = (("\\", "\\\\"), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"))


@dataclass(frozen=True)
class ChunkResult:
    """What one chunk of a partition did: ``sent`` messages, or skipped as written before."""

    part: int
    chunk: int
    sent: int
    skipped: bool


def _escaped(col: pa.Array) -> pa.Array:
    col = col.cast(pa.string())
    for plain, escaped in _ESCAPES:
        col = pc.replace_substring(col, plain, escaped)
    return pc.fill_null(col, "\\N")


def copy_lines(
    body: pa.Array,
    attributes: pa.Array | None,
    dedup_id: pa.Array | None = None,
    group: pa.Array | None = None,
) -> pa.Array:
    """One COPY text line per row: body, attributes, dedup id, group (a missing value as \\N)."""
    fields: list[Any] = [
        pa.scalar("\\N") if col is None else _escaped(col) for col in (attributes, dedup_id, group)
    ]
    row = pc.binary_join_element_wise(_escaped(body), *fields, "\t")
    return pc.binary_join_element_wise(row, pa.scalar(""), "\n")


def chunked(lines: Iterable[pa.Array], size: int) -> Iterator[list[pa.Array]]:
    """The lines cut into chunks of exactly ``size`` rows (the last may be shorter)."""
    if size < 1:
        raise ValueError(f"chunk_rows = {size} is out of range: allowed 1 or more")
    pending: list[pa.Array] = []
    n = 0
    for arr in lines:
        while len(arr):
            take = min(size - n, len(arr))
            pending.append(arr.slice(0, take))
            arr = arr.slice(take)
            n += take
            if n == size:
                yield pending
                pending, n = [], 0
    if pending:
        yield pending


def _payload(lines: pa.Array) -> memoryview:
    """The bytes of a string array's values (its lines, back to back), read in place."""
    _, offsets, data = lines.buffers()
    ends = memoryview(offsets).cast("B").cast("i")  # int32 offsets, one more than rows
    return memoryview(data)[ends[lines.offset] : ends[lines.offset + len(lines)]]


def write_partition(
    chunks: Iterable[list[pa.Array]],
    *,
    dsn: str,
    queue: str,
    write_id: str,
    part: int,
    delay: float | None = None,
    ttl: float | None = None,
) -> list[ChunkResult]:
    """Send each chunk of COPY lines (``copy_lines``, ``chunked``) in a transaction of its own.

    The rows must come in the same order on every attempt (Spark's own rule for a deterministic
    partition): a chunk is known by its number within the partition.
    """
    results: list[ChunkResult] = []
    with translate(), psycopg.connect(libpq_dsn(dsn)) as conn:
        for number, chunk in enumerate(chunks):
            results.append(_write_chunk(conn, chunk, (queue, write_id, part, number), delay, ttl))
    return results


def _write_chunk(
    conn: psycopg.Connection[Any],
    chunk: list[pa.Array],
    key: tuple[str, str, int, int],
    delay: float | None,
    ttl: float | None,
) -> ChunkResult:
    with conn.transaction():
        done = conn.execute("SELECT queue_pg.stage(%s, %s, %s, %s)", key).fetchone()
        if done is not None and done[0]:
            return ChunkResult(key[2], key[3], 0, True)
        with conn.cursor().copy(_COPY) as copy:
            for lines in chunk:
                copy.write(_payload(lines))
        got = conn.execute(
            "SELECT queue_pg.send_staged(%s, %s, %s, %s, %s, %s)", (*key, delay, ttl)
        ).fetchone()
    sent = None if got is None else got[0]
    return ChunkResult(key[2], key[3], int(sent or 0), sent is None)
