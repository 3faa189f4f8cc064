"""Who may do what in the DeliveryService: real servers with tokens, both backends.

The model (README "Who may do what", the proto's service comment): an agent or
gateway token acts for its agents through the instances it registered; another
agent's row and another principal's instance read exactly as missing ones;
operator calls need admin; and recovery is bound to the gateway that recorded
a row, for every caller.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, NamedTuple

import grpc
import pytest
from google.protobuf.message import Message

from delivery_service.records import Caller as Scope
from switchboard.auth import parse_tokens
from switchboard.delivery.v1 import delivery_service_pb2 as pb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as pb_grpc
from switchboard.errors import PermissionDenied
from tests.delivery.conftest import StartDelivery
from tests.harness import EventLoopThread, InProcessDelivery
from tests.status import error_details

ADMIN, MAIN, CODER = "root-token", "main-token", "coder-token"
TGBOT, MAINBOT = "tgbot-token", "mainbot-token"
GRANTS = parse_tokens(
    f"{ADMIN}=admin;{MAIN}=agents:main;{CODER}=agents:coder;"
    f"{TGBOT}=gateway:tgbot:main,coder;{MAINBOT}=gateway:mainbot:main,coder"
)
MISSING_OBLIGATION = "0123456789abcdef01234567"
OWED = {pb.OBLIGATION_STATE_PENDING, pb.OBLIGATION_STATE_ATTEMPTING, pb.OBLIGATION_STATE_FAILED}

Refusal = tuple[grpc.StatusCode, str, str, dict[str, str]]


def refusal(call: Callable[[], object], *, hide: str = "") -> Refusal:
    """Code, reason, message (with `hide` replaced by <id>) and metadata of a refused call."""
    with pytest.raises(grpc.RpcError) as refused:
        call()
    info, _ = error_details(refused.value)
    message = refused.value.details() or ""
    return (
        refused.value.code(),
        info.reason,
        message.replace(hide, "<id>") if hide else message,
        dict(info.metadata),
    )


class _Details(
    NamedTuple(
        "_Details",
        [
            ("method", str),
            ("timeout", float | None),
            ("metadata", Any),
            ("credentials", Any),
            ("wait_for_ready", Any),
            ("compression", Any),
        ],
    ),
    grpc.ClientCallDetails,
):
    pass


class _Bearer(grpc.UnaryUnaryClientInterceptor):
    """Adds one bearer token to every call."""

    def __init__(self, token: str) -> None:
        self.header = ("authorization", f"Bearer {token}")

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        metadata = [*(details.metadata or ()), self.header]
        with_token = _Details(
            details.method,
            details.timeout if details.timeout is not None else 30.0,
            metadata,
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )
        return continuation(with_token, request)


def Caller(delivery: InProcessDelivery, token: str | None) -> pb_grpc.DeliveryServiceStub:  # noqa: N802
    """The generated stub, every call with `token` (None: no token)."""
    if token is None:
        return delivery.stub
    return pb_grpc.DeliveryServiceStub(grpc.intercept_channel(delivery.channel, _Bearer(token)))


class Bot:
    """A gateway instance of one bot account, calling with its token."""

    def __init__(
        self,
        delivery: InProcessDelivery,
        token: str | None,
        gateway_name: str,
        platforms: tuple[str, ...] = ("telegram",),
    ) -> None:
        self.call = Caller(delivery, token)
        self.gateway_name = gateway_name
        self.instance_id = self.call.RegisterInstance(
            pb.RegisterInstanceRequest(
                gateway_name=gateway_name, host="h", pid=os.getpid(), platforms=platforms
            )
        ).instance.instance_id

    def record(self, session_key: str, content: str, platform: str = "telegram") -> pb.Obligation:
        chat = session_key.rsplit(":", 1)[-1]
        return self.call.RecordObligation(
            pb.RecordObligationRequest(
                instance_id=self.instance_id,
                session_key=session_key,
                message_ref="m1",
                content=content,
                platform=platform,
                chat_id=chat,
            )
        ).obligation

    def attempting(self, row: pb.Obligation) -> pb.Obligation:
        return self.call.MarkAttempting(
            pb.MarkAttemptingRequest(
                obligation_id=row.id, instance_id=self.instance_id, fence=row.fence
            )
        ).obligation

    def failed(self, row: pb.Obligation) -> pb.Obligation:
        return self.call.MarkFailed(
            pb.MarkFailedRequest(
                obligation_id=row.id,
                instance_id=self.instance_id,
                fence=row.fence,
                error="503",
                retryable=True,
            )
        ).obligation

    def claim(self) -> pb.ClaimRecoverableResponse:
        return self.call.ClaimRecoverable(pb.ClaimRecoverableRequest(instance_id=self.instance_id))

    def die(self) -> None:
        self.call.DeregisterInstance(pb.DeregisterInstanceRequest(instance_id=self.instance_id))


@pytest.fixture
def secured(start_delivery: StartDelivery) -> InProcessDelivery:
    return start_delivery(auth=GRANTS)


def admin_rows(delivery: InProcessDelivery) -> dict[str, pb.Obligation]:
    listed = Caller(delivery, ADMIN).ListObligations(pb.ListObligationsRequest(page_size=1000))
    return {row.id: row for row in listed.obligations}


def instance_count(delivery: InProcessDelivery) -> int:
    store = delivery.unit.store
    with store.backend.database.connection_context():
        return int(store.Instance.select().count())


# -- rows of another agent -------------------------------------------------------------------


def test_another_agents_row_reads_and_moves_like_a_missing_one(
    secured: InProcessDelivery,
) -> None:
    coder = Bot(secured, CODER, "coderbot")
    row = coder.attempting(coder.record("agent:coder:telegram:dm:7", "coder's secret reply"))
    main = Bot(secured, MAIN, "coderbot")
    get = main.call.GetObligation
    missing = refusal(lambda: get(pb.GetObligationRequest(obligation_id=MISSING_OBLIGATION)))
    assert missing[:2] == (grpc.StatusCode.NOT_FOUND, "OBLIGATION_NOT_FOUND")

    def like_missing(call: Callable[[str], object]) -> None:
        hidden = refusal(lambda: call(row.id), hide=row.id)
        assert hidden == refusal(lambda: call(MISSING_OBLIGATION), hide=MISSING_OBLIGATION)
        assert hidden[:2] == missing[:2]

    like_missing(lambda oid: get(pb.GetObligationRequest(obligation_id=oid)))
    # With main's own instance, and with coder's instance and the leaked fence.
    for instance_id in (main.instance_id, coder.instance_id):

        def attempting(oid: str, iid: str = instance_id) -> object:
            request = pb.MarkAttemptingRequest(obligation_id=oid, instance_id=iid, fence=row.fence)
            return main.call.MarkAttempting(request)

        def delivered(oid: str, iid: str = instance_id) -> object:
            request = pb.MarkDeliveredRequest(obligation_id=oid, instance_id=iid, fence=row.fence)
            return main.call.MarkDelivered(request)

        def failed(oid: str, iid: str = instance_id) -> object:
            request = pb.MarkFailedRequest(
                obligation_id=oid, instance_id=iid, fence=row.fence, error="e", retryable=False
            )
            return main.call.MarkFailed(request)

        for call in (attempting, delivered, failed):
            like_missing(call)
    listed = main.call.ListObligations(pb.ListObligationsRequest())
    assert list(listed.obligations) == []
    by_key = main.call.ListObligations(pb.ListObligationsRequest(session_key=row.session_key))
    assert list(by_key.obligations) == []
    assert admin_rows(secured)[row.id] == row, "the refused calls changed the row"
    # Coder itself sees and moves its row.
    mine = coder.call.ListObligations(pb.ListObligationsRequest()).obligations
    assert [r.id for r in mine] == [row.id]
    assert (mine[0].agent, mine[0].gateway_name) == ("coder", "coderbot")


def test_a_token_records_only_under_its_agents_keys(secured: InProcessDelivery) -> None:
    main = Bot(secured, MAIN, "shared")
    for key in ("agent:coder:telegram:dm:7", "web:tab-1", "agent:Main:web:x", "agent:main"):
        refused = refusal(partial(main.record, key, "hi"))
        assert refused[:2] == (grpc.StatusCode.PERMISSION_DENIED, "AGENT_SCOPE"), key
    assert admin_rows(secured) == {}, "a refused record wrote a row"
    assert main.record("agent:main:web:tab-1", "hi", platform="web").agent == "main"


# -- instances of another principal ----------------------------------------------------------


def test_another_principals_instance_is_an_unknown_one(secured: InProcessDelivery) -> None:
    coder = Bot(secured, CODER, "coderbot")
    # The same agent under another token scope is another principal too.
    tgbot = Bot(secured, TGBOT, "tgbot")
    main = Bot(secured, MAIN, "tgbot")
    mine = main.record("agent:main:telegram:dm:1", "main's reply")
    unknown = uuid.uuid4().hex
    calls: dict[str, Callable[[str], object]] = {
        "Heartbeat": lambda iid: main.call.Heartbeat(
            pb.HeartbeatRequest(instance_id=iid, platforms=["telegram"])
        ),
        "DeregisterInstance": lambda iid: main.call.DeregisterInstance(
            pb.DeregisterInstanceRequest(instance_id=iid)
        ),
        "GetInstance": lambda iid: main.call.GetInstance(pb.GetInstanceRequest(instance_id=iid)),
        "RecordObligation": lambda iid: main.call.RecordObligation(
            pb.RecordObligationRequest(
                instance_id=iid,
                session_key="agent:main:telegram:dm:2",
                content="x",
                platform="telegram",
                chat_id="2",
            )
        ),
        "ClaimRecoverable": lambda iid: main.call.ClaimRecoverable(
            pb.ClaimRecoverableRequest(instance_id=iid)
        ),
        "MarkDelivered": lambda iid: main.call.MarkDelivered(
            pb.MarkDeliveredRequest(obligation_id=mine.id, instance_id=iid, fence=mine.fence)
        ),
    }
    for rpc, call in calls.items():
        expected = refusal(partial(call, unknown), hide=unknown)
        assert expected[:2] == (grpc.StatusCode.NOT_FOUND, "INSTANCE_NOT_FOUND"), rpc
        for other in (coder.instance_id, tgbot.instance_id):
            assert refusal(partial(call, other), hide=other) == expected, rpc
    assert instance_count(secured) == 3, "a refused call registered something"
    for bot in (coder, tgbot):
        got = bot.call.GetInstance(pb.GetInstanceRequest(instance_id=bot.instance_id)).instance
        assert got.live, "a refused deregister ended the instance"
    assert admin_rows(secured)[mine.id] == mine


def test_a_gateway_token_registers_its_own_gateway_name_only(secured: InProcessDelivery) -> None:
    for name in ("mainbot", "tgbot2", "TGBOT"):
        refused = refusal(partial(Bot, secured, TGBOT, name))
        assert refused[:2] == (grpc.StatusCode.PERMISSION_DENIED, "GATEWAY_SCOPE"), name
        assert "'tgbot'" in refused[2]
    assert instance_count(secured) == 0
    bot = Bot(secured, TGBOT, "tgbot")
    got = bot.call.GetInstance(pb.GetInstanceRequest(instance_id=bot.instance_id)).instance
    assert got.gateway_name == "tgbot"
    # An agent token is bound to no gateway name; admin sees every instance.
    Bot(secured, MAIN, "anything")
    admin = Caller(secured, ADMIN).GetInstance(pb.GetInstanceRequest(instance_id=bot.instance_id))
    assert admin.instance.instance_id == bot.instance_id


def test_operator_calls_need_an_admin_token(secured: InProcessDelivery) -> None:
    coder = Bot(secured, CODER, "coderbot")
    row = coder.failed(coder.record("agent:coder:telegram:dm:7", "x"))
    requests: dict[str, Message] = {
        "GetLedgerStats": pb.GetLedgerStatsRequest(),
        "RetryObligation": pb.RetryObligationRequest(obligation_id=row.id),
        "AbandonObligation": pb.AbandonObligationRequest(obligation_id=row.id),
        "PruneObligations": pb.PruneObligationsRequest(),
        "HandOverObligations": pb.HandOverObligationsRequest(
            from_gateway_name="coderbot", to_gateway_name="tgbot"
        ),
    }
    for token in (MAIN, CODER, TGBOT):
        for rpc, request in requests.items():
            refused = refusal(partial(getattr(Caller(secured, token), rpc), request))
            assert refused[:2] == (grpc.StatusCode.PERMISSION_DENIED, "ADMIN_ONLY"), (token, rpc)
    assert admin_rows(secured)[row.id] == row
    admin = Caller(secured, ADMIN)
    assert admin.GetLedgerStats(pb.GetLedgerStatsRequest()).live_instance_count == 1
    hand_over = pb.HandOverObligationsRequest(from_gateway_name="coderbot", to_gateway_name="tgbot")
    assert admin.HandOverObligations(hand_over).handed_over_count == 1


def test_calls_without_a_token_are_unauthenticated(secured: InProcessDelivery) -> None:
    refused = refusal(lambda: Bot(secured, None, "tgbot"))
    assert refused[0] == grpc.StatusCode.UNAUTHENTICATED


# -- claims ----------------------------------------------------------------------------------


def test_a_claim_takes_abandons_and_counts_only_the_callers_agents_rows(
    secured: InProcessDelivery,
) -> None:
    coder = Bot(secured, CODER, "shared", platforms=("telegram", "slack"))
    theirs = [
        coder.record("agent:coder:telegram:dm:7", "a"),
        coder.record("agent:coder:slack:dm:7", "b", platform="slack"),
    ]
    main_old = Bot(secured, MAIN, "shared")
    ours = main_old.record("agent:main:telegram:dm:1", "c")
    coder.die()
    main_old.die()
    _make_exhausted(secured, [row.id for row in theirs])
    rescuer = Bot(secured, MAIN, "shared")
    claimed = rescuer.claim()
    assert [row.id for row in claimed.obligations] == [ours.id]
    assert (claimed.abandoned_count, claimed.gated_count) == (0, 0)
    after = admin_rows(secured)
    assert {after[row.id].state for row in theirs} == {pb.OBLIGATION_STATE_PENDING}


def _make_exhausted(delivery: InProcessDelivery, ids: list[str]) -> None:
    """Rows that spent every attempt: the next sweep that may see them abandons them."""
    model = delivery.unit.store.Obligation
    with delivery.unit.store.backend.database.connection_context():
        model.update(attempts=delivery.unit.limits.max_attempts).where(model.id.in_(ids)).execute()


def test_the_sabotage_sequence_is_refused_at_its_first_step(secured: InProcessDelivery) -> None:
    """Issue 12: an agent token for `main` against `coder`'s six owed replies."""
    coder = Bot(secured, CODER, "coderbot")
    second = Bot(secured, CODER, "coderbot")
    rows = []
    for i in range(6):
        owner = coder if i % 2 else second
        row = owner.record(f"agent:coder:telegram:dm:{i}", f"owed {i}")
        rows.append(owner.attempting(row) if i % 3 == 1 else row)
    before = admin_rows(secured)
    attacker = Caller(secured, MAIN)
    leaked = rows[1]  # a fence seen in a log line, say

    def first_step(code: grpc.StatusCode, reason: str, call: Callable[[], object]) -> None:
        assert refusal(call)[:2] == (code, reason)

    assert list(attacker.ListObligations(pb.ListObligationsRequest()).obligations) == []
    for row in rows:
        first_step(
            grpc.StatusCode.NOT_FOUND,
            "OBLIGATION_NOT_FOUND",
            partial(attacker.GetObligation, pb.GetObligationRequest(obligation_id=row.id)),
        )
    first_step(
        grpc.StatusCode.NOT_FOUND,
        "OBLIGATION_NOT_FOUND",
        lambda: attacker.MarkDelivered(
            pb.MarkDeliveredRequest(
                obligation_id=leaked.id, instance_id=coder.instance_id, fence=leaked.fence
            )
        ),
    )
    first_step(
        grpc.StatusCode.PERMISSION_DENIED,
        "AGENT_SCOPE",
        lambda: attacker.RecordObligation(
            pb.RecordObligationRequest(
                instance_id=coder.instance_id,
                session_key="agent:coder:telegram:dm:0",
                content="spoofed",
                platform="telegram",
                chat_id="0",
            )
        ),
    )
    for victim in (coder, second):
        first_step(
            grpc.StatusCode.NOT_FOUND,
            "INSTANCE_NOT_FOUND",
            partial(
                attacker.DeregisterInstance,
                pb.DeregisterInstanceRequest(instance_id=victim.instance_id),
            ),
        )
    # Claim and deregister three times, under coder's own gateway name, while
    # coder's gateways live and after they really crashed.
    for crashed in (False, True):
        if crashed:
            coder.die()
            second.die()
        for _ in range(3):
            claimer = Bot(secured, MAIN, "coderbot")
            claimed = claimer.claim()
            assert (len(claimed.obligations), claimed.abandoned_count, claimed.gated_count) == (
                0,
                0,
                0,
            )
            claimer.die()
    after = admin_rows(secured)
    for row in rows:
        assert after[row.id].state in OWED
        assert (after[row.id].owner_instance_id, after[row.id].fence, after[row.id].attempts) == (
            before[row.id].owner_instance_id,
            before[row.id].fence,
            0,
        )
    # And coder's next gateway recovers all six.
    recovered = Bot(secured, CODER, "coderbot").claim().obligations
    assert sorted(row.id for row in recovered) == sorted(row.id for row in rows)


