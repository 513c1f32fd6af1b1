"""Model-based test: a Hypothesis state machine drives the queue and a small pure-Python model of
its semantics side by side, and after every step checks that every message, history row and
statistic agrees.

Time is the model's: before every step the session setting ``queue_pg.time_offset`` puts the
server's ``queue_pg.now()`` at ``base + T``, T the model's clock. T moves by multiples of 10 s
when time passes and by a 30 ms tick each step (so two steps never share a moment); every
duration ends on 5 s modulo 10 (5, 15, 35, 45, 105, 405) and max_lease on 2.5, so with at most
1.5 s of ticks no lease, delay, expiry or cap ends within 0.7 s of a moment the machine looks at:
the milliseconds real time adds within a step cannot change an outcome. Messages whose
visibility times are within 0.3 s in the model may come back in either order.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import hypothesis.strategies as st
import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from queue_pg import (
    Client,
    InvalidParameter,
    LeaseLimitExceeded,
    MessageNotFound,
    StaleReceipt,
)
from tests.conftest import RESET_SQL

MAIN, DLQ = "mq", "mq-dlq"
VT = 35.0  # the queue's visibility_timeout
TTL = 405.0  # the queue's message_ttl
MAX_LEASE = 62.5
MAX_RECEIVES = 2
HALF = 1.0  # tolerance when comparing the server's times with the model's
SEEN: Counter[str] = Counter()  # which branches the run took, printed at the end


def event(what: str) -> None:
    SEEN[what] += 1


TICK = 0.03  # model seconds each step takes
STEPS = 50  # at most STEPS * TICK = 1.5 s of ticks per example, less than any margin below
TIES = 0.3  # visibility times this close may come back in either order

durations = st.sampled_from([5.0, 15.0, 45.0, 105.0])
leases = st.sampled_from([5.0, 15.0, 45.0, 45.0, 45.0, 105.0])  # 105 is past max_lease
# NUL and lone surrogates are refused by jsonb: tests/test_hostile.py feeds those
texts = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
                max_size=3)
bodies = st.one_of(st.integers(-5, 5), texts, st.lists(st.booleans(), max_size=2),
                   st.none(), st.dictionaries(st.sampled_from("ab"), st.integers(0, 3), max_size=2))


@dataclass
class M:
    """The model's view of one message."""

    id: int
    queue: str
    body: Any
    attributes: dict[str, Any] | None
    visible_at: float
    expires_at: float
    receive_count: int = 0
    lease_no: int = 0
    lease_expiries: int = 0
    released: bool = False
    last_received_at: float | None = None


@dataclass
class Model:
    now: float = 0.0
    messages: dict[int, M] = field(default_factory=dict)
    history: Counter[tuple[int, str]] = field(default_factory=Counter)
    stale: int = 0
    expiries: int = 0  # the queue's lease_expiries statistic

    def live(self, m: M) -> bool:
        return m.expires_at > self.now

    def visible(self, queue: str) -> list[M]:
        return sorted((m for m in self.messages.values()
                       if m.queue == queue and m.visible_at <= self.now and self.live(m)),
                      key=lambda m: m.visible_at)

    def holder(self, mid: int, lease_no: int) -> tuple[M | None, str]:
        """The message a receipt designates in MAIN, or why not: gone / stale."""
        m = self.messages.get(mid)
        if m is None or m.queue != MAIN:
            return None, "gone"
        if m.lease_no > lease_no:
            return None, "stale"
        if not self.live(m):
            return None, "gone"
        return m, "ok"

    def dead_letter(self, m: M, reason: str | None) -> None:
        m.lease_expiries += int(m.visible_at <= self.now and not m.released)
        m.queue, m.visible_at, m.lease_no, m.released = DLQ, self.now, m.lease_no + 1, False
        if reason is not None:
            m.attributes = {**(m.attributes or {}), "dead_letter_reason": reason}
        self.history[(m.id, "dead_lettered")] += 1


def valid_prefix(chosen: list[M], candidates: list[M]) -> bool:
    """``chosen`` are the first of ``candidates`` by visible_at, ties in any order."""
    if not chosen:
        return True
    last = max(m.visible_at for m in chosen)
    ids = {m.id for m in chosen}
    return all(m.visible_at >= last - TIES for m in candidates if m.id not in ids)


