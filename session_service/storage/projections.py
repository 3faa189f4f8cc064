"""The projections of the log kept in its write transactions: agent and session index
rows (what lists, routing and version checks read), routes and fork lineage."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import peewee

from session_service import storage_format
from session_service.records import Agent, Session, SessionStatus
from session_service.storage import queries
from session_service.storage.event_log import EventLog
from session_service.storage.schema import Part, Tables
from session_service.storage.states import States
from switchboard.database import dicts, tuples


@dataclass(frozen=True)
class SessionIndex:
    """A session's projection row: what routing, lists and version checks read."""

    session_id: str
    agent: str
    routing_key: str
    transport: str
    status: int
    created_seq: int
    last_seq: int
    version: int
    snapshot_version: int
    resume_pending: bool = False
    #: The session's `Session` as the fold of its events leaves it (serialized,
    #: deterministic), so that lists, GetSession and routing read one row instead of
    #: rebuilding the state. None: not projected yet (a row from before migration 4,
    #: or one written without it); `put_session_index` then folds it.
    summary: bytes | None = None


@dataclass(frozen=True)
class AgentIndex:
    """An agent's projection row."""

    name: str
    archived: bool
    version: int
    last_seq: int
    snapshot_version: int
    #: The agent's `Agent` without its memory as the fold leaves it (serialized,
    #: deterministic): what routing and lists need. None as for `SessionIndex.summary`.
    summary: bytes | None = None


_SESSION_COLUMNS = tuple(SessionIndex.__dataclass_fields__)
_AGENT_COLUMNS = tuple(AgentIndex.__dataclass_fields__)


def serialized_summary(summary: Session | Agent) -> bytes:
    """A projection row's summary: deterministic, so that a rebuild writes the same bytes."""
    return storage_format.encode_summary(summary)


def agent_summary(agent: Agent) -> Agent:
    """The agent as its projection row keeps it: everything but its memory."""
    return replace(agent, memory={})


def _agent_index(row: Sequence[Any]) -> AgentIndex:
    fields = dict(zip(_AGENT_COLUMNS, row, strict=True))
    summary = fields["summary"]
    return AgentIndex(
        **{
            **fields,
            "archived": bool(fields["archived"]),
            "summary": None if summary is None else bytes(summary),
        }
    )


def _session_index(fields: dict[str, Any]) -> SessionIndex:
    summary = fields["summary"]
    return SessionIndex(
        **{
            **fields,
            "resume_pending": bool(fields["resume_pending"]),
            "summary": None if summary is None else bytes(summary),
        }
    )


