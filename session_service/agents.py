"""Agents: their creation, changes and memory, all through one guarded path
(`Agents._change_agent`), and the reads of their rows and lineage."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from fnmatch import fnmatchcase
from functools import partial

from session_service import convert, permissions, replay, storage_format
from session_service.checks import MAX_AGENT_BYTES, agent_name, checked_agent
from session_service.core import Core
from session_service.records import (
    Agent,
    AgentArchived,
    AgentCreated,
    AgentUpdated,
    Event,
    MemoryDeleted,
    MemoryPut,
    PermissionEffect,
)
from session_service.storage.projections import AgentIndex, agent_summary
from switchboard import pagination, validation
from switchboard.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from switchboard.idempotency import RequestGuard


class Agents:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.store = core.store
        self.runner = core.runner

    def live_agent(self, name: str) -> Agent:
        agent = self.store.states.agent_state(name)
        if agent is None:
            raise NotFound("AGENT_NOT_FOUND", f"agent {name!r} does not exist")
        if agent.archived:
            raise FailedPrecondition("AGENT_ARCHIVED", f"agent {name!r} is archived")
        return agent

    def live_agent_summary(self, name: str) -> Agent:
        """The live agent without its memory, from its projection row (one statement):
        enough for routing, freshness and existence checks."""
        index = self.store.projections.agent_index(name)
        if index is None:
            raise NotFound("AGENT_NOT_FOUND", f"agent {name!r} does not exist")
        agent = self.agent_summary_of(index)
        if agent.archived:
            raise FailedPrecondition("AGENT_ARCHIVED", f"agent {name!r} is archived")
        return agent

    def agent_summary_of(self, index: AgentIndex) -> Agent:
        """The agent without its memory, from its projection row (a row not summarized
        yet folds the agent: see `recovery.fill_summaries`)."""
        if index.summary is None:
            agent = self.store.states.agent_state(index.name)
            assert agent is not None
            return agent_summary(agent)
        return storage_format.decode_agent_summary(index.summary)

    async def create_agent(self, agent: Agent, *, guard: RequestGuard | None = None) -> Agent:
        checked_agent(agent)
        created = copy.deepcopy(agent)
        created.archived, created.version, created.last_sequence = False, 0, 0
        created.create_time = created.update_time = None

        def op(now: float) -> Agent:
            if self.store.projections.agent_index(agent.name) is not None:
                raise AlreadyExists("AGENT_EXISTS", f"agent {agent.name!r} exists already")
            parent = self.store.states.agent_state(created.parent) if created.parent else None
            if parent is not None:
                # A record of what it may never do; the parent's current rules bind it anyway.
                inherited = [r for r in parent.permissions if r.effect == PermissionEffect.DENY]
                created.permissions.extend(r for r in inherited if r not in created.permissions)
            event = Event(agent=agent.name, body=AgentCreated(agent=created))
            return self._change_agent(now, None, event, permissions.BOUNDED_FIELDS)

        result: Agent = await self.core.write(op, guard=guard)
        return result

    async def get_agent(self, name: str) -> Agent:
        agent_name("name", name)

        def op() -> Agent:
            agent = self.store.states.agent_state(name)
            if agent is None:
                raise NotFound("AGENT_NOT_FOUND", f"agent {name!r} does not exist")
            return agent

        # A snapshot and the events after it: a rewind committed between the two would
        # pair a version of the new branch with memory of the abandoned one.
        return await self.runner.read(op, consistent=True)

    async def list_agents(
        self, include_archived: bool, page_size: int, page_token: str
    ) -> tuple[list[Agent], str]:
        size = pagination.page_size(page_size)
        position = pagination.position_of(page_token, [include_archived], str)
        after = position[0] if position else ""

        def op(may_fold: bool = True) -> tuple[list[Agent], str] | None:
            rows = self.store.projections.list_agents(after, size + 1, include_archived)
            more = len(rows) > size
            if not may_fold and any(row.summary is None for row in rows[:size]):
                return None
            agents = [self.agent_summary_of(row) for row in rows[:size]]
            token = pagination.encode([agents[-1].name], [include_archived]) if more else ""
            return agents, token

        # One statement, the page of rows, in the common case; rows without a summary yet
        # (written by a release before session migration 4) are folded from snapshots and
        # events, read again in one snapshot.
        found = await self.runner.read(partial(op, may_fold=False))
        folded = found or await self.runner.read(op, consistent=True)
        assert folded is not None
        return folded

    async def update_agent(
        self, agent: Agent, mask: Sequence[str], *, guard: RequestGuard | None = None
    ) -> Agent:
        """`mask`: the update mask's paths."""
        agent_name("agent.name", agent.name)
        if not mask:
            raise InvalidArgument("update_mask", "names no field to change")
        for path in mask:
            if path.split(".", 1)[0] not in replay.UPDATABLE_AGENT_FIELDS:
                raise InvalidArgument(
                    "update_mask",
                    f"{path!r} cannot be updated; use one of "
                    f"{', '.join(replay.UPDATABLE_AGENT_FIELDS)} (memory has PutMemory)",
                )
        if not convert.is_valid_mask(Agent, mask):
            raise InvalidArgument("update_mask", "names a field the Agent message does not have")
        checked_agent(agent)

        def op(now: float) -> Agent:
            update = AgentUpdated(agent=copy.deepcopy(agent), update_mask=list(mask))
            event = Event(agent=agent.name, body=update)
            touched = permissions.bounded_fields(mask)
            return self._change_agent(now, self.live_agent(agent.name), event, touched)

        result: Agent = await self.core.write(op, guard=guard)
        return result

    async def delete_agent(self, name: str, *, guard: RequestGuard | None = None) -> Agent:
        agent_name("name", name)

        def op(now: float) -> Agent:
            agent = self.store.states.agent_state(name)
            if agent is None:
                raise NotFound("AGENT_NOT_FOUND", f"agent {name!r} does not exist")
            if not agent.archived:
                self.core.log(now, [Event(agent=name, body=AgentArchived())])
            archived = self.store.states.agent_state(name)
            assert archived is not None
            return archived

        result: Agent = await self.core.write(op, guard=guard)
        return result

    async def put_memory(
        self, name: str, key: str, value: str, *, guard: RequestGuard | None = None
    ) -> Agent:
        agent_name("agent", name)
        validation.text("key", key, max_len=256, required=True)
        validation.text("value", value, max_len=64 * 1024, allow_newlines=True)
        event = Event(agent=name, body=MemoryPut(key=key, value=value))
        return await self._agent_change(name, key, event, guard=guard)

    async def delete_memory(
        self, name: str, key: str, *, guard: RequestGuard | None = None
    ) -> Agent:
        agent_name("agent", name)
        validation.text("key", key, max_len=256, required=True)
        event = Event(agent=name, body=MemoryDeleted(key=key))
        return await self._agent_change(name, key, event, guard=guard)

    async def _agent_change(
        self, name: str, key: str, event: Event, *, guard: RequestGuard | None
    ) -> Agent:
        def op(now: float) -> Agent:
            agent = self.live_agent(name)
            lineage = self.whole_lineage(agent) if agent.parent else permissions.Ancestry()
            rules = [r for a in (agent, *lineage.agents) for r in a.permissions]
            if any(fnmatchcase("memory.write", rule.action) for rule in rules):
                # The rules of the agent or an ancestor speak of memory writes: they go
                # through the gate, every ancestor's layer included.
                decision = permissions.decide(agent, (), "memory.write", f"memory:{key}", lineage)
                if not decision.allowed:
                    raise PermissionDenied(
                        "PERMISSION_DENIED", f"memory.write on {key!r}: {decision.reason}"
                    )
            return self._change_agent(now, agent, event, frozenset(), lineage)

        result: Agent = await self.core.write(op, guard=guard)
        return result

    def _change_agent(
        self,
        now: float,
        before: Agent | None,
        event: Event,
        touched: frozenset[str],
        lineage: permissions.Ancestry | None = None,
    ) -> Agent:
        """The one path every change of an agent takes (creation, update, memory): the
        agent as the event leaves it must fit the size limit and, for a sub-agent, have
        a whole lineage and stay within every ancestor in the `touched` fields; only
        then is the event logged. `lineage`: the ancestors, when the caller read them."""
        # The fold replaces what it changes but the memory, which it edits in place.
        after = replace(before, memory=dict(before.memory)) if before is not None else Agent()
        replay.apply_to_agent(after, event)
        size = convert.encoded_size(after)
        if size > MAX_AGENT_BYTES:
            raise FailedPrecondition(
                "AGENT_TOO_LARGE",
                f"agent {after.name!r} would be {size} bytes encoded; the limit is "
                f"{MAX_AGENT_BYTES}: delete memory entries (DeleteMemory) to make room",
            )
        if after.parent:
            lineage = lineage or self.whole_lineage(after)
            found = permissions.excess(after, lineage.agents, touched)
            if found is not None:
                raise FailedPrecondition(
                    "EXCEEDS_PARENT",
                    f"{found.field}: sub-agent {after.name!r} may not exceed its ancestors: "
                    f"{found.message}",
                    {"field": found.field},
                )
        self.core.log(now, [event])
        return self.live_agent(after.name)

    def lineage(self, agent: Agent) -> permissions.Ancestry:
        """The agent's ancestors as they are now (one read each)."""
        return permissions.ancestry(agent, self.store.states.agent_state)

    def whole_lineage(self, agent: Agent) -> permissions.Ancestry:
        """The sub-agent's ancestors; FAILED_PRECONDITION naming the break when the chain
        is not whole (a change must not leave or keep a sub-agent hanging off nothing)."""
        lineage = self.lineage(agent)
        if lineage.broken:
            raise FailedPrecondition(
                lineage.reason,
                f"agent.parent: sub-agent {agent.name!r} (parent {agent.parent!r}): "
                f"{lineage.broken}; give it a live parent (UpdateAgent parent) or none",
                {"field": "agent.parent"},
            )
        return lineage
