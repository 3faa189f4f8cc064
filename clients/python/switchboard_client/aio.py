"""asyncio clients for the two services, on grpc.aio channels.

`AsyncSessionClient` and `AsyncDeliveryClient` are what an asyncio gateway
(python-telegram-bot, slack_sdk's async client, discord.py) awaits. They share
the call discipline of the blocking clients (`switchboard_client._base`): the
same service configs, per-attempt deadlines, request ids kept across retries,
bearer token and `SwitchboardError`s. Method names, arguments and answers are
those of `SessionClient` and `DeliveryClient`; lists are async iterators.
They cover what a gateway and an agent framework's adapter need; operator calls
stay on the blocking clients. Each method is the blocking one's request builder
(`_session_calls`, `_delivery_calls`), awaited.

Create them inside the running event loop and use them from that loop only.
"""

from __future__ import annotations

from switchboard.delivery.v1 import delivery_service_pb2_grpc as dpb_grpc
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from switchboard_client import _delivery_calls as delivery_calls
from switchboard_client import _session_calls as session_calls
from switchboard_client._base import AsyncBaseClient, awaited, awaited_pages
from switchboard_client.delivery import SERVICE_CONFIG as DELIVERY_SERVICE_CONFIG
from switchboard_client.session import SERVICE_CONFIG as SESSION_SERVICE_CONFIG


class AsyncSessionClient(AsyncBaseClient):
    """The SessionService, awaited: `SessionClient`'s gateway methods."""

    SERVICE_CONFIG = SESSION_SERVICE_CONFIG
    STUB = pb_grpc.SessionServiceStub
    _stub: pb_grpc.SessionServiceAsyncStub

    create_agent = awaited(session_calls.create_agent)
    get_agent = awaited(session_calls.get_agent)
    resolve = awaited(session_calls.resolve)
    get_session = awaited(session_calls.get_session)
    get_session_with_state = awaited(session_calls.get_session_with_state)
    spawn = awaited(session_calls.spawn)
    #: `SessionClient.list_sessions`, as an async iterator.
    iter_sessions = awaited_pages(session_calls.list_sessions)
    reset = awaited(session_calls.reset)
    mark_resumable = awaited(session_calls.mark_resumable)
    list_resumable = awaited(session_calls.list_resumable)
    expire_resumable = awaited(session_calls.expire_resumable)
    append = awaited(session_calls.append)
    post_to_inbox = awaited(session_calls.post_to_inbox)
    post_message = awaited(session_calls.post_message)
    history = awaited(session_calls.history)
    state = awaited(session_calls.state)
    end = awaited(session_calls.end)

    # -- what agent frameworks store ------------------------------------------------------
    retract_messages = awaited(session_calls.retract_messages)
    update_state = awaited(session_calls.update_state)
    user_state = awaited(session_calls.user_state)
    put_records = awaited(session_calls.put_records)
    get_record = awaited(session_calls.get_record)
    list_records = awaited_pages(session_calls.list_records)
    erase_session = awaited(session_calls.erase_session)
    erase_records = awaited(session_calls.erase_records)


class AsyncDeliveryClient(AsyncBaseClient):
    """The DeliveryService, awaited: `DeliveryClient`'s gateway methods."""

    SERVICE_CONFIG = DELIVERY_SERVICE_CONFIG
    STUB = dpb_grpc.DeliveryServiceStub
    _stub: dpb_grpc.DeliveryServiceAsyncStub

    register = awaited(delivery_calls.register)
    heartbeat = awaited(delivery_calls.heartbeat)
    deregister = awaited(delivery_calls.deregister)
    instance = awaited(delivery_calls.instance)
    record = awaited(delivery_calls.record)
    record_best_effort = awaited(delivery_calls.record_best_effort)
    mark_attempting = awaited(delivery_calls.mark_attempting)
    mark_delivered = awaited(delivery_calls.mark_delivered)
    mark_failed = awaited(delivery_calls.mark_failed)
    claim_recoverable = awaited(delivery_calls.claim_recoverable)
    get = awaited(delivery_calls.get)
    list = awaited_pages(delivery_calls.list_obligations)


__all__ = ["AsyncDeliveryClient", "AsyncSessionClient"]
