"""``queue-pg demo``: two producers and three workers, each its own process, on one queue.

Besides ordinary jobs, four special ones show what leases are for:

- **slow**: takes longer than its lease, so its worker heartbeats with ``change_visibility``;
- **crash**: its worker process dies holding it; the lease lapses and another worker gets it
  again (``receive_count=2``); a new worker process replaces the dead one;
- **stall**: its worker hangs past the lease without heartbeating; the job is redelivered, and
  when the first worker finally deletes, its receipt is refused as stale (fencing);
- **poison**: fails every time (released at once with ``change_visibility(receipt, 0)``) until
  the engine moves it to the dead-letter queue after ``max_receive_count`` receives.

Each process reports to the parent through a pipe of its own (a send is complete when it
returns, so a process may die right after; EOF tells the parent it is gone), and only the
parent prints. The parent stops them all by closing the "stop" pipe.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import os
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnProcess
from typing import TYPE_CHECKING, Any

from queue_pg.client import Client
from queue_pg.dsn import safe_dsn
from queue_pg.errors import StaleReceipt
from queue_pg.types import Message, QueueStats

if TYPE_CHECKING:
    from rich.console import Console

JOBS, DLQ = "demo-jobs", "demo-dlq"
MAX_RECEIVES = 3
PRODUCERS, WORKERS = 2, 3
SPECIALS = ("slow", "crash", "poison", "stall")


@dataclass(frozen=True)
class Plan:
    lease: float  #: visibility_timeout of demo-jobs
    jobs: int  #: ordinary jobs
    work: tuple[float, float]  #: an ordinary job takes between these many seconds
    slow: float  #: the slow job's work (longer than the lease: needs heartbeats)
    stall: float  #: how long the stalled worker hangs (longer than the lease)
    pause: float  #: between two sends of producer-2 (producer-1 sends pairs, half as often)
    deadline: float  #: give up after this many seconds


FULL = Plan(lease=2, jobs=40, work=(0.1, 0.5), slow=6, stall=4.5, pause=0.6, deadline=90)
QUICK = Plan(lease=1, jobs=4, work=(0.05, 0.2), slow=2.5, stall=2.5, pause=0.1, deadline=60)


# --- child processes ------------------------------------------------------------------------------


def _producer(dsn: str, who: str, bodies: list[dict[str, Any]], batch: int, pause: float,
              events: Connection, stop: Connection) -> None:
    """Send ``bodies`` in batches of ``batch``, with the job's kind as attribute ``type``."""
    try:
        with Client(dsn, min_size=1, max_size=1, sweep_interval=None) as client:
            for i in range(0, len(bodies), batch):
                if stop.poll():  # readable = closed by the parent
                    return
                chunk = bodies[i:i + batch]
                types = [{"type": b["kind"]} for b in chunk]
                ids = client.send_batch(JOBS, chunk, attributes=types)
                events.send((who, "sent", len(ids)))
                kinds = {b["kind"] for b in chunk} - {"ordinary"}
                label = f"job {ids[0]}" if len(ids) == 1 else f"jobs {ids[0]}-{ids[-1]}"
                if kinds:
                    events.send((who, "log", (f"sent {label} ({', '.join(kinds)})", "bold")))
                else:
                    events.send((who, "log", (f"sent {label}", "dim")))
                time.sleep(pause)
    except KeyboardInterrupt:
        pass
    except Exception as exc:
        events.send((who, "log", (f"failed: {exc!r}", "red")))
        raise SystemExit(1) from None


def _worker(dsn: str, who: str, plan: Plan, events: Connection, stop: Connection) -> None:
    """Receive, work, delete, until ``stop``; the special jobs behave as the module says."""
    try:
        with Client(dsn, min_size=1, max_size=2, sweep_interval=None) as client:
            while not stop.poll():
                for message in client.receive(JOBS, wait=1):
                    _handle(client, message, who, plan, events)
    except KeyboardInterrupt:
        pass
    except Exception as exc:
        events.send((who, "log", (f"failed: {exc!r}", "red")))
        raise SystemExit(1) from None


