"""FIFO queues: groups in send order, never held by two consumers at once, several messages of
a group in one receive.

Functional rules here; many consumers at once in tests/test_fifo_concurrency.py, fair queues in
tests/test_fair.py.
"""

from __future__ import annotations

import time

import psycopg
import pytest

from queue_pg import Client, GroupRequired, InvalidParameter


def bodies(msgs: list) -> list:  # type: ignore[type-arg]
    return [m.body for m in msgs]


def test_a_receive_takes_a_groups_messages_together_in_send_order(client: Client) -> None:
    client.create_queue("f", fifo=True)
    for i in range(3):
        client.send("f", {"g": "a", "i": i}, group="a")
    client.send_batch("f", [{"g": "b", "i": i} for i in range(3)], group="b")
    first = client.receive("f", 10)  # the group ready longest first, each in send order
    assert bodies(first) == [{"g": g, "i": i} for g in "ab" for i in range(3)]
    assert client.receive("f", 10) == []  # both groups have messages out
    for m in first:
        client.delete("f", m.receipt)
    assert client.receive("f", 10) == []


def test_a_group_out_is_held_whole_until_all_of_it_is_settled(client: Client) -> None:
    client.create_queue("f", fifo=True)
    client.send_batch("f", [f"a{i}" for i in range(5)], group="a")
    client.send("f", "b0", group="b")
    first = client.receive("f", 2)
    assert bodies(first) == ["a0", "a1"]
    assert bodies(client.receive("f", 10)) == ["b0"]  # another consumer: not a2
    client.change_visibility("f", first[0].receipt, 0)  # a0 is back, but a1 holds the group
    assert client.receive("f", 10) == []
    client.delete("f", first[1].receipt)  # settled out of order: a0 comes back first
    assert bodies(client.receive("f", 10)) == ["a0", "a2", "a3", "a4"]


def test_batches_interleave_groups_and_keep_each_groups_order(client: Client) -> None:
    client.create_queue("f", fifo=True)
    client.send_batch("f", [{"i": i} for i in range(6)], group=["x", "y", "x", "y", "x", "y"])
    seen: dict[str, list[int]] = {"x": [], "y": []}
    while True:
        got = client.receive("f", 10)
        if not got:
            break
        for m in got:
            seen["x" if m.body["i"] % 2 == 0 else "y"].append(m.body["i"])
        client.delete_batch("f", [m.receipt for m in got])
    assert seen == {"x": [0, 2, 4], "y": [1, 3, 5]}
    client.send_batch("f", [{"i": i} for i in range(6)], group=["x", "y", "x", "y", "x", "y"])
    assert [m.body["i"] for m in client.receive("f", 10)] == [0, 2, 4, 1, 3, 5]


def test_a_group_is_required_and_checked(client: Client) -> None:
    client.create_queue("f", fifo=True)
    with pytest.raises(GroupRequired, match=r"group = NULL.*FIFO"):
        client.send("f", {})
    with pytest.raises(GroupRequired, match=r"group\[1\] = NULL"):
        client.send_batch("f", [{}, {}], group=["a", None])
    with pytest.raises(InvalidParameter, match="group = '' is invalid: allowed 1 to 128"):
        client.send("f", {}, group="")
    with pytest.raises(InvalidParameter, match=r"group = 'x+'\.\.\. is invalid"):
        client.send("f", {}, group="x" * 200)
    with pytest.raises(InvalidParameter, match=r"len\(group\) = 1 is invalid"):
        client.send_batch("f", [{}, {}], group=["a"])
    with pytest.raises(InvalidParameter, match="delay = 5 is invalid: queue 'f' is a FIFO queue"):
        client.send("f", {}, group="a", delay=5)
    assert client.stats("f").visible == 0


def test_fifo_is_fixed_at_create_and_excludes_fair(client: Client) -> None:
    client.create_queue("f", fifo=True)
    client.create_queue("f", fifo=True)  # same settings: a no-op
    with pytest.raises(InvalidParameter, match="fifo = false is invalid: fifo is fixed"):
        client.alter_queue("f", fifo=False)
    with pytest.raises(InvalidParameter, match="fifo = true and fair = true"):
        client.create_queue("g", fifo=True, fair=True)
    with pytest.raises(InvalidParameter, match="fifo = true and fair = true"):
        client.alter_queue("f", fair=True)
    assert client.get_queue("f").fifo and not client.get_queue("f").fair


