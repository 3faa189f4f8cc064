"""SQLite faults through the real server: a full disk (a small tmpfs of the test's
own), a lock another process holds past the busy timeout, a damaged file at
start, a data file deleted or replaced under the running server; and the clock
anchored in the file.

Each fault must answer a status the clients can act on (RESOURCE_EXHAUSTED,
UNAVAILABLE) with a message naming the file, never INTERNAL; leave the file
intact (`PRAGMA integrity_check`); and pass once the fault is gone, without a
restart where the file survived.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import resource
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import grpc
import pytest

from delivery_service.app import DeliveryUnit
from switchboard.database import DatabaseSettings
from switchboard.delivery.v1 import delivery_service_pb2_grpc as pb_grpc
from switchboard.errors import Unavailable
from switchboard.server import GrpcApp, ServerSettings
from switchboard.sqlite_backend import SqliteBackend
from switchboard.sqlite_clock import boot_id
from tests.harness import EventLoopThread, Gateway, ServerProcess, get
from tests.status import error_reason

IN_CI = os.environ.get("CI", "").lower() in ("1", "true") or bool(
    os.environ.get("SWITCHBOARD_REQUIRE_POSTGRES")
)
BIG_REPLY = "x" * 200_000  # a few of these overflow the small disk quickly


@contextmanager
def served(loop: EventLoopThread, unit: DeliveryUnit) -> Iterator[Gateway]:
    """The production server on 127.0.0.1 around `unit`; yields a registered gateway."""
    app = GrpcApp(unit, ServerSettings(listen="127.0.0.1:0", drain_grace_s=1.0))
    loop.run(app.start())
    channel = grpc.insecure_channel(app.address)
    try:
        yield Gateway(pb_grpc.DeliveryServiceStub(channel))
    finally:
        channel.close()
        loop.run(app.stop())


def integrity(path: Path) -> str:
    """`PRAGMA integrity_check`'s verdict ("ok"), or what it found or failed with."""
    with closing(sqlite3.connect(path)) as database:
        try:
            return ", ".join(str(row[0]) for row in database.execute("PRAGMA integrity_check"))
        except sqlite3.DatabaseError as exc:
            return f"{type(exc).__name__}: {exc}"


def details(error: grpc.RpcError) -> str:
    return str(error.details() or "")


def refused(call: object) -> grpc.RpcError:
    """Runs `call()`, which must fail; returns its error."""
    with pytest.raises(grpc.RpcError) as caught:
        call()  # type: ignore[operator]
    return caught.value


# -- a full disk -----------------------------------------------------------------------------