class Projections(Part):
    def __init__(self, tables: Tables, log: EventLog, states: States) -> None:
        super().__init__(tables)
        self.log = log
        self.states = states
        self._select_session, self._upsert_session = self._row_sql(
            "session_session", _SESSION_COLUMNS
        )
        self._select_agent, self._upsert_agent = self._row_sql("session_agent", _AGENT_COLUMNS)
        self._select_routed_session = self._sql(queries.routed_session(_SESSION_COLUMNS))
        self._insert_lineage = self._sql(queries.INSERT_LINEAGE)

    # The projection rows are read and written on every append: prepared SQL,
    # because building these statements with peewee cost more than running them.

    def _row_sql(self, table: str, columns: Sequence[str]) -> tuple[str, str]:
        """SELECT by key, and the upsert of a projection row (key first)."""
        return (
            self._sql(queries.select_row(table, columns)),
            self._sql(queries.upsert_row(table, columns)),
        )

    def agent_index(self, name: str) -> AgentIndex | None:
        row = self.database.execute_sql(self._select_agent, [name]).fetchone()
        if row is None:
            return None
        return _agent_index(row)

    def put_agent_index(self, index: AgentIndex) -> None:
        if index.summary is None:  # written without one (a rewind's refresh): fold it
            agent = self.states.agent_state(index.name)
            summary = None if agent is None else serialized_summary(agent_summary(agent))
            index = replace(index, summary=summary)
        self._write(self._upsert_agent, [getattr(index, column) for column in _AGENT_COLUMNS])

    def list_agents(self, after_name: str, limit: int, include_archived: bool) -> list[AgentIndex]:
        """A page of agent rows by name, summaries included: one statement."""
        sql = self._sql(queries.agents_page(_AGENT_COLUMNS, include_archived))
        params = [after_name, *([] if include_archived else [False]), limit]
        return [_agent_index(row) for row in self.database.execute_sql(sql, params).fetchall()]

    def session_index(self, session_id: str) -> SessionIndex | None:
        row = self.database.execute_sql(self._select_session, [session_id]).fetchone()
        if row is None:
            return None
        return _session_index(dict(zip(_SESSION_COLUMNS, row, strict=True)))

    def put_session_index(self, index: SessionIndex) -> None:
        if index.summary is None:  # written without one (a rewind's refresh): fold it
            state = self.states.session_state(index.session_id)
            summary = (
                None
                if state is None or state.session is None
                else serialized_summary(state.session)
            )
            index = replace(index, summary=summary)
        self._write(self._upsert_session, [getattr(index, column) for column in _SESSION_COLUMNS])

    def list_sessions(
        self,
        agent: str,
        status: int,
        transport: str,
        before_created_seq: int | None,
        limit: int,
        routing_key: str = "",
        user_id: str = "",
    ) -> list[SessionIndex]:
        """Newest first; every agent's sessions for `agent` "". `user_id` (with an
        agent): only the sessions of that user (hook, issue 23: `session_user_store`)."""
        query = self.Session.select()
        if agent:
            query = query.where(self.Session.agent == agent)
        if user_id:
            query = query.where(
                peewee.SQL(
                    self._sql(queries.SESSIONS_OF_USER),
                    [agent, user_id],
                )
            )
        if routing_key:
            query = query.where(self.Session.routing_key == routing_key)
        if status:
            query = query.where(self.Session.status == status)
        if transport:
            query = query.where(self.Session.transport == transport)
        if before_created_seq is not None:
            query = query.where(self.Session.created_seq < before_created_seq)
        rows = dicts(query.order_by(self.Session.created_seq.desc()).limit(limit))
        return [_session_index(row) for row in rows]

    def resumable(self, agent: str) -> list[SessionIndex]:
        query = self.Session.select().where(
            (self.Session.agent == agent)
            & (self.Session.resume_pending == True)  # noqa: E712 - SQL, not Python
            & (self.Session.status == SessionStatus.OPEN)
        )
        return [_session_index(row) for row in dicts(query.order_by(self.Session.created_seq))]

    def routed_session(self, agent: str, routing_key: str) -> SessionIndex | None:
        """The projection row of the session a routing key points to (one statement)."""
        row = self.database.execute_sql(self._select_routed_session, [agent, routing_key])
        found = row.fetchone()
        return (
            None
            if found is None
            else _session_index(dict(zip(_SESSION_COLUMNS, found, strict=True)))
        )

    def unsummarized(self) -> tuple[list[str], list[str]]:
        """(agent names, session ids) of projection rows without a summary yet."""
        agents = self.Agent.select(self.Agent.name).where(self.Agent.summary.is_null())
        sessions = self.Session.select(self.Session.session_id).where(
            self.Session.summary.is_null()
        )
        return (
            [str(name) for (name,) in tuples(agents)],
            [str(session_id) for (session_id,) in tuples(sessions)],
        )

    def key_report(self) -> list[dict[str, Any]]:
        """The rows of `session_key_report` (the upgrade to injective keys), in no order."""
        return dicts(self.KeyReport.select())

    def route(self, agent: str, routing_key: str) -> str | None:
        row = (
            self.Route.select(self.Route.session_id)
            .where((self.Route.agent == agent) & (self.Route.routing_key == routing_key))
            .tuples()
            .first()
        )
        return None if row is None else str(row[0])

    def claim_route(self, agent: str, routing_key: str, session_id: str) -> bool:
        """Points a free routing key at a session; False when another session holds it."""
        inserted = (
            self.Route.insert(agent=agent, routing_key=routing_key, session_id=session_id)
            .on_conflict_ignore()
            .as_rowcount()
            .execute()
        )
        return bool(inserted)

    def set_route(self, agent: str, routing_key: str, session_id: str) -> None:
        self.Route.insert(agent=agent, routing_key=routing_key, session_id=session_id).on_conflict(
            conflict_target=[self.Route.agent, self.Route.routing_key],
            update={self.Route.session_id: session_id},
        ).execute()

    def drop_route(self, agent: str, routing_key: str, session_id: str) -> None:
        self.Route.delete().where(
            (self.Route.agent == agent)
            & (self.Route.routing_key == routing_key)
            & (self.Route.session_id == session_id)
        ).execute()

    def drop_routes_to(self, session_ids: Iterable[str]) -> None:
        self.Route.delete().where(self.Route.session_id.in_(list(session_ids))).execute()

    def delete_agent_index(self, name: str) -> None:
        self.Agent.delete().where(self.Agent.name == name).execute()

    def delete_session_index(self, session_id: str) -> None:
        """A session a rewind undid: its row and, for a fork, its lineage."""
        self.Session.delete().where(self.Session.session_id == session_id).execute()
        self.Lineage.delete().where(self.Lineage.session_id == session_id).execute()

    def add_lineage(self, session_id: str, parent_id: str, until_seq: int) -> None:
        """Records a fork's ancestors (one statement; a replay writes the same rows)."""
        params = [session_id, parent_id, session_id, parent_id, until_seq]
        self.database.execute_sql(self._insert_lineage, params)

    def clear_projections(self) -> None:
        for model in (self.Agent, self.Session, self.Route, self.Lineage):
            model.delete().execute()

    def projection_rows(self) -> dict[str, set[tuple[Any, ...]]]:
        """Every projection row as the log defines it, for comparing before and after
        a rebuild (snapshot bookkeeping is cache state, so it is left out)."""
        rows: dict[str, set[tuple[Any, ...]]] = {}
        for name, model in (
            ("agents", self.Agent),
            ("sessions", self.Session),
            ("routes", self.Route),
            ("lineage", self.Lineage),
        ):
            columns = [f for n, f in model._meta.fields.items() if n != "snapshot_version"]
            rows[name] = {
                tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                for row in tuples(model.select(*columns))
            }
        return rows

    def head_and_snapshot_lag(self) -> tuple[int, int]:
        lag = self.database.execute_sql(queries.SNAPSHOT_LAG).fetchone()[0]
        return self.log.head(), int(lag or 0)
