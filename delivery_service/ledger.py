"""The delivery ledger's domain core: validation, rules and transactions.

Plain Python over `LedgerStore`; the gRPC servicer only converts messages.
Every public method is one transaction run by the `TransactionRunner`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from delivery_service.records import (
    UNRESTRICTED,
    Caller,
    ClaimResult,
    Holder,
    Instance,
    InstancePage,
    InstanceSummary,
    LedgerStats,
    NewObligation,
    Obligation,
    ObligationFilter,
    Page,
)
from delivery_service.redaction import LedgerRedactor
from delivery_service.state_machine import HOLDER_SOURCES, OWED, LedgerLimits, State
from delivery_service.store import LedgerStore
from switchboard import pagination, validation
from switchboard.errors import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from switchboard.idempotency import RequestGuard
from switchboard.runner import TransactionRunner

_OBLIGATION_ID = re.compile(r"[0-9a-f]{24}")
MAX_CLAIM_LIMIT = 1000
MAX_LEASE_TTL_S = 3600.0
MAX_RETRY_AFTER_S = 24 * 3600.0
MAX_HAND_OVER_IDS = 1000
#: Session keys one CountObligations counts apart.
MAX_COUNTED_KEYS = 1000
_REGISTER_FIRST = "; call RegisterInstance first"


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


def _gateway_name(field: str, value: str) -> str:
    return validation.text(field, value, max_len=128, required=True)


def _checked_origin(from_gateway: str, from_no_gateway: bool) -> None:
    """A hand-over moves the rows of no known gateway only when the caller says so."""
    if not from_gateway and not from_no_gateway:
        raise InvalidArgument(
            "from_gateway_name",
            "give the gateway whose owed rows move; the rows of no known gateway "
            "(recorded before rows remembered their gateway) must be asked for "
            "explicitly with from_no_gateway=true",
        )
    if from_gateway and from_no_gateway:
        raise InvalidArgument(
            "from_no_gateway",
            f"names the rows of no known gateway; it cannot go with from_gateway_name "
            f"{from_gateway[:128]!r}: give one or the other",
        )


def _visible(instance: Instance | None, caller: Caller) -> Instance | None:
    """The instance as the caller may see it: another principal's is not there at all."""
    return instance if instance is not None and caller.owns(instance) else None


def _instance_not_found(instance_id: str, hint: str = "") -> NotFound:
    """An unknown instance, and (answered alike) one another principal registered."""
    return NotFound("INSTANCE_NOT_FOUND", f"instance {instance_id!r} is not registered{hint}")


def _require_admin(caller: Caller, rpc: str) -> None:
    """Operator calls (the interceptor refuses them first; the rules hold on their own)."""
    if not caller.unrestricted:
        raise PermissionDenied("ADMIN_ONLY", f"{rpc} needs an admin token")