# -- two bots on one platform ----------------------------------------------------------------


@pytest.fixture(params=["auth on", "auth off"])
def two_bot_ledger(
    request: pytest.FixtureRequest, start_delivery: StartDelivery
) -> Iterator[tuple[InProcessDelivery, dict[str, str | None]]]:
    """The binding holds for every caller: with each bot's gateway token, and with
    authentication off."""
    if request.param == "auth on":
        yield start_delivery(auth=GRANTS), {"tgbot": TGBOT, "mainbot": MAINBOT, "admin": ADMIN}
    else:
        yield start_delivery(), {"tgbot": None, "mainbot": None, "admin": None}


def test_each_bots_rows_are_claimed_only_by_the_same_bot(
    two_bot_ledger: tuple[InProcessDelivery, dict[str, str | None]],
) -> None:
    delivery, tokens = two_bot_ledger
    bots = {name: Bot(delivery, tokens[name], name) for name in ("tgbot", "mainbot")}
    owed = {
        "tgbot": {
            bots["tgbot"].record("agent:main:telegram:dm:42", "via tgbot").id,
            bots["tgbot"].attempting(bots["tgbot"].record("agent:coder:telegram:dm:9", "t2")).id,
        },
        "mainbot": {bots["mainbot"].record("agent:main:telegram:dm:43", "via mainbot").id},
    }
    for bot in bots.values():
        bot.die()  # both crash
    # mainbot comes back first: it takes its own row only, tgbot's wait.
    mainbot = Bot(delivery, tokens["mainbot"], "mainbot")
    claimed = mainbot.claim()
    assert {row.id for row in claimed.obligations} == owed["mainbot"]
    assert claimed.gated_count == 0, "another gateway's rows are not this claimer's to count"
    stats = Caller(delivery, tokens["admin"]).GetLedgerStats(pb.GetLedgerStatsRequest())
    assert {(g.platform, g.count) for g in stats.gated} == {("telegram", 2)}
    tgbot = Bot(delivery, tokens["tgbot"], "tgbot")
    claimed = tgbot.claim()
    assert {row.id for row in claimed.obligations} == owed["tgbot"]
    # tgbot is retired with its rows claimed: only an admin's hand-over lets mainbot
    # send them, and through its own bot.
    tgbot.die()
    assert list(mainbot.claim().obligations) == []
    hand_over = pb.HandOverObligationsRequest(from_gateway_name="tgbot", to_gateway_name="mainbot")
    moved = Caller(delivery, tokens["admin"]).HandOverObligations(hand_over)
    assert moved.handed_over_count == 2
    claimed = mainbot.claim()
    assert {row.id for row in claimed.obligations} == owed["tgbot"]
    assert {row.gateway_name for row in claimed.obligations} == {"mainbot"}
    assert all(row.needs_marker for row in claimed.obligations), "tgbot may have sent them"


