"""Real servers for tests: in-process aio servers on 127.0.0.1 and server processes.

Nothing here fakes a part: servers are the production `GrpcApp` on a real
SQLite file or a real Postgres schema, reached through generated stubs.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import grpc
import psycopg2

from delivery_service.app import DeliveryUnit
from delivery_service.state_machine import LedgerLimits
from session_service.app import SessionUnit
from session_service.core import SessionLimits
from switchboard.database import DatabaseSettings, SettingsMismatch
from switchboard.delivery.v1 import delivery_service_pb2 as pb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as pb_grpc
from switchboard.server import GrpcApp, ServerSettings
from switchboard.session.v1 import session_service_pb2_grpc as session_grpc

POSTGRES_URL = os.environ.get(
    "SWITCHBOARD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


def postgres_unreachable_reason() -> str | None:
    try:
        psycopg2.connect(POSTGRES_URL, connect_timeout=3).close()
    except psycopg2.Error as exc:
        return f"PostgreSQL at {POSTGRES_URL} is unreachable: {str(exc).strip()}"
    return None


@contextmanager
def postgres_schema() -> Iterator[str]:
    """A fresh schema for one test; yields a database URL whose search_path is it."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = psycopg2.connect(POSTGRES_URL)
    admin.autocommit = True
    with admin.cursor() as cursor:
        cursor.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{POSTGRES_URL}?options={quote(f'-csearch_path={schema}')}"
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f"DROP SCHEMA {schema} CASCADE")
        admin.close()


class EventLoopThread:
    """An asyncio loop on a daemon thread, for hosting aio servers in tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout=60)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


U = TypeVar("U", DeliveryUnit, SessionUnit)
Stub = TypeVar("Stub")


@dataclass
class InProcess(Generic[U, Stub]):
    """A production server on 127.0.0.1 in this process, and a stub to call it."""

    app: GrpcApp
    unit: U
    channel: grpc.Channel
    stub: Stub

    @property
    def address(self) -> str:
        return self.app.address


InProcessDelivery = InProcess[DeliveryUnit, pb_grpc.DeliveryServiceStub]
InProcessSession = InProcess[SessionUnit, session_grpc.SessionServiceStub]


@contextmanager
def _serve(
    loop: EventLoopThread, unit: U, stub: Callable[[grpc.Channel], Stub], **settings: Any
) -> Iterator[InProcess[U, Stub]]:
    app = GrpcApp(unit, ServerSettings(listen="127.0.0.1:0", drain_grace_s=1.0, **settings))
    loop.run(app.start())
    channel = grpc.insecure_channel(app.address)
    try:
        yield InProcess(app, unit, channel, stub(channel))
    finally:
        channel.close()
        loop.run(app.stop())


def delivery_server(
    loop: EventLoopThread,
    url: str,
    limits: LedgerLimits | None = None,
    *,
    pii_key: bytes | None = None,
    **settings: Any,
) -> AbstractContextManager[InProcessDelivery]:
    unit = DeliveryUnit(DatabaseSettings(url=url), limits or LedgerLimits(), pii_key=pii_key)
    return _serve(loop, unit, pb_grpc.DeliveryServiceStub, **settings)


def session_server(
    loop: EventLoopThread,
    url: str,
    limits: SessionLimits | None = None,
    *,
    pii_key: bytes | None = None,
    on_settings_mismatch: SettingsMismatch = "refuse",
    **settings: Any,
) -> AbstractContextManager[InProcessSession]:
    unit = SessionUnit(
        DatabaseSettings(url=url, on_settings_mismatch=on_settings_mismatch),
        limits or SessionLimits(watch_poll_s=0.2),
        pii_key=pii_key,
    )
    return _serve(loop, unit, session_grpc.SessionServiceStub, **settings)


class Gateway:
    """A gateway instance as the tests drive it: raw generated-stub calls."""

    def __init__(
        self, stub: pb_grpc.DeliveryServiceStub, platforms: tuple[str, ...] = ("slack",)
    ) -> None:
        self.stub = stub
        self.instance_id = stub.RegisterInstance(
            pb.RegisterInstanceRequest(
                gateway_name="test-gateway", host="testhost", pid=os.getpid(), platforms=platforms
            )
        ).instance.instance_id

    def record(
        self, content: str = "the final answer", **fields: Any
    ) -> pb.RecordObligationResponse:
        request = {
            "session_key": "agent:main:slack:channel:C1",
            "message_ref": "m1",
            "platform": "slack",
            "chat_id": "C1",
            "thread_id": "171.001",
            **fields,
        }
        return self.stub.RecordObligation(
            pb.RecordObligationRequest(instance_id=self.instance_id, content=content, **request)
        )

    def attempting(self, row: pb.Obligation) -> pb.Obligation:
        return self.stub.MarkAttempting(
            pb.MarkAttemptingRequest(
                obligation_id=row.id, instance_id=self.instance_id, fence=row.fence
            )
        ).obligation

    def delivered(self, row: pb.Obligation, platform_message_id: str = "pm-1") -> pb.Obligation:
        return self.stub.MarkDelivered(
            pb.MarkDeliveredRequest(
                obligation_id=row.id,
                instance_id=self.instance_id,
                fence=row.fence,
                platform_message_id=platform_message_id,
            )
        ).obligation

    def failed(
        self, row: pb.Obligation, retryable: bool = True, error: str = "503", **extra: Any
    ) -> pb.Obligation:
        return self.stub.MarkFailed(
            pb.MarkFailedRequest(
                obligation_id=row.id,
                instance_id=self.instance_id,
                fence=row.fence,
                error=error,
                retryable=retryable,
                **extra,
            )
        ).obligation

    def claim(
        self, platforms: tuple[str, ...] | None = None, limit: int = 0
    ) -> pb.ClaimRecoverableResponse:
        request = pb.ClaimRecoverableRequest(instance_id=self.instance_id, limit=limit)
        if platforms is not None:
            request.deliverable_platforms.SetInParent()  # an empty set is still a set
            request.deliverable_platforms.platforms.extend(platforms)
        return self.stub.ClaimRecoverable(request)

    def heartbeat(self, platforms: tuple[str, ...]) -> pb.Instance:
        return self.stub.Heartbeat(
            pb.HeartbeatRequest(instance_id=self.instance_id, platforms=platforms)
        ).instance

    def die(self) -> None:
        """The process is gone: its lease ends now (as after a crash and lease expiry)."""
        self.stub.DeregisterInstance(pb.DeregisterInstanceRequest(instance_id=self.instance_id))


def get(stub: pb_grpc.DeliveryServiceStub, obligation_id: str) -> pb.Obligation:
    return stub.GetObligation(pb.GetObligationRequest(obligation_id=obligation_id)).obligation


def age_rows(unit: DeliveryUnit, seconds: float) -> None:
    """Moves every row's timestamps `seconds` into the past (as if time had passed)."""
    model = unit.store.Obligation
    with unit.store.backend.database.connection_context():
        model.update(
            created_at=model.created_at - seconds,
            updated_at=model.updated_at - seconds,
            next_attempt_at=model.next_attempt_at - seconds,
        ).execute()


