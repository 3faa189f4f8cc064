"""Retracted messages' storage: which history messages a session took back.

`session_retraction` has a row per message a MessagesRetracted event retracted
(the message's sequence, the retracting session, the retraction's sequence),
kept for active retractions only: a rewind deletes the rows of the events it
abandons and a checkout indexes the events it restores again, so a message is
back in the history exactly when its retraction is abandoned.

A history read leaves a message out when the session reading it, or an ancestor
whose history it shares up to a fork point after the retraction, retracted it
(`NOT_RETRACTED`): a fork keeps its parent's messages as they were at the fork.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import peewee

from session_service.storage.kinds import MESSAGE_APPENDED
from switchboard.database import Backend, bind_model


class RetractionRow(peewee.Model):
    message_seq = peewee.BigIntegerField()
    session_id = peewee.CharField(max_length=128)  # the session that retracted it
    by_seq = peewee.BigIntegerField()  # the MessagesRetracted event

    class Meta:
        table_name = "session_retraction"
        primary_key = peewee.CompositeKey("message_seq", "session_id")
        indexes = ((("by_seq",), False), (("session_id",), False))


#: The condition a history read adds for the session it reads (two parameters: the
#: session id twice). Unqualified `seq` is the session_log row's.
NOT_RETRACTED = (
    "NOT EXISTS (SELECT 1 FROM session_retraction x WHERE x.message_seq = session_log.seq "
    "AND (x.session_id = ? OR EXISTS (SELECT 1 FROM session_lineage g WHERE g.session_id = ? "
    "AND g.ancestor_id = x.session_id AND x.by_seq <= g.until_seq)))"
)


class RetractionStore:
    def __init__(self, backend: Backend) -> None:
        self.database: Any = backend.database
        self._sql = backend.sql  # `?` placeholders, in the backend's dialect
        self.Retraction = bind_model(RetractionRow, self.database)
        self.models = (self.Retraction,)

    def index(self, session_id: str, by_seq: int, sequences: Sequence[int]) -> None:
        for message_seq in sequences:
            self.database.execute_sql(
                self._sql(
                    "INSERT INTO session_retraction (message_seq, session_id, by_seq) "
                    "VALUES (?, ?, ?) ON CONFLICT DO NOTHING"
                ),
                [message_seq, session_id, by_seq],
            )

    def visible_messages(self, session_id: str, seqs: Sequence[int]) -> list[tuple[int, bytes]]:
        """(format, payload) of the history messages at `seqs` that the session's
        history holds now (its own, or an ancestor's up to the fork point; active, not
        retracted), oldest first: one statement."""
        marks = ", ".join("?" for _ in seqs)
        rows = self.database.execute_sql(
            self._sql(
                f"SELECT format, payload FROM session_log WHERE seq IN ({marks}) "
                f"AND kind = '{MESSAGE_APPENDED}' AND active = ? AND (session_id = ? OR EXISTS "
                "(SELECT 1 FROM session_lineage g WHERE g.session_id = ? "
                "AND g.ancestor_id = session_log.session_id AND session_log.seq <= g.until_seq)) "
                f"AND {NOT_RETRACTED} ORDER BY seq"
            ),
            [*seqs, True, session_id, session_id, session_id, session_id],
        ).fetchall()
        return [(int(fmt), payload) for fmt, payload in rows]

    def drop_between(self, first: int, last: int) -> None:
        self.database.execute_sql(
            self._sql("DELETE FROM session_retraction WHERE by_seq >= ? AND by_seq <= ?"),
            [first, last],
        )

    def drop_session(self, session_id: str) -> None:
        self.database.execute_sql(
            self._sql("DELETE FROM session_retraction WHERE session_id = ?"), [session_id]
        )

    def clear(self) -> None:
        self.database.execute_sql("DELETE FROM session_retraction")

    def rows(self) -> set[tuple[Any, ...]]:
        return {
            (int(m), str(s), int(b))
            for m, s, b in self.database.execute_sql(
                "SELECT message_seq, session_id, by_seq FROM session_retraction"
            ).fetchall()
        }
