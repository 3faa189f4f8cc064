"""The body of session migration `injective_routing_keys`: existing sessions keyed in
the injective encoding, and the sessions two conversations may have shared, reported.

In the migration's transaction:

1. Every session row with a key gets the key `legacy_keys.upgrade` builds from the
   source its `SessionOpened` stored (what every reader of that format-1 row computes
   too, so a rebuild, rewind or checkout lands on the same key), its summary the
   same, and each route follows its session. The log is not touched.
2. Each such session is looked at for what the old encoding hid, and written to
   `session_key_report` when something was found (`FINDINGS`, most severe first):
   its old key could also come from another source (the other readings are named)
   and the history shows a second conversation (messages from someone the key
   does not belong to, a sender who is another reading's user, the key held by
   sessions of different sources over time); a peer thread opened by another agent
   than the one its conversation id names (the gate's audit record, committed in
   the same transaction as the `SessionOpened`, says who sent), or naming none.

Nothing is split or ended: a merged session stays its first conversation's (the one
its stored source names), and the next message of the other conversation opens a
session of its own. The report is what an operator acts on.

Frozen like a migration, except for the key rule it applies (`legacy_keys`,
`routing`), which is the live one on purpose: the rows it rewrites must agree with
what the readers of the log compute.
"""

from __future__ import annotations

import itertools
import logging
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from session_service import legacy_keys, pii, routing, storage_format
from session_service.records import (
    ChatType,
    Event,
    InboxPosted,
    MessageAppended,
    PermissionChecked,
    Role,
    RoutingPolicy,
    SessionOpened,
    SessionStatus,
    Source,
)
from session_service.storage.kinds import INBOX_POSTED, MESSAGE_APPENDED
from session_service.storage.store import SessionStore
from switchboard.migrations import Schema

log = logging.getLogger(__name__)

#: What a report row says, most severe first.
MERGED = "merged"  # two conversations (or senders) in one session: evidence found
FORGED_PEER_THREAD = "forged_peer_thread"  # opened by another agent than it names
PEER_SENDER_UNKNOWN = "peer_sender_unknown"  # its conversation id names no agent
AMBIGUOUS = "ambiguous"  # another source could have made its key; no sign one did
UNRECOGNISED = "unrecognised"  # its key is not what its source gives: kept as it was
FINDINGS = (MERGED, FORGED_PEER_THREAD, PEER_SENDER_UNKNOWN, AMBIGUOUS, UNRECOGNISED)

#: Keys cut into more parts than this are not read every way (combinations explode);
#: they are ambiguous anyway.
_MAX_PARTS_READ = 12
_SHOWN = 5  # ids and readings quoted per finding
_BATCH = 500  # sessions whose messages one statement reads
_DM_SHAPES = (
    ("chat_id",), ("chat_id", "thread_id"), ("user_id",), ("user_id", "thread_id"), ("thread_id",),
)  # fmt: skip
_GROUP_SHAPES = (
    ("chat_id",), ("chat_id", "thread_id"), ("chat_id", "user_id"),
    ("chat_id", "thread_id", "user_id"),
)  # fmt: skip
_PEER_ACTIONS = ("peer.send", "peer.delegate")


@dataclass
class _Session:
    session_id: str
    agent: str
    status: int
    old_key: str
    summary: bytes | None
    opened: Event | None
    upgrade: legacy_keys.Upgrade = field(default_factory=lambda: legacy_keys.Upgrade(""))

    @property
    def source(self) -> Source | None:
        body = self.opened.body if self.opened is not None else None
        return body.source if isinstance(body, SessionOpened) else None


@dataclass(frozen=True)
class Finding:
    session_id: str
    agent: str
    status: str
    old_key: str
    new_key: str
    finding: str
    evidence: str


def migrate(schema: Schema) -> list[Finding]:
    """Rekeys every session, its summary and its routes; writes and returns the report."""
    sessions = _sessions(schema)
    for session in sessions:
        session.upgrade = legacy_keys.upgrade(session.agent, session.old_key, session.source)
        _rekey(schema, session)
    _reroute(schema, sessions)
    findings = _Analysis(schema, sessions).findings()
    for found in findings:
        schema.execute(
            "INSERT INTO session_key_report "
            "(session_id, agent, status, old_key, new_key, finding, evidence) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (found.session_id, found.agent, found.status, found.old_key, found.new_key,
             found.finding, found.evidence),
        )  # fmt: skip
    return findings


def reported(store: SessionStore) -> list[Finding]:
    """The report the migration wrote, most severe first."""
    with store.database.connection_context():
        rows = store.projections.key_report()
    return sorted(
        (Finding(**row) for row in rows),
        key=lambda f: (FINDINGS.index(f.finding), f.agent, f.session_id),
    )


