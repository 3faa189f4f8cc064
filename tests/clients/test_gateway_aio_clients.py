"""The asyncio clients the async gateway runs on keep the blocking clients' call
discipline (shared in switchboard_client._base): errors with their reasons, the
bearer token, and a write whose answer was lost retried with the same request id
and a fresh deadline per attempt, written once. Real servers, a real TCP proxy."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import ExitStack

import grpc
import pytest
from switchboard_client import SwitchboardError
from switchboard_client.aio import AsyncDeliveryClient, AsyncSessionClient

from switchboard.auth import parse_tokens
from tests.clients.test_lost_answers import HANDSHAKE_BYTES, _ledger
from tests.harness import EventLoopThread, delivery_server, session_server
from tests.tcp_proxy import Link, TcpProxy


def test_async_errors_carry_code_reason_and_fields(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    with delivery_server(loop_thread, database_url) as delivery:

        async def run() -> list[SwitchboardError]:
            errors = []
            async with AsyncDeliveryClient(delivery.address) as ledger:
                for obligation_id in ("0" * 24, "not an id"):
                    try:
                        await ledger.get(obligation_id)
                    except SwitchboardError as error:
                        errors.append(error)
            return errors

        missing, malformed = asyncio.run(run())
    assert (missing.code, missing.reason) == (grpc.StatusCode.NOT_FOUND, "OBLIGATION_NOT_FOUND")
    assert malformed.code == grpc.StatusCode.INVALID_ARGUMENT
    assert malformed.field_violations == ["obligation_id"]


def test_async_clients_send_the_bearer_token(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    grants = parse_tokens("root=admin")
    with session_server(loop_thread, database_url, auth=grants) as session:

        async def create(token: str | None) -> str:
            async with AsyncSessionClient(session.address, token=token) as sessions:
                return (await sessions.create_agent("main")).name

        with pytest.raises(SwitchboardError) as refused:
            asyncio.run(create(None))
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert asyncio.run(create("root")) == "main"


def test_an_async_answer_held_past_the_deadline_is_retried_with_a_fresh_deadline(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    """As tests/clients/test_lost_answers.py's test of the blocking client."""
    with ExitStack() as stack:
        delivery = stack.enter_context(delivery_server(loop_thread, database_url))
        host, port = delivery.address.rsplit(":", 1)
        proxy = stack.enter_context(TcpProxy((host, int(port))))
        held = threading.Event()

        def hold_one_answer(link: Link, chunk: bytes) -> bool:
            if link.sent_by_client <= HANDSHAKE_BYTES or held.is_set():
                return True
            held.set()
            time.sleep(1.5)  # past the attempt's 1 s deadline, then the link drops
            return False

        async def record(attempts: int) -> bool:
            async with AsyncDeliveryClient(delivery.address) as direct:
                instance = (await direct.register("gw", ["slack"])).instance_id
            held.clear()
            proxy.on_reply = hold_one_answer
            try:
                async with AsyncDeliveryClient(
                    proxy.address, timeout_s=1.0, mutation_attempts=attempts
                ) as client:
                    answer = await client.record(
                        instance,
                        session_key="held",
                        content=f"held-{attempts}",
                        platform="slack",
                        chat_id="C1",
                    )
                    return answer.created
            finally:
                proxy.on_reply = None

        with pytest.raises(SwitchboardError) as once:
            asyncio.run(record(1))
        assert once.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
        assert asyncio.run(record(3)), "retried with the first attempt's request id"
        contents, _, _ = _ledger(delivery)
        assert contents["held-1"] == 1  # the first attempt ran though its answer was lost
        assert contents["held-3"] == 1  # retried, written once
