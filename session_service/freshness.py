"""The freshness and reset rules of continuity (pure: no storage).

A resume mark older than the agent's window is stale (1 hour by default; zero
or less turns the gate off; `never_resume` turns resuming off). Idle and daily
resets apply only when the agent opts in.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from session_service.records import AgentSettings, ResetMode, ResetPolicy, ResumePolicy, Session

DEFAULT_FRESHNESS_S = 3600.0
EXPIRED = "resume_pending_expired"


def _freshness_window(resume: ResumePolicy) -> float:
    if resume.freshness_window is not None:
        return resume.freshness_window / 1e9
    return DEFAULT_FRESHNESS_S


def is_stale(settings: AgentSettings | None, session: Session, now: float) -> bool:
    """A resume mark older than the window; never with the gate off (window <= 0)."""
    resume = (settings.resume if settings is not None else None) or ResumePolicy()
    if not session.resume_pending or resume.never_resume:
        return False
    window = _freshness_window(resume)
    marked = (session.resume_marked_time or 0) / 1e9
    return window > 0 and now - marked > window


def reset_reason(settings: AgentSettings | None, session: Session, now: float) -> str | None:
    """Why routing a new message should reset this session first, if it should."""
    if session.suspended:
        return None
    if is_stale(settings, session, now):
        return EXPIRED
    policy = (settings.reset if settings is not None else None) or ResetPolicy()
    last_activity = (session.update_time or 0) / 1e9
    idle_for = now - last_activity
    if (
        policy.mode == ResetMode.IDLE
        and policy.idle_after is not None
        and idle_for > policy.idle_after / 1e9
    ):
        return "idle"
    if policy.mode == ResetMode.DAILY:
        boundary = datetime.fromtimestamp(now, UTC).replace(
            hour=policy.daily_at_hour % 24, minute=0, second=0, microsecond=0
        )
        if boundary.timestamp() > now:
            boundary -= timedelta(days=1)
        if last_activity < boundary.timestamp():
            return "daily"
    return None