def test_a_lapsed_lease_unblocks_its_group_and_the_head_comes_again(client: Client) -> None:
    client.create_queue("f", fifo=True)
    client.send_batch("f", [1, 2, 3], group="g")
    got = client.receive("f", 2, visibility_timeout=1.5)  # long enough for a loaded machine
    assert bodies(got) == [1, 2]
    assert client.receive("f", 10) == []
    time.sleep(1.6)
    again = client.receive("f", 10, visibility_timeout=1.5)
    assert bodies(again) == [1, 2, 3] and [m.receive_count for m in again] == [2, 2, 1]
    client.delete("f", again[0].receipt)  # the head goes; 2 and 3 lapse: 2 heads the group
    time.sleep(1.6)
    third = client.receive("f", 10)
    assert bodies(third) == [2, 3] and [m.receive_count for m in third] == [3, 2]


def test_a_release_puts_the_head_back_first(client: Client) -> None:
    client.create_queue("f", fifo=True)
    client.send_batch("f", [1, 2], group="g")
    [m] = client.receive("f")
    client.change_visibility("f", m.receipt, 0)
    assert bodies(client.receive("f", 10)) == [1, 2]


def test_a_dead_lettered_message_stops_blocking_its_group(client: Client) -> None:
    client.create_queue("dlq")
    client.create_queue("f", fifo=True, dead_letter_queue="dlq", max_receive_count=1)
    client.send_batch("f", ["a1", "a2"], group="a")
    [m] = client.receive("f", visibility_timeout=0.2)
    time.sleep(0.3)
    # the receive after the last allowed one moves a1 to the dead-letter queue and goes on to a2
    assert bodies(client.receive("f", 10)) == ["a2"]
    assert bodies(client.receive("dlq", 10)) == ["a1"]
    assert m.body == "a1"


def test_dead_letter_call_moves_the_group_on(client: Client) -> None:
    client.create_queue("dlq", fifo=True)
    client.create_queue("f", fifo=True, dead_letter_queue="dlq", max_receive_count=5)
    client.send_batch("f", ["a1", "a2", "a3"], group="a")
    client.send("dlq", "d0", group="a")
    [m] = client.receive("f")
    client.dead_letter("f", m.receipt)
    assert bodies(client.receive("f", 10)) == ["a2", "a3"]
    # in a FIFO dead-letter queue it joins its group behind what is there
    assert bodies(client.receive("dlq", 10)) == ["d0", "a1"]


def test_delete_expiry_and_purge_move_groups_on(client: Client, conn: psycopg.Connection) -> None:
    client.create_queue("f", fifo=True)
    client.send("f", "short", group="g", ttl=0.2)
    client.send("f", "next", group="g")
    time.sleep(0.3)
    assert client.receive("f") == []  # the expired head is not delivered, and blocks until swept
    client.sweep()
    assert bodies(client.receive("f", 10)) == ["next"]
    client.send("f", "more", group="g")
    client.purge("f")
    assert conn.execute("select count(*) from queue_pg.fifo_groups").fetchone() == (0,)
    client.send("f", "fresh", group="g")
    assert bodies(client.receive("f", 10)) == ["fresh"]


def test_the_queue_delay_applies_to_each_message_from_its_send(client: Client) -> None:
    client.create_queue("f", fifo=True, delay=1.5)  # long enough for a loaded machine
    client.send_batch("f", [1, 2], group="g")
    assert client.receive("f") == []
    time.sleep(1.6)
    [m] = client.receive("f")
    client.delete("f", m.receipt)
    assert bodies(client.receive("f")) == [2]  # its delay is over too


def test_stats_count_waiting_messages_as_delayed(client: Client) -> None:
    client.create_queue("f", fifo=True)
    client.send_batch("f", [1, 2, 3], group="g")
    s = client.stats("f")
    assert (s.visible, s.delayed) == (1, 2)


def test_groups_on_a_standard_queue_change_nothing(client: Client) -> None:
    client.create_queue("s")
    client.send_batch("s", [1, 2, 3], group="g")
    client.send("s", 4, group="g", delay=0)
    assert bodies(client.receive("s", 10)) == [1, 2, 3, 4]


