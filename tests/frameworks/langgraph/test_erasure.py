"""`delete_thread`, `prune` and `delete_for_runs` through `SwitchboardSaver` erase for
good: a byte scan of the SQLite files (with -wal and -shm) and of every row and a
pg_dump of the Postgres schema (the scan of tests/session/test_erasure.py) finds none of
the erased content, and a Switchboard checkout to before the erasure brings none back."""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.base import empty_checkpoint
from switchboard_client import SessionClient
from switchboard_client.frameworks.langgraph import SwitchboardSaver

from switchboard.session.v1 import session_service_pb2 as pb
from tests.session.test_erasure import MARKERS, _copies

#: The thread id, a channel value and a metadata value: content the scan can find.
THREAD = MARKERS["conversation"].decode()
VALUE = MARKERS["payload"].decode()
NOTE = MARKERS["metadata"].decode()
RUN = MARKERS["label"].decode()
WRITTEN = {"conversation", "payload", "metadata", "label"}


def _put(saver: SwitchboardSaver, parent: dict[str, Any], value: str, run: str) -> dict[str, Any]:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"said": [value]}
    checkpoint["channel_versions"] = {"said": 1}
    stored = saver.put(parent, checkpoint, {"step": 1, "note": NOTE, "run_id": run}, {"said": 1})
    saver.put_writes(stored, [("said", value)], "task-1")
    return stored


def _filled(saver: SwitchboardSaver) -> dict[str, Any]:
    config = {"configurable": {"thread_id": THREAD, "checkpoint_ns": ""}}
    return _put(saver, _put(saver, config, VALUE, RUN), VALUE, RUN)


def _head(client: SessionClient) -> int:
    return max(e.event.sequence for e in client.list_log_events(page_size=1000))


def test_delete_thread_leaves_no_copy_even_after_a_checkout(
    saver: SwitchboardSaver, client: SessionClient, database_url: str
) -> None:
    _filled(saver)
    before = _head(client)
    assert _copies(database_url) >= WRITTEN, "the scan finds what is there"

    saver.delete_thread(THREAD)

    assert _copies(database_url) == set()
    client.checkout(before)
    assert _copies(database_url) == set()
    assert saver.get_tuple({"configurable": {"thread_id": THREAD}}) is None


def test_prune_and_delete_for_runs_erase_what_they_drop_and_keep_the_rest(
    saver: SwitchboardSaver, client: SessionClient, database_url: str
) -> None:
    head = _filled(saver)
    kept = _put(saver, head, "kept-value", "kept-run")
    assert _copies(database_url) >= WRITTEN

    saver.prune([THREAD], strategy="keep_latest")
    # Left: the thread id (the session's key) and the newest checkpoint, whose metadata
    # carries the note; the older checkpoints' values and run ids are gone.
    assert _copies(database_url) == {"conversation", "metadata"}
    assert [t.config for t in saver.list({"configurable": {"thread_id": THREAD}})] == [kept]

    _put(saver, kept, VALUE, RUN)
    assert "payload" in _copies(database_url)
    saver.delete_for_runs([RUN])
    assert _copies(database_url) == {"conversation", "metadata"}
    only = saver.get_tuple({"configurable": {"thread_id": THREAD}})
    assert only is not None and only.config == kept
    assert only.pending_writes == [("task-1", "said", "kept-value")]

    saver.prune([THREAD], strategy="delete")
    assert _copies(database_url) == {"conversation"}
    assert list(saver.list(None)) == []
    assert [s.status for s in client.list_sessions(saver.agent)] == [pb.SESSION_STATUS_OPEN]
