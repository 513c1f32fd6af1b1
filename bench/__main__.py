"""``python -m bench <scenario> [options]``: run one benchmark scenario.

Options every scenario shares come after the scenario's name, e.g.
``python -m bench leased-head --dsn postgresql://postgres@127.0.0.1:5432/postgres --scale 0.1``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from bench import (
    Scenario,
    advice,
    azure,
    azure_cors,
    azure_suite,
    client_cpu,
    cycle,
    cycle_cpu,
    failover,
    fifo,
    latency,
    leased_head,
    run_all,
    send,
    soak,
    spark,
    sqs,
    sqs_details,
    sqs_suite,
    tuning,
    worker,
    worker_cpu,
)
from bench.report import DEFAULT_OUT, command_line

#: Every scenario, in the order ``--help`` lists them. A new scenario adds its module here.
SCENARIOS: tuple[Scenario, ...] = (
    send.SCENARIO,
    cycle.SCENARIO,
    cycle_cpu.SCENARIO,
    latency.SCENARIO,
    worker.SCENARIO,
    worker_cpu.SCENARIO,
    leased_head.SCENARIO,
    client_cpu.SCENARIO,
    soak.SCENARIO,
    tuning.SCENARIO,
    spark.SCENARIO,
    fifo.SCENARIO,
    advice.SCENARIO,
    sqs.SCENARIO,
    sqs_details.SCENARIO,
    sqs_suite.SCENARIO,
    azure.SCENARIO,
    azure_cors.SCENARIO,
    azure_suite.SCENARIO,
    failover.SCENARIO,
)


# `all` runs the others through this command line (main and scenario_names come below)
SCENARIOS = (*SCENARIOS, run_all.scenario(lambda argv: main(argv), lambda: scenario_names()))


def scenario_names() -> list[str]:
    return [s.name for s in SCENARIOS]


DSN_ENV = ("QUEUE_PG_BENCH_DSN", "QUEUE_PG_DSN")


def _common(*, needs_dsn: bool = True) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    default_dsn = next((os.environ[v] for v in DSN_ENV if os.environ.get(v)), None)
    common.add_argument(
        "--dsn",
        default=default_dsn,
        required=needs_dsn and default_dsn is None,
        help="a server to benchmark, as a libpq DSN of any database on it; the scenario works in"
        f" a scratch database it creates and drops; 'embedded': queue_pg's embedded PostgreSQL"
        f" (default: ${DSN_ENV[0]} or ${DSN_ENV[1]})",
    )
    common.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiplies the message counts (default 1.0; 0.1 for a quick check)",
    )
    common.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"folder for the JSON and Markdown results (default {DEFAULT_OUT})",
    )
    common.add_argument(
        "--database",
        default="queue_pg_bench",
        help="name of the scratch database (default queue_pg_bench)",
    )
    common.add_argument(
        "--keep", action="store_true", help="keep the scratch database afterwards (for psql)"
    )
    common.add_argument("--quiet", action="store_true", help="print nothing but errors")
    return common


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="python -m bench", description="queue_pg benchmarks (see bench/__init__.py)"
    )
    subs = top.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")
    common, own_servers = _common(), _common(needs_dsn=False)
    for scenario in SCENARIOS:
        sub = subs.add_parser(
            scenario.name, parents=[common if scenario.needs_dsn else own_servers],
            help=scenario.help, description=scenario.help,
        )
        scenario.add_arguments(sub)
        sub.set_defaults(run=scenario.run)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(args_list)
    if args.scale <= 0:
        raise SystemExit("--scale must be more than 0")
    args.command_line = command_line(args_list)
    if args.dsn == "embedded":  # the fresh-machine default: queue_pg's own embedded PostgreSQL
        from queue_pg.embedded import default_data_dir, embedded_dsn

        args.dsn = embedded_dsn(default_data_dir())
    status: int = args.run(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