def test_the_cli_creates_fifo_queues_and_sends_groups(clean: str) -> None:
    from tests.test_cli import receive_json, run

    run(clean, "create", "f", "--fifo")
    refused = run(clean, "send", "f", "1", code=1)
    assert refused.stderr.splitlines()[-1].startswith("error: group = NULL is invalid")
    run(clean, "send", "f", "-", "--group", "g", input="1\n2\n")
    assert [m["body"] for m in receive_json(clean, "f", "-n", "10")] == [1, 2]


def test_moves_between_queues_go_through_fifo_moved(client: Client,
                                                    conn: psycopg.Connection) -> None:
    """The hook a mover of messages (redrive) calls: the source group moves on, and the moved
    message joins its group in a FIFO destination behind what waits there."""
    client.create_queue("a", fifo=True)
    client.create_queue("b", fifo=True)
    client.send_batch("a", ["a1", "a2"], group="g")
    client.send("b", "b1", group="g")
    conn.execute("""
        WITH m AS (
            UPDATE queue_pg.messages m SET queue_id = b.id, visible_at = now()
            FROM queue_pg.queues b WHERE b.name = 'b' AND m.body = '"a1"' RETURNING m.id
        )
        SELECT queue_pg._fifo_moved(a.id, b.id, array(SELECT id FROM m))
        FROM queue_pg.queues a, queue_pg.queues b WHERE a.name = 'a' AND b.name = 'b'""")
    assert bodies(client.receive("a", 10)) == ["a2"]
    [b1] = client.receive("b", 1)
    assert b1.body == "b1"
    client.delete("b", b1.receipt)
    assert bodies(client.receive("b", 10)) == ["a1"]


def test_dedup_ids_on_a_fifo_queue_keep_one_message_in_its_group(client: Client) -> None:
    """Deduplication (docs/dedup.md) and groups together: a duplicate returns the first's id and
    takes no place in its group; a batch's fresh messages keep their group order."""
    client.create_queue("f", fifo=True)
    first = client.send("f", "a1", group="a", dedup_id="x")
    assert client.send("f", "a1 again", group="a", dedup_id="x") == first
    ids = client.send_batch("f", ["a2", "dup", "a3", "b1"], group=["a", "a", "a", "b"],
                            dedup_ids=["y", "x", None, "z"])
    assert ids[1] == first and len(set(ids)) == 4
    seen: dict[str, list[str]] = {}
    while got := client.receive("f", 10):
        for m in got:
            seen.setdefault(m.body[0], []).append(m.body)
        client.delete_batch("f", [m.receipt for m in got])
    assert seen == {"a": ["a1", "a2", "a3"], "b": ["b1"]}


def test_redrive_out_of_and_into_fifo_queues_keeps_groups_in_order(client: Client) -> None:
    """redrive() and redrive tasks move messages through _fifo_moved: the FIFO dead-letter
    queue's groups move on, and the messages rejoin their groups in the FIFO source in order."""
    client.create_queue("dlq", fifo=True)
    client.create_queue("f", fifo=True, dead_letter_queue="dlq", max_receive_count=5)
    client.send_batch("f", ["a1", "a2", "a3"], group="a")
    for expected in ("a1", "a2"):
        [m] = client.receive("f")
        assert m.body == expected
        client.dead_letter("f", m.receipt)
    # a3 is in f; a1 then a2 wait in the dead-letter queue's group "a"
    assert client.redrive("dlq") == 1  # only the group's head is visible to move
    assert client.redrive("dlq") == 1
    assert bodies(client.receive("f", 10)) == ["a3", "a1", "a2"]


def test_message_groups_answers_by_receipt_of_this_queue_only(client: Client) -> None:
    """The look-up the SQS endpoint's MessageGroupId uses: a receipt of another queue, or a
    forged one, matches nothing."""
    client.create_queue("f", fifo=True)
    client.create_queue("plain")
    client.send_batch("f", ["a1", "b1"], group=["a", "b"])
    client.send("plain", "p", group="t")
    got = client.receive("f", 10)
    [p] = client.receive("plain")
    receipts = [m.receipt for m in got if m.receipt]
    groups = client.message_groups("f", [*receipts, p.receipt or "", "1.2.3.4"])
    assert groups == {m.receipt: m.body[0] for m in got}
    assert client.message_groups("plain", [p.receipt or ""]) == {p.receipt: "t"}
    assert client.message_groups("f", []) == {}
