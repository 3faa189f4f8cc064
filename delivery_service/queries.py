"""The ledger's raw SQL, named in one place (peewee query-builder calls stay in
`store.py`). Texts use `?` placeholders; the store passes each through `Backend.sql`
for the backend's style. The send path runs these prepared texts because building
each statement with peewee cost more CPU than executing and committing it."""

from __future__ import annotations

from collections.abc import Sequence


def insert_obligation(columns: Sequence[str], *, own_instance: bool) -> str:
    """Records an obligation if its recording instance is live (`own_instance`: and
    registered by the given principal); the row takes that instance's gateway, read in
    the same statement. Returns the gateway, or no row when nothing was inserted."""
    values = ", ".join("i.gateway_name" if c == "gateway_name" else "?" for c in columns)
    insert = (
        f"INSERT INTO ledger_obligation ({', '.join(columns)}) SELECT {values} "
        "FROM ledger_instance i WHERE i.id = ? AND i.lease_expires_at > ?"
    )
    conflict = " ON CONFLICT (id) DO NOTHING RETURNING gateway_name"
    return insert + (" AND i.principal = ?" if own_instance else "") + conflict


def backoff_delay(backoff: Sequence[float]) -> str:
    """The retry delay for the attempts a row has spent, as an SQL expression."""
    steps = " ".join(f"WHEN attempts = {i} THEN {delay!r}" for i, delay in enumerate(backoff))
    return f"(CASE {steps} ELSE {backoff[-1]!r} END)"


def agents_in(count: int) -> str:
    """The prepared-SQL condition "the row's agent is one of `count` agents"."""
    return f"agent IN ({', '.join('?' for _ in range(count))})" if count else "1 = 0"


def move_obligation(
    columns: Sequence[str],
    changes: Sequence[str],
    *,
    sources: int,
    retry_delay: str | None,
    agents: int | None,
    by_principal: bool,
) -> str:
    """Moves an obligation held by the given holder and fence out of one of `sources`
    states, setting `changes` (and `next_attempt_at` to now plus `retry_delay` when
    given); scoped to `agents` agents and to holders `by_principal` registered."""
    assignments = ["updated_at = ?", *(f"{column} = ?" for column in changes)]
    if retry_delay is not None:
        assignments.append(f"next_attempt_at = ? + {retry_delay}")
    scope = ""
    if agents is not None:
        scope += " AND " + agents_in(agents)
    if by_principal:
        scope += (
            " AND EXISTS (SELECT 1 FROM ledger_instance i WHERE "
            "i.id = ledger_obligation.owner_instance_id AND i.principal = ?)"
        )
    return (
        f"UPDATE ledger_obligation SET {', '.join(assignments)} "
        "WHERE id = ? AND owner_instance_id = ? AND fence = ? "
        f"AND state IN ({', '.join('?' for _ in range(sources))}){scope} "
        f"RETURNING {', '.join(columns)}"
    )
