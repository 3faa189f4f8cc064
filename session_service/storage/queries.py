"""The session storage's raw SQL, named in one place: the event log, history pages,
snapshots, markers and projections. Texts use `?` placeholders; the parts pass each
through `Backend.sql` (`Part._sql`) for the backend's style. Peewee query-builder
calls stay in the parts; a statement composed from a condition is a function here.
Kind names are embedded (not parameters), so statement texts and plans stay fixed."""

from __future__ import annotations

from collections.abc import Sequence

from session_service.storage.kinds import (
    LOG_RECORD_KINDS,
    MESSAGE_APPENDED,
    NEVER_ABANDONED_KINDS,
    RECORDS_PUT,
    REWIND_APPLIED,
    REWOUND,
    STATE_CHANGED,
    sql_list,
)

# -- the event log -------------------------------------------------------------------

INSERT_EVENT = (
    "INSERT INTO session_log "
    "(seq, agent, session_id, kind, format, payload, tool_ref, active, inbound_ref) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
MOVE_HEAD = "UPDATE session_log_head SET seq = seq + ? WHERE id = 1 RETURNING seq"
IS_ACTIVE = "SELECT active FROM session_log WHERE seq = ?"


def accepted_post(accepted_posts: str) -> str:
    """A session's post under a message_ref, among the rows `accepted_posts` selects."""
    return (
        "SELECT format, payload FROM session_log WHERE session_id = ? AND inbound_ref = ? "
        f"AND {accepted_posts}"
    )


def lock_head(for_update: str) -> str:
    """Reads the head row with the backend's row lock (`Backend.for_update`)."""
    return f"SELECT seq FROM session_log_head WHERE id = 1{for_update}"


def page_within_budget(where: str) -> str:
    """Rows matching `where` in order, each with its payload only while the bytes of
    the rows before it stay under the budget (the first parameter): the row that
    reaches the budget still comes whole."""
    return (
        "SELECT format, CASE WHEN upto - size < ? THEN payload END FROM ("
        "SELECT seq, format, payload, LENGTH(payload) AS size, "
        "SUM(LENGTH(payload)) OVER (ORDER BY seq) AS upto FROM session_log "
        f"WHERE {where} ORDER BY seq LIMIT ?) AS page ORDER BY seq"
    )


def rewind_or(column: str) -> str:
    """The row is the value's in `column`, or a rewind record (which every reader sees)."""
    return f"({column} = ? OR kind = '{REWOUND}')"


def entity_events(where: str, bounded: bool) -> str:
    """An entity's active events after a sequence (`bounded`: up to another)."""
    bound = " AND seq <= ?" if bounded else ""
    return (
        f"SELECT format, payload FROM session_log WHERE {where} AND active = ? "
        f"AND seq > ?{bound} ORDER BY seq"
    )


def abandoned_among(count: int) -> str:
    marks = ", ".join("?" for _ in range(count))
    return f"SELECT seq FROM session_log WHERE seq IN ({marks}) AND active = ?"


# -- history pages ---------------------------------------------------------------------

ANCESTORS = (
    "SELECT ancestor_id, until_seq FROM session_lineage WHERE session_id = ? "
    "ORDER BY until_seq DESC"
)


def any_row(where: str) -> str:
    return f"SELECT 1 FROM session_log WHERE {where} LIMIT 1"


def row_sizes(where: str, descending: bool, limit: int) -> str:
    """The sequences and payload lengths of up to `limit` rows matching `where`."""
    order = "DESC" if descending else "ASC"
    return (
        f"SELECT seq, LENGTH(payload) FROM session_log WHERE {where} "
        f"ORDER BY seq {order} LIMIT {int(limit)}"
    )


def payloads_between(where: str) -> str:
    """The payloads of the rows matching `where` between two sequences, at most a count."""
    return (
        f"SELECT format, payload FROM session_log WHERE {where} AND seq >= ? "
        "AND seq <= ? ORDER BY seq LIMIT ?"
    )


# -- snapshots -------------------------------------------------------------------------


def latest_snapshot(bounded: bool) -> str:
    bound = " AND seq <= ?" if bounded else ""
    return (
        "SELECT seq, format, state FROM session_snapshot "
        f"WHERE entity = ? AND active = ?{bound} ORDER BY seq DESC LIMIT 1"
    )


# -- markers ---------------------------------------------------------------------------

MOVE_EFFECT = (
    "SELECT agent, session_id, "
    f"SUM(CASE WHEN kind = '{REWIND_APPLIED}' THEN 0 ELSE 1 END) "
    "FROM session_log WHERE seq >= ? AND seq <= ? AND active = ? "
    f"AND kind NOT IN ({sql_list(LOG_RECORD_KINDS)}) GROUP BY agent, session_id"
)
# Audit records keep their marker: they are on every timeline.
MARK_LOG = (
    "UPDATE session_log SET active = ? WHERE seq >= ? AND seq <= ? AND active = ?"
    f" AND kind NOT IN ({sql_list(NEVER_ABANDONED_KINDS)})"
)
MARK_SNAPSHOTS = "UPDATE session_snapshot SET active = ? WHERE seq >= ? AND seq <= ? AND active = ?"
UNDONE_BELOW = (
    "SELECT agent, session_id FROM (SELECT DISTINCT agent, session_id "
    f"FROM session_log WHERE seq < ? AND kind <> '{REWOUND}') AS l "
    "WHERE CASE WHEN session_id IS NULL "
    "THEN NOT EXISTS (SELECT 1 FROM session_agent WHERE name = l.agent) "
    "ELSE NOT EXISTS (SELECT 1 FROM session_session AS s "
    "WHERE s.session_id = l.session_id) END"
)


def floor_and_newest(where: str) -> str:
    """An entity's version floor and its newest event (`where`), in one row."""
    return (
        "SELECT f.version, n.format, n.payload FROM (SELECT 1 AS one) AS o "
        "LEFT JOIN session_version_floor AS f ON f.entity = ? LEFT JOIN "
        f"(SELECT format, payload FROM session_log WHERE {where} "
        "ORDER BY seq DESC LIMIT 1) AS n ON 1 = 1"
    )


def count_events(where: str) -> str:
    return f"SELECT COUNT(*) FROM session_log WHERE {where}"


# -- projections -----------------------------------------------------------------------

# A fork's ancestors are its parent's and the parent itself, each up to the
# earlier of the two fork points (the parent's own are earlier already).
INSERT_LINEAGE = (
    "INSERT INTO session_lineage (session_id, ancestor_id, until_seq) "
    "SELECT ?, ancestor_id, until_seq FROM session_lineage WHERE session_id = ? "
    "UNION ALL SELECT ?, ?, ? ON CONFLICT DO NOTHING"
)
SESSIONS_OF_USER = (
    "session_id IN (SELECT session_id FROM session_of_user WHERE agent = ? AND user_id = ?)"
)
SNAPSHOT_LAG = "SELECT MAX(version - snapshot_version) FROM session_session"


def select_row(table: str, columns: Sequence[str]) -> str:
    """A projection row by its key (the first column)."""
    return f"SELECT {', '.join(columns)} FROM {table} WHERE {columns[0]} = ?"


def upsert_row(table: str, columns: Sequence[str]) -> str:
    """The upsert of a projection row (key first): one statement with no row count to
    wait for, so it can travel with the log's INSERT."""
    key, rest = columns[0], columns[1:]
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) "
        f"VALUES ({', '.join('?' for _ in columns)}) ON CONFLICT ({key}) DO UPDATE SET "
        + ", ".join(f"{c} = excluded.{c}" for c in rest)
    )