def _handle(client: Client, m: Message, who: str, plan: Plan, events: Connection) -> None:
    def log(text: str, style: str = "") -> None:
        events.send((who, "log", (text, style)))

    assert m.receipt is not None
    kind, job, count = m.body["kind"], m.id, m.receive_count
    tag = f"job {job}" if kind == "ordinary" else f"job {job} ({kind})"
    events.send((who, "received", count))
    if count > 1 and kind != "poison":
        log(f"{tag} redelivered, receive_count={count}", "yellow bold")

    if kind == "crash" and count == 1:
        log(f"{tag}: worker crashes holding it (no delete, no more heartbeats)", "red bold")
        os._exit(3)

    if kind == "poison":
        time.sleep(plan.work[0])
        client.change_visibility(JOBS, m.receipt, 0)
        log(f"{tag} failed on receive {count}/{MAX_RECEIVES}: released with"
            " change_visibility(receipt, 0)", "magenta")
        return

    if kind == "stall" and count == 1:
        log(f"{tag}: hangs {plan.stall:g}s without heartbeating (lease {plan.lease:g}s)", "red")
        time.sleep(plan.stall)
    elif kind == "slow" or kind == "stall":  # the stall job's second holder takes its time too
        work = plan.slow if kind == "slow" else 2 * plan.lease
        log(f"{tag}: needs {work:g}s, lease is {plan.lease:g}s: heartbeating", "cyan")
        done_at = time.monotonic() + work
        while (left := done_at - time.monotonic()) > plan.lease / 2:
            time.sleep(plan.lease / 2)
            until = client.change_visibility(JOBS, m.receipt, plan.lease)
            log(f"{tag} heartbeat: lease extended to {until.astimezone():%H:%M:%S.%f}"[:-3]
                + f" (+{plan.lease:g}s)", "cyan")
        time.sleep(max(left, 0))
    else:
        time.sleep(random.uniform(*plan.work))

    try:
        deleted = client.delete(JOBS, m.receipt)
    except StaleReceipt:
        events.send((who, "stale", job))
        log(f"{tag}: delete refused (StaleReceipt): it was redelivered, its new holder owns it",
            "red bold")
        return
    if not deleted:
        log(f"{tag}: delete returned False: already deleted by its next holder", "red")
        return
    events.send((who, "deleted", job))
    late = " (lease had lapsed, nobody took it: delete accepted)" * (kind == "stall")
    log(f"{tag} done{late if count == 1 else ''}",
        "dim" if kind == "ordinary" and count == 1 else "green")


# --- the parent -----------------------------------------------------------------------------------


def _stop_resource_tracker() -> None:
    """Stop (and reap) the helper process every spawn starts, so none outlives the demo.

    It would exit by itself when this process does; stopping it here keeps the demo from
    leaving anything behind when it runs inside a longer-lived process (tests, a notebook).
    Private API, hence the guard.
    """
    from multiprocessing import resource_tracker

    stop = getattr(getattr(resource_tracker, "_resource_tracker", None), "_stop", None)
    if callable(stop):
        with contextlib.suppress(Exception):
            stop()