def _require_live(instance: Instance | None, instance_id: str, now: float) -> Instance:
    if instance is None:
        raise _instance_not_found(instance_id, _REGISTER_FIRST)
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
    def __init__(
        self,
        runner: TransactionRunner,
        store: LedgerStore,
        limits: LedgerLimits,
        redactor: LedgerRedactor | None = None,
    ) -> None:
        self.runner = runner
        self.store = store
        self.limits = limits
        #: With a PII key: session keys stored hashed, reply targets only sealed.
        self.redactor = redactor or LedgerRedactor()

    # -- gateway instances ----------------------------------------------------------------

    async def register_instance(
        self,
        gateway_name: str,
        host: str,
        pid: int,
        platforms: Sequence[str],
        lease_ttl_s: float | None = None,
        caller: Caller = UNRESTRICTED,
        *,
        guard: RequestGuard | None = None,
    ) -> Instance:
        _gateway_name("gateway_name", gateway_name)
        if caller.gateway and gateway_name != caller.gateway:
            raise PermissionDenied(
                "GATEWAY_SCOPE",
                f"this token registers instances of gateway {caller.gateway!r} only, "
                f"not {gateway_name[:128]!r}",
            )
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
                now, instance_id, gateway_name, host, pid, connected, ttl, caller.principal
            ),
            guard=guard,
        )

    async def heartbeat(
        self,
        instance_id: str,
        platforms: Sequence[str],
        caller: Caller = UNRESTRICTED,
        *,
        guard: RequestGuard | None = None,
    ) -> Instance:
        _instance_id(instance_id)
        connected = validation.platforms("platforms", platforms)
        principal = _principal_guard(caller)

        def op(now: float) -> Instance:
            if not self.store.heartbeat(now, instance_id, connected, principal):
                _require_live(self._instance(instance_id, caller), instance_id, now)
            return self.store.get_instance(instance_id)  # type: ignore[return-value]

        return await self.runner.write(op, guard=guard)

    async def deregister(
        self, instance_id: str, caller: Caller = UNRESTRICTED, *, guard: RequestGuard | None = None
    ) -> Instance:
        _instance_id(instance_id)
        principal = _principal_guard(caller)

        def op(now: float) -> Instance:
            self.store.deregister(now, instance_id, principal)
            instance = self._instance(instance_id, caller)
            if instance is None:
                raise _instance_not_found(instance_id)
            return instance

        return await self.runner.write(op, guard=guard)

    async def get_instance(
        self, instance_id: str, caller: Caller = UNRESTRICTED
    ) -> tuple[Instance, bool]:
        """The instance and whether it is live now, on the database's clock (as the
        lease checks of every other call judge it)."""
        _instance_id(instance_id)

        def op() -> tuple[Instance, bool]:
            instance = self._instance(instance_id, caller)
            if instance is None:
                raise _instance_not_found(instance_id)
            return instance, instance.live_at(self.runner.backend.now())

        return await self.runner.read(op)

    async def list_instances(
        self,
        gateway_name: str,
        live_only: bool,
        page_size: int,
        page_token: str,
        caller: Caller = UNRESTRICTED,
    ) -> InstancePage:
        """A page of instances, latest registered first, each with its liveness now
        (database clock) and the owed rows it holds. Admin only."""
        _require_admin(caller, "ListInstances")
        validation.text("gateway_name", gateway_name, max_len=128)
        size = pagination.page_size(page_size)
        filters = [gateway_name, live_only]
        position = pagination.position_of(page_token, filters, float, str)
        before = None if position is None else (position[0], position[1])

        def op() -> InstancePage:
            now = self.runner.backend.now()
            found = self.store.instance_page(
                gateway_name, now if live_only else None, before, size + 1
            )
            more, found = len(found) > size, found[:size]
            held = self.store.held_counts([instance.id for instance in found])
            summaries = [
                InstanceSummary(instance, instance.live_at(now), held.get(instance.id, 0))
                for instance in found
            ]
            last = found[-1] if found else None
            token = (
                pagination.encode([last.registered_at, last.id], filters) if more and last else ""
            )
            return InstancePage(summaries, token)

        return await self.runner.read(op)

    def _instance(self, instance_id: str, caller: Caller) -> Instance | None:
        return _visible(self.store.get_instance(instance_id), caller)

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
        _reply_target(new)
        validation.string_map("metadata", new.metadata)
        return new

    def _stored(self, new: NewObligation) -> NewObligation:
        """The reply as this server may store it: with a PII key, its target only
        sealed, its session key and message ref hashed (the id is computed over them)."""
        if not self.redactor.keyed:
            return new
        if not new.sealed_target:
            raise InvalidArgument(
                "chat_id",
                "this DeliveryService keeps no raw personal ids (it has a PII key): record "
                "the reply target sealed in sealed_target, with chat_id and thread_id empty "
                "(the reference gateways do when given a reply key)",
                reason="SEALED_TARGET_REQUIRED",
            )
        return replace(
            new,
            session_key=self.redactor.session_key(new.session_key),
            message_ref=self.redactor.message_ref(new.message_ref),
        )

    async def record(
        self,
        instance_id: str,
        new: NewObligation,
        begin_attempt: bool = False,
        caller: Caller = UNRESTRICTED,
        *,
        guard: RequestGuard | None = None,
    ) -> tuple[Obligation, bool]:
        """Records a reply as owed; returns the row and whether this call created it.

        `begin_attempt` records it straight into ATTEMPTING, for a caller about to
        send: one round trip instead of record + MarkAttempting. The row remembers
        its agent and the recording instance's gateway (the one that may claim it).
        """
        _instance_id(instance_id)
        self._validated(new)
        if not caller.may_act_for(new.agent):
            raise PermissionDenied(
                "AGENT_SCOPE",
                "session_key: this token records replies only under keys "
                "'agent:<name>:...' of its own agents",
            )
        new = self._stored(new)
        state = State.ATTEMPTING if begin_attempt else State.PENDING
        principal = _principal_guard(caller)

        def op(now: float) -> tuple[Obligation, bool]:
            created = self.store.insert_if_live(now, new, instance_id, state, principal)
            if created is not None:
                return created, True
            _require_live(self._instance(instance_id, caller), instance_id, now)
            return self._existing(new.id, caller), False

        return await self.runner.write(op, guard=guard)

    async def mark_attempting(
        self,
        obligation_id: str,
        instance_id: str,
        fence: int,
        caller: Caller = UNRESTRICTED,
        *,
        guard: RequestGuard | None = None,
    ) -> Obligation:
        holder = _holder(instance_id, fence)
        return await self._holder_transition(
            obligation_id, holder, State.ATTEMPTING, {}, caller, guard=guard
        )

    async def mark_delivered(
        self,
        obligation_id: str,
        instance_id: str,
        fence: int,
        platform_message_id: str,
        caller: Caller = UNRESTRICTED,
        *,
        guard: RequestGuard | None = None,
    ) -> Obligation:
        validation.text("platform_message_id", platform_message_id, max_len=256)
        holder = _holder(instance_id, fence)
        return await self._holder_transition(
            obligation_id,
            holder,
            State.DELIVERED,
            # Delivered: an earlier failure's or an operator's reason is history now.
            {
                "platform_message_id": self.redactor.platform_message_id(platform_message_id),
                "last_error": "",
            },
            caller,
            stamp_delivered=True,
            guard=guard,
        )

    async def mark_failed(
        self,
        obligation_id: str,
        instance_id: str,
        fence: int,
        error: str,
        retryable: bool,
        retry_after_s: float | None,
        caller: Caller = UNRESTRICTED,
        *,
        guard: RequestGuard | None = None,
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
            caller,
            schedule_retry=retryable,
            retry_after_s=retry_after_s,
            guard=guard,
        )

    async def _holder_transition(
        self,
        obligation_id: str,
        holder: Holder,
        target: State,
        changes: dict[str, Any],
        caller: Caller,
        *,
        stamp_delivered: bool = False,
        schedule_retry: bool = False,
        retry_after_s: float | None = None,
        guard: RequestGuard | None,
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
                agents=caller.agents,
                principal=_principal_guard(caller),
            )
            return moved or self._refused_transition(obligation_id, holder, target, caller)

        return await self.runner.write(op, guard=guard)

    def _refused_transition(
        self, obligation_id: str, holder: Holder, target: State, caller: Caller
    ) -> Obligation:
        """Why a fenced transition changed nothing; a holder's repeat is answered with the row.

        Another agent's row is a missing one; a holder instance the caller did not
        register is an unknown one."""
        row = self._existing(obligation_id, caller)
        if self._instance(holder.instance_id, caller) is None:
            raise _instance_not_found(holder.instance_id, _REGISTER_FIRST)
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

    def _existing(self, obligation_id: str, caller: Caller = UNRESTRICTED) -> Obligation:
        """The row; another agent's is answered exactly as a missing one."""
        row = self.store.get(obligation_id, caller.agents)
        if row is None:
            raise NotFound("OBLIGATION_NOT_FOUND", f"obligation {obligation_id} does not exist")
        return row

    # -- recovery -------------------------------------------------------------------------

    async def claim_recoverable(
        self,
        instance_id: str,
        deliverable: Sequence[str] | None,
        limit: int,
        caller: Caller = UNRESTRICTED,
        *,
        guard: RequestGuard | None = None,
    ) -> ClaimResult:
        """Claims rows bound to the caller instance's gateway (or to none) that the
        caller's agents own, on the platforms it can deliver to."""
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
            claimer = _require_live(self._instance(instance_id, caller), instance_id, now)
            platforms = claimer.platforms if requested is None else requested
            scope = (claimer.gateway_name, caller.agents)
            abandoned = self.store.abandon_exhausted(now, *scope)
            gated = self.store.count_gated(now, platforms, *scope)
            candidates = self.store.find_claimable(now, platforms, limit, *scope)
            claimed = self.store.claim(now, candidates, instance_id, *scope)
            return ClaimResult(claimed, abandoned, gated)

        return await self.runner.write(op, guard=guard)

    # -- operators ------------------------------------------------------------------------

    async def get(self, obligation_id: str, caller: Caller = UNRESTRICTED) -> Obligation:
        _obligation_id(obligation_id)
        return await self.runner.read(lambda: self._existing(obligation_id, caller))

    async def list(
        self,
        where: ObligationFilter,
        page_size: int,
        page_token: str,
        caller: Caller = UNRESTRICTED,
    ) -> Page:
        """A page of rows, of the caller's agents only."""
        _check_filter(where)
        size = pagination.page_size(page_size)
        filters: list[Any] = [
            where.state,
            where.platform,
            where.session_key,
            where.owner_instance_id,
        ]
        if where.gateway_name:  # tokens of earlier releases stay valid without it
            filters.append(where.gateway_name)
        if where.agent or where.owed_only:  # so do those issued before these filters
            filters += [where.agent, where.owed_only]
        position = pagination.position_of(page_token, filters, float, str)
        after = None if position is None else (position[0], position[1])
        if where.session_key:
            where = replace(
                where, session_key_as_stored=self.redactor.session_key(where.session_key)
            )

        def op() -> Page:
            rows = self.store.list_page(where, after, size + 1, caller.agents)
            kept = min(size, pagination.fitting(row.answer_bytes() for row in rows))
            more = len(rows) > kept
            rows = rows[:kept]
            token = pagination.encode([rows[-1].created_at, rows[-1].id], filters) if more else ""
            return Page(rows, token)

        return await self.runner.read(op)

    async def count(
        self,
        where: ObligationFilter,
        session_keys: Sequence[str],
        caller: Caller = UNRESTRICTED,
    ) -> tuple[int, dict[str, int]]:
        """How many rows `list` would list with these filters, and per session key."""
        _check_filter(where)
        if len(session_keys) > MAX_COUNTED_KEYS:
            raise InvalidArgument(
                "session_keys",
                f"has {len(session_keys)} entries; the limit is {MAX_COUNTED_KEYS}",
            )
        for index, key in enumerate(session_keys):
            validation.text(f"session_keys[{index}]", key, max_len=512)
        return await self.runner.read(lambda: self.store.count(where, session_keys, caller.agents))

    async def retry(
        self,
        obligation_id: str,
        caller: Caller = UNRESTRICTED,
        *,
        guard: RequestGuard | None = None,
    ) -> Obligation:
        _require_admin(caller, "RetryObligation")
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

        return await self.runner.write(op, guard=guard)

    async def abandon(
        self,
        obligation_id: str,
        reason: str,
        caller: Caller = UNRESTRICTED,
        *,
        guard: RequestGuard | None = None,
    ) -> Obligation:
        _require_admin(caller, "AbandonObligation")
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

        return await self.runner.write(op, guard=guard)

    async def stats(self, caller: Caller = UNRESTRICTED) -> LedgerStats:
        _require_admin(caller, "GetLedgerStats")
        return await self.runner.read(lambda: self.store.stats(self.runner.backend.now()))

    async def prune(
        self,
        older_than_s: float | None,
        caller: Caller = UNRESTRICTED,
        *,
        guard: RequestGuard | None = None,
    ) -> int:
        _require_admin(caller, "PruneObligations")
        retention = validation.seconds("older_than", older_than_s or self.limits.retention_s)
        return await self.runner.write(lambda now: self.store.prune(now, retention), guard=guard)

    async def hand_over(
        self,
        from_gateway: str,
        to_gateway: str,
        obligation_ids: Sequence[str],
        caller: Caller = UNRESTRICTED,
        from_no_gateway: bool = False,
        *,
        guard: RequestGuard | None = None,
    ) -> int:
        """Binds owed rows of one gateway to another (all of them, or the ids named);
        returns how many moved. "" as `from_gateway` names the rows of no known gateway,
        and only with `from_no_gateway`: "" is also what an unset field reads as."""
        _require_admin(caller, "HandOverObligations")
        validation.text("from_gateway_name", from_gateway, max_len=128)
        _checked_origin(from_gateway, from_no_gateway)
        _gateway_name("to_gateway_name", to_gateway)
        if from_gateway == to_gateway:
            raise InvalidArgument("to_gateway_name", "must differ from from_gateway_name")
        if len(obligation_ids) > MAX_HAND_OVER_IDS:
            raise InvalidArgument(
                "obligation_ids",
                f"has {len(obligation_ids)} entries; the limit is {MAX_HAND_OVER_IDS} "
                "(leave it empty to hand over every owed row)",
            )
        for value in obligation_ids:
            if not _OBLIGATION_ID.fullmatch(value):
                raise InvalidArgument(
                    "obligation_ids", f"{value[:40]!r} is not 24 lower-case hex characters"
                )
        ids = sorted(set(obligation_ids)) or None
        return await self.runner.write(
            lambda now: self.store.hand_over(now, from_gateway, to_gateway, ids), guard=guard
        )