def routed_session(session_columns: Sequence[str]) -> str:
    """The session row a routing key points to."""
    return (
        f"SELECT {', '.join(f's.{c}' for c in session_columns)} FROM session_route r "
        "JOIN session_session s ON s.session_id = r.session_id "
        "WHERE r.agent = ? AND r.routing_key = ?"
    )


def agents_page(columns: Sequence[str], include_archived: bool) -> str:
    live = "" if include_archived else " AND archived = ?"
    return (
        f"SELECT {', '.join(columns)} FROM session_agent WHERE name > ?{live} ORDER BY name LIMIT ?"
    )


# -- retractions (retraction_store.py) -------------------------------------------------

#: The condition a history read adds for the session it reads (two parameters: the
#: session id twice). Unqualified `seq` is the session_log row's.
NOT_RETRACTED = (
    "NOT EXISTS (SELECT 1 FROM session_retraction x WHERE x.message_seq = session_log.seq "
    "AND (x.session_id = ? OR EXISTS (SELECT 1 FROM session_lineage g WHERE g.session_id = ? "
    "AND g.ancestor_id = x.session_id AND x.by_seq <= g.until_seq)))"
)
INSERT_RETRACTION = (
    "INSERT INTO session_retraction (message_seq, session_id, by_seq) "
    "VALUES (?, ?, ?) ON CONFLICT DO NOTHING"
)
DELETE_RETRACTIONS_BETWEEN = "DELETE FROM session_retraction WHERE by_seq >= ? AND by_seq <= ?"
DELETE_RETRACTIONS_OF_SESSION = "DELETE FROM session_retraction WHERE session_id = ?"
DELETE_RETRACTIONS = "DELETE FROM session_retraction"
RETRACTION_ROWS = "SELECT message_seq, session_id, by_seq FROM session_retraction"