class QueueMachine(RuleBasedStateMachine):
    dsn: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.conn.execute(RESET_SQL)
        self.client = Client(self.dsn, min_size=1, max_size=1, sweep_interval=None)
        self.model = Model()
        self.receipts: list[tuple[int, int, str]] = []  # (id, lease_no, receipt) ever handed out
        row = self.conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        self.base: datetime = row[0]
        self._set_clock()

    def teardown(self) -> None:
        self.client.close()
        self.conn.close()

    def _set_clock(self) -> None:
        self.conn.execute(
            "SELECT set_config('queue_pg.time_offset', ((%s::timestamptz + make_interval(secs =>"
            " %s)) - clock_timestamp())::text, false)", [self.base, self.model.now])

    def _tick(self) -> None:
        self.model.now = round(self.model.now + TICK, 6)
        self._set_clock()

    def _t(self, at: datetime | None) -> float | None:
        return None if at is None else (at - self.base).total_seconds()

    def _stale(self) -> list[tuple[int, int, str]]:
        """Receipts the model knows are stale: their message was received again since."""
        return [p for p in self.receipts if (m := self.model.messages.get(p[0])) is not None
                and m.queue == MAIN and m.lease_no > p[1]]

    def _receipt(self) -> st.SearchStrategy[tuple[int, int, str]]:
        """A receipt handed out before: one of the latest (likely still current), any, or one
        the model knows is stale (its message was received again since)."""
        stale = self._stale()
        options = [st.sampled_from(self.receipts[-3:]), st.sampled_from(self.receipts)]
        return st.one_of(*options, *([st.sampled_from(stale)] if stale else []))

    def _keep(self, mid: int, receipt: str) -> None:
        self.receipts.append((mid, int(receipt.split(".")[2]), receipt))

    @initialize()
    def queues(self) -> None:
        c = self.client
        c.create_queue(DLQ, conn=self.conn)
        c.create_queue(MAIN, visibility_timeout=VT, message_ttl=TTL, max_lease=MAX_LEASE,
                       dead_letter_queue=DLQ, max_receive_count=MAX_RECEIVES, conn=self.conn)

    # --- operations ------------------------------------------------------------------------

    @rule(body=bodies, delay=st.none() | st.just(0.0) | durations,
          ttl=st.none() | durations, attrs=st.none() | st.just({"type": "t"}))
    def send(self, body: Any, delay: float | None, ttl: float | None,
             attrs: dict[str, Any] | None) -> None:
        self._tick()
        if (delay or 0.0) >= (ttl if ttl is not None else TTL):  # would expire unseen: refused
            event("send refused: delay >= ttl")
            with pytest.raises(InvalidParameter, match="delay"):
                self.client.send(MAIN, body, delay=delay, ttl=ttl, attributes=attrs, conn=self.conn)
            return
        mid = self.client.send(MAIN, body, delay=delay, ttl=ttl, attributes=attrs, conn=self.conn)
        now = self.model.now
        assert mid not in self.model.messages
        self.model.messages[mid] = M(mid, MAIN, body, attrs, now + (delay or 0.0),
                                     now + (ttl if ttl is not None else TTL))

    @rule(n=st.integers(1, 3), vt=st.none() | leases)
    def receive(self, n: int, vt: float | None) -> None:
        self._tick()
        self._receive(n, vt)

    def _receive(self, n: int, vt: float | None) -> None:
        model = self.model
        if vt is not None and vt > MAX_LEASE:
            event("receive past max_lease")
            with pytest.raises(InvalidParameter):
                self.client.receive(MAIN, n, visibility_timeout=vt, conn=self.conn)
            return
        candidates = model.visible(MAIN)
        before_dlq = {m.id for m in model.messages.values() if m.queue == DLQ}
        got = self.client.receive(MAIN, n, visibility_timeout=vt, conn=self.conn)
        row = self.conn.execute(
            "SELECT coalesce(array_agg(m.id), '{}') FROM queue_pg.messages m"
            " JOIN queue_pg.queues q ON q.id = m.queue_id WHERE q.name = %s", [DLQ]).fetchone()
        assert row is not None
        moved_ids = set(row[0]) - before_dlq
        by_id = {m.id: m for m in candidates}
        returned = [by_id.get(g.id) for g in got]
        assert all(r is not None for r in returned), "received a message that was not visible"
        moved = [by_id[i] for i in moved_ids if i in by_id]
        assert len(moved) == len(moved_ids), "dead-lettered a message that was not visible"
        assert len(got) <= n
        assert all(m.receive_count >= MAX_RECEIVES for m in moved)
        assert all(m is not None and m.receive_count < MAX_RECEIVES for m in returned)
        picked = [m for m in returned if m is not None] + moved
        assert valid_prefix(picked, candidates), (picked, candidates)
        if not got:  # nothing to hand out, or only messages to move (4 attempts at most)
            assert len(moved) in (len(candidates), 4 * n), (moved, candidates)
        for m in picked:
            model.expiries += int(m.receive_count > 0 and not m.released)
        for m in moved:
            event("receive dead-lettered a message")
            model.dead_letter(m, None)
        lease = vt if vt is not None else VT
        for g in sorted(got, key=lambda g: g.id):  # ties come back in either order
            m = by_id[g.id]
            m.lease_expiries += int(m.receive_count > 0 and not m.released)
            m.receive_count += 1
            m.lease_no += 1
            m.released = False
            m.last_received_at = model.now
            m.visible_at = model.now + lease
            assert g.receive_count == m.receive_count and g.body == m.body
            assert g.receipt is not None
            self._keep(g.id, g.receipt)

    @rule(n=st.integers(1, 2))
    def receive_again(self, n: int) -> None:
        """A second receive rule: receiving is what most steps of a consumer do."""
        self._tick()
        self._receive(n, None)

    @rule(n=st.integers(1, 3))
    def receive_and_crash(self, n: int) -> None:
        """A consumer that dies after its receive: 10 s later its 5 s leases have lapsed."""
        self._tick()
        self._receive(n, 5.0)
        self.model.now += 10
        self._set_clock()

    def _settle(self, pick: tuple[int, int, str]) -> tuple[M | None, str]:
        mid, lease_no, _ = pick
        m, why = self.model.holder(mid, lease_no)
        event(f"receipt: {why}")
        return m, why

    @precondition(lambda self: self.receipts)
    @rule(data=st.data())
    def delete(self, data: st.DataObject, among: list[tuple[int, int, str]] | None = None) -> None:
        self._tick()
        pick = data.draw(st.sampled_from(among) if among else self._receipt())
        m, why = self._settle(pick)
        event(f"delete: {why}")
        if why == "stale":
            with pytest.raises(StaleReceipt):
                self.client.delete(MAIN, pick[2], conn=self.conn)
            self.model.stale += 1
            return
        assert self.client.delete(MAIN, pick[2], conn=self.conn) is (m is not None)
        if m is not None:
            del self.model.messages[m.id]
            self.model.history[(m.id, "deleted")] += 1

    @precondition(lambda self: self._stale())
    @rule(data=st.data())
    def delete_with_a_stale_receipt(self, data: st.DataObject) -> None:
        """A consumer whose lease lapsed and whose message went to another tries to delete it."""
        self.delete(data, self._stale())

    @precondition(lambda self: self.receipts)
    @rule(data=st.data(), batch=st.integers(1, 3))
    def delete_batch(self, data: st.DataObject, batch: int) -> None:
        self._tick()
        picks = data.draw(st.lists(self._receipt(), min_size=1, max_size=batch,
                                   unique_by=lambda p: p[2]))
        results = self.client.delete_batch(MAIN, [p[2] for p in picks], conn=self.conn)
        # the engine deletes first, then diagnoses the rest: a stale twin of a deleted
        # message's receipt is stale; all decided on the state before the call
        verdicts = [self._settle(p) for p in picks]
        deleted = {m.id for m, _ in verdicts if m is not None}
        for p, (m, why), r in zip(picks, verdicts, results, strict=True):
            assert r.receipt == p[2]
            if why == "stale" and p[0] in deleted:  # its message is gone by the diagnosis
                assert (r.deleted, r.error) == (False, None), (p, r)
            elif why == "stale":
                assert (r.deleted, r.error) == (False, "StaleReceipt"), (p, r)
                self.model.stale += 1
            elif m is None:
                assert (r.deleted, r.error) == (False, None), (p, r)
            else:
                assert (r.deleted, r.error) == (True, None), (p, r)
        for m, _ in verdicts:
            if m is not None and m.id in self.model.messages:
                del self.model.messages[m.id]
                self.model.history[(m.id, "deleted")] += 1

    def _relet(self, m: M | None, why: str, timeout: float | None, call: Any) -> Any:
        model = self.model
        if why == "stale":
            with pytest.raises(StaleReceipt):
                call()
            model.stale += 1
            return None
        if m is None:
            with pytest.raises(MessageNotFound):
                call()
            return None
        assert m.last_received_at is not None
        if model.now + (timeout or 0.0) > m.last_received_at + MAX_LEASE:
            event("lease limit")
            with pytest.raises(LeaseLimitExceeded):
                call()
            return None
        result = call()
        if timeout is not None:
            m.visible_at = model.now + timeout
            m.released = timeout == 0
        return result

    @precondition(lambda self: self.receipts)
    @rule(data=st.data(), timeout=st.sampled_from([0.0, 5.0, 15.0, 45.0, 105.0, 105.0]))
    def change_visibility(self, data: st.DataObject, timeout: float) -> None:
        self._tick()
        pick = data.draw(self._receipt())
        m, why = self._settle(pick)
        until = self._relet(m, why, timeout, lambda: self.client.change_visibility(
            MAIN, pick[2], timeout, conn=self.conn))
        if until is not None:
            assert abs(self._t(until) - (self.model.now + timeout)) < HALF  # type: ignore[operator]

    @precondition(lambda self: self.receipts)
    @rule()
    def heartbeat_past_max_lease(self) -> None:
        """The latest receipt asks for more than max_lease allows (LeaseLimitExceeded)."""
        self._tick()
        pick = self.receipts[-1]
        m, why = self._settle(pick)
        self._relet(m, why, 105.0, lambda: self.client.change_visibility(
            MAIN, pick[2], 105.0, conn=self.conn))

    @precondition(lambda self: self.receipts)
    @rule(data=st.data(), body=st.none() | bodies, vt=st.none() | st.just(0.0) | durations,
          attrs=st.none() | st.just({"k": 1}))
    def update(self, data: st.DataObject, body: Any, vt: float | None,
               attrs: dict[str, Any] | None) -> None:
        self._tick()
        pick = data.draw(self._receipt())
        m, why = self._settle(pick)
        got = self._relet(m, why, vt, lambda: self.client.update(
            MAIN, pick[2], body=body, visibility_timeout=vt, attributes=attrs, conn=self.conn))
        if got is not None and m is not None:
            if body is not None:
                m.body = body
            if attrs is not None:
                m.attributes = {**(m.attributes or {}), **attrs}
            assert got.body == m.body and got.attributes == m.attributes

    @precondition(lambda self: self.receipts)
    @rule(data=st.data(), reason=st.none() | st.just("bad"))
    def dead_letter(self, data: st.DataObject, reason: str | None) -> None:
        self._tick()
        pick = data.draw(self._receipt())
        m, why = self._settle(pick)
        if why == "stale":
            with pytest.raises(StaleReceipt):
                self.client.dead_letter(MAIN, pick[2], reason, conn=self.conn)
            self.model.stale += 1
            return
        assert self.client.dead_letter(MAIN, pick[2], reason, conn=self.conn) is (m is not None)
        if m is not None:
            self.model.dead_letter(m, reason)

    @rule(n=st.integers(1, 4))
    def peek(self, n: int) -> None:
        self._tick()
        got = self.client.peek(MAIN, n, conn=self.conn)
        candidates = self.model.visible(MAIN)
        assert len(got) == min(n, len(candidates))
        by_id = {m.id: m for m in candidates}
        assert all(g.id in by_id and g.receipt is None for g in got)
        assert valid_prefix([by_id[g.id] for g in got], candidates)

    @rule(sweep=st.sampled_from([True, True, True, False]))
    def purge_or_sweep(self, sweep: bool) -> None:
        if sweep:
            self.sweep()
        else:
            self.purge()

    def purge(self) -> None:
        self._tick()
        gone = [m for m in self.model.messages.values() if m.queue == MAIN]
        assert self.client.purge(MAIN, conn=self.conn) == len(gone)
        for m in gone:
            del self.model.messages[m.id]
            self.model.history[(m.id, "purged")] += 1

    def sweep(self) -> None:
        self._tick()
        expired = [m for m in self.model.messages.values() if not self.model.live(m)]
        event(f"sweep found expired: {bool(expired)}")
        assert self.client.sweep(conn=self.conn) == len(expired)
        for m in expired:
            del self.model.messages[m.id]
            self.model.history[(m.id, "expired")] += 1

    @rule(seconds=st.sampled_from([10, 20, 60, 150, 400]))
    def time_passes(self, seconds: int) -> None:
        self._tick()
        self.model.now += seconds
        self._set_clock()

    # --- agreement -------------------------------------------------------------------------

    @invariant()
    def agree(self) -> None:
        if not hasattr(self, "model"):
            return
        rows = self.conn.execute(
            "SELECT m.id, q.name, m.body, m.attributes, m.visible_at, m.expires_at,"
            " m.receive_count, m.lease_no, m.lease_expiries, m.released, m.last_received_at"
            " FROM queue_pg.messages m JOIN queue_pg.queues q ON q.id = m.queue_id").fetchall()
        engine = {r[0]: r for r in rows}
        model = self.model
        assert set(engine) == set(model.messages)
        for mid, r in engine.items():
            m = model.messages[mid]
            assert (r[1], r[2], r[3]) == (m.queue, m.body, m.attributes), (r, m)
            assert (r[6], r[7], r[8], r[9]) == (m.receive_count, m.lease_no, m.lease_expiries,
                                                m.released), (r, m)
            assert abs(self._t(r[4]) - m.visible_at) < HALF, (r, m)  # type: ignore[operator]
            assert abs(self._t(r[5]) - m.expires_at) < HALF, (r, m)  # type: ignore[operator]
            last = self._t(r[10])
            assert (last is None) == (m.last_received_at is None)
            assert last is None or abs(last - m.last_received_at) < HALF  # type: ignore[operator]
        history = Counter((r[0], r[1]) for r in self.conn.execute(
            "SELECT message_id, outcome FROM queue_pg.message_history"))
        assert history == model.history
        s = self.client.stats(MAIN, conn=self.conn)
        mine = [m for m in model.messages.values() if m.queue == MAIN and model.live(m)]
        visible = sum(m.visible_at <= model.now for m in mine)
        in_flight = sum(m.visible_at > model.now and m.last_received_at is not None for m in mine)
        delayed = sum(m.visible_at > model.now and m.last_received_at is None for m in mine)
        dead = sum(m.queue == DLQ for m in model.messages.values())
        assert (s.visible, s.in_flight, s.delayed, s.dead_lettered) == (visible, in_flight,
                                                                          delayed, dead)
        assert (s.stale_receipts, s.lease_expiries) == (model.stale, model.expiries)


