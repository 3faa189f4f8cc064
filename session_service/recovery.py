"""Start-up verification and the full rebuild of the projections from the log."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from session_service.sessions import Sessions
from switchboard.session.v1 import session_service_pb2 as pb


class LogCorrupt(RuntimeError):
    """The log and its head disagree: refuse to serve rather than hand out wrong sequences."""


@dataclass
class RebuildReport:
    events: int = 0
    differences: dict[str, int] = field(default_factory=dict)

    @property
    def differed(self) -> bool:
        return any(self.differences.values())


def verify(sessions: Sessions) -> int:
    """Cheap checks at start: the head counter equals the newest logged event.

    Projections are written in the same transactions as the events, so a
    crash cannot leave them behind; `rebuild` is the full check.
    """
    store = sessions.store
    with store.database.connection_context():
        head, newest = store.head(), store.max_logged_seq()
    if head != newest:
        raise LogCorrupt(
            f"the log head says {head} but the newest event is {newest}: "
            "run `switchboard session rebuild` after inspecting the database"
        )
    return head


def rebuild(
    sessions: Sessions, progress: Callable[[int, int], None] | None = None
) -> RebuildReport:
    """Replays the whole active log into fresh projections in one write transaction.

    Reports how many projection rows differed from what was there before.
    """
    store = sessions.store
    report = RebuildReport()

    def op(_now: float) -> RebuildReport:
        total = store.event_count()
        before = store.projection_rows()
        store.clear_projections()
        batch: list[pb.Event] = []
        for event in store.active_events():
            batch.append(event)
            if len(batch) == 1000:
                sessions.project(batch)
                report.events += len(batch)
                batch = []
                if progress is not None:
                    progress(report.events, total)
        sessions.project(batch)
        report.events += len(batch)
        if progress is not None:
            progress(report.events, total)
        after = store.projection_rows()
        for name in before:
            report.differences[name] = len(before[name] ^ after[name])
        return report

    return sessions.runner.submit_write(op).result()
