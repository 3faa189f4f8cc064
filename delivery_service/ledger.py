"""The delivery ledger's domain core: validation, rules and transactions.

Plain Python over `LedgerStore`; the gRPC servicer only converts messages.
Every public method is one transaction run by the `TransactionRunner`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from typing import Any

from delivery_service.records import (
    ClaimResult,
    Holder,
    Instance,
    LedgerStats,
    NewObligation,
    Obligation,
    ObligationFilter,
    Page,
)
from delivery_service.state_machine import HOLDER_SOURCES, OWED, LedgerLimits, State
from delivery_service.store import LedgerStore
from switchboard import pagination, validation
from switchboard.errors import Aborted, FailedPrecondition, InvalidArgument, NotFound
from switchboard.runner import TransactionRunner

_OBLIGATION_ID = re.compile(r"[0-9a-f]{24}")
MAX_CLAIM_LIMIT = 1000
MAX_LEASE_TTL_S = 3600.0
MAX_RETRY_AFTER_S = 24 * 3600.0


def _obligation_id(value: str) -> str:
    if not _OBLIGATION_ID.fullmatch(value):
        raise InvalidArgument("obligation_id", "must be 24 lower-case hex characters")
    return value


def _instance_id(value: str) -> str:
    return validation.path_safe_id("instance_id", value, max_len=64)


def _holder(instance_id: str, fence: int) -> Holder:
    if fence <= 0:
        raise InvalidArgument("fence", "is required: pass the fence the record or claim returned")
    validation.int64("fence", fence)
    return Holder(_instance_id(instance_id), fence)


def _require_live(instance: Instance | None, instance_id: str, now: float) -> Instance:
    if instance is None:
        raise NotFound(
            "INSTANCE_NOT_FOUND",
            f"instance {instance_id!r} is not registered; call RegisterInstance first",
        )
    if not instance.live_at(now):
        raise FailedPrecondition(
            "INSTANCE_NOT_LIVE",
            f"instance {instance_id!r} has deregistered or its lease expired; "
            "register a new instance",
        )
    return instance


def _changed_concurrently(obligation_id: str) -> Obligation:
    raise Aborted(
        "CONCURRENT_CHANGE", f"obligation {obligation_id} changed while this call ran; retry"
    )


class Ledger:
    def __init__(self, runner: TransactionRunner, store: LedgerStore, limits: LedgerLimits) -> None:
        self.runner = runner
        self.store = store
        self.limits = limits

    # -- gateway instances ----------------------------------------------------------------

    async def register_instance(
        self,
        gateway_name: str,
        host: str,
        pid: int,
        platforms: Sequence[str],
        lease_ttl_s: float | None = None,
    ) -> Instance:
        validation.text("gateway_name", gateway_name, max_len=128, required=True)
        validation.text("host", host, max_len=255)
        if pid < 0:
            raise InvalidArgument("pid", "must not be negative")
        connected = validation.platforms("platforms", platforms)
        ttl = validation.seconds(
            "lease_ttl",
            lease_ttl_s or self.limits.lease_ttl_s,
            minimum=1.0,
            maximum=MAX_LEASE_TTL_S,
        )
        instance_id = uuid.uuid4().hex
        return await self.runner.write(
            lambda now: self.store.register_instance(
                now, instance_id, gateway_name, host, pid, connected, ttl
            )
        )

    async def heartbeat(self, instance_id: str, platforms: Sequence[str]) -> Instance:
        _instance_id(instance_id)
        connected = validation.platforms("platforms", platforms)

        def op(now: float) -> Instance:
            if not self.store.heartbeat(now, instance_id, connected):
                _require_live(self.store.get_instance(instance_id), instance_id, now)
            return self.store.get_instance(instance_id)  # type: ignore[return-value]

        return await self.runner.write(op)

    async def deregister(self, instance_id: str) -> Instance:
        _instance_id(instance_id)

        def op(now: float) -> Instance:
            self.store.deregister(now, instance_id)
            instance = self.store.get_instance(instance_id)
            if instance is None:
                raise NotFound("INSTANCE_NOT_FOUND", f"instance {instance_id!r} is not registered")
            return instance

        return await self.runner.write(op)

    async def get_instance(self, instance_id: str) -> tuple[Instance, bool]:
        """The instance and whether it is live now, on the database's clock (as the
        lease checks of every other call judge it)."""
        _instance_id(instance_id)

        def op() -> tuple[Instance, bool]:
            instance = self.store.get_instance(instance_id)
            if instance is None:
                raise NotFound("INSTANCE_NOT_FOUND", f"instance {instance_id!r} is not registered")
            return instance, instance.live_at(self.runner.backend.now())

        return await self.runner.read(op)

    # -- the send path --------------------------------------------------------------------

    def _validated(self, new: NewObligation) -> NewObligation:
        validation.routing_key("session_key", new.session_key)
        validation.text("message_ref", new.message_ref, max_len=256)
        validation.no_separator("message_ref", new.message_ref)
        if not new.content:
            raise InvalidArgument("content", "is required")
        if "\x00" in new.content:
            # PostgreSQL text cannot hold NUL; refused on SQLite too, so that moving
            # from one backend to the other never changes what a gateway may record.
            raise InvalidArgument("content", "contains NUL characters; remove them")
        size = len(new.content.encode("utf-8", "replace"))
        if size > self.limits.max_content_bytes:
            raise InvalidArgument(
                "content",
                f"is {size} bytes; this server accepts at most {self.limits.max_content_bytes}",
                reason="CONTENT_TOO_LARGE",
            )
        validation.platform("platform", new.platform)
        validation.text("chat_id", new.chat_id, max_len=256, required=True)
        validation.text("thread_id", new.thread_id, max_len=256)
        validation.string_map("metadata", new.metadata)
        return new

    async def record(
        self, instance_id: str, new: NewObligation, begin_attempt: bool = False
    ) -> tuple[Obligation, bool]:
        """Records a reply as owed; returns the row and whether this call created it.

        `begin_attempt` records it straight into ATTEMPTING, for a caller about to
        send: one round trip instead of record + MarkAttempting.
        """
        _instance_id(instance_id)
        self._validated(new)
        state = State.ATTEMPTING if begin_attempt else State.PENDING

        def op(now: float) -> tuple[Obligation, bool]:
            created = self.store.insert_if_live(now, new, instance_id, state)
            if created is not None:
                return created, True
            _require_live(self.store.get_instance(instance_id), instance_id, now)
            return self._existing(new.id), False

        return await self.runner.write(op)

    async def mark_attempting(self, obligation_id: str, instance_id: str, fence: int) -> Obligation:
        holder = _holder(instance_id, fence)
        return await self._holder_transition(obligation_id, holder, State.ATTEMPTING, {})

    async def mark_delivered(
        self, obligation_id: str, instance_id: str, fence: int, platform_message_id: str
    ) -> Obligation:
        validation.text("platform_message_id", platform_message_id, max_len=256)
        holder = _holder(instance_id, fence)
        return await self._holder_transition(
            obligation_id,
            holder,
            State.DELIVERED,
            {"platform_message_id": platform_message_id},
            stamp_delivered=True,
        )

    async def mark_failed(
        self,
        obligation_id: str,
        instance_id: str,
        fence: int,
        error: str,
        retryable: bool,
        retry_after_s: float | None,
    ) -> Obligation:
        """A retryable failure waits `retry_after_s`, or the backoff step for the
        attempts spent; a permanent one abandons the row."""
        validation.text("error", error, max_len=4096, allow_newlines=True)
        if retry_after_s is not None:
            validation.seconds("retry_after", retry_after_s, maximum=MAX_RETRY_AFTER_S)
        holder = _holder(instance_id, fence)
        target = State.FAILED if retryable else State.ABANDONED
        return await self._holder_transition(
            obligation_id,
            holder,
            target,
            {"last_error": error},
            schedule_retry=retryable,
            retry_after_s=retry_after_s,
        )

    async def _holder_transition(
        self,
        obligation_id: str,
        holder: Holder,
        target: State,
        changes: dict[str, Any],
        *,
        stamp_delivered: bool = False,
        schedule_retry: bool = False,
        retry_after_s: float | None = None,
    ) -> Obligation:
        _obligation_id(obligation_id)

        def op(now: float) -> Obligation:
            values = {"state": target.value, **changes}
            if stamp_delivered:
                values["delivered_at"] = now
            moved = self.store.transition(
                now,
                obligation_id,
                holder,
                HOLDER_SOURCES[target],
                values,
                retry_after_s=retry_after_s,
                schedule_retry=schedule_retry,
            )
            return moved or self._refused_transition(obligation_id, holder, target)

        return await self.runner.write(op)

    def _refused_transition(self, obligation_id: str, holder: Holder, target: State) -> Obligation:
        """Why a fenced transition changed nothing; a holder's repeat is answered with the row."""
        row = self._existing(obligation_id)
        if row.owner_instance_id != holder.instance_id or row.fence != holder.fence:
            raise FailedPrecondition(
                "STALE_FENCE",
                f"obligation {obligation_id} is no longer held by instance "
                f"{holder.instance_id!r} with fence {holder.fence} (it was re-claimed or "
                "retried); leave it to its current holder",
                {"state": row.state.value},
            )
        if row.state is target:
            return row  # the holder repeating its own call: idempotent
        raise FailedPrecondition(
            "ILLEGAL_TRANSITION",
            f"obligation {obligation_id} is {row.state.value}; it cannot become {target.value}",
            {"state": row.state.value},
        )

    def _existing(self, obligation_id: str) -> Obligation:
        row = self.store.get(obligation_id)
        if row is None:
            raise NotFound("OBLIGATION_NOT_FOUND", f"obligation {obligation_id} does not exist")
        return row

    # -- recovery -------------------------------------------------------------------------

    async def claim_recoverable(
        self, instance_id: str, deliverable: Sequence[str] | None, limit: int
    ) -> ClaimResult:
        _instance_id(instance_id)
        requested = (
            None
            if deliverable is None
            else validation.platforms("deliverable_platforms", deliverable)
        )
        if limit < 0:
            raise InvalidArgument("limit", "must not be negative")
        # Like page_size: 0 is the default, more than the maximum is served as the maximum.
        limit = min(limit or self.limits.default_claim_limit, MAX_CLAIM_LIMIT)

        def op(now: float) -> ClaimResult:
            caller = _require_live(self.store.get_instance(instance_id), instance_id, now)
            platforms = caller.platforms if requested is None else requested
            abandoned = self.store.abandon_exhausted(now)
            gated = self.store.count_gated(now, platforms)
            candidates = self.store.find_claimable(now, platforms, limit)
            return ClaimResult(self.store.claim(now, candidates, instance_id), abandoned, gated)

        return await self.runner.write(op)

    # -- operators ------------------------------------------------------------------------

    async def get(self, obligation_id: str) -> Obligation:
        _obligation_id(obligation_id)
        return await self.runner.read(lambda: self._existing(obligation_id))

    async def list(self, where: ObligationFilter, page_size: int, page_token: str) -> Page:
        if where.platform:
            validation.platform("platform", where.platform)
        if where.owner_instance_id:
            _instance_id(where.owner_instance_id)
        validation.text("session_key", where.session_key, max_len=512)
        size = pagination.page_size(page_size)
        filters = [where.state, where.platform, where.session_key, where.owner_instance_id]
        position = pagination.position_of(page_token, filters, float, str)
        after = None if position is None else (position[0], position[1])

        def op() -> Page:
            rows = self.store.list_page(where, after, size + 1)
            kept = min(size, pagination.fitting(row.answer_bytes() for row in rows))
            more = len(rows) > kept
            rows = rows[:kept]
            token = pagination.encode([rows[-1].created_at, rows[-1].id], filters) if more else ""
            return Page(rows, token)

        return await self.runner.read(op)

    async def retry(self, obligation_id: str) -> Obligation:
        _obligation_id(obligation_id)

        def op(now: float) -> Obligation:
            row = self._existing(obligation_id)
            if row.state is State.DELIVERED:
                raise FailedPrecondition(
                    "ALREADY_DELIVERED", f"obligation {obligation_id} was delivered; not reopened"
                )
            if row.state not in (State.FAILED, State.ABANDONED):
                raise FailedPrecondition(
                    "STILL_OWED",
                    f"obligation {obligation_id} is {row.state.value}: it is still owed and is "
                    "claimed when its owner dies",
                )
            if row.created_at <= now - self.limits.stale_after_s:
                raise FailedPrecondition(
                    "OBLIGATION_STALE",
                    f"obligation {obligation_id} is older than the stale cutoff "
                    f"({self.limits.stale_after_s:g} s); a sweep would abandon it again",
                )
            retried = self.store.operator_update(
                now,
                obligation_id,
                (State.FAILED, State.ABANDONED),
                {
                    "state": State.FAILED.value,
                    "next_attempt_at": now,
                    "attempts": 0,
                    "owner_instance_id": None,
                },
            )
            return retried or _changed_concurrently(obligation_id)

        return await self.runner.write(op)

    async def abandon(self, obligation_id: str, reason: str) -> Obligation:
        _obligation_id(obligation_id)
        validation.text("reason", reason, max_len=1024)

        def op(now: float) -> Obligation:
            row = self._existing(obligation_id)
            if row.state is State.ABANDONED:
                return row
            if row.state is State.DELIVERED:
                raise FailedPrecondition(
                    "ALREADY_DELIVERED", f"obligation {obligation_id} was delivered already"
                )
            abandoned = self.store.operator_update(
                now,
                obligation_id,
                OWED,
                {
                    "state": State.ABANDONED.value,
                    "last_error": f"abandoned by operator: {reason}".rstrip(": "),
                    "next_attempt_at": None,
                },
            )
            return abandoned or _changed_concurrently(obligation_id)

        return await self.runner.write(op)

    async def stats(self) -> LedgerStats:
        return await self.runner.read(lambda: self.store.stats(self.runner.backend.now()))

    async def prune(self, older_than_s: float | None) -> int:
        retention = validation.seconds("older_than", older_than_s or self.limits.retention_s)
        return await self.runner.write(lambda now: self.store.prune(now, retention))
