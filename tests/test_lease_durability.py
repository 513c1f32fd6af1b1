"""Relaxed lease durability (revision 0022): a receive of a relaxed queue that owns its
transaction commits without waiting for the WAL flush, and its receipts carry a lease token
that a crash-lost lease or a restart cannot repeat (sql/api/00_util.sql)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from queue_pg import Client
from queue_pg.errors import InvalidParameter, StaleReceipt

PROBE = """
CREATE FUNCTION pg_temp.probe(queue text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM * FROM queue_pg.receive(queue);
    RETURN current_setting('synchronous_commit');
END $$
"""


def test_the_setting_is_checked_and_shown(client: Client) -> None:
    with pytest.raises(InvalidParameter, match="lease_durability"):
        client.create_queue("q", lease_durability="fast")
    assert client.create_queue("q").lease_durability == "durable"
    assert client.alter_queue("q", lease_durability="relaxed").lease_durability == "relaxed"
    with pytest.raises(InvalidParameter, match="lease_durability = 'never'"):
        client.alter_queue("q", lease_durability="never")
    assert client.get_queue("q").lease_durability == "relaxed"  # a bad value changed nothing


def test_a_relaxed_receive_skips_the_flush_only_in_its_own_transaction(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    client.create_queue("relaxed", lease_durability="relaxed")
    client.create_queue("durable")
    for q in ("relaxed", "durable"):
        client.send_batch(q, [1, 2, 3])
    conn.execute(PROBE)
    # autocommit: the receive's statement is its transaction
    assert conn.execute("SELECT pg_temp.probe('relaxed')").fetchone() == ("off",)
    assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)  # ended with it
    assert conn.execute("SELECT pg_temp.probe('durable')").fetchone() == ("on",)
    # a caller's transaction keeps its durability
    with conn.transaction():
        conn.execute("SELECT 1")
        assert conn.execute("SELECT pg_temp.probe('relaxed')").fetchone() == ("on",)


def test_relaxed_receipts_settle_and_a_stale_token_is_refused(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    client.create_queue("relaxed", lease_durability="relaxed", visibility_timeout=30)
    client.send_batch("relaxed", [1, 2, 3, 4])
    a, b, c, d = client.receive("relaxed", 4)
    assert a.receipt is not None and len(a.receipt.split(".")) == 5
    client.change_visibility("relaxed", b.receipt or "", 60)
    assert client.delete("relaxed", a.receipt) is True
    assert [r.deleted for r in client.delete_batch("relaxed", [b.receipt or ""])] == [True]
    # a lease a crash undid: the row is back at its previous lease, and the next receive grants
    # the same lease number again with another token; the old receipt must not pass
    conn.execute("UPDATE queue_pg.messages SET lease_no = lease_no - 1, visible_at = now()"
                 " WHERE id = %s", (c.id,))
    again = client.receive("relaxed", 1)[0]
    assert again.id == c.id and again.receipt != c.receipt
    assert again.receipt is not None and again.receipt.split(".")[2] == (c.receipt or "").split(".")[2]
    with pytest.raises(StaleReceipt):
        client.delete("relaxed", c.receipt or "")
    assert [(r.deleted, r.error) for r in client.delete_batch("relaxed", [c.receipt or ""])] == [
        (False, "StaleReceipt")]
    assert client.delete("relaxed", again.receipt) is True
    # a receipt altered to another token is forged: the MAC covers the token
    parts = (d.receipt or "").split(".")
    parts[3] = "0" * 12
    assert [r.error for r in client.delete_batch("relaxed", [".".join(parts)])] == ["InvalidReceipt"]
    # a durable queue's receipts are as before
    client.create_queue("durable")
    client.send("durable", 1)
    m = client.receive("durable")[0]
    assert m.receipt is not None and len(m.receipt.split(".")) == 4
    assert client.delete("durable", m.receipt) is True
