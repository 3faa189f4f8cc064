"""Fuzzing every DeliveryService RPC: each answer is a success or a clear status with
an ErrorInfo, and a rejected request leaves ledger_obligation and ledger_instance as
they were.

One server per RPC and backend, seeded with a live gateway instance (slack and
telegram), a deregistered one, obligations in every state with their fences, and
page tokens; then Hypothesis sends that RPC requests built from valid values mixed
with hostile ones (see hostile.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import grpc
import pytest
from google.protobuf.message import Message
from hypothesis import strategies as st

from switchboard.delivery.v1 import delivery_service_pb2 as pb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as pb_grpc
from tests.fuzz.checks import (
    Answer,
    KnownBug,
    backend_of,
    carried_calls,
    check_repro,
    check_request_table,
    describe,
    fuzz_rpc,
    mark_if_open,
)
from tests.fuzz.hostile import (
    Field,
    boolean,
    duration,
    empty_request,
    enum,
    int64,
    message,
    message_of,
    optional,
    page_token,
    request,
    string_list,
    string_map,
    text,
    uint32,
    uint64,
)
from tests.harness import EventLoopThread, InProcessDelivery, delivery_server

pytestmark = [pytest.mark.fuzz]

S = st.SearchStrategy
SERVICE: Final = pb.DESCRIPTOR.services_by_name["DeliveryService"]
SESSION_KEY: Final = "agent:main:slack:channel:C1"


# -- seeded state ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Holding:
    """An obligation with the instance holding it and its fence."""

    obligation_id: str
    instance_id: str
    fence: int


@dataclass(frozen=True)
class Seed:
    instance_id: str  # live, slack and telegram
    dead_instance_id: str  # deregistered
    holdings: tuple[Holding, ...]  # pending, attempting, delivered, failed, abandoned, telegram
    token: str  # ListObligations(page_size=1)
    foreign_token: str  # ListObligations(page_size=1, platform="slack")


def seed(stub: pb_grpc.DeliveryServiceStub) -> Seed:
    def register(name: str) -> str:
        return stub.RegisterInstance(
            pb.RegisterInstanceRequest(
                gateway_name=name, host="fuzz-host", pid=4242, platforms=["slack", "telegram"]
            )
        ).instance.instance_id

    live, dead = register("fuzz-gateway"), register("dead-gateway")
    stub.DeregisterInstance(pb.DeregisterInstanceRequest(instance_id=dead))

    def record(content: str, platform: str = "slack", begin: bool = False) -> pb.Obligation:
        return stub.RecordObligation(
            pb.RecordObligationRequest(
                instance_id=live,
                session_key=SESSION_KEY,
                message_ref="m1",
                content=content,
                platform=platform,
                chat_id="C1",
                thread_id="171.001",
                metadata={"reply_to": "m1"},
                begin_attempt=begin,
            )
        ).obligation

    def fenced(row: pb.Obligation) -> dict[str, Any]:
        return {"obligation_id": row.id, "instance_id": live, "fence": row.fence}

    pending = record("pending reply")
    attempting = record("attempting reply", begin=True)
    delivered = record("delivered reply")
    stub.MarkDelivered(pb.MarkDeliveredRequest(platform_message_id="pm-1", **fenced(delivered)))
    failed = record("failed reply")
    stub.MarkFailed(pb.MarkFailedRequest(error="503", retryable=True, **fenced(failed)))
    abandoned = record("abandoned reply")
    stub.MarkFailed(pb.MarkFailedRequest(error="blocked", retryable=False, **fenced(abandoned)))
    telegram = record("telegram reply", platform="telegram")
    token = stub.ListObligations(pb.ListObligationsRequest(page_size=1)).next_page_token
    foreign = stub.ListObligations(
        pb.ListObligationsRequest(page_size=1, platform="slack")
    ).next_page_token
    assert token and foreign
    rows = (pending, attempting, delivered, failed, abandoned, telegram)
    return Seed(
        instance_id=live,
        dead_instance_id=dead,
        holdings=tuple(Holding(row.id, live, row.fence) for row in rows),
        token=token,
        foreign_token=foreign,
    )


# -- field strategies -----------------------------------------------------------------------

PLATFORM: Final = text("slack", "telegram", "discord")
PLATFORMS: Final = string_list(PLATFORM, [], ["slack"], ["slack", "telegram"])
KEY: Final = text("reply_to", "parse_mode")
VALUE: Final = text("", "m1", "HTML")
STATES: Final = [
    pb.OBLIGATION_STATE_UNSPECIFIED,
    pb.OBLIGATION_STATE_PENDING,
    pb.OBLIGATION_STATE_ATTEMPTING,
    pb.OBLIGATION_STATE_DELIVERED,
    pb.OBLIGATION_STATE_FAILED,
    pb.OBLIGATION_STATE_ABANDONED,
]


def _instance(seed: Seed) -> Field:
    return text(seed.instance_id, seed.instance_id, seed.dead_instance_id, "nosuchinstance")


def _obligation(seed: Seed) -> Field:
    return text(*(h.obligation_id for h in seed.holdings), "0" * 24)


def _held(seed: Seed) -> S[dict[str, Any]]:
    return st.sampled_from(
        [
            {"obligation_id": h.obligation_id, "instance_id": h.instance_id, "fence": h.fence}
            for h in seed.holdings
        ]
    )


def _fenced(cls: type[Message], seed: Seed, **fields: Field) -> S[Message]:
    fences = uint64(0, 1, *(h.fence for h in seed.holdings))
    held = {
        "obligation_id": _obligation(seed),
        "instance_id": _instance(seed),
        "fence": fences,
        **fields,
    }
    return request(message_of(cls, held, base=_held(seed)))


def _record(seed: Seed) -> S[Message]:
    return request(
        message(
            pb.RecordObligationRequest,
            base=st.just({"instance_id": seed.instance_id}),
            instance_id=_instance(seed),
            session_key=text(SESSION_KEY, "spaces/AAA/threads/BBB", "k"),
            message_ref=text("", "m1", "m2"),
            content=text("reply", "the final answer", "multi\nline"),
            platform=PLATFORM,
            chat_id=text("C1", "U1", "-100123"),
            thread_id=text("", "171.001"),
            metadata=string_map(KEY, VALUE, {}, {"reply_to": "m1"}),
            begin_attempt=boolean(),
        )
    )


RequestStrategy = Callable[[Seed], S[Message]]

#: Every RPC of the DeliveryService and how its requests are built.
REQUESTS: Final[dict[str, RequestStrategy]] = {
    "RegisterInstance": lambda seed: request(
        message(
            pb.RegisterInstanceRequest,
            gateway_name=text("gw", "prod-gateway"),
            host=text("", "host-1"),
            pid=int64(0, 1234),
            platforms=PLATFORMS,
            lease_ttl=duration(1, 30, 3600),
        )
    ),
    "Heartbeat": lambda seed: request(
        message(pb.HeartbeatRequest, instance_id=_instance(seed), platforms=PLATFORMS)
    ),
    "DeregisterInstance": lambda seed: request(
        message(pb.DeregisterInstanceRequest, instance_id=_instance(seed))
    ),
    "GetInstance": lambda seed: request(
        message(pb.GetInstanceRequest, instance_id=_instance(seed))
    ),
    "RecordObligation": _record,
    "MarkAttempting": lambda seed: _fenced(pb.MarkAttemptingRequest, seed),
    "MarkDelivered": lambda seed: _fenced(
        pb.MarkDeliveredRequest, seed, platform_message_id=text("", "pm-1")
    ),
    "MarkFailed": lambda seed: _fenced(
        pb.MarkFailedRequest,
        seed,
        error=text("", "503", "HTTP 429\nretry later"),
        retryable=boolean(),
        retry_after=duration(0, 5, 86400),
    ),
    "ClaimRecoverable": lambda seed: request(
        message(
            pb.ClaimRecoverableRequest,
            base=st.just({"instance_id": seed.instance_id}),
            instance_id=_instance(seed),
            deliverable_platforms=optional(message(pb.PlatformSet, platforms=PLATFORMS)),
            limit=uint32(0, 1, 1000),
        )
    ),
    "GetObligation": lambda seed: request(
        message(pb.GetObligationRequest, obligation_id=_obligation(seed))
    ),
    "ListObligations": lambda seed: request(
        message(
            pb.ListObligationsRequest,
            base=st.sampled_from(
                [{"state": 0, "platform": "", "session_key": "", "owner_instance_id": ""}, {}]
            ),
            state=enum(STATES),
            platform=text("", "slack"),
            session_key=text("", SESSION_KEY),
            owner_instance_id=text("", seed.instance_id),
            page_size=uint32(0, 1, 2, 1000),
            page_token=page_token([seed.token], foreign=[seed.foreign_token]),
        )
    ),
    "RetryObligation": lambda seed: request(
        message(pb.RetryObligationRequest, obligation_id=_obligation(seed))
    ),
    "AbandonObligation": lambda seed: request(
        message(
            pb.AbandonObligationRequest,
            obligation_id=_obligation(seed),
            reason=text("", "operator says so"),
        )
    ),
    "GetLedgerStats": lambda seed: empty_request(pb.GetLedgerStatsRequest),
    "PruneObligations": lambda seed: request(
        message(pb.PruneObligationsRequest, older_than=duration(1, 3600, 7 * 86400))
    ),
    "HandOverObligations": lambda seed: request(
        message(
            pb.HandOverObligationsRequest,
            base=st.just({"from_gateway_name": "fuzz-gateway", "to_gateway_name": "gw-2"}),
            from_gateway_name=text("", "fuzz-gateway", "dead-gateway"),
            to_gateway_name=text("gw-2", "dead-gateway"),
            obligation_ids=string_list(_obligation(seed), [], [seed.holdings[0].obligation_id]),
        )
    ),
    "ListInstances": lambda seed: request(
        message(
            pb.ListInstancesRequest,
            base=st.sampled_from([{"gateway_name": "", "live_only": False}, {}]),
            gateway_name=text("", "fuzz-gateway"),
            live_only=boolean(),
            page_size=uint32(0, 1, 2, 1000),
            page_token=page_token([seed.token], foreign=[seed.foreign_token]),
        )
    ),
    "CountObligations": lambda seed: request(
        message(
            pb.CountObligationsRequest,
            state=enum(STATES),
            platform=text("", "slack"),
            session_key=text("", SESSION_KEY),
            owner_instance_id=text("", seed.instance_id),
            owed_only=boolean(),
            session_keys=string_list(text(SESSION_KEY), [], [SESSION_KEY]),
        )
    ),
}


REQUESTS["CallStream"] = lambda seed: carried_calls(pb.CallStreamRequest, SERVICE, REQUESTS, seed)

#: RPCs that never write, whatever they answer.
READ_ONLY: Final = frozenset(
    {
        "GetInstance",
        "GetObligation",
        "ListObligations",
        "GetLedgerStats",
        "ListInstances",
        "CountObligations",
    }
)

_PLATFORM = re.compile(r"[a-z][a-z0-9_]{0,31}")


def accepted_problems(rpc: str, response: Message) -> list[str]:
    """Platform names the server accepted must follow the rule the protos state."""
    values: list[tuple[str, str]] = []
    if isinstance(response, pb.RecordObligationResponse):
        values.append(("obligation.platform", response.obligation.platform))
    elif isinstance(
        response, pb.RegisterInstanceResponse | pb.HeartbeatResponse | pb.GetInstanceResponse
    ):
        values += [("instance.platforms", p) for p in response.instance.platforms]
    return [
        f"{rpc} accepted {name}={value!r}, which breaks its documented syntax"
        for name, value in values
        if not _PLATFORM.fullmatch(value)
    ]


# -- the database -------------------------------------------------------------------------------

Rows = tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]


def rows(delivery: InProcessDelivery) -> Rows:
    """The rows of ledger_obligation and ledger_instance (as test_bad_input compares)."""
    store = delivery.unit.store
    with store.backend.database.connection_context():
        database: Any = store.backend.database  # peewee's execute_sql is untyped
        obligations = database.execute_sql("SELECT * FROM ledger_obligation ORDER BY id").fetchall()
        instances = database.execute_sql("SELECT * FROM ledger_instance ORDER BY id").fetchall()
    return obligations, instances


def check_nothing_written(
    rpc: str, request: Message, answer: Answer, before: Rows, after: Rows
) -> None:
    outcome = "OK" if answer.error is None else answer.error.code().name
    assert after[0] == before[0], (
        f"{rpc} answered {outcome} but changed ledger_obligation\nrequest: {describe(request)}"
    )
    assert after[1] == before[1], (
        f"{rpc} answered {outcome} but changed ledger_instance\nrequest: {describe(request)}"
    )


# -- known server bugs ------------------------------------------------------------------------

BUGS: Final = (
    KnownBug(
        name="content-nul-on-postgres",
        rpc="RecordObligation",
        reason="content is only checked for size; on Postgres a reply containing NUL reaches "
        "the text column and fails with INTERNAL ('A string literal cannot contain NUL'); "
        "expected the row (as on SQLite) or INVALID_ARGUMENT content",
        backends=("postgres",),
        fixed=True,
        matches=None,
        repro=lambda seed: pb.RecordObligationRequest(
            instance_id=seed.instance_id,
            session_key=SESSION_KEY,
            content="a\x00b",
            platform="slack",
            chat_id="C1",
        ),
        expected=grpc.StatusCode.INVALID_ARGUMENT,
    ),
)


def test_every_rpc_has_a_request_strategy() -> None:
    check_request_table(REQUESTS, SERVICE, READ_ONLY | {bug.rpc for bug in BUGS})


@pytest.mark.parametrize("rpc", sorted(REQUESTS))
def test_fuzzed_requests_answer_clearly_and_rejections_write_nothing(
    rpc: str, database_url: str, loop_thread: EventLoopThread
) -> None:
    backend = backend_of(database_url)
    method = SERVICE.methods_by_name[rpc]
    with delivery_server(loop_thread, database_url) as delivery:
        fuzz_rpc(
            delivery.stub,
            rpc,
            method,
            REQUESTS[rpc](seed(delivery.stub)),
            bugs=BUGS,
            backend=backend,
            read_only=READ_ONLY,
            snapshot=lambda: rows(delivery),
            nothing_written=check_nothing_written,
            accepted_problems=accepted_problems,
        )


@pytest.mark.parametrize("bug", BUGS, ids=lambda bug: bug.name)
def test_known_bug(
    bug: KnownBug,
    database_url: str,
    loop_thread: EventLoopThread,
    request: pytest.FixtureRequest,
) -> None:
    """Each server bug the fuzzer found, reproduced minimally: a strict xfail where it
    shows while open, a regression test once fixed."""
    mark_if_open(bug, backend_of(database_url), request)
    with delivery_server(loop_thread, database_url) as delivery:
        repro = bug.repro(seed(delivery.stub))
        check_repro(bug, delivery.stub, SERVICE.methods_by_name[bug.rpc], repro)
