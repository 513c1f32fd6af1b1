"""The operator's layer: the command line (``queue-pg``), ``queue-pg top``, the Prometheus
metrics, the web dashboard, and how queues look on a terminal.

It sits above the core, the jobs layer and the endpoints (the command line serves
``queue_pg.sqs``, ``queue_pg.azure`` and ``queue_pg.spark``); only ``queue_pg.contrib`` imports
it. See docs/architecture.md.
"""
