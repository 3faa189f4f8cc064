"""Ledger storage: two tables and the SQL of every transition.

Every method runs inside a transaction the caller opened (the
`TransactionRunner` does) and takes `now` from the database's clock. Each
transition is one guarded UPDATE: it changes the row only for the current
holder and only from a legal state, so a stale caller can never overwrite a
row someone else re-claimed or finished.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, cast

import peewee
from peewee import SQL, fn

from delivery_service import queries
from delivery_service.records import (
    ROW_OVERHEAD_BYTES,
    Holder,
    Instance,
    LedgerStats,
    NewObligation,
    Obligation,
    ObligationFilter,
)
from delivery_service.state_machine import OWED, TERMINAL, LedgerLimits, State
from switchboard import pagination
from switchboard.database import Backend, bind_model, tuples


class InstanceRow(peewee.Model):
    id = peewee.CharField(max_length=64, primary_key=True)
    gateway_name = peewee.CharField(max_length=128)
    host = peewee.CharField(max_length=255)
    pid = peewee.BigIntegerField()
    platforms = peewee.TextField()  # comma-separated, sorted
    registered_at = peewee.DoubleField()
    heartbeat_at = peewee.DoubleField()
    lease_expires_at = peewee.DoubleField()
    deregistered_at = peewee.DoubleField(null=True)
    #: The grant's principal that registered it ("" with authentication off).
    principal = peewee.TextField(default="")

    class Meta:
        table_name = "ledger_instance"


class ObligationRow(peewee.Model):
    id = peewee.CharField(max_length=24, primary_key=True)
    session_key = peewee.TextField()
    message_ref = peewee.TextField()
    content = peewee.TextField()
    platform = peewee.CharField(max_length=32)
    chat_id = peewee.TextField()
    thread_id = peewee.TextField()
    metadata = peewee.TextField()  # JSON object of strings
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
    agent = peewee.CharField(max_length=64, default="")  # of session_key; "" for none
    gateway_name = peewee.CharField(max_length=128, default="")  # who may claim; "" any
    sealed_target = peewee.BlobField(null=True)  # the gateway's sealed chat; NULL: none

    class Meta:
        table_name = "ledger_obligation"
        indexes = (
            (("state", "platform"), False),
            (("session_key", "created_at"), False),
            (("owner_instance_id",), False),
            (("created_at", "id"), False),
            (("agent", "created_at", "id"), False),
            (("gateway_name", "state", "platform"), False),
        )


COLUMNS = tuple(field.column_name for field in ObligationRow._meta.sorted_fields)


#: Whose rows a statement may touch: None for every agent, else these agents only.
Agents = frozenset[str] | None


class LedgerStore:
    def __init__(self, backend: Backend, limits: LedgerLimits) -> None:
        self.backend = backend
        self.limits = limits
        self.Instance = bind_model(InstanceRow, backend.database)
        self.Obligation = bind_model(ObligationRow, backend.database)
        # The send path (record, mark) runs prepared SQL text (named in `queries`).
        self._database: Any = backend.database
        self._sql_cache: dict[tuple[Any, ...], str] = {}
        self._insert_if_live = self._sql(queries.insert_obligation(COLUMNS, own_instance=False))
        self._insert_if_own_live = self._sql(queries.insert_obligation(COLUMNS, own_instance=True))
        self._backoff_delay = queries.backoff_delay(self.limits.backoff_s)

    def _sql(self, text: str) -> str:
        """`?` placeholders in the backend's parameter style."""
        return self.backend.sql(text)

    # -- instances ------------------------------------------------------------------------

    def register_instance(
        self,
        now: float,
        instance_id: str,
        gateway_name: str,
        host: str,
        pid: int,
        platforms: Sequence[str],
        lease_ttl_s: float,
        principal: str = "",
    ) -> Instance:
        self.Instance.insert(
            id=instance_id,
            gateway_name=gateway_name,
            host=host,
            pid=pid,
            platforms=",".join(platforms),
            registered_at=now,
            heartbeat_at=now,
            lease_expires_at=now + lease_ttl_s,
            principal=principal,
        ).execute()
        return self._instance_or_none(instance_id)  # type: ignore[return-value]

    def _named(self, instance_id: str, principal: str | None) -> peewee.Expression:
        """The instance `instance_id`, if `principal` (None: anyone) registered it."""
        inst = self.Instance
        named: peewee.Expression = inst.id == instance_id
        return named if principal is None else named & (inst.principal == principal)

    def heartbeat(
        self,
        now: float,
        instance_id: str,
        platforms: Sequence[str],
        principal: str | None = None,
    ) -> int:
        """Extends a live instance's lease; returns the rows changed (0: not live, or
        not registered by `principal`)."""
        inst = self.Instance
        return cast(
            int,
            inst.update(
                heartbeat_at=now,
                lease_expires_at=now + (inst.lease_expires_at - inst.heartbeat_at),
                platforms=",".join(platforms),
            )
            .where(self._named(instance_id, principal) & (inst.lease_expires_at > now))
            .execute(),
        )

    def deregister(self, now: float, instance_id: str, principal: str | None = None) -> int:
        inst = self.Instance
        lease_ends_now = peewee.Case(
            None, [(inst.lease_expires_at > now, now)], inst.lease_expires_at
        )
        return cast(
            int,
            inst.update(deregistered_at=now, lease_expires_at=lease_ends_now)
            .where(self._named(instance_id, principal) & inst.deregistered_at.is_null())
            .execute(),
        )

    def get_instance(self, instance_id: str) -> Instance | None:
        return self._instance_or_none(instance_id)

    def instance_page(
        self, gateway_name: str, live_at: float | None, before: tuple[float, str] | None, limit: int
    ) -> list[Instance]:
        """Instances, latest registered first (then by id, descending); of
        `gateway_name` unless empty; live at `live_at` unless None; after the
        position `before` (a page's last (registered_at, id)) unless None."""
        inst = self.Instance
        query = inst.select()
        if gateway_name:
            query = query.where(inst.gateway_name == gateway_name)
        if live_at is not None:
            query = query.where((inst.lease_expires_at > live_at) & inst.deregistered_at.is_null())
        if before is not None:
            query = query.where(peewee.Tuple(inst.registered_at, inst.id) < peewee.Tuple(*before))
        query = query.order_by(inst.registered_at.desc(), inst.id.desc()).limit(limit)
        return [_instance(row) for row in query]

    def held_counts(self, instance_ids: Sequence[str]) -> dict[str, int]:
        """Owed rows per owner, for these instances (absent: none)."""
        if not instance_ids:
            return {}
        obl = self.Obligation
        counts = (
            obl.select(obl.owner_instance_id, fn.COUNT(obl.id))
            .where(
                obl.owner_instance_id.in_(list(instance_ids))
                & obl.state.in_([s.value for s in OWED])
            )
            .group_by(obl.owner_instance_id)
            .tuples()
        )
        return {owner: int(count) for owner, count in cast(Iterable[tuple[str, int]], counts)}

    def live_instances(self, now: float) -> list[Instance]:
        inst = self.Instance
        return [_instance(row) for row in inst.select().where(inst.lease_expires_at > now)]

    def _instance_or_none(self, instance_id: str) -> Instance | None:
        row = self.Instance.get_or_none(self.Instance.id == instance_id)
        return None if row is None else _instance(row)

    # -- obligations ----------------------------------------------------------------------

    def insert_if_live(
        self,
        now: float,
        new: NewObligation,
        owner: str,
        state: State = State.PENDING,
        principal: str | None = None,
    ) -> Obligation | None:
        """Inserts a row owned by `owner` if that instance is live (and registered by
        `principal`, unless None) and the id is new. The row takes the owner's gateway.

        None when the owner is not live or not the principal's, or the id exists (an
        existing row is never reset: insert-or-ignore, not insert-or-replace).
        """
        values = {
            "id": new.id,
            "session_key": new.session_key,
            "message_ref": new.message_ref,
            "content": new.content,
            "platform": new.platform,
            "chat_id": new.chat_id,
            "thread_id": new.thread_id,
            "metadata": json.dumps(new.metadata, sort_keys=True),
            "state": state.value,
            "owner_instance_id": owner,
            "fence": 1,
            "attempts": 0,
            "needs_marker": False,
            "platform_message_id": "",
            "last_error": "",
            "created_at": now,
            "updated_at": now,
            "next_attempt_at": None,
            "delivered_at": None,
            "agent": new.agent,
            "sealed_target": new.sealed_target or None,
        }
        params = [values[column] for column in COLUMNS if column != "gateway_name"]
        params += [owner, now]
        sql = self._insert_if_live
        if principal is not None:
            sql = self._insert_if_own_live
            params.append(principal)
        inserted = self._database.execute_sql(sql, params).fetchone()
        if inserted is None:
            return None
        return _obligation_from({**values, "gateway_name": inserted[0]})

    def get(self, obligation_id: str, agents: Agents = None) -> Obligation | None:
        """The row, if it belongs to one of `agents` (None: any)."""
        obl = self.Obligation
        query = obl.select().where((obl.id == obligation_id) & _of_agents(obl, agents))
        row = query.dicts().first()
        return None if row is None else _obligation_from(row)

    def transition(
        self,
        now: float,
        obligation_id: str,
        holder: Holder,
        sources: Sequence[State],
        changes: dict[str, Any],
        retry_after_s: float | None = None,
        schedule_retry: bool = False,
        agents: Agents = None,
        principal: str | None = None,
    ) -> Obligation | None:
        """The fenced transition: applies `changes` only for the holder and from `sources`.

        With `schedule_retry`, `next_attempt_at` becomes now plus `retry_after_s`,
        or the backoff step for the attempts the row has spent. With `agents`, only a
        row of those agents moves; with `principal`, only under a holder instance that
        principal registered.
        """
        key = (
            tuple(changes),
            len(sources),
            schedule_retry,
            retry_after_s is None,
            None if agents is None else len(agents),
            principal is None,
        )
        sql = self._sql_cache.get(key)
        if sql is None:
            delay = "?" if retry_after_s is not None else self._backoff_delay
            sql = self._sql_cache[key] = self._sql(
                queries.move_obligation(
                    COLUMNS,
                    tuple(changes),
                    sources=len(sources),
                    retry_delay=delay if schedule_retry else None,
                    agents=None if agents is None else len(agents),
                    by_principal=principal is not None,
                )
            )
        params: list[Any] = [now, *changes.values()]
        if schedule_retry:
            params.append(now)
            if retry_after_s is not None:
                params.append(retry_after_s)
        params += [obligation_id, holder.instance_id, holder.fence, *(s.value for s in sources)]
        if agents is not None:
            params += sorted(agents)
        if principal is not None:
            params.append(principal)
        row = self._database.execute_sql(sql, params).fetchone()
        return None if row is None else _obligation_from(dict(zip(COLUMNS, row, strict=True)))

    def operator_update(
        self, now: float, obligation_id: str, sources: Sequence[State], changes: dict[str, Any]
    ) -> Obligation | None:
        """An operator's change: from `sources`, whoever holds the row; fences the holder out."""
        obl = self.Obligation
        query = (
            obl.update(updated_at=now, fence=obl.fence + 1, **changes)
            .where((obl.id == obligation_id) & obl.state.in_([s.value for s in sources]))
            .returning(obl)
            .dicts()
        )
        rows = list(query.execute())
        return _obligation_from(rows[0]) if rows else None

    def hand_over(
        self, now: float, from_gateway: str, to_gateway: str, ids: Sequence[str] | None
    ) -> int:
        """Binds the owed rows of `from_gateway` (only those of `ids`, unless None) to
        `to_gateway`; holders and fences are left alone. Returns the rows moved."""
        obl = self.Obligation
        moved = (obl.gateway_name == from_gateway) & obl.state.in_([s.value for s in OWED])
        if ids is not None:
            moved &= obl.id.in_(list(ids))
        return cast(int, obl.update(gateway_name=to_gateway, updated_at=now).where(moved).execute())

    # -- recovery -------------------------------------------------------------------------

    def _recoverable(self, now: float) -> peewee.Expression:
        """Owed rows whose owner is dead or gone, plus FAILED rows that are due."""
        obl, inst = self.Obligation, self.Instance
        live_owner = inst.select(SQL("1")).where(
            (inst.id == obl.owner_instance_id) & (inst.lease_expires_at > now)
        )
        return cast(
            peewee.Expression,
            obl.state.in_([s.value for s in OWED])
            & (
                ~fn.EXISTS(live_owner)
                | ((obl.state == State.FAILED.value) & (obl.next_attempt_at <= now))
            ),
        )

    def _claimable_by(self, now: float, gateway_name: str, agents: Agents) -> peewee.Expression:
        """Recoverable rows a claimer of `gateway_name` acting for `agents` answers for:
        its gateway's rows and those of no known gateway."""
        obl = self.Obligation
        claimable: peewee.Expression = (
            self._recoverable(now)
            & obl.gateway_name.in_([gateway_name, ""])
            & _of_agents(obl, agents)
        )
        return claimable

    def abandon_exhausted(self, now: float, gateway_name: str, agents: Agents) -> int:
        """The claimer's recoverable rows over the attempts cap or past the stale
        cutoff → ABANDONED, whatever their platform (stale rows expire anyway)."""
        obl = self.Obligation
        recoverable = self._claimable_by(now, gateway_name, agents)
        over_cap = (
            obl.update(
                state=State.ABANDONED.value,
                last_error=f"attempts cap ({self.limits.max_attempts}) reached",
                updated_at=now,
                next_attempt_at=None,
            )
            .where(recoverable & (obl.attempts >= self.limits.max_attempts))
            .execute()
        )
        stale = (
            obl.update(
                state=State.ABANDONED.value,
                last_error=f"stale: recorded more than {self.limits.stale_after_s:g} s ago",
                updated_at=now,
                next_attempt_at=None,
            )
            .where(recoverable & (obl.created_at <= now - self.limits.stale_after_s))
            .execute()
        )
        return cast(int, over_cap) + cast(int, stale)

    def count_gated(
        self, now: float, deliverable: Sequence[str], gateway_name: str, agents: Agents
    ) -> int:
        """The claimer's recoverable rows for platforms it cannot deliver to."""
        obl = self.Obligation
        gated = self._claimable_by(now, gateway_name, agents) & obl.platform.not_in(
            list(deliverable)
        )
        return int(obl.select().where(gated).count())

    def find_claimable(
        self,
        now: float,
        deliverable: Sequence[str],
        limit: int,
        gateway_name: str,
        agents: Agents,
    ) -> list[tuple[str, str, int]]:
        """(id, state, fence) of rows the claimer may claim, in delivery order, locked
        where the backend can lock; rows another claimer holds locked are skipped."""
        if not deliverable:
            return []
        obl = self.Obligation
        octets = self.backend.octet_length
        size = octets(obl.content) + octets(obl.metadata) + ROW_OVERHEAD_BYTES
        claimable = self._claimable_by(now, gateway_name, agents)
        query = (
            obl.select(obl.id, obl.state, obl.fence, size.alias("size"))
            .where(claimable & obl.platform.in_(list(deliverable)))
            .order_by(obl.session_key, obl.created_at, obl.id)
            .limit(limit)
        )
        if self.backend.skip_locked:
            query = query.for_update(skip_locked=True)
        rows = tuples(query)
        # Claim no more than one answer can carry: a claimed row the claimer never
        # read would sit ATTEMPTING under it until its lease ends.
        kept = pagination.fitting(int(size) for *_, size in rows)
        return [(row_id, state, int(fence)) for row_id, state, fence, _ in rows[:kept]]

    def claim(
        self,
        now: float,
        candidates: Sequence[tuple[str, str, int]],
        instance_id: str,
        gateway_name: str,
        agents: Agents,
    ) -> list[Obligation]:
        """Claims the candidates that are still exactly as they were read.

        The guard on (id, state, fence) is what keeps a row that was delivered,
        failed or re-claimed since `find_claimable` untouched; the claimer's
        gateway and agents are guarded again, so that this write alone can never
        take a row another gateway or agent answers for.
        """
        if not candidates:
            return []
        obl = self.Obligation
        guard = peewee.Tuple(obl.id, obl.state, obl.fence).in_(
            [peewee.Tuple(*candidate) for candidate in candidates]
        )
        scope = obl.gateway_name.in_([gateway_name, ""]) & _of_agents(obl, agents)
        claimed = (
            obl.update(
                state=State.ATTEMPTING.value,
                owner_instance_id=instance_id,
                fence=obl.fence + 1,
                attempts=obl.attempts + 1,
                needs_marker=(obl.state != State.PENDING.value) | (obl.attempts > 0),
                next_attempt_at=None,
                updated_at=now,
            )
            .where(guard & scope)
            .returning(obl)
            .dicts()
            .execute()
        )
        order = {candidate[0]: i for i, candidate in enumerate(candidates)}
        return sorted((_obligation_from(row) for row in claimed), key=lambda o: order[o.id])

    # -- reads for operators --------------------------------------------------------------

    def list_page(
        self,
        where: ObligationFilter,
        after: tuple[float, str] | None,
        limit: int,
        agents: Agents = None,
    ) -> list[Obligation]:
        """A page of rows matching `where`, of `agents` only (None: every agent)."""
        obl = self.Obligation
        query = obl.select().where(self._matching(where, agents))
        if after is not None:
            query = query.where(peewee.Tuple(obl.created_at, obl.id) > peewee.Tuple(*after))
        query = query.order_by(obl.created_at, obl.id).limit(limit)
        return [_obligation_from(cast(dict[str, Any], row)) for row in query.dicts()]

    def _matching(self, where: ObligationFilter, agents: Agents) -> peewee.Expression:
        obl = self.Obligation
        condition = _of_agents(obl, agents)
        if where.state is not None:
            condition &= obl.state == where.state.value
        if where.owed_only:
            condition &= obl.state.in_([state.value for state in OWED])
        if where.session_key:
            keys = {where.session_key, where.session_key_as_stored} - {""}
            condition &= obl.session_key.in_(sorted(keys))
        for column, value in (
            (obl.platform, where.platform),
            (obl.owner_instance_id, where.owner_instance_id),
            (obl.gateway_name, where.gateway_name),
            (obl.agent, where.agent),
        ):
            if value:
                condition &= column == value
        return condition

    def count(
        self, where: ObligationFilter, session_keys: Sequence[str], agents: Agents = None
    ) -> tuple[int, dict[str, int]]:
        """Rows matching `where` (of `agents` only), and those of each of `session_keys`:
        two statements, the second one grouped."""
        obl = self.Obligation
        matching = self._matching(where, agents)
        total = int(obl.select().where(matching).count())
        if not session_keys:
            return total, {}
        grouped = (
            obl.select(obl.session_key, fn.COUNT(SQL("*")))
            .where(matching & obl.session_key.in_(sorted(set(session_keys))))
            .group_by(obl.session_key)
        )
        return total, {str(key): int(count) for key, count in tuples(grouped)}

    def stats(self, now: float) -> LedgerStats:
        obl = self.Obligation
        counts = dict.fromkeys(State, 0)
        by_state = obl.select(obl.state, fn.COUNT(obl.id).alias("n")).group_by(obl.state)
        for state, count in cast(Iterable[tuple[str, int]], by_state.tuples()):
            counts[State(state)] = int(count)
        oldest = obl.select(fn.MIN(obl.created_at)).where(obl.state == State.PENDING.value).scalar()
        recoverable = self._recoverable(now)
        in_doubt = obl.select().where(recoverable & (obl.state == State.ATTEMPTING.value)).count()
        live = self.live_instances(now)
        gated: dict[str, int] = {}
        per_gateway = cast(
            Iterable[tuple[str, str, int]],
            obl.select(obl.gateway_name, obl.platform, fn.COUNT(obl.id))
            .where(recoverable)
            .group_by(obl.gateway_name, obl.platform)
            .tuples(),
        )
        for gateway_name, platform, count in per_gateway:
            if not _deliverable_by(live, gateway_name, platform):
                gated[platform] = gated.get(platform, 0) + int(count)
        return LedgerStats(
            state_counts=counts,
            oldest_pending_age_s=max(0.0, now - float(oldest)) if oldest is not None else 0.0,
            in_doubt_count=int(in_doubt),
            gated_by_platform=gated,
            live_instance_count=len(live),
        )

    def prune(self, now: float, older_than_s: float) -> int:
        obl = self.Obligation
        return cast(
            int,
            obl.delete()
            .where(
                obl.state.in_([s.value for s in TERMINAL]) & (obl.updated_at <= now - older_than_s)
            )
            .execute(),
        )


