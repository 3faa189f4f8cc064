"""What the load generator repeats against a server, one operation at a time (grpc.aio).

A workload is prepared once on the channels it is given (agents, sessions, gateway
instances: setup the clock does not see), then `op(lane, i)` runs its `i`-th
operation for lane `lane` (a closed-loop client, or one of the conversations an open
loop spreads its operations over; lanes take the channels round robin) and returns
how many items it completed: 1, or for a claim the rows it claimed.

- `noop`: `rpcs` x `grpc.health.v1.Health/Check`, which touches no database: the
  ceiling of the gRPC layer alone (server and client) on this machine;
- `append`: one AppendEvents of one USER message of `MESSAGE_BYTES` bytes into the
  lane's own session (one agent, a session per lane);
- `turn`: what a gateway does before every model turn, GetSessionState +
  GetHistory(limit=50, newest) of one session seeded with `events` message events
  (AppendEvents, `SEED_BATCH` per call, before the clock starts);
- `cycle`: the delivery send path, RecordObligation (unique content) ->
  MarkAttempting -> MarkDelivered, each a durable transaction, for the lane's own
  gateway instance; `cycle2` the same transitions in 2 RPCs (record with
  begin_attempt, then MarkDelivered);
- `append-stream`, `cycle2-stream`: `append` and `cycle2` sent as the Python clients send
  them when several calls are in flight: carried over one CallStream per channel
  (`switchboard_client._stream`);
- `claim`: ClaimRecoverable(limit) back to back until a call claims nothing, by one
  rescuing instance of the crashed gateway whose `expect` orphans were seeded
  (`bench.seeding.seed_orphans`); every id must come back once, ATTEMPTING under it.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import duration_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from switchboard_client._stream import AsyncStreamCalls
from switchboard_client.errors import SwitchboardError

from bench.stats import Window, percentile
from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as dpb_grpc
from switchboard.session.v1 import session_service_pb2 as spb
from switchboard.session.v1 import session_service_pb2_grpc as spb_grpc

#: Per-RPC deadline: a stuck call ends its client, never the whole run.
RPC_TIMEOUT_S = 10.0
#: Size of every benchmark message's content, in bytes (ASCII); the peers write the same.
MESSAGE_BYTES = 100
#: Events per AppendEvents call when seeding a session (the server's maximum).
SEED_BATCH = 100
#: Messages a gateway loads for its next turn.
HISTORY_LIMIT = 50
#: Lease asked for at registration: longer than any measurement.
LEASE_TTL_S = 3600
#: The gateway whose instance owed the orphans a claim takes over.
CRASHED_GATEWAY = "bench-crashed-gateway"


class Exhausted(Exception):
    """An operation found nothing left to do: its lane is finished."""


def message_content(lane: int, i: int) -> str:
    """A message of exactly MESSAGE_BYTES ASCII bytes, unique per (lane, i)."""
    head = f"bench user message {i} from tab-{lane}: "
    filler = "the quick brown fox jumps over the lazy dog. " * 3
    return (head + filler)[:MESSAGE_BYTES].ljust(MESSAGE_BYTES, ".")


def message_event(lane: int, i: int, role: spb.Role.ValueType = spb.ROLE_USER) -> Any:
    message = spb.Message(role=role, content=message_content(lane, i))
    return spb.SessionEventInput(message_appended=spb.MessageAppended(message=message))


def unique_name() -> str:
    """An agent or tag no earlier run on the same database used."""
    return f"bench-{uuid.uuid4().hex[:12]}"


@dataclass
class Workload:
    """The operations of one workload; subclasses set `rpcs_per_op` and define the rest."""

    request_ids: bool = False
    rpcs_per_op: float = 1
    #: Writes go as the clients send concurrent ones: over CallStream, one per channel.
    over_stream: bool = False
    carriers: list[AsyncStreamCalls] = field(default_factory=list)

    def carry(self, channels: Sequence[grpc.aio.Channel]) -> None:
        """One CallStream carrier per channel (used with `over_stream`)."""
        self.carriers = [AsyncStreamCalls(channel, ()) for channel in channels]

    async def write(self, lane: int, method: Any, request: Any) -> Any:
        """One write: the unary `method`, or with `over_stream` the lane's carrier, which
        carries it while another call is in flight (as the clients do)."""
        if not self.over_stream:
            return await method(request, timeout=RPC_TIMEOUT_S)
        carrier = self.carriers[lane % len(self.carriers)]
        try:
            return await carrier.attempt(
                request, RPC_TIMEOUT_S, lambda: method(request, timeout=RPC_TIMEOUT_S)
            )
        except SwitchboardError as error:  # the loop counts RuntimeErrors as failed ops
            raise RuntimeError(str(error)) from error

    async def prepare(self, channels: Sequence[grpc.aio.Channel], lanes: int) -> None:
        """Setup before the clock starts, for `lanes` lanes over `channels`."""

    async def op(self, lane: int, i: int) -> int:
        raise NotImplementedError

    def request_id(self) -> str:
        return str(uuid.uuid4()) if self.request_ids else ""

    def report(self, window: Window) -> dict[str, Any]:
        """What the workload measured beside the window's own figures."""
        return {}

    def problems(self) -> list[str]:
        """What went wrong that no single operation could tell (checked at the end)."""
        return []