def test_a_hand_over_moves_owed_rows_only_and_leaves_a_live_holder_alone(
    start_delivery: StartDelivery,
) -> None:
    delivery = start_delivery(auth=GRANTS)
    admin = Caller(delivery, ADMIN)
    tgbot = Bot(delivery, TGBOT, "tgbot")
    held = tgbot.attempting(tgbot.record("agent:main:telegram:dm:1", "held"))
    pending = tgbot.record("agent:main:telegram:dm:2", "pending")
    done = tgbot.attempting(tgbot.record("agent:main:telegram:dm:3", "done"))
    tgbot.call.MarkDelivered(
        pb.MarkDeliveredRequest(
            obligation_id=done.id, instance_id=tgbot.instance_id, fence=done.fence
        )
    )
    only_held = pb.HandOverObligationsRequest(
        from_gateway_name="tgbot",
        to_gateway_name="mainbot",
        obligation_ids=[held.id, done.id, MISSING_OBLIGATION],
        request_id=str(uuid.uuid4()),
    )
    assert admin.HandOverObligations(only_held).handed_over_count == 1
    # A retry with the request id is answered as the first call was.
    assert admin.HandOverObligations(only_held).handed_over_count == 1
    rows = admin_rows(delivery)
    assert rows[held.id].gateway_name == "mainbot"
    assert (rows[held.id].owner_instance_id, rows[held.id].fence) == (tgbot.instance_id, held.fence)
    assert rows[pending.id].gateway_name == rows[done.id].gateway_name == "tgbot"
    # The live holder still finishes its send.
    delivered = tgbot.call.MarkDelivered(
        pb.MarkDeliveredRequest(
            obligation_id=held.id, instance_id=tgbot.instance_id, fence=held.fence
        )
    ).obligation
    assert delivered.state == pb.OBLIGATION_STATE_DELIVERED
    everything = pb.HandOverObligationsRequest(from_gateway_name="tgbot", to_gateway_name="mainbot")
    assert admin.HandOverObligations(everything).handed_over_count == 1  # `pending`
    assert admin.HandOverObligations(everything).handed_over_count == 0


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"from_gateway_name": "tgbot"}, "to_gateway_name"),
        ({"from_gateway_name": "tgbot", "to_gateway_name": "tgbot"}, "to_gateway_name"),
        ({"from_gateway_name": "tgbot", "to_gateway_name": "x" * 129}, "to_gateway_name"),
        ({"from_gateway_name": "a\x00", "to_gateway_name": "b"}, "from_gateway_name"),
        (
            {"from_gateway_name": "a", "to_gateway_name": "b", "obligation_ids": ["nope"]},
            "obligation_ids",
        ),
        (
            {"from_gateway_name": "a", "to_gateway_name": "b", "obligation_ids": ["0" * 24] * 1001},
            "obligation_ids",
        ),
    ],
)
def test_a_bad_hand_over_names_the_field_and_moves_nothing(
    delivery: InProcessDelivery, fields: dict[str, Any], field: str
) -> None:
    bot = Bot(delivery, None, "a")
    row = bot.record("agent:main:telegram:dm:1", "x")
    with pytest.raises(grpc.RpcError) as refused:
        delivery.stub.HandOverObligations(pb.HandOverObligationsRequest(**fields))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_details(refused.value)[1] == [field]
    assert (
        delivery.stub.GetObligation(pb.GetObligationRequest(obligation_id=row.id)).obligation == row
    )