def _bodies(plan: Plan) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Producer 1 sends ordinary jobs; producer 2 the rest, the specials among them."""
    ordinary = [{"kind": "ordinary", "n": i} for i in range(plan.jobs)]
    first, second = ordinary[: plan.jobs // 2], ordinary[plan.jobs // 2:]
    for k, kind in enumerate(SPECIALS):
        second.insert(min(2 * k + 1, len(second)), {"kind": kind})
    return first, second


def run(dsn: str, *, quick: bool = False, messages: int | None = None) -> Counter[str]:
    """Run the demo on ``dsn`` and print its summary; returns the summary counts
    (``lost`` and ``timed out`` are 0 when all went well)."""
    from queue_pg.install import migrate
    from queue_pg.ops.display import out

    plan = QUICK if quick else FULL
    if messages is not None:
        plan = replace(plan, jobs=messages)
    console = out()
    console.print(f"[dim]schema queue_pg at revision {migrate(dsn).after}[/dim]")
    with Client(dsn, min_size=1, max_size=2, sweep_interval=None) as client:
        # Drop and re-create rather than purge: a re-run starts with its counters at zero too.
        client.drop_queue(JOBS, if_exists=True)  # first: it names demo-dlq as its DLQ
        client.drop_queue(DLQ, if_exists=True)
        client.create_queue(DLQ)
        client.create_queue(JOBS, visibility_timeout=plan.lease, dead_letter_queue=DLQ,
                            max_receive_count=MAX_RECEIVES)
        console.print(
            f"queues [bold]{JOBS}[/bold] (visibility_timeout {plan.lease:g}s, max_receive_count"
            f" {MAX_RECEIVES}, dead_letter_queue {DLQ}) and [bold]{DLQ}[/bold]; starting"
            f" {PRODUCERS} producers and {WORKERS} workers"
        )
        started = time.monotonic()
        tally = _run_processes(dsn, client, plan, console, started)
        return _summary(dsn, client, tally, console, started)


def _run_processes(dsn: str, client: Client, plan: Plan, console: Console,
                   started: float) -> Counter[str]:
    """Start the producers and workers, print what they report and the live stats, restart a
    crashed worker, and stop them all once every message is settled; returns their counts."""
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    from queue_pg.ops.display import stats_table

    ctx = mp.get_context("spawn")
    stop, stopping = ctx.Pipe(duplex=False)
    procs: dict[str, SpawnProcess] = {}
    readers: dict[Connection, str] = {}
    tally: Counter[str] = Counter()

    def say(who: str, text: str, style: str = "") -> None:
        line = Text(f"{time.monotonic() - started:5.1f}s {who:<11}", style="dim")
        line.append(text, style=style)
        console.print(line)

    def start(who: str, target: Callable[..., None], *args: Any) -> None:
        reader, events = ctx.Pipe(duplex=False)
        p = ctx.Process(target=target, name=who, args=(dsn, who, *args, events, stop), daemon=True)
        p.start()
        events.close()  # the child's end: EOF on the reader once the child is gone
        procs[who], readers[reader] = p, who

    def drain(timeout: float) -> None:
        """Print and count what the processes report, for ``timeout`` seconds or until every
        process has exited."""
        if not readers:  # nobody left to hear from (not the normal case): just pace the loop
            time.sleep(timeout)
            return
        deadline = time.monotonic() + timeout
        while readers and (left := deadline - time.monotonic()) > 0:
            for reader in wait(list(readers), timeout=left):
                assert isinstance(reader, Connection)
                try:
                    who, kind, payload = reader.recv()
                except EOFError:
                    del readers[reader]
                    reader.close()
                    continue
                if kind == "log":
                    say(who, *payload)
                else:
                    tally[kind] += payload if kind == "sent" else 1

    def view(rows: list[QueueStats]) -> Group:
        counts = ", ".join(f"{k} {tally[k]}" for k in ("sent", "deleted", "stale"))
        footer = Text(f"{time.monotonic() - started:5.1f}s  {counts}", style="dim")
        return Group(stats_table(rows, title="queue_pg.queue_stats"), footer)

    first, second = _bodies(plan)
    workers = itertools.count(1)
    try:
        for _ in range(WORKERS):
            start(f"worker-{next(workers)}", _worker, plan)
        start("producer-1", _producer, first, 2, 2 * plan.pause)
        start("producer-2", _producer, second, 1, plan.pause)
        producers = [procs["producer-1"], procs["producer-2"]]
        dead_lettered = 0
        with Live(view([]), console=console, auto_refresh=False) as live:
            while time.monotonic() - started < plan.deadline:
                drain(0.25)
                for who, p in list(procs.items()):
                    if who.startswith("worker") and p.exitcode not in (None, 0):
                        del procs[who]
                        new = f"worker-{next(workers)}"
                        say(who, f"exited ({p.exitcode}); starting {new}", "red")
                        start(new, _worker, plan)
                jobs, dlq = client.stats(JOBS), client.stats(DLQ)
                live.update(view([jobs, dlq]), refresh=True)
                if dlq.visible > dead_lettered:
                    dead_lettered = dlq.visible
                    for m in client.peek(DLQ, 10):
                        say("engine", f"moved job {m.id} ({m.body['kind']}) to {DLQ} after"
                            f" {m.receive_count} receives", "bold magenta")
                settled = jobs.visible + jobs.in_flight + jobs.delayed == 0
                if settled and all(p.exitcode == 0 for p in producers):
                    break
            else:
                tally["timed out"] = 1
                console.print(f"[red]demo did not finish within {plan.deadline:g}s[/red]")
            stopping.close()
            drain(30)  # until every process has finished its job and exited
            live.update(view([client.stats(JOBS), client.stats(DLQ)]), refresh=True)
    finally:
        stopping.close()
        for p in procs.values():
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join()
        for reader in [stop, *readers]:
            reader.close()
        _stop_resource_tracker()
    return tally


def _psql(dsn: str) -> str:
    """How to open psql on ``dsn``: the bundled one for the embedded server (a fresh machine may
    have no psql of its own)."""
    from queue_pg.embedded import EmbeddedPostgresMissing, server_status

    try:
        embedded = server_status().dsn == dsn
    except EmbeddedPostgresMissing:
        embedded = False
    return "queue-pg server psql" if embedded else f"psql '{safe_dsn(dsn)}'"


def _summary(dsn: str, client: Client, tally: Counter[str], console: Console,
             started: float) -> Counter[str]:
    from queue_pg.ops.display import message_table

    jobs = client.stats(JOBS)
    summary = Counter({
        "sent": tally["sent"],
        "deleted": tally["deleted"],
        "redelivered": jobs.lease_expiries,
        "dead-lettered": jobs.dead_lettered,
        "stale receipts": jobs.stale_receipts,
        "still queued": jobs.visible + jobs.in_flight + jobs.delayed,
        "timed out": tally["timed out"],
    })
    dead = client.peek(DLQ, 10)
    if dead:
        console.print(f"\n[bold]{DLQ}[/bold] (queue-pg peek {DLQ}):")
        console.print(message_table(dead, receipts=False))
    console.print(f"\n[bold]summary[/bold] after {time.monotonic() - started:.1f}s")
    notes = {
        "sent": f"by {PRODUCERS} producers",
        "deleted": "worked and deleted",
        "redelivered": "leases that lapsed (crash, stall) and were received again",
        "dead-lettered": f"moved to {DLQ} after {MAX_RECEIVES} receives",
        "stale receipts": "deletes refused: the message had been redelivered",
        "still queued": "",
    }
    for key, note in notes.items():
        console.print(f"  {key:<15}{summary[key]:>4}   [dim]{note}[/dim]")
    summary["lost"] = (summary["sent"] - summary["deleted"] - summary["dead-lettered"]
                       - summary["still queued"])
    if summary["lost"] == 0:
        console.print("  [green]every message accounted for: deleted, or dead-lettered[/green]")
    else:
        console.print(f"  [red]{summary['lost']} messages unaccounted for[/red]")
    console.print(
        "\nlook further:\n"
        f"  {_psql(dsn)} -c 'select * from queue_pg.queue_stats;'\n"
        f"  select * from queue_pg.peek('{DLQ}', 10);\n"
        "  select outcome, count(*) from queue_pg.message_history"
        f" where queue = '{JOBS}' group by 1;\n"
        f"  queue-pg stats --watch     queue-pg peek {DLQ}     queue-pg redrive {DLQ}",
        soft_wrap=True,
    )
    return summary
