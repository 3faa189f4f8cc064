"""The SessionService's schema migrations, in order (how to add one: `switchboard.migrations`).

The models below are frozen copies of the tables as migration 1 (the baseline,
the schema of the release before versioning) creates them. They are not the
store's models in `session_service.storage.schema`: those keep changing, a shipped
migration never does.
"""

from __future__ import annotations

import peewee

from session_service import key_migration, records, storage_format
from switchboard.idempotency import SESSION_REQUESTS, RequestRecordV1
from switchboard.migrations import Component, Schema


class LogHeadV1(peewee.Model):
    id = peewee.IntegerField(primary_key=True)
    seq = peewee.BigIntegerField()

    class Meta:
        table_name = "session_log_head"


class EventV1(peewee.Model):
    seq = peewee.BigIntegerField(primary_key=True)
    agent = peewee.CharField(max_length=64)
    session_id = peewee.CharField(max_length=128, null=True)
    kind = peewee.CharField(max_length=32)
    payload = peewee.BlobField()
    tool_ref = peewee.TextField(null=True)

    class Meta:
        table_name = "session_log"
        indexes = (
            (("session_id", "seq"), False),
            (("agent", "session_id", "seq"), False),
            (("session_id", "kind", "seq"), False),
        )


class AgentV1(peewee.Model):
    name = peewee.CharField(max_length=64, primary_key=True)
    archived = peewee.BooleanField()
    version = peewee.BigIntegerField()
    last_seq = peewee.BigIntegerField()
    snapshot_version = peewee.BigIntegerField()

    class Meta:
        table_name = "session_agent"


class SessionV1(peewee.Model):
    session_id = peewee.CharField(max_length=128, primary_key=True)
    agent = peewee.CharField(max_length=64)
    routing_key = peewee.TextField()
    transport = peewee.CharField(max_length=32)
    status = peewee.IntegerField()
    created_seq = peewee.BigIntegerField()
    last_seq = peewee.BigIntegerField()
    version = peewee.BigIntegerField()
    snapshot_version = peewee.BigIntegerField()
    resume_pending = peewee.BooleanField(default=False)

    class Meta:
        table_name = "session_session"
        indexes = ((("agent", "created_seq"), False),)


class RouteV1(peewee.Model):
    agent = peewee.CharField(max_length=64)
    routing_key = peewee.CharField(max_length=512)
    session_id = peewee.CharField(max_length=128)

    class Meta:
        table_name = "session_route"
        primary_key = peewee.CompositeKey("agent", "routing_key")


class SnapshotV1(peewee.Model):
    entity = peewee.CharField(max_length=200)
    seq = peewee.BigIntegerField()
    state = peewee.BlobField()

    class Meta:
        table_name = "session_snapshot"
        primary_key = peewee.CompositeKey("entity", "seq")


class RewindV1(peewee.Model):
    seq = peewee.BigIntegerField(primary_key=True)
    target = peewee.BigIntegerField()

    class Meta:
        table_name = "session_rewind"


class CheckpointV1(peewee.Model):
    label = peewee.CharField(max_length=128, primary_key=True)
    seq = peewee.BigIntegerField()
    created_at = peewee.DoubleField()

    class Meta:
        table_name = "session_checkpoint"


class RetentionV1(peewee.Model):
    id = peewee.IntegerField(primary_key=True)
    retained_from = peewee.BigIntegerField()

    class Meta:
        table_name = "session_retention"


BASELINE_MODELS: tuple[type[peewee.Model], ...] = (
    LogHeadV1, EventV1, AgentV1, SessionV1, RouteV1, SnapshotV1, RewindV1, CheckpointV1,
    RetentionV1,
)  # fmt: skip


def _seed_baseline(schema: Schema) -> None:
    # The log's sequence counter and the retention floor are single rows the
    # store updates, never inserts.
    schema.seed(LogHeadV1, id=1, seq=0)
    schema.seed(RetentionV1, id=1, retained_from=0)


def baseline(schema: Schema) -> None:
    """The log, its projections, snapshots, rewinds, checkpoints and retention."""
    schema.create_tables(*BASELINE_MODELS)
    _seed_baseline(schema)