@dataclass
class Noop(Workload):
    rpcs_per_op: float = 1
    checks: list[Any] = field(default_factory=list)

    async def prepare(self, channels: Sequence[grpc.aio.Channel], lanes: int) -> None:
        self.checks = [health_pb2_grpc.HealthStub(channel).Check for channel in channels]

    async def op(self, lane: int, i: int) -> int:
        check = self.checks[lane % len(self.checks)]
        for _ in range(int(self.rpcs_per_op)):
            await check(health_pb2.HealthCheckRequest(service=""), timeout=RPC_TIMEOUT_S)
        return 1


async def create_agent(stub: spb_grpc.SessionServiceAsyncStub) -> str:
    agent = unique_name()
    request = spb.CreateAgentRequest(agent=spb.Agent(name=agent, display_name="bench agent"))
    await stub.CreateAgent(request, timeout=RPC_TIMEOUT_S)
    return agent


async def resolve_session(stub: spb_grpc.SessionServiceAsyncStub, agent: str, tab: str) -> str:
    source = spb.Source(transport="web", conversation_id=tab)
    resolved = await stub.ResolveSession(
        spb.ResolveSessionRequest(agent=agent, source=source), timeout=RPC_TIMEOUT_S
    )
    if not resolved.created:
        raise RuntimeError(f"session for {tab} existed already: agent names not unique")
    return resolved.session.session_id


@dataclass
class Append(Workload):
    agent: str = ""
    lanes: list[tuple[spb_grpc.SessionServiceAsyncStub, str]] = field(default_factory=list)

    async def prepare(self, channels: Sequence[grpc.aio.Channel], lanes: int) -> None:
        stubs = [spb_grpc.SessionServiceStub(channel) for channel in channels]
        self.carry(channels)
        self.agent = await create_agent(stubs[0])
        for lane in range(lanes):
            stub = stubs[lane % len(stubs)]
            self.lanes.append((stub, await resolve_session(stub, self.agent, f"tab-{lane}")))

    async def op(self, lane: int, i: int) -> int:
        stub, session_id = self.lanes[lane]
        response = await self.write(
            lane,
            stub.AppendEvents,
            spb.AppendEventsRequest(
                agent=self.agent,
                session_id=session_id,
                events=[message_event(lane, i)],
                request_id=self.request_id(),
            ),
        )
        if len(response.events) != 1:
            raise RuntimeError(f"append {i} of lane {lane} answered {len(response.events)} events")
        return 1


