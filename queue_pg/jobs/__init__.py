"""The jobs layer: tasks, the job a handler gets, the workers and what they run beside their
receive loop (settling, batched deletes, liveness, schedules), and the worker processes.

It imports the client core (``queue_pg``'s own modules) and nothing above it; see
docs/architecture.md. The public names are on ``queue_pg`` itself (``queue_pg.task``,
``queue_pg.Worker``, ...).
"""