def test_rows_of_no_known_gateway_are_claimable_by_any_gateway_until_handed_over(
    delivery: InProcessDelivery,
) -> None:
    """Rows recorded before rows remembered their gateway (migration 4 leaves them "")."""
    old = Bot(delivery, None, "retired")
    first, second = (old.record(f"agent:main:telegram:dm:{i}", "x").id for i in (1, 2))
    old.die()
    model = delivery.unit.store.Obligation
    with delivery.unit.store.backend.database.connection_context():
        model.update(gateway_name="").execute()
    bind = pb.HandOverObligationsRequest(
        from_gateway_name="", from_no_gateway=True, to_gateway_name="tgbot", obligation_ids=[second]
    )
    assert delivery.stub.HandOverObligations(bind).handed_over_count == 1
    mainbot = Bot(delivery, None, "mainbot")
    assert [row.id for row in mainbot.claim().obligations] == [first]
    assert [row.id for row in Bot(delivery, None, "tgbot").claim().obligations] == [second]


def test_a_leaked_fence_of_another_principals_instance_moves_nothing(
    secured: InProcessDelivery,
) -> None:
    """Same agent, another token scope: the row is main's, the holder is not."""
    tgbot = Bot(secured, TGBOT, "tgbot")
    held = tgbot.attempting(tgbot.record("agent:main:telegram:dm:1", "held by tgbot"))
    main = Caller(secured, MAIN)
    oid, iid, fence = held.id, tgbot.instance_id, held.fence
    for call in (
        partial(
            main.MarkDelivered,
            pb.MarkDeliveredRequest(obligation_id=oid, instance_id=iid, fence=fence),
        ),
        partial(
            main.MarkFailed,
            pb.MarkFailedRequest(obligation_id=oid, instance_id=iid, fence=fence, error="x"),
        ),
        partial(
            main.MarkAttempting,
            pb.MarkAttemptingRequest(obligation_id=oid, instance_id=iid, fence=fence),
        ),
    ):
        assert refusal(call)[:2] == (grpc.StatusCode.NOT_FOUND, "INSTANCE_NOT_FOUND")
    # main reads its agent's row all the same.
    got = main.GetObligation(pb.GetObligationRequest(obligation_id=held.id)).obligation
    assert got == held


