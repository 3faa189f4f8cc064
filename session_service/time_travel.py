"""Time travel: checkpoints, the global rewind, checkout and log retention.

A rewind is a global cut: one write transaction appends a rewind record at R,
abandons (target, R) for every agent and session at once (see `timeline`),
and recomputes the projections of everything the cut touched. Appends are
serialized with it by the same write lock, so each lands wholly before the
cut (abandoned) or wholly after it (kept). A crash mid-rewind rolls the whole
transaction back.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from session_service import replay
from session_service.core import Core
from session_service.records import Agent, Checkpoint, Event, RewindApplied, Rewound, SessionState
from session_service.storage.event_log import agent_entity, session_entity
from session_service.timeline import Changes, Timeline, changes
from switchboard.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OutOfRange,
)
from switchboard.idempotency import RequestGuard

_LABEL = re.compile(r"[\w.:-]{1,128}", re.ASCII)


def _checked_label(field: str, label: str) -> str:
    if not _LABEL.fullmatch(label):
        raise InvalidArgument(field, "must be 1-128 letters, digits, '_', '.', ':' or '-'")
    return label


def _checked_target(sequence: int | None, empty_log: bool, goal: str) -> None:
    """Sequence 0, the empty log, is reached only when the caller says it means it
    (`empty_log`): 0 is also what an unset field reads as, and what a caller's
    mistake computes, and a move there abandons every agent and session at once."""
    if sequence == 0 and not empty_log:
        raise InvalidArgument(
            "sequence",
            f"give the sequence to {goal}; 0 is the empty log (every agent and session "
            "abandoned) and must be asked for explicitly with empty_log=true",
        )
    if empty_log and sequence != 0:
        raise InvalidArgument(
            "empty_log",
            "goes with sequence 0 only (the empty log); leave it unset for any other target",
        )


#: Agents and sessions a move's answer lists; the totals count them all.
MAX_LISTED_EFFECTS = 1000


@dataclass(frozen=True)
class EntityEffect:
    """What a move does to one agent's own events (session_id "") or one session."""

    agent: str
    session_id: str
    abandoned: int = 0
    restored: int = 0

    @property
    def counted(self) -> bool:
        return bool(self.abandoned or self.restored)

    def adding(self, count: int, *, restored: bool) -> EntityEffect:
        if restored:
            return replace(self, restored=self.restored + count)
        return replace(self, abandoned=self.abandoned + count)


@dataclass(frozen=True)
class Move:
    """A rewind's or checkout's answer: what it did, or in preview what it would do."""

    #: The sequence whose state is (or would be) current.
    to_sequence: int
    #: The record logged; None in preview and when nothing changed.
    record: Event | None
    #: Nothing after the target was active (nothing to restore): nothing written.
    unchanged: bool
    #: Agents and sessions whose events move, at most `MAX_LISTED_EFFECTS`.
    listed: tuple[EntityEffect, ...]
    #: How many agents and sessions change in all (listed or not).
    changed: int
    abandoned: int
    restored: int


def _answer(target: int, effects: list[EntityEffect], record: Event | None) -> Move:
    counted = [effect for effect in effects if effect.counted]
    return Move(
        to_sequence=target,
        record=record,
        unchanged=not counted,
        listed=tuple(counted[:MAX_LISTED_EFFECTS]),
        changed=len(counted),
        abandoned=sum(effect.abandoned for effect in counted),
        restored=sum(effect.restored for effect in counted),
    )


def checkpoint_of(label: str, seq: int, created_at: float) -> Checkpoint:
    """A checkpoint as its row keeps it (`created_at`: epoch seconds)."""
    return Checkpoint(label=label, sequence=seq, create_time=round(created_at * 1e9))


