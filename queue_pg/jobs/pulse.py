"""A worker as a consumer that can be seen to die (sql/api/34_consumers.sql).

A worker opens one connection of its own (in no pool) and registers as a consumer there; its
receives name the id, so each lease records whose it is. Every second the worker writes a
heartbeat and reaps, in one round trip on that connection: the leases of consumers found dead
for the grace period end, so their messages come back in seconds whatever their visibility
timeout, while a slow job on a live worker keeps its long lease. Dead is a heartbeat older than
the grace, or (on a session of its own, the default unless the client is behind a transaction
pooler) its backend gone: when the process dies (a crash, SIGKILL, the out-of-memory killer, a
host gone) the session ends with it. The beat also keeps the connection busy (no idle-session
timeout ends it) and notices when it is lost: the worker connects again and adopts its old id,
which keeps its leases when that happens within the grace period (after a failover, switchover
or restart, within 15 s).

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
        # reconnect at least every 2 s: after a restart or failover the worker must be back
        # (adopt its id) within the allowance the reaps give it
        self.outage = outage.Outage(logger, "consumer registration", base=REAP_INTERVAL,
                                    cap=2.0)
        #: registrations that gave no id or failed: crash detection was off meanwhile
        self.failures = 0

    def adopt(self) -> int | None:
        """The id to ask register_consumer for: the one held before the connection was lost."""
        return self._adopt

    def registered(self, consumer: int | None) -> None:
        if consumer is None:
            self.failures += 1
            logger.error("crash detection is OFF for this worker: no consumer id could be"
                         " registered; its leases lapse as usual if it dies (retrying each"
                         " second)")
        elif self._adopt is not None and consumer != self._adopt:
            logger.warning("consumer %d was reaped while its connection was lost (its leases"
                           " ended); registered again as consumer %d", self._adopt, consumer)
        elif self._adopt is None:
            logger.info("registered as consumer %d (%s): if this process dies, its leases end"
                        " within seconds", consumer, self.name)
        self.consumer = self._adopt = consumer
        self.outage.recovered()

    @property
    def active(self) -> bool:
        """Whether crash detection covers this worker now (registered, not lost)."""
        return self.consumer is not None

    def beat(self, alive: bool, ended: int) -> None:
        """A heartbeat and reap on the registration's connection: ``alive`` False when the
        consumer was reaped (its leases ended): register again (a new id)."""
        if not alive:
            logger.error("consumer %s was reaped although this worker lives (its leases"
                         " ended): registering again", self.consumer)
            self.consumer = self._adopt = None
        self.reaped_now(ended)

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
            self.failures += 1
            logger.error("consumer registration failed (%s): crash detection is OFF for this"
                         " worker until it succeeds; retrying in %.1fs", exc, pause)
        return pause

    def refused(self) -> None:
        """A receive said the id is unknown (reaped): stop naming it; the next reap on the
        connection, or a new one, registers again."""
        self.consumer = None
