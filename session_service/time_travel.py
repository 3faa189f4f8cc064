"""Time travel: checkpoints, the global rewind, checkout and log retention.

A rewind is a global cut: one write transaction appends a rewind record at R,
abandons (target, R) for every agent and session at once (see `timeline`),
and recomputes the projections of everything the cut touched. Appends are
serialized with it by the same write lock, so each lands wholly before the
cut (abandoned) or wholly after it (kept). A crash mid-rewind rolls the whole
transaction back.
"""

from __future__ import annotations

import re

from session_service import replay
from session_service.log_store import AgentIndex, SessionIndex, agent_entity, session_entity
from session_service.sessions import Sessions
from switchboard.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OutOfRange,
)
from switchboard.proto_time import timestamp
from switchboard.session.v1 import session_service_pb2 as pb

_LABEL = re.compile(r"[\w.:-]{1,128}", re.ASCII)


def _checked_label(field: str, label: str) -> str:
    if not _LABEL.fullmatch(label):
        raise InvalidArgument(field, "must be 1-128 letters, digits, '_', '.', ':' or '-'")
    return label


def _checkpoint_pb(label: str, seq: int, created_at: float) -> pb.Checkpoint:
    return pb.Checkpoint(label=label, sequence=seq, create_time=timestamp(created_at))


