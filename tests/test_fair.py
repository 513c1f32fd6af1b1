"""Fair queues: on a standard queue the group names a tenant, and a receive serves tenants with
few messages in flight before one holding a large share. Asserted on delivery order from the
history, never on wall time."""

from __future__ import annotations

import threading

import psycopg
import pytest

from queue_pg import Client

NOISY = 600  # one tenant sends 100x each of the others
QUIET = 6
PER_QUIET = 6


def run_tenants(clean: str, fair: bool) -> list[int]:
    """Positions (0-based, in order of first delivery) of the quiet tenants' messages."""
    with Client(clean, min_size=3, max_size=3, sweep_interval=None) as client:
        client.create_queue("t", fair=fair)
        client.send_batch("t", [{"n": i} for i in range(NOISY)], group="noisy")
        quiet = [mid for q in range(QUIET)
                 for mid in client.send_batch("t", [{"q": q, "i": i} for i in range(PER_QUIET)],
                                              group=f"quiet-{q}")]
        errors: list[BaseException] = []

        def consume() -> None:
            try:
                while got := client.receive("t", 5):
                    client.delete_batch("t", [m.receipt for m in got if m.receipt])
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=consume) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
    with psycopg.connect(clean) as conn:
        order = [mid for (mid,) in conn.execute(
            "SELECT message_id FROM queue_pg.message_history WHERE queue = 't'"
            " ORDER BY first_received_at, message_id").fetchall()]
    assert len(order) == NOISY + QUIET * PER_QUIET
    where = {mid: pos for pos, mid in enumerate(order)}
    return sorted(where[mid] for mid in quiet)


def test_a_noisy_tenant_does_not_starve_the_others(clean: str) -> None:
    positions = run_tenants(clean, fair=True)
    # every quiet message went out among the first deliveries: each receive of 5 serves the
    # tenants by their count in flight, so the noisy one gets at most its share meanwhile
    assert positions[-1] < 3 * QUIET * PER_QUIET, positions


def test_without_fair_the_quiet_tenants_wait_behind_the_noisy_one(clean: str) -> None:
    positions = run_tenants(clean, fair=False)
    assert positions[0] >= NOISY - 20, positions  # the contrast the setting makes


def test_fair_can_be_switched_and_ungrouped_messages_still_flow(client: Client) -> None:
    client.create_queue("t")
    client.send_batch("t", [1, 2])
    client.alter_queue("t", fair=True)
    client.send_batch("t", [3, 4], group="a")
    got = client.receive("t", 10)
    assert sorted(m.body for m in got) == [1, 2, 3, 4]
    assert client.get_queue("t").fair


@pytest.mark.parametrize("max_messages", [1, 3])
def test_fair_batches_mix_tenants_by_their_share(client: Client, max_messages: int) -> None:
    client.create_queue("t", fair=True)
    client.send_batch("t", list(range(10)), group="big")
    client.send_batch("t", [100, 101], group="small")
    first = sorted(m.body for m in client.receive("t", max_messages))
    # big's first, then small's first (both have none out), then big's second (older than
    # small's second); a batch's order among itself is not promised
    assert first == sorted([0, 100, 1][:max_messages])
