"""Exactly-once writes under retries: request ids remembered with the write they answer.

A call that carries a request id (AIP-155) runs its write op wrapped by
`RequestGuard.run`, inside the op's own transaction (or savepoint, under group
commit):

1. prune a bounded batch of expired records, when due;
2. in one statement, try to lock the id for the rest of the transaction and
   read its record (caller's principal, request id). On Postgres the lock is a
   transaction-scoped advisory lock taken without waiting: an attempt racing one
   still open answers UNAVAILABLE (REQUEST_IN_FLIGHT; the clients retry it with
   the same id and get the replay), because waiting inside a group-commit batch
   could deadlock. A racer in the same batch holds the lock already and finds
   the record; SQLite's writers take turns anyway;
3. if there is a record: the same method and fingerprint replay the stored
   answer (`Replayed`), anything else is REQUEST_ID_REUSED; either way the op
   does not run and nothing is written;
4. else run the op and insert the record with its serialized answer (no other
   transaction can insert it meanwhile: it would need the lock).

So "committed" and "recorded" cannot disagree, and a failed op (a domain error
rolls its savepoint back) leaves no record: its retry runs again.

The guard travels as an argument: the servicer side (`switchboard.mutations`)
makes one per call and hands it to the handler, the handler to its rule, and the
rule to its first write (`TransactionRunner.write(op, guard)`), so that only the
call's first write carries its request id. Nothing here knows protobuf: the answer
arrives as an encoder.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import peewee

from switchboard.database import Backend, bind_model
from switchboard.errors import DomainError, InvalidArgument, Unavailable

T = TypeVar("T")

DEFAULT_WINDOW_S = 24 * 3600.0
MAX_REQUEST_ID_LEN = 64
_REQUEST_ID = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_REQUEST_ID_LEN}}}")
#: Expired records deleted per prune: bounded, so a prune never costs a call much.
PRUNE_BATCH = 500
#: The longest a process waits between prunes (shorter windows prune sooner).
MAX_PRUNE_INTERVAL_S = 10.0


class RequestRecord(peewee.Model):
    """A remembered call. Each service has a table of its own (`SESSION_REQUESTS`,
    `LEDGER_REQUESTS`, created by its migrations), so the two can share a database."""

    principal = peewee.CharField(max_length=160)
    request_id = peewee.CharField(max_length=MAX_REQUEST_ID_LEN)
    method = peewee.CharField(max_length=200)
    fingerprint = peewee.CharField(max_length=64)  # (keyed) sha256 hex of the request sans id
    response = peewee.BlobField()
    created_at = peewee.DoubleField(index=True)

    class Meta:
        primary_key = peewee.CompositeKey("principal", "request_id")


SESSION_REQUESTS = "session_request_record"
LEDGER_REQUESTS = "ledger_request_record"


class RequestRecordV1(peewee.Model):
    """The record table as the services' migrations first create it: frozen (a
    shipped migration never changes), while `RequestRecord` may move on."""

    principal = peewee.CharField(max_length=160)
    request_id = peewee.CharField(max_length=MAX_REQUEST_ID_LEN)
    method = peewee.CharField(max_length=200)
    fingerprint = peewee.CharField(max_length=64)
    response = peewee.BlobField()
    created_at = peewee.DoubleField(index=True)

    class Meta:
        primary_key = peewee.CompositeKey("principal", "request_id")


def checked_request_id(value: str) -> str:
    if not _REQUEST_ID.fullmatch(value):
        raise InvalidArgument(
            "request_id",
            f"must be 1-{MAX_REQUEST_ID_LEN} letters, digits, '-' or '_' (a UUID)",
        )
    return value


class Replayed(DomainError):
    """The call ran before with this request id: here is its answer.

    Raised inside the transaction so that the runner rolls the attempt back like
    a refusal (it wrote nothing) and the rule's code after its write is skipped;
    `switchboard.mutations` turns it back into the stored response.
    """

    def __init__(self, response: bytes) -> None:
        super().__init__("REPLAYED", "answered from the request-id record")
        self.response = response


class NotAnAnswer:
    """Base of op results that the rule turns into an error after the commit
    (a committed denial, say): they are not remembered, so a retry decides again."""


@dataclass(frozen=True)
class StoredRequest:
    method: str
    fingerprint: str
    response: bytes
    created_at: float


class RequestStore:
    """The record table's SQL; every method runs in the caller's transaction."""

    def __init__(
        self,
        backend: Backend,
        table: str,
        window_s: float = DEFAULT_WINDOW_S,
        fingerprint_key: bytes | None = None,
        subject_table: str = "",
    ) -> None:
        """`subject_table`: where each record's subjects go (the sessions its request
        or answer names: `RequestGuard.subjects`), so that an erasure finds the
        answers that carry a session's content; "" keeps none."""
        if window_s <= 0:
            raise ValueError("the request-id window must be positive")
        self.backend = backend
        self.window_s = window_s
        #: Keys the stored request fingerprints (HMAC): a plain digest of a request
        #: that carries a short platform id gives the id away to brute force.
        self.fingerprint_key = fingerprint_key
        self.prune_interval_s = min(MAX_PRUNE_INTERVAL_S, window_s)
        self.Record = bind_model(RequestRecord, backend.database, table)
        self._database: Any = backend.database
        sql = backend.sql
        # One round trip before the op: take the id's lock and read its record. With
        # concurrent writers (Postgres), an attempt must not wait for another open
        # transaction working on the same id while it may hold locks an earlier op of
        # its group-commit batch took (a deadlock), so the lock is only tried
        # (`Backend.try_lock_sql`); SQLite's one writer needs none. Under that lock
        # no other transaction can add the record, so reading first and writing the
        # record with its answer after the op is race-free: one write, not two.
        self._lock_and_select = sql(
            f"SELECT {backend.try_lock_sql}, r.method, r.fingerprint, r.response, "
            f"r.created_at FROM (SELECT 1) AS one LEFT JOIN {table} AS r "
            "ON r.principal = ? AND r.request_id = ?"
        )
        self._insert = sql(
            f"INSERT INTO {table} "
            "(principal, request_id, method, fingerprint, response, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?)"
        )
        self._delete = sql(f"DELETE FROM {table} WHERE principal = ? AND request_id = ?")
        # Oldest first through the created_at index; on Postgres, rows another
        # writer is pruning (or whose call is still open) are skipped, not waited for.
        skip = " FOR UPDATE SKIP LOCKED" if backend.skip_locked else ""
        self._prune = sql(
            f"DELETE FROM {table} WHERE (principal, request_id) IN "
            f"(SELECT principal, request_id FROM {table} WHERE created_at < ? "
            f"ORDER BY created_at LIMIT {PRUNE_BATCH}{skip})"
        )
        self._next_prune = 0.0  # monotonic; per process, a hint, not a guarantee
        self.subject_table = subject_table
        self._insert_subject = sql(
            f"INSERT INTO {subject_table} (session_id, principal, request_id, created_at) "
            "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"
        )
        self._prune_subjects = sql(
            f"DELETE FROM {subject_table} WHERE (session_id, principal, request_id) IN "
            f"(SELECT session_id, principal, request_id FROM {subject_table} "
            f"WHERE created_at < ? ORDER BY created_at LIMIT {PRUNE_BATCH}{skip})"
        )

    def lock_and_get(self, principal: str, request_id: str) -> tuple[bool, StoredRequest | None]:
        """(False, _) when another open transaction is working on this id right now;
        else (True, the record or None)."""
        digest = hashlib.sha256(f"{principal}\0{request_id}".encode()).digest()
        key = int.from_bytes(digest[:8], "big", signed=True)
        row = self._database.execute_sql(
            self._lock_and_select, (key, principal, request_id)
        ).fetchone()
        if not row[0]:
            return False, None
        if row[1] is None:
            return True, None
        return True, StoredRequest(row[1], row[2], bytes(row[3]), float(row[4]))

    def insert(
        self,
        now: float,
        principal: str,
        request_id: str,
        method: str,
        print_: str,
        answer: bytes,
        subjects: Sequence[str] = (),
    ) -> None:
        self._database.execute_sql(
            self._insert, (principal, request_id, method, print_, answer, now)
        )
        if self.subject_table:
            for subject in sorted(set(subjects)):
                self._database.execute_sql(
                    self._insert_subject, (subject, principal, request_id, now)
                )

    def forget(self, principal: str, request_id: str) -> None:
        self._database.execute_sql(self._delete, (principal, request_id))

    def prune_if_due(self, now: float) -> int:
        """Deletes up to PRUNE_BATCH expired records, at most once per interval
        unless the last prune found a full batch (then at once again)."""
        if time.monotonic() < self._next_prune:
            return 0
        deleted = int(self._database.execute_sql(self._prune, (now - self.window_s,)).rowcount)
        if self.subject_table:
            subjects = self._database.execute_sql(self._prune_subjects, (now - self.window_s,))
            deleted = max(deleted, int(subjects.rowcount))
        if deleted < PRUNE_BATCH:
            self._next_prune = time.monotonic() + self.prune_interval_s
        return deleted

    def count(self) -> int:
        return int(self.Record.select().count())