class TimeTravel:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.store = core.store
        self.projection = core.projection

    # -- checkpoints ------------------------------------------------------------------------

    async def create_checkpoint(
        self, label: str, *, guard: RequestGuard | None = None
    ) -> Checkpoint:
        _checked_label("label", label)

        def op(now: float) -> Checkpoint:
            head = self.store.log.head()
            if not self.store.markers.add_checkpoint(label, head, now):
                raise AlreadyExists("CHECKPOINT_EXISTS", f"checkpoint {label!r} exists already")
            return checkpoint_of(label, head, now)

        result: Checkpoint = await self.core.write(op, guard=guard)
        return result

    # -- moving the log ---------------------------------------------------------------------

    async def rewind(
        self,
        sequence: int | None,
        checkpoint: str,
        preview: bool = False,
        empty_log: bool = False,
        principal: str = "",
        *,
        guard: RequestGuard | None = None,
    ) -> Move:
        """Abandons everything after the target. Nothing to abandon: nothing is
        written and the answer says so (`Move.unchanged`). Target sequence 0 needs
        `empty_log` (see `_checked_target`). `principal`: who asked, kept in the record."""
        if sequence is None and not checkpoint:
            raise InvalidArgument("target", "give a sequence or a checkpoint label")
        _checked_target(sequence, empty_log, "rewind to")
        if checkpoint:
            _checked_label("checkpoint", checkpoint)
        plan = functools.partial(self._rewind_plan, sequence, checkpoint)
        record = Rewound(checkpoint=checkpoint, principal=principal)
        return await self._run(plan, record, preview=preview, guard=guard)

    async def checkout(
        self,
        sequence: int,
        preview: bool = False,
        empty_log: bool = False,
        principal: str = "",
        *,
        guard: RequestGuard | None = None,
    ) -> Move:
        """Sequence 0 needs `empty_log` (see `_checked_target`). `principal`: who asked,
        kept in the record."""
        _checked_target(sequence, empty_log, "check out")
        plan = functools.partial(self._checkout_plan, sequence)
        return await self._run(
            plan, Rewound(checkout=True, principal=principal), preview=preview, guard=guard
        )

    def rewind_within(self, now: float, sequence: int) -> Move:
        """A rewind inside the caller's write transaction (for building long logs)."""
        plan = functools.partial(self._rewind_plan, sequence, "")
        return self._moved(now, plan, Rewound())

    def _rewind_plan(self, sequence: int | None, checkpoint: str) -> tuple[int, Changes]:
        target = sequence
        if target is None:
            found = self.store.markers.checkpoint(checkpoint)
            if found is None:
                raise NotFound("CHECKPOINT_NOT_FOUND", f"checkpoint {checkpoint!r} does not exist")
            target = found[1]
        self._check_reachable(target)
        target = self._outside_tool_cycles(target)
        if not self.store.log.is_active(target):
            raise FailedPrecondition(
                "REWIND_INTO_ABANDONED",
                f"sequence {target} lies on an abandoned branch; Checkout can go there",
            )
        # The target is active, so no active record after it reaches below it: the
        # log up to the target stays as it is, and only what follows is abandoned.
        return target, Changes(abandoned=((target + 1, self.store.log.head()),))

    def _checkout_plan(self, sequence: int) -> tuple[int, Changes]:
        self._check_reachable(sequence)
        # Onto an abandoned branch, earlier rewinds may count for nothing any more:
        # the whole timeline before and after (arithmetic in memory), then only the
        # ranges whose status differs are read and written.
        records = self.store.markers.rewind_records()
        before = Timeline.from_records(records)
        after = Timeline.from_records([*records, (self.store.log.head() + 1, sequence)])
        return sequence, changes(before, after)

    async def _run(
        self,
        plan: Callable[[], tuple[int, Changes]],
        record: Rewound,
        *,
        preview: bool,
        guard: RequestGuard | None,
    ) -> Move:
        """`record`: the rewind record to log, but for its target (the plan's)."""

        def look() -> Move:
            target, planned = plan()
            return _answer(target, self._effects(planned), record=None)

        if preview:
            # The plan and each range's effects, as of one state of the log.
            previewed: Move = await self.core.runner.read(look, consistent=True)
            return previewed
        moved: Move = await self.core.write(
            functools.partial(self._moved, plan=plan, record=record), guard=guard
        )
        return moved

    def _moved(self, now: float, plan: Callable[[], tuple[int, Changes]], record: Rewound) -> Move:
        target, planned = plan()
        effects = self._effects(planned)
        if not any(effect.counted for effect in effects):
            return _answer(target, effects, record=None)
        logged = self._move(now, replace(record, to_sequence=target), planned, effects)
        return _answer(target, effects, record=logged)

    def _check_reachable(self, target: int) -> None:
        head = self.store.log.head()
        if target > head:
            raise OutOfRange(
                "SEQUENCE_AHEAD_OF_LOG", f"sequence {target} is past the log head {head}"
            )
        retained = self.store.markers.retained_from()
        if target < retained:
            raise OutOfRange(
                "REWIND_BEYOND_RETENTION",
                f"sequence {target} is below the retained log, which starts at {retained}",
            )

    def _outside_tool_cycles(self, target: int) -> int:
        """A cut between a tool call and its result would leave the call dangling:
        move it back to just before the message that requested the call."""
        while True:
            starts = [
                self.store.markers.earliest_request(session_id, call_ids, target)
                for session_id, call_ids in self.store.markers.tool_results_after(target).items()
            ]
            earliest = min((start for start in starts if start is not None), default=None)
            if earliest is None:
                return target
            target = earliest - 1

    def _effects(self, planned: Changes) -> list[EntityEffect]:
        """Per agent and session, the events the planned changes move (read from the
        rows in the changed ranges only)."""
        found: dict[tuple[str, str], EntityEffect] = {}
        for ranges, now_active in ((planned.abandoned, True), (planned.restored, False)):
            for first, last in ranges:
                if first > last:
                    continue
                for agent, session_id, count in self.store.markers.move_effect(
                    first, last, now_active
                ):
                    effect = found.get((agent, session_id), EntityEffect(agent, session_id))
                    found[(agent, session_id)] = effect.adding(count, restored=not now_active)
        return [found[key] for key in sorted(found)]

    def _move(
        self, now: float, rewound: Rewound, planned: Changes, effects: list[EntityEffect]
    ) -> Event:
        [logged] = self.core.record(now, [Event(body=rewound)])
        self.store.markers.add_rewind(logged.sequence, rewound.to_sequence)
        for first, last in planned.abandoned:
            self.store.markers.mark(first, last, active=False)
        for first, last in planned.restored:
            self.store.markers.mark(first, last, active=True)
        # Only agents and sessions with events whose status changed have another state.
        sessions = sorted({e.session_id for e in effects if e.session_id})
        agents = sorted({e.agent for e in effects if not e.session_id})
        session_states = {sid: self.store.states.session_state(sid) for sid in sessions}
        agent_states = {name: self.store.states.agent_state(name) for name in agents}
        self._move_versions_forward(now, logged.sequence, session_states, agent_states)
        self.projection.refresh_sessions(session_states)
        for name, agent in agent_states.items():
            self.projection.refresh_agent(name, agent)
        # Hook (issue 23): records, retractions, scoped state and sessions by user
        # follow the marks (see `framework_projection.FrameworkProjection.moved`).
        self.projection.framework.moved(planned, session_states)
        return logged

    def _move_versions_forward(
        self,
        now: float,
        rewind_sequence: int,
        session_states: dict[str, SessionState | None],
        agent_states: dict[str, Agent | None],
    ) -> None:
        """Logs a RewindApplied for each agent and session the move changed, with a
        version above every version it ever had, and folds it into its state: a
        version read before the move can never match after it (no ABA)."""
        applied = RewindApplied(rewind_sequence=rewind_sequence)
        events = [
            Event(
                agent=state.session.agent,
                session_id=session_id,
                session_version=self.store.markers.highest_version(session_entity(session_id)) + 1,
                body=applied,
            )
            for session_id, state in session_states.items()
            if state is not None and state.session is not None
        ]
        events += [
            Event(
                agent=name,
                agent_version=self.store.markers.highest_version(agent_entity(name)) + 1,
                body=applied,
            )
            for name, agent in agent_states.items()
            if agent is not None
        ]
        if not events:
            return
        for event in self.core.record(now, events):
            if event.session_id:
                state = session_states[event.session_id]
                assert state is not None
                replay.apply_to_session(state, event)
            else:
                agent = agent_states[event.agent]
                assert agent is not None
                replay.apply_to_agent(agent, event)

    # -- retention --------------------------------------------------------------------------

    async def truncate(self, below: int, *, guard: RequestGuard | None = None) -> tuple[int, int]:
        if below == 0:  # what an unset field reads as
            raise InvalidArgument(
                "below_sequence",
                "give the lowest sequence to keep: events below it are deleted "
                "(0 would delete nothing)",
            )

        def op(_now: float) -> tuple[int, int]:
            self._check_reachable(below)
            blocking = self.store.markers.entities_needing_events_below(below)
            # Hook (issue 23): stored records keep their payloads in the log rows.
            blocking += self.projection.framework.truncating(below)
            if blocking:
                raise FailedPrecondition(
                    "SNAPSHOT_NEEDED",
                    f"{len(blocking)} agent(s)/session(s) have no snapshot that makes the events "
                    f"below {below} unnecessary (e.g. {sorted(blocking)[0]}); snapshot them "
                    "first or truncate lower",
                )
            self.projection.framework.keep_state_below(below)  # hook (issue 23)
            deleted = self.store.markers.truncate_below(below)
            return below, deleted

        result: tuple[int, int] = await self.core.write(op, guard=guard)
        return result
