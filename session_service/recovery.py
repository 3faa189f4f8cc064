"""Start-up verification and the full rebuild of the projections from the log."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from session_service.core import Core
from session_service.records import Event


class LogCorrupt(RuntimeError):
    """The log and its head disagree: refuse to serve rather than hand out wrong sequences."""


@dataclass
class RebuildReport:
    events: int = 0
    differences: dict[str, int] = field(default_factory=dict)

    @property
    def differed(self) -> bool:
        return any(self.differences.values())


def verify(core: Core) -> int:
    """Cheap checks at start: the head counter equals the newest logged event.

    Projections are written in the same transactions as the events, so a
    crash cannot leave them behind; `rebuild` is the full check.
    """
    store = core.store
    with store.database.connection_context():
        head, newest = store.log.head(), store.log.max_logged_seq()
    if head != newest:
        raise LogCorrupt(
            f"the log head says {head} but the newest event is {newest}: "
            "run `switchboard session rebuild` after inspecting the database"
        )
    return head


def fill_summaries(core: Core, batch: int = 500) -> int:
    """Gives every projection row without a summary (rows from before session migration
    `projection_summaries`) the fold of its log, a batch per write transaction; how many.

    Until then reads fold such a row whole, so serving can start at once; after it every
    row is current, since `Projection.project` folds summaries on with each event."""
    store = core.store
    agents, session_ids = core.runner.submit_read(
        store.projections.unsummarized, consistent=True
    ).result()
    for start in range(0, max(len(agents), len(session_ids)), batch):

        def op(_now: float, start: int = start) -> None:
            for name in agents[start : start + batch]:
                index = store.projections.agent_index(name)
                if index is not None:  # None: gone meanwhile (a rewind undid it)
                    store.projections.put_agent_index(replace(index, summary=None))  # None: folded
            for session_id in session_ids[start : start + batch]:
                found = store.projections.session_index(session_id)
                if found is not None:
                    store.projections.put_session_index(replace(found, summary=None))

        core.runner.submit_write(op).result()
    return len(agents) + len(session_ids)


def rebuild(core: Core, progress: Callable[[int, int], None] | None = None) -> RebuildReport:
    """Replays the whole active log into fresh projections in one write transaction.

    Reports how many projection rows differed from what was there before.
    """
    store = core.store
    report = RebuildReport()

    def op(_now: float) -> RebuildReport:
        total = store.log.replayable_event_count()
        framework = core.projection.framework  # hook (issue 23): its read models too
        before = {**store.projections.projection_rows(), **framework.rows()}
        store.projections.clear_projections()
        framework.clear()
        batch: list[Event] = []
        for event in store.log.active_events():
            batch.append(event)
            if len(batch) == 1000:
                core.projection.project(batch)
                report.events += len(batch)
                batch = []
                if progress is not None:
                    progress(report.events, total)
        core.projection.project(batch)
        report.events += len(batch)
        if progress is not None:
            progress(report.events, total)
        after = {**store.projections.projection_rows(), **framework.rows()}
        for name in before:
            report.differences[name] = len(before[name] ^ after[name])
        return report

    return core.runner.submit_write(op).result()
