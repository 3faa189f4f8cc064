"""Real calls through whichever `switchboard_client` the running interpreter has.

Run as a script by an installed venv's python (never imported by the suite):

    python client_calls.py SESSION_ADDRESS DELIVERY_ADDRESS TAG

Either address may be "-" to skip that service; $SWITCHBOARD_TOKEN, when set, is the
bearer token. Creates agent `agent-TAG`, resolves
a session, appends a message and reads it back; registers a gateway instance,
records a reply, deregisters, and claims the reply from a second instance. Prints
one JSON object: what it did, and the file every Switchboard module came from.
"""

from __future__ import annotations

import json
import os
import sys

from switchboard_client import DeliveryClient, SessionClient

from switchboard.session.v1 import session_service_pb2 as pb


def session_calls(address: str, tag: str, token: str | None = None) -> dict[str, object]:
    agent = f"agent-{tag}"
    with SessionClient(address, token=token) as sessions:
        sessions.create_agent(agent)
        session = sessions.resolve(agent, transport="web", conversation_id=f"chat-{tag}").session
        sessions.append_message(agent, session.session_id, pb.ROLE_USER, f"hello {tag}")
        history = sessions.history(agent, session.session_id)
        return {
            "agent": sessions.get_agent(agent).name,
            "session_id": session.session_id,
            "history": [message.message.content for message in history],
        }


def delivery_calls(address: str, tag: str, token: str | None = None) -> dict[str, object]:
    with DeliveryClient(address, token=token) as ledger:
        first = ledger.register(f"gateway-{tag}", ["web"]).instance_id
        recorded = ledger.record(
            first, session_key=f"key-{tag}", content=f"reply {tag}", platform="web",
            chat_id=f"chat-{tag}",
        ).obligation  # fmt: skip
        ledger.deregister(first)
        second = ledger.register(f"gateway-{tag}", ["web"]).instance_id
        claimed = ledger.claim_recoverable(second, deliverable_platforms=["web"]).obligations
        return {"recorded": recorded.id, "claimed": [row.id for row in claimed]}


def module_files() -> dict[str, str]:
    prefixes = ("switchboard", "session_service", "delivery_service")
    return {
        name: str(getattr(module, "__file__", None))
        for name, module in sorted(sys.modules.items())
        if name.split(".")[0] in prefixes or name.startswith("switchboard_client")
    }


def main(session_address: str, delivery_address: str, tag: str) -> None:
    result: dict[str, object] = {}
    token = os.environ.get("SWITCHBOARD_TOKEN") or None
    if session_address != "-":
        result["session"] = session_calls(session_address, tag, token)
    if delivery_address != "-":
        result["delivery"] = delivery_calls(delivery_address, tag, token)
    result["modules"] = module_files()
    print(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:4])