def adopt_unversioned(schema: Schema) -> None:
    """A database made before versioning: add what the baseline has and it lacks
    (older releases lacked e.g. `session_session.resume_pending`, `session_log.tool_ref`
    and the time-travel tables)."""
    schema.complete(*BASELINE_MODELS)
    _seed_baseline(schema)


class SessionRequestRecordV2(RequestRecordV1):
    class Meta:
        table_name = SESSION_REQUESTS


def request_records(schema: Schema) -> None:
    """Calls remembered by request id, so that a retry is answered, not redone."""
    schema.create_tables(SessionRequestRecordV2)


def projection_summaries(schema: Schema) -> None:
    """Projection rows keep their agent's and session's summary (ListSessions reads rows)."""
    # NULL until filled: the summary is the fold of the log (live code, not a frozen
    # copy), so the server fills the rows at start (`recovery.fill_summaries`) and
    # reads fold a row without one.
    for table in ("session_agent", "session_session"):
        schema.run(schema.migrator.add_column(table, "summary", peewee.BlobField(null=True)))


def _abandoned_v4(records: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Frozen copy of `session_service.timeline.Timeline.from_records` as of migration
    4: the open intervals (target, record) that count, latest record first."""
    kept: list[tuple[int, int]] = []
    for seq, target in sorted(records, reverse=True):
        if kept and seq > min(low for low, _ in kept):
            continue  # inside a later record's interval: it counts for nothing
        kept.append((target, seq))
    return kept


def active_markers(schema: Schema) -> None:
    """Log rows and snapshots say whether they are active, backfilled from the rewinds."""
    schema.run(
        schema.migrator.add_column("session_log", "active", peewee.BooleanField(default=True)),
        schema.migrator.add_column("session_snapshot", "active", peewee.BooleanField(default=True)),
    )
    records = schema.execute("SELECT seq, target FROM session_rewind").fetchall()
    for low, high in _abandoned_v4([(int(seq), int(target)) for seq, target in records]):
        for table in ("session_log", "session_snapshot"):
            schema.execute(
                f"UPDATE {table} SET active = ? WHERE seq > ? AND seq < ? AND active = ?",
                (False, low, high, True),
            )
    schema.run(
        schema.migrator.add_index("session_log", ("session_id", "active", "seq"), False),
        schema.migrator.add_index("session_log", ("agent", "session_id", "active", "seq"), False),
        schema.migrator.add_index("session_log", ("session_id", "kind", "active", "seq"), False),
        schema.migrator.add_index("session_snapshot", ("entity", "active", "seq"), False),
        schema.migrator.add_index("session_snapshot", ("seq",), False),
    )


class LineageV5(peewee.Model):
    session_id = peewee.CharField(max_length=128)
    ancestor_id = peewee.CharField(max_length=128)
    until_seq = peewee.BigIntegerField()

    class Meta:
        table_name = "session_lineage"
        primary_key = peewee.CompositeKey("session_id", "ancestor_id")


def fork_lineage(schema: Schema) -> None:
    """Forks read their ancestors' history up to each fork point instead of copying it.
    Nothing to backfill: forks made before copied their history (the flag on their
    `SessionOpened` says so), and only forks made from now on get lineage rows."""
    schema.create_tables(LineageV5)


def storage_formats(schema: Schema) -> None:
    """Log and snapshot rows name the storage format of their bytes (`storage_format`):
    every row so far is format 1, the encoding of the session.v1 messages."""
    for table in ("session_log", "session_snapshot"):
        column = peewee.SmallIntegerField(default=1)
        schema.run(schema.migrator.add_column(table, "format", column))


def session_listing_indexes(schema: Schema) -> None:
    """ListSessions across agents reads the newest sessions first, or one routing
    key's: an index for each, so a page costs the same however many sessions exist.
    IF NOT EXISTS: a database brought back to an earlier version by hand may keep them."""
    for column in ("created_seq", "routing_key"):
        schema.execute(
            f"CREATE INDEX IF NOT EXISTS session_session_{column} ON session_session ({column})"
        )


class VersionFloorV8(peewee.Model):
    entity = peewee.CharField(max_length=200, primary_key=True)
    version = peewee.BigIntegerField()

    class Meta:
        table_name = "session_version_floor"


def version_floors(schema: Schema) -> None:
    """Versions of agents and sessions whose events a truncation deleted are kept, so that
    an id created again never repeats one. Nothing to backfill: what was truncated before
    is gone (such an id may still repeat a version it had before this migration)."""
    schema.create_tables(VersionFloorV8)


class SharedSettingV9(peewee.Model):
    name = peewee.CharField(max_length=128, primary_key=True)
    value = peewee.TextField()

    class Meta:
        table_name = "session_shared_setting"


def shared_settings(schema: Schema) -> None:
    """The settings every replica must agree on (`switchboard.shared_settings`)."""
    schema.create_tables(SharedSettingV9)


def inbound_refs(schema: Schema) -> None:
    """Inbox posts keep their message_ref, unique per session among active log rows:
    one inbound message per platform message. Nothing to backfill: posts logged
    before count for nothing (and may hold duplicates already)."""
    schema.run(
        schema.migrator.add_column("session_log", "inbound_ref", peewee.TextField(null=True))
    )
    # Partial, so that it costs nothing for the rows without a ref and frees a ref
    # the moment a rewind abandons its post (the same text as the store's model).
    schema.execute(
        "CREATE UNIQUE INDEX session_log_inbound_ref ON session_log (session_id, inbound_ref) "
        "WHERE inbound_ref IS NOT NULL AND active"
    )


class KeyReportV11(peewee.Model):
    session_id = peewee.CharField(max_length=128, primary_key=True)
    agent = peewee.CharField(max_length=64)
    status = peewee.CharField(max_length=16)
    old_key = peewee.TextField()
    new_key = peewee.TextField()
    finding = peewee.CharField(max_length=32)
    evidence = peewee.TextField()

    class Meta:
        table_name = "session_key_report"


def injective_routing_keys(schema: Schema) -> None:
    """Routing keys in the injective encoding; sessions old keys may have merged, reported."""
    # The log keeps its old keys (its rows are storage format 1, read upgraded).
    schema.create_tables(KeyReportV11)
    key_migration.migrate(schema)


class StateValueV12(peewee.Model):
    owner = peewee.CharField(max_length=400)
    key = peewee.CharField(max_length=256)
    value = peewee.TextField()
    seq = peewee.BigIntegerField()

    class Meta:
        table_name = "session_state_value"
        primary_key = peewee.CompositeKey("owner", "key")


class StateEventV12(peewee.Model):
    seq = peewee.BigIntegerField(primary_key=True)
    owner = peewee.CharField(max_length=400)

    class Meta:
        table_name = "session_state_event"
        indexes = ((("owner", "seq"), False),)


class StateBaseV12(peewee.Model):
    owner = peewee.CharField(max_length=400)
    key = peewee.CharField(max_length=256)
    value = peewee.TextField()

    class Meta:
        table_name = "session_state_base"
        primary_key = peewee.CompositeKey("owner", "key")


class RecordV12(peewee.Model):
    seq = peewee.BigIntegerField()
    position = peewee.IntegerField()
    agent = peewee.CharField(max_length=64)
    session_id = peewee.CharField(max_length=128)
    kind = peewee.CharField(max_length=64)
    namespace = peewee.CharField(max_length=512)
    key = peewee.CharField(max_length=512)
    parent_key = peewee.CharField(max_length=512)
    metadata = peewee.TextField()
    labels = peewee.TextField()
    payload_size = peewee.BigIntegerField()

    class Meta:
        table_name = "session_record"
        primary_key = peewee.CompositeKey("seq", "position")
        indexes = (
            (("session_id", "kind", "namespace", "key", "seq"), False),
            (("session_id", "kind", "namespace", "seq"), False),
            (("session_id", "kind", "seq"), False),
            (("session_id", "kind", "namespace", "parent_key", "seq"), False),
            (("agent", "kind", "seq"), False),
        )


class RecordLabelV12(peewee.Model):
    seq = peewee.BigIntegerField()
    position = peewee.IntegerField()
    name = peewee.CharField(max_length=64)
    value = peewee.CharField(max_length=256)
    agent = peewee.CharField(max_length=64)
    session_id = peewee.CharField(max_length=128)
    kind = peewee.CharField(max_length=64)

    class Meta:
        table_name = "session_record_label"
        primary_key = peewee.CompositeKey("seq", "position", "name")
        indexes = (
            (("agent", "kind", "name", "value"), False),
            (("session_id", "kind", "name", "value"), False),
        )


class RetractionV12(peewee.Model):
    message_seq = peewee.BigIntegerField()
    session_id = peewee.CharField(max_length=128)
    by_seq = peewee.BigIntegerField()

    class Meta:
        table_name = "session_retraction"
        primary_key = peewee.CompositeKey("message_seq", "session_id")
        indexes = ((("by_seq",), False), (("session_id",), False))


class SessionUserV12(peewee.Model):
    session_id = peewee.CharField(max_length=128, primary_key=True)
    agent = peewee.CharField(max_length=64)
    user_id = peewee.CharField(max_length=256)

    class Meta:
        table_name = "session_of_user"
        indexes = ((("agent", "user_id"), False),)


class ErasedIdV12(peewee.Model):
    session_id = peewee.CharField(max_length=128, primary_key=True)
    agent = peewee.CharField(max_length=64)
    erased_seq = peewee.BigIntegerField()

    class Meta:
        table_name = "session_erased_id"


class ErasedKeyV12(peewee.Model):
    agent = peewee.CharField(max_length=64)
    key_digest = peewee.CharField(max_length=64)
    erased_seq = peewee.BigIntegerField()

    class Meta:
        table_name = "session_erased_key"
        primary_key = peewee.CompositeKey("agent", "key_digest")


class RequestSubjectV12(peewee.Model):
    session_id = peewee.CharField(max_length=128)
    principal = peewee.CharField(max_length=160)
    request_id = peewee.CharField(max_length=64)
    created_at = peewee.DoubleField(index=True)

    class Meta:
        table_name = "session_request_subject"
        primary_key = peewee.CompositeKey("session_id", "principal", "request_id")


FRAMEWORK_MODELS_V12: tuple[type[peewee.Model], ...] = (
    StateValueV12, StateEventV12, StateBaseV12, RecordV12, RecordLabelV12, RetractionV12,
    SessionUserV12, ErasedIdV12, ErasedKeyV12, RequestSubjectV12,
)  # fmt: skip
#: The tables migration 12 creates (for tests that take a database back before it).
FRAMEWORK_TABLES = tuple(model._meta.table_name for model in FRAMEWORK_MODELS_V12)


def framework_read_models(schema: Schema) -> None:
    """What agent frameworks store: scoped state, stored records, retractions,
    sessions by user, and what erasure remembers (erased ids and keys, the sessions
    each remembered request answer names). Sessions by user are backfilled from the
    sessions' opening events (no event of the other kinds was logged before)."""
    schema.create_tables(*FRAMEWORK_MODELS_V12)
    opened = schema.execute(
        "SELECT l.format, l.payload FROM session_log l JOIN session_session s "
        "ON s.session_id = l.session_id WHERE l.kind = 'session_opened' AND l.active = ?",
        (True,),
    ).fetchall()
    for format_number, payload in opened:
        event = storage_format.decode_event(int(format_number), payload)
        body = event.body
        if isinstance(body, records.SessionOpened) and body.source and body.source.user_id:
            schema.execute(
                "INSERT INTO session_of_user (session_id, agent, user_id) VALUES (?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                (event.session_id, event.agent, body.source.user_id),
            )


MIGRATIONS = (
    baseline,
    request_records,
    projection_summaries,
    active_markers,
    fork_lineage,
    storage_formats,
    session_listing_indexes,
    version_floors,
    shared_settings,
    inbound_refs,
    injective_routing_keys,
    framework_read_models,
)

SESSION_SCHEMA = Component(
    name="session",
    history_table="session_schema_history",
    migrations=MIGRATIONS,
    adopt=adopt_unversioned,
    legacy_tables=("session_log", "session_log_head", "session_session", "session_agent"),
)