@contextmanager
def small_disk(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` for the test (root only)."""
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        why = f"cannot mount a tmpfs for the full-disk test: {mounted.stderr.strip()}"
        if IN_CI:
            pytest.fail(why)  # CI runs as root: the test must run there
        pytest.skip(why)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    """Writes a file until the disk has no space left; returns it."""
    filler = disk / "filler"
    chunk = b"\0" * 65536
    # Unbuffered: a buffer left over from the failed write would fail again at close.
    with open(filler, "wb", buffering=0) as out:
        try:
            while True:
                out.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


def record_until_refused(gateway: Gateway, acknowledged: list[str]) -> grpc.RpcError | None:
    """Records big replies until one is refused (the WAL may still have room for a few);
    appends the acknowledged ids; returns the refusal, or None after 40 tries."""
    for n in range(len(acknowledged), 40):
        try:
            acknowledged.append(gateway.record(BIG_REPLY, message_ref=f"m{n}").obligation.id)
        except grpc.RpcError as refused:
            return refused
    return None


def test_a_full_disk_answers_resource_exhausted_and_service_resumes_when_space_returns(
    loop_thread: EventLoopThread, tmp_path: Path
) -> None:
    with small_disk(tmp_path / "disk", "6m") as disk:
        path = disk / "ledger.sqlite3"
        unit = DeliveryUnit(DatabaseSettings(url=f"sqlite:///{path}"))
        with served(loop_thread, unit) as gateway:
            acknowledged = [
                gateway.record(BIG_REPLY, message_ref=f"m{n}").obligation.id for n in range(3)
            ]
            filler = fill(disk)
            error = record_until_refused(gateway, acknowledged)
            assert error is not None, "writes kept succeeding on a full disk"
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
            assert error_reason(error) == "DATABASE_DISK_FULL"
            assert str(path) in details(error) and "free space" in details(error)
            # Still full: the next call says the same (not INTERNAL), reads still work,
            # health stays SERVING (reads can be served; writes say why they cannot).
            again = refused(lambda: gateway.record(BIG_REPLY, message_ref="again"))
            assert again.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, again
            assert [get(gateway.stub, row).id for row in acknowledged] == acknowledged
            unit.store.backend.probe()
            assert integrity(path) == "ok"

            filler.unlink()  # space returns: no restart
            acknowledged.append(gateway.record(BIG_REPLY, message_ref="after").obligation.id)
            assert [get(gateway.stub, row).id for row in acknowledged] == acknowledged
        assert integrity(path) == "ok"
        with closing(sqlite3.connect(path)) as database:
            [(rows,)] = database.execute("SELECT COUNT(*) FROM ledger_obligation")
        assert rows == len(acknowledged), (
            "a failed write left a row, or an acknowledged one is gone"
        )


# -- a lock held by another process ----------------------------------------------------------


def test_a_lock_held_past_the_busy_timeout_answers_unavailable_naming_the_file(
    loop_thread: EventLoopThread, tmp_path: Path
) -> None:
    path = tmp_path / "ledger.sqlite3"
    unit = DeliveryUnit(DatabaseSettings(url=f"sqlite:///{path}", busy_timeout_ms=200))
    with served(loop_thread, unit) as gateway:
        first = gateway.record(message_ref="before")
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sqlite3, sys\n"
                "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
                "db.execute('BEGIN IMMEDIATE')\n"
                "print('locked', flush=True)\n"
                "sys.stdin.read()\n",
                str(path),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            error = refused(lambda: gateway.record(message_ref="while-locked"))
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error
            assert error_reason(error) == "DATABASE_LOCKED"
            assert str(path) in details(error) and "busy timeout" in details(error)
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(timeout=30)
        after = gateway.record(message_ref="after")  # the lock is gone: writes pass again
        assert {get(gateway.stub, first.obligation.id).id, after.obligation.id} == {
            first.obligation.id,
            after.obligation.id,
        }
    with closing(sqlite3.connect(path)) as database:
        refs = {row[0] for row in database.execute("SELECT message_ref FROM ledger_obligation")}
    assert refs == {"before", "after"}, "the refused call wrote something"


# -- an I/O error -----------------------------------------------------------------------------


@pytest.mark.slow
def test_an_io_error_answers_unavailable_and_service_resumes(tmp_path: Path) -> None:
    """A write the kernel refuses: the server process may write no file beyond a size
    (RLIMIT_FSIZE; the write fails with EFBIG, which SQLite reports as SQLITE_IOERR_WRITE)."""
    path = tmp_path / "ledger.sqlite3"
    server = ServerProcess(f"sqlite:///{path}", tmp_path)
    server.start()
    assert server.process is not None
    pid = server.process.pid
    try:
        with grpc.insecure_channel(server.address) as channel:
            gateway = Gateway(pb_grpc.DeliveryServiceStub(channel))
            acknowledged = [gateway.record(BIG_REPLY, message_ref="m0").obligation.id]
            largest = max(f.stat().st_size for f in tmp_path.glob("ledger.sqlite3*"))
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (largest + 65536, resource.RLIM_INFINITY))
            error = record_until_refused(gateway, acknowledged)
            assert error is not None, "writes kept succeeding past the file size limit"
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error
            assert error_reason(error) == "DATABASE_IO_ERROR"
            assert str(path) in details(error), error

            resource.prlimit(pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
            acknowledged.append(gateway.record(BIG_REPLY, message_ref="after").obligation.id)
            assert [get(gateway.stub, row).id for row in acknowledged] == acknowledged
    finally:
        assert server.terminate() == 0
    assert integrity(path) == "ok"
    with closing(sqlite3.connect(path)) as database:
        [(rows,)] = database.execute("SELECT COUNT(*) FROM ledger_obligation")
    assert rows == len(acknowledged), "a failed write left a row, or an acknowledged one is gone"


# -- a damaged file at start ------------------------------------------------------------------


def start_refused(url: str, data_dir: Path, *flags: str) -> tuple[int, str]:
    """Runs `switchboard serve delivery`, which must exit by itself; returns its code and output."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "switchboard_cli",
            "serve",
            "delivery",
            "--delivery-listen",
            "127.0.0.1:0",
            "--delivery-database-url",
            url,
            "--data-dir",
            str(data_dir),
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=30,  # it must refuse at once; a server that starts runs until then
        check=False,
    )
    return run.returncode, run.stdout + run.stderr


@pytest.mark.slow
def test_start_up_refuses_a_file_with_damaged_pages(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    url = f"sqlite:///{path}"
    server = ServerProcess(url, tmp_path)
    server.start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            gateway = Gateway(pb_grpc.DeliveryServiceStub(channel))
            for n in range(300):
                gateway.record(f"message {n} " + "y" * 1000, message_ref=f"m{n}")
    finally:
        assert server.terminate() == 0
    with closing(sqlite3.connect(path)) as database:
        database.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = path.stat().st_size
    noise = random.Random(10)
    with open(path, "r+b") as file:  # three pages in the middle of the file
        file.seek(size // 2 - 4096)
        file.write(bytes(noise.randrange(256) for _ in range(3 * 4096)))
    assert integrity(path) != "ok", "the damage did not take"

    for flags in ((), ("--sqlite-integrity-check", "full")):
        code, output = start_refused(url, tmp_path, *flags)
        assert code != 0, output
        assert "is damaged" in output and str(path) in output, output
        assert "listening on" not in output, output
    # Without the check the damaged file is served: the check is what refuses it.
    unchecked = ServerProcess(url, tmp_path, "--sqlite-integrity-check", "off")
    unchecked.start()
    unchecked.stop_quietly()


# -- a data file deleted or replaced under the running server ---------------------------------


@pytest.mark.parametrize("fate", ["deleted", "replaced"])
def test_a_data_file_deleted_or_replaced_under_the_server_refuses_calls(
    loop_thread: EventLoopThread, tmp_path: Path, fate: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ledger.sqlite3"
    unit = DeliveryUnit(DatabaseSettings(url=f"sqlite:///{path}"))
    with served(loop_thread, unit) as gateway:
        kept = gateway.record(message_ref="before").obligation
        unit.store.backend.probe()
        if fate == "deleted":
            path.unlink()
        else:
            other = tmp_path / "other.sqlite3"
            with closing(sqlite3.connect(other)) as database:
                database.execute("CREATE TABLE unrelated (x)")
            os.replace(other, path)
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            for call in (
                lambda: gateway.record(message_ref="after"),
                lambda: get(gateway.stub, kept.id),
                lambda: gateway.record(message_ref="after-again"),
                gateway.claim,
            ):
                error = refused(call)
                assert error.code() == grpc.StatusCode.UNAVAILABLE, error
                assert error_reason(error) == "DATABASE_FILE_LOST"
                assert str(path) in details(error) and fate in details(error), error
            with pytest.raises(Unavailable, match=fate):
                unit.store.backend.probe()  # health: NOT_SERVING
        lost = [r for r in caplog.records if "while this server had it open" in r.getMessage()]
        assert len(lost) == 1, [r.getMessage() for r in caplog.records]
        if fate == "deleted":
            assert not path.exists(), "a new, empty file was created under the server"
        else:
            with closing(sqlite3.connect(path)) as database:
                tables = {row[0] for row in database.execute("SELECT name FROM sqlite_master")}
            assert tables == {"unrelated"}, "the server wrote into the file put in its place"


def test_a_file_deleted_while_the_health_probe_opens_it_is_reported_as_lost(
    loop_thread: EventLoopThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The health probe checks the file, then opens it: a deletion landing between
    the two must still say DATABASE_FILE_LOST (the probe's error opens the outage
    window, whose error every call then answers)."""
    path = tmp_path / "ledger.sqlite3"
    unit = DeliveryUnit(DatabaseSettings(url=f"sqlite:///{path}"))
    with served(loop_thread, unit) as gateway:
        gateway.record(message_ref="before")
        backend = unit.store.backend
        assert isinstance(backend, SqliteBackend)
        opening = backend.file.connect_existing

        def deleted_first(timeout_s: float) -> sqlite3.Connection:
            if path.exists():
                path.unlink()
            return opening(timeout_s)

        monkeypatch.setattr(backend.file, "connect_existing", deleted_first)
        with pytest.raises(Unavailable) as probed:
            unit.probe()
        assert probed.value.reason == "DATABASE_FILE_LOST", probed.value
        error = refused(lambda: gateway.record(message_ref="after"))
        assert error_reason(error) == "DATABASE_FILE_LOST", error


# -- the clock ----------------------------------------------------------------------------------


def test_backends_on_one_file_share_the_clock_anchor(tmp_path: Path) -> None:
    if boot_id() is None:
        pytest.skip("this host has no boot id: the clock is the wall clock")
    settings = DatabaseSettings(url=f"sqlite:///{tmp_path / 'x.sqlite3'}")
    first = SqliteBackend(str(tmp_path / "x.sqlite3"), settings)
    second = SqliteBackend(str(tmp_path / "x.sqlite3"), settings)
    assert first.clock == second.clock
    with closing(sqlite3.connect(tmp_path / "x.sqlite3")) as database:
        [(boot,)] = database.execute("SELECT boot_id FROM switchboard_clock_anchor")
    assert boot == boot_id()
    assert abs(first.now() - second.now()) < 1


def test_another_boot_re_anchors_and_never_before_the_previous_anchor(tmp_path: Path) -> None:
    if boot_id() is None:
        pytest.skip("this host has no boot id: the clock is the wall clock")
    path = tmp_path / "x.sqlite3"
    settings = DatabaseSettings(url=f"sqlite:///{path}")
    SqliteBackend(str(path), settings)
    ahead = first_now = SqliteBackend(str(path), settings).now()
    ahead += 3600.0  # an anchor an hour ahead of this host's wall clock, from another boot
    with closing(sqlite3.connect(path)) as database, database:
        database.execute(
            "UPDATE switchboard_clock_anchor SET boot_id = 'an-earlier-boot', wall = ?", [ahead]
        )
    rebooted = SqliteBackend(str(path), settings)
    assert rebooted.now() >= ahead > first_now
    with closing(sqlite3.connect(path)) as database:
        [(boot,)] = database.execute("SELECT boot_id FROM switchboard_clock_anchor")
    assert boot == boot_id()
