"""Scenario "azure-cors": what CORS costs the Azure endpoint (docs/azure.md, "Browsers (CORS)").

A ``queue-pg azure`` process (authentication on) with two CORS rules on its account serves, in
rounds taking turns, N requests of each kind over one keep-alive connection: a preflight a rule
admits, a preflight none does (403), a SAS-signed Peek Messages without an Origin, and the same
with an Origin a rule admits (the actual request's CORS headers). Each kind's figures are the
endpoint process's CPU per request (from /proc, which load disturbs less than wall time) and
requests a second; medians over the rounds. A preflight reads no database of its own (the rules
come from one cached read: tests/test_azure_cors.py counts the reads), so its CPU is the
endpoint's HTTP work alone.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from bench import Scenario
from bench.azure import endpoint_process
from bench.report import DEFAULT_OUT, cpu_seconds, machine_line, markdown_table, write_results

APP = "https://app.example"
KINDS = ("preflight", "preflight refused", "peek", "peek with Origin")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=2000,
                        help="requests of each kind a round at scale 1 (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")


def run(args: argparse.Namespace) -> int:
    import requests
    from azure.storage.queue import (
        AccountSasPermissions,
        CorsRule,
        QueueServiceClient,
        ResourceTypes,
        generate_account_sas,
    )

    n = max(10, int(args.requests * args.scale))
    out = Path(args.out) if args.out else DEFAULT_OUT
    log: Callable[[str], None] = (lambda _: None) if args.quiet else print
    figures: dict[str, list[dict[str, float]]] = {k: [] for k in KINDS}
    with contextlib.ExitStack() as stack:
        ep = endpoint_process(stack, args, "corsbench")
        pid, account, key, machine = ep.process.pid, ep.account, ep.key, ep.machine
        url = f"http://127.0.0.1:{ep.port}/{account}"
        svc = QueueServiceClient.from_connection_string(ep.conn_str)
        svc.create_queue("jobs").send_message("x")
        svc.set_service_properties(cors=[
            CorsRule(["https://other.example"], ["PUT"]),
            CorsRule([APP], ["GET", "PUT"], allowed_headers=["x-ms-*", "content-type"],
                     exposed_headers=["x-ms-*"])])
        sas = generate_account_sas(account, key, ResourceTypes(object=True),
                                   AccountSasPermissions(read=True),
                                   expiry=datetime.now(timezone.utc) + timedelta(hours=2))
        session = requests.Session()
        asked = {"Access-Control-Request-Method": "PUT",
                 "Access-Control-Request-Headers": "content-type,x-ms-date,x-ms-version"}
        calls: dict[str, tuple[Callable[..., Any], str, dict[str, str], int]] = {
            "preflight": (session.options, f"{url}/jobs/messages", {"Origin": APP, **asked}, 200),
            "preflight refused": (session.options, f"{url}/jobs/messages",
                                  {"Origin": "https://evil.example", **asked}, 403),
            "peek": (session.get, f"{url}/jobs/messages?peekonly=true&{sas}",
                     {"x-ms-version": "2019-02-02"}, 200),
            "peek with Origin": (session.get, f"{url}/jobs/messages?peekonly=true&{sas}",
                                 {"x-ms-version": "2019-02-02", "Origin": APP}, 200),
        }

        def one_round(kind: str, count: int) -> dict[str, float]:
            call, target, headers, status = calls[kind]
            cpu0, t0 = cpu_seconds(pid), time.perf_counter()
            for _ in range(count):
                got = call(target, headers=headers, timeout=30)
                if got.status_code != status:
                    raise RuntimeError(f"{kind}: {got.status_code} {got.text[:200]}")
            wall = time.perf_counter() - t0
            return {"cpu_ms": (cpu_seconds(pid) - cpu0) / count * 1e3, "per_second": count / wall}

        for kind in KINDS:  # warm-up, not counted
            one_round(kind, max(10, n // 10))
        for r in range(args.rounds):
            for kind in KINDS if r % 2 == 0 else tuple(reversed(KINDS)):
                figures[kind].append(one_round(kind, n))
                log(f"round {r + 1} {kind}: {figures[kind][-1]['cpu_ms']:.3f} ms CPU a request,"
                    f" {figures[kind][-1]['per_second']:.0f}/s")
    medians = {k: {m: statistics.median(f[m] for f in v) for m in ("cpu_ms", "per_second")}
               for k, v in figures.items()}
    rows = [[k, f"{medians[k]['cpu_ms']:.3f}", f"{medians[k]['per_second']:.0f}"] for k in KINDS]
    markdown = "\n\n".join([
        "# What CORS costs the Azure endpoint",
        f"`{args.command_line}`: {n} requests of each kind a round, {args.rounds} rounds taking"
        " turns, one keep-alive connection; medians.",
        markdown_table(["request", "endpoint CPU (ms a request)", "requests/s"], rows, "lrr"),
        machine_line(machine)])
    for path in write_results(out, "azure_cors", {"scenario": "azure-cors",
                                                  "command": args.command_line,
                                                  "requests": n, "rounds": figures,
                                                  "medians": medians, "machine": machine},
                              markdown):
        log(f"wrote {path}")
    log(markdown)
    return 0


SCENARIO = Scenario(
    name="azure-cors",
    help="what CORS costs queue-pg azure: preflights and actual requests with an Origin",
    add_arguments=add_arguments,
    run=run,
)
