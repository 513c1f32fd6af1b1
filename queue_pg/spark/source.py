"""``df.write.format("queue_pg")``: the sink as a Spark 4 Python data source.

It fits: a ``DataSourceArrowWriter`` runs on each partition with its rows as Arrow batches, which
is all the partition writer needs. What it cannot do is hand counts back to the caller
(``save()`` returns nothing), so ``queue_pg.spark.enqueue`` stays the function that reports rows
written and partitions skipped; both send through ``queue_pg.spark.writer``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StringType, StructType

from queue_pg.spark.writer import (
    DEFAULT_CHUNK_ROWS,
    ChunkResult,
    chunked,
    copy_lines,
    write_partition,
)

NAME = "queue_pg"
#: The columns besides body that a DataFrame may have, in the staging table's order.
OPTIONAL = ("attributes", "dedup_id", "group")


def register(spark: SparkSession) -> None:
    """Make ``format("queue_pg")`` known to this session."""
    spark.dataSource.register(QueuePgDataSource)


@dataclass(frozen=True)
class Written(WriterCommitMessage):
    chunks: list[ChunkResult]


class QueuePgDataSource(DataSource):
    """Options: ``dsn``, ``queue`` (required), ``write_id``, ``delay``, ``ttl``, ``chunk_rows``.

    The DataFrame has a string column ``body`` (JSON text: ``to_json`` a struct first) and
    optionally ``attributes`` (JSON text of an object), ``dedup_id`` and ``group`` (strings).
    """

    @classmethod
    def name(cls) -> str:
        return NAME

    def writer(self, schema: StructType, overwrite: bool) -> QueuePgWriter:
        if overwrite:
            raise ValueError("mode 'overwrite' is invalid for a queue: allowed 'append'")
        for field in schema.fields:
            if field.name in (*OPTIONAL, "body") and not isinstance(field.dataType, StringType):
                raise ValueError(
                    f"column {field.name} is {field.dataType.simpleString()}: allowed"
                    " a string (JSON text for body and attributes: use to_json)"
                )
        if "body" not in schema.fieldNames():
            raise ValueError(
                f"no column body among {schema.fieldNames()}: allowed a DataFrame"
                " with a JSON-text column body (and optionally attributes)"
            )
        for option in ("dsn", "queue"):
            if not self.options.get(option):
                raise ValueError(f"option {option} is missing: it is required")
        return QueuePgWriter(dict(self.options), [c for c in OPTIONAL if c in schema.fieldNames()])


def _seconds(value: Any) -> float | None:
    return None if value is None else float(value)


class QueuePgWriter(DataSourceArrowWriter):
    def __init__(self, options: dict[str, Any], columns: list[str]) -> None:
        self.dsn = str(options["dsn"])
        self.queue = str(options["queue"])
        # made on the driver, so every task and attempt of this write shares it
        self.write_id = str(options.get("write_id") or uuid.uuid4().hex)
        self.delay = _seconds(options.get("delay"))
        self.ttl = _seconds(options.get("ttl"))
        self.chunk_rows = int(options.get("chunk_rows") or DEFAULT_CHUNK_ROWS)
        self.columns = columns

    def write(self, iterator: Iterator[Any]) -> Written:
        context = TaskContext.get()
        part = context.partitionId() if context is not None else 0
        lines = (
            copy_lines(b.column("body"), *(b.column(c) if c in self.columns else None
                                           for c in OPTIONAL))
            for b in iterator
        )
        return Written(
            write_partition(
                chunked(lines, self.chunk_rows),
                dsn=self.dsn,
                queue=self.queue,
                write_id=self.write_id,
                part=part,
                delay=self.delay,
                ttl=self.ttl,
            )
        )