@dataclass
class Turn(Workload):
    rpcs_per_op: float = 2
    events: int = 1000
    stubs: list[spb_grpc.SessionServiceAsyncStub] = field(default_factory=list)
    state_request: Any = None
    history_request: Any = None
    seed_s: float = 0.0
    #: (began, GetSessionState s, GetHistory s) of every load.
    timings: list[tuple[float, float, float]] = field(default_factory=list)

    async def prepare(self, channels: Sequence[grpc.aio.Channel], lanes: int) -> None:
        self.stubs = [spb_grpc.SessionServiceStub(channel) for channel in channels]
        agent = await create_agent(self.stubs[0])
        session_id = await resolve_session(self.stubs[0], agent, "tab-turn")
        began = time.perf_counter()
        await self._seed(agent, session_id)
        self.seed_s = time.perf_counter() - began
        self.state_request = spb.GetSessionStateRequest(agent=agent, session_id=session_id)
        self.history_request = spb.GetHistoryRequest(
            agent=agent, session_id=session_id, limit=HISTORY_LIMIT, newest=True
        )

    async def _seed(self, agent: str, session_id: str) -> None:
        """`events` message events, alternating USER / ASSISTANT, SEED_BATCH per call."""
        version = 1  # the SessionOpened event
        for start in range(0, self.events, SEED_BATCH):
            batch = [
                message_event(0, i, spb.ROLE_USER if i % 2 == 0 else spb.ROLE_ASSISTANT)
                for i in range(start, min(start + SEED_BATCH, self.events))
            ]
            request = spb.AppendEventsRequest(
                agent=agent, session_id=session_id, expected_version=version, events=batch
            )
            response = await self.stubs[0].AppendEvents(request, timeout=RPC_TIMEOUT_S * 3)
            version += len(batch)
            if response.version != version:
                raise RuntimeError(f"seeding: version {response.version}, expected {version}")

    async def op(self, lane: int, i: int) -> int:
        stub = self.stubs[lane % len(self.stubs)]
        began = time.perf_counter()
        state = await stub.GetSessionState(self.state_request, timeout=RPC_TIMEOUT_S)
        between = time.perf_counter()
        history = await stub.GetHistory(self.history_request, timeout=RPC_TIMEOUT_S)
        self.timings.append((began, between - began, time.perf_counter() - between))
        if state.state.session.message_count != self.events:
            raise RuntimeError(
                f"session holds {state.state.session.message_count} messages, "
                f"expected {self.events}"
            )
        if len(history.messages) != min(self.events, HISTORY_LIMIT):
            raise RuntimeError(f"history returned {len(history.messages)} messages")
        return 1

    def report(self, window: Window) -> dict[str, Any]:
        inside = [t for t in self.timings if window.measure_from <= t[0] < window.stop_at]
        states = sorted(t[1] for t in inside)
        histories = sorted(t[2] for t in inside)
        return {
            "events": self.events,
            "history_limit": HISTORY_LIMIT,
            "seed_s": round(self.seed_s, 3),
            "state_p50_ms": round(percentile(states, 0.5) * 1000, 3),
            "history_p50_ms": round(percentile(histories, 0.5) * 1000, 3),
        }


async def register_instance(stub: dpb_grpc.DeliveryServiceAsyncStub, gateway: str) -> str:
    """Registers one gateway instance (a lease longer than any measurement); its id."""
    registered = await stub.RegisterInstance(
        dpb.RegisterInstanceRequest(
            gateway_name=gateway,
            host="bench",
            pid=os.getpid(),
            platforms=["slack"],
            lease_ttl=duration_pb2.Duration(seconds=LEASE_TTL_S),
        ),
        timeout=RPC_TIMEOUT_S,
    )
    return registered.instance.instance_id