def test_a_row_forged_into_the_callers_hands_still_moves_only_for_its_agent(
    secured: InProcessDelivery,
) -> None:
    """Defence in depth: the transition's own statement checks the row's agent, so
    even a row of coder's somehow held by main's instance does not move for main."""
    coder = Bot(secured, CODER, "shared")
    row = coder.record("agent:coder:telegram:dm:7", "coder's")
    main = Bot(secured, MAIN, "shared")
    model = secured.unit.store.Obligation
    with secured.unit.store.backend.database.connection_context():
        model.update(owner_instance_id=main.instance_id).where(model.id == row.id).execute()
    refused = refusal(lambda: main.attempting(row))
    assert refused[:2] == (grpc.StatusCode.NOT_FOUND, "OBLIGATION_NOT_FOUND")
    assert admin_rows(secured)[row.id].state == pb.OBLIGATION_STATE_PENDING


def test_a_claim_never_abandons_another_gateways_exhausted_rows(
    delivery: InProcessDelivery,
) -> None:
    tgbot = Bot(delivery, None, "tgbot")
    rows = [tgbot.record(f"agent:main:telegram:dm:{i}", "x").id for i in range(3)]
    tgbot.die()
    _make_exhausted(delivery, rows)
    claimed = Bot(delivery, None, "mainbot").claim()
    assert (len(claimed.obligations), claimed.abandoned_count) == (0, 0)
    assert Bot(delivery, None, "tgbot").claim().abandoned_count == 3


