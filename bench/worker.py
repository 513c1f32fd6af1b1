"""Scenario "worker": ``queue_pg.Worker`` running no-op tasks (``queue_pg.tasks``).

Two measurements, each with the worker in a process of its own:

- latency: an idle worker (concurrency 4) long-polls; the parent enqueues the task at a fixed
  rate (``Task.send``), each run carrying the ``time.monotonic()`` taken just before its send.
  Latency is the handler's start (inside the task function) minus that stamp.
- throughput: the queue is filled with task messages first, then a worker with concurrency 1,
  4 and 16 (threads, as ``Worker`` runs them) runs them all; jobs per second is the number of
  jobs over the time from the first task start to the last.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from bench import Scenario, db, peers
from bench.report import (
    DEFAULT_OUT,
    LatencySummary,
    machine_info,
    machine_line,
    markdown_table,
    redact_dsn,
    write_results,
)
from bench.throughput import logger

RESULT_NAME = "worker"
TASK = "bench.noop"
CONCURRENCY = (1, 4, 16)
LATENCY_CONCURRENCY = 4
#: Jobs per second of measured time a throughput run is sized for (at --scale 1, --seconds 5).
_JOBS_PER_SECOND_GUESS = 600


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seconds",
        type=float,
        default=5.0,
        help="rough seconds per measurement at --scale 1 (default 5; times --scale)",
    )
    parser.add_argument(
        "--rate", type=float, default=50.0, help="tasks enqueued per second for the latency run"
    )


def _registry(sink: Any = None) -> Any:
    from queue_pg.tasks import Registry, Task

    registry = Registry()

    def noop(n: int | None = None, t: float | None = None) -> None:
        """The task: does nothing but note when it started."""
        if sink is not None:
            sink(time.monotonic(), t)

    Task(noop, queue=peers.QUEUE, name=TASK, registry=registry)
    return registry


def _worker_child(dsn: str, concurrency: int, expected: int, ready: Any, results: Any) -> None:
    try:
        from queue_pg import Client, Worker

        starts: list[tuple[float, float | None]] = []
        lock = threading.Lock()
        holder: dict[str, Any] = {}

        def sink(now: float, stamp: float | None) -> None:
            with lock:
                starts.append((now, stamp))
                if len(starts) >= expected:
                    holder["worker"].stop()

        client = Client(dsn, min_size=1, max_size=concurrency + 2, sweep_interval=None)
        worker = Worker(client, peers.QUEUE, _registry(sink), concurrency=concurrency, wait=5)
        holder["worker"] = worker
    except BaseException:
        ready.put(traceback.format_exc())
        return
    ready.put(None)
    try:
        began = time.monotonic()
        worker.run(signals=())
        client.close()
    except BaseException:
        results.put({"error": traceback.format_exc()})
        return
    results.put({"starts": starts, "began": began, "stats": worker.stats.line()})


def _spawn(dsn: str, concurrency: int, expected: int) -> tuple[Any, Any, Any]:
    ctx = mp.get_context("fork")
    ready, results = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(
        target=_worker_child, args=(dsn, concurrency, expected, ready, results), daemon=True
    )
    proc.start()
    err = ready.get(timeout=60)
    if err:
        proc.join(5)
        raise RuntimeError(err)
    return proc, results, ctx


def _finish(proc: Any, results: Any, timeout: float) -> dict[str, Any]:
    try:
        out: dict[str, Any] = results.get(timeout=timeout)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join()
    if "error" in out:
        raise RuntimeError(out["error"])
    return out


def measure_latency(dsn: str, rate: float, count: int) -> dict[str, Any]:
    from queue_pg import Client

    proc, results, _ = _spawn(dsn, LATENCY_CONCURRENCY, count)
    time.sleep(1.0)  # the worker is up and idle in its long poll
    task = _registry().tasks[TASK]
    with Client(dsn, min_size=1, max_size=1, sweep_interval=None) as client:
        t0 = time.monotonic()
        for i in range(count):
            pause = t0 + i / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            task.send(kwargs={"n": i, "t": time.monotonic()}, client=client)
        out = _finish(proc, results, timeout=120)
    lat = [now - stamp for now, stamp in out["starts"] if stamp is not None]
    return {"latency": LatencySummary.of(lat), "sent": count, "started": len(lat),
            "concurrency": LATENCY_CONCURRENCY}


def fill_tasks(dsn: str, count: int) -> None:
    """``count`` task messages, built in the server (the envelope ``Task.send`` writes)."""
    with db.connect(dsn) as conn:
        done = 0
        while done < count:
            size = min(10_000, count - done)
            conn.execute(
                "SELECT count(*) FROM queue_pg.send_batch(%s, ARRAY("
                " SELECT jsonb_build_object('task', %s::text, 'args', '[]'::jsonb,"
                " 'kwargs', jsonb_build_object('n', g))"
                " FROM generate_series(%s::bigint, %s::bigint) AS g ORDER BY g),"
                " attributes => array_fill(jsonb_build_object('type', %s::text), ARRAY[%s]))",
                [peers.QUEUE, TASK, done, done + size - 1, TASK, size],
            )
            done += size


def measure_throughput(dsn: str, concurrency: int, jobs: int) -> dict[str, Any]:
    fill_tasks(dsn, jobs)
    with db.connect(dsn) as conn:
        conn.execute("VACUUM ANALYZE queue_pg.messages")
    proc, results, _ = _spawn(dsn, concurrency, jobs)
    out = _finish(proc, results, timeout=600)
    starts = sorted(now for now, _ in out["starts"])
    span = starts[-1] - starts[0] if len(starts) > 1 else 0.0
    return {
        "concurrency": concurrency,
        "jobs": len(starts),
        "seconds": round(span, 3),
        "jobs_per_s": (len(starts) - 1) / span if span > 0 else None,
        "worker_stats": out["stats"],
    }


def run(args: argparse.Namespace) -> int:
    from bench.peers.queue_pg_driver import QueuePg

    log = logger(args.quiet)
    out_dir = Path(args.out) if args.out else DEFAULT_OUT
    seconds = float(args.seconds) * float(args.scale)
    count = max(20, round(seconds * 2 * args.rate))
    jobs = max(100, round(seconds * _JOBS_PER_SECOND_GUESS))
    began = time.perf_counter()
    with db.scratch_database(args.dsn, f"{args.database}_worker", keep=args.keep) as dsn:
        install = QueuePg.install(dsn)
        with db.connect(dsn) as conn:
            machine = machine_info(conn)
        latency = measure_latency(dsn, args.rate, count)
        s: LatencySummary = latency["latency"]
        log(f"worker latency (concurrency {LATENCY_CONCURRENCY}): p50 {s.p50_ms:.2f} ms"
            f"  p99 {s.p99_ms:.2f} ms  max {s.max_ms:.2f} ms")
        throughput = []
        for c in CONCURRENCY:
            r = measure_throughput(dsn, c, jobs)
            throughput.append(r)
            log(f"worker concurrency {c:>2}: {r['jobs_per_s'] or 0:,.0f} jobs/s ({r['jobs']} jobs)")
    result: dict[str, Any] = {
        "scenario": RESULT_NAME,
        "command": args.command_line,
        "dsn": redact_dsn(args.dsn),
        "machine": machine,
        "parameters": {"rate": args.rate, "latency_tasks": count, "throughput_jobs": jobs,
                       "concurrency": list(CONCURRENCY), "scale": args.scale},
        "systems": {"queue_pg": {"version": QueuePg.version(), **install}},
        "latency": latency,
        "throughput": throughput,
        "elapsed_s": round(time.perf_counter() - began, 1),
    }
    rows: list[list[object]] = [
        [f"send → handler start, idle worker, concurrency {LATENCY_CONCURRENCY}",
         f"p50 {s.p50_ms:.2f} ms, p99 {s.p99_ms:.2f} ms, max {s.max_ms:.2f} ms"]
    ]
    rows += [[f"no-op tasks, concurrency {r['concurrency']}",
              f"{r['jobs_per_s'] or 0:,.0f} jobs/s ({r['jobs']:,} jobs)"] for r in throughput]
    md = "\n".join([
        "### Worker: queue_pg.Worker running no-op tasks",
        "",
        f"Latency: {count} tasks enqueued with `Task.send` at {args.rate:g}/s to an idle worker"
        " in another process; time from just before the send to the task function's start."
        f" Throughput: {jobs:,} task messages filled first, then run by one worker process"
        " (handler threads = concurrency); jobs over the time from first to last task start.",
        "",
        markdown_table(["measurement", "queue_pg"], rows, "lr"),
        "",
        f"Machine: {machine_line(machine)}.",
        "",
        f"Reproduce: `{args.command_line}`",
    ])
    paths = write_results(out_dir, RESULT_NAME, result, md)
    from bench import chart

    png = chart.latency_chart(
        "worker: send to handler start",
        {"queue_pg.Worker": {"p50": s.p50_ms, "p99": s.p99_ms, "max": s.max_ms}},
        out_dir / f"{RESULT_NAME}.png",
    )
    if png:
        paths.append(png)
    for p in paths:
        log(f"wrote {p}")
    return 0


SCENARIO = Scenario(
    name="worker",
    help="queue_pg.Worker: send-to-handler latency and no-op jobs/s at concurrency 1, 4, 16",
    add_arguments=add_arguments,
    run=run,
)
