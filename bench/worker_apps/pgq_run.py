"""``pgq run bench.worker_apps.pgq:create`` with its defaults.

PgQueuer 1.6's ``pgq run`` command fails before it starts with the Typer release installed here
(its ``--log-level`` parser hands a str where an enum is expected: ``'str' object has no
attribute 'name'``), so this calls the command's own function with the same values the command
line would give it (``python -m bench.worker_apps.pgq_run C``).
"""

from __future__ import annotations


def main() -> None:
    """PgQueuer's defaults: a batch of 10, no limit on the jobs a process runs at once (its
    ``--max-concurrent-tasks`` must be at least twice the batch size, so it cannot say 8 or
    16; an entrypoint's ``concurrency_limit`` is counted across all processes in the database).
    """
    from pgqueuer.adapters.cli import cli
    from pgqueuer.core.logconfig import LogLevel
    from pgqueuer.domain.types import QueueExecutionMode

    cli.run(factory_fn="bench.worker_apps.pgq:create", factory_args=[], dequeue_timeout=30.0,
            batch_size=10, heartbeat_timeout=30.0, restart_delay=5.0, restart_on_failure=False,
            log_level=LogLevel.WARNING, mode=QueueExecutionMode.continuous,
            max_concurrent_tasks=None, shutdown_on_listener_failure=False)


if __name__ == "__main__":
    main()