def visible_messages(count: int) -> str:
    """The history messages among `count` sequences that a session's history holds now
    (its own, or an ancestor's up to the fork point; active, not retracted)."""
    marks = ", ".join("?" for _ in range(count))
    return (
        f"SELECT format, payload FROM session_log WHERE seq IN ({marks}) "
        f"AND kind = '{MESSAGE_APPENDED}' AND active = ? AND (session_id = ? OR EXISTS "
        "(SELECT 1 FROM session_lineage g WHERE g.session_id = ? "
        "AND g.ancestor_id = session_log.session_id AND session_log.seq <= g.until_seq)) "
        f"AND {NOT_RETRACTED} ORDER BY seq"
    )


# -- sessions' users (session_user_store.py) -------------------------------------------

PUT_SESSION_USER = (
    "INSERT INTO session_of_user (session_id, agent, user_id) VALUES (?, ?, ?) "
    "ON CONFLICT (session_id) DO UPDATE SET agent = excluded.agent, "
    "user_id = excluded.user_id"
)
DELETE_SESSION_USER = "DELETE FROM session_of_user WHERE session_id = ?"
DELETE_SESSION_USERS = "DELETE FROM session_of_user"
SESSION_USER_ROWS = "SELECT session_id, agent, user_id FROM session_of_user"


# -- scoped state (state_store.py) -----------------------------------------------------

