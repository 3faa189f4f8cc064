"""Before authentication: malformed credentials, refusing before the request is read,
brief and rate-limited refusal logs, and gRPC's own limits on connections, streams and
flow-control windows.

Every call goes to a real server over TCP: through grpc's client where it can send the
credential, through a raw HTTP/2 connection (tests/raw_h2.py) where grpc refuses to.
Memory was measured by a benchmark (docs/performance.md, "memory before authentication"),
not here (it cannot be held to a bound without flaking); these tests hold the behaviour
that bounds it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import CollectorRegistry, generate_latest

from switchboard.auth import LOG_LINES, LogBudget, check_sendable, parse_tokens
from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.observability import RpcMetrics
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from switchboard_cli.main import main
from tests.harness import EventLoopThread, InProcessSession, delivery_server, session_server
from tests.raw_h2 import MAX_CONCURRENT_STREAMS, RawConnection, call, grpc_frame
from tests.status import error_reason

ADMIN, MAIN_ONLY = "admin-token", "main-token"
GRANTS = parse_tokens(f"{ADMIN}=admin;{MAIN_ONLY}=agents:main")
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED.value[0]
SESSION = "/switchboard.session.v1.SessionService"
LIST_AGENTS = f"{SESSION}/ListAgents"
INITIAL_WINDOW_SIZE = 4  # the HTTP/2 SETTINGS code


@pytest.fixture
def secured(tmp_path: Path, loop_thread: EventLoopThread) -> Iterator[InProcessSession]:
    url = f"sqlite:///{tmp_path / 's.sqlite3'}"
    with session_server(loop_thread, url, auth=GRANTS) as service:
        yield service


def _bearer(token: str) -> tuple[str, str]:
    return ("authorization", f"Bearer {token}")


Metadata = tuple[tuple[str, str | bytes], ...]
#: Credentials grpc's client sends as they are, and what the refusal must say.
SENDABLE: dict[str, tuple[Metadata, str]] = {
    "none": ((), "no credentials"),
    "unknown token": ((_bearer("wrong-token"),), "unknown token"),
    "no scheme": ((("authorization", ADMIN),), "not a Bearer credential"),
    "another scheme": ((("authorization", f"Basic {ADMIN}"),), "not a Bearer credential"),
    "empty header": ((("authorization", ""),), "not a Bearer credential"),
    "scheme only": ((("authorization", "Bearer"),), "malformed token"),
    "empty token": ((("authorization", "Bearer    "),), "malformed token"),
    "two headers": ((_bearer(ADMIN), _bearer(ADMIN)), "2 authorization headers"),
    "binary": ((("authorization-bin", b"\xff\x00\x01"),), "authorization-bin"),
    "binary beside a valid one": (
        (_bearer(ADMIN), ("authorization-bin", ADMIN.encode())),
        "authorization-bin",
    ),
    "overlong": ((_bearer("a" * 5000),), "malformed token"),
}


@pytest.mark.parametrize("case", SENDABLE)
def test_malformed_credentials_are_unauthenticated(secured: InProcessSession, case: str) -> None:
    metadata, says = SENDABLE[case]
    with pytest.raises(grpc.RpcError) as refused:
        secured.stub.ListAgents(pb.ListAgentsRequest(), metadata=metadata, timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value
    assert error_reason(refused.value) == "UNAUTHENTICATED"
    assert says in str(refused.value.details())
    assert "authorization: Bearer <token>" in str(refused.value.details())


#: Header values grpc's client refuses to send (it checks them); a raw HTTP/2 client can.
UNSENDABLE = {
    "UTF-8 beyond ASCII": "Bearer admin-tökén".encode(),
    "Latin-1 (not UTF-8)": b"Bearer admin-t\xf6ken",
    "binary bytes": b"Bearer \xff\xfe\xfd\x80",
    "NUL inside": b"Bearer admin\x00-token",
    "NUL after a valid token": b"Bearer admin-token\x00",
    "control character": b"Bearer admin\x01token",
    "DEL": b"Bearer admin-token\x7f",
    "tab for the space": b"Bearer\tadmin-token",
}


@pytest.mark.parametrize("case", UNSENDABLE)
def test_credentials_grpc_cannot_send_are_unauthenticated_too(
    secured: InProcessSession, case: str
) -> None:
    answer = call(secured.address, LIST_AGENTS, [(b"authorization", UNSENDABLE[case])])
    assert answer.status == UNAUTHENTICATED, answer
    assert b"authorization: Bearer <token>" in answer.message


def test_valid_tokens_pass_in_either_case_and_with_spaces(secured: InProcessSession) -> None:
    for header in (f"Bearer {ADMIN}", f"bearer {ADMIN}", f"BEARER   {ADMIN}  "):
        secured.stub.ListAgents(pb.ListAgentsRequest(), metadata=(("authorization", header),))


@pytest.mark.parametrize(
    ("method", "request_bytes"),
    [
        ("PostToInbox", pb.PostToInboxRequest(agent="main").SerializeToString()),
        ("WatchEvents", pb.WatchEventsRequest(agent="main").SerializeToString()),
    ],
    ids=["unary", "server-streaming"],
)
def test_an_unauthenticated_call_is_refused_before_its_request_arrives(
    secured: InProcessSession, method: str, request_bytes: bytes
) -> None:
    """The request announces 4 MiB and only its first bytes are sent: the refusal comes
    without waiting for the rest (a server that read the request first never answers)."""
    with RawConnection(secured.address) as connection:
        stream = connection.start_call(
            f"{SESSION}/{method}",
            [(b"authorization", b"Bearer wrong-token")],
            grpc_frame(request_bytes + b"x" * 1000, announced=4 * 1024 * 1024),
            end=False,
        )
        answer = connection.wait_for_answer(stream)
    assert answer.status == UNAUTHENTICATED, answer


def test_an_unauthenticated_delivery_call_is_refused_before_its_request_arrives(
    tmp_path: Path, loop_thread: EventLoopThread
) -> None:
    url = f"sqlite:///{tmp_path / 'd.sqlite3'}"
    record = dpb.RecordObligationRequest(session_key="agent:main:web:x", content="x" * 1000)
    with (
        delivery_server(loop_thread, url, auth=GRANTS) as delivery,
        RawConnection(delivery.address) as connection,
    ):
        stream = connection.start_call(
            "/switchboard.delivery.v1.DeliveryService/RecordObligation",
            [],
            grpc_frame(record.SerializeToString(), announced=4 * 1024 * 1024),
            end=False,
        )
        assert connection.wait_for_answer(stream).status == UNAUTHENTICATED


def test_scope_checks_still_run_on_the_request(secured: InProcessSession) -> None:
    """Authenticated calls still reach the checks that need the request."""
    with pytest.raises(grpc.RpcError) as refused:
        secured.stub.GetAgent(pb.GetAgentRequest(name="other"), metadata=(_bearer(MAIN_ONLY),))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert error_reason(refused.value) == "AGENT_SCOPE"


def test_reflection_needs_no_token(secured: InProcessSession) -> None:
    reflection = reflection_pb2_grpc.ServerReflectionStub(secured.channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    answer = next(reflection.ServerReflectionInfo(iter([request]), timeout=10))
    names = [service.name for service in answer.list_services_response.service]
    assert "switchboard.session.v1.SessionService" in names


def test_refusals_are_logged_in_one_short_line_each_and_rate_limited(
    secured: InProcessSession, caplog: pytest.LogCaptureFixture
) -> None:
    """A flood of bad credentials cannot flood the log: no traceback, nothing at ERROR,
    no token in it, one line per refusal at most and at most LOG_LINES per period."""
    secret = "wrong-but-secret-token"
    refusals = 60
    with caplog.at_level(logging.DEBUG):
        for index in range(refusals // 2):
            with pytest.raises(grpc.RpcError):
                secured.stub.ListAgents(pb.ListAgentsRequest(), metadata=(_bearer(secret),))
            bad = [b"Bearer \xf6" + secret.encode(), b"Bearer " + secret.encode() + b"\x00"]
            call(secured.address, LIST_AGENTS, [(b"authorization", bad[index % 2])])
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert records, "refusals are logged"
    assert all(r.exc_info is None and r.levelno < logging.ERROR for r in records), records
    lines = [r.getMessage() for r in records]
    assert all("\n" not in line and len(line) < 300 for line in lines), lines
    assert not any(secret in line for line in lines), lines
    refused_lines = [r for r in records if r.name == "switchboard.auth"]
    # One period's budget; two if the calls spanned a period boundary.
    assert len(refused_lines) <= 2 * LOG_LINES < refusals, lines


def test_the_log_budget_holds_back_lines_and_counts_them() -> None:
    now = [0.0]
    budget = LogBudget(lines=2, period_s=10.0, clock=lambda: now[0])
    assert [budget.take(), budget.take(), budget.take(), budget.take()] == [0, 0, None, None]
    now[0] = 9.9
    assert budget.take() is None
    now[0] = 10.0
    assert budget.take() == 3, "the next line that passes tells how many were held back"
    assert budget.take() == 0
    assert budget.take() is None


def test_refused_calls_are_counted_but_not_access_logged(
    tmp_path: Path, loop_thread: EventLoopThread, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    url = f"sqlite:///{tmp_path / 's.sqlite3'}"
    counted = f'switchboard_rpc_total{{code="UNAUTHENTICATED",method="{LIST_AGENTS}"}} 3.0'
    with (
        caplog.at_level(logging.INFO, logger="switchboard.access"),
        session_server(loop_thread, url, auth=GRANTS, metrics=RpcMetrics(registry)) as service,
    ):
        for _ in range(3):
            with pytest.raises(grpc.RpcError):
                service.stub.ListAgents(pb.ListAgentsRequest(), metadata=(_bearer("nope"),))
        service.stub.ListAgents(pb.ListAgentsRequest(), metadata=(_bearer(ADMIN),))
        # The server observes a call after its status went out: wait for it.
        deadline = time.monotonic() + 10
        while counted not in (exposed := generate_latest(registry).decode()):
            assert time.monotonic() < deadline, exposed
            time.sleep(0.01)
        ok = f'switchboard_rpc_total{{code="OK",method="{LIST_AGENTS}"}} 1.0'
        while ok not in generate_latest(registry).decode():
            assert time.monotonic() < deadline
            time.sleep(0.01)
    statuses = [getattr(r, "status", "") for r in caplog.records if r.name == "switchboard.access"]
    assert statuses == ["OK"]


def test_grpc_is_given_the_connection_stream_and_window_limits(
    tmp_path: Path, loop_thread: EventLoopThread, secured: InProcessSession
) -> None:
    with RawConnection(secured.address) as defaults:
        settings = defaults.wait_for_settings()
    assert settings[MAX_CONCURRENT_STREAMS] == 1000
    assert settings[INITIAL_WINDOW_SIZE] == 64 * 1024, "not gRPC's probed 4 MiB"

    url = f"sqlite:///{tmp_path / 'limited.sqlite3'}"
    limits: dict[str, Any] = {
        "max_connections": 2,
        "max_streams_per_connection": 7,
        "http2_window_bytes": 32768,
    }
    with (
        session_server(loop_thread, url, auth=GRANTS, **limits) as limited,
        RawConnection(limited.address) as first,
        RawConnection(limited.address) as second,
    ):
        settings = first.wait_for_settings()
        assert (settings[MAX_CONCURRENT_STREAMS], settings[INITIAL_WINDOW_SIZE]) == (7, 32768)
        second.wait_for_settings()
        with RawConnection(limited.address) as third, pytest.raises(OSError):
            third.wait_for_settings()  # closed as accepted: two are held


def test_tokens_no_client_could_send_are_refused_at_start() -> None:
    for spec in ("ok=admin;tök=admin", "ok=admin;t k=admin", f"{'a' * 5000}=admin"):
        with pytest.raises(ValueError, match=r"auth token \d") as refused:
            check_sendable(parse_tokens(spec))
        assert "tök" not in str(refused.value) and "t k" not in str(refused.value)
    check_sendable(parse_tokens(f"{ADMIN}=admin;{MAIN_ONLY}=agents:main"))
    result = CliRunner().invoke(main, ["serve", "--auth-tokens", "tök=admin"])
    assert result.exit_code == 2 and "auth token 1: a token is visible ASCII" in result.output


def test_serve_lists_the_limit_flags() -> None:
    shown = CliRunner().invoke(main, ["serve", "--help"]).output
    for flag in (
        "--max-connections",
        "--max-streams-per-connection",
        "--http2-window-bytes",
        "--max-message-bytes",
        "--max-concurrent-rpcs",
    ):
        assert flag in shown


def test_a_refused_stream_ends_unauthenticated_with_its_reason(secured: InProcessSession) -> None:
    """A refused server-streaming call ends with UNAUTHENTICATED, as a unary one does."""
    watching = pb_grpc.SessionServiceStub(secured.channel).WatchEvents(
        pb.WatchEventsRequest(agent="main"), metadata=(_bearer("nope"),), timeout=10
    )
    with pytest.raises(grpc.RpcError) as refused:
        next(watching)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_reason(refused.value) == "UNAUTHENTICATED"
