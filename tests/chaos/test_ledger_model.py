"""A Hypothesis state machine of the delivery ledger, driven through gRPC.

Random records, marks (by the holder, by others, with stale or future fences),
failures (retryable or not, due now or later), claims, deregistrations,
operator retries and abandons against an in-process DeliveryService on both
backends. After every step all rows are read back and checked twice:

- against a model that predicts every response (or error reason) and row;
- against the ledger's rules, independently of the model: each row's change
  from its previous observation is one legal transition (a holder transition
  from `HOLDER_SOURCES`, a claim, the attempts-cap sweep, an operator retry or
  abandon) made by the step that ran; DELIVERED and ABANDONED are never left,
  except ABANDONED → FAILED by RetryObligation; fences only grow; attempts only
  grow, except that RetryObligation resets them.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import grpc
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from switchboard_client.errors import from_rpc_error

from delivery_service.records import NewObligation
from delivery_service.state_machine import HOLDER_SOURCES, OWED, LedgerLimits, State
from switchboard.delivery.v1 import delivery_service_pb2 as pb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as pb_grpc
from tests.chaos.common import DEADLINE, ROUNDS
from tests.harness import EventLoopThread, delivery_server

pytestmark = [pytest.mark.chaos, pytest.mark.slow, DEADLINE]

MAX_ATTEMPTS = 3
CONTENTS = 5
TIMEOUT_S = 10.0
STATE_OF = {
    pb.OBLIGATION_STATE_PENDING: State.PENDING,
    pb.OBLIGATION_STATE_ATTEMPTING: State.ATTEMPTING,
    pb.OBLIGATION_STATE_DELIVERED: State.DELIVERED,
    pb.OBLIGATION_STATE_FAILED: State.FAILED,
    pb.OBLIGATION_STATE_ABANDONED: State.ABANDONED,
}
HOLDER_CALLS = ("attempting", "delivered", "failed")
#: Transitions seen across all runs of a test, by kind (printed at the end).
SEEN: Counter[str] = Counter()


@dataclass(frozen=True)
class Row:
    """What the model says a row is."""

    state: State
    owner: str
    fence: int
    attempts: int
    needs_marker: bool
    due: bool = False  # FAILED and its retry time has come


def _seen(row: pb.Obligation) -> Row:
    return Row(
        STATE_OF[row.state],
        row.owner_instance_id,
        row.fence,
        row.attempts,
        row.needs_marker,
    )


Outcome = tuple[grpc.StatusCode, str] | None  # None: the call succeeds


def _refusal(call: Any) -> Outcome:
    try:
        call()
    except grpc.RpcError as error:
        refused = from_rpc_error(error)
        return refused.code, refused.reason
    return None


FP = grpc.StatusCode.FAILED_PRECONDITION


class LedgerMachine(RuleBasedStateMachine):
    stub: ClassVar[pb_grpc.DeliveryServiceStub]

    def __init__(self) -> None:
        super().__init__()
        # A platform of its own: claims of this run see only this run's rows.
        self.platform = f"p{uuid.uuid4().hex[:12]}"
        self.instances: list[str] = []
        self.live: dict[str, bool] = {}
        self.model: dict[str, Row] = {}
        self.observed: dict[str, pb.Obligation] = {}
        self.last: tuple[str, str] = ("init", "")  # (step kind, acting instance)
        self.just_claimed: list[str] = []

    # -- helpers ----------------------------------------------------------------------------

    def _new(self, content: int) -> NewObligation:
        return NewObligation(
            session_key=f"agent:main:{self.platform}:dm:c{content}",
            message_ref=f"m{content}",
            content=f"reply {content}",
            platform=self.platform,
            chat_id=f"c{content}",
        )

    def _instance(self, index: int) -> str:
        return self.instances[index % len(self.instances)]

    def _row_id(self, index: int) -> str:
        ids = list(self.model)  # in recording order: ids differ between runs (the platform)
        return ids[index % len(ids)]

    def _expect(self, outcome: Outcome, expected: Outcome, what: str) -> None:
        assert outcome == expected, f"{what}: got {outcome}, the model expects {expected}"

    def _recoverable(self, row: Row) -> bool:
        owner_dead = not self.live.get(row.owner, False)
        return row.state in OWED and (owner_dead or (row.state is State.FAILED and row.due))

    # -- instances --------------------------------------------------------------------------

    @initialize()
    def two_gateways(self) -> None:
        self.register()
        self.register()

    @precondition(lambda self: sum(self.live.values()) < 3 and len(self.instances) < 8)
    @rule()
    def register(self) -> None:
        request = pb.RegisterInstanceRequest(gateway_name="model", platforms=[self.platform])
        instance_id = self.stub.RegisterInstance(request, timeout=TIMEOUT_S).instance.instance_id
        self.instances.append(instance_id)
        self.live[instance_id] = True
        self.last = ("register", instance_id)

    @rule(who=st.integers(0, 7))
    def deregister(self, who: int) -> None:
        instance_id = self._instance(who)
        request = pb.DeregisterInstanceRequest(instance_id=instance_id)
        self.stub.DeregisterInstance(request, timeout=TIMEOUT_S)
        self.live[instance_id] = False
        self.last = ("deregister", instance_id)

    # -- the send path ----------------------------------------------------------------------

    @rule(who=st.integers(0, 7), content=st.integers(0, CONTENTS - 1), begin=st.booleans())
    def record(self, who: int, content: int, begin: bool) -> None:
        instance_id = self._instance(who)
        new = self._new(content)
        request = pb.RecordObligationRequest(
            instance_id=instance_id,
            session_key=new.session_key,
            message_ref=new.message_ref,
            content=new.content,
            platform=new.platform,
            chat_id=new.chat_id,
            begin_attempt=begin,
        )
        answer: list[pb.RecordObligationResponse] = []
        outcome = _refusal(
            lambda: answer.append(self.stub.RecordObligation(request, timeout=TIMEOUT_S))
        )
        self.last = ("record", instance_id)
        if not self.live[instance_id]:
            return self._expect(outcome, (FP, "INSTANCE_NOT_LIVE"), "record by a dead instance")
        self._expect(outcome, None, "record")
        existing = self.model.get(new.id)
        assert answer[0].created is (existing is None)
        if existing is None:
            state = State.ATTEMPTING if begin else State.PENDING
            self.model[new.id] = Row(state, instance_id, 1, 0, False)
            SEEN["record"] += 1
        assert _seen(answer[0].obligation) == replace(self.model[new.id], due=False)

    def _holder_call(
        self, kind: str, row_id: str, who: int, fence_choice: str, **extra: Any
    ) -> tuple[Outcome, Row, str, int]:
        row = self.model[row_id]
        instance_id = row.owner if who < 8 and row.owner else self._instance(who)
        fence = {
            "current": row.fence,
            "stale": row.fence - 1,
            "future": row.fence + 1,
        }[fence_choice]
        holder: dict[str, Any] = {
            "obligation_id": row_id,
            "instance_id": instance_id,
            "fence": fence,
        }
        if kind == "attempting":
            call: Any = lambda: self.stub.MarkAttempting(  # noqa: E731
                pb.MarkAttemptingRequest(**holder), timeout=TIMEOUT_S
            )
        elif kind == "delivered":
            call = lambda: self.stub.MarkDelivered(  # noqa: E731
                pb.MarkDeliveredRequest(platform_message_id="pm", **holder), timeout=TIMEOUT_S
            )
        else:
            call = lambda: self.stub.MarkFailed(  # noqa: E731
                pb.MarkFailedRequest(error="503", **holder, **extra), timeout=TIMEOUT_S
            )
        self.last = (kind, instance_id)
        return _refusal(call), row, instance_id, fence

    def _holder_expectation(
        self, row: Row, instance_id: str, fence: int, target: State
    ) -> tuple[Outcome, bool]:
        """The model of a fenced transition: (expected outcome, whether the row moves)."""
        if fence <= 0:
            return (grpc.StatusCode.INVALID_ARGUMENT, ""), False
        holds = row.owner == instance_id and row.fence == fence
        if holds and row.state in HOLDER_SOURCES[target]:
            return None, True
        if not holds:
            return (FP, "STALE_FENCE"), False
        if row.state is target:
            return None, False  # the holder repeating its own call
        return (FP, "ILLEGAL_TRANSITION"), False

    def _check_holder(
        self, outcome: Outcome, row: Row, row_id: str, instance_id: str, fence: int, target: State
    ) -> bool:
        expected, moves = self._holder_expectation(row, instance_id, fence, target)
        if expected is not None and expected[0] == grpc.StatusCode.INVALID_ARGUMENT:
            assert outcome is not None and outcome[0] == expected[0], outcome
        else:
            self._expect(outcome, expected, f"{target.value} of a {row.state.value} row")
        return moves

    fences = st.sampled_from(["current"] * 6 + ["stale", "future"])

    @precondition(lambda self: self.model)
    @rule(pick=st.integers(0, 99), who=st.integers(0, 9), fence=fences)
    def attempting(self, pick: int, who: int, fence: str) -> None:
        row_id = self._row_id(pick)
        outcome, row, instance_id, sent = self._holder_call("attempting", row_id, who, fence)
        if self._check_holder(outcome, row, row_id, instance_id, sent, State.ATTEMPTING):
            self.model[row_id] = replace(row, state=State.ATTEMPTING)

    @precondition(lambda self: self.model)
    @rule(pick=st.integers(0, 99), who=st.integers(0, 9), fence=fences)
    def delivered(self, pick: int, who: int, fence: str) -> None:
        row_id = self._row_id(pick)
        outcome, row, instance_id, sent = self._holder_call("delivered", row_id, who, fence)
        if self._check_holder(outcome, row, row_id, instance_id, sent, State.DELIVERED):
            self.model[row_id] = replace(row, state=State.DELIVERED)

    @precondition(lambda self: self.model)
    @rule(
        pick=st.integers(0, 99),
        who=st.integers(0, 9),
        fence=fences,
        retryable=st.booleans(),
        due_now=st.booleans(),
    )
    def failed(self, pick: int, who: int, fence: str, retryable: bool, due_now: bool) -> None:
        row_id = self._row_id(pick)
        retry_after = pb.MarkFailedRequest().retry_after
        retry_after.FromSeconds(0 if due_now else 3600)
        outcome, row, instance_id, sent = self._holder_call(
            "failed", row_id, who, fence, retryable=retryable, retry_after=retry_after
        )
        target = State.FAILED if retryable else State.ABANDONED
        if self._check_holder(outcome, row, row_id, instance_id, sent, target):
            self.model[row_id] = replace(row, state=target, due=retryable and due_now)

    # -- recovery ---------------------------------------------------------------------------

    @precondition(lambda self: sum(self.live.values()) >= 2)
    @rule(dies=st.integers(0, 7), rescuer=st.integers(0, 7))
    def a_gateway_dies_and_another_claims(self, dies: int, rescuer: int) -> None:
        """The common recovery story in one step: a live gateway goes, a live one claims."""
        alive = [i for i in self.instances if self.live[i]]
        dead = alive[dies % len(alive)]
        self.deregister(self.instances.index(dead))
        survivors = [i for i in self.instances if self.live[i]]
        self.claim(self.instances.index(survivors[rescuer % len(survivors)]))

    @precondition(lambda self: any(self._recoverable(row) for row in self.model.values()))
    @rule(who=st.integers(0, 7), claims=st.integers(1, MAX_ATTEMPTS + 1))
    def a_flaky_platform_fails_every_redelivery(self, who: int, claims: int) -> None:
        """A live gateway's periodic claims whose redeliveries all fail (retryable, due at
        once): attempts pile up until the sweep abandons the row. Checked after every
        call, like a step."""
        alive = [i for i in self.instances if self.live[i]]
        if not alive:
            self.register()
            self.rows_match_the_model_and_move_only_legally()
            alive = self.instances[-1:]
        claimer = self.instances.index(alive[who % len(alive)])
        for n in range(claims):
            if n:
                self.rows_match_the_model_and_move_only_legally()
            self.claim(claimer)
            for row_id in self.just_claimed:
                self.rows_match_the_model_and_move_only_legally()
                pick = list(self.model).index(row_id)
                self.failed(pick, who=0, fence="current", retryable=True, due_now=True)

    @rule(who=st.integers(0, 7))
    def claim(self, who: int) -> None:
        instance_id = self._instance(who)
        request = pb.ClaimRecoverableRequest(instance_id=instance_id, limit=1000)
        answer: list[pb.ClaimRecoverableResponse] = []
        outcome = _refusal(
            lambda: answer.append(self.stub.ClaimRecoverable(request, timeout=TIMEOUT_S))
        )
        self.last = ("claim", instance_id)
        self.just_claimed = []
        if not self.live[instance_id]:
            return self._expect(outcome, (FP, "INSTANCE_NOT_LIVE"), "claim by a dead instance")
        self._expect(outcome, None, "claim")
        swept, claimed = set(), {}
        for row_id, row in self.model.items():
            if not self._recoverable(row):
                continue
            if row.attempts >= MAX_ATTEMPTS:
                self.model[row_id] = replace(row, state=State.ABANDONED, due=False)
                swept.add(row_id)
                continue
            claimed[row_id] = Row(
                State.ATTEMPTING,
                instance_id,
                row.fence + 1,
                row.attempts + 1,
                row.state is not State.PENDING or row.attempts > 0,
            )
        self.model.update(claimed)
        self.just_claimed = sorted(claimed)
        got = {row.id: _seen(row) for row in answer[0].obligations}
        assert got == claimed, f"claimed {sorted(got)}, the model expects {sorted(claimed)}"
        # The sweep is global: rows of other runs may be in the count as well.
        assert answer[0].abandoned_count >= len(swept)

    # -- operators --------------------------------------------------------------------------

    @precondition(lambda self: self.model)
    @rule(pick=st.integers(0, 99))
    def operator_retry(self, pick: int) -> None:
        row_id = self._row_id(pick)
        row = self.model[row_id]
        request = pb.RetryObligationRequest(obligation_id=row_id)
        outcome = _refusal(lambda: self.stub.RetryObligation(request, timeout=TIMEOUT_S))
        self.last = ("retry", "")
        if row.state is State.DELIVERED:
            return self._expect(outcome, (FP, "ALREADY_DELIVERED"), "retry of a delivered row")
        if row.state not in (State.FAILED, State.ABANDONED):
            return self._expect(outcome, (FP, "STILL_OWED"), f"retry of a {row.state.value} row")
        self._expect(outcome, None, "retry")
        self.model[row_id] = replace(
            row, state=State.FAILED, owner="", fence=row.fence + 1, attempts=0, due=True
        )

    @precondition(lambda self: self.model)
    @rule(pick=st.integers(0, 99))
    def operator_abandon(self, pick: int) -> None:
        row_id = self._row_id(pick)
        row = self.model[row_id]
        request = pb.AbandonObligationRequest(obligation_id=row_id, reason="model")
        outcome = _refusal(lambda: self.stub.AbandonObligation(request, timeout=TIMEOUT_S))
        self.last = ("abandon", "")
        if row.state is State.DELIVERED:
            return self._expect(outcome, (FP, "ALREADY_DELIVERED"), "abandon of a delivered row")
        self._expect(outcome, None, "abandon")
        if row.state is not State.ABANDONED:
            self.model[row_id] = replace(row, state=State.ABANDONED, fence=row.fence + 1, due=False)

    # -- after every step -------------------------------------------------------------------

    @invariant()
    def rows_match_the_model_and_move_only_legally(self) -> None:
        request = pb.ListObligationsRequest(platform=self.platform, page_size=100)
        listed = self.stub.ListObligations(request, timeout=TIMEOUT_S).obligations
        rows = {row.id: row for row in listed}
        assert set(rows) == set(self.model), "rows appeared or vanished"
        for row_id, row in rows.items():
            assert _seen(row) == replace(self.model[row_id], due=False), (
                f"{row_id}: stored {_seen(row)}, the model says {self.model[row_id]}"
            )
            before = self.observed.get(row_id)
            kind = self._legal(before, row)
            if kind:
                SEEN[kind] += 1
        self.observed = rows

    def _legal(self, before: pb.Obligation | None, after: pb.Obligation) -> str:
        """Which legal transition took `before` to `after` in the last step ("" for none);
        fails the test if no legal transition can have done it."""
        step, actor = self.last
        if before is None:
            assert step == "record", f"a row appeared on {step}"
            assert STATE_OF[after.state] in (State.PENDING, State.ATTEMPTING)
            assert (after.fence, after.attempts) == (1, 0)
            return ""
        prev, next_ = STATE_OF[before.state], STATE_OF[after.state]
        assert after.fence >= before.fence, f"{after.id}: the fence went back"
        reset = step == "retry" and after.attempts == 0
        assert after.attempts >= before.attempts or reset, f"{after.id}: attempts went back"
        if prev.terminal and next_ is not prev:
            assert (prev, next_, step) == (State.ABANDONED, State.FAILED, "retry"), (
                f"{after.id} left terminal {prev.value} for {next_.value} on {step}"
            )
        same = (before.owner_instance_id, before.fence, before.attempts)
        now = (after.owner_instance_id, after.fence, after.attempts)
        if (prev, same) == (next_, now):
            return ""
        shapes = {
            "holder": step in HOLDER_CALLS
            and now == same
            and after.owner_instance_id == actor
            and prev in HOLDER_SOURCES.get(next_, ()),
            "claim": step == "claim"
            and prev in OWED
            and next_ is State.ATTEMPTING
            and now == (actor, before.fence + 1, before.attempts + 1),
            "sweep": step == "claim"
            and prev in OWED
            and next_ is State.ABANDONED
            and now == same
            and before.attempts >= MAX_ATTEMPTS,
            "retry": step == "retry"
            and prev in (State.FAILED, State.ABANDONED)
            and next_ is State.FAILED
            and now == ("", before.fence + 1, 0),
            "abandon": step == "abandon"
            and prev in OWED
            and next_ is State.ABANDONED
            and now == (before.owner_instance_id, before.fence + 1, before.attempts),
        }
        legal = [name for name, fits in shapes.items() if fits]
        assert legal, (
            f"{after.id}: illegal transition on {step}: {prev.value} {same} → {next_.value} {now}"
        )
        return f"{legal[0]}: {prev.value} → {next_.value}"


#: Transition kinds every test must have exercised (the attempts-cap sweep needs four
#: claims of one row in a run: it shows up in most runs, not all, and is printed).
REQUIRED = ("holder:", "claim:", "retry:", "abandon:")


def test_ledger_state_machine(database_url: str, loop_thread: EventLoopThread) -> None:
    # Leases never run out during a run: only deregistration kills an instance.
    limits = LedgerLimits(lease_ttl_s=3600.0, max_attempts=MAX_ATTEMPTS)
    SEEN.clear()
    with delivery_server(loop_thread, database_url, limits) as server:
        machine = type("Ledger", (LedgerMachine,), {"stub": server.stub})
        # Coverage is random: another batch of runs (at most two) if a kind was missed.
        for _batch in range(3):
            run_state_machine_as_test(
                machine,
                settings=settings(
                    max_examples=10 + 10 * ROUNDS,
                    stateful_step_count=40,
                    deadline=None,
                    database=None,
                    suppress_health_check=[HealthCheck.too_slow],
                ),
            )
            missed = [kind for kind in REQUIRED if not any(k.startswith(kind) for k in SEEN)]
            if not missed:
                break
    print(f"ledger model: transitions exercised {dict(sorted(SEEN.items()))}")
    assert not missed, f"never exercised: {missed}"