@dataclass
class RequestGuard:
    """One call's request id on its way to the write transaction."""

    store: RequestStore
    principal: str
    request_id: str
    method: str
    fingerprint: str
    #: The op's result as the serialized response (built inside the transaction).
    encode: Callable[[Any], bytes]
    #: The response bytes of this attempt once its op ran (for the servicer).
    answer: bytes | None = field(default=None)
    #: What the record is found by besides its id (the sessions the request or its
    #: answer names), set by `encode`; kept when the store has a subject table.
    subjects: list[str] = field(default_factory=list)
    #: Whether a write took this guard already (`guarding`).
    taken: bool = field(default=False, init=False)

    def guarding(self, op: Callable[[float], T]) -> Callable[[float], T]:
        """`op` run under this guard (for the runner); a guard guards one write only:
        given to a second, that write would find the first's record and replay it."""
        if self.taken:
            raise RuntimeError(f"{self.method}: the request guard was given to a second write")
        self.taken = True
        return lambda now: self.run(op, now)

    def run(self, op: Callable[[float], T], now: float) -> T:
        store = self.store
        store.prune_if_due(now)
        key = (self.principal, self.request_id)
        locked, stored = store.lock_and_get(*key)
        if not locked:
            raise Unavailable(
                "REQUEST_IN_FLIGHT",
                "an attempt with this request_id is still running; retry with the same id",
            )
        if stored is not None and stored.created_at < now - store.window_s:
            store.forget(*key)  # expired but not pruned yet: the id is free again
            stored = None
        if stored is not None:
            self._refuse_reuse(stored)
            raise Replayed(stored.response)
        result = op(now)
        if isinstance(result, NotAnAnswer):
            return result
        # Encoded here, in the write's transaction: the stored answer commits with the write.
        self.answer = self.encode(result)
        store.insert(now, *key, self.method, self.fingerprint, self.answer, self.subjects)
        return result

    def _refuse_reuse(self, stored: StoredRequest) -> None:
        if stored.method != self.method:
            raise InvalidArgument(
                "request_id",
                f"was used for {stored.method.rsplit('/', 1)[-1]} already; "
                "use a fresh id for every call",
                reason="REQUEST_ID_REUSED",
            )
        if stored.fingerprint != self.fingerprint:
            raise InvalidArgument(
                "request_id",
                "was used for a different request already; a retry must repeat the "
                "request unchanged, a new call needs a fresh id",
                reason="REQUEST_ID_REUSED",
            )
