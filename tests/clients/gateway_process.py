"""A gateway process for the crash tests: it takes one message and dies mid-send.

python -m tests.clients.gateway_process SESSION_ADDRESS DELIVERY_ADDRESS [--idempotent] [--async]
    [--die-in-agent]

With --async it is an `AsyncGateway` on grpc.aio clients with an async platform.
With --die-in-agent it dies while its agent thinks instead: the message is posted and
marked, nothing is answered or recorded.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from switchboard_client import DeliveryClient, SessionClient
from switchboard_client.aio import AsyncDeliveryClient, AsyncSessionClient
from switchboard_client.async_gateway import AsyncGateway
from switchboard_client.gateway import Gateway, Inbound, Turn
from switchboard_client.loopback import AsyncLoopbackPlatform, LoopbackPlatform

from switchboard.session.v1 import session_service_pb2 as pb

SOURCE = pb.Source(transport="loopback", chat_type=pb.CHAT_TYPE_DM, chat_id="chat-1", user_id="u1")
INBOUND = Inbound(source=SOURCE, text="what is 6 x 7?", message_ref="m-1")
#: The bot the test restarts: only its instances claim its rows.
NAME = "test-gateway"


def answer(turn: Turn) -> str:
    if "--die-in-agent" in sys.argv:
        os.kill(os.getpid(), signal.SIGKILL)
    return f"answer to {turn.state.state.inbox[-1].message.content}"


def main(session_address: str, delivery_address: str, idempotent: bool) -> None:
    gateway = Gateway(
        NAME,
        "main",
        SessionClient(session_address),
        DeliveryClient(delivery_address),
        [LoopbackPlatform(mode="die", idempotent_sends=idempotent)],
        answer,
    )
    gateway.start()
    gateway.handle(INBOUND)
    raise SystemExit("the loopback platform should have killed this process")


async def main_async(session_address: str, delivery_address: str, idempotent: bool) -> None:
    platform = AsyncLoopbackPlatform(LoopbackPlatform(mode="die", idempotent_sends=idempotent))

    async def agent(turn: Turn) -> str:
        return answer(turn)

    async with (
        AsyncSessionClient(session_address) as sessions,
        AsyncDeliveryClient(delivery_address) as ledger,
    ):
        gateway = AsyncGateway(NAME, "main", sessions, ledger, [platform], agent)
        await gateway.start()
        await gateway.handle(INBOUND)
    raise SystemExit("the loopback platform should have killed this process")


if __name__ == "__main__":
    flags = sys.argv[3:]
    if "--async" in flags:
        asyncio.run(main_async(sys.argv[1], sys.argv[2], idempotent="--idempotent" in flags))
    else:
        main(sys.argv[1], sys.argv[2], idempotent="--idempotent" in flags)