def announce(store: SessionStore) -> None:
    """One warning at start-up while the report lists sessions."""
    found = reported(store)
    if found:
        log.warning("routing keys: %s", summary_line(counts(found)))


def counts(findings: list[Finding]) -> dict[str, int]:
    counted: dict[str, int] = defaultdict(int)
    for found in findings:
        counted[found.finding] += 1
    return dict(counted)


def summary_line(counted: dict[str, int]) -> str:
    """One line for operators: what the key upgrade found, and where to read it."""
    shown = ", ".join(f"{counted[name]} {name}" for name in FINDINGS if counted.get(name))
    return (
        f"the upgrade to injective routing keys reported sessions ({shown}): sessions two "
        "conversations may have shared under one old key. `switchboard session key-report` "
        "lists them with the evidence; a merged session stays its first conversation's, the "
        "other conversation continues in a session of its own"
    )


def _sessions(schema: Schema) -> list[_Session]:
    opened: dict[str, Event] = {}
    rows = schema.execute(
        "SELECT session_id, format, payload FROM session_log "
        "WHERE kind = ? AND active = ? ORDER BY seq",
        ("session_opened", True),
    ).fetchall()
    for session_id, format_number, payload in rows:
        if int(format_number) == storage_format.JOINED_KEYS:  # all, before this migration
            opened[str(session_id)] = storage_format.decode_event_as_written(1, payload)
    rows = schema.execute(
        "SELECT session_id, agent, status, routing_key, summary FROM session_session "
        "WHERE routing_key <> ? ORDER BY created_seq",
        ("",),
    ).fetchall()
    return [
        _Session(
            session_id=str(sid),
            agent=str(agent),
            status=int(status),
            old_key=str(key),
            summary=None if summary is None else bytes(summary),
            opened=opened.get(str(sid)),
        )
        for sid, agent, status, key, summary in rows
    ]


def _rekey(schema: Schema, session: _Session) -> None:
    new_key = session.upgrade.key
    if new_key == session.old_key:
        return
    summary = session.summary
    if summary is not None:
        decoded = storage_format.decode_session_summary(summary)
        decoded.routing_key = new_key
        summary = storage_format.encode_summary(decoded)
    schema.execute(
        "UPDATE session_session SET routing_key = ?, summary = ? WHERE session_id = ?",
        (new_key, summary, session.session_id),
    )


def _reroute(schema: Schema, sessions: list[_Session]) -> None:
    """Every route to its session's new key (all deleted first: a new key may equal
    another route's old one only in theory, but the primary key would not wait)."""
    renamed = {(s.agent, s.old_key, s.session_id): s.upgrade.key for s in sessions}
    routes = schema.execute("SELECT agent, routing_key, session_id FROM session_route").fetchall()
    schema.execute("DELETE FROM session_route")
    for agent, key, session_id in routes:
        new_key = renamed.get((str(agent), str(key), str(session_id)), str(key))
        schema.execute(
            "INSERT INTO session_route (agent, routing_key, session_id) VALUES (?, ?, ?)",
            (agent, new_key, session_id),
        )


