"""`serve --workers N` on Postgres: real worker processes sharing one port (SO_REUSEPORT),
the calls spread over them, versions and request ids exact across them, SIGTERM stopping
all, a dead worker stopping the rest; SQLite refused."""

from __future__ import annotations

import os
import re
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from switchboard_cli.main import main
from tests.harness import ServerProcess, postgres_schema
from tests.session.conftest import create_agent, resolve, user_message, web

pytestmark = pytest.mark.postgres

_PIDS = re.compile(r"workers share the ports \(pids ([\d, ]+)\)")
_METRICS = re.compile(r"metrics of worker (\d+) on (\S+)")
_APPEND_CALLS = re.compile(
    r'switchboard_rpc_total\{code="(\w+)",method="/switchboard.session.v1.SessionService/'
    r'AppendEvents"\} (\S+)'
)


@contextmanager
def _workers(tmp_path: Path, count: int = 2) -> Iterator[ServerProcess]:
    """`serve session --workers COUNT` on a fresh Postgres schema, every worker serving
    (the parent has printed its ready line) when yielded."""
    with postgres_schema() as url:
        server = ServerProcess(
            url,
            tmp_path,
            "--workers",
            str(count),
            "--metrics-listen",
            "127.0.0.1:0",
            service="session",
        )
        server.start(timeout_s=120)
        try:
            server.wait_for_line("ready;")
            yield server
        finally:
            if server.process is not None and server.process.poll() is None:
                server.terminate()


def _pids(server: ServerProcess) -> list[int]:
    found = next(m for line in server.output if (m := _PIDS.search(line)))
    return [int(pid) for pid in found.group(1).split(", ")]


def _appends_by_worker(server: ServerProcess) -> list[float]:
    """AppendEvents calls each worker counted (its own metrics endpoint)."""
    endpoints = [m.group(2) for line in server.output if (m := _METRICS.search(line))]
    counted = []
    for endpoint in endpoints:
        with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        counted.append(sum(float(m.group(2)) for m in _APPEND_CALLS.finditer(text)))
    return counted


def _append(
    address: str, session_id: str, text: str, expected: int | None = None, request_id: str = ""
) -> pb.AppendEventsResponse:
    """One call on a connection of its own (a local subchannel pool: channels alike
    share one connection otherwise), so that the kernel picks a worker for it."""
    with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        request = pb.AppendEventsRequest(
            agent="main", session_id=session_id, events=[user_message(text)], request_id=request_id
        )
        if expected is not None:
            request.expected_version = expected
        answer: pb.AppendEventsResponse = stub.AppendEvents(request, timeout=30)
        return answer


def _retried(address: str, session_id: str) -> pb.AppendEventsResponse:
    """An append with request id r-1, retried as the server asks while another attempt
    with the id runs (on either worker)."""
    for _ in range(100):
        try:
            return _append(address, session_id, "once", request_id="r-1")
        except grpc.RpcError as refused:
            if refused.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            time.sleep(0.05)
    raise AssertionError("still running after 100 retries")


def _session(address: str) -> tuple[str, int]:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        create_agent(stub)
        session = resolve(stub, **web()).session
        return session.session_id, session.version


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_two_workers_share_one_port_and_the_calls_land_on_both(tmp_path: Path) -> None:
    with _workers(tmp_path) as server:
        session_id, _version = _session(server.address)
        for n in range(40):
            _append(server.address, session_id, f"m{n}")
        counted = _appends_by_worker(server)
        assert len(counted) == 2 and sum(counted) == 40, counted
        assert all(count > 0 for count in counted), f"one worker took every call: {counted}"


def test_workers_drain_when_the_parent_is_killed(tmp_path: Path) -> None:
    """SIGKILL leaves the parent no time to stop its workers: they notice and drain."""
    with _workers(tmp_path) as server:
        pids = _pids(server)
        server.kill()
        deadline = time.monotonic() + 60
        while not all(_gone(pid) for pid in pids):
            assert time.monotonic() < deadline, f"orphaned workers still run: {pids}"
            time.sleep(0.1)


def test_racing_appends_across_workers_have_one_winner_and_retries_answer_alike(
    tmp_path: Path,
) -> None:
    with _workers(tmp_path) as server:
        session_id, version = _session(server.address)

        def contender(n: int) -> str:
            try:
                _append(server.address, session_id, f"contender {n}", expected=version)
            except grpc.RpcError as refused:
                return refused.code().name
            return "OK"

        with ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(contender, range(8)))
        assert sorted(outcomes) == ["ABORTED"] * 7 + ["OK"], outcomes

        # The same request id through 8 connections (both workers): one append, one answer.
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: _retried(server.address, session_id), range(8)))
        assert len({answer.SerializeToString() for answer in answers}) == 1
        assert answers[0].version == version + 2
        counted = _appends_by_worker(server)
        assert all(count > 0 for count in counted), counted


def test_sigterm_drains_and_stops_every_worker(tmp_path: Path) -> None:
    with _workers(tmp_path) as server:
        pids = _pids(server)
        assert len(pids) == 2 and server.pid not in pids
        assert server.terminate() == 0, "".join(server.output)
        assert all(_gone(pid) for pid in pids)


def test_a_worker_that_dies_stops_the_others_and_the_parent_exits_1(tmp_path: Path) -> None:
    with _workers(tmp_path) as server:
        first, second = _pids(server)
        os.kill(second, 9)
        assert server.process is not None
        assert server.process.wait(timeout=60) == 1
        assert _gone(first)
        server.wait_for_line(f"pid {second}) exited with code -9", timeout_s=10)


@pytest.mark.parametrize(
    ("workers", "database", "said"),
    [
        ("2", "sqlite", "SQLite keeps one writer process"),
        ("0", "postgres", "give 1 (one process) or more"),
    ],
)
def test_workers_refused_with_the_reason(
    tmp_path: Path, workers: str, database: str, said: str
) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite3'}" if database == "sqlite" else "postgresql://x@h/db"
    result = CliRunner().invoke(
        main,
        ["serve", "session", "--workers", workers, "--session-database-url", url],
    )
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert not (tmp_path / "s.sqlite3").exists(), "a refused start opened the database"
