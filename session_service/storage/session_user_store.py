"""Which user each session's source names (Source.user_id, as stored), indexed, so
that ListSessions filters an agent's sessions by user in one indexed read.

A row per session opened with a user, written with its SessionOpened event;
a rewind or checkout that undoes or restores the session deletes or writes it
again (`FrameworkProjection.moved`), an erasure deletes it.
"""

from __future__ import annotations

from typing import Any

import peewee

from session_service.storage import queries
from switchboard.database import Backend, bind_model


class SessionUserRow(peewee.Model):
    session_id = peewee.CharField(max_length=128, primary_key=True)
    agent = peewee.CharField(max_length=64)
    user_id = peewee.CharField(max_length=256)

    class Meta:
        table_name = "session_of_user"
        indexes = ((("agent", "user_id"), False),)


class SessionUserStore:
    def __init__(self, backend: Backend) -> None:
        self.database: Any = backend.database
        self._sql = backend.sql  # `?` placeholders, in the backend's dialect
        self.User = bind_model(SessionUserRow, self.database)
        self.models = (self.User,)

    def put(self, session_id: str, agent: str, user_id: str) -> None:
        self.database.execute_sql(
            self._sql(queries.PUT_SESSION_USER),
            [session_id, agent, user_id],
        )

    def drop(self, session_id: str) -> None:
        self.database.execute_sql(self._sql(queries.DELETE_SESSION_USER), [session_id])

    def clear(self) -> None:
        self.database.execute_sql(queries.DELETE_SESSION_USERS)

    def rows(self) -> set[tuple[Any, ...]]:
        return {
            (str(s), str(a), str(u))
            for s, a, u in self.database.execute_sql(queries.SESSION_USER_ROWS).fetchall()
        }
