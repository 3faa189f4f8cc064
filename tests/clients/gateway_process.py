"""A gateway process for the crash tests: it takes one message and dies mid-send.

python -m tests.clients.gateway_process SESSION_ADDRESS DELIVERY_ADDRESS
"""

from __future__ import annotations

import sys

from switchboard_client import DeliveryClient, SessionClient
from switchboard_client.gateway import Gateway, Inbound
from switchboard_client.loopback import LoopbackPlatform

from switchboard.session.v1 import session_service_pb2 as pb


def main(session_address: str, delivery_address: str, idempotent: bool) -> None:
    gateway = Gateway(
        "test-gateway",  # the bot the test restarts: only its instances claim its rows
        "main",
        SessionClient(session_address),
        DeliveryClient(delivery_address),
        [LoopbackPlatform(mode="die", idempotent_sends=idempotent)],
        lambda turn: f"answer to {turn.state.state.inbox[-1].message.content}",
    )
    gateway.start()
    source = pb.Source(
        transport="loopback", chat_type=pb.CHAT_TYPE_DM, chat_id="chat-1", user_id="u1"
    )
    gateway.handle(Inbound(source=source, text="what is 6 x 7?", message_ref="m-1"))
    raise SystemExit("the loopback platform should have killed this process")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], idempotent="--idempotent" in sys.argv[3:])
