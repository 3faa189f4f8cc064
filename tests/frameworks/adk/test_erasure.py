"""ADK's `delete_session` through the adapter is Switchboard's erasure: the event
content and the session's state are gone from the database's bytes (SQLite files, a
Postgres dump), and a global rewind or checkout to before the deletion brings nothing
back."""

from __future__ import annotations

from switchboard_client.frameworks.adk import SwitchboardSessionService

from switchboard.session.v1 import session_service_pb2 as pb
from tests.frameworks.adk.conftest import APP, USER, bytes_at_rest, drive, event
from tests.harness import InProcessSession

SAID = b"okapi-said-3c1e"
KEPT = b"okapi-state-77d2"


def _held(database_url: str) -> set[bytes]:
    data = bytes_at_rest(database_url)
    return {marker for marker in (SAID, KEPT) if marker in data or marker.hex().encode() in data}


def test_delete_session_erases_events_and_state_from_the_bytes_at_rest(
    server: InProcessSession, database_url: str
) -> None:
    async def fill(service: SwitchboardSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        await service.append_event(session, event(SAID.decode(), state={"note": KEPT.decode()}))

    drive(server.address, fill)
    mark = server.stub.CreateCheckpoint(pb.CreateCheckpointRequest(label="before")).checkpoint
    assert _held(database_url) == {SAID, KEPT}, "the scan finds what is there"

    async def delete(service: SwitchboardSessionService) -> None:
        await service.delete_session(app_name=APP, user_id=USER, session_id="s1")

    drive(server.address, delete)
    assert _held(database_url) == set()

    server.stub.Checkout(pb.CheckoutRequest(sequence=mark.sequence))

    async def read(service: SwitchboardSessionService) -> None:
        assert await service.get_session(app_name=APP, user_id=USER, session_id="s1") is None

    drive(server.address, read)
    assert _held(database_url) == set()