class _Analysis:
    def __init__(self, schema: Schema, sessions: list[_Session]) -> None:
        self.schema = schema
        self.sessions = sessions
        by_key: dict[tuple[str, str], list[_Session]] = defaultdict(list)
        for session in sessions:
            by_key[(session.agent, session.old_key)].append(session)
        self.by_key = by_key
        #: Per chat session, its old key's other readings (None: too many to read).
        self._readings: dict[str, dict[str, Source] | None] = {}
        #: Per doubtful session, the people its user messages came from.
        self._people: dict[str, set[str]] = {}

    def findings(self) -> list[Finding]:
        self._readings = {
            session.session_id: other_readings(
                session.agent, source, session.upgrade.policy or RoutingPolicy(), session.old_key
            )
            for session in self.sessions
            if (source := session.upgrade.source) is not None
            and source.transport not in routing.NON_CHAT_TRANSPORTS
            and not session.upgrade.kept
        }
        doubtful = [
            session.session_id
            for session in self.sessions
            if self._readings.get(session.session_id, {}) != {} or self._shared_key(session)
        ]
        self._people = self._people_of(doubtful)
        found = [self._finding(session) for session in self.sessions]
        return [f for f in found if f is not None]

    def _finding(self, session: _Session) -> Finding | None:
        source, upgrade = session.upgrade.source, session.upgrade
        if upgrade.kept or source is None:
            reason = upgrade.kept or "its session has no stored source"
            return self._row(session, UNRECOGNISED, [f"kept as it was: {reason}"])
        if source.transport == routing.PEER:
            return self._peer_finding(session, source)
        if source.transport in routing.NON_CHAT_TRANSPORTS:
            return None  # one id, its transport's own namespace: nothing to confuse
        return self._chat_finding(session, source)

    def _row(self, session: _Session, finding: str, evidence: list[str]) -> Finding:
        status = "open" if session.status == SessionStatus.OPEN else "ended"
        return Finding(
            session.session_id, session.agent, status, session.old_key, session.upgrade.key,
            finding, "; ".join(evidence),
        )  # fmt: skip

    # -- chat sessions -----------------------------------------------------------------------

    def _chat_finding(self, session: _Session, source: Source) -> Finding | None:
        readings = self._readings[session.session_id]
        shared = self._shared_key(session)
        if readings == {} and not shared:
            return None
        signs = shared + self._sender_evidence(session, source, readings or {})
        evidence = []
        if readings is None:
            evidence.append(f"the old key has more than {_MAX_PARTS_READ} ':'-separated parts")
        elif readings:
            evidence.append(f"the old key also reads as {', '.join(list(readings)[:_SHOWN])}")
        return self._row(session, MERGED if signs else AMBIGUOUS, evidence + signs)

    def _shared_key(self, session: _Session) -> list[str]:
        """Other sessions that held the same old key for another source (one ended,
        the next conversation on the key opened another)."""
        others = [
            other.session_id
            for other in self.by_key[(session.agent, session.old_key)]
            if other is not session and other.upgrade.key != session.upgrade.key
        ]
        if not others:
            return []
        return [f"the old key also held session(s) of another source: {', '.join(others)}"]

    def _sender_evidence(
        self, session: _Session, source: Source, readings: dict[str, Source]
    ) -> list[str]:
        people = self._people.get(session.session_id, set())
        evidence = []
        if source.chat_type == ChatType.DM or ":u=" in session.upgrade.key:  # one person's
            if source.user_id and people - {source.user_id}:
                strangers = sorted(people - {source.user_id})
                evidence.append(
                    f"messages from {len(strangers)} sender(s) besides its user "
                    f"{source.user_id}: {', '.join(strangers[:_SHOWN])}"
                )
            elif not source.user_id and len(people) > 1:
                shown = ", ".join(sorted(people)[:_SHOWN])
                evidence.append(f"messages from {len(people)} senders: {shown}")
        their_users = {other.user_id for key, other in readings.items() if ":u=" in key}
        seen = sorted((their_users & people) - {source.user_id})
        if seen:
            evidence.append(f"sender(s) {', '.join(seen[:_SHOWN])}: another reading's user")
        return evidence

    def _people_of(self, session_ids: list[str]) -> dict[str, set[str]]:
        """Per session, the senders of its user messages that name people (not agents),
        read a batch of sessions per statement."""
        people: dict[str, set[str]] = defaultdict(set)
        for start in range(0, len(session_ids), _BATCH):
            batch = session_ids[start : start + _BATCH]
            rows = self.schema.execute(
                "SELECT session_id, format, payload FROM session_log WHERE kind IN (?, ?) "
                f"AND active = ? AND session_id IN ({', '.join('?' * len(batch))})",
                (MESSAGE_APPENDED, INBOX_POSTED, True, *batch),
            ).fetchall()
            for session_id, format_number, payload in rows:
                body = storage_format.decode_event(int(format_number), payload).body
                message = body.message if isinstance(body, (MessageAppended, InboxPosted)) else None
                if message is None or message.role != Role.USER:
                    continue
                if message.sender and not message.sender.startswith("agent:"):
                    people[str(session_id)].add(message.sender)
        return people

    # -- peer threads ------------------------------------------------------------------------

    def _peer_finding(self, session: _Session, source: Source) -> Finding | None:
        named = source.from_agent
        opened = session.opened
        assert opened is not None
        opener = self._audited_sender(opened, session.session_id)
        evidence = []
        if opener and opener != named:
            evidence.append(
                f"opened by agent {opener!r} (its gate's audit at sequence {opened.sequence - 1})"
                + (f" under a conversation id naming agent {named!r}" if named else "")
            )
        strangers = self._peer_posters(session, named)
        evidence += strangers
        if not named:
            evidence.insert(0, f"its conversation id {source.conversation_id!r} names no agent")
            return self._row(session, PEER_SENDER_UNKNOWN, evidence)
        if opener and opener != named:
            return self._row(session, FORGED_PEER_THREAD, evidence)
        return self._row(session, MERGED, evidence) if evidence else None

    def _peer_posters(self, session: _Session, named: str) -> list[str]:
        rows = self.schema.execute(
            "SELECT format, payload FROM session_log WHERE session_id = ? AND kind = ? "
            "AND active = ? ORDER BY seq",
            (session.session_id, "inbox_posted", True),
        ).fetchall()
        evidence = []
        for format_number, payload in rows:
            posted = storage_format.decode_event(int(format_number), payload)
            poster = self._audited_sender(posted, session.session_id)
            if poster and poster != named:
                evidence.append(
                    f"agent {poster!r} posted at sequence {posted.sequence} (peer gate audit)"
                )
        return evidence[:_SHOWN]

    def _audited_sender(self, event: Event, session_id: str) -> str:
        """The agent whose peer gate let `event` in: the gate commits its audit record
        just before, in the same transaction (same time); "" when none is there."""
        sequence = event.sequence - 1
        for _ in range(2):  # the audit, or the SessionOpened the same call logged first
            row = self.schema.execute(
                "SELECT agent, session_id, format, payload FROM session_log WHERE seq = ?",
                (sequence,),
            ).fetchone()
            if row is None:
                return ""
            before = storage_format.decode_event(int(row[2]), row[3])
            if before.time != event.time:
                return ""
            if isinstance(before.body, SessionOpened) and row[1] == session_id:
                sequence -= 1
                continue
            audit = before.body
            if (
                isinstance(audit, PermissionChecked)
                and audit.allowed
                and audit.action in _PEER_ACTIONS
                and audit.resource == f"agent:{event.agent}"
            ):
                return str(row[0])
            return ""
        return ""


