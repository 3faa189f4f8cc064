"""Continuity (Hermes' session behaviour): resuming interrupted turns, and the
opt-in time-based resets.

A turn cut off by a gateway crash is marked resumable. It is resumed only
while fresh (the agent's window, 1 hour by default); a stale mark resets the
session with reason "resume_pending_expired" instead of continuing hours-old
context. Suspended sessions are never auto-resumed. Idle and daily resets
exist only when an agent opts in: users were surprised by automatic resets.
"""

from __future__ import annotations

from session_service.agents import Agents
from session_service.checks import agent_name, checked_session_id
from session_service.conversations import Conversations
from session_service.core import Core
from session_service.freshness import EXPIRED, is_stale
from session_service.records import Event, ResumeMarked, Session, SuspensionChanged
from switchboard import validation
from switchboard.errors import InvalidArgument
from switchboard.idempotency import RequestGuard

#: Longest resume-mark holder id (the reference gateway's instance ids are 32 characters).
MAX_HOLDER_LEN = 128


def post_mark(mark_resumable: bool, holder: str, reply_target: bytes) -> ResumeMarked | None:
    """The resume mark a PostToInbox sets beside its post (None: it sets none)."""
    validation.path_safe_id("resume_holder", holder, max_len=MAX_HOLDER_LEN, required=False)
    validation.sealed_target("reply_target", reply_target)
    if holder and not mark_resumable:
        raise InvalidArgument(
            "resume_holder", "names the holder of a resume mark: set mark_resumable too"
        )
    if reply_target and not mark_resumable:
        raise InvalidArgument("reply_target", "is kept with a resume mark: set mark_resumable too")
    if not mark_resumable:
        return None
    return ResumeMarked(pending=True, holder=holder, reply_target=reply_target)


class Continuity:
    def __init__(self, core: Core, agents: Agents, conversations: Conversations) -> None:
        self.core = core
        self.agents = agents
        self.conversations = conversations

    async def mark(
        self,
        agent: str,
        session_id: str,
        pending: bool,
        holder: str = "",
        reply_target: bytes = b"",
        *,
        guard: RequestGuard | None = None,
    ) -> Session:
        # Checked even when clearing, so a request is refused or accepted as a whole;
        # a cleared mark has no holder and no reply target.
        validation.path_safe_id("holder", holder, max_len=MAX_HOLDER_LEN, required=False)
        validation.sealed_target("reply_target", reply_target)
        marked = ResumeMarked(
            pending=pending,
            holder=holder if pending else "",
            reply_target=reply_target if pending else b"",
        )
        event = Event(body=marked)
        return await self._change(agent, session_id, event, versioned=False, guard=guard)

    async def suspend(
        self, agent: str, session_id: str, suspended: bool, *, guard: RequestGuard | None = None
    ) -> Session:
        event = Event(body=SuspensionChanged(suspended=suspended))
        return await self._change(agent, session_id, event, versioned=True, guard=guard)

    async def _change(
        self,
        agent: str,
        session_id: str,
        event: Event,
        versioned: bool,
        *,
        guard: RequestGuard | None,
    ) -> Session:
        agent_name("agent", agent)
        checked_session_id(session_id)

        def op(now: float) -> Session:
            index = self.core.open_session_of(agent, session_id)
            if isinstance(event.body, SuspensionChanged) and (
                self.core.summary(session_id).suspended == event.body.suspended
            ):
                return self.core.summary(session_id)  # a retry: the version moves once
            event.agent, event.session_id = agent, session_id
            # A resume mark comes from the gateway, beside a turn: it never conflicts.
            event.session_version = index.version + (1 if versioned else 0)
            self.core.log(now, [event])
            return self.core.summary(session_id)

        result: Session = await self.core.write(op, guard=guard)
        return result

    async def list_resumable(self, agent: str) -> tuple[list[Session], list[Session]]:
        """(fresh, stale) interrupted sessions of the agent, oldest mark first. A read:
        stale ones are reported, and reset only by `expire_resumable` (or routing)."""
        agent_name("agent", agent)

        def op() -> tuple[list[Session], list[Session]]:
            # Judged on the database's clock, as the writes that expire them are.
            return self._interrupted(agent, self.core.store.backend.now())

        # The agent's settings (its snapshot and events) and the marked sessions' rows.
        return await self.core.runner.read(op, consistent=True)

    async def expire_resumable(
        self, agent: str, *, guard: RequestGuard | None = None
    ) -> list[Session]:
        """Resets the agent's stale interrupted sessions, in one transaction; answers
        them as ended."""
        agent_name("agent", agent)

        def op(now: float) -> list[Session]:
            _fresh, stale = self._interrupted(agent, now)
            for session in stale:
                self.conversations.reset_now(now, agent, session.session_id, EXPIRED)
            return [self.core.summary(session.session_id) for session in stale]

        result: list[Session] = await self.core.write(op, guard=guard)
        return result

    def _interrupted(self, agent: str, now: float) -> tuple[list[Session], list[Session]]:
        settings = self.agents.live_agent(agent).settings
        if settings is not None and settings.resume is not None and settings.resume.never_resume:
            return [], []  # never resumed, and its marks never expire
        fresh: list[Session] = []
        stale: list[Session] = []
        for index in self.core.store.projections.resumable(agent):
            session = self.core.summary(index.session_id)
            if session.suspended:
                continue
            (stale if is_stale(settings, session, now) else fresh).append(session)
        return fresh, stale
