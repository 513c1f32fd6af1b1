"""A sink job whose one slow task makes Spark launch a speculative copy; run with spark-submit.

``spark-submit --master spark://... speculation.py DSN QUEUE WRITE_ID ROWS CHUNK_ROWS MARKS``

Two partitions. The first attempt of partition 1 hands the sink two chunks of rows,
waits until the sink committed that chunk, then stalls (until Spark kills it); every other
attempt passes its rows straight on. Each attempt leaves a file in MARKS (partition, attempt,
what it saw), and the job prints the sink's ``EnqueueResult`` as JSON on its last line.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import psycopg
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from queue_pg.spark import enqueue


def main() -> None:
    dsn, queue, write_id, rows, chunk_rows, marks = sys.argv[1:7]
    n, chunk = int(rows), int(chunk_rows)
    spark = SparkSession.builder.appName("queue_pg speculation").getOrCreate()

    def stall(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ctx = TaskContext.get()
        assert ctx is not None
        part, attempt = ctx.partitionId(), ctx.attemptNumber()
        mark = Path(marks) / f"part{part}-attempt{attempt}"
        mark.write_text("started\n")
        slow = part == 1 and attempt == 0
        given = 0
        for batch in batches:
            for at in range(0, batch.num_rows, chunk // 2 or 1):  # small batches: no buffering holds a chunk
                piece = batch.slice(at, chunk // 2 or 1)
                yield piece
                given += piece.num_rows
                if slow and given >= 2 * chunk:
                    with mark.open("a") as f:
                        f.write(f"stalled after {given} rows\n")
                    with psycopg.connect(dsn, autocommit=True) as c:
                        for _ in range(400):  # until the sink committed chunk 0 (20 s at most)
                            if c.execute("SELECT 1 FROM queue_pg.bulk_writes WHERE write_id = %s"
                                         " AND part = 1 AND chunk = 0", (write_id,)).fetchone():
                                with mark.open("a") as f:
                                    f.write("chunk 0 committed\n")
                                break
                            time.sleep(0.05)
                    time.sleep(120)  # until Spark kills this attempt: its copy finished
                    slow = False
        with mark.open("a") as f:
            f.write(f"done after {given} rows\n")

    # rows of 1 kB: the first chunk outgrows every buffer between the stalling step and the sink
    df = spark.range(0, n, 1, 2).select(F.col("id"), F.concat(F.lit("r"), F.col("id")).alias("name"),
                                        F.lit("x" * 1000).alias("pad"))
    df = df.mapInArrow(stall, df.schema)
    result = enqueue(df, queue, dsn=dsn, write_id=write_id, chunk_rows=chunk)
    print(json.dumps(asdict(result)))
    spark.stop()


if __name__ == "__main__":
    main()
