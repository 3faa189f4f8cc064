"""The ADK session service's contract, from ADK 2.13's documented behaviour
(`BaseSessionService`, `GetSessionConfig`, `State`'s prefixes), through the adapter
against a real SessionService on both backends."""

from __future__ import annotations

import time

import pytest
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.session import Session
from switchboard_client.frameworks.adk import SwitchboardSessionService

from tests.frameworks.adk.conftest import APP, USER, drive, event, log_head, texts
from tests.harness import InProcessSession


def test_create_then_get_answers_the_session_with_its_state_and_no_events(
    server: InProcessSession,
) -> None:
    async def scenario(service: SwitchboardSessionService) -> None:
        created = await service.create_session(
            app_name=APP, user_id=USER, state={"cart": ["tea"]}, session_id="s1"
        )
        assert (created.id, created.app_name, created.user_id) == ("s1", APP, USER)
        assert created.state == {"cart": ["tea"]} and created.events == []
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        assert got is not None and got.state == {"cart": ["tea"]} and got.events == []
        assert got.last_update_time > 0

    drive(server.address, scenario)


def test_a_session_id_is_generated_when_none_is_given_and_padding_is_trimmed(
    server: InProcessSession,
) -> None:
    async def scenario(service: SwitchboardSessionService) -> None:
        generated = await service.create_session(app_name=APP, user_id=USER)
        assert generated.id
        padded = await service.create_session(app_name=APP, user_id=USER, session_id=" p1 ")
        assert padded.id == "p1"
        assert await service.get_session(app_name=APP, user_id=USER, session_id=" p1 ")

    drive(server.address, scenario)


def test_get_of_an_unknown_session_app_or_user_is_none_and_creates_nothing(
    server: InProcessSession,
) -> None:
    async def scenario(service: SwitchboardSessionService) -> None:
        await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        assert await service.get_session(app_name=APP, user_id=USER, session_id="nope") is None
        assert await service.get_session(app_name=APP, user_id="bob", session_id="s1") is None
        assert await service.get_session(app_name="other", user_id=USER, session_id="s1") is None
        listed = await service.list_sessions(app_name=APP)
        assert [s.id for s in listed.sessions] == ["s1"]

    drive(server.address, scenario)


def test_creating_a_taken_id_raises_already_exists(server: InProcessSession) -> None:
    async def scenario(service: SwitchboardSessionService) -> None:
        await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        with pytest.raises(AlreadyExistsError, match="s1 already exists"):
            await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        # The same id under another user is another session.
        await service.create_session(app_name=APP, user_id="bob", session_id="s1")

    drive(server.address, scenario)


