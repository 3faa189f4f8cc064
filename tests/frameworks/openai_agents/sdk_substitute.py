"""A pytest plugin (`-p sdk_substitute`) that runs the OpenAI Agents SDK's own session
tests (`tests/memory` of its sdist) against `SwitchboardSession`.

The SDK's tests build the session under test as `SQLiteSession(session_id, db_path,
...)`, imported from `agents` or `agents.memory`. Before the test modules are
imported, this plugin puts a stand-in under those names: a `SwitchboardSession` on
the server named by SWITCHBOARD_SESSION_TARGET, agent SWITCHBOARD_AGENT. One
database of one test (a file path, or each `:memory:` instance) is one user of the
agent, so that a session id reused by another test or file is another conversation,
as it is another SQLite database.

Tests that inspect SQLite itself, or behaviour only SQLiteSession's private hooks
give, are deselected: DESELECTED lists each with its reason (the running test reads
it to report them). It runs in a child process whose working directory is the
sdist's root (its `tests` package is not ours), so it imports nothing from ours.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

import agents
import agents.memory
import pytest
from switchboard_client.frameworks.openai_agents import SwitchboardSession
from switchboard_client.session import SessionClient

_SQLITE_INTERNALS = (
    "inspects or fakes SQLiteSession's own sqlite3 connections, locks, tables or file "
    "(its connection registry, a failing commit or rollback, a dropped table)"
)
_CLOSED = "expects SQLiteSession's closed state (RuntimeError 'SQLiteSession is closed')"
_CORRUPT_ROWS = (
    "writes a corrupt row into SQLite's table with raw SQL; the Switchboard equivalent, a "
    "history message holding no item, is skipped the same way by get_items and pop_item "
    "(tests/frameworks/openai_agents/test_session_contract.py)"
)
_PRIVATE_HOOK = (
    "needs SQLiteSession's private _get_compaction_snapshot (an atomic replacement of the "
    "newest items that OpenAIResponsesCompactionSession uses only when the backend has it); "
    "our session, like the SDK's other backends, offers the public protocol, on which the "
    "compaction keeps the history instead (a warning says so) and the test's compact call "
    "never happens"
)
_FROZEN_CLOCK = (
    "freezes time.time for the whole process (it patches cryptography.fernet.time.time, "
    "which is the time module's) to expire encrypted items; gRPC computes every call's "
    "deadline from time.time, so each call of a networked session expires before it is sent"
)

#: Test node ids (file::name, or file::name[param-prefix) -> why they do not run here.
DESELECTED: dict[str, str] = {
    # test_session.py
    "test_session.py::test_sqlite_session_close_closes_worker_thread_connections": (
        _SQLITE_INTERNALS
    ),
    "test_session.py::test_sqlite_session_reaps_connections_from_exited_worker_threads": (
        _SQLITE_INTERNALS
    ),
    "test_session.py::test_sqlite_session_closes_retired_connections_before_the_next_allocation": (
        _SQLITE_INTERNALS
    ),
    "test_session.py::test_sqlite_session_keeps_connections_of_live_worker_threads": (
        _SQLITE_INTERNALS
    ),
    "test_session.py::test_sqlite_session_closed_rejects_empty_add_items": _CLOSED,
    "test_session.py::test_sqlite_session_file_lock_is_shared_across_instances": (
        _SQLITE_INTERNALS
    ),
    "test_session.py::test_sqlite_session_pop_item_skips_corrupt_most_recent": _CORRUPT_ROWS,
    "test_session.py::test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows": (
        _CORRUPT_ROWS
    ),
    "test_session.py::test_sqlite_session_get_items_limit_skips_corrupt_newest_rows": (
        _CORRUPT_ROWS
    ),
    "test_session.py::test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows": (
        _CORRUPT_ROWS
    ),
    "test_session.py::test_sqlite_session_failed_add_items_releases_write_lock": _SQLITE_INTERNALS,
    "test_session.py::test_sqlite_session_failed_clear_session_rolls_back": _SQLITE_INTERNALS,
    "test_session.py::test_sqlite_session_failed_pop_item_releases_write_lock": _SQLITE_INTERNALS,
    "test_session.py::test_sqlite_session_rollback_failure_evicts_connection": _SQLITE_INTERNALS,
    "test_session.py::test_sqlite_session_close_retries_quarantined_connection": _SQLITE_INTERNALS,
    "test_session.py::"
    "test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome": (
        _SQLITE_INTERNALS
    ),
    # test_openai_responses_compaction_session.py
    "test_openai_responses_compaction_session.py::TestOpenAIResponsesCompactionSession::"
    "test_rollback_does_not_revive_items_expired_during_compaction": _FROZEN_CLOCK,
    "test_openai_responses_compaction_session.py::TestOpenAIResponsesCompactionSession::"
    "test_automatic_compaction_rollback_budget[True]": _PRIVATE_HOOK,
    "test_openai_responses_compaction_session.py::TestOpenAIResponsesCompactionSession::"
    "test_settled_pop_failure_invalidates_response_chain": _SQLITE_INTERNALS,
    "test_openai_responses_compaction_session.py::TestOpenAIResponsesCompactionSession::"
    "test_settled_clear_failure_invalidates_response_chain": _SQLITE_INTERNALS,
    # test_compaction_model_visibility.py
    "test_compaction_model_visibility.py::"
    "test_backend_read_limit_cannot_hide_retained_history_from_compaction": _PRIVATE_HOOK,
    "test_compaction_model_visibility.py::"
    "test_automatic_compaction_does_not_reload_unbounded_hidden_history[none-": _PRIVATE_HOOK,
    "test_compaction_model_visibility.py::"
    "test_automatic_compaction_does_not_reload_unbounded_hidden_history[outer-": _FROZEN_CLOCK,
    "test_compaction_model_visibility.py::"
    "test_automatic_compaction_does_not_reload_unbounded_hidden_history[inner-": _FROZEN_CLOCK,
    "test_compaction_model_visibility.py::"
    "test_manual_compaction_refreshes_expired_encrypted_history": _FROZEN_CLOCK,
    "test_compaction_model_visibility.py::"
    "test_automatic_compaction_recovers_after_encrypted_history_expires": _FROZEN_CLOCK,
    "test_compaction_model_visibility.py::"
    "test_expired_read_overhead_does_not_authorize_hidden_history": _FROZEN_CLOCK,
    # test_compaction_suffix.py: its [sqlite] cases are ours, [async-sqlite] the SDK's
    "test_compaction_suffix.py::test_expired_prefix_does_not_block_full_live_window[sqlite-": (
        _FROZEN_CLOCK
    ),
    "test_compaction_suffix.py::test_repeated_ttl_bursts_do_not_accumulate_expired_rows[sqlite-": (
        _FROZEN_CLOCK
    ),
    "test_compaction_suffix.py::test_prefix_cleanup_stops_before_retained_history[sqlite-": (
        _FROZEN_CLOCK
    ),
    "test_compaction_suffix.py::"
    "test_failed_encrypted_suffix_transaction_preserves_original_tokens[sqlite-": _FROZEN_CLOCK,
    "test_compaction_suffix.py::test_suffix_transaction_rolls_back_failed_insert[sqlite]": (
        _SQLITE_INTERNALS
    ),
    "test_compaction_suffix.py::test_cancelled_suffix_transaction_settles_before_newer_append"
    "[sqlite]": _SQLITE_INTERNALS,
    "test_compaction_suffix.py::test_new_backend_write_invalidates_snapshot[sqlite]": (
        _PRIVATE_HOOK
    ),
    "test_compaction_suffix.py::test_partial_compaction_does_not_split_tool_call_and_output"
    "[sqlite]": _PRIVATE_HOOK,
    "test_compaction_suffix.py::test_partial_compaction_preserves_reasoning_and_its_follower"
    "[sqlite-": _PRIVATE_HOOK,
    "test_compaction_suffix.py::test_unverifiable_rows_inside_snapshot_are_retained[sqlite-": (
        _PRIVATE_HOOK
    ),
}


def _client() -> SessionClient:
    global _shared_client
    if _shared_client is None:
        _shared_client = SessionClient(os.environ["SWITCHBOARD_SESSION_TARGET"])
    return _shared_client


_shared_client: SessionClient | None = None
_current_test = ""
#: The tests that built the session under test (what the report counts as ours).
_used_by: set[str] = set()

#: Files of tests/memory not collected at all, with the reason.
IGNORED_FILES: dict[str, str] = {
    "test_sqlalchemy_compaction.py": (
        "tests SQLAlchemySession, not the session under test, and needs sqlalchemy, which "
        "the dev install does not have (the file skips itself without it)"
    ),
}


class SQLiteSessionOnSwitchboard(SwitchboardSession):
    """`SQLiteSession`'s constructor, a Switchboard conversation behind it."""

    def __init__(
        self,
        session_id: str,
        db_path: str | Path = ":memory:",
        sessions_table: str = "agent_sessions",
        messages_table: str = "agent_messages",
        session_settings: Any = None,
    ) -> None:
        database = uuid.uuid4().hex if str(db_path) == ":memory:" else str(Path(db_path).resolve())
        store = f"{_current_test}\0{database}\0{sessions_table}\0{messages_table}"
        super().__init__(
            session_id,
            _client(),
            agent=os.environ["SWITCHBOARD_AGENT"],
            user_id=hashlib.sha256(store.encode()).hexdigest()[:32],
            session_settings=session_settings,
        )
        self.db_path = db_path
        _used_by.add(_current_test)