UPSERT_STATE_VALUE = (
    "INSERT INTO session_state_value (owner, key, value, seq) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (owner, key) DO UPDATE SET value = excluded.value, seq = excluded.seq"
)
DELETE_STATE_VALUE = "DELETE FROM session_state_value WHERE owner = ? AND key = ?"
INDEX_STATE_EVENT = (
    "INSERT INTO session_state_event (seq, owner) VALUES (?, ?) ON CONFLICT DO NOTHING"
)
# An owner's active events, through the index (never a scan of the log).
OWNER_EVENTS = (
    "SELECT l.format, l.payload FROM session_state_event e "
    "JOIN session_log l ON l.seq = e.seq WHERE e.owner = ? AND l.active = ? "
    f"AND l.kind = '{STATE_CHANGED}' AND l.seq <= ? ORDER BY e.seq"
)
STATE_SIZE = (
    "SELECT COALESCE(SUM(LENGTH(key) + LENGTH(value)), 0) FROM session_state_value WHERE owner = ?"
)
STATE_OWNERS_BETWEEN = "SELECT DISTINCT owner FROM session_state_event WHERE seq >= ? AND seq <= ?"
STATE_BASE = "SELECT key, value FROM session_state_base WHERE owner = ?"
DELETE_STATE_VALUES_OF = "DELETE FROM session_state_value WHERE owner = ?"
STATE_OWNERS_BELOW = "SELECT DISTINCT owner FROM session_state_event WHERE seq < ?"
DELETE_STATE_BASE_OF = "DELETE FROM session_state_base WHERE owner = ?"
INSERT_STATE_BASE = "INSERT INTO session_state_base (owner, key, value) VALUES (?, ?, ?)"
DELETE_STATE_EVENTS_BELOW = "DELETE FROM session_state_event WHERE seq < ?"
#: Everything kept of an owner, table by table.
FORGET_STATE_OWNER = tuple(
    f"DELETE FROM {table} WHERE owner = ?"
    for table in ("session_state_value", "session_state_base", "session_state_event")
)
DELETE_STATE_VALUES = "DELETE FROM session_state_value"
STATE_VALUES_FROM_BASES = (
    "INSERT INTO session_state_value (owner, key, value, seq) "
    "SELECT owner, key, value, 0 FROM session_state_base"
)
STATE_VALUE_ROWS = "SELECT owner, key, value FROM session_state_value"


def state_values(owners: int) -> str:
    """The entries of `owners` owners."""
    marks = ", ".join("?" for _ in range(owners))
    return f"SELECT owner, key, value FROM session_state_value WHERE owner IN ({marks})"


# -- erasure (erasure_store.py) --------------------------------------------------------

ERASED_ID = "SELECT erased_seq FROM session_erased_id WHERE session_id = ?"
ERASED_KEY = "SELECT erased_seq FROM session_erased_key WHERE agent = ? AND key_digest = ?"
REMEMBER_ERASED_ID = (
    "INSERT INTO session_erased_id (session_id, agent, erased_seq) VALUES (?, ?, ?) "
    "ON CONFLICT (session_id) DO UPDATE SET erased_seq = excluded.erased_seq"
)
REMEMBER_ERASED_KEY = (
    "INSERT INTO session_erased_key (agent, key_digest, erased_seq) VALUES (?, ?, ?) "
    "ON CONFLICT (agent, key_digest) DO UPDATE SET erased_seq = excluded.erased_seq"
)
FORGET_ERASED_ID = "DELETE FROM session_erased_id WHERE session_id = ?"
FORGET_ERASED_KEY = "DELETE FROM session_erased_key WHERE agent = ? AND key_digest = ?"
SESSION_ROWS = "SELECT seq, kind FROM session_log WHERE session_id = ? ORDER BY seq"
TOMBSTONE_ROW = (
    "UPDATE session_log SET kind = ?, format = ?, payload = ?, tool_ref = NULL, "
    "inbound_ref = NULL WHERE seq = ?"
)
REWRITE_ROW = "UPDATE session_log SET format = ?, payload = ? WHERE seq = ?"
#: The session's snapshots (by entity) and the core's projection rows of it (by id).
DROP_SESSION_SNAPSHOTS = "DELETE FROM session_snapshot WHERE entity = ?"
DROP_SESSION_PROJECTIONS = (
    "DELETE FROM session_session WHERE session_id = ?",
    "DELETE FROM session_route WHERE session_id = ?",
    "DELETE FROM session_lineage WHERE session_id = ?",
    "DELETE FROM session_key_report WHERE session_id = ?",
)
WAL_CHECKPOINT = "PRAGMA wal_checkpoint(TRUNCATE)"


def log_rows(count: int) -> str:
    marks = ", ".join("?" for _ in range(count))
    return f"SELECT seq, format, payload FROM session_log WHERE seq IN ({marks})"


def abandoned_puts(of_session: bool) -> str:
    """The RecordsPut rows a rewind abandoned, of one session or of an agent's sessions."""
    where = "session_id = ?" if of_session else "agent = ? AND session_id IS NOT NULL"
    return (
        f"SELECT seq, format, payload FROM session_log WHERE {where} "
        f"AND kind = '{RECORDS_PUT}' AND active = ? ORDER BY seq"
    )


