"""Request bodies gRPC cannot decode, sent over a raw HTTP/2 connection (grpc's own
client refuses to): invalid UTF-8 in a string field, a truncated body, 5,000 nested
groups, and a length prefix longer than the body (the call then ends before a whole
message arrived, which gRPC alone never answers at all).

Each is the caller's error: INVALID_ARGUMENT with reason MALFORMED_REQUEST and a
message naming the request type, one access line per call, and at most one warning
line per period for all of them (the next one counting those held back), no traceback;
for unary and streaming methods of both services, on both backends.
"""

from __future__ import annotations

import base64
import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
from google.rpc import error_details_pb2, status_pb2

from switchboard import grpc_errors
from switchboard.log_budget import LogBudget
from tests.harness import EventLoopThread, delivery_server, session_server
from tests.held_locks import SERVICES, wait_for
from tests.raw_h2 import RawAnswer, RawConnection, grpc_frame

#: Per service: methods with one request (unary and streaming answers), the request
#: type, and the field number of a string field in it.
METHODS: dict[str, dict[str, tuple[str, int]]] = {
    "session": {
        "/switchboard.session.v1.SessionService/GetAgent": (
            "switchboard.session.v1.GetAgentRequest",
            1,
        ),
        "/switchboard.session.v1.SessionService/WatchEvents": (
            "switchboard.session.v1.WatchEventsRequest",
            2,
        ),
    },
    "delivery": {
        "/switchboard.delivery.v1.DeliveryService/GetObligation": (
            "switchboard.delivery.v1.GetObligationRequest",
            1,
        ),
        # The DeliveryService streams nothing; the health watch beside it does.
        "/grpc.health.v1.Health/Watch": ("grpc.health.v1.HealthCheckRequest", 1),
    },
}


def malformed_bodies(string_field: int) -> dict[str, tuple[bytes, str]]:
    """Each malformed body (a whole gRPC frame) and what the answer must say."""
    tag = bytes([string_field << 3 | 2])  # a length-delimited field
    valid = tag + b"\x02ab"
    return {
        "invalid UTF-8": (grpc_frame(tag + b"\x02\xff\xfe"), "is not a valid"),
        "a truncated body": (grpc_frame(tag + b"\x05ab"), "is not a valid"),
        # Field 15 as a group, opened 5,000 times and closed as often.
        "5,000 nested groups": (grpc_frame(b"\x7b" * 5000 + b"\x7c" * 5000), "is not a valid"),
        "a length prefix past the body": (
            grpc_frame(valid, announced=len(valid) + 100),
            "ended before a whole",
        ),
    }


def server(
    loop: EventLoopThread, service: str, url: str, **settings: Any
) -> AbstractContextManager[Any]:
    serve = session_server if service == "session" else delivery_server
    return serve(loop, url, **settings)


def raw_call(address: str, method: str, frame: bytes) -> RawAnswer:
    with RawConnection(address) as connection:
        return connection.wait_for_answer(connection.start_call(method, [], frame))


def reason_of(answer: RawAnswer) -> str:
    encoded = answer.details + b"=" * (-len(answer.details) % 4)
    status = status_pb2.Status.FromString(base64.b64decode(encoded))
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return str(info.reason)
    return ""


@pytest.fixture
def log_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """The clock of the warning lines' budget, which the test moves on by hand."""
    now = [0.0]
    budget = LogBudget(lines=1, period_s=10.0, clock=lambda: now[0])
    monkeypatch.setattr(grpc_errors, "_MALFORMED_LINES", budget)
    yield now


@pytest.mark.parametrize("service", SERVICES)
def test_undecodable_requests_are_invalid_argument_with_one_line_each_and_no_traceback(
    loop_thread: EventLoopThread,
    database_url: str,
    service: str,
    caplog: pytest.LogCaptureFixture,
    log_clock: list[float],
) -> None:
    answers: dict[tuple[str, str], tuple[RawAnswer, str]] = {}
    made: Counter[str] = Counter()
    with caplog.at_level(logging.INFO), server(loop_thread, service, database_url) as served:
        for method, (type_name, string_field) in METHODS[service].items():
            for case, (frame, said) in malformed_bodies(string_field).items():
                answers[(method, case)] = (
                    raw_call(served.address, method, frame),
                    f"{said} {type_name}",
                )
                made[method] += 1
        log_clock[0] = 10.0  # the next period: one more line, counting the held ones
        method, (_type_name, field) = next(iter(METHODS[service].items()))
        raw_call(served.address, method, malformed_bodies(field)["invalid UTF-8"][0])
        made[method] += 1

        def access_lines() -> Counter[tuple[str, str]]:
            records: Any = [r for r in caplog.records if r.name == "switchboard.access"]
            return Counter((r.method, r.status) for r in records)

        wait_for(lambda: access_lines().total() >= made.total(), "an access line per call")
    for (method, case), (answer, said) in answers.items():
        assert answer.status == 3, (method, case, answer)  # INVALID_ARGUMENT
        assert said in answer.message.decode(), (method, case, answer.message)
        assert reason_of(answer) == "MALFORMED_REQUEST", (method, case)
    assert access_lines() == {(method, "INVALID_ARGUMENT"): n for method, n in made.items()}
    warnings = [r.getMessage() for r in caplog.records if r.name == "switchboard.grpc_errors"]
    assert len(warnings) == 2, warnings
    assert f"({made.total() - 2} more since, not logged)" in warnings[1], warnings
    assert not [r for r in caplog.records if r.exc_info or r.exc_text], "a traceback was logged"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "an error was logged"


@pytest.mark.parametrize("service", SERVICES)
def test_an_undecodable_request_counted_against_the_call_limit_is_invalid_argument(
    loop_thread: EventLoopThread, database_url: str, service: str, log_clock: list[float]
) -> None:
    """--max-concurrent-rpcs reads an admitted call's request itself: the same answer,
    and the call's slot is given back (the limit of one admits the next call)."""
    method, (_type_name, field) = next(iter(METHODS[service].items()))
    with server(loop_thread, service, database_url, max_concurrent_rpcs=1) as served:
        for case, (frame, said) in malformed_bodies(field).items():
            answer = raw_call(served.address, method, frame)
            assert answer.status == 3 and said in answer.message.decode(), (case, answer)
            assert reason_of(answer) == "MALFORMED_REQUEST", case