def other_readings(
    agent: str, source: Source, policy: RoutingPolicy, old_key: str
) -> dict[str, Source] | None:
    """The other sources (same transport and chat type, under `policy`) the old rule
    turned into `old_key`, by their new keys: how another conversation could have
    reached this session. A DM's one id in another role (chat, user or thread) names
    the same conversation and is not counted; nor is, for a redacting agent (its
    stored ids hashed), a reading whose chat or user id is not hashed: that agent
    stores no such id. None when the key has too many parts to read every way."""
    blank = replace(source, scope_id="", chat_id="", thread_id="", user_id="")
    head = legacy_keys.legacy_key(agent, blank, policy)
    tail = old_key[len(head) + 1 :] if old_key.startswith(f"{head}:") else ""
    parts = tail.split(":") if tail else []
    if len(parts) > _MAX_PARTS_READ:
        return None
    own = routing.unbounded_key(agent, source, policy)
    readings: dict[str, Source] = {}
    hashed = _hashed_ids(source)
    for candidate in _candidates(blank, parts):
        if legacy_keys.legacy_key(agent, candidate, policy) != old_key:
            continue
        if _one_dm_id(candidate) and _one_dm_id(candidate) == _one_dm_id(source):
            continue
        if hashed and not _hashed_ids(candidate, every=True):
            continue
        key = routing.unbounded_key(agent, candidate, policy)
        if key != own:
            readings.setdefault(key, candidate)
    return readings


def _hashed_ids(source: Source, every: bool = False) -> bool:
    """Whether the source's chat and user ids are redacted ones: any of them, or
    `every` one present (and one at least)."""
    checks = [
        pii.is_redacted_chat(source.transport, source.chat_id) if source.chat_id else None,
        pii.is_redacted_user(source.user_id) if source.user_id else None,
    ]
    present = [check for check in checks if check is not None]
    return bool(present) and all(present) if every else any(present)


def _candidates(blank: Source, parts: list[str]) -> Iterator[Source]:
    shapes = _DM_SHAPES if blank.chat_type == ChatType.DM else _GROUP_SHAPES
    for taken in range(len(parts)):  # the first `taken` parts as a scope, or none
        scope, rest = ":".join(parts[:taken]), parts[taken:]
        for shape in shapes:
            for ids in _splits(rest, len(shape)):
                candidate = replace(blank, scope_id=scope)
                for name, value in zip(shape, ids, strict=True):
                    setattr(candidate, name, value)
                yield candidate


def _splits(parts: list[str], count: int) -> Iterator[list[str]]:
    """Every way to cut `parts` into `count` non-empty runs, each joined with ':'."""
    if len(parts) < count:
        return
    for cuts in itertools.combinations(range(1, len(parts)), count - 1):
        bounds = (0, *cuts, len(parts))
        yield [":".join(parts[start:end]) for start, end in itertools.pairwise(bounds)]


def _one_dm_id(source: Source) -> str:
    """A DM's only id, whichever field holds it ("" for none, several, or no DM)."""
    if source.chat_type != ChatType.DM:
        return ""
    ids = [source.chat_id or source.user_id, source.thread_id]
    present = [value for value in ids if value]
    return present[0] if len(present) == 1 else ""