class TimeTravel:
    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions
        self.store = sessions.store

    # -- checkpoints ------------------------------------------------------------------------

    async def create_checkpoint(self, label: str) -> pb.Checkpoint:
        _checked_label("label", label)

        def op(now: float) -> pb.Checkpoint:
            head = self.store.head()
            if not self.store.add_checkpoint(label, head, now):
                raise AlreadyExists("CHECKPOINT_EXISTS", f"checkpoint {label!r} exists already")
            return _checkpoint_pb(label, head, now)

        result: pb.Checkpoint = await self.sessions.runner.write(op)
        return result

    async def list_checkpoints(self) -> list[pb.Checkpoint]:
        rows = await self.sessions.runner.read(self.store.checkpoints)
        return [_checkpoint_pb(*row) for row in rows]

    # -- moving the log ---------------------------------------------------------------------

    async def rewind(self, sequence: int | None, checkpoint: str) -> pb.Event:
        if sequence is None and not checkpoint:
            raise InvalidArgument("target", "give a sequence or a checkpoint label")
        if checkpoint:
            _checked_label("checkpoint", checkpoint)

        def op(now: float) -> pb.Event:
            target = sequence
            if target is None:
                found = self.store.checkpoint(checkpoint)
                if found is None:
                    raise NotFound(
                        "CHECKPOINT_NOT_FOUND", f"checkpoint {checkpoint!r} does not exist"
                    )
                target = found[1]
            self._check_reachable(target)
            target = self._outside_tool_cycles(target)
            if not self.store.timeline().is_active(target):
                raise FailedPrecondition(
                    "REWIND_INTO_ABANDONED",
                    f"sequence {target} lies on an abandoned branch; Checkout can go there",
                )
            if not self.store.has_active_events_after(target):
                already = self._latest_record()
                if already is not None:
                    return already  # the log is already there: repeating is idempotent
            return self._move(now, target, checkout=False, checkpoint=checkpoint)

        result: pb.Event = await self.sessions.write(op)
        return result

    async def checkout(self, sequence: int) -> pb.Event:
        def op(now: float) -> pb.Event:
            self._check_reachable(sequence)
            return self._move(now, sequence, checkout=True, checkpoint="")

        result: pb.Event = await self.sessions.write(op)
        return result

    def _check_reachable(self, target: int) -> None:
        head = self.store.head()
        if target > head:
            raise OutOfRange(
                "SEQUENCE_AHEAD_OF_LOG", f"sequence {target} is past the log head {head}"
            )
        retained = self.store.retained_from()
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
                self.store.earliest_request(session_id, call_ids, target)
                for session_id, call_ids in self.store.tool_results_after(target).items()
            ]
            earliest = min((start for start in starts if start is not None), default=None)
            if earliest is None:
                return target
            target = earliest - 1

    def _latest_record(self) -> pb.Event | None:
        records = self.store.rewind_events()
        timeline = self.store.timeline()
        active = [record for record in records if timeline.is_active(record.sequence)]
        return active[-1] if active else None

    def _move(self, now: float, target: int, *, checkout: bool, checkpoint: str) -> pb.Event:
        before = self.store.timeline()
        record = pb.Event(
            rewound=pb.Rewound(to_sequence=target, checkout=checkout, checkpoint=checkpoint)
        )
        [logged] = self.store.append([record], now)
        after = self.store.add_rewind(logged.sequence, target)
        # Everything whose active events may differ: events after the target, and
        # any branch the new view brings back.
        revived = [low for low, high in before.abandoned if (low, high) not in after.abandoned]
        agents, sessions = self.store.touched_since(min([target, *revived]))
        session_states = {sid: self.store.session_state(sid) for sid in sorted(sessions)}
        agent_states = {name: self.store.agent_state(name) for name in sorted(agents)}
        self._move_versions_forward(now, logged.sequence, session_states, agent_states)
        self._refresh_sessions(session_states)
        for name, agent in agent_states.items():
            self._refresh_agent(name, agent)
        return logged

    def _move_versions_forward(
        self,
        now: float,
        rewind_sequence: int,
        session_states: dict[str, pb.SessionState | None],
        agent_states: dict[str, pb.Agent | None],
    ) -> None:
        """Logs a RewindApplied for each agent and session the move changed, with a
        version above every version it ever had, and folds it into its state: a
        version read before the move can never match after it (no ABA)."""
        applied = pb.RewindApplied(rewind_sequence=rewind_sequence)
        events = [
            pb.Event(
                agent=state.session.agent,
                session_id=session_id,
                session_version=self.store.highest_version(session_entity(session_id)) + 1,
                rewind_applied=applied,
            )
            for session_id, state in session_states.items()
            if state is not None
        ]
        events += [
            pb.Event(
                agent=name,
                agent_version=self.store.highest_version(agent_entity(name)) + 1,
                rewind_applied=applied,
            )
            for name, agent in agent_states.items()
            if agent is not None
        ]
        if not events:
            return
        for event in self.store.append(events, now):
            if event.session_id:
                state = session_states[event.session_id]
                assert state is not None
                replay.apply_to_session(state, event)
            else:
                agent = agent_states[event.agent]
                assert agent is not None
                replay.apply_to_agent(agent, event)

    def _refresh_sessions(self, states: dict[str, pb.SessionState | None]) -> None:
        self.store.drop_routes_to(states)
        for session_id, state in states.items():
            if state is None:
                self.store.delete_session_index(session_id)  # created after the cut
                continue
            session = state.session
            self.store.put_session_index(
                SessionIndex(
                    session_id=session_id,
                    agent=session.agent,
                    routing_key=session.routing_key,
                    transport=session.source.transport,
                    status=session.status,
                    created_seq=session.create_sequence,
                    last_seq=session.last_sequence,
                    version=session.version,
                    snapshot_version=session.version,
                    resume_pending=session.resume_pending,
                )
            )
            if session.routing_key and session.status == pb.SESSION_STATUS_OPEN:
                self.store.set_route(session.agent, session.routing_key, session_id)

    def _refresh_agent(self, name: str, agent: pb.Agent | None) -> None:
        if agent is None:
            self.store.delete_agent_index(name)  # created after the cut
            return
        self.store.put_agent_index(
            AgentIndex(
                name=name,
                archived=agent.archived,
                version=agent.version,
                last_seq=agent.last_sequence,
                snapshot_version=agent.version,
            )
        )

    # -- retention --------------------------------------------------------------------------

    async def truncate(self, below: int) -> tuple[int, int]:
        def op(_now: float) -> tuple[int, int]:
            self._check_reachable(below)
            blocking = self.store.entities_needing_events_below(below)
            if blocking:
                raise FailedPrecondition(
                    "SNAPSHOT_NEEDED",
                    f"{len(blocking)} agent(s)/session(s) have no snapshot that makes the events "
                    f"below {below} unnecessary (e.g. {sorted(blocking)[0]}); snapshot them "
                    "first or truncate lower",
                )
            deleted = self.store.truncate_below(below)
            return below, deleted

        result: tuple[int, int] = await self.sessions.runner.write(op)
        return result