# -- server processes -----------------------------------------------------------------------

_LISTENING = re.compile(r"(\w+Service) listening on (\S+)")


class ServerProcess:
    """`switchboard serve delivery` (or `session`) as a real child process, with extra
    environment if given (e.g. libfaketime's, for a skewed clock). The benchmarks start
    their servers with it too (bench/servers.py)."""

    def __init__(
        self,
        url: str,
        data_dir: Path,
        *extra: str,
        service: str = "delivery",
        env: dict[str, str] | None = None,
        code_root: Path | None = None,
        command_prefix: Sequence[str] = (),
        keep_lines: int | None = None,
    ) -> None:
        """`code_root`: the tree whose server code runs (an earlier release's, say):
        `python -m` puts the working directory first on the path. `command_prefix`: a
        program that execs the server in the same process (`valgrind --tool=callgrind
        …`), so that `pid` stays the server's. `keep_lines`: how much of the output
        `output` keeps once the server listens (None: all of it; a benchmark's access
        log would otherwise grow without bound)."""
        self.service = service
        self.url = url
        self.data_dir = data_dir
        self.extra = extra
        self.env = env
        self.code_root = code_root
        self.command_prefix = list(command_prefix)
        self.keep_lines = keep_lines
        self.process: subprocess.Popen[str] | None = None
        self.address = ""
        self.output: list[str] = []

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def start(self, timeout_s: float = 30.0) -> str:
        self.launch()
        return self.wait_ready(timeout_s)

    def _cli_module(self) -> str:
        """The command's module: `switchboard_cli`, or in a tree of a release before
        it existed (a benchmark's `--against`), that release's `switchboard`."""
        if self.code_root is not None and not (self.code_root / "switchboard_cli").is_dir():
            return "switchboard"
        return "switchboard_cli"

    def launch(self) -> None:
        """Starts the process without waiting for it (`wait_ready` then waits), so that
        several can start at the same moment."""
        self.process = subprocess.Popen(
            [
                *self.command_prefix,
                sys.executable,
                "-m",
                self._cli_module(),
                "serve",
                self.service,
                f"--{self.service}-listen",
                "127.0.0.1:0",
                f"--{self.service}-database-url",
                self.url,
                "--data-dir",
                str(self.data_dir),
                "--drain-grace",
                "5",
                *self.extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=None if self.env is None else {**os.environ, **self.env},
            cwd=self.code_root,
        )

    def wait_ready(self, timeout_s: float = 30.0) -> str:
        """Waits for the "listening" line; returns the address. What the process prints
        is kept in `output` (what a failed start said, and its log after)."""
        assert self.process is not None and self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            self.output.append(line)
            match = _LISTENING.search(line)
            if match:
                self.address = match.group(2)
                threading.Thread(target=self._drain_output, daemon=True).start()
                return self.address
        self.stop_quietly()
        said = "".join(self.output[-20:])
        raise RuntimeError(f"server did not start (exit code {self.process.poll()}):\n{said}")

    def wait_for_line(self, text: str, timeout_s: float = 60.0) -> str:
        """The first line of the output after the listening line that holds `text` (e.g.
        `serve --workers`' "ready;", printed once every worker serves)."""
        deadline = time.monotonic() + timeout_s
        while not (found := [line for line in self.output if text in line]):
            if time.monotonic() > deadline:
                said = "".join(self.output[-20:])
                raise RuntimeError(f"no line with {text!r} in {timeout_s} s:\n{said}")
            time.sleep(0.05)
        return found[0]

    def _drain_output(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            if self.keep_lines is not None:
                del self.output[: -self.keep_lines]

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def terminate(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)

    def stop_quietly(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
