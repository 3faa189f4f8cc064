"""The DeliveryService's schema migrations, in order (how to add one: `switchboard.migrations`).

The models below are frozen copies of the tables as migration 1 (the baseline,
the schema of the release before versioning) creates them; the store's models
in `delivery_service.store` keep changing, a shipped migration never does.
"""

from __future__ import annotations

import re

import peewee

from switchboard.idempotency import LEDGER_REQUESTS, RequestRecordV1
from switchboard.migrations import Component, Schema


class InstanceV1(peewee.Model):
    id = peewee.CharField(max_length=64, primary_key=True)
    gateway_name = peewee.CharField(max_length=128)
    host = peewee.CharField(max_length=255)
    pid = peewee.BigIntegerField()
    platforms = peewee.TextField()
    registered_at = peewee.DoubleField()
    heartbeat_at = peewee.DoubleField()
    lease_expires_at = peewee.DoubleField()
    deregistered_at = peewee.DoubleField(null=True)

    class Meta:
        table_name = "ledger_instance"


class ObligationV1(peewee.Model):
    id = peewee.CharField(max_length=24, primary_key=True)
    session_key = peewee.TextField()
    message_ref = peewee.TextField()
    content = peewee.TextField()
    platform = peewee.CharField(max_length=32)
    chat_id = peewee.TextField()
    thread_id = peewee.TextField()
    metadata = peewee.TextField()
    state = peewee.CharField(max_length=16)
    owner_instance_id = peewee.CharField(max_length=64, null=True)
    fence = peewee.BigIntegerField()
    attempts = peewee.IntegerField()
    needs_marker = peewee.BooleanField()
    platform_message_id = peewee.TextField()
    last_error = peewee.TextField()
    created_at = peewee.DoubleField()
    updated_at = peewee.DoubleField()
    next_attempt_at = peewee.DoubleField(null=True)
    delivered_at = peewee.DoubleField(null=True)

    class Meta:
        table_name = "ledger_obligation"
        indexes = (
            (("state", "platform"), False),
            (("session_key", "created_at"), False),
            (("owner_instance_id",), False),
            (("created_at", "id"), False),
        )


BASELINE_MODELS: tuple[type[peewee.Model], ...] = (InstanceV1, ObligationV1)


def baseline(schema: Schema) -> None:
    """Gateway instances and the obligation ledger."""
    schema.create_tables(*BASELINE_MODELS)


def adopt_unversioned(schema: Schema) -> None:
    """A database made before versioning: add what the baseline has and it lacks."""
    schema.complete(*BASELINE_MODELS)


class SharedSettingV2(peewee.Model):
    name = peewee.CharField(max_length=128, primary_key=True)
    value = peewee.TextField()

    class Meta:
        table_name = "switchboard_shared_setting"


def shared_settings(schema: Schema) -> None:
    """The settings every replica must agree on (`switchboard.shared_settings`)."""
    schema.create_tables(SharedSettingV2)


class LedgerRequestRecordV3(RequestRecordV1):
    class Meta:
        table_name = LEDGER_REQUESTS


def request_records(schema: Schema) -> None:
    """Calls remembered by request id, so that a retry is answered, not redone."""
    schema.create_tables(LedgerRequestRecordV3)


#: Frozen copy of `delivery_service.records.agent_of`'s pattern, as of migration 4.
_AGENT_KEY_V4 = re.compile(r"agent:([a-z0-9][a-z0-9_-]{0,62}):")


def row_scope(schema: Schema) -> None:
    """Obligations remember their agent and gateway; instances who registered them."""
    schema.run(
        schema.migrator.add_column(
            "ledger_obligation", "agent", peewee.CharField(max_length=64, default="")
        ),
        schema.migrator.add_column(
            "ledger_obligation", "gateway_name", peewee.CharField(max_length=128, default="")
        ),
        schema.migrator.add_column("ledger_instance", "principal", peewee.TextField(default="")),
    )
    keys = schema.execute("SELECT DISTINCT session_key FROM ledger_obligation").fetchall()
    agents = {match.group(1) for (key,) in keys if (match := _AGENT_KEY_V4.match(key))}
    for agent in sorted(agents):
        # substr, not LIKE: SQLite's LIKE ignores case and '_' is a wildcard.
        prefix = f"agent:{agent}:"
        schema.execute(
            "UPDATE ledger_obligation SET agent = ? WHERE substr(session_key, 1, ?) = ?",
            (agent, len(prefix), prefix),
        )
    # The recording instance is not known any more; its current owner is the best
    # guess. Rows without an existing owner stay "" (any gateway may claim them).
    schema.execute(
        "UPDATE ledger_obligation SET gateway_name = (SELECT i.gateway_name FROM "
        "ledger_instance i WHERE i.id = ledger_obligation.owner_instance_id) WHERE EXISTS "
        "(SELECT 1 FROM ledger_instance i WHERE i.id = ledger_obligation.owner_instance_id)"
    )
    schema.run(
        # Listing for a token's agents; claims and hand-overs of one gateway's rows.
        schema.migrator.add_index("ledger_obligation", ("agent", "created_at", "id"), False),
        schema.migrator.add_index(
            "ledger_obligation", ("gateway_name", "state", "platform"), False
        ),
    )


def sealed_targets(schema: Schema) -> None:
    """Obligations may carry their reply target sealed by the gateway instead of a chat id."""
    schema.run(
        schema.migrator.add_column(
            "ledger_obligation", "sealed_target", peewee.BlobField(null=True)
        ),
    )


MIGRATIONS = (baseline, shared_settings, request_records, row_scope, sealed_targets)

DELIVERY_SCHEMA = Component(
    name="delivery",
    history_table="ledger_schema_history",
    migrations=MIGRATIONS,
    adopt=adopt_unversioned,
    legacy_tables=("ledger_instance", "ledger_obligation"),
)