def test_the_claim_write_itself_keeps_to_the_claimers_gateway_and_agents(
    delivery: InProcessDelivery,
) -> None:
    """The claim's guarded UPDATE re-checks gateway and agents: candidates read for
    one claimer are not taken by another."""
    tgbot = Bot(delivery, None, "tgbot")
    rows = {tgbot.record(f"agent:main:telegram:dm:{i}", "x").id for i in range(2)}
    tgbot.die()
    rescuer = Bot(delivery, None, "mainbot")
    store, backend = delivery.unit.store, delivery.unit.store.backend
    with backend.database.connection_context(), backend.write_transaction():
        candidates = store.find_claimable(backend.now(), ["telegram"], 100, "tgbot", None)
        assert {c[0] for c in candidates} == rows
        now = backend.now()
        assert store.claim(now, candidates, rescuer.instance_id, "mainbot", None) == []
        assert store.claim(now, candidates, rescuer.instance_id, "tgbot", frozenset({"x"})) == []


def test_the_rules_refuse_operator_calls_on_their_own(
    delivery: InProcessDelivery, loop_thread: EventLoopThread
) -> None:
    """The interceptor refuses them first; the ledger holds without it."""
    ledger = delivery.unit.ledger
    agent = Scope(principal="agents:main", agents=frozenset({"main"}))
    for call in (
        lambda: ledger.stats(agent),
        lambda: ledger.retry(MISSING_OBLIGATION, agent),
        lambda: ledger.abandon(MISSING_OBLIGATION, "", agent),
        lambda: ledger.prune(None, agent),
        lambda: ledger.hand_over("a", "b", [], agent),
    ):
        with pytest.raises(PermissionDenied) as refused:
            loop_thread.run(call())
        assert refused.value.reason == "ADMIN_ONLY"


