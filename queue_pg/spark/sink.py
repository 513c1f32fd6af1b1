"""``enqueue``: a DataFrame into a queue, one message per row, once per row per ``write_id``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from queue_pg.spark.writer import (
    DEFAULT_CHUNK_ROWS,
    ChunkResult,
    chunked,
    copy_lines,
    write_partition,
)

#: What each partition's task reports, one row per chunk.
RESULT_SCHEMA = "part int, chunk int, sent long, skipped boolean"


@dataclass(frozen=True)
class EnqueueResult:
    """What ``enqueue`` did: the key to re-run it with, and what was sent or skipped."""

    write_id: str
    rows_written: int  #: messages sent by this run
    chunks_written: int
    chunks_skipped: int  #: chunks written before (by an earlier run or attempt): nothing sent
    partitions_skipped: int  #: partitions whose every chunk was written before


def json_column(df: DataFrame, value: str | Column) -> Column:
    """A column as JSON text: a string column is taken as JSON already, anything else to_json."""
    col = F.col(value) if isinstance(value, str) else value
    kind = df.select(col).schema.fields[0].dataType
    return col if isinstance(kind, StringType) else F.to_json(col)


def message_columns(
    df: DataFrame,
    body: str | Column | None,
    attributes: str | Column | Mapping[str, Any] | None,
    dedup_id: str | Column | None = None,
    group: str | Column | None = None,
) -> DataFrame:
    """``df`` as the staging table's four text columns: body and attributes as JSON (the whole
    row when body is None), dedup_id and group as strings (NULL when not given)."""
    body_col = (
        F.to_json(F.struct(*[F.col(c) for c in df.columns]))
        if body is None
        else (json_column(df, body))
    )
    if attributes is None:
        attr_col = F.lit(None).cast("string")
    elif isinstance(attributes, Mapping):
        attr_col = F.lit(json.dumps(dict(attributes), ensure_ascii=False))
    else:
        attr_col = json_column(df, attributes)
    return df.select(body_col.alias("body"), attr_col.alias("attributes"),
                     _text(dedup_id).alias("dedup_id"), _text(group).alias("group"))


def _text(value: str | Column | None) -> Column:
    if value is None:
        return F.lit(None).cast("string")
    return (F.col(value) if isinstance(value, str) else value).cast("string")


def enqueue(
    df: DataFrame,
    queue: str,
    *,
    dsn: str,
    body: str | Column | None = None,
    attributes: str | Column | Mapping[str, Any] | None = None,
    delay: float | None = None,
    ttl: float | None = None,
    write_id: str | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    dedup_id: str | Column | None = None,
    group: str | Column | None = None,
) -> EnqueueResult:
    """Send one message per row of ``df``, each partition with COPY in one transaction per chunk.

    ``body``: a column (JSON text, struct, map or array) or, by default, the whole row as a JSON
    object; ``attributes``: a column or one mapping for every row; ``dedup_id`` and ``group``:
    columns of each row's dedup id and group, as ``send_batch``'s ``dedup_ids`` and ``group``
    (a FIFO queue needs ``group``; a row whose dedup id was sent within the queue's dedup window
    is accepted and not sent again, nor counted in ``rows_written``). Running again with the same
    ``write_id`` sends only what no earlier run committed (``df`` must then yield the same rows
    in the same partitions, as for any idempotent Spark write); without one, a fresh id still
    makes retried and speculative tasks send nothing twice.
    """
    write_id = write_id or uuid.uuid4().hex
    prepared = message_columns(df, body, attributes, dedup_id, group)

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        part = context.partitionId() if context is not None else 0
        lines = (copy_lines(b.column(0), b.column(1), b.column(2), b.column(3)) for b in batches)
        done = write_partition(
            chunked(lines, chunk_rows),
            dsn=dsn,
            queue=queue,
            write_id=write_id,
            part=part,
            delay=delay,
            ttl=ttl,
        )
        yield pa.RecordBatch.from_pylist(
            [vars(r) for r in done],
            schema=pa.schema(
                [
                    ("part", pa.int32()),
                    ("chunk", pa.int32()),
                    ("sent", pa.int64()),
                    ("skipped", pa.bool_()),
                ]
            ),
        )

    rows = prepared.mapInArrow(write, RESULT_SCHEMA).collect()
    chunks = [ChunkResult(r.part, r.chunk, r.sent, r.skipped) for r in rows]
    return summarize(write_id, chunks)


def summarize(write_id: str, chunks: list[ChunkResult]) -> EnqueueResult:
    parts: dict[int, bool] = {}
    for c in chunks:
        parts[c.part] = parts.get(c.part, True) and c.skipped
    return EnqueueResult(
        write_id=write_id,
        rows_written=sum(c.sent for c in chunks),
        chunks_written=sum(not c.skipped for c in chunks),
        chunks_skipped=sum(c.skipped for c in chunks),
        partitions_skipped=sum(parts.values()),
    )
