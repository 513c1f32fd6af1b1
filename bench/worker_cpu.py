"""Scenario "worker-cpu": the worker process's own CPU per job, in-process.

``bench worker`` starts each system's worker as a command and times a short run from outside:
on this host its cells move by tens of percent between runs, too much to see a change of a few
microseconds per job. This scenario runs ``queue_pg.Worker`` inside the bench process on the
bench's no-op task (:mod:`bench.worker_apps.qpg`) over a pre-filled queue and reads
``time.process_time`` (this process only: the server's work is not in it) and the wall clock
until the queue is empty. Each figure is the least of ``--repeats`` rounds (noise only adds).
What it counts: the receive's Python (psycopg, decoding, Message objects), the hand-off to the
handler threads, the task lookup and argument check, the job itself (one small file write), the
batched settle, and the worker's own threads.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from typing import Any

from bench import Scenario, db
from bench.report import machine_info, machine_line, markdown_table, save_scenario
from bench.throughput import logger
from bench.worker_apps import QUEUE, STAMPS_ENV

RESULT_NAME = "worker_cpu"
CONCURRENCY = (16, 8)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=60_000,
                        help="jobs per round at --scale 1 (default 60000)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per figure (default 3)")


def _round(dsn: str, jobs: int, concurrency: int) -> tuple[float, float]:
    """One round on a freshly filled queue: (process CPU seconds per job, jobs per second)."""
    import bench.worker_apps.qpg  # noqa: F401  (registers the task)
    from bench.worker_systems import QueuePgSystem
    from queue_pg import Client, Worker
    from queue_pg.jobs.tasks import registry

    QueuePgSystem(dsn).fill(jobs)
    with Client(dsn, sweep_interval=None, min_size=1, max_size=concurrency + 3) as client:
        worker = Worker(client, [QUEUE], registry, concurrency=concurrency)

        def stop_when_done() -> None:  # in-process: no query adds to the server's work
            while worker.stats.succeeded < jobs:
                time.sleep(0.01)
            worker.stop()  # the last deletes are flushed before run returns

        watcher = threading.Thread(target=stop_when_done, daemon=True)
        c0, w0 = time.process_time(), time.perf_counter()
        watcher.start()
        worker.run(signals=())
        c1, w1 = time.process_time(), time.perf_counter()
    return (c1 - c0) / jobs, jobs / (w1 - w0)


def run(args: argparse.Namespace) -> int:
    log = logger(args.quiet)
    jobs = max(200, round(args.jobs * args.scale))
    results: list[dict[str, Any]] = []
    stamps = tempfile.TemporaryDirectory(prefix="queue_pg_worker_cpu_")  # the job's writes
    os.environ[STAMPS_ENV] = stamps.name
    with stamps, db.scratch_database(args.dsn, args.database, keep=args.keep) as dsn:
        from bench.worker_systems import QueuePgSystem

        QueuePgSystem(dsn).install()
        with db.connect(dsn) as conn:
            machine = machine_info(conn)
        best = {c: (float("inf"), 0.0) for c in CONCURRENCY}
        for _ in range(max(1, args.repeats)):  # the sizes take turns, so drift hits both
            for c in CONCURRENCY:
                cpu, rate = _round(dsn, jobs, c)
                log(f"{c} threads: {cpu * 1e6:.1f} µs CPU per job, {rate:,.0f} jobs/s")
                best[c] = (min(best[c][0], cpu), max(best[c][1], rate))
        for c, (cpu, rate) in best.items():
            results.append({"concurrency": c, "jobs": jobs, "cpu_us_per_job": cpu * 1e6,
                            "jobs_per_s": rate})
    md = "\n".join([
        "# Worker process CPU per job",
        "",
        f"`queue_pg.Worker` in-process on {jobs:,} pre-filled no-op jobs, one process; least"
        f" CPU and best rate of {args.repeats} rounds. The server's work is not in the CPU"
        " figure.",
        "",
        markdown_table(["threads", "µs CPU per job (worker process)", "jobs/s"],
                       [[r["concurrency"], f"{r['cpu_us_per_job']:.1f}",
                         f"{r['jobs_per_s']:,.0f}"] for r in results], "rrr"),
        "",
        f"Machine: {machine_line(machine)}.",
        "",
        f"Reproduce: `{args.command_line}`",
    ])
    return save_scenario(args, RESULT_NAME, machine, {"jobs": jobs, "repeats": args.repeats},
                         results, md, log)


SCENARIO = Scenario(
    name="worker-cpu",
    help="the worker process's own CPU per no-op job, in-process (16 and 8 threads)",
    add_arguments=add_arguments,
    run=run,
)
