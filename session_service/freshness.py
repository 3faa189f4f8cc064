"""The freshness and reset rules of continuity (pure: no storage).

A resume mark older than the agent's window is stale (1 hour by default; zero
or less turns the gate off; `never_resume` turns resuming off). Idle and daily
resets apply only when the agent opts in.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from switchboard.proto_time import seconds_of
from switchboard.session.v1 import session_service_pb2 as pb

DEFAULT_FRESHNESS_S = 3600.0
EXPIRED = "resume_pending_expired"


def _freshness_window(settings: pb.AgentSettings) -> float:
    if settings.resume.HasField("freshness_window"):
        return seconds_of(settings.resume.freshness_window)
    return DEFAULT_FRESHNESS_S


def is_stale(settings: pb.AgentSettings, session: pb.Session, now: float) -> bool:
    """A resume mark older than the window; never with the gate off (window <= 0)."""
    if not session.resume_pending or settings.resume.never_resume:
        return False
    window = _freshness_window(settings)
    marked = session.resume_marked_time.ToNanoseconds() / 1e9
    return window > 0 and now - marked > window


def reset_reason(settings: pb.AgentSettings, session: pb.Session, now: float) -> str | None:
    """Why routing a new message should reset this session first, if it should."""
    if session.suspended:
        return None
    if is_stale(settings, session, now):
        return EXPIRED
    policy = settings.reset
    last_activity = session.update_time.ToNanoseconds() / 1e9
    idle_for = now - last_activity
    if (
        policy.mode == pb.RESET_MODE_IDLE
        and policy.HasField("idle_after")
        and idle_for > seconds_of(policy.idle_after)
    ):
        return "idle"
    if policy.mode == pb.RESET_MODE_DAILY:
        boundary = datetime.fromtimestamp(now, UTC).replace(
            hour=policy.daily_at_hour % 24, minute=0, second=0, microsecond=0
        )
        if boundary.timestamp() > now:
            boundary -= timedelta(days=1)
        if last_activity < boundary.timestamp():
            return "daily"
    return None
