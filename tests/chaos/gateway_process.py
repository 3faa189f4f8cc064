"""A gateway process for the chaos tests: it handles COUNT messages, one after the
other, until the test SIGKILLs it at a random moment.

python -m tests.chaos.gateway_process SESSION DELIVERY SENDS_FILE TAG COUNT SEED

Its loopback platform appends every send to SENDS_FILE as one JSON line, in a
single write(2), at the instant the message reaches the "platform" (before the
platform's answer travels back): whatever moment the kill hits, the file says
exactly which messages went out. It prints "ready INSTANCE_ID" once the
gateway has started, and "done" if it handled every message without being killed.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

from switchboard_client import DeliveryClient, SessionClient
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
        self._count += 1
        message_id = f"pm-{os.getpid()}-{self._count}"
        line = json.dumps({"key": idempotency_key, "text": text, "chat_id": chat_id}) + "\n"
        os.write(self._fd, line.encode())  # the message has reached the platform
        # The platform's answer on its way back: the window between send and mark.
        time.sleep(self._rng.uniform(0.0, 0.015))
        return message_id


def answer(turn: Turn) -> str:
    """The agent answers the newest user message: the inbox's, else the history's (a
    resumed turn whose inbox was drained already)."""
    if turn.state.state.inbox:
        return f"answer to {turn.state.state.inbox[-1].message.content}"
    asked = [q.message.content for q in turn.history if q.message.role == pb.ROLE_USER]
    return f"answer to {asked[-1] if asked else '(nothing)'}"


def main(
    session_address: str, delivery_address: str, sends: str, tag: str, count: int, seed: int
) -> None:
    gateway = Gateway(
        "chaos-gateway",  # one bot's processes: only they claim its rows
        "main",
        SessionClient(session_address),
        DeliveryClient(delivery_address),
        [RecordingPlatform(sends, random.Random(seed))],
        answer,
        heartbeat_s=0.2,
        claim_every_s=3600,  # only the test's rescuer claims
    )
    gateway.start()
    print(f"ready {gateway.instance_id}", flush=True)
    for i in range(count):
        source = pb.Source(
            transport="loopback",
            chat_type=pb.CHAT_TYPE_DM,
            chat_id=f"{tag}-c{i % CHATS}",
            user_id="u1",
        )
        gateway.handle(Inbound(source=source, text=f"q {tag} {i}", message_ref=f"{tag}-m{i}"))
    gateway.stop()
    print("done", flush=True)


if __name__ == "__main__":
    session, delivery, sends_file, run_tag, messages, run_seed = sys.argv[1:7]
    main(session, delivery, sends_file, run_tag, int(messages), int(run_seed))
