"""Delivery migration 4 (row_scope) on a ledger written at version 3, both backends:
each row's agent comes from its session key, its gateway from its owner instance
where that still exists ("" = any gateway otherwise); instances belong to no token."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from delivery_service.migrations import DELIVERY_SCHEMA, MIGRATIONS, InstanceV1, ObligationV1
from switchboard import migrations
from switchboard.backends import open_backend
from switchboard.database import Backend, DatabaseSettings
from tests.test_migrations import _drop_row_scope, _drop_sealed_targets

#: session key, owner instance → the (agent, gateway_name) migration 4 gives the row.
ROWS: list[tuple[str, str | None, tuple[str, str]]] = [
    ("agent:main:telegram:dm:1", "i-tgbot", ("main", "tgbot")),
    ("agent:a_b:web:x", "i-mainbot", ("a_b", "mainbot")),
    ("agent:aXb:web:x", None, ("", "")),  # not an agent name; owner cleared by a retry
    ("agent:axb:web:x", "i-gone", ("axb", "")),  # its instance row is gone
    ("AGENT:main:web:x", "i-tgbot", ("", "tgbot")),
    ("agent:main", "i-tgbot", ("", "tgbot")),
    ("web:tab-1", "i-mainbot", ("", "mainbot")),
]


@pytest.fixture
def at_version_3(database_url: str) -> Iterator[Backend]:
    """A ledger migrated to version 3, with rows written as that version's code did."""
    backend = open_backend(DatabaseSettings(url=database_url))
    migrations.migrate(backend, DELIVERY_SCHEMA)
    database: Any = backend.database
    with database.connection_context():
        _drop_row_scope(database)
        _drop_sealed_targets(database)  # migration 5, which runs after 4 again
        database.execute_sql("DELETE FROM ledger_schema_history WHERE version >= 4")
        with database.bind_ctx([InstanceV1, ObligationV1]):
            for instance_id, gateway in (("i-tgbot", "tgbot"), ("i-mainbot", "mainbot")):
                InstanceV1.insert(
                    id=instance_id, gateway_name=gateway, host="h", pid=1, platforms="telegram",
                    registered_at=0, heartbeat_at=0, lease_expires_at=0,
                ).execute()  # fmt: skip
            for i, (key, owner, _) in enumerate(ROWS):
                ObligationV1.insert(
                    id=f"{i:024x}", session_key=key, message_ref="", content="x",
                    platform="telegram", chat_id="1", thread_id="", metadata="{}",
                    state="pending", owner_instance_id=owner, fence=1, attempts=0,
                    needs_marker=False, platform_message_id="", last_error="",
                    created_at=i, updated_at=i,
                ).execute()  # fmt: skip
    assert migrations.status(backend, DELIVERY_SCHEMA).database_version == 3
    yield backend
    database.close()


def test_migration_4_backfills_agent_and_gateway_and_leaves_instances_to_no_token(
    at_version_3: Backend,
) -> None:
    report = migrations.migrate(at_version_3, DELIVERY_SCHEMA)
    later = range(4, len(MIGRATIONS) + 1)
    assert report.applied == [DELIVERY_SCHEMA.title(version) for version in later]
    database: Any = at_version_3.database
    with database.connection_context():
        got = database.execute_sql(
            "SELECT session_key, agent, gateway_name FROM ledger_obligation ORDER BY id"
        ).fetchall()
        principals = database.execute_sql("SELECT DISTINCT principal FROM ledger_instance")
        assert [tuple(row) for row in principals.fetchall()] == [("",)]
    assert [tuple(row) for row in got] == [(key, *expected) for key, _, expected in ROWS]
