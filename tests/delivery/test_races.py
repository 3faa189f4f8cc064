"""Racing claimers and the read/write race of a claim, on both backends."""

from __future__ import annotations

import threading
from collections import Counter

from delivery_service.records import NewObligation
from switchboard.delivery.v1 import delivery_service_pb2 as pb
from tests.delivery.conftest import StartDelivery
from tests.harness import Gateway, InProcessDelivery, get

ORPHANS = 5000
CLAIMERS = 4


def _seed_orphans(delivery: InProcessDelivery, count: int) -> set[str]:
    """Writes `count` rows owned by an instance that then dies (through the real store)."""
    crashed = Gateway(delivery.stub)
    store, backend = delivery.unit.store, delivery.unit.store.backend
    ids = set()
    with backend.database.connection_context(), backend.write_transaction():
        now = backend.now()
        for i in range(count):
            new = NewObligation(
                session_key=f"agent:main:slack:dm:U{i % 97}",
                message_ref=f"m{i}",
                content=f"reply {i}",
                platform="slack",
                chat_id=f"U{i % 97}",
            )
            assert store.insert_if_live(now, new, crashed.instance_id) is not None
            ids.add(new.id)
    crashed.die()
    return ids


def test_four_claimers_claim_every_orphan_exactly_once(start_delivery: StartDelivery) -> None:
    # Two servers on one database, two claimers each: contention crosses
    # connections (and, on SQLite, the file lock), not just one writer thread.
    servers = [start_delivery(), start_delivery()]
    orphans = _seed_orphans(servers[0], ORPHANS)
    claimed_by: dict[str, list[str]] = {}
    start = threading.Barrier(CLAIMERS)
    errors: list[BaseException] = []

    def claimer(server: InProcessDelivery) -> None:
        try:
            gateway = Gateway(server.stub)
            mine = claimed_by.setdefault(gateway.instance_id, [])
            start.wait()
            empty_in_a_row = 0
            while empty_in_a_row < 3:
                batch = gateway.claim(limit=97).obligations
                mine.extend(row.id for row in batch)
                empty_in_a_row = 0 if batch else empty_in_a_row + 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(servers[i % 2],)) for i in range(CLAIMERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    assert not errors, errors
    every_claim = Counter(row_id for ids in claimed_by.values() for row_id in ids)
    assert set(every_claim) == orphans
    assert max(every_claim.values()) == 1, "a row was claimed twice"
    assert sum(1 for ids in claimed_by.values() if ids) >= 2, "claimers did not overlap at all"
    for instance_id, ids in claimed_by.items():
        for row_id in ids[:50]:
            row = get(servers[0].stub, row_id)
            assert (row.owner_instance_id, row.attempts) == (instance_id, 1)


def test_row_delivered_between_claim_read_and_write_is_untouched(
    delivery: InProcessDelivery,
) -> None:
    """River #1302/#1373: the claim's write is guarded on what it read."""
    slow_sender = Gateway(delivery.stub)
    rows = [
        slow_sender.attempting(slow_sender.record(content=f"reply {i}").obligation)
        for i in range(3)
    ]
    slow_sender.die()
    rescuer = Gateway(delivery.stub)
    store, backend = delivery.unit.store, delivery.unit.store.backend

    with backend.database.connection_context():
        candidates = store.find_claimable(backend.now(), ["slack"], 100, "test-gateway", None)
    assert {c[0] for c in candidates} == {row.id for row in rows}

    # The old holder's send completes after all: it may still record that.
    slow_sender.delivered(rows[0], "pm-late")

    with backend.database.connection_context(), backend.write_transaction():
        claimed = store.claim(backend.now(), candidates, rescuer.instance_id, "test-gateway", None)

    assert {row.id for row in claimed} == {rows[1].id, rows[2].id}
    late = get(delivery.stub, rows[0].id)
    assert late.state == pb.OBLIGATION_STATE_DELIVERED
    assert (late.owner_instance_id, late.fence, late.attempts) == (
        slow_sender.instance_id,
        rows[0].fence,
        0,
    )
    assert late.platform_message_id == "pm-late"