def _reply_target(new: NewObligation) -> None:
    """Where the reply goes: a chat id in clear, or the gateway's sealed target, never
    both (a raw id beside a sealed one would be stored in clear)."""
    validation.sealed_target("sealed_target", new.sealed_target)
    if not new.sealed_target and not new.chat_id:
        raise InvalidArgument("chat_id", "is required (or the sealed target, sealed_target)")
    validation.text("chat_id", new.chat_id, max_len=256)
    validation.text("thread_id", new.thread_id, max_len=256)
    if new.sealed_target and (new.chat_id or new.thread_id):
        raise InvalidArgument(
            "chat_id" if new.chat_id else "thread_id",
            "must be empty when sealed_target is given: the sealed target carries the chat "
            "and the thread, and an id beside it would be stored in clear",
        )


def _check_filter(where: ObligationFilter) -> None:
    if where.platform:
        validation.platform("platform", where.platform)
    if where.owner_instance_id:
        _instance_id(where.owner_instance_id)
    validation.text("session_key", where.session_key, max_len=512)
    validation.text("gateway_name", where.gateway_name, max_len=128)
    validation.text("agent", where.agent, max_len=64)
    if where.owed_only and where.state is not None:
        raise InvalidArgument("owed_only", "give either a state or owed_only, not both")


def _principal_guard(caller: Caller) -> str | None:
    """The principal whose instances a store statement may use (None: any)."""
    return None if caller.unrestricted else caller.principal
