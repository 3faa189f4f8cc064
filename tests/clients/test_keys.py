"""The Python client's offline key builder reproduces the server's rule: every
published vector (protos/testdata/session_keys.json), and a real server's answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from switchboard_client import SessionClient, keys

from switchboard.session.v1 import session_service_pb2 as pb

VECTORS: list[dict[str, Any]] = json.loads(
    (Path(__file__).resolve().parents[2] / "protos/testdata/session_keys.json").read_text()
)["vectors"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_the_client_builds_every_vectors_key(vector: dict[str, Any]) -> None:
    stored = json_format.ParseDict(vector.get("stored_source", vector["source"]), pb.Source())
    policy = json_format.ParseDict(vector["policy"], pb.RoutingPolicy())
    assert keys.routing_key(vector["agent"], stored, policy) == vector["key"]


@pytest.mark.parametrize(
    ("source", "complaint"),
    [
        (pb.Source(transport="telegram", chat_id="1"), "chat_type"),
        (pb.Source(transport="peer", conversation_id="x"), "from_agent"),
        (pb.Source(transport="slack", chat_type=pb.CHAT_TYPE_DM, chat_id=":" * 200), "limit"),
    ],
)
def test_a_source_the_server_would_refuse_is_refused(source: pb.Source, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        keys.routing_key("main", source)


def test_the_client_agrees_with_a_real_server(session_client: SessionClient) -> None:
    ids = {"chat_id": "!room:example.org", "thread_id": "$t:x%", "user_id": "@a:b"}
    session_client.create_agent("main")
    answered = session_client.resolve(
        "main",
        transport="matrix",
        chat_type=pb.CHAT_TYPE_GROUP,
        chat_id=ids["chat_id"],
        thread_id=ids["thread_id"],
        user_id=ids["user_id"],
    ).session
    source = pb.Source(transport="matrix", chat_type=pb.CHAT_TYPE_GROUP, **ids)
    assert keys.routing_key("main", source) == answered.routing_key
