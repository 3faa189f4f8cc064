"""DeliveryClient against real in-process DeliveryService servers (SQLite and Postgres).

Nothing is mocked: failures come from a real server, a port nothing listens on,
or a TCP listener that accepts and never speaks HTTP/2.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import socket
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from switchboard_client import SERVICE_CONFIG, DeliveryClient, SwitchboardError
from switchboard_client.delivery import REQUEST_ID_METHODS

from switchboard.delivery.v1 import delivery_service_pb2 as pb
from tests.harness import InProcessDelivery

SESSION = "agent:main:slack:channel:C1"

READS = {
    "GetInstance",
    "GetObligation",
    "ListObligations",
    "GetLedgerStats",
    "ListInstances",
    "CountObligations",
}
#: Every write carries a request id, so a retry is answered, not run again.
WRITES = {
    method.name
    for method in pb.DESCRIPTOR.services_by_name["DeliveryService"].methods
    if "request_id" in method.input_type.fields_by_name
}
IDEMPOTENT = READS | WRITES
NOT_IDEMPOTENT: set[str] = set()
#: Long-lived: CallStream, the clients' carrier of concurrent writes.
STREAMING = {"CallStream"}


def register(client: DeliveryClient, platforms: tuple[str, ...] = ("slack",)) -> str:
    return client.register("test-gateway", platforms).instance_id


def record(
    client: DeliveryClient,
    instance_id: str,
    content: str = "the final answer",
    session_key: str = SESSION,
) -> pb.RecordObligationResponse:
    return client.record(
        instance_id,
        session_key=session_key,
        content=content,
        platform="slack",
        chat_id="C1",
        message_ref="m1",
        thread_id="171.001",
    )


def raised(error: pytest.ExceptionInfo[SwitchboardError]) -> tuple[grpc.StatusCode, str]:
    return error.value.code, error.value.reason


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture
def silent_address() -> Iterator[str]:
    """A TCP listener that accepts connections and never answers (a hung server)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(connection)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        for connection in held:
            connection.close()
        listener.close()


# -- the send path ------------------------------------------------------------------------


def test_full_cycle_register_record_attempting_delivered(client: DeliveryClient) -> None:
    instance = client.register("test-gateway", ["telegram", "slack"], lease_ttl_s=10)
    assert instance.instance_id and instance.live
    assert (instance.host, instance.pid) == (socket.gethostname(), os.getpid())
    assert list(instance.platforms) == ["slack", "telegram"]
    lease = instance.lease_expire_time.ToNanoseconds() - instance.heartbeat_time.ToNanoseconds()
    assert lease == 10 * 10**9, "lease_ttl_s reaches the server as a Duration"
    iid = instance.instance_id

    recorded = client.record(
        iid,
        session_key=SESSION,
        content="the final answer",
        platform="slack",
        chat_id="C1",
        message_ref="m1",
        thread_id="171.001",
        metadata={"reply_to": "m1"},
    )
    assert recorded.created
    row = recorded.obligation
    assert row.state == pb.OBLIGATION_STATE_PENDING
    assert row.owner_instance_id == iid and row.fence > 0
    assert (row.session_key, row.content, row.platform, row.chat_id, row.thread_id) == (
        SESSION,
        "the final answer",
        "slack",
        "C1",
        "171.001",
    )
    assert dict(row.metadata) == {"reply_to": "m1"}

    attempting = client.mark_attempting(iid, row)
    assert attempting.state == pb.OBLIGATION_STATE_ATTEMPTING
    delivered = client.mark_delivered(iid, attempting, "pm-1")
    assert delivered.state == pb.OBLIGATION_STATE_DELIVERED
    assert delivered.platform_message_id == "pm-1"
    assert client.get(row.id) == delivered

    counts = {count.state: count.count for count in client.stats().state_counts}
    assert counts[pb.OBLIGATION_STATE_DELIVERED] == 1
    assert counts[pb.OBLIGATION_STATE_PENDING] == 0


def test_recording_twice_returns_the_stored_row_with_created_false(
    client: DeliveryClient,
) -> None:
    iid = register(client)
    first = record(client, iid)
    again = record(client, iid)
    assert first.created and not again.created
    assert again.obligation == first.obligation
    client.mark_delivered(iid, first.obligation)
    after_delivery = record(client, iid)
    assert not after_delivery.created
    assert after_delivery.obligation.state == pb.OBLIGATION_STATE_DELIVERED


