"""Pages of the log for people: a session's history (a fork's included, through its
lineage) and the operator's log pages, each held to a row count and a byte budget."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from session_service import convert
from session_service.records import Event, LogBranch
from session_service.storage import queries
from session_service.storage.event_log import EventLog
from session_service.storage.kinds import MESSAGE_APPENDED
from session_service.storage.schema import Part, Tables
from switchboard import pagination


class History(Part):
    def __init__(self, tables: Tables, log: EventLog) -> None:
        super().__init__(tables)
        self.log = log

    def history(
        self,
        session_id: str,
        after_seq: int,
        before_seq: int | None,
        limit: int,
        newest: bool,
        include_abandoned: bool,
        budget: int,
        shared: bool = False,
    ) -> tuple[list[Event], bool]:
        """The oldest (or `newest`) history messages in (after, before), at most `limit`
        and `budget` bytes, oldest first; and whether more lie beyond them. `shared`:
        the session is a fork sharing its ancestors' history (see `LineageRow`)."""
        conditions: list[str] = [f"kind = '{MESSAGE_APPENDED}'", "seq > ?"]
        params: list[Any] = [after_seq]
        if before_seq is not None:
            conditions.append("seq < ?")
            params.append(before_seq)
        if not include_abandoned:
            conditions.append("active = ?")
            params.append(True)
        # Hook (issue 23): messages the session (or an ancestor before its fork
        # point) retracted are no longer history (`retraction_store`).
        conditions.append(queries.NOT_RETRACTED)
        params += [session_id, session_id]
        if not shared:
            where = " AND ".join(["session_id = ?", *conditions])
            return self._sized_page(where, [session_id, *params], newest, limit, budget)
        # The fork's own rows lie above its fork point, its parent's below it, and so
        # on up the lineage: segments of the one history, each read as a bounded page
        # in the page's direction until the page is full. So a page costs what it
        # holds (plus one lookup of the lineage), never the length of what it inherits.
        segments = [(session_id, None), *self._ancestors(session_id)]
        if not newest:
            segments.reverse()
        events: list[Event] = []
        for number, (entity, until) in enumerate(segments):
            where, segment_params = _segment(entity, until, conditions, params)
            left = budget - sum(convert.encoded_size(event) for event in events)
            page, more = self._sized_page(
                where, segment_params, newest, limit - len(events), left, first_always=not events
            )
            events = page + events if newest else events + page
            if more:
                return events, True
            if len(events) == limit:
                return events, self._any_in(segments[number + 1 :], conditions, params)
        return events, False

    def _ancestors(self, session_id: str) -> list[tuple[str, int]]:
        """A fork's ancestors, newest first: (ancestor's session id, its fork point)."""
        rows = self.database.execute_sql(
            self._sql(queries.ANCESTORS),
            [session_id],
        ).fetchall()
        return [(str(ancestor), int(until)) for ancestor, until in rows]

    def _any_in(
        self, segments: list[tuple[str, int | None]], conditions: list[str], params: list[Any]
    ) -> bool:
        """Whether any of the segments holds a matching row (a page that filled up at
        the end of a segment: is there a next page?)."""
        for entity, until in segments:
            where, segment_params = _segment(entity, until, conditions, params)
            sql = self._sql(queries.any_row(where))
            if self.database.execute_sql(sql, segment_params).fetchone() is not None:
                return True
        return False

    def log_page(
        self,
        after_seq: int,
        before_seq: int | None,
        agent: str,
        session_id: str,
        kinds: Sequence[str],
        branch: int,
        limit: int,
        budget: int,
        newest: bool = False,
    ) -> tuple[list[tuple[Event, bool]], bool]:
        """A page of the global log in sequence order, each event with whether it is
        abandoned (`branch`: a LogBranch); and whether more match beyond it (after
        it, or with `newest`, the top of the matching events, before it)."""
        # No lower bound unless one is asked for: SQLite bounds a range scan by the first
        # one it meets, and a "seq > 0" would make a newest page's rows read from the start.
        where, params = ("seq > ?", list[Any]([after_seq])) if after_seq else ("1 = 1", [])
        for column, value in (("agent", agent), ("session_id", session_id)):
            if value:
                where += f" AND {column} = ?"
                params.append(value)
        if before_seq is not None:
            where += " AND seq < ?"
            params.append(before_seq)
        if kinds:
            where += f" AND kind IN ({', '.join('?' for _ in kinds)})"
            params.extend(kinds)
        if branch in (LogBranch.ACTIVE, LogBranch.ABANDONED):
            where += " AND active = ?"
            params.append(branch == LogBranch.ACTIVE)
        events, more = self._sized_page(where, params, newest, limit, budget)
        abandoned = self.log.abandoned_among([event.sequence for event in events])
        return [(event, event.sequence in abandoned) for event in events], more

    def _sized_page(
        self,
        where: str,
        params: list[Any],
        descending: bool,
        limit: int,
        budget: int,
        first_always: bool = True,
    ) -> tuple[list[Event], bool]:
        """Events matching `where`, by sequence (from the top when `descending`), as many
        as `limit` and `budget` bytes allow, returned oldest first; and whether more
        match. Two statements: the rows' sizes (the payloads' lengths, which the
        database knows without reading them), then the payloads of the rows that fit;
        so no more than a page is ever loaded, however large the rows. The first row
        comes even past the budget (so paging moves on) unless not `first_always`."""
        sizes = self.database.execute_sql(
            self._sql(queries.row_sizes(where, descending, int(limit) + 1)),
            params,
        ).fetchall()
        lengths = [int(size) for _, size in sizes[:limit]]
        kept = pagination.fitting(lengths, budget)
        if kept and not first_always and lengths[0] > budget:
            kept = 0
        seqs = sorted(int(seq) for seq, _ in sizes[:kept])
        if not seqs:
            return [], len(sizes) > kept
        # The kept rows are the matching rows between the first and the last of them:
        # one statement whose text does not depend on the page's length (the LIMIT
        # holds it to the page should a concurrent checkout restore rows in between).
        events = self.log.payloads(
            self._sql(queries.payloads_between(where)),
            [*params, seqs[0], seqs[-1], len(seqs)],
        )
        return events, len(sizes) > kept


def _segment(
    session_id: str, until: int | None, conditions: list[str], params: list[Any]
) -> tuple[str, list[Any]]:
    """The SQL condition and parameters selecting one segment of a shared history: a
    session's rows matching `conditions`, up to its fork point `until` (None: all)."""
    where = " AND ".join(["session_id = ?", *conditions])
    if until is None:
        return where, [session_id, *params]
    return f"{where} AND seq <= ?", [session_id, *params, until]
