"""Retracted messages' storage: which history messages a session took back.

`session_retraction` has a row per message a MessagesRetracted event retracted
(the message's sequence, the retracting session, the retraction's sequence),
kept for active retractions only: a rewind deletes the rows of the events it
abandons and a checkout indexes the events it restores again, so a message is
back in the history exactly when its retraction is abandoned.

A history read leaves a message out when the session reading it, or an ancestor
whose history it shares up to a fork point after the retraction, retracted it
(`queries.NOT_RETRACTED`): a fork keeps its parent's messages as they were at the fork.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import peewee

from session_service.storage import queries
from switchboard.database import Backend, bind_model


class RetractionRow(peewee.Model):
    message_seq = peewee.BigIntegerField()
    session_id = peewee.CharField(max_length=128)  # the session that retracted it
    by_seq = peewee.BigIntegerField()  # the MessagesRetracted event

    class Meta:
        table_name = "session_retraction"
        primary_key = peewee.CompositeKey("message_seq", "session_id")
        indexes = ((("by_seq",), False), (("session_id",), False))


class RetractionStore:
    def __init__(self, backend: Backend) -> None:
        self.database: Any = backend.database
        self._sql = backend.sql  # `?` placeholders, in the backend's dialect
        self.Retraction = bind_model(RetractionRow, self.database)
        self.models = (self.Retraction,)

    def index(self, session_id: str, by_seq: int, sequences: Sequence[int]) -> None:
        for message_seq in sequences:
            self.database.execute_sql(
                self._sql(queries.INSERT_RETRACTION),
                [message_seq, session_id, by_seq],
            )

    def visible_messages(self, session_id: str, seqs: Sequence[int]) -> list[tuple[int, bytes]]:
        """(format, payload) of the history messages at `seqs` that the session's
        history holds now (its own, or an ancestor's up to the fork point; active, not
        retracted), oldest first: one statement."""
        rows = self.database.execute_sql(
            self._sql(queries.visible_messages(len(seqs))),
            [*seqs, True, session_id, session_id, session_id, session_id],
        ).fetchall()
        return [(int(fmt), payload) for fmt, payload in rows]

    def drop_between(self, first: int, last: int) -> None:
        self.database.execute_sql(
            self._sql(queries.DELETE_RETRACTIONS_BETWEEN),
            [first, last],
        )

    def drop_session(self, session_id: str) -> None:
        self.database.execute_sql(self._sql(queries.DELETE_RETRACTIONS_OF_SESSION), [session_id])

    def clear(self) -> None:
        self.database.execute_sql(queries.DELETE_RETRACTIONS)

    def rows(self) -> set[tuple[Any, ...]]:
        return {
            (int(m), str(s), int(b))
            for m, s, b in self.database.execute_sql(queries.RETRACTION_ROWS).fetchall()
        }