# -- several replicas -------------------------------------------------------------------------


def test_the_model_holds_across_replicas_and_racing_claims(
    start_delivery: StartDelivery,
) -> None:
    """Ownership lives in the rows, not in a replica: what one replica recorded and
    registered is another principal's on every replica, and two instances of the
    owing bot claiming at once on two replicas take each row exactly once."""
    first, second = start_delivery(auth=GRANTS), start_delivery(auth=GRANTS)
    crashed = Bot(first, TGBOT, "tgbot")
    rows = [crashed.record(f"agent:main:telegram:dm:{n}", f"reply {n}") for n in range(20)]
    crashed.die()
    coder = Caller(second, CODER)
    assert refusal(
        lambda: coder.GetObligation(pb.GetObligationRequest(obligation_id=rows[0].id)),
        hide=rows[0].id,
    ) == refusal(
        lambda: coder.GetObligation(pb.GetObligationRequest(obligation_id=MISSING_OBLIGATION)),
        hide=MISSING_OBLIGATION,
    )
    assert refusal(
        lambda: Caller(second, MAIN).Heartbeat(pb.HeartbeatRequest(instance_id=crashed.instance_id))
    )[:2] == (grpc.StatusCode.NOT_FOUND, "INSTANCE_NOT_FOUND")
    assert Bot(second, MAINBOT, "mainbot").claim().obligations == []

    rescuers = [Bot(first, TGBOT, "tgbot"), Bot(second, TGBOT, "tgbot")]
    with ThreadPoolExecutor(len(rescuers)) as pool:
        answers = list(pool.map(lambda bot: bot.claim(), rescuers))
    claimed = [row.id for answer in answers for row in answer.obligations]
    assert sorted(claimed) == sorted(row.id for row in rows)
