"""``queue-pg spark advise``: the timeout advisor from the command line.

Spark is imported only when the command runs, so ``queue-pg`` works without the [spark] extra.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import click

from queue_pg.ops.cli.params import Duration


@click.group()
def spark() -> None:
    """Queues and Spark (needs `pip install 'queue-pg[spark]'` and Java 17)."""


@spark.command()
@click.option(
    "--since",
    type=Duration(),
    default="1d",
    show_default=True,
    help="How far back to read the history (e.g. 7d).",
)
@click.option(
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("advice"),
    show_default=True,
    help="Folder for the Parquet tables, summary.md and the PNG.",
)
@click.option(
    "--apply", "apply_", is_flag=True, help="Set each queue's visibility_timeout to its advice."
)
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option(
    "--jdbc-jar",
    type=click.Path(dir_okay=False, exists=True),
    help="PostgreSQL JDBC driver (default: $QUEUE_PG_JDBC_JAR, else"
    " /usr/share/java/postgresql.jar).",
)
@click.option("--queue", "queues", multiple=True, help="Only this queue (repeatable).")
@click.option("--driver-memory", metavar="SIZE",
              help="Spark driver memory, e.g. 4g (in local mode all the work runs in it; exact"
                   " percentiles hold each group's times in memory).")
@click.pass_obj
def advise(
    state: Any,
    since: float,
    output: Path,
    apply_: bool,
    master: str,
    jdbc_jar: str | None,
    queues: tuple[str, ...],
    driver_memory: str | None,
) -> None:
    """Advise each queue's visibility timeout and heartbeat from its history.

    Per queue and message type: processing and waiting times, receive counts, lease-expiry and
    dead-letter rates, the advised timeout, and which types belong in queues of their own.
    """
    try:
        from queue_pg.spark import advise as run_advice
        from queue_pg.spark import report, session
    except ImportError as exc:
        raise click.ClickException(
            f"{exc}: install the Spark extra, pip install 'queue-pg[spark]'"
        ) from None
    from pyspark.sql import SparkSession

    dsn = state.dsn
    ours = SparkSession.getActiveSession() is None  # else a caller's session: leave it running
    conf = {"spark.driver.memory": driver_memory} if driver_memory else None
    spark_session = session(master, jar=jdbc_jar, conf=conf)
    try:
        advice = run_advice(
            spark_session, dsn=dsn, since=timedelta(seconds=since), queues=list(queues) or None
        )
        written = report.write(advice, output)
        click.echo(written.summary.read_text(encoding="utf-8"))
        click.echo(
            f"wrote {', '.join(str(p) for p in written.parquet)}, {written.summary},"
            f" {written.chart}"
        )
        if apply_:
            for queue, old, new in report.apply(advice, dsn):
                click.echo(f"{queue}: visibility_timeout {old:g} -> {new:g}")
    finally:
        if ours:
            spark_session.stop()