def drop_answers_naming(request_table: str, subjects_table: str) -> str:
    """The remembered answers of requests that named a session."""
    return (
        f"DELETE FROM {request_table} WHERE EXISTS (SELECT 1 FROM {subjects_table} s "
        f"WHERE s.session_id = ? AND s.principal = {request_table}.principal "
        f"AND s.request_id = {request_table}.request_id)"
    )


def drop_subjects_of(subjects_table: str) -> str:
    return f"DELETE FROM {subjects_table} WHERE session_id = ?"


# -- stored records (records_store.py) -------------------------------------------------

#: The row is its key's newest put (reads answer only those).
LATEST = (
    "NOT EXISTS (SELECT 1 FROM session_record n WHERE n.session_id = r.session_id "
    "AND n.kind = r.kind AND n.namespace = r.namespace AND n.key = r.key "
    "AND (n.seq > r.seq OR (n.seq = r.seq AND n.position > r.position)))"
)
INSERT_RECORD_LABEL = (
    "INSERT INTO session_record_label "
    "(seq, position, name, value, agent, session_id, kind) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
RECORD_TABLES = ("session_record", "session_record_label")
#: Each table's rows of the events in [first, last].
DROP_RECORDS_BETWEEN = tuple(
    f"DELETE FROM {table} WHERE seq >= ? AND seq <= ?" for table in RECORD_TABLES
)
#: Each table's rows of one record (sequence, position).
DROP_RECORD = tuple(
    f"DELETE FROM {table} WHERE seq = ? AND position = ?" for table in RECORD_TABLES
)
DROP_RECORDS_OF_SESSION = tuple(
    f"DELETE FROM {table} WHERE session_id = ?" for table in RECORD_TABLES
)
DROP_RECORDS = tuple(f"DELETE FROM {table}" for table in RECORD_TABLES)
#: The page condition "below the place (sequence, position)".
RECORDS_BELOW = "(r.seq < ? OR (r.seq = ? AND r.position < ?))"


def insert_record(columns: Sequence[str]) -> str:
    return (
        f"INSERT INTO session_record ({', '.join(columns)}) "
        f"VALUES ({', '.join('?' for _ in columns)})"
    )


def record_rows(columns: Sequence[str]) -> str:
    return f"SELECT {', '.join(columns)} FROM session_record"


def _record_columns(columns: Sequence[str]) -> str:
    return ", ".join(f"r.{column}" for column in columns)


def records_where(columns: Sequence[str], where: str) -> str:
    """The index rows (`r`) matching `where`."""
    return f"SELECT {_record_columns(columns)} FROM session_record r WHERE {where}"


def newest_record(columns: Sequence[str], where: str) -> str:
    """The newest put among the index rows matching `where`."""
    return records_where(columns, where) + " ORDER BY r.seq DESC, r.position DESC LIMIT 1"


def records_page(columns: Sequence[str], where: str, limit: int) -> str:
    """Up to `limit` index rows matching `where`, newest first."""
    return (
        records_where(columns, where) + f" ORDER BY r.seq DESC, r.position DESC LIMIT {int(limit)}"
    )


def record_labelled(values: int) -> str:
    """The condition "the record has the label (a name) with one of `values` values"."""
    return (
        "EXISTS (SELECT 1 FROM session_record_label b WHERE b.seq = r.seq "
        f"AND b.position = r.position AND b.name = ? AND b.value IN "
        f"({', '.join('?' for _ in range(values))}))"
    )


def keys_in(count: int) -> str:
    return f"r.key IN ({', '.join('?' for _ in range(count))})"


def child_keys(parents: int) -> str:
    """The keys of a kind's records in a namespace whose parent is one of `parents`."""
    return (
        "SELECT DISTINCT key FROM session_record WHERE session_id = ? AND kind = ? "
        f"AND namespace = ? AND parent_key IN ({', '.join('?' for _ in range(parents))})"
    )