def _of_agents(obl: Any, agents: Agents) -> peewee.Expression:
    """Rows of `agents` (None: every row). An empty set matches nothing."""
    if agents is None:
        return cast(peewee.Expression, SQL("1 = 1"))
    if not agents:
        return cast(peewee.Expression, SQL("1 = 0"))
    return cast(peewee.Expression, obl.agent.in_(sorted(agents)))


def _deliverable_by(live: Sequence[Instance], gateway_name: str, platform: str) -> bool:
    """Whether a live instance may claim a row of this gateway and platform now."""
    return any(
        platform in instance.platforms and gateway_name in ("", instance.gateway_name)
        for instance in live
    )


def _instance(row: InstanceRow) -> Instance:
    return Instance(
        id=row.id,
        gateway_name=row.gateway_name,
        host=row.host,
        pid=row.pid,
        platforms=tuple(p for p in row.platforms.split(",") if p),
        registered_at=row.registered_at,
        heartbeat_at=row.heartbeat_at,
        lease_expires_at=row.lease_expires_at,
        deregistered_at=row.deregistered_at,
        principal=row.principal,
    )


def _obligation_from(row: dict[str, Any]) -> Obligation:
    return Obligation(
        id=row["id"],
        session_key=row["session_key"],
        message_ref=row["message_ref"],
        content=row["content"],
        platform=row["platform"],
        chat_id=row["chat_id"],
        thread_id=row["thread_id"],
        metadata=json.loads(row["metadata"]),
        state=State(row["state"]),
        owner_instance_id=row["owner_instance_id"],
        fence=int(row["fence"]),
        attempts=int(row["attempts"]),
        needs_marker=bool(row["needs_marker"]),
        platform_message_id=row["platform_message_id"],
        last_error=row["last_error"],
        created_at=float(row["created_at"]),
        updated_at=float(row["updated_at"]),
        next_attempt_at=row["next_attempt_at"],
        delivered_at=row["delivered_at"],
        agent=row["agent"],
        gateway_name=row["gateway_name"],
        sealed_target=bytes(row["sealed_target"] or b""),  # Postgres answers a memoryview
    )
