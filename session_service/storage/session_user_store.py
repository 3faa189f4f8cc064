"""Which user each session's source names (Source.user_id, as stored), indexed, so
that ListSessions filters an agent's sessions by user in one indexed read.

A row per session opened with a user, written with its SessionOpened event;
a rewind or checkout that undoes or restores the session deletes or writes it
again (`FrameworkProjection.moved`), an erasure deletes it.
"""

from __future__ import annotations

from typing import Any

import peewee

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
            self._sql(
                "INSERT INTO session_of_user (session_id, agent, user_id) VALUES (?, ?, ?) "
                "ON CONFLICT (session_id) DO UPDATE SET agent = excluded.agent, "
                "user_id = excluded.user_id"
            ),
            [session_id, agent, user_id],
        )

    def drop(self, session_id: str) -> None:
        self.database.execute_sql(
            self._sql("DELETE FROM session_of_user WHERE session_id = ?"), [session_id]
        )

    def clear(self) -> None:
        self.database.execute_sql("DELETE FROM session_of_user")

    def rows(self) -> set[tuple[Any, ...]]:
        return {
            (str(s), str(a), str(u))
            for s, a, u in self.database.execute_sql(
                "SELECT session_id, agent, user_id FROM session_of_user"
            ).fetchall()
        }