def test_appended_events_read_back_whole_and_in_order(server: InProcessSession) -> None:
    async def scenario(service: SwitchboardSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        first = event("hello")
        await service.append_event(session, first)
        await service.append_event(session, event("hi, how can I help", author="shop_agent"))
        assert texts(session.events) == ["hello", "hi, how can I help"]
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        assert got is not None
        assert texts(got.events) == ["hello", "hi, how can I help"]
        assert got.events[0] == first
        assert [e.author for e in got.events] == ["user", "shop_agent"]

    drive(server.address, scenario)


def test_a_partial_event_is_not_stored(server: InProcessSession) -> None:
    async def scenario(service: SwitchboardSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        partial = event("hel")
        partial.partial = True
        assert await service.append_event(session, partial) is partial
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        assert got is not None and got.events == [] and session.events == []

    drive(server.address, scenario)


def test_an_event_delivered_again_is_stored_once_but_another_event_with_its_id_is_stored(
    server: InProcessSession,
) -> None:
    """ADK's services never hold one event twice: InMemorySessionService ignores an equal
    re-delivery (the same object, or a copy), its SQL services refuse the id. A caller
    retrying an append that went through must not duplicate it either; an event that
    merely shares an id is another event (as in InMemorySessionService)."""

    async def scenario(service: SwitchboardSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        said = event("hello", state={"user:n": 1})
        await service.append_event(session, said)
        before = log_head(server)
        assert await service.append_event(session, said) is said
        await service.append_event(session, said.model_copy(deep=True))
        reloaded = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        assert reloaded is not None
        await service.append_event(reloaded, said.model_copy(deep=True))
        assert log_head(server) == before  # nothing written
        assert texts(session.events) == ["hello"] and texts(reloaded.events) == ["hello"]
        same_id = event("another", author="shop_agent")
        same_id.id = said.id
        await service.append_event(session, same_id)
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        assert got is not None and texts(got.events) == ["hello", "another"]

    drive(server.address, scenario)


def test_state_scopes_app_user_session_and_temp(server: InProcessSession) -> None:
    """app: is shared by every session of the app, user: by the user's sessions,
    unprefixed keys stay in their session, temp: is seen in memory but never stored."""

    async def scenario(service: SwitchboardSessionService) -> None:
        mine = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        delta = {
            "app:banner": "sale",
            "user:lang": "fr",
            "step": 2,
            "temp:scratch": "x",
        }
        await service.append_event(mine, event("go", state=delta))
        assert mine.state == delta  # the live session sees temp: too
        stored = mine.events[0].actions.state_delta
        assert "temp:scratch" not in stored  # the stored event never holds it

        again = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        assert again is not None
        assert again.state == {"app:banner": "sale", "user:lang": "fr", "step": 2}
        assert "temp:scratch" not in again.events[0].actions.state_delta

        second = await service.create_session(app_name=APP, user_id=USER, session_id="s2")
        assert second.state == {"app:banner": "sale", "user:lang": "fr"}
        other_user = await service.create_session(app_name=APP, user_id="bob", session_id="s3")
        assert other_user.state == {"app:banner": "sale"}
        other_app = await service.create_session(app_name="other", user_id=USER)
        assert other_app.state == {}

        assert await service.get_user_state(app_name=APP, user_id=USER) == {"lang": "fr"}
        assert await service.get_user_state(app_name=APP, user_id="bob") == {}
        assert await service.get_user_state(app_name="never", user_id=USER) == {}

    drive(server.address, scenario)


def test_initial_state_is_scoped_too(server: InProcessSession) -> None:
    async def scenario(service: SwitchboardSessionService) -> None:
        await service.create_session(
            app_name=APP,
            user_id=USER,
            session_id="s1",
            state={"app:v": 1, "user:name": "Ada", "draft": True, "temp:t": 1},
        )
        other = await service.create_session(app_name=APP, user_id=USER, session_id="s2")
        assert other.state == {"app:v": 1, "user:name": "Ada"}
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        assert got is not None and got.state == {"app:v": 1, "user:name": "Ada", "draft": True}

    drive(server.address, scenario)


def test_values_keep_their_json_types_and_none_is_kept_as_none(
    server: InProcessSession,
) -> None:
    async def scenario(service: SwitchboardSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        values = {"n": 1, "f": 1.5, "s": "1", "b": False, "l": [1, {"a": None}], "gone": None}
        await service.append_event(session, event("x", state=values))
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        assert got is not None and got.state == values

    drive(server.address, scenario)


async def both_paths(
    writer: SwitchboardSessionService, address: str, config: GetSessionConfig
) -> list[str]:
    """The texts `get_session` answers with `config`, read by the adapter that wrote
    the session (its cached events) and by one that keeps none (the history read): they
    must agree."""
    reader = SwitchboardSessionService(address, cached_sessions=0)
    try:
        read = [
            await service.get_session(app_name=APP, user_id=USER, session_id="s1", config=config)
            for service in (writer, reader)
        ]
    finally:
        await reader.close()
    assert read[0] is not None and read[1] is not None
    assert read[0].events == read[1].events
    return texts(read[0].events)


def test_a_value_json_cannot_hold_is_stored_as_its_repr_with_a_warning(
    server: InProcessSession, caplog: pytest.LogCaptureFixture
) -> None:
    """As ADK's own services do (its newer contract tests ask it): one such value never
    loses the event or the rest of the delta."""

    async def scenario(service: SwitchboardSessionService) -> None:
        session = await service.create_session(
            app_name=APP, user_id=USER, session_id="s1", state={"hook": print}
        )
        await service.append_event(session, event("x", state={"callback": len, "ok": 2}))
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        assert got is not None and len(got.events) == 1
        assert got.state["ok"] == 2
        assert "built-in function len" in got.state["callback"]
        assert "built-in function print" in got.state["hook"]

    with caplog.at_level("WARNING", logger="switchboard_client.frameworks.adk"):
        drive(server.address, scenario)
    assert "'callback' cannot be stored as JSON" in caplog.text


def test_get_session_config_num_recent_events(server: InProcessSession) -> None:
    async def scenario(service: SwitchboardSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        for i in range(5):
            await service.append_event(session, event(f"m{i}"))

        async def recent(n: int) -> list[str]:
            config = GetSessionConfig(num_recent_events=n)
            return await both_paths(service, server.address, config)

        assert await recent(2) == ["m3", "m4"]
        assert await recent(0) == []
        assert await recent(10) == [f"m{i}" for i in range(5)]
        with pytest.raises(ValueError, match="num_recent_events"):
            GetSessionConfig(num_recent_events=-1)

    drive(server.address, scenario)


def test_get_session_config_after_timestamp_and_both(server: InProcessSession) -> None:
    async def scenario(service: SwitchboardSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        base = time.time()
        for i in range(5):
            appended = event(f"m{i}")
            appended.timestamp = base + i
            await service.append_event(session, appended)

        async def read(config: GetSessionConfig) -> list[str]:
            return await both_paths(service, server.address, config)

        assert await read(GetSessionConfig(after_timestamp=base + 2)) == ["m2", "m3", "m4"]
        assert await read(GetSessionConfig(after_timestamp=base + 10)) == []
        both = GetSessionConfig(after_timestamp=base + 1, num_recent_events=2)
        assert await read(both) == ["m3", "m4"]
        both = GetSessionConfig(after_timestamp=base + 3, num_recent_events=4)
        assert await read(both) == ["m3", "m4"]
        both = GetSessionConfig(after_timestamp=base + 3, num_recent_events=3)
        assert await read(both) == ["m3", "m4"]

    drive(server.address, scenario)


def test_after_timestamp_keeps_every_later_event_when_times_do_not_grow_with_the_log(
    server: InProcessSession,
) -> None:
    """An event's timestamp is the caller's (ADK stamps it when it makes the event, not
    when it is appended), so an older one can follow a newer one: `after_timestamp`
    keeps each event at or after it, as ADK's services filter, and the cached and the
    history read agree."""

    async def scenario(service: SwitchboardSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        base = time.time()
        for name, offset in (("m0", 0), ("m3", 3), ("m1", 1), ("m4", 4), ("m2", 2)):
            appended = event(name)
            appended.timestamp = base + offset
            await service.append_event(session, appended)

        async def read(config: GetSessionConfig) -> list[str]:
            return await both_paths(service, server.address, config)

        assert await read(GetSessionConfig(after_timestamp=base + 3)) == ["m3", "m4"]
        assert await read(GetSessionConfig(after_timestamp=base + 2)) == ["m3", "m4", "m2"]
        both = GetSessionConfig(after_timestamp=base + 1, num_recent_events=3)
        assert await read(both) == ["m1", "m4", "m2"]

    drive(server.address, scenario)


def test_list_sessions_by_user_or_all_without_events_oldest_update_first(
    server: InProcessSession,
) -> None:
    async def scenario(service: SwitchboardSessionService) -> None:
        a = await service.create_session(app_name=APP, user_id=USER, session_id="a")
        await service.create_session(app_name=APP, user_id=USER, session_id="b")
        await service.create_session(
            app_name=APP, user_id="bob", session_id="c", state={"k": 1, "user:u": 2}
        )
        await service.create_session(app_name="other", user_id=USER, session_id="d")
        await service.append_event(a, event("touch a last", state={"app:x": 1}))

        mine = await service.list_sessions(app_name=APP, user_id=USER)
        assert [s.id for s in mine.sessions] == ["b", "a"]
        assert all(s.events == [] for s in mine.sessions)
        everyone = await service.list_sessions(app_name=APP)
        assert sorted((s.user_id, s.id) for s in everyone.sessions) == [
            ("ada", "a"),
            ("ada", "b"),
            ("bob", "c"),
        ]
        bobs = next(s for s in everyone.sessions if s.id == "c")
        assert bobs.state == {"k": 1, "user:u": 2, "app:x": 1}
        assert (await service.list_sessions(app_name=APP, user_id="nobody")).sessions == []
        assert (await service.list_sessions(app_name="never")).sessions == []

    drive(server.address, scenario)


def test_delete_session_erases_it_and_the_id_can_be_used_again(
    server: InProcessSession,
) -> None:
    async def scenario(service: SwitchboardSessionService) -> None:
        session = await service.create_session(
            app_name=APP, user_id=USER, session_id="s1", state={"user:keep": 1}
        )
        await service.append_event(session, event("secret words"))
        await service.delete_session(app_name=APP, user_id=USER, session_id="s1")
        assert await service.get_session(app_name=APP, user_id=USER, session_id="s1") is None
        assert (await service.list_sessions(app_name=APP)).sessions == []
        # user: state is the user's, not the session's: it outlives the session.
        assert await service.get_user_state(app_name=APP, user_id=USER) == {"keep": 1}
        # Deleting what is not there is no error, as with ADK's services.
        await service.delete_session(app_name=APP, user_id=USER, session_id="s1")
        # The held session object cannot write into the erased session.
        with pytest.raises(SessionNotFoundError):
            await service.append_event(session, event("after delete"))
        fresh = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        assert fresh.events == []

    drive(server.address, scenario)
    # Erased for real: the words are in no log row any more.
    assert b"secret words" not in _log_bytes(server)


def _log_bytes(server: InProcessSession) -> bytes:
    from switchboard.session.v1 import session_service_pb2 as pb

    page = server.stub.ListLogEvents(pb.ListLogEventsRequest(page_size=1000))
    return b"".join(entry.SerializeToString() for entry in page.entries)


def test_a_session_deleted_by_another_client_is_gone_for_a_client_that_read_it(
    server: InProcessSession,
) -> None:
    """The adapter remembers where a session is stored; an erasure through another
    adapter (another process) must not leave it answering the erased session."""

    async def scenario(service: SwitchboardSessionService) -> None:
        await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        assert await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        other = SwitchboardSessionService(server.address)
        try:
            await other.delete_session(app_name=APP, user_id=USER, session_id="s1")
            assert await service.get_session(app_name=APP, user_id=USER, session_id="s1") is None
            await other.create_session(app_name=APP, user_id=USER, session_id="s1", state={"v": 2})
        finally:
            await other.close()
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        assert got is not None and got.state == {"v": 2}

    drive(server.address, scenario)


def test_append_to_a_session_never_created_raises_session_not_found(
    server: InProcessSession,
) -> None:
    async def scenario(service: SwitchboardSessionService) -> None:
        ghost = Session(id="ghost", app_name=APP, user_id=USER)
        with pytest.raises(SessionNotFoundError):
            await service.append_event(ghost, event("boo"))

    drive(server.address, scenario)


def test_app_names_that_are_not_agent_names_are_kept_apart(server: InProcessSession) -> None:
    async def scenario(service: SwitchboardSessionService) -> None:
        await service.create_session(app_name="MyApp", user_id=USER, session_id="s", state={})
        await service.create_session(app_name="myapp", user_id=USER, session_id="s")
        await service.create_session(app_name="my app/ü", user_id=USER, session_id="s")
        for app in ("MyApp", "myapp", "my app/ü"):
            listed = await service.list_sessions(app_name=app)
            assert [(s.app_name, s.id) for s in listed.sessions] == [(app, "s")]

    drive(server.address, scenario)


def test_a_reader_sees_other_writers_and_global_rewinds_through_its_cached_events(
    server: InProcessSession,
) -> None:
    """The adapter reuses the events it read or wrote while the session stays at that
    version; another writer's append or an operator's global rewind moves the version,
    so the next read reads the history again."""
    from switchboard.session.v1 import session_service_pb2 as pb

    async def scenario(service: SwitchboardSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        await service.append_event(session, event("one"))
        mark = server.stub.CreateCheckpoint(pb.CreateCheckpointRequest(label="one")).checkpoint
        await service.append_event(session, event("two"))
        assert texts((await _read(service)).events) == ["one", "two"]
        other = SwitchboardSessionService(server.address)
        try:
            theirs = await _read(other)
            await other.append_event(theirs, event("three"))
        finally:
            await other.close()
        assert texts((await _read(service)).events) == ["one", "two", "three"]
        server.stub.Rewind(pb.RewindRequest(sequence=mark.sequence))
        rewound = await _read(service)
        assert texts(rewound.events) == ["one"]
        await service.append_event(rewound, event("four"))
        assert texts((await _read(service)).events) == ["one", "four"]

    drive(server.address, scenario)


async def _read(service: SwitchboardSessionService) -> Session:
    got = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
    assert got is not None
    return got


def test_a_session_object_built_by_hand_appends_only_while_it_holds_every_stored_event(
    server: InProcessSession,
) -> None:
    """A Session this service did not load (rebuilt from a dict: no revision marker) is
    accepted while the store holds exactly its events, as ADK's database service
    accepts one; once another writer appended, it is stale."""

    async def scenario(service: SwitchboardSessionService) -> None:
        loaded = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        await service.append_event(loaded, event("one"))
        rebuilt = Session.model_validate(loaded.model_dump())
        assert rebuilt._storage_update_marker is None
        await service.append_event(rebuilt, event("two"))
        empty_copy = Session(id="s1", app_name=APP, user_id=USER)
        with pytest.raises(ValueError, match="modified in storage"):
            await service.append_event(empty_copy, event("lost"))
        assert texts((await _read(service)).events) == ["one", "two"]

    drive(server.address, scenario)
