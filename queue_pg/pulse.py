"""A worker as a consumer that can be seen to die (sql/api/34_consumers.sql).

A worker opens one connection of its own (in no pool) and registers its session as a consumer
there; its receives name the id, so each lease records whose it is. While the process lives the
session holds the consumer's advisory lock; when the process dies (a crash, SIGKILL, the out-of-
memory killer, a host gone) the session ends with it. Every second the worker reaps on that
connection: the leases of consumers whose lock has been free for the grace period end, so their
messages come back in seconds whatever their visibility timeout, while a slow job on a live
worker keeps its long lease. The reap also keeps the connection busy (no idle-session timeout
ends it) and notices when it is lost: the worker connects again and adopts its old id, which
keeps its leases when that happens within the grace period.

This module holds what both workers decide; :class:`queue_pg.Worker` runs it in a thread,
:class:`queue_pg.AsyncWorker` in a task.
"""

from __future__ import annotations

import logging
import os
import socket

from queue_pg import outage

__all__ = ["REAP_INTERVAL", "Pulse"]

logger = logging.getLogger("queue_pg.worker")

#: Seconds between two reaps of one worker (each also proves its connection alive).
REAP_INTERVAL = 1.0


class Pulse:
    """The registration's state: the id receives name (None: none yet, or lost), the id to
    adopt after a lost connection, and the backoff of failed attempts."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.name = f"{socket.gethostname()}:{os.getpid()}"[:200]
        #: What receives name; None until registered, and while the registration is lost.
        self.consumer: int | None = None
        self._adopt: int | None = None
        self.reaped = 0  #: leases of lost consumers this worker's reaps ended
        self.outage = outage.Outage(logger, "consumer registration", base=REAP_INTERVAL,
                                    cap=30.0)

    def adopt(self) -> int | None:
        """The id to ask register_consumer for: the one held before the connection was lost."""
        return self._adopt

    def registered(self, consumer: int | None) -> None:
        if consumer is None:
            logger.warning("no consumer id could be registered: leases of this worker lapse"
                           " as usual if it dies")
        elif self._adopt is not None and consumer != self._adopt:
            logger.warning("consumer %d was reaped while its connection was lost (its leases"
                           " ended); registered again as consumer %d", self._adopt, consumer)
        elif self._adopt is None:
            logger.info("registered as consumer %d (%s): if this process dies, its leases end"
                        " within seconds", consumer, self.name)
        self.consumer = self._adopt = consumer
        self.outage.recovered()

    def reaped_now(self, ended: int) -> None:
        if ended:
            self.reaped += ended
            logger.info("ended %d lease(s) of consumer(s) whose process is gone", ended)
        self.outage.recovered()

    def lost(self, exc: BaseException) -> float:
        """The connection or a call on it failed: receives name no id until it is back; the
        pause before the next try."""
        self.consumer = None
        pause = self.outage.failed(exc)
        if not outage.is_connection_error(exc):
            logger.warning("consumer registration failed (%s); retrying in %.1fs", exc, pause)
        return pause

    def refused(self) -> None:
        """A receive said the id is unknown (reaped): stop naming it; the next reap on the
        connection, or a new one, registers again."""
        self.consumer = None
