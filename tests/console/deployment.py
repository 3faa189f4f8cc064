"""A deployment for the console's tests: both services (with tokens) on one database,
a seeded log (two agents, sessions, two rewinds, a checkpoint, owed replies), and the
console served in this process, read-write and read-only. Real parts throughout."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from switchboard.auth import parse_tokens
from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as dpb_grpc
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from switchboard_console.server import ConsoleServer
from switchboard_console.web import Console, ConsoleSettings
from tests.harness import EventLoopThread, delivery_server, session_server

TOKENS = {"admin": "tok-admin", "alice": "tok-alice", "bob": "tok-bob"}
GRANTS = parse_tokens("tok-admin=admin;tok-alice=agents:alice;tok-bob=agents:bob")
ADMIN = (("authorization", "Bearer tok-admin"),)


def message(text: str, role: int = pb.ROLE_USER) -> pb.SessionEventInput:
    return pb.SessionEventInput(
        message_appended=pb.MessageAppended(message=pb.Message(role=role, content=text))  # type: ignore[arg-type]
    )


def temp(key: str, value: str) -> pb.SessionEventInput:
    return pb.SessionEventInput(temp_state_changed=pb.TempStateChanged(set={key: value}))


@dataclass
class Seeded:
    alice_session: str = ""
    bob_session: str = ""
    rewinds: list[int] = field(default_factory=list)
    abandoned_message: int = 0
    obligations: list[str] = field(default_factory=list)


@dataclass
class Deployment:
    loop: EventLoopThread
    sessions: pb_grpc.SessionServiceStub
    delivery: dpb_grpc.DeliveryServiceStub
    url: str  # the console, read-write
    read_only_url: str
    console: Console
    seeded: Seeded
    database_url: str

    def append(
        self, session_id: str, *events: pb.SessionEventInput, agent: str = "alice"
    ) -> pb.AppendEventsResponse:
        request = pb.AppendEventsRequest(agent=agent, session_id=session_id, events=events)
        return self.sessions.AppendEvents(request, metadata=ADMIN)

    def head(self) -> int:
        request = pb.ListLogEventsRequest(newest=True, page_size=1)
        return self.sessions.ListLogEvents(request, metadata=ADMIN).head_sequence


def seed(sessions: pb_grpc.SessionServiceStub, delivery: dpb_grpc.DeliveryServiceStub) -> Seeded:
    """Two agents with sessions; a checkpoint; a first rewind, more messages, and a
    second rewind after the first (two separate abandoned intervals); a permission
    decision; and owed replies in several states."""
    seeded = Seeded()
    for name in ("alice", "bob"):
        agent = pb.Agent(name=name, display_name=name.title(), peers=[name])
        sessions.CreateAgent(pb.CreateAgentRequest(agent=agent), metadata=ADMIN)
    alice = sessions.ResolveSession(
        pb.ResolveSessionRequest(
            agent="alice", source=pb.Source(transport="web", conversation_id="tab-1")
        ),
        metadata=ADMIN,
    ).session
    bob = sessions.ResolveSession(
        pb.ResolveSessionRequest(
            agent="bob",
            source=pb.Source(
                transport="slack", chat_type=pb.CHAT_TYPE_GROUP, chat_id="C42", user_id="U7"
            ),
        ),
        metadata=ADMIN,
    ).session
    seeded.alice_session, seeded.bob_session = alice.session_id, bob.session_id

    def say(session: pb.Session, *events: pb.SessionEventInput) -> list[pb.Event]:
        request = pb.AppendEventsRequest(
            agent=session.agent, session_id=session.session_id, events=events
        )
        return list(sessions.AppendEvents(request, metadata=ADMIN).events)

    kept = say(alice, message("What is on the roadmap?"), temp("topic", "roadmap"))
    say(alice, message("Q3: the console.", pb.ROLE_ASSISTANT))
    say(bob, message("Deploy status?"), message("Green.", pb.ROLE_ASSISTANT))
    sessions.PutMemory(
        pb.PutMemoryRequest(agent="alice", key="tone", value="brief"), metadata=ADMIN
    )
    sessions.CreateCheckpoint(pb.CreateCheckpointRequest(label="before-deploy"), metadata=ADMIN)
    lost = say(alice, message("Deploy to prod now"), temp("topic", "deploy"))
    seeded.abandoned_message = lost[0].sequence
    say(bob, message("Rolling out…"))
    first = sessions.Rewind(pb.RewindRequest(checkpoint="before-deploy"), metadata=ADMIN)
    seeded.rewinds.append(first.record.sequence)
    after = say(alice, message("Deploy to staging first"), temp("topic", "staging"))
    say(alice, message("Staging is green.", pb.ROLE_ASSISTANT))
    say(bob, message("Oops, wrong channel"))
    second = sessions.Rewind(pb.RewindRequest(sequence=after[-1].sequence), metadata=ADMIN)
    seeded.rewinds.append(second.record.sequence)
    say(alice, message("Ship it.", pb.ROLE_USER), temp("topic", "shipped"))
    sessions.CheckPermission(
        pb.CheckPermissionRequest(
            agent="alice", session_id=alice.session_id, action="peer.send", resource="alice"
        ),
        metadata=ADMIN,
    )
    del kept
    seeded.obligations = _owed_replies(delivery, alice, bob)
    return seeded


def _owed_replies(
    delivery: dpb_grpc.DeliveryServiceStub, alice: pb.Session, bob: pb.Session
) -> list[str]:
    instance = delivery.RegisterInstance(
        dpb.RegisterInstanceRequest(
            gateway_name="gw-main", host="pod-1", platforms=["slack", "web"]
        ),
        metadata=ADMIN,
    ).instance
    ids = []
    for number, (session, platform) in enumerate(
        [(alice, "web"), (alice, "web"), (bob, "slack"), (bob, "slack")]
    ):
        row = delivery.RecordObligation(
            dpb.RecordObligationRequest(
                instance_id=instance.instance_id,
                session_key=session.routing_key,
                message_ref=f"m{number}",
                content=f"reply {number}",
                platform=platform,
                chat_id="C42" if platform == "slack" else "tab-1",
                metadata={"session_id": session.session_id},
            ),
            metadata=ADMIN,
        ).obligation
        ids.append(row.id)
        if number == 1:
            delivery.MarkFailed(
                dpb.MarkFailedRequest(
                    obligation_id=row.id,
                    instance_id=instance.instance_id,
                    fence=row.fence,
                    error="HTTP 502 from the platform",
                    retryable=False,
                ),
                metadata=ADMIN,
            )
        if number == 2:
            delivery.MarkDelivered(
                dpb.MarkDeliveredRequest(
                    obligation_id=row.id,
                    instance_id=instance.instance_id,
                    fence=row.fence,
                    platform_message_id="p-2",
                ),
                metadata=ADMIN,
            )
    return ids


@contextmanager
def deployed(loop: EventLoopThread, database_url: str) -> Iterator[Deployment]:
    with ExitStack() as stack:
        session = stack.enter_context(session_server(loop, database_url, auth=GRANTS))
        delivery = stack.enter_context(delivery_server(loop, database_url, auth=GRANTS))
        seeded = seed(session.stub, delivery.stub)
        consoles = []
        for read_only in (False, True):
            settings = ConsoleSettings(
                session.address, delivery.address, "127.0.0.1:0", read_only=read_only
            )
            server = ConsoleServer(settings)
            address = loop.run(server.start())
            stack.callback(loop.run, server.stop())
            consoles.append((server, f"http://{address}"))
        yield Deployment(
            loop=loop,
            sessions=session.stub,
            delivery=delivery.stub,
            url=consoles[0][1],
            read_only_url=consoles[1][1],
            console=consoles[0][0].console,
            seeded=seeded,
            database_url=database_url,
        )