def test_a_stale_fence_raises_failed_precondition_stale_fence(client: DeliveryClient) -> None:
    owner = register(client)
    row = record(client, owner).obligation
    client.deregister(owner)
    rescuer = register(client)
    (claimed,) = client.claim_recoverable(rescuer).obligations
    assert claimed.fence != row.fence

    with pytest.raises(SwitchboardError) as error:
        client.mark_delivered(owner, row, "pm-late")
    assert raised(error) == (grpc.StatusCode.FAILED_PRECONDITION, "STALE_FENCE")
    assert error.value.metadata == {"state": "attempting"}
    assert error.value.field_violations == []
    assert client.get(row.id).owner_instance_id == rescuer
    assert client.mark_delivered(rescuer, claimed).state == pb.OBLIGATION_STATE_DELIVERED


def test_an_empty_session_key_raises_invalid_argument_naming_the_field(
    client: DeliveryClient,
) -> None:
    iid = register(client)
    with pytest.raises(SwitchboardError) as error:
        record(client, iid, session_key="")
    assert raised(error) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
    assert error.value.field_violations == ["session_key"]
    assert "session_key" in error.value.message
    copy = pickle.loads(pickle.dumps(error.value))
    assert (copy.code, copy.reason, copy.field_violations, copy.message) == (
        error.value.code,
        error.value.reason,
        error.value.field_violations,
        error.value.message,
    )


def test_mark_failed_sends_retry_after_and_retryable(client: DeliveryClient) -> None:
    iid = register(client)
    flooded = record(client, iid, content="flood controlled").obligation
    failed = client.mark_failed(
        iid, flooded, "429 Too Many Requests", retryable=True, retry_after_s=90
    )
    assert failed.state == pb.OBLIGATION_STATE_FAILED
    assert failed.last_error == "429 Too Many Requests"
    delay_ns = failed.next_attempt_time.ToNanoseconds() - failed.update_time.ToNanoseconds()
    assert abs(delay_ns - 90 * 10**9) < 10**9

    blocked = record(client, iid, content="bot blocked").obligation
    abandoned = client.mark_failed(iid, blocked, "403 bot was blocked", retryable=False)
    assert abandoned.state == pb.OBLIGATION_STATE_ABANDONED


def test_heartbeat_replaces_platforms_and_deregister_ends_the_instance(
    client: DeliveryClient,
) -> None:
    iid = register(client, ("slack",))
    assert list(client.heartbeat(iid, ["telegram"]).platforms) == ["telegram"]
    gone = client.deregister(iid)
    assert not gone.live and gone.HasField("deregister_time")
    assert not client.deregister(iid).live, "deregister is idempotent"
    with pytest.raises(SwitchboardError) as error:
        client.heartbeat(iid, ["slack"])
    assert raised(error) == (grpc.StatusCode.FAILED_PRECONDITION, "INSTANCE_NOT_LIVE")


# -- recovery -----------------------------------------------------------------------------


def test_claim_after_deregister_returns_the_orphan_without_marker(
    client: DeliveryClient,
) -> None:
    owner = register(client)
    row = record(client, owner).obligation
    client.deregister(owner)
    rescuer = register(client, ("slack",))

    nothing = client.claim_recoverable(rescuer, deliverable_platforms=[])
    assert list(nothing.obligations) == [], "an empty set means: no platform deliverable now"
    assert nothing.gated_count == 1

    claimed = client.claim_recoverable(rescuer)  # None: the heartbeat's platforms (slack)
    assert [c.id for c in claimed.obligations] == [row.id]
    orphan = claimed.obligations[0]
    assert orphan.state == pb.OBLIGATION_STATE_ATTEMPTING
    assert orphan.owner_instance_id == rescuer
    assert not orphan.needs_marker, "a PENDING row never reached the platform"
    assert list(client.claim_recoverable(rescuer).obligations) == []


