"""The kinds of log events that storage and watching treat specially, named once.

Each name is the event body's own `kind` (see `session_service.records`), so a kind
renamed there is renamed here; SQL takes them as parameters or through `sql_list`.
"""

from __future__ import annotations

from collections.abc import Iterable

from session_service.records import (
    Erased,
    Erasure,
    InboxPosted,
    MessageAppended,
    OperatorAction,
    RecordsPut,
    RewindApplied,
    Rewound,
    StateChanged,
)

#: A rewind's record: it concerns every reader and watcher, whatever they filter on.
REWOUND = Rewound.kind
#: A move's bookkeeping on an entity it refreshed (counts no event of the entity).
REWIND_APPLIED = RewindApplied.kind
OPERATOR_ACTION = OperatorAction.kind
ERASURE = Erasure.kind
#: The tombstone an erased session's rows become.
ERASED = Erased.kind
#: What a history is made of.
MESSAGE_APPENDED = MessageAppended.kind
INBOX_POSTED = InboxPosted.kind
STATE_CHANGED = StateChanged.kind
RECORDS_PUT = RecordsPut.kind

#: The kinds of the log's own records, which belong to no agent or session: no state
#: folds them and no truncation deletes them. Hook (issue 23): an erasure's record,
#: and the tombstones of an erased session's rows ("erased"), which keep their agent
#: and session id but must never fold into a state, be replayed or be moved.
LOG_RECORD_KINDS = (REWOUND, OPERATOR_ACTION, ERASURE, ERASED)
#: Audit records stay active whatever a move abandons or restores: what an operator
#: did happened, on whichever branch the log is now (an erasure too).
NEVER_ABANDONED_KINDS = (OPERATOR_ACTION, ERASURE)


def sql_list(kinds: Iterable[str]) -> str:
    """The kinds as an SQL list of string literals (they are constants, never input)."""
    return ", ".join(f"'{kind}'" for kind in kinds)