@dataclass
class Cycle(Workload):
    rpcs_per_op: float = 3
    begin_attempt: bool = False
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    lanes: list[tuple[dpb_grpc.DeliveryServiceAsyncStub, str]] = field(default_factory=list)

    async def prepare(self, channels: Sequence[grpc.aio.Channel], lanes: int) -> None:
        stubs = [dpb_grpc.DeliveryServiceStub(channel) for channel in channels]
        self.carry(channels)
        for lane in range(lanes):
            stub = stubs[lane % len(stubs)]
            self.lanes.append((stub, await register_instance(stub, "bench-gateway")))

    async def op(self, lane: int, i: int) -> int:
        """RecordObligation (content unique per tag, lane, i) -> MarkAttempting ->
        MarkDelivered; with `begin_attempt` the record goes straight to ATTEMPTING."""
        stub, instance_id = self.lanes[lane]
        recorded = await self.write(
            lane,
            stub.RecordObligation,
            dpb.RecordObligationRequest(
                instance_id=instance_id,
                session_key=f"agent:bench:slack:channel:C{lane}",
                message_ref=f"{self.tag}-{i}",
                content=f"bench {lane} {i}",
                platform="slack",
                chat_id=f"C{lane}",
                thread_id="171.001",
                begin_attempt=self.begin_attempt,
                request_id=self.request_id(),
            ),
        )
        row = recorded.obligation
        if not recorded.created:
            raise RuntimeError(f"obligation {row.id} existed already: contents not unique")
        if not self.begin_attempt:
            await self.write(
                lane,
                stub.MarkAttempting,
                dpb.MarkAttemptingRequest(
                    obligation_id=row.id,
                    instance_id=instance_id,
                    fence=row.fence,
                    request_id=self.request_id(),
                ),
            )
        delivered = await self.write(
            lane,
            stub.MarkDelivered,
            dpb.MarkDeliveredRequest(
                obligation_id=row.id,
                instance_id=instance_id,
                fence=row.fence,
                platform_message_id=f"pm-{lane}-{i}",
                request_id=self.request_id(),
            ),
        )
        if delivered.obligation.state != dpb.OBLIGATION_STATE_DELIVERED:
            raise RuntimeError(f"obligation {row.id} is not delivered after MarkDelivered")
        return 1


@dataclass
class Claim(Workload):
    expect: int = 0
    limit: int = 1000
    stub: Any = None
    instance_id: str = ""
    claimed: set[str] = field(default_factory=set)
    calls: int = 0
    duplicates: int = 0
    abandoned: int = 0
    wrong: str = ""

    async def prepare(self, channels: Sequence[grpc.aio.Channel], lanes: int) -> None:
        self.stub = dpb_grpc.DeliveryServiceStub(channels[0])
        # The crashed gateway's next process: only its instances claim its rows.
        self.instance_id = await register_instance(self.stub, CRASHED_GATEWAY)

    async def op(self, lane: int, i: int) -> int:
        request = dpb.ClaimRecoverableRequest(instance_id=self.instance_id, limit=self.limit)
        response = await self.stub.ClaimRecoverable(request, timeout=RPC_TIMEOUT_S * 6)
        self.calls += 1
        self.abandoned += response.abandoned_count
        if not response.obligations:
            raise Exhausted
        for row in response.obligations:
            self.duplicates += row.id in self.claimed
            self.claimed.add(row.id)
            owned = (row.owner_instance_id, row.state)
            if owned != (self.instance_id, dpb.OBLIGATION_STATE_ATTEMPTING) and not self.wrong:
                self.wrong = f"row {row.id} came back {row.state} owned by {row.owner_instance_id}"
        return len(response.obligations)

    def report(self, window: Window) -> dict[str, Any]:
        return {"rows": len(self.claimed), "calls": self.calls, "limit": self.limit}

    def problems(self) -> list[str]:
        found = [
            f"{len(self.claimed):,} rows claimed, {self.expect:,} expected"
            if len(self.claimed) != self.expect
            else "",
            f"{self.duplicates} row(s) claimed twice" if self.duplicates else "",
            f"{self.abandoned} row(s) abandoned" if self.abandoned else "",
            self.wrong,
        ]
        return [text for text in found if text]
