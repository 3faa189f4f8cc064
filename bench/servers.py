"""Server processes and databases for the benchmark: start, watch, always stop.

The DeliveryService and the SessionService run exactly as an operator runs
them (`python -m switchboard_cli serve delivery|session`), each in its own
process; nothing here touches the server's code.
Profiling wraps that process from outside (py-spy attached to its pid, or the
stdlib profiler as `python -m cProfile -o FILE -m switchboard_cli …`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

REPO_ROOT = Path(__file__).resolve().parent.parent
POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"

_LISTENING = {
    service: re.compile(rf"{service.capitalize()}Service listening on (\S+)")
    for service in ("delivery", "session")
}
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ThreadCpu:
    tid: int
    name: str
    cpu_s: float


def thread_cpu(pid: int, names: dict[int, str] | None = None) -> dict[int, ThreadCpu]:
    """CPU seconds (user + system) of every thread of `pid`, from /proc.

    `names` (tid → Python thread name, see `python_thread_names`) labels Python
    threads, which Python 3.11 leaves named like the process ("python").
    """
    threads: dict[int, ThreadCpu] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return threads
    for entry in tids:
        try:
            raw = Path(f"/proc/{pid}/task/{entry}/stat").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        ticks = int(fields[11]) + int(fields[12])  # utime, stime
        tid = int(entry)
        label = (names or {}).get(tid, name)
        if tid == pid:
            label = "main (event loop)"
        threads[tid] = ThreadCpu(tid, label, ticks / _CLOCK_TICKS)
    return threads


def cpu_delta(before: dict[int, ThreadCpu], after: dict[int, ThreadCpu]) -> list[ThreadCpu]:
    """Per-thread CPU spent between two `thread_cpu` samples, busiest first."""
    spent = [
        ThreadCpu(tid, now.name, now.cpu_s - (before[tid].cpu_s if tid in before else 0.0))
        for tid, now in after.items()
    ]
    return sorted((t for t in spent if t.cpu_s > 0), key=lambda t: -t.cpu_s)


class ServerProcess:
    """`switchboard serve delivery|session` as a child process on 127.0.0.1, port picked by
    the OS."""

    def __init__(
        self,
        url: str,
        data_dir: Path,
        sqlite_synchronous: str = "FULL",
        cprofile_to: Path | None = None,
        service: str = "delivery",
        code_root: Path = REPO_ROOT,
        extra_args: Sequence[str] = (),
        command_prefix: Sequence[str] = (),
    ) -> None:
        """`code_root` is the tree whose server code runs (an earlier release's, say):
        `python -m` puts the working directory first on the path. `extra_args` go on
        `serve`'s command line (e.g. `--access-log off`). `command_prefix` runs the
        server under another program that execs it in the same process (`valgrind
        --tool=callgrind …`), so `pid` stays the server's."""
        if service not in _LISTENING:
            raise ValueError(f"unknown service {service!r}: use one of {', '.join(_LISTENING)}")
        self.service = service
        self.url = url
        self.data_dir = data_dir
        self.sqlite_synchronous = sqlite_synchronous
        self.cprofile_to = cprofile_to
        self.code_root = code_root
        self.extra_args = tuple(extra_args)
        self.command_prefix = list(command_prefix)
        self.process: subprocess.Popen[str] | None = None
        self.address = ""
        self.output: list[str] = []
        #: tid → Python thread name, read once after start (needs py-spy).
        self.thread_names: dict[int, str] = {}

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def command(self) -> list[str]:
        python = [*self.command_prefix, sys.executable]
        if self.cprofile_to is not None:
            python += ["-m", "cProfile", "-o", str(self.cprofile_to)]
        return [
            *python,
            "-m",
            "switchboard_cli",
            "serve",
            self.service,
            f"--{self.service}-listen",
            "127.0.0.1:0",
            f"--{self.service}-database-url",
            self.url,
            "--sqlite-synchronous",
            self.sqlite_synchronous,
            "--data-dir",
            str(self.data_dir),
            "--drain-grace",
            "2",
            *self.extra_args,
        ]

    def start(self, timeout_s: float = 30.0) -> str:
        self.process = subprocess.Popen(
            self.command(),
            cwd=self.code_root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        stdout = self.process.stdout
        assert stdout is not None
        found: list[str] = []

        def read_until_listening() -> None:
            for line in stdout:
                self.output.append(line.rstrip())
                match = _LISTENING[self.service].search(line)
                if match and not found:
                    found.append(match.group(1))
                    break

        reader = threading.Thread(target=read_until_listening, daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not found:
            self.stop()
            tail = "\n".join(self.output[-20:])
            raise RuntimeError(f"server did not start within {timeout_s:g} s:\n{tail}")
        self.address = found[0]
        # Keep draining its output so the server never blocks on a full pipe.
        threading.Thread(target=self._drain, args=(stdout,), daemon=True).start()
        self.thread_names = python_thread_names(self.process.pid)
        return self.address

    def _drain(self, stdout: Iterator[str]) -> None:
        for line in stdout:
            self.output.append(line.rstrip())
            del self.output[:-200]

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (graceful drain), then SIGKILL if it does not exit in time."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                return process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
        return process.wait(timeout=timeout_s)


@contextmanager
def running_server(
    url: str,
    data_dir: Path,
    sqlite_synchronous: str = "FULL",
    cprofile_to: Path | None = None,
    service: str = "delivery",
    code_root: Path = REPO_ROOT,
    extra_args: Sequence[str] = (),
    command_prefix: Sequence[str] = (),
    start_timeout_s: float = 30.0,
) -> Iterator[ServerProcess]:
    server = ServerProcess(
        url,
        data_dir,
        sqlite_synchronous,
        cprofile_to,
        service,
        code_root,
        extra_args=extra_args,
        command_prefix=command_prefix,
    )
    try:
        server.start(start_timeout_s)
        yield server
    finally:
        server.stop()


@contextmanager
def temp_dir(prefix: str) -> Iterator[Path]:
    import tempfile

    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- Postgres ---------------------------------------------------------------------------------


def postgres_unreachable_reason(url: str = POSTGRES_URL) -> str | None:
    try:
        import psycopg2
    except ImportError as exc:  # pragma: no cover - psycopg2 is a dependency
        return f"psycopg2 is not importable: {exc}"
    try:
        psycopg2.connect(url, connect_timeout=3).close()
    except psycopg2.Error as exc:
        return f"PostgreSQL at {url} is unreachable: {str(exc).strip()}"
    return None


@contextmanager
def postgres_schema(url: str = POSTGRES_URL) -> Iterator[str]:
    """A fresh schema, dropped afterwards; yields a URL whose search_path is it."""
    import psycopg2

    schema = f"bench_{uuid.uuid4().hex[:12]}"
    admin = psycopg2.connect(url, connect_timeout=5)
    admin.autocommit = True
    try:
        with admin.cursor() as cursor:
            cursor.execute(f"CREATE SCHEMA {schema}")
        try:
            yield f"{url}?options={quote(f'-csearch_path={schema}')}"
        finally:
            with admin.cursor() as cursor:
                cursor.execute(f"DROP SCHEMA {schema} CASCADE")
    finally:
        admin.close()


def postgres_version(url: str = POSTGRES_URL) -> str:
    import psycopg2

    connection = psycopg2.connect(url, connect_timeout=3)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            row = cursor.fetchone()
            return str(row[0]) if row else "?"
    finally:
        connection.close()


def python_thread_names(pid: int) -> dict[int, str]:
    """tid → Python thread name, read by `py-spy dump` (empty without py-spy)."""
    spy = py_spy_path()
    if spy is None:
        return {}
    try:
        dumped = subprocess.run(
            [spy, "dump", "--pid", str(pid), "--json"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
        threads = json.loads(dumped.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}
    return {
        int(t["os_thread_id"]): str(t["thread_name"])
        for t in threads
        if isinstance(t, dict) and t.get("os_thread_id") and t.get("thread_name")
    }


# -- py-spy -----------------------------------------------------------------------------------


def py_spy_path() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


class PySpy:
    """`py-spy record` attached to a pid for a fixed time, raw collapsed stacks out."""

    def __init__(
        self, executable: str, pid: int, seconds: float, output: Path, flags: Sequence[str]
    ) -> None:
        self.output = output
        self.seconds = seconds
        self.log = ""
        self.process = subprocess.Popen(
            [
                executable,
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(max(1, round(seconds))),
                "--rate",
                "200",
                "--format",
                "raw",
                "--threads",
                "--output",
                str(output),
                *flags,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )

    def wait(self) -> str:
        """Waits for the recording to end (bounded); returns py-spy's own output."""
        try:
            out, _ = self.process.communicate(timeout=self.seconds + 30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate(timeout=30)
        self.log = out or ""
        return self.log