def pytest_configure(config: pytest.Config) -> None:
    # Before collection imports the test modules: they bind the name at import.
    agents.SQLiteSession = SQLiteSessionOnSwitchboard
    agents.memory.SQLiteSession = SQLiteSessionOnSwitchboard


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, dropped = [], []
    matched: set[str] = set()
    for item in items:
        reason = _deselection(item.nodeid)
        if reason is None:
            kept.append(item)
        else:
            matched.add(reason[0])
            dropped.append(item)
    collected_files = {item.nodeid.split("tests/memory/", 1)[-1].split("::")[0] for item in items}
    listed = {key for key in DESELECTED if key.split("::")[0] in collected_files}
    unmatched = listed - matched
    if unmatched:  # a renamed or removed upstream test: the list must be kept true
        raise pytest.UsageError(f"deselections matching no test: {sorted(unmatched)}")
    items[:] = kept
    config.hook.pytest_deselected(items=dropped)


def _deselection(nodeid: str) -> tuple[str, str] | None:
    """(the DESELECTED key, its reason) for a node id of tests/memory, if listed."""
    name = nodeid.split("tests/memory/", 1)[-1]
    for key, reason in DESELECTED.items():
        # A key ending inside the brackets names a prefix of the parameters.
        if name == key or name.startswith(f"{key}[" if "[" not in key else key):
            return key, reason
    return None


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    return True if collection_path.name in IGNORED_FILES else None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    global _current_test
    _current_test = item.nodeid


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Writes which tests used the session under test, and the deselections with their
    reasons, to SWITCHBOARD_SDK_REPORT (JSON) when set."""
    path = os.environ.get("SWITCHBOARD_SDK_REPORT")
    if path:
        report = {
            "used_our_session": sorted(_used_by),
            "deselected": DESELECTED,
            "ignored_files": IGNORED_FILES,
        }
        Path(path).write_text(json.dumps(report, indent=1))