def test_claim_limits_and_platform_sets(client: DeliveryClient) -> None:
    owner = register(client)
    for n in range(3):
        record(client, owner, content=f"reply {n}")
    client.deregister(owner)
    rescuer = register(client, ("telegram",))
    gated = client.claim_recoverable(rescuer)
    assert list(gated.obligations) == [] and gated.gated_count == 3
    first = client.claim_recoverable(rescuer, deliverable_platforms=["slack"], limit=2)
    assert len(first.obligations) == 2
    rest = client.claim_recoverable(rescuer, deliverable_platforms=("slack",))
    assert len(rest.obligations) == 1


# -- operators ----------------------------------------------------------------------------


def test_list_follows_page_tokens_in_creation_order(
    client: DeliveryClient, delivery: InProcessDelivery
) -> None:
    iid = register(client)
    ids = [record(client, iid, content=f"reply {n}").obligation.id for n in range(5)]
    first_page = delivery.stub.ListObligations(pb.ListObligationsRequest(page_size=2))
    assert len(first_page.obligations) == 2 and first_page.next_page_token, "really paged"

    rows = list(client.list(page_size=2))
    assert [row.id for row in rows] == ids


def test_list_keeps_its_filters_on_every_page(client: DeliveryClient) -> None:
    iid = register(client)
    wanted = [
        record(client, iid, content=f"a{n}", session_key="s:a").obligation.id for n in range(3)
    ]
    for n in range(2):
        record(client, iid, content=f"b{n}", session_key="s:b")
    client.mark_delivered(iid, record(client, iid, content="done", session_key="s:a").obligation)

    pending_a = client.list(
        state=pb.OBLIGATION_STATE_PENDING, session_key="s:a", owner_instance_id=iid, page_size=2
    )
    assert [row.id for row in pending_a] == wanted
    assert len(list(client.list(platform="slack"))) == 6


def test_operator_retry_abandon_and_prune(client: DeliveryClient) -> None:
    iid = register(client)
    done = record(client, iid, content="done").obligation
    client.mark_delivered(iid, done)
    given_up = client.mark_failed(
        iid, record(client, iid, content="blocked").obligation, "403", retryable=False
    )
    owed = record(client, iid, content="owed").obligation

    retried = client.retry(given_up.id)
    assert retried.state == pb.OBLIGATION_STATE_FAILED
    assert retried.owner_instance_id == "" and retried.attempts == 0
    with pytest.raises(SwitchboardError) as error:
        client.retry(done.id)
    assert raised(error) == (grpc.StatusCode.FAILED_PRECONDITION, "ALREADY_DELIVERED")

    abandoned = client.abandon(retried.id, "spam")
    assert abandoned.state == pb.OBLIGATION_STATE_ABANDONED and "spam" in abandoned.last_error

    assert client.prune() == 0, "the server's retention keeps fresh terminal rows"
    time.sleep(0.3)
    assert client.prune(older_than_s=0.1) == 2
    with pytest.raises(SwitchboardError) as error:
        client.get(done.id)
    assert raised(error) == (grpc.StatusCode.NOT_FOUND, "OBLIGATION_NOT_FOUND")
    assert client.get(owed.id).state == pb.OBLIGATION_STATE_PENDING


# -- failures must not hang or break a gateway -------------------------------------------


def test_record_best_effort_returns_none_instead_of_raising(
    client: DeliveryClient, caplog: pytest.LogCaptureFixture
) -> None:
    iid = register(client)
    stored = client.record_best_effort(
        iid, session_key=SESSION, content="kept", platform="slack", chat_id="C1"
    )
    assert stored is not None and stored.created

    with caplog.at_level(logging.WARNING, logger="switchboard_client"):
        bad = client.record_best_effort(
            iid, session_key="", content="x", platform="slack", chat_id="C1"
        )
    assert bad is None
    assert "INVALID_ARGUMENT" in caplog.text
    caplog.clear()

    not_a_string = {"reply_to": 171}
    assert (
        client.record_best_effort(
            iid,
            session_key=SESSION,
            content="x",
            platform="slack",
            chat_id="C1",
            metadata=not_a_string,
        )
        is None
    ), "errors outside gRPC (here: building the request) are swallowed too"
    caplog.clear()

    unreachable = DeliveryClient(f"127.0.0.1:{unused_port()}", best_effort_timeout_s=1.0)
    with unreachable, caplog.at_level(logging.WARNING, logger="switchboard_client"):
        started = time.monotonic()
        lost = unreachable.record_best_effort(
            iid, session_key=SESSION, content="lost", platform="slack", chat_id="C1"
        )
        assert time.monotonic() - started < 10
    assert lost is None
    # The in-process server's access lines (switchboard.access) may land late: only the
    # client's own records count here.
    client_records = [r.name for r in caplog.records if not r.name.startswith("switchboard.")]
    assert client_records == ["switchboard_client"]
    assert "the final answer" not in caplog.text and "lost" not in caplog.text