@pytest.mark.slow
@pytest.mark.timeout(600)  # a failure shrinks for a while
def test_engine_agrees_with_the_model(dsn: str) -> None:
    # a database of its own would be cleaner, but the run's is reset per example (RESET_SQL)
    QueueMachine.dsn = dsn
    try:
        _run_machine()
    finally:  # leave the run's database as the clean fixture would
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(RESET_SQL)


def _run_machine() -> None:
    run_state_machine_as_test(
        QueueMachine,
        # the same examples every run (CI); QUEUE_PG_MODEL_RANDOM=1 explores new ones
        settings=settings(max_examples=80, stateful_step_count=STEPS, deadline=None,
                          derandomize=not os.environ.get("QUEUE_PG_MODEL_RANDOM"),
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.filter_too_much]),
    )
    print(f"\n[model] branches taken: {dict(sorted(SEEN.items()))}")
    # the run reached the interesting corners of the semantics
    for what in ("receipt: stale", "receipt: gone", "lease limit", "sweep found expired: True",
                 "receive dead-lettered a message", "delete: stale", "delete: ok"):
        assert SEEN[what] > 0, (what, SEEN)


def test_time_offset_moves_only_its_own_sessions_clock(dsn: str) -> None:
    """The hook the model needs cannot move another session's clock."""
    with psycopg.connect(dsn, autocommit=True) as a, psycopg.connect(dsn, autocommit=True) as b:
        a.execute("SET queue_pg.time_offset = '10 days'")
        row = a.execute("SELECT queue_pg.now() - clock_timestamp()").fetchone()
        other = b.execute("SELECT queue_pg.now() - clock_timestamp()").fetchone()
        assert row is not None and other is not None
        assert row[0].days == 9 or row[0].days == 10  # 10 days less a few microseconds
        assert abs(other[0].total_seconds()) < 1
