"""``queue-pg top`` and ``queue-pg metrics``: the live surfaces (the ``dashboard`` extra).

Textual and prometheus-client are imported when the command runs, so the rest of the command
line works without the extra.
"""

from __future__ import annotations

import asyncio
import time

import click

from queue_pg.ops.cli.state import State, fail, pass_state
from queue_pg.ops.display import err

__all__ = ["COMMANDS", "metrics", "top"]

_EXTRA = "needs the dashboard extra: pip install 'queue-pg[dashboard]'"

_window = click.option(
    "--window", type=click.FloatRange(min=1, max=7 * 86400), default=600.0, show_default=True,
    metavar="SECONDS",
    help="Finished messages of the last SECONDS feed the advice and the processing times.")


@click.command()
@_window
@click.option("--interval", type=click.FloatRange(min=0.2, max=3600), default=1.0,
              show_default=True, metavar="SECONDS", help="Refresh every SECONDS.")
@pass_state
def top(state: State, window: float, interval: float) -> None:
    """Every queue live, like top: counts, rates, expiries, the timeout and its advice.

    Keys: arrows select a queue (its in-flight messages, dead letters and processing times show
    in the detail pane), s sorts by the next column (or click a header), r reverses, q quits.
    """
    try:
        from queue_pg.ops.top import TopApp
    except ImportError:
        fail(f"queue-pg top {_EXTRA}")
    from queue_pg.aio import AsyncClient

    dsn = state.dsn

    async def run() -> None:
        async with AsyncClient(dsn, min_size=1, max_size=2, sweep_interval=None) as client:
            await TopApp(client, window=window, interval=interval).run_async()

    asyncio.run(run())


@click.command()
@click.option("--port", type=click.IntRange(0, 65535), default=9464, show_default=True)
@click.option("--addr", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface; the metrics name every queue"
                   " and ask for no credentials).")
@_window
@pass_state
def metrics(state: State, port: int, addr: str, window: float) -> None:
    """Serve Prometheus metrics of every queue on http://ADDR:PORT/metrics until Ctrl-C.

    Each scrape runs one query, whatever the number of queues.
    """
    try:
        from queue_pg.ops.metrics import serve
    except ImportError:
        fail(f"queue-pg metrics {_EXTRA}")
    server, _ = serve(state.client, port=port, addr=addr, window=window)
    err().print(f"serving metrics on http://{addr}:{server.server_port}/metrics", soft_wrap=True)
    try:
        # Not Event().wait(): the kernel may hand Ctrl-C to one of the server's or the pool's
        # threads, and a main thread blocked for good never runs Python's handler
        # (tests/test_metrics.py sends it to another thread). Waking each second, it does.
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        server.shutdown()


COMMANDS: list[click.Command] = [top, metrics]
