"""The event log's contract: what every storage backend must do alike.

`EventLogContract` is one test case class; each backend runs all of it by subclassing
it with `open_core` (test_sqlite.py, test_postgres.py). A new backend adds a module of
a few lines here, and passes when its recorder keeps the log's rules: dense sequences
in commit order, nothing of a rolled-back append, reads in sequence order, filters
and byte budgets alike; and the stores beside it keep theirs: snapshots read newest
active first, a routing key claimed once, a checkpoint label taken once. The model is
the `eventsourcing` library's recorder test cases: one small interface, one shared
suite per implementation.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

import pytest

from session_service import storage_format
from session_service.composition import build_core
from session_service.core import Core
from session_service.migrations import SESSION_SCHEMA
from session_service.records import (
    Event,
    InboxPosted,
    Message,
    MessageAppended,
    Rewound,
    Role,
    Session,
    SessionState,
)
from session_service.storage.event_log import agent_entity, session_entity
from switchboard import migrations
from switchboard.backends import open_backend
from switchboard.database import DatabaseSettings

T = TypeVar("T")
NOW = 1_700_000_000.0


def message(session_id: str, text: str, agent: str = "main") -> Event:
    body = MessageAppended(message=Message(role=Role.USER, content=text))
    return Event(agent=agent, session_id=session_id, body=body)


def post(session_id: str, ref: str) -> Event:
    body = InboxPosted(message=Message(role=Role.USER, content="hi", message_ref=ref))
    return Event(agent="main", session_id=session_id, body=body)


def texts(events: list[Event]) -> list[str]:
    found = []
    for event in events:
        assert isinstance(event.body, MessageAppended | InboxPosted)
        assert event.body.message is not None
        found.append(event.body.message.content)
    return found


@contextmanager
def migrated_core(url: str) -> Iterator[Core]:
    """The session core on the database at `url`, migrated, as the server builds it."""
    settings = DatabaseSettings(url=url)
    backend = open_backend(settings)
    migrations.prepare(backend, SESSION_SCHEMA)
    core = build_core(backend, settings)
    try:
        yield core
    finally:
        core.runner.close()


class Failed(Exception):
    """Raised inside a write transaction to roll it back."""


class EventLogContract(ABC):
    """Run by every storage backend: subclass it and give `open_core`."""

    @abstractmethod
    def open_core(self) -> AbstractContextManager[Core]:
        """A core on a fresh, migrated database of the backend (closed on exit)."""

    @pytest.fixture
    def core(self) -> Iterator[Core]:
        with self.open_core() as core:
            yield core

    # -- helpers ----------------------------------------------------------------------------

    @staticmethod
    def write(core: Core, op: Callable[[float], T]) -> T:
        return core.runner.submit_write(op).result(timeout=30)

    @staticmethod
    def read(core: Core, op: Callable[[], T]) -> T:
        return core.runner.submit_read(op).result(timeout=30)

    def append(self, core: Core, *events: Event) -> list[Event]:
        return self.write(core, lambda now: core.record(NOW, list(events)))

    # -- the contract -----------------------------------------------------------------------

    def test_an_empty_log_has_head_zero_and_reads_nothing(self, core: Core) -> None:
        log = core.store.log
        assert self.read(core, log.head) == 0
        assert self.read(core, lambda: log.read(0, 10)) == []
        assert self.read(core, lambda: log.read_page(0, None, 10, 1 << 20)) == ([], False)
        assert self.read(core, lambda: log.entity_events(session_entity("s-1"), 0)) == []

    def test_appends_take_the_next_sequences_and_read_back_as_written(self, core: Core) -> None:
        first = self.append(core, message("s-1", "one"), message("s-1", "two"))
        second = self.append(core, message("s-2", "three"))
        assert [e.sequence for e in first + second] == [1, 2, 3]
        assert all(e.time == int(NOW * 1e9) for e in first + second)
        log = core.store.log
        assert self.read(core, log.head) == 3
        read = self.read(core, lambda: log.read(0, 10))
        assert read == first + second, "every field of every event, as appended"
        assert [e.sequence for e in self.read(core, lambda: log.read(1, 1))] == [2]

    def test_a_rolled_back_append_leaves_no_trace_and_no_gap(self, core: Core) -> None:
        self.append(core, message("s-1", "kept"))

        def failing(now: float) -> None:
            core.record(now, [message("s-1", "lost"), message("s-1", "lost too")])
            raise Failed

        with pytest.raises(Failed):
            self.write(core, failing)
        log = core.store.log
        assert self.read(core, log.head) == 1
        [after] = self.append(core, message("s-1", "next"))
        assert after.sequence == 2
        assert texts(self.read(core, lambda: log.read(0, 10))) == ["kept", "next"]

    def test_concurrent_appenders_get_dense_unique_sequences(self, core: Core) -> None:
        writers, each = 4, 5
        logged: list[list[Event]] = [[] for _ in range(writers)]

        def writer(number: int) -> None:
            for n in range(each):
                logged[number] += self.append(core, message(f"s-{number}", f"{number}.{n}"))

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        sequences = sorted(e.sequence for events in logged for e in events)
        assert sequences == list(range(1, writers * each + 1))
        read = self.read(core, lambda: core.store.log.read(0, 100))
        assert [e.sequence for e in read] == sequences
        for events in logged:  # each writer's appends in its own order
            assert [e.sequence for e in events] == sorted(e.sequence for e in events)

    def test_reads_filter_by_agent_and_session_and_keep_rewind_records(self, core: Core) -> None:
        self.append(
            core,
            message("s-1", "a", agent="main"),
            message("s-2", "b", agent="other"),
            Event(body=Rewound(to_sequence=1)),
            message("s-1", "c", agent="main"),
        )
        log = core.store.log

        def kinds(**where: Any) -> list[str]:
            return [e.body.kind for e in self.read(core, lambda: log.read(0, 10, **where))]

        assert kinds(agent="main") == ["message_appended", "rewound", "message_appended"]
        assert kinds(session_id="s-2") == ["message_appended", "rewound"]
        page, more = self.read(core, lambda: log.read_page(0, None, 10, 1 << 20, agent="other"))
        assert [e.sequence for e in page] == [2, 3] and not more

    def test_a_page_stops_at_its_byte_budget_but_always_holds_one(self, core: Core) -> None:
        big = "x" * 2000
        self.append(core, *(message("s-1", f"{n}{big}") for n in range(5)))
        log = core.store.log
        one, more = self.read(core, lambda: log.read_page(0, None, 10, 10))
        assert [e.sequence for e in one] == [1] and more, "the first comes past the budget"
        size = len(storage_format.encode_event(one[0]))
        # A row comes when the page's bytes before it are under the budget.
        three, more = self.read(core, lambda: log.read_page(0, None, 10, 3 * size))
        assert [e.sequence for e in three] == [1, 2, 3] and more
        rest, more = self.read(core, lambda: log.read_page(3, None, 10, 1 << 20))
        assert [e.sequence for e in rest] == [4, 5] and not more
        bounded, more = self.read(core, lambda: log.read_page(0, 2, 10, 1 << 20))
        assert [e.sequence for e in bounded] == [1, 2] and not more

    def test_entity_events_are_one_entitys_after_a_sequence_up_to_a_bound(self, core: Core) -> None:
        self.append(
            core,
            Event(agent="main", body=MessageAppended(message=Message(content="agent's"))),
            message("s-1", "one"),
            message("s-2", "elsewhere"),
            message("s-1", "two"),
            message("s-1", "three"),
        )
        log = core.store.log
        assert texts(self.read(core, lambda: log.entity_events(session_entity("s-1"), 0))) == [
            "one",
            "two",
            "three",
        ]
        assert texts(self.read(core, lambda: log.entity_events(session_entity("s-1"), 2, 4))) == [
            "two"
        ]
        agent = self.read(core, lambda: log.entity_events(agent_entity("main"), 0))
        assert texts(agent) == ["agent's"], "an agent's events are those of no session"

    def test_a_session_accepts_one_post_per_message_ref(self, core: Core) -> None:
        [posted] = self.append(core, post("s-1", "m-1"))
        log = core.store.log
        assert self.read(core, lambda: log.accepted_post("s-1", "m-1")) == posted
        assert self.read(core, lambda: log.accepted_post("s-1", "m-2")) is None
        assert self.read(core, lambda: log.accepted_post("s-2", "m-1")) is None
        with pytest.raises(Exception, match=r"(?i)unique|duplicate"):
            self.append(core, post("s-1", "m-1"))
        assert self.read(core, log.head) == 1, "the refused append wrote nothing"
        self.append(core, post("s-2", "m-1"))  # another session's ref is its own

    def test_sequences_are_active_unless_a_move_abandons_them(self, core: Core) -> None:
        self.append(core, message("s-1", "one"), message("s-1", "two"))
        log, markers = core.store.log, core.store.markers
        assert self.read(core, lambda: [log.is_active(seq) for seq in (0, 1, 2, 99)]) == [
            True,
            True,
            True,
            True,
        ]
        self.write(core, lambda now: markers.mark(2, 2, active=False))
        assert self.read(core, lambda: log.is_active(2)) is False
        assert self.read(core, lambda: log.abandoned_among([1, 2])) == {2}
        assert texts(self.read(core, lambda: log.entity_events(session_entity("s-1"), 0))) == [
            "one"
        ], "states fold active events only"

    # -- the stores beside the log: snapshots, routes, checkpoints ---------------------------

    def test_a_snapshot_read_is_the_newest_active_one_at_or_before_a_bound(
        self, core: Core
    ) -> None:
        self.append(core, *(message("s-1", text) for text in ("one", "two", "three")))
        entity, snapshots = session_entity("s-1"), core.store.snapshots

        def state(version: int) -> SessionState:
            return SessionState(session=Session(session_id="s-1", agent="main", version=version))

        self.write(core, lambda now: snapshots.save_snapshot(entity, 1, state(1)))
        self.write(core, lambda now: snapshots.save_snapshot(entity, 3, state(3)))
        latest = snapshots.latest_snapshot
        assert self.read(core, lambda: latest(entity, SessionState)) == (3, state(3))
        assert self.read(core, lambda: latest(entity, SessionState, until=2)) == (1, state(1))
        assert self.read(core, lambda: latest(session_entity("s-2"), SessionState)) is None
        self.write(core, lambda now: core.store.markers.mark(3, 3, active=False))
        assert self.read(core, lambda: latest(entity, SessionState)) == (1, state(1)), (
            "a snapshot at an abandoned sequence describes a state that no longer exists"
        )

    def test_a_routing_key_is_claimed_once_per_agent_and_moves_only_when_set(
        self, core: Core
    ) -> None:
        routes = core.store.projections
        claim = routes.claim_route
        assert self.write(core, lambda now: claim("main", "k", "s-1")) is True
        assert self.write(core, lambda now: claim("main", "k", "s-2")) is False
        assert self.write(core, lambda now: claim("other", "k", "s-3")) is True
        assert self.read(core, lambda: routes.route("main", "k")) == "s-1"
        self.write(core, lambda now: routes.drop_route("main", "k", "s-2"))
        assert self.read(core, lambda: routes.route("main", "k")) == "s-1", (
            "a drop names the session it expects the key to point to"
        )
        self.write(core, lambda now: routes.set_route("main", "k", "s-2"))
        assert self.read(core, lambda: routes.route("main", "k")) == "s-2"
        self.write(core, lambda now: routes.drop_route("main", "k", "s-2"))
        assert self.read(core, lambda: routes.route("main", "k")) is None
        assert self.read(core, lambda: routes.route("other", "k")) == "s-3"

    def test_racing_claimers_of_one_routing_key_have_one_winner(self, core: Core) -> None:
        claim = core.store.projections.claim_route

        def claimer(n: int) -> Callable[[float], bool]:
            return lambda now: claim("main", "k", f"s-{n}")

        futures = [core.runner.submit_write(claimer(n)) for n in range(8)]
        won = [n for n, future in enumerate(futures) if future.result(timeout=30)]
        assert len(won) == 1, won
        route = self.read(core, lambda: core.store.projections.route("main", "k"))
        assert route == f"s-{won[0]}"

    def test_a_checkpoint_label_is_taken_once(self, core: Core) -> None:
        markers = core.store.markers
        assert self.write(core, lambda now: markers.add_checkpoint("before", 1, NOW)) is True
        assert self.write(core, lambda now: markers.add_checkpoint("before", 2, NOW)) is False
        assert self.read(core, lambda: markers.checkpoint("before")) == ("before", 1, NOW)
        assert self.read(core, lambda: markers.checkpoint("after")) is None
