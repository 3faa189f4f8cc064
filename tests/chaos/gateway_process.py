"""A gateway process for the chaos tests: it handles COUNT messages, one after the
other, until the test SIGKILLs it at a random moment.

python -m tests.chaos.gateway_process SESSION DELIVERY SENDS_FILE TAG COUNT SEED [--async]

Its loopback platform appends every send to SENDS_FILE as one JSON line, in a
single write(2), at the instant the message reaches the "platform" (before the
platform's answer travels back): whatever moment the kill hits, the file says
exactly which messages went out. It prints "ready INSTANCE_ID" once the
gateway has started, and "done" if it handled every message without being killed.
With --async the gateway is an `AsyncGateway` (grpc.aio clients) and the platform's
send is a coroutine that yields to the loop where a real one would wait.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time

from switchboard_client import DeliveryClient, SessionClient
from switchboard_client.aio import AsyncDeliveryClient, AsyncSessionClient
from switchboard_client.async_gateway import AsyncGateway
from switchboard_client.gateway import Gateway, Inbound, Turn
from switchboard_client.loopback import LoopbackPlatform

from switchboard.session.v1 import session_service_pb2 as pb

CHATS = 3


class RecordingPlatform(LoopbackPlatform):
    """A loopback platform whose sends survive the process: one line per send in a file."""

    def __init__(self, path: str, rng: random.Random) -> None:
        super().__init__()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._rng = rng
        self._count = 0

    def send(self, chat_id: str, thread_id: str, text: str, idempotency_key: str) -> str:
        time.sleep(self._rng.uniform(0.0, 0.005))  # on its way to the platform
        message_id = self._arrive(chat_id, text, idempotency_key)
        # The platform's answer on its way back: the window between send and mark.
        time.sleep(self._rng.uniform(0.0, 0.015))
        return message_id

    def _arrive(self, chat_id: str, text: str, idempotency_key: str) -> str:
        self._count += 1
        line = json.dumps({"key": idempotency_key, "text": text, "chat_id": chat_id}) + "\n"
        os.write(self._fd, line.encode())  # the message has reached the platform
        return f"pm-{os.getpid()}-{self._count}"


class AsyncRecordingPlatform:
    """The same platform, awaited: the waits are the event loop's."""

    name = "loopback"

    def __init__(self, path: str, rng: random.Random) -> None:
        self._platform = RecordingPlatform(path, rng)
        self._rng = rng

    async def connect(self) -> None:
        self._platform.connect()

    async def send(self, chat_id: str, thread_id: str, text: str, idempotency_key: str) -> str:
        await asyncio.sleep(self._rng.uniform(0.0, 0.005))
        message_id = self._platform._arrive(chat_id, text, idempotency_key)
        await asyncio.sleep(self._rng.uniform(0.0, 0.015))
        return message_id


def answer(turn: Turn) -> str:
    """The agent answers the newest user message: the inbox's, else the history's (a
    resumed turn whose inbox was drained already)."""
    if turn.state.state.inbox:
        return f"answer to {turn.state.state.inbox[-1].message.content}"
    asked = [q.message.content for q in turn.history if q.message.role == pb.ROLE_USER]
    return f"answer to {asked[-1] if asked else '(nothing)'}"


def _inbound(tag: str, i: int) -> Inbound:
    source = pb.Source(
        transport="loopback",
        chat_type=pb.CHAT_TYPE_DM,
        chat_id=f"{tag}-c{i % CHATS}",
        user_id="u1",
    )
    return Inbound(source=source, text=f"q {tag} {i}", message_ref=f"{tag}-m{i}")


#: One bot's processes: only they claim its rows. Only the test's rescuer claims.
HEARTBEAT_S, CLAIM_EVERY_S = 0.2, 3600.0
NAME = "chaos-gateway"


def main(
    session_address: str, delivery_address: str, sends: str, tag: str, count: int, seed: int
) -> None:
    gateway = Gateway(
        NAME,
        "main",
        SessionClient(session_address),
        DeliveryClient(delivery_address),
        [RecordingPlatform(sends, random.Random(seed))],
        answer,
        heartbeat_s=HEARTBEAT_S,
        claim_every_s=CLAIM_EVERY_S,
    )
    gateway.start()
    print(f"ready {gateway.instance_id}", flush=True)
    for i in range(count):
        gateway.handle(_inbound(tag, i))
    gateway.stop()
    print("done", flush=True)


async def main_async(
    session_address: str, delivery_address: str, sends: str, tag: str, count: int, seed: int
) -> None:
    async def agent(turn: Turn) -> str:
        return answer(turn)

    async with (
        AsyncSessionClient(session_address) as sessions,
        AsyncDeliveryClient(delivery_address) as ledger,
    ):
        platform = AsyncRecordingPlatform(sends, random.Random(seed))
        gateway = AsyncGateway(
            NAME,
            "main",
            sessions,
            ledger,
            [platform],
            agent,
            heartbeat_s=HEARTBEAT_S,
            claim_every_s=CLAIM_EVERY_S,
        )
        await gateway.start()
        print(f"ready {gateway.instance_id}", flush=True)
        for i in range(count):
            await gateway.handle(_inbound(tag, i))
        await gateway.stop()
    print("done", flush=True)


if __name__ == "__main__":
    session, delivery, sends_file, run_tag, messages, run_seed = sys.argv[1:7]
    arguments = (session, delivery, sends_file, run_tag, int(messages), int(run_seed))
    if "--async" in sys.argv[7:]:
        asyncio.run(main_async(*arguments))
    else:
        main(*arguments)
