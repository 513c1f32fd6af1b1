"""Chains, groups and chords (Celery's canvas, small): ``chain(a.s(1), b.s())``,
``group(a.s(1), a.s(2))``, ``chord(group(...), callback.s())``.

No worker holds their state. A chain's later steps travel in its first message's envelope
(``then``: ``[{"queue", "task", "args", "kwargs"}, ...]``); a chord is recorded in SQL
(``queue_pg.send_chord``: the callback, the members by message, a count of those pending).
When a job of either succeeds, the worker settles it with ``queue_pg.complete_step``: the
delete of its message, the next step's send (with the result appended to its arguments) or,
for a chord's last member, the callback's send (with the list of results), in one transaction.
So a step runs exactly when the previous one is settled as succeeded; a step that fails for
good is dead-lettered with its chain still in its body (the reason says which steps did not
run), and redriving it goes on from there. Everything is enqueued in the caller's transaction,
as :meth:`queue_pg.Task.enqueue` is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from queue_pg.jobs.tasks import Signature, TaskResult

if TYPE_CHECKING:
    import psycopg

    from queue_pg._sqla import SessionLike
    from queue_pg.client import Client

__all__ = ["CHORD_KEY", "THEN_KEY", "ChordResult", "GroupResult", "Signature", "chain", "chord",
           "group", "steps_left"]

#: Envelope key of a chain's steps still to run.
THEN_KEY = "then"
#: Envelope key of a chord member: its chord's id (the worker settles it with complete_step).
CHORD_KEY = "chord"


def _signatures(items: tuple[Any, ...], what: str) -> list[Signature]:
    if len(items) == 1 and not isinstance(items[0], Signature) and isinstance(items[0], Iterable):
        items = tuple(items[0])
    out = [s for s in items]
    for s in out:
        if not isinstance(s, Signature):
            raise TypeError(f"{what} takes signatures (task.s(...)), not {s!r}")
    if not out:
        raise ValueError(f"{what} needs at least one signature")
    return out


class chain:  # Celery's spelling
    """``chain(a.s(1), b.s(), c.s())`` (or ``chain(a.s(1)) | b.s() | c.s()``): a, then b with a's
    result appended to its arguments once a succeeded, then c with b's. A step that fails for
    good stops the chain there: it is dead-lettered with the steps not run in its reason
    (and in its body: redrive it to go on). Enqueues only the first step; :meth:`apply_async`
    returns its :class:`TaskResult`."""

    steps: list[Signature]

    def __init__(self, *steps: Signature | chain | Iterable[Signature]) -> None:
        flat: list[Any] = []
        for s in steps:
            flat.extend(s.steps if isinstance(s, chain) else [s])
        self.steps = _signatures(tuple(flat), "chain")
        for s in self.steps[1:]:
            s.check_takes_one_more("a chain's later step")

    def __or__(self, other: Signature | chain) -> chain:
        return chain(self, other)

    def __repr__(self) -> str:
        return " | ".join(map(repr, self.steps))

    def apply_async(
        self, *, conn: psycopg.Connection[Any] | None = None, session: SessionLike | None = None,
        client: Client | None = None,
    ) -> TaskResult:
        first, rest = self.steps[0], self.steps[1:]
        extra = {THEN_KEY: [s.step() for s in rest]} if rest else None
        return first.task.send(first.args, first.kwargs, conn=conn, session=session,
                               client=client, extra=extra)

    def delay(self) -> TaskResult:
        return self.apply_async()


class GroupResult(list[TaskResult]):
    """The members' message ids (TaskResults), in the group's order."""

    def get(self, timeout: float | None = None, *, client: Client | None = None) -> list[Any]:
        """Each member's result (their tasks need ``store_result``), in order."""
        return [r.get(timeout, client=client) for r in self]


class group:  # Celery's spelling
    """``group(a.s(1), a.s(2))``: jobs that run in parallel, enqueued together (in the caller's
    transaction with ``conn`` / ``session``, else in one transaction of their own)."""

    def __init__(self, *members: Signature | Iterable[Signature]) -> None:
        self.members = _signatures(members, "group")

    def __repr__(self) -> str:
        return f"group({', '.join(map(repr, self.members))})"

    def apply_async(
        self, *, conn: psycopg.Connection[Any] | None = None, session: SessionLike | None = None,
        client: Client | None = None,
    ) -> GroupResult:
        first = self.members[0].task
        on = first.joined(conn, session, client)
        if on is not None:
            return GroupResult(s.task.send(s.args, s.kwargs, conn=on, client=client)
                               for s in self.members)
        c = client or first.registry.default_client()
        with c._borrow() as own, own.transaction():
            return GroupResult(s.task.send(s.args, s.kwargs, conn=own, client=c)
                               for s in self.members)

    def delay(self) -> GroupResult:
        return self.apply_async()


class ChordResult(GroupResult):
    """The members' message ids, and the chord's id (``queue_pg.chords``)."""

    chord_id: int


class chord:  # Celery's spelling
    """``chord(group(a.s(1), a.s(2)), total.s())``: the group's jobs, then ``total`` once with
    the list of their results (in the group's order) appended to its arguments, when the last of
    them succeeded. Recorded in SQL: the last member to finish sends the callback, in the
    transaction that deletes its message, exactly once however many workers finish together. A
    member that fails for good holds the callback (it waits in the dead-letter queue: redrive
    it and the chord completes)."""

    def __init__(self, header: group | Iterable[Signature], body: Signature) -> None:
        self.header = header if isinstance(header, group) else group(*header)
        if not isinstance(body, Signature):
            raise TypeError(f"a chord's callback is a signature (task.s(...)), not {body!r}")
        body.check_takes_one_more("a chord's callback")
        self.body = body

    def __repr__(self) -> str:
        return f"chord({self.header!r}, {self.body!r})"

    def apply_async(
        self, *, conn: psycopg.Connection[Any] | None = None, session: SessionLike | None = None,
        client: Client | None = None,
    ) -> ChordResult:
        from queue_pg import _ops
        from queue_pg.client import execute
        from queue_pg.errors import translating

        members = [{"queue": s.task.queue, "body": s.task.envelope(s.args, s.kwargs),
                    "attributes": {"type": s.task.name}} for s in self.header.members]
        callback = {"task": self.body.task.name, "args": self.body.args,
                    "kwargs": self.body.kwargs}
        call = _ops.send_chord(members, self.body.task.queue, callback)
        on = self.body.task.joined(conn, session, client)
        if on is not None:
            with translating():
                chord_id, ids = execute(on, call)
        else:
            c = client or self.body.task.registry.default_client()
            chord_id, ids = c.send_chord(members, self.body.task.queue, callback)
        out = ChordResult(TaskResult(i, s.task, client)
                          for i, s in zip(ids, self.header.members, strict=True))
        out.chord_id = chord_id
        return out

    def delay(self) -> ChordResult:
        return self.apply_async()


def steps_left(body: Any) -> list[str]:
    """The names of a chain's steps still to run, from a job's envelope (none: [])."""
    if not isinstance(body, dict) or not isinstance(body.get(THEN_KEY), list):
        return []
    return [str(s.get("task")) for s in body[THEN_KEY] if isinstance(s, dict)]
