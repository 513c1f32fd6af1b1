"""Throughput cells: N processes of one system sending, or receiving + deleting, for T seconds.

Processes, not threads, so the GIL never caps a many-client figure: each process opens its own
client (:mod:`bench.peers`), makes one unmeasured call to warm its connection, reports ready,
and waits on a shared start event; they all stop at the same deadline (a consumer also stops
when the queue is empty, which the cell records as ``drained``). A cell's rate is the messages
all processes sent (or deleted) divided by the longest process's measured time.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from bench import peers
from bench.report import LatencySummary

__all__ = ["Cell", "run_cell"]

#: Per-call times kept per process (enough for a p99).
_MAX_SAMPLES = 20_000
#: Empty receives in a row after which a consumer takes the queue for drained.
_EMPTY_LIMIT = 3


@dataclass
class Cell:
    """One measurement: ``procs`` processes of ``system`` doing ``op`` with ``batch``."""

    system: str
    op: str  #: "send" or "cycle"
    batch: int
    procs: int
    seconds: float  #: planned duration
    rate: float | None = None  #: messages per second (None: not measured, see ``note``)
    messages: int = 0
    calls: int = 0
    elapsed_s: float = 0.0
    drained: bool = False  #: the queue ran empty before the deadline (rate still valid)
    call_ms: LatencySummary | None = None  #: time per call (a send, or a delete + receive)
    note: str | None = None  #: why there is no rate ("n/a (…)") or what went wrong
    extra: dict[str, Any] = field(default_factory=dict)


def _child(
    system: str,
    dsn: str,
    op: str,
    batch: int,
    seconds: float,
    index: int,
    ready: Any,
    start: Any,
    results: Any,
) -> None:
    try:
        driver = peers.get(system)(dsn)
        base = (index + 1) * 1_000_000_000
        if op == "send":
            driver.send(peers.bodies(base, batch))  # warm-up, not counted
        else:
            warm = driver.receive(batch)
            if warm:
                driver.delete(warm)
    except BaseException:
        ready.put((index, traceback.format_exc()))
        return
    ready.put((index, None))
    start.wait()
    samples: list[float] = []
    done = calls = empties = 0
    handles: list[Any] = []
    drained = False
    t0 = time.monotonic()
    end = t0 + seconds
    try:
        n = base + batch
        now = t0
        while now < end:
            if op == "send":
                driver.send(peers.bodies(n, batch))
                n += batch
                done += batch
            else:
                got = driver.cycle(handles, batch)
                done += len(handles)
                handles = got
                if got:
                    empties = 0
                else:
                    empties += 1
                    if empties >= _EMPTY_LIMIT:
                        drained = True
                        break
            t1 = time.monotonic()
            calls += 1
            if len(samples) < _MAX_SAMPLES:
                samples.append(t1 - now)
            now = t1
        elapsed = time.monotonic() - t0
        if handles:
            driver.delete(handles)  # received in the window, settled after it: not counted
        driver.close()
    except BaseException:
        results.put((index, {"error": traceback.format_exc()}))
        return
    results.put(
        (
            index,
            {"messages": done, "calls": calls, "elapsed": elapsed, "drained": drained,
             "samples": samples},
        )
    )


def _context() -> Any:
    # fork starts 16 clients in well under a second; the parent holds no connection meanwhile.
    try:
        return mp.get_context("fork")
    except ValueError:  # pragma: no cover - platforms without fork
        return mp.get_context("spawn")


def run_cell(
    system: str, dsn: str, op: str, batch: int, procs: int, seconds: float, *, timeout: float = 120
) -> Cell:
    """Run one cell; a failure in a process becomes the cell's ``note`` (no rate)."""
    cell = Cell(system=system, op=op, batch=batch, procs=procs, seconds=seconds)
    ctx = _context()
    ready, results, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    workers = [
        ctx.Process(
            target=_child,
            args=(system, dsn, op, batch, seconds, i, ready, start, results),
            daemon=True,
        )
        for i in range(procs)
    ]
    for w in workers:
        w.start()
    errors: list[str] = []
    try:
        for _ in workers:
            _, err = ready.get(timeout=timeout)
            if err:
                errors.append(err)
        start.set()
        outcomes: list[dict[str, Any]] = []
        if not errors:
            deadline = time.monotonic() + seconds + timeout
            while len(outcomes) < len(workers):
                try:
                    _, out = results.get(timeout=max(0.1, deadline - time.monotonic()))
                except queue_mod.Empty:
                    errors.append("a process did not report in time")
                    break
                if "error" in out:
                    errors.append(out["error"])
                outcomes.append(out)
    finally:
        for w in workers:
            w.join(5)
            if w.is_alive():
                w.kill()
                w.join()
    if errors:
        cell.note = "error: " + errors[0].strip().splitlines()[-1]
        cell.extra["traceback"] = errors[0]
        return cell
    cell.messages = sum(o["messages"] for o in outcomes)
    cell.calls = sum(o["calls"] for o in outcomes)
    cell.elapsed_s = max(o["elapsed"] for o in outcomes)
    cell.drained = any(o["drained"] for o in outcomes)
    cell.rate = cell.messages / cell.elapsed_s if cell.elapsed_s > 0 else None
    cell.call_ms = LatencySummary.of([s for o in outcomes for s in o["samples"]])
    return cell