def test_record_best_effort_gives_up_on_a_hung_server(silent_address: str) -> None:
    with DeliveryClient(silent_address, timeout_s=30, best_effort_timeout_s=0.3) as hung:
        started = time.monotonic()
        result = hung.record_best_effort(
            "i1", session_key=SESSION, content="x", platform="slack", chat_id="C1"
        )
        assert time.monotonic() - started < 10
    assert result is None


def test_a_server_that_never_answers_raises_deadline_exceeded(silent_address: str) -> None:
    with DeliveryClient(silent_address, timeout_s=0.5) as hung:
        for call in (lambda: hung.get("0" * 24), lambda: hung.register("gw", ["slack"])):
            started = time.monotonic()
            with pytest.raises(SwitchboardError) as error:
                call()
            assert time.monotonic() - started < 10
            assert error.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
            assert error.value.reason == "" and error.value.field_violations == []


def test_an_unreachable_server_raises_unavailable() -> None:
    with (
        DeliveryClient(f"127.0.0.1:{unused_port()}", timeout_s=5) as nowhere,
        pytest.raises(SwitchboardError) as error,
    ):
        nowhere.stats()
    assert error.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_close_closes_only_a_channel_the_client_created(delivery: InProcessDelivery) -> None:
    channel = grpc.insecure_channel(delivery.address)
    try:
        with DeliveryClient("unused:1", channel=channel) as borrowed:
            borrowed.stats()
        assert DeliveryClient("unused:1", channel=channel).stats().live_instance_count == 0
    finally:
        channel.close()

    owned = DeliveryClient(delivery.address)
    owned.stats()
    owned.close()
    with pytest.raises(ValueError, match="closed channel"):
        owned.stats()


# -- the retry contract -------------------------------------------------------------------


def test_service_config_retries_exactly_the_idempotent_methods() -> None:
    service = pb.DESCRIPTOR.services_by_name["DeliveryService"]
    methods = {method.name for method in service.methods}
    assert methods == IDEMPOTENT | NOT_IDEMPOTENT | STREAMING, "every method is classified"
    assert set(REQUEST_ID_METHODS) == WRITES, "the client sets ids for exactly the writes"
    assert len(WRITES) == 12

    config = json.loads(json.dumps(SERVICE_CONFIG))
    assert config == SERVICE_CONFIG, "the config is plain JSON"
    entries = config["methodConfig"]
    for entry in entries:
        assert all(name["service"] == service.full_name for name in entry["name"])

    retrying = [entry for entry in entries if "retryPolicy" in entry]
    retried = [name.get("method") for entry in retrying for name in entry["name"]]
    assert sorted(retried) == sorted(IDEMPOTENT), "a misspelt method is silently not retried"
    for entry in retrying:
        assert entry["retryPolicy"] == {
            "maxAttempts": 4,
            "initialBackoff": "0.1s",
            "maxBackoff": "2s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"],
        }

    def entry_for(method: str) -> dict[str, object]:
        """gRPC's lookup: the exact method name first, then the service-wide entry."""
        for entry in entries:
            if {"service": service.full_name, "method": method} in entry["name"]:
                return dict(entry)
        for entry in entries:
            if {"service": service.full_name} in entry["name"]:
                return dict(entry)
        raise AssertionError(f"{method} has no method config")

    for method in methods:
        entry = entry_for(method)
        timeout = entry.get("timeout")
        if method in STREAMING:
            assert timeout is None and "retryPolicy" not in entry, f"{method} is long-lived"
            continue
        assert isinstance(timeout, str) and timeout.endswith("s"), method
        assert float(timeout[:-1]) > 0, method
        assert ("retryPolicy" in entry) == (method in IDEMPOTENT), method
